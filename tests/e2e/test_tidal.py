"""Tidal best-effort capacity end to end: real processes (store, dispatcher, shards, binders, a
node agent with tidal pools over hollow nodes). Online pods arriving on a node raise its online
usage; the node's reclaimable pool shrinks below its best-effort pods, which the agent has the
Binder evict (Reclaimed); their job replaces them elsewhere; no guaranteed pod is touched."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import Cluster, wait_until

pytestmark = pytest.mark.e2e

TIDAL_NODES = (
    "nodeagent",
    (
        "--hollow-cpu-milli", "8000",
        "--tidal", "true",
        "--tidal-reserve-percent", "10",
        "--tidal-interval-seconds", "0.5",
    ),
)  # fmt: skip


def pods(cluster: Cluster, job: str) -> list[pb.Pod]:
    return cluster.client.list("Pod", job=job)  # type: ignore[return-value]


def running(cluster: Cluster, job: str) -> list[pb.Pod]:
    return [p for p in pods(cluster, job) if p.status.phase == pb.POD_RUNNING]


def test_online_usage_pushes_best_effort_pods_elsewhere(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=3, service_args=(TIDAL_NODES,))
    # Empty nodes: the whole node less the 10 % reserve is reclaimable (not the static 50 %).
    wait_until(
        lambda: (
            [n.status.reclaimable.milli_cpu for n in cluster.client.list("Node")]  # type: ignore[attr-defined]
            == [7200] * 3
        ),
        what="tidal pools written",
    )
    batch = (
        "apiVersion: godel/v1\nkind: Job\nmetadata: {name: batch}\n"
        "spec:\n  replicas: 2\n  minMember: 1\n  qos: best-effort\n  priority: 0\n"
        "  preemptible: true\n  replaceLostPods: true\n"
        "  template:\n    requests: {cpu: '3', memory: 1Gi}\n"
    )
    cluster.godel("apply", "-f", "-", stdin=batch)
    wait_until(lambda: len(running(cluster, "batch")) == 2, timeout=120, what="batch running")
    crowded = sorted({p.spec.node_name for p in running(cluster, "batch")})

    # Online work lands where the batch runs: 6 of 8 CPUs in use leaves a pool of 1.2 CPUs.
    for i, node in enumerate(crowded):
        online = (
            f"apiVersion: godel/v1\nkind: Job\nmetadata: {{name: online-{i}}}\n"
            "spec:\n  replicas: 1\n  minMember: 1\n  priority: 100\n"
            "  template:\n    requests: {cpu: '6', memory: 1Gi}\n"
            f"    nodeSelector: {{hostname: {node}}}\n"
        )
        cluster.godel("apply", "-f", "-", stdin=online)

    def moved() -> bool:
        live = running(cluster, "batch")
        return len(live) == 2 and not {p.spec.node_name for p in live} & set(crowded)

    wait_until(moved, timeout=120, what="the batch pods replaced on the free node")
    evicted = [p for p in pods(cluster, "batch") if p.status.phase == pb.POD_FAILED]
    assert len(evicted) == 2
    assert {p.status.reason for p in evicted} == {"Reclaimed"}
    assert {p.spec.node_name for p in evicted} == set(crowded)
    # Guaranteed pods untouched: every online pod runs where it was put.
    for i, node in enumerate(crowded):
        (online_pod,) = pods(cluster, f"online-{i}")
        assert (online_pod.status.phase, online_pod.spec.node_name) == (pb.POD_RUNNING, node)
    for node in cluster.client.list("Node"):
        assert isinstance(node, pb.Node)
        if node.metadata.name in crowded:
            assert node.status.reclaimable.milli_cpu == 1200
    why = cluster.godel("explain", evicted[0].metadata.name).stdout
    assert "Reclaimed" in why
