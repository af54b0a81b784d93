"""Job-level affinity and NUMA end to end: real processes (store server, dispatcher, two scheduler
shards, binders, a node agent), driven through the CLI. The teardown's audit checks both rules
on the live store (a job's pods in one domain; NUMA assignments that fit and are never shared
when exclusive)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import Cluster, wait_until

pytestmark = pytest.mark.e2e


def pods_of(cluster: Cluster, job: str) -> list[pb.Pod]:
    return cluster.client.list("Pod", job=job)  # type: ignore[return-value]


def gang_yaml(name: str, replicas: int, *, extra: str = "") -> str:
    return (
        f"apiVersion: godel/v1\nkind: Job\nmetadata: {{name: {name}}}\n"
        f"spec:\n  replicas: {replicas}\n  minMember: {replicas}\n{extra}"
        f"  template:\n    requests: {{cpu: '1', memory: 100Mi}}\n"
    )


@contextlib.contextmanager
def rack_agents(cluster: Cluster, racks: dict[str, int]) -> Iterator[None]:
    """One node agent per rack, as an operator adds machines: ``count`` hollow nodes of 4 cpu
    labelled rack=<name>, named <name>-<i>, each agent with its own certificate naming them.
    Stopped (SIGTERM) at the end."""
    for rack in racks:
        cluster.godel(
            "certs", "issue", f"rack-{rack}", "--role", "nodeagent", "--node", f"{rack}-*"
        )
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-P",
                "-m",
                "services.nodeagent",
                "--name",
                f"rack-{rack}",
                "--port",
                "0",
                "--store-url",
                cluster.state.store_url,
                "--hollow-nodes",
                str(count),
                "--node-prefix",
                rack,
                "--hollow-labels",
                f"rack={rack}",
                "--process-node",
                "false",
                "--log-format",
                "json",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=cluster.home.path,
        )
        for rack, count in racks.items()
    ]
    try:
        yield
    finally:
        for agent in agents:
            agent.send_signal(signal.SIGTERM)
        for agent in agents:
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()


def test_gang_lands_in_one_rack_or_waits_explained(make_cluster: Callable[..., Cluster]) -> None:
    """12 nodes of 4 cpu in two racks: a (4 nodes) and b (8). A gang of 10 one-cpu pods that
    must share a rack lands whole in rack a, the tightest that holds it; a gang of 40 fits no
    single rack (b holds 32) and stays pending, `godel explain` saying so."""
    cluster = make_cluster(schedulers=2, hollow_nodes=0)
    with rack_agents(cluster, {"a": 4, "b": 8}):
        _gang_in_one_rack(cluster)


def _gang_in_one_rack(cluster: Cluster) -> None:
    wait_until(lambda: len(cluster.client.list("Node")) == 12, what="12 nodes registered")
    rack_of = {n.metadata.name: n.metadata.labels["rack"] for n in cluster.client.list("Node")}  # type: ignore[attr-defined]
    affinity = "  jobAffinity: {requiredTopologyKeys: [rack]}\n"
    cluster.godel("apply", "-f", "-", stdin=gang_yaml("ten", 10, extra=affinity))
    cluster.godel("apply", "-f", "-", stdin=gang_yaml("forty", 40, extra=affinity))

    def placed() -> list[pb.Pod] | None:
        pods = pods_of(cluster, "ten")
        return pods if len(pods) == 10 and all(p.spec.node_name for p in pods) else None

    ten = wait_until(placed, timeout=120, what="the gang of 10 bound")
    assert {rack_of[p.spec.node_name] for p in ten} == {"a"}

    def explained() -> str:
        summary = cluster.client.explain("forty-0").summary
        return summary if "rack" in summary else ""

    summary = wait_until(explained, timeout=120, what="an explanation for the gang of 40")
    assert "no single rack domain with room for the whole gang (40 pods)" in summary
    assert not any(p.spec.node_name for p in pods_of(cluster, "forty"))
    out = cluster.godel("explain", "forty-0").stdout
    assert "no single rack domain" in out


def test_exclusive_numa_nodes_are_never_shared(make_cluster: Callable[..., Cluster]) -> None:
    """3 hollow nodes of 2 sockets × 2 NUMA nodes (1 cpu each) and 16 single-pod jobs that each
    want a whole NUMA node, submitted at once to two shards: exactly 12 bind, every one on its
    own (node, NUMA node), `get pods -o wide` shows the assignment; the other 4 wait, explained."""
    shape = ("--hollow-numa-per-socket", "2", "--hollow-sockets", "2")
    cluster = make_cluster(schedulers=2, hollow_nodes=3, service_args=(("nodeagent", shape),))
    wait_until(lambda: len(cluster.client.list("Node")) == 3, what="3 nodes registered")
    docs = "---\n".join(
        f"apiVersion: godel/v1\nkind: Job\nmetadata: {{name: x{i}}}\n"
        "spec:\n  replicas: 1\n  minMember: 1\n"
        "  template: {requests: {cpu: 500m, memory: 100Mi}, numaPolicy: EXCLUSIVE}\n"
        for i in range(16)
    )
    cluster.godel("apply", "-f", "-", stdin=docs)

    def settled() -> list[pb.Pod] | None:
        pods: list[pb.Pod] = cluster.client.list("Pod")  # type: ignore[assignment]
        placed = [p for p in pods if p.spec.node_name]
        waiting = [p for p in pods if not p.spec.node_name]
        explained = all(
            any(c.type == "PodScheduled" and c.status == "False" for c in p.status.conditions)
            for p in waiting
        )
        return placed if len(pods) == 16 and len(placed) == 12 and explained else None

    placed = wait_until(settled, timeout=120, what="12 bound, the rest explained")
    held = [(p.spec.node_name, tuple(p.spec.numa_nodes)) for p in placed]
    assert all(len(ids) == 1 for _, ids in held), held
    assert len(set(held)) == 12, held
    wide = cluster.godel("get", "pods", "-o", "wide").stdout
    assert "NUMA" in wide.splitlines()[0]
    pod = placed[0]
    line = next(ln for ln in wide.splitlines() if ln.startswith(pod.metadata.name + " "))
    assert f" {pod.spec.numa_nodes[0]} " in f" {line} "
    waiting = [p for p in cluster.client.list("Pod") if not p.spec.node_name]  # type: ignore[attr-defined]
    why = [" ".join(c.message for c in p.status.conditions) for p in waiting]
    assert all("not enough free NUMA nodes on one socket" in w for w in why), why
