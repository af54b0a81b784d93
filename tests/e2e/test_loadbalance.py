"""LoadBalance on measured load, end to end: node agents report what their nodes carry, the
rescheduler's load-balance round moves a pod off a node hot by that load (though its requests
are low), and the load follows the pod; `godel get nodes -o wide` shows it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from godel.client import ReschedulerClient
from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import Cluster, wait_until
from tests.e2e.test_rescheduler import TWO_NODES, cordon, pods_on
from tests.factories import job as make_job

pytestmark = pytest.mark.e2e


def measured_cpu(cluster: Cluster, node: str) -> int | None:
    obj = cluster.client.get("Node", node)
    assert isinstance(obj, pb.Node)
    return obj.status.load.milli_cpu if obj.status.HasField("load") else None


def test_a_round_moves_a_pod_off_a_node_hot_by_measured_load(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2, service_args=(TWO_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 2, 60, "2 nodes")
    n1, n2 = sorted(n.metadata.name for n in cluster.client.list("Node"))  # type: ignore[attr-defined]
    # n1: two 1-CPU pods that use 180 % of what they request: 50 % requested, 90 % carried.
    hot = make_job("hot", replicas=2, cpu=1000)
    hot.spec.template.hollow_usage_percent = 180
    cordon(cluster, n2, True)
    cluster.client.submit([hot])
    wait_until(lambda: len(pods_on(cluster, n1)) == 2, 60, "the hot pods running on n1")
    # n2: one 1-CPU pod using what it asked: 25 %.
    cordon(cluster, n2, False)
    cordon(cluster, n1, True)
    cluster.client.submit([make_job("calm", cpu=1000)])
    wait_until(lambda: len(pods_on(cluster, n2)) == 1, 60, "the calm pod running on n2")
    cordon(cluster, n1, False)
    wait_until(
        lambda: measured_cpu(cluster, n1) == 3600 and measured_cpu(cluster, n2) == 1000,
        60,
        "the agents' load reports",
    )
    wide = cluster.godel("get", "nodes", "-o", "wide").stdout
    assert "CPU-LOAD" in wide and "NET-LOAD" in wide
    assert "3600m (90%)" in wide, wide

    with ReschedulerClient(cluster.state.address_of("rescheduler")) as client:
        [plan] = client.trigger("load-balance").plans
    assert plan.outcome == "planned", plan.message
    # Each hot pod is estimated at 45 %: one leaves, n1 drops to 45 %, n2 rises to 70 %.
    assert [(m.pod, m.from_node, m.to_node) for m in plan.moves] == [("hot-0", n1, n2)]
    assert plan.evicted == 1
    wait_until(
        lambda: len(pods_on(cluster, n1)) == 1 and len(pods_on(cluster, n2)) == 2,
        60,
        "the replacement running on n2",
    )
    # The load followed the pod: the agents measure n1 at 45 % and n2 at 70 % now.
    wait_until(
        lambda: measured_cpu(cluster, n1) == 1800 and measured_cpu(cluster, n2) == 2800,
        60,
        "the loads after the move",
    )
    with ReschedulerClient(cluster.state.address_of("rescheduler")) as client:
        [again] = client.trigger("load-balance", dry_run=True).plans
    assert again.moves == [] and again.detected_nodes == 0
