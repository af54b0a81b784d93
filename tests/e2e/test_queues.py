"""Queues end to end — borrow and reclaim, fairness between queues — with real processes (store
server, dispatcher, scheduler shards, binders, a node agent with hollow nodes) driven through the
CLI and the client; the fixture audits the invariants afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from bench import fairness
from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import Cluster, wait_until

pytestmark = pytest.mark.e2e

ONE_CPU_NODES = fairness.ONE_CPU_NODES


def queue_yaml(name: str, spec: str) -> str:
    return f"apiVersion: godel/v1\nkind: Queue\nmetadata: {{name: {name}}}\nspec:\n{spec}"


def job_yaml(name: str, queue: str, replicas: int, extra: str = "") -> str:
    return (
        f"apiVersion: godel/v1\nkind: Job\nmetadata: {{name: {name}}}\n"
        f"spec:\n  queue: {queue}\n  replicas: {replicas}\n  minMember: 1\n{extra}"
        f"  template:\n    requests: {{cpu: '1', memory: 100Mi}}\n"
    )


def pods_of(cluster: Cluster, queue: str) -> list[pb.Pod]:
    return [
        p for p in cluster.client.list("Pod") if isinstance(p, pb.Pod) and p.spec.queue == queue
    ]


def running(pods: list[pb.Pod]) -> list[pb.Pod]:
    return [p for p in pods if p.status.phase == pb.POD_RUNNING]


def test_a_queue_below_its_min_reclaims_what_another_borrowed(
    make_cluster: Callable[..., Cluster],
) -> None:
    nodes = 10
    cluster = make_cluster(schedulers=1, hollow_nodes=nodes, service_args=(ONE_CPU_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == nodes, what="nodes registered")
    cluster.godel(
        "apply",
        "-f",
        "-",
        stdin=queue_yaml("alpha", "  min: {cpu: '5'}\n")
        + "---\n"
        + queue_yaml("beta", "  min: {cpu: '5'}\n"),
    )
    # Alpha idle: beta fills the whole cluster, borrowing five cpus beyond its min.
    cluster.godel(
        "apply", "-f", "-", stdin=job_yaml("fill", "beta", nodes, "  replaceLostPods: true\n")
    )
    wait_until(lambda: len(running(pods_of(cluster, "beta"))) == nodes, timeout=120, what="fill")

    def beta_borrows() -> bool:
        (beta,) = [q for q in cluster.client.list("Queue") if q.metadata.name == "beta"]
        return beta.status.borrowed.milli_cpu == 5000  # type: ignore[attr-defined]

    wait_until(beta_borrows, what="beta's status shows what it borrowed")
    wide = cluster.godel("get", "queues", "-o", "wide").stdout
    header, *rows = wide.splitlines()
    for column in ("MIN-CPU", "MAX-CPU", "USED-CPU", "BORROWED-CPU", "PENDING", "SHARE"):
        assert column in header
    beta_row = next(r.split() for r in rows if r.startswith("beta "))
    assert beta_row[header.split().index("BORROWED-CPU")] == "5"
    assert beta_row[header.split().index("SHARE")] == "100%"

    # Alpha asks for more than its min: it gets its min back, by reclaim, and no more.
    cluster.godel("apply", "-f", "-", stdin=job_yaml("work", "alpha", 7))
    wait_until(
        lambda: len(running(pods_of(cluster, "alpha"))) == 5, timeout=120, what="alpha at its min"
    )
    time.sleep(3)  # let a wrong extra eviction show up, if there were one

    beta = pods_of(cluster, "beta")
    evicted = [p for p in beta if p.status.phase == pb.POD_FAILED]
    assert len(evicted) == 5
    assert {p.status.reason for p in evicted} == {"Reclaimed"}
    assert all("alpha" in p.status.message for p in evicted)
    # Beta keeps what its min guarantees; its evicted pods wait as replacements in its queue.
    assert len(running(beta)) == 5
    assert len([p for p in beta if p.status.phase == pb.POD_PENDING]) == 5
    alpha = pods_of(cluster, "alpha")
    assert len(running(alpha)) == 5
    assert len([p for p in alpha if p.status.phase == pb.POD_PENDING]) == 2
    assert not [p for p in alpha if p.status.phase == pb.POD_FAILED]


def contend(make_cluster: Callable[..., Cluster], c: fairness.Contention) -> fairness.Summary:
    """The quick form of bench/fairness.py on this test's cluster: two queues on a full cluster
    of 100 one-cpu hollow nodes, the heavy one submitting ten times the light one's work."""
    cluster = make_cluster(
        schedulers=2,
        hollow_nodes=c.nodes,
        service_args=(ONE_CPU_NODES, ("dispatcher", ("--queue-fairness", c.fairness))),
    )
    wait_until(lambda: len(cluster.client.list("Node")) == c.nodes, what="nodes registered")
    fairness.apply_queues(cluster.client, c)
    fairness.submit_work(cluster.client, c)
    samples = fairness.sample(cluster.client, c)
    # Stop the churn before the fixture's audit, which reads pods and claims one after the other.
    fairness.clean_up(cluster.client)
    return fairness.summarise(samples, c)


def test_two_equal_queues_hold_equal_shares_on_a_full_cluster(
    make_cluster: Callable[..., Cluster],
) -> None:
    summary = contend(make_cluster, fairness.Contention.quick((1, 1)))
    assert summary.samples >= 5, summary.timeline
    # Sampled while both have work: the shares stay within 10 % of each other. A sample may
    # catch a job's pods that just finished before their room is handed on: five pods are five
    # nodes of the queue's fifty, a 10 % gap by themselves, more with one other pod finishing.
    # About one run in eight had two such samples of eighteen (before 3a8e724 and after), so up
    # to one in five may; an unfair dispatcher is off in most samples, and the mean gap below
    # is the bound that catches a small but steady bias.
    assert summary.within_ten_percent >= 0.8, summary
    assert summary.gap_mean <= 0.05, summary


def test_weights_three_to_one_converge_to_shares_of_three_to_one(
    make_cluster: Callable[..., Cluster],
) -> None:
    summary = contend(make_cluster, fairness.Contention.quick((1, 3)))
    assert summary.samples >= 5, summary.timeline
    # CI's short run on two busy cores: pods finish (and hand their room on) in bursts, so the
    # bounds are looser than the long form's (bench/fairness.py --weights 1:3: 2.99, 0.9 %).
    assert 2.5 <= summary.ratio <= 3.5, summary
    # Converged: the last half of the contended samples hold 3:1 within 20 %.
    assert summary.late_gap_mean <= 0.20, summary
