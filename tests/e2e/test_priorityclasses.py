"""Priority classes end to end: real processes (store server, dispatcher, a scheduler shard, a
Binder, a node agent with two one-core hollow nodes) driven through the CLI with the classes of
examples/priority-classes.yaml. A job of the globalDefault class fills the cluster; a class with
preemptionPolicy Never preempts nothing; a higher class preempts the lower one's pods; a class
with preemptible false protects its pods from a higher priority. The fixture audits the
invariants afterwards (every victim preemptible, of lower priority)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import ROOT, Cluster, wait_until
from tests.e2e.test_preemption import SMALL_NODES, job_yaml, placed, pods

pytestmark = pytest.mark.e2e


def explained(cluster: Cluster, pod: str, needle: str) -> str:
    out = cluster.godel("explain", pod).stdout
    return out if needle in out else ""


def test_classes_give_priority_preemption_policy_and_protection(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2, service_args=(SMALL_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 2, what="nodes registered")
    applied = cluster.godel("apply", "-f", str(ROOT / "examples" / "priority-classes.yaml"))
    assert applied.stdout.splitlines() == [
        "priorityclass/batch created",
        "priorityclass/service created",
        "priorityclass/nonpreempting created",
    ]
    table = cluster.godel("get", "pc").stdout.splitlines()
    assert [line.split()[:5] for line in table[1:]] == [
        ["batch", "10", "true", "PreemptLowerPriority", "true"],
        ["nonpreempting", "50000", "false", "Never", "true"],
        ["service", "100000", "false", "PreemptLowerPriority", "false"],
    ]

    # No class, no priority: the globalDefault (batch) with its preemptibility.
    cluster.godel("apply", "-f", "-", stdin=job_yaml("work", 2, "1", ""))
    wait_until(lambda: placed(cluster, "work") == 2, timeout=120, what="work placed")
    work = cluster.client.get(pb.Job, "work")
    assert (work.spec.priority_class_name, work.spec.priority) == ("batch", 10)
    assert all(p.spec.preemptible and p.spec.priority == 10 for p in pods(cluster, "work"))

    # Higher, but Never: it waits, and no pod of the batch class goes.
    polite = job_yaml("polite", 1, "1", "  priorityClassName: nonpreempting\n")
    cluster.godel("apply", "-f", "-", stdin=polite)
    wait_until(
        lambda: explained(cluster, "polite-0", "0/2 nodes fit"),
        timeout=120,
        what="the Never job's attempt",
    )
    assert pods(cluster, "polite")[0].spec.preemption_policy == pb.NEVER
    assert all(p.status.phase == pb.POD_RUNNING for p in pods(cluster, "work"))
    cluster.godel("delete", "job", "polite")

    # The service class preempts the batch class's pods.
    cluster.godel(
        "apply", "-f", "-", stdin=job_yaml("web", 2, "1", "  priorityClassName: service\n")
    )
    wait_until(
        lambda: [p.status.phase for p in pods(cluster, "web")] == [pb.POD_RUNNING] * 2,
        timeout=180,
        what="the service running",
    )
    wide = cluster.godel("get", "jobs", "-o", "wide").stdout.splitlines()
    column = wide[0].index("PRIORITY-CLASS")
    assert {line.split()[0]: line[column:].split()[0] for line in wide[1:]} == {
        "web": "service",
        "work": "batch",
    }
    victims = pods(cluster, "work")
    assert {(p.status.phase, p.status.reason) for p in victims} == {(pb.POD_FAILED, "Preempted")}
    assert {p.status.preempted_by for p in victims} == {"web-0", "web-1"}

    # A higher raw priority still takes nothing from a class whose pods are not preemptible.
    cluster.godel("apply", "-f", "-", stdin=job_yaml("vip", 1, "1", "  priority: 200000\n"))
    # Its attempt placed it nowhere (a preemption would have nominated a node instead).
    wait_until(
        lambda: explained(cluster, "vip-0", "0/2 nodes fit"),
        timeout=120,
        what="vip's attempt",
    )
    assert cluster.client.get(pb.Job, "vip").spec.priority_class_name == ""  # no default taken
    assert [p.status.phase for p in pods(cluster, "web")] == [pb.POD_RUNNING] * 2

    # A class that jobs name stays; once they are gone it goes.
    refused = cluster.godel("delete", "priorityclass", "service", check=False)
    assert refused.returncode == 1
    assert "priority class 'service' is in use by 1 job (web)" in refused.stderr
    described = cluster.godel("describe", "pc", "service").stdout
    assert "value: 100000" in described and "web" in described.split("jobs:")[1]
    cluster.godel("delete", "job", "web", "work", "vip")
    deleted = cluster.godel("delete", "pc", "service", "nonpreempting")
    assert deleted.stdout.splitlines() == [
        "priorityclass/service deleted",
        "priorityclass/nonpreempting deleted",
    ]
