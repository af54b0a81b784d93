"""Movements as the services share them: recording where replacements landed (actual vs
mismatched), the failure ratio, liveness, and the shard's handshake (acknowledging, preferring
recommended nodes, waiting for a swap's room) — tables over plain objects, plus the search's
preference for recommended nodes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import pytest

from placement.framework import Framework, PodInfo, Profile, UnitInfo
from placement.nodeinfo import NodeInfo
from placement.plugins import new_in_tree_registry
from placement.rules import hard_rules
from placement.search import UnitScheduler
from placement.snapshot import Snapshot
from protos.godel.v1 import objects_pb2 as pb
from services import movements as shared
from services.rescheduler.executor import ExecutionConfig
from services.rescheduler.framework import Move
from services.rescheduler.movements import build_movement, failure_ratio, movement_name
from services.rescheduler.view import build_view
from services.scheduler.movements import MovementTracker
from tests.factories import job, node, pods_of


def movement(
    name: str = "m",
    *,
    recommended: dict[str, dict[str, int]] | None = None,  # job -> node -> desired
    deleted: Sequence[tuple[str, str]] = (),  # (pod, node)
    phase: str = shared.ACKNOWLEDGING,
    age_ms: int = 0,
    ttl_ms: int = 600_000,
) -> pb.Movement:
    now = int(time.time() * 1000)
    m = pb.Movement(metadata=pb.ObjectMeta(name=name, creation_timestamp_ms=now - age_ms))
    m.spec.deadline_ms = now - age_ms + ttl_ms
    for pod, where in deleted:
        m.spec.deleted_tasks.add(pod=pod, node=where)
    for job_name, nodes in (recommended or {"web": {"n1": 1}}).items():
        owner = m.status.owners.add(job=job_name)
        for n, count in nodes.items():
            owner.recommended_nodes.add(node=n, desired_pod_count=count)
    m.status.phase = phase
    return m


def bound(name: str, job_name: str, on: str) -> pb.Pod:
    pod = pb.Pod(metadata=pb.ObjectMeta(name=name, uid=f"uid-{name}"))
    pod.spec.job, pod.spec.node_name = job_name, on
    return pod


@dataclass
class LandingCase:
    id: str
    recommended: dict[str, dict[str, int]]
    landed: list[tuple[str, str, str]]  # (pod, job, node)
    actual: dict[str, list[str]]  # node -> pods recorded there
    mismatched: list[str]
    ratio: float


LANDINGS = [
    LandingCase("on its recommendation", {"web": {"n1": 1}}, [("r1", "web", "n1")],
                {"n1": ["r1"]}, [], 0.0),
    LandingCase("elsewhere", {"web": {"n1": 1}}, [("r1", "web", "n2")], {}, ["r1"], 1.0),
    LandingCase("beyond the desired count goes to mismatched", {"web": {"n1": 1}},
                [("r1", "web", "n1"), ("r2", "web", "n1")], {"n1": ["r1"]}, ["r2"], 1.0),
    LandingCase("mismatched capped at the desired total", {"web": {"n1": 1}},
                [("r1", "web", "n2"), ("r2", "web", "n3")], {}, ["r1"], 1.0),
    LandingCase("two nodes, half right", {"web": {"n1": 1, "n2": 1}},
                [("r1", "web", "n1"), ("r2", "web", "n3")], {"n1": ["r1"]}, ["r2"], 0.5),
    LandingCase("a job the movement does not list is ignored", {"web": {"n1": 1}},
                [("x1", "other", "n1")], {}, [], 0.0),
    LandingCase("recording twice changes nothing", {"web": {"n1": 2}},
                [("r1", "web", "n1"), ("r1", "web", "n1")], {"n1": ["r1"]}, [], 0.0),
]  # fmt: skip


@pytest.mark.parametrize("case", LANDINGS, ids=[c.id for c in LANDINGS])
def test_record_landing_and_failure_ratio(case: LandingCase) -> None:
    m = movement(recommended=case.recommended)
    shared.record_landing([bound(p, j, n) for p, j, n in case.landed])(m)
    owner = m.status.owners[0]
    actual = {
        r.node: [t.pod for t in r.actual_pods] for r in owner.recommended_nodes if r.actual_pods
    }
    assert actual == case.actual
    assert [t.pod for t in owner.mismatched_tasks] == case.mismatched
    assert failure_ratio([m]) == pytest.approx(case.ratio)


def test_failure_ratio_of_no_recommendation_is_zero_not_nan() -> None:
    assert failure_ratio([]) == 0.0
    assert failure_ratio([pb.Movement()]) == 0.0


@pytest.mark.parametrize(
    ("phase", "age_ms", "ttl_ms", "expected"),
    [(shared.ACKNOWLEDGING, 0, 600_000, True), (shared.LANDING, 0, 600_000, True),
     (shared.DONE, 0, 600_000, False), (shared.STOPPED, 0, 600_000, False),
     (shared.EVICTING, 700_000, 600_000, False)],
    ids=["acknowledging", "landing", "done", "stopped", "past its deadline"],
)  # fmt: skip
def test_live(phase: str, age_ms: int, ttl_ms: int, expected: bool) -> None:
    m = movement(phase=phase, age_ms=age_ms, ttl_ms=ttl_ms)
    assert shared.live(m, int(time.time() * 1000)) is expected


def test_acknowledge_adds_the_shard_once() -> None:
    m = movement()
    assert shared.acknowledge("s1")(m) is True
    assert shared.acknowledge("s1")(m) is False
    assert list(m.status.notified_schedulers) == ["s1"]


# --------------------------------------------------------------------------------------------
# The shard's tracker
# --------------------------------------------------------------------------------------------


def tracker(holding: AbstractSet[tuple[str, str]] = frozenset()) -> MovementTracker:
    # No store: these tests never acknowledge (that is the e2e tests' part).
    return MovementTracker(None, "s1", lambda pod, n: (pod, n) in holding, max_wait_seconds=30)  # type: ignore[arg-type]


def test_tracker_prefers_open_recommendations_and_counts_its_proposals() -> None:
    t = tracker()
    t.on_add("Movement", movement("m1", recommended={"web": {"n1": 2, "n2": 1}}))
    assert t.preferences("web") == [("n1", "m1"), ("n1", "m1"), ("n2", "m1")]
    assert t.movement_of("web") == "m1" and t.movement_of("other") == ""
    t.proposed("r1", "m1", "web", "n1")
    assert t.preferences("web") == [("n1", "m1"), ("n2", "m1")]


def test_tracker_ignores_finished_and_expired_movements_and_forgets_deleted_ones() -> None:
    t = tracker()
    done = movement("m1", phase=shared.DONE)
    expired = movement("m2", age_ms=700_000)
    for m in (done, expired):
        t.on_add("Movement", m)
    assert t.preferences("web") == [] and t.movement_of("web") == ""
    live = movement("m3")
    t.on_add("Movement", live)
    assert t.movement_of("web") == "m3"
    t.on_delete("Movement", live)
    assert t.movement_of("web") == ""


def test_tracker_queues_an_acknowledgement_only_for_live_unacknowledged_movements() -> None:
    t = tracker()
    acked = movement("m1")
    acked.status.notified_schedulers.append("s1")
    for m in (acked, movement("m2", phase=shared.DONE), movement("m3")):
        t.on_add("Movement", m)
    assert t._to_ack == {"m3"}


@pytest.mark.parametrize(
    ("holding", "age_ms", "waits"),
    [({("old", "n1")}, 0, True), (set(), 0, False), ({("old", "n1")}, 40_000, False)],
    ids=["room still held by the movement's own pod", "room free", "waited long enough"],
)
def test_tracker_waits_for_a_swap_room_for_a_bounded_time(
    holding: set[tuple[str, str]], age_ms: int, waits: bool
) -> None:
    t = tracker(holding)
    t.on_add("Movement", movement(deleted=[("old", "n1")], age_ms=age_ms))
    reason = t.waiting_for("web")
    assert bool(reason) is waits
    if waits:
        assert "n1" in reason


# --------------------------------------------------------------------------------------------
# The search's preference
# --------------------------------------------------------------------------------------------


def snapshot_of(*names: str, cpu: int = 4000) -> Snapshot:
    return Snapshot.of(NodeInfo.from_node(node(n, cpu=cpu)) for n in names)


def unit(replicas: int, cpu: int, preferred: list[tuple[str, str]]) -> UnitInfo:
    pods = [PodInfo.from_pod(p) for p in pods_of(job("web", replicas=replicas, cpu=cpu))]
    return UnitInfo("web", 1, 0, 0, pods, preferred=preferred)


SEARCH = UnitScheduler(Framework(Profile(), new_in_tree_registry()))


@pytest.mark.parametrize(
    ("preferred", "cpu", "expected"),
    [
        ([("b", "m")], 1000, {"web-0": ("b", "m")}),
        ([("b", "m"), ("c", "m")], 1000, {"web-0": ("b", "m"), "web-1": ("c", "m")}),
        ([("b", "m")], 5000, {}),  # too big for the recommendation: placed as usual (nowhere)
        ([("nowhere", "m")], 1000, {"web-0": None}),
    ],
    ids=["one recommendation", "two recommendations", "does not fit", "unknown node"],
)
def test_search_tries_recommended_nodes_first(
    preferred: list[tuple[str, str]], cpu: int, expected: dict[str, tuple[str, str] | None]
) -> None:
    snap = snapshot_of("a", "b", "c")
    result = SEARCH.schedule(unit(len(preferred), cpu, preferred), snap)
    got = {p.pod: (p.node, p.recommendation) for p in result.placements}
    for pod, want in expected.items():
        if want is None:
            assert got[pod][1] == ""  # placed, but not on a recommendation
        else:
            assert got[pod] == want
    if not expected:
        assert result.placements == []


def test_a_recommended_node_filled_by_a_recommendation_is_rechecked_before_reuse() -> None:
    # b is both recommended and the best cached candidate; after the recommendation fills it,
    # the next pod must not be placed there too.
    snap = snapshot_of("a", "b", cpu=1000)
    result = SEARCH.schedule(unit(2, 1000, [("b", "m")]), snap)
    assert sorted((p.node, p.recommendation) for p in result.placements) == [("a", ""), ("b", "m")]


def test_proposals_of_one_job_leave_another_jobs_recommendations_open() -> None:
    t = tracker()
    t.on_add("Movement", movement("m1", recommended={"a": {"n1": 2}, "b": {"n1": 2}}))
    t.proposed("a-0-r1", "m1", "a", "n1")
    t.proposed("a-1-r1", "m1", "a", "n1")
    assert t.preferences("a") == []
    assert t.preferences("b") == [("n1", "m1"), ("n1", "m1")]


def test_a_movement_of_a_full_part_stays_well_within_the_store_object_limit() -> None:
    """A batch of tens of thousands of moves goes as Movements of ExecutionConfig
    .moves_per_movement each; one such Movement must fit the store's 1 MiB object limit with
    room for the status the shards and the Binder add (acks, actual pods)."""

    count = ExecutionConfig().moves_per_movement
    nodes = [node(f"node-{i:05d}", cpu=64000, mem=256 << 30, gpus=8) for i in range(count // 10)]
    pods = []
    for i in range(count):
        pod = bound(
            f"train-{i // 100:04d}-{i % 100}-r1",
            f"train-{i // 100:04d}",
            nodes[i // 10].metadata.name,
        )
        pod.status.phase = pb.POD_RUNNING
        pod.metadata.uid = f"{i:032x}"
        pods.append(pod)
    view = build_view(nodes, pods, [], [], hard_rules())
    moves = [
        Move(p.metadata.name, p.spec.job, p.spec.node_name, nodes[0].metadata.name) for p in pods
    ]
    m = build_movement(
        policy="gpu-defrag", creator="BinPacking", generation=1795436264634, batch=0,
        moves=moves, view=view, deadline_ms=0, part=3,
    )  # fmt: skip
    for owner in m.status.owners:  # the Binder fills actual pods up to the desired counts
        for rec in owner.recommended_nodes:
            for i in range(rec.desired_pod_count):
                rec.actual_pods.add(pod=f"x{i}" * 3, uid="u" * 32, node=rec.node)
    assert m.ByteSize() * 2 < 1 << 20
    assert m.metadata.name == movement_name("gpu-defrag", 1795436264634, 0, 3)
    assert movement_name("p", 1, 0) == "p-1-0" and movement_name("p", 1, 0, 2) == "p-1-0-2"
