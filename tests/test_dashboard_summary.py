"""The dashboard's summary, table-driven: heatmap cells, pending reasons, per-pool utilisation
from pod events, binds per second with their latency, and a size that does not grow with the
cluster. (The page itself is tested in a real browser: tests/e2e/test_dashboard.py.)"""

from __future__ import annotations

import time

import orjson
import pytest

from protos.godel.v1 import objects_pb2 as pb
from services.dashboard.summary import (
    WAITING,
    ClusterTracker,
    heatmap,
    lease_summary,
    movement_summary,
    pending_reason,
    queue_summary,
)
from tests import factories as f

HEATMAP_CASES = [
    # (case, utilisations, max cells, expected cells, expected nodes per cell)
    ("no nodes", [], 4, [], 1),
    ("one cell per node when they fit", [0.0, 0.5, 1.0], 4, [0, 50, 100], 1),
    ("runs of nodes averaged", [0.0, 1.0, 0.5, 0.5, 0.2], 3, [50, 50, 20], 2),
    ("no capacity in the pool", [-1.0, -1.0, 0.4], 3, [-1, -1, 40], 1),
    ("nodes without capacity left out of a run's mean", [-1.0, 0.6, -1.0, -1.0], 2, [60, -1], 2),
]


@pytest.mark.parametrize(
    ("values", "max_cells", "cells", "per_cell"),
    [case[1:] for case in HEATMAP_CASES],
    ids=[case[0] for case in HEATMAP_CASES],
)
def test_heatmap_cells(
    values: list[float], max_cells: int, cells: list[int], per_cell: int
) -> None:
    assert heatmap(values, max_cells) == (cells, per_cell)


def _pending(message: str | None, counts: tuple[tuple[str, int], ...] = ()) -> pb.Pod:
    pod = pb.Pod(metadata=pb.ObjectMeta(name="p"), status=pb.PodStatus(phase=pb.POD_PENDING))
    if message is not None:
        pod.status.conditions.add(
            type="PodScheduled", status="False", reason="Unschedulable", message=message
        )
    for reason, nodes in counts:  # the shard's diagnosis, as it stores it beside the message
        pod.status.unschedulable.reasons.add(reason=reason, nodes=nodes)
    return pod


REASON_CASES = [
    ("not looked at yet", None, (), WAITING),
    ("the reason most nodes gave", "0/50 nodes fit: 30 insufficient memory, 20 insufficient cpu",
     (("insufficient memory", 30), ("insufficient cpu", 20)), "insufficient memory"),
    ("a gang's counts: the node reasons, never the gang's",
     "0/12 nodes fit: 12 insufficient cpu; preemption: no node where preemption helps; "
     "min_member needs 20 pod(s) placed, 12 fit", (("insufficient cpu", 12),), "insufficient cpu"),
    ("a message without counts is its own reason (never parsed)",
     "0/3 nodes fit: 3 insufficient cpu", (), "0/3 nodes fit: 3 insufficient cpu"),
    ("a message of another form is its own reason", "the unit can never fit as specified", (),
     "the unit can never fit as specified"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("message", "counts", "reason"),
    [c[1:] for c in REASON_CASES],
    ids=[c[0] for c in REASON_CASES],
)
def test_pending_reason(
    message: str | None, counts: tuple[tuple[str, int], ...], reason: str
) -> None:
    assert pending_reason(_pending(message, counts)) == reason


def _node(name: str, cpu: int = 4000, memory: int = 8 << 30, reclaimable_cpu: int = 0) -> pb.Node:
    return pb.Node(
        metadata=pb.ObjectMeta(name=name),
        status=pb.NodeStatus(
            ready=True,
            allocatable=pb.Resources(milli_cpu=cpu, memory_bytes=memory, pods=110),
            reclaimable=pb.Resources(milli_cpu=reclaimable_cpu, memory_bytes=0),
        ),
    )


def _pod(
    name: str,
    cpu: int,
    *,
    node: str = "",
    qos: int = pb.QOS_GUARANTEED,
    queue: str = "default",
    job: str = "j",
) -> pb.Pod:
    pod = pb.Pod(
        metadata=pb.ObjectMeta(name=name, creation_timestamp_ms=int(time.time() * 1000) - 250),
        spec=pb.PodSpec(node_name=node, qos=qos, queue=queue, job=job),
        status=pb.PodStatus(phase=pb.POD_BOUND if node else pb.POD_PENDING),
    )
    pod.spec.template.requests.milli_cpu = cpu
    if node:
        pod.status.bound_ms = pod.metadata.creation_timestamp_ms + 250
    return pod


def test_pod_events_drive_utilisation_pending_reasons_and_throughput() -> None:
    tracker = ClusterTracker(window_seconds=60, max_cells=16)
    tracker.on_add("Node", _node("a"))
    tracker.on_add("Node", _node("b", reclaimable_cpu=2000))
    pending = _pod("p", 1000)
    tracker.on_add("Pod", pending)
    assert tracker.pending_reasons() == [{"reason": WAITING, "pods": 1}]

    bound = _pod("p", 1000, node="a")
    tracker.on_update("Pod", pending, bound)
    best_effort = _pod("q", 1000, node="b", qos=pb.QOS_BEST_EFFORT)
    tracker.on_add("Pod", best_effort)  # seen bound from the start: a listing, not a bind

    nodes = tracker.node_summary()
    assert nodes["total"] == 2 and nodes["ready"] == 2
    assert nodes["pools"]["guaranteed"]["cells"] == [25, 0]
    assert nodes["pools"]["best_effort"]["cells"] == [-1, 50]
    assert tracker.pending_reasons() == []
    assert tracker.pod_summary()["bound"] == 2

    series = tracker.throughput()
    assert sum(series["bound"]) == 1, "only the observed bind counts"
    assert [v for v in series["p50_ms"] if v is not None] == [250]

    finished = _pod("p", 1000, node="a")
    finished.status.phase = pb.POD_SUCCEEDED
    tracker.on_update("Pod", bound, finished)
    assert tracker.node_summary()["pools"]["guaranteed"]["cells"] == [0, 0], "claim returned"
    tracker.on_delete("Pod", best_effort)
    assert tracker.node_summary()["pools"]["best_effort"]["cells"] == [-1, 0]


def test_summary_size_does_not_grow_with_the_cluster() -> None:
    tracker = ClusterTracker(window_seconds=300, max_cells=2048)
    for i in range(20_000):
        tracker.on_add("Node", _node(f"n{i:05d}"))
    nodes = tracker.node_summary()
    assert len(nodes["pools"]["guaranteed"]["cells"]) <= 2048
    assert nodes["pools"]["guaranteed"]["nodes_per_cell"] == 10
    size = len(orjson.dumps({"nodes": nodes, "throughput": tracker.throughput()}))
    assert size < 64 * 1024, f"{size} bytes for 20,000 nodes"


def test_recent_movements_newest_first_and_bounded() -> None:
    movements = [
        pb.Movement(
            metadata=pb.ObjectMeta(name=f"m{i:02d}", creation_timestamp_ms=1000 + i),
            spec=pb.MovementSpec(policy="binpacking", batch=i, deleted_tasks=[pb.TaskRef()] * 2),
            status=pb.MovementStatus(phase="Done"),
        )
        for i in range(15)
    ]
    rows = movement_summary(list(movements))
    assert [r["name"] for r in rows] == [f"m{i:02d}" for i in range(14, 4, -1)]
    assert rows[0] | {"created_ms": 0} == {
        "name": "m14", "policy": "binpacking", "batch": 14, "phase": "Done", "pods": 2,
        "created_ms": 0, "message": "",
    }  # fmt: skip


LEASE_CASES = [
    ("never taken", None, {"leader": None, "address": None, "epoch": 0}),
    ("released or expired", pb.Lease(name="binder", epoch=3),
     {"leader": None, "address": None, "epoch": 3}),
    ("held", pb.Lease(name="binder", holder="binder-1", holder_address="127.0.0.1:5", epoch=4),
     {"leader": "binder-1", "address": "127.0.0.1:5", "epoch": 4}),
    ("held by a process's incarnation", pb.Lease(name="binder", holder="binder-1/9f3a01bc",
     holder_address="127.0.0.1:5", epoch=5),
     {"leader": "binder-1", "address": "127.0.0.1:5", "epoch": 5}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("lease", "expected"), [c[1:] for c in LEASE_CASES], ids=[c[0] for c in LEASE_CASES]
)
def test_binder_leader(lease: pb.Lease | None, expected: dict[str, object]) -> None:
    assert lease_summary(lease) == expected


def _row(rows: list[dict[str, object]], name: str) -> dict[str, object]:
    [row] = [r for r in rows if r["name"] == name]
    return row


def test_the_default_queue_is_listed_without_a_queue_object_with_what_its_pods_hold() -> None:
    tracker = ClusterTracker(window_seconds=60, max_cells=16)
    tracker.on_add("Node", _node("a"))
    research = pb.Queue(metadata=pb.ObjectMeta(name="research"))
    research.spec.quota.milli_cpu = 8000
    research.status.pending_pods = 7
    assert [r["name"] for r in queue_summary([research], tracker.default_queue_status())] == [
        "default",
        "research",
    ], "listed while still empty"

    waiting = _pod("w-0", 500, job="w")
    tracker.on_add("Pod", waiting)
    tracker.on_add("Pod", _pod("w-1", 500, job="w"))
    tracker.on_add("Pod", _pod("x-0", 300, job="x", queue=""))  # stored before queue was set
    bound = _pod("b-0", 1000, node="a", job="b")
    tracker.on_add("Pod", bound)
    tracker.on_add("Pod", _pod("r-0", 2000, node="a", queue="research"))  # another queue's
    rows = queue_summary([research], tracker.default_queue_status())
    assert [r["name"] for r in rows] == ["default", "research"]
    default = _row(rows, "default")
    assert default["quota"] is None
    assert default["used"] == {"milli_cpu": 1000, "memory_bytes": 0, "gpus": 0, "pods": 1}
    assert (default["pending_pods"], default["pending_units"]) == (3, 2)
    assert _row(rows, "research")["pending_pods"] == 7  # a stored queue keeps its own status

    # w-0 binds, b-0 finishes: what the queue holds and what waits follow.
    tracker.on_update("Pod", waiting, _pod("w-0", 500, node="a", job="w"))
    finished = _pod("b-0", 1000, node="a", job="b")
    finished.status.phase = pb.POD_SUCCEEDED
    tracker.on_update("Pod", bound, finished)
    default = _row(queue_summary([research], tracker.default_queue_status()), "default")
    assert default["used"] == {"milli_cpu": 500, "memory_bytes": 0, "gpus": 0, "pods": 1}
    assert (default["pending_pods"], default["pending_units"]) == (2, 2)


def test_a_stored_default_queue_is_listed_once_with_its_own_status() -> None:
    stored = pb.Queue(metadata=pb.ObjectMeta(name="default"))
    stored.spec.quota.milli_cpu = 4000
    stored.status.pending_pods = 2
    rows = queue_summary([stored], pb.QueueStatus(pending_pods=99))
    assert [(r["name"], r["pending_pods"]) for r in rows] == [("default", 2)]
    assert rows[0]["quota"] == {"milli_cpu": 4000, "memory_bytes": 0, "gpus": 0, "pods": 0}


def test_gpu_cards_by_model_count_the_cards_unfinished_pods_hold() -> None:
    tracker = ClusterTracker()
    for name, cards, model in (("a", 8, "V100M32"), ("b", 8, "V100M32"), ("c", 2, "T4")):
        node = _node(name)
        node.status.allocatable.gpus, node.status.gpu_model = cards, model
        tracker.on_add("Node", node)
    tracker.on_add("Node", _node("cpu-only"))
    whole = _pod("whole", 1000, node="a")
    whole.spec.gpu_cards.extend([0, 1])
    shares = [_pod(f"share{i}", 1000, node="c") for i in range(2)]
    for pod in shares:  # two shares of one card: one card in use
        pod.spec.gpu_cards.append(1)
        pod.spec.template.gpu_milli = 300
    for pod in (whole, *shares):
        tracker.on_add("Pod", pod)
    assert tracker.gpu_summary() == [
        {"model": "V100M32", "nodes": 2, "cards": 16, "used": 2},
        {"model": "T4", "nodes": 1, "cards": 2, "used": 1},
    ]
    finished = _pod("whole", 1000, node="a")
    finished.status.phase = pb.POD_SUCCEEDED
    tracker.on_update("Pod", whole, finished)
    tracker.on_delete("Pod", shares[0])
    assert [row["used"] for row in tracker.gpu_summary()] == [0, 1]


def test_gangs_by_phase_show_prescheduling_and_timeout_as_the_api_names_them() -> None:
    """The dashboard counts gangs by their stored phase (one-pod and minMember-1 jobs aside),
    as `godel get jobs` shows them."""
    tracker = ClusterTracker()
    gang = f.job("g", replicas=3, min_member=3)
    gang.status.phase = pb.JOB_PRESCHEDULING
    other = f.job("h", replicas=2, min_member=2)
    other.status.phase = pb.JOB_PRESCHEDULING
    tracker.on_add("Job", gang)
    tracker.on_add("Job", other)
    tracker.on_add("Job", f.job("solo", replicas=1))
    tracker.on_add("Job", f.job("deployment", replicas=4, min_member=1))
    assert tracker.gang_summary() == [{"phase": "PreScheduling", "jobs": 2}]
    timed_out = pb.Job()
    timed_out.CopyFrom(gang)
    timed_out.status.phase = pb.JOB_TIMEOUT
    tracker.on_update("Job", gang, timed_out)
    assert tracker.gang_summary() == [
        {"phase": "PreScheduling", "jobs": 1},
        {"phase": "Timeout", "jobs": 1},
    ]
    tracker.on_delete("Job", timed_out)
    assert tracker.gang_summary() == [{"phase": "PreScheduling", "jobs": 1}]


def test_reservations_counted_and_the_soonest_listed() -> None:
    from services.dashboard.summary import reservation_summary
    from tests import factories as f

    live = [
        f.reservation(f"r{i:02d}", f"n{i}", job="train", cpu=500, mem=f.GiB, ttl=100 - i)
        for i in range(25)
    ]
    live.append(f.reservation("waiting", "", selector="app=web", cpu=1000, ttl=1))
    summary = reservation_summary(live)
    # The pending one holds no room yet, but is listed (it expires first).
    assert (summary["count"], summary["milli_cpu"], summary["memory_bytes"]) == (
        26,
        25 * 500,
        25 * f.GiB,
    )
    assert [r["name"] for r in summary["soonest"]][:3] == ["waiting", "r24", "r23"]
    assert len(summary["soonest"]) == 20
    assert summary["soonest"][0] | {"expires_ms": 0} == {
        "name": "waiting", "node": "", "owner": "app=web", "milli_cpu": 1000,
        "memory_bytes": f.GiB, "expires_ms": 0,
    }  # fmt: skip


def test_gpu_fragmentation_is_the_reschedulers_figure_and_follows_the_pods() -> None:
    """Two 2-card nodes with a 300 share each (mix {300 ×2}): each strands its 700-free card
    for a whole card (the rescheduler's expected fragmentation, placement.gpu.gpu_figures),
    1,400 of 3,400 free; the shares gone, nothing is stranded and both nodes are whole."""
    tracker = ClusterTracker()
    for name in ("a", "b"):
        node = _node(name, cpu=10_000)
        node.status.allocatable.gpus, node.status.gpu_model = 2, "T4"
        tracker.on_add("Node", node)
    shares = [_pod(f"share-{name}", 1000, node=name) for name in ("a", "b")]
    for pod in shares:
        pod.spec.template.requests.gpus = 1
        pod.spec.template.gpu_milli = 300
        pod.spec.gpu_cards.append(0)
        tracker.on_add("Pod", pod)
    # Mix {300 ×2}: a 300 share fits every card: nothing stranded, yet no node is whole.
    assert tracker.gpu_fragmentation() == {
        "expected_percent": 0.0,
        "fragmentation_percent": 100.0,
        "whole_free_nodes": 0,
        "free_gpus": 3.4,
    }
    whole = _pod("whole", 1000, node="b")
    whole.spec.template.requests.gpus = 1
    whole.spec.gpu_cards.append(1)
    tracker.on_add("Pod", whole)
    # Mix {300 ×2, 1 card}: a's 700 card is stranded for the card (weight 1), b's too: 1,400
    # of 2,400 free, over 3 shapes.
    figures = tracker.gpu_fragmentation()
    assert figures["expected_percent"] == round(100 * 1400 / (3 * 2400), 1)
    for pod in shares:
        tracker.on_delete("Pod", pod)
    assert tracker.gpu_fragmentation() == {
        "expected_percent": 0.0,
        "fragmentation_percent": round(100 * 1000 / 3000, 1),
        "whole_free_nodes": 1,
        "free_gpus": 3.0,
    }
