"""UnitQueue — the dispatcher's queue of pending units (ordering, quota, backoff): pure and
synchronous, table-driven, no store, no gRPC, no event loop."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction

import pytest

from placement.nodeinfo import GUARANTEED
from placement.resources import Quantities
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching import unitqueue
from services.dispatcher.dispatching.entries import Claim, JobShare
from services.dispatcher.dispatching.feed import ViewFeed
from services.dispatcher.dispatching.queueing import FAIRNESS, PendingUnit
from services.dispatcher.dispatching.unitqueue import (
    MAX_HELD_PER_ROUND,
    BackoffSettings,
    UnitEntry,
    UnitQueue,
    UnitState,
)
from services.dispatcher.objects import PODS_CREATED_ANNOTATION
from tests import factories as f


@dataclass
class World:
    """The jobs and queues a UnitQueue looks up, and the queue under test."""

    jobs: dict[str, pb.Job] = field(default_factory=dict)
    queues: dict[str, pb.Queue] = field(default_factory=dict)
    backoff: BackoffSettings = field(default_factory=BackoffSettings)
    uq: UnitQueue = field(init=False)

    def __post_init__(self) -> None:
        self.uq = UnitQueue(self.jobs.get, self.queues.get, self.backoff)

    def submit(
        self,
        name: str,
        *,
        queue: str = "default",
        replicas: int = 1,
        priority: int = 0,
        created: int = 0,
        cpu: int = 100,
    ) -> list[pb.Pod]:
        job = f.job(name, replicas=replicas, cpu=cpu)
        job.spec.queue = queue
        job.spec.priority = priority
        job.metadata.creation_timestamp_ms = created
        self.jobs[name] = job
        pods = f.pods_of(job)
        for pod in pods:
            pod.spec.queue = queue
            self.uq.add_pod(pod, now_ms=created)
        return pods

    def queue(
        self, name: str, *, sort: int = pb.SORT_FIFO, quota: pb.Resources | None = None
    ) -> None:
        spec = pb.QueueSpec(sort_policy=sort)  # type: ignore[arg-type]
        if quota is not None:
            spec.quota.CopyFrom(quota)
        self.queues[name] = pb.Queue(metadata=pb.ObjectMeta(name=name), spec=spec)
        self.uq.queue_changed(name)

    def take(self, *, accept: int = 10**9, now: float = 0.0) -> list[str]:
        """One round with a placer that accepts the first ``accept`` units: the jobs sent."""
        sent: list[str] = []

        def place(entry: UnitEntry, unit: PendingUnit) -> bool:
            if len(sent) >= accept:
                return False
            sent.append(entry.job)
            self.uq.dispatched(entry, "shard-0", unit)
            return True

        self.uq.round(now, place, lambda: len(sent) < accept)
        return sent


def bound(pod: pb.Pod, node: str = "n1") -> pb.Pod:
    copy = pb.Pod()
    copy.CopyFrom(pod)
    copy.spec.node_name = node
    copy.status.phase = pb.POD_BOUND
    return copy


# ---------------------------------------------------------------------------------------------
# Order: within a queue by its policy, between queues round-robin
# ---------------------------------------------------------------------------------------------

# (case, queue specs {name: sort policy}, submissions (job, queue, priority, created), sent order)
ORDER_CASES: list[tuple[str, dict[str, int], list[tuple[str, str, int, int]], list[str]]] = [
    ("fifo by creation time", {"q": pb.SORT_FIFO},
     [("b", "q", 0, 2), ("a", "q", 0, 1), ("c", "q", 0, 3)], ["a", "b", "c"]),
    ("priority queue: highest first", {"q": pb.SORT_PRIORITY},
     [("low", "q", 1, 1), ("high", "q", 9, 2), ("mid", "q", 5, 3)], ["high", "mid", "low"]),
    ("no Queue object: fifo", {},
     [("late", "default", 9, 2), ("early", "default", 0, 1)], ["early", "late"]),
    ("queues alternate, by name first", {"a": pb.SORT_FIFO, "b": pb.SORT_FIFO},
     [("b1", "b", 0, 1), ("b2", "b", 0, 2), ("a1", "a", 0, 3), ("a2", "a", 0, 4)],
     ["a1", "b1", "a2", "b2"]),
    ("a drained queue drops out of the rotation", {"a": pb.SORT_FIFO, "b": pb.SORT_FIFO},
     [("a1", "a", 0, 1), ("b1", "b", 0, 2), ("b2", "b", 0, 3), ("b3", "b", 0, 4)],
     ["a1", "b1", "b2", "b3"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("queues", "submissions", "expected"),
    [c[1:] for c in ORDER_CASES],
    ids=[c[0] for c in ORDER_CASES],
)
def test_round_order(
    queues: dict[str, int], submissions: list[tuple[str, str, int, int]], expected: list[str]
) -> None:
    w = World()
    for name, sort in queues.items():
        w.queue(name, sort=sort)
    for job, queue, priority, created in submissions:
        w.submit(job, queue=queue, priority=priority, created=created)
    assert w.take() == expected


def test_queue_change_rekeys_its_heap() -> None:
    w = World()
    w.queue("q", sort=pb.SORT_FIFO)
    w.submit("low", queue="q", priority=1, created=1)
    w.submit("high", queue="q", priority=9, created=2)
    w.queue("q", sort=pb.SORT_PRIORITY)
    assert [e.job for e in w.uq.queued("q")] == ["high", "low"]
    assert w.uq.position(w.uq.units["low"]) == 2
    assert w.take() == ["high", "low"]


# ---------------------------------------------------------------------------------------------
# Quota: bound usage + dispatched + the unit must fit
# ---------------------------------------------------------------------------------------------

# (case, quota, already bound cpu, units' cpu in order, sent, blocked resource of the first held)
QUOTA_CASES: list[tuple[str, pb.Resources | None, int, list[int], list[int], str]] = [
    ("no quota", None, 5000, [1000, 1000], [0, 1], ""),
    ("fits exactly", pb.Resources(milli_cpu=1000), 0, [600, 400], [0, 1], ""),
    ("dispatched units count in the same round", pb.Resources(milli_cpu=1000), 0,
     [600, 600], [0], "cpu"),
    ("bound pods count", pb.Resources(milli_cpu=1000), 800, [300], [], "cpu"),
    ("a smaller unit behind a held one still goes", pb.Resources(milli_cpu=1000), 500,
     [600, 400], [1], "cpu"),
    ("pod count quota", pb.Resources(pods=2), 0, [100, 100, 100], [0, 1], "pods"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("quota", "bound_cpu", "units", "sent", "blocked"),
    [c[1:] for c in QUOTA_CASES],
    ids=[c[0] for c in QUOTA_CASES],
)
def test_quota(
    quota: pb.Resources | None, bound_cpu: int, units: list[int], sent: list[int], blocked: str
) -> None:
    w = World()
    w.queue("q", quota=quota)
    if bound_cpu:
        (pod,) = w.submit("running", queue="q", cpu=bound_cpu)
        w.uq.remove_pod(pod)
        w.uq.add_pod(bound(pod), now_ms=0)
        w.uq.drop_if_empty("running")
    for i, cpu in enumerate(units):
        w.submit(f"u{i}", queue="q", cpu=cpu, created=i + 1)
    assert w.take() == [f"u{i}" for i in sent]
    held = [w.uq.units[f"u{i}"] for i in range(len(units)) if i not in sent]
    assert (held[0].blocked if held else "") == blocked
    assert all(e.state == UnitState.QUEUED and e.in_heap for e in held)


def test_release_returns_reserved_quota() -> None:
    w = World()
    w.queue("q", quota=pb.Resources(milli_cpu=1000))
    w.submit("a", queue="q", cpu=1000, created=1)
    w.submit("b", queue="q", cpu=1000, created=2)
    assert w.take() == ["a"]
    w.uq.release(w.uq.units["a"])
    w.uq.back_off(w.uq.units["a"], now=0.0)
    assert w.take() == ["b"]
    assert w.uq.used("q").cpu == 1000


def test_a_refusing_placer_holds_at_most_the_round_budget() -> None:
    w = World()
    for i in range(MAX_HELD_PER_ROUND + 10):
        w.submit(f"u{i}", created=i)
    offered: list[str] = []

    def place(entry: UnitEntry, unit: PendingUnit) -> bool:
        offered.append(entry.job)
        return False

    w.uq.round(0.0, place, lambda: True)
    assert len(offered) == MAX_HELD_PER_ROUND
    assert len(w.uq.queued("default")) == MAX_HELD_PER_ROUND + 10  # all back in the queue


# ---------------------------------------------------------------------------------------------
# Backoff and the infeasible wait
# ---------------------------------------------------------------------------------------------

# (case, initial, max, attempts, expected delay of the last)
BACKOFF_CASES: list[tuple[str, float, float, int, float]] = [
    ("first attempt waits the initial delay", 1.0, 60.0, 1, 1.0),
    ("doubles", 1.0, 60.0, 3, 4.0),
    ("capped", 1.0, 60.0, 10, 60.0),
    ("other initial", 0.5, 2.0, 2, 1.0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("initial", "cap", "attempts", "expected"),
    [c[1:] for c in BACKOFF_CASES],
    ids=[c[0] for c in BACKOFF_CASES],
)
def test_backoff_delay(initial: float, cap: float, attempts: int, expected: float) -> None:
    w = World(backoff=BackoffSettings(initial, cap))
    w.submit("a")
    entry = w.uq.units["a"]
    delays = [w.uq.back_off(entry, now=100.0) for _ in range(attempts)]
    assert delays[-1] == expected
    assert entry.state == UnitState.BACKOFF and entry.not_before == 100.0 + expected


def test_backed_off_unit_waits_until_due() -> None:
    w = World(backoff=BackoffSettings(2.0, 60.0))
    w.submit("a")
    entry = w.uq.units["a"]
    assert w.take() == ["a"]
    w.uq.release(entry)
    w.uq.back_off(entry, now=10.0)
    assert w.uq.next_wake(10.0) == 2.0
    assert w.take(now=11.9) == []
    assert w.take(now=12.0) == ["a"]
    assert w.uq.next_wake(12.0) is None


def test_success_resets_attempts_and_settles() -> None:
    w = World()
    (pod,) = w.submit("a", replicas=1)
    entry = w.uq.units["a"]
    w.uq.back_off(entry, now=0.0)
    w.uq.succeeded(entry)
    assert (entry.state, entry.attempts) == (UnitState.SETTLING, 0)
    assert w.uq.settled("a")  # still has a pending pod: queued again
    assert entry.state == UnitState.QUEUED
    w.uq.settle(entry)
    w.uq.remove_pod(pod)
    assert not w.uq.settled("a")
    assert "a" not in w.uq.units  # nothing left pending: dropped


def test_infeasible_waits_for_a_cluster_change_or_the_recheck() -> None:
    w = World(backoff=BackoffSettings(infeasible_recheck_seconds=300.0))
    w.submit("a")
    w.submit("b")
    for job in ("a", "b"):
        w.uq.park_infeasible(w.uq.units[job], now=0.0)
    assert w.take(now=299.0) == []
    assert w.uq.wake_infeasible() == 2
    assert w.take(now=299.0) == ["a", "b"]
    w.submit("c")
    w.uq.park_infeasible(w.uq.units["c"], now=0.0)
    assert w.take(now=300.0) == ["c"]


# ---------------------------------------------------------------------------------------------
# Tracking and status
# ---------------------------------------------------------------------------------------------


def test_dispatched_unit_stays_tracked_without_pods() -> None:
    w = World()
    (pod,) = w.submit("a")
    assert w.take() == ["a"]
    w.uq.remove_pod(pod)
    w.uq.drop_if_empty("a")
    assert w.uq.units["a"].state == UnitState.DISPATCHED
    assert w.uq.forget("a") is not None
    assert w.uq.used("default").is_zero()


def test_statuses_count_pending_and_bound() -> None:
    w = World()
    pods = w.submit("a", queue="q", replicas=3, cpu=200)
    w.uq.remove_pod(pods[0])
    w.uq.add_pod(bound(pods[0]), now_ms=0)
    w.submit("b", queue="q", replicas=2)
    w.submit("c", queue="other")
    got = w.uq.statuses()
    assert (got["q"].pending_units, got["q"].pending_pods) == (2, 4)
    assert (got["q"].used.milli_cpu, got["q"].used.pods) == (200, 1)
    assert (got["other"].pending_units, got["other"].HasField("used")) == (1, False)


def test_counts_kept_as_units_come_go_and_change_state_match_the_units() -> None:
    """The per-queue counts (pending units and pods for the statuses; units not at a shard,
    for whether another queue waits) are kept as pods are added, bound and removed and units
    are sent, settle, back off, are parked, dropped or forgotten; after every step they equal
    a count over the units themselves."""
    rng = random.Random(42)
    w = World()
    pods: dict[str, list[pb.Pod]] = {}
    for i in range(9):
        pods[f"j{i}"] = w.submit(f"j{i}", queue="abc"[i % 3], replicas=1 + i % 3)

    def counted() -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for entry in w.uq.units.values():
            if entry.pods:
                units, n = out.get(entry.queue, (0, 0))
                out[entry.queue] = (units + 1, n + len(entry.pods))
        return out

    def others_wait(queue: str) -> bool:
        return any(
            e.pods and e.state != UnitState.DISPATCHED
            for e in w.uq.units.values()
            if e.queue != queue
        )

    for _ in range(800):
        job = rng.choice(sorted(pods))
        pod = rng.choice(pods[job])
        entry = w.uq.units.get(job)
        step = rng.randrange(10)
        if step == 0:
            w.uq.remove_pod(pod)
        elif step == 1:
            w.uq.add_pod(pod, now_ms=0)
        elif step == 2:
            w.uq.remove_pod(pod)
            w.uq.add_pod(bound(pod), now_ms=0)
        elif step == 3:
            w.take(accept=rng.randrange(3))
        elif step == 4 and entry is not None:
            w.uq.back_off(entry, now=0.0)
        elif step == 5 and entry is not None:
            w.uq.settle(entry)
        elif step == 6 and entry is not None:
            w.uq.park_infeasible(entry, now=0.0)
        elif step == 7 and entry is not None:
            w.uq.enqueue(entry)
        elif step == 8:
            w.uq.drop_if_empty(job)
        elif step == 9:
            w.uq.forget(job)
        got = {q: (s.pending_units, s.pending_pods) for q, s in w.uq.statuses().items()}
        assert {q: c for q, c in got.items() if c != (0, 0)} == counted(), step
        assert w.uq.pending_pods() == {q: n for q, (_, n) in counted().items()}, step
        for queue in "abc":
            assert w.uq._others_wait(queue) == others_wait(queue), (queue, step)


def test_unknown_job_is_held_not_sent() -> None:
    w = World()
    w.submit("a")
    del w.jobs["a"]
    assert w.take() == []
    assert w.uq.units["a"].state == UnitState.QUEUED


# ---------------------------------------------------------------------------------------------
# Fairness in the round, min and borrowed, reclaim needs
# ---------------------------------------------------------------------------------------------


def fair_world(fairness: str, *, node_cpu: int = 10_000, **queues: dict[str, int]) -> World:
    """A World whose cluster is one node of ``node_cpu``; ``queues``: name -> spec fields (cpu
    amounts: ``min``, ``weight``, ``bound`` = cpu its running pods already hold)."""
    w = World()
    w.uq.fairness = FAIRNESS[fairness]
    w.uq.set_node("n1", {GUARANTEED: Quantities(cpu=node_cpu, mem=64 * f.GiB, pods=110)})
    for name, spec in queues.items():
        qspec = pb.QueueSpec(weight=spec.get("weight", 0))
        if spec.get("min"):
            qspec.min.milli_cpu = spec["min"]
        w.queues[name] = pb.Queue(metadata=pb.ObjectMeta(name=name), spec=qspec)
        if spec.get("bound"):
            (pod,) = w.submit(f"{name}-running", queue=name, cpu=spec["bound"])
            w.uq.remove_pod(pod)
            w.uq.add_pod(bound(pod), now_ms=0)
            w.uq.drop_if_empty(f"{name}-running")
    return w


class _EveryKeyTurns:
    """The turn order as it was computed before ``_Turns``: every queue's key at every turn."""

    def __init__(self, key: Callable[[str], tuple[Fraction, str]], queues: Iterable[str]) -> None:
        self._key = key

    def next(self, budget: dict[str, int]) -> str | None:
        return min(budget, key=self._key) if budget else None

    def again(self, queue: str) -> None:
        pass


@pytest.mark.parametrize("fairness", ["drf", "fair-share"])
def test_turns_kept_in_a_heap_send_what_every_key_at_every_turn_sends(
    fairness: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rounds that recompute only the key of the queue that just went send the same units, in
    the same order, as rounds that recompute every queue's key at every turn: with weights,
    mins, maxes, bound pods, units too big for the room and rounds cut short."""
    rng = random.Random(fairness)
    kept_in_a_heap = unitqueue._Turns

    def run(turns: type, seed: int) -> list[list[str]]:
        monkeypatch.setattr(unitqueue, "_Turns", turns)
        pick = random.Random(seed)
        specs = {
            f"q{i}": {
                "weight": pick.choice([0, 1, 3]),
                "min": pick.choice([0, 0, 2000]),
                "bound": pick.choice([0, 1000, 4000]),
            }
            for i in range(pick.randint(2, 6))
        }
        w = fair_world(fairness, node_cpu=pick.choice([8000, 20_000, 60_000]), **specs)
        for name in specs:
            if pick.random() < 0.3:
                w.queues[name].spec.quota.milli_cpu = pick.choice([3000, 6000])
                w.uq.queue_changed(name)
        for i in range(pick.randint(5, 60)):
            cpu = pick.choice([100, 500, 2000, 9000])
            w.submit(f"j{i}", queue=pick.choice(sorted(specs)), cpu=cpu, created=i + 1)
        return [w.take(accept=pick.randint(1, 25)) for _ in range(3)]

    for trial in range(30):
        seed = rng.randrange(1 << 30)
        assert run(kept_in_a_heap, seed) == run(_EveryKeyTurns, seed), trial


# (case, fairness, queues {name: spec}, submissions [(job, queue, cpu)], sent in order)
FAIR_ROUND_CASES: list[tuple[str, str, dict[str, dict[str, int]], list[tuple[str, str, int]],
                             list[str]]] = [
    ("drf: the smaller share goes first, until no room", "drf",
     {"a": {"bound": 6000}, "b": {"bound": 2000}},
     [("a1", "a", 1000), ("b1", "b", 1000), ("b2", "b", 1000), ("b3", "b", 1000)],
     ["b1", "b2"]),
    ("drf: a larger share may not take the room the smaller waits for", "drf",
     {"a": {"bound": 6000}, "b": {"bound": 3000}},
     [("a1", "a", 500), ("b1", "b", 2000)], []),
    ("drf: shares alternate as units go", "drf", {"a": {}, "b": {}},
     [("a1", "a", 2000), ("a2", "a", 2000), ("b1", "b", 2000), ("b2", "b", 2000)],
     ["a1", "b1", "a2", "b2"]),
    ("drf: a queue alone sends without room (it may preempt)", "drf",
     {"a": {"bound": 10_000}}, [("a1", "a", 1000)], ["a1"]),
    ("fair-share: weights 3:1 split the room 3:1", "fair-share",
     {"heavy": {"weight": 3}, "light": {"weight": 1}},
     [*((f"h{i}", "heavy", 1000) for i in range(10)), *((f"l{i}", "light", 1000) for i in range(10))],
     ["h0", "l0", "h1", "h2", "h3", "l1", "h4", "h5", "h6", "l2"]),
    ("round-robin ignores room and shares", "round-robin",
     {"a": {"bound": 10_000}, "b": {}}, [("a1", "a", 1000), ("b1", "b", 1000)], ["a1", "b1"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fairness", "queues", "submissions", "expected"),
    [c[1:] for c in FAIR_ROUND_CASES],
    ids=[c[0] for c in FAIR_ROUND_CASES],
)
def test_fair_round(
    fairness: str,
    queues: dict[str, dict[str, int]],
    submissions: list[tuple[str, str, int]],
    expected: list[str],
) -> None:
    w = fair_world(fairness, **queues)
    for i, (job, queue, cpu) in enumerate(submissions):
        w.submit(job, queue=queue, cpu=cpu, created=i + 1)
    assert w.take() == expected


def test_the_queue_waiting_for_room_says_so() -> None:
    w = fair_world("drf", a={"bound": 9000}, b={"bound": 500})
    w.submit("a1", queue="a", cpu=2000, created=1)
    w.submit("b1", queue="b", cpu=2000, created=2)
    assert w.take() == []
    assert w.uq.units["b1"].waiting_for_room
    assert not w.uq.units["a1"].waiting_for_room  # never offered: it waits behind b


# (case, queues {name: spec}, pending [(job, queue, cpu)], needs {queue: cpu})
RECLAIM_NEED_CASES: list[tuple[str, dict[str, dict[str, int]], list[tuple[str, str, int]],
                               dict[str, int]]] = [
    ("below min, cluster full: what it waits for", {"a": {"min": 5000}, "b": {"bound": 10_000}},
     [("a1", "a", 1000), ("a2", "a", 1000)], {"a": 2000}),
    ("only up to its min", {"a": {"min": 1500}, "b": {"bound": 10_000}},
     [("a1", "a", 1000), ("a2", "a", 1000)], {"a": 1500}),
    ("free room counts", {"a": {"min": 5000}, "b": {"bound": 9000}},
     [("a1", "a", 3000)], {"a": 2000}),
    ("room enough: nothing", {"a": {"min": 5000}, "b": {"bound": 2000}}, [("a1", "a", 3000)], {}),
    ("at its min: nothing", {"a": {"min": 2000, "bound": 2000}, "b": {"bound": 8000}},
     [("a1", "a", 1000)], {}),
    ("no min: nothing", {"a": {}, "b": {"bound": 10_000}}, [("a1", "a", 1000)], {}),
    ("no pending work: nothing", {"a": {"min": 5000}, "b": {"bound": 10_000}}, [], {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("queues", "pending", "expected"),
    [c[1:] for c in RECLAIM_NEED_CASES],
    ids=[c[0] for c in RECLAIM_NEED_CASES],
)
def test_reclaim_needs(
    queues: dict[str, dict[str, int]], pending: list[tuple[str, str, int]], expected: dict[str, int]
) -> None:
    w = fair_world("drf", **queues)
    for i, (job, queue, cpu) in enumerate(pending):
        w.submit(job, queue=queue, cpu=cpu, created=i + 1)
    assert {q: need.cpu for q, need in w.uq.reclaim_needs().items()} == expected


def test_owed_stops_reading_units_once_they_ask_for_all_the_min_owes() -> None:
    """``owed`` reads a queue's units only until they ask for all its min still owes; what it
    returns equals the sum over every pending unit not at a shard, capped by the min left."""
    rng = random.Random(7)

    def every_unit(uq: UnitQueue) -> dict[str, tuple[int, int]]:
        out = {}
        for queue, members in sorted(uq._by_queue.items()):
            floor = uq.min(queue)
            wanted = Quantities()
            for e in members.values():
                unit = uq.view(e) if e.pods and e.state != UnitState.DISPATCHED else None
                if unit is not None and unit.pool == GUARANTEED:
                    wanted.add(unit.requests)
            owed = wanted.capped_by(floor.beyond(uq.used(queue)))
            if not floor.is_zero() and not owed.is_zero():
                out[queue] = (owed.cpu, owed.mem)
        return out

    for _ in range(40):
        w = World()
        w.uq.set_node("n1", {GUARANTEED: Quantities(cpu=10**6, mem=1 << 50, pods=10**6)})
        for queue in "ab":
            spec = pb.QueueSpec()
            spec.min.milli_cpu = rng.choice([0, 500, 3000, 20_000])
            spec.min.memory_bytes = rng.choice([0, f.GiB, 8 * f.GiB])
            w.queues[queue] = pb.Queue(metadata=pb.ObjectMeta(name=queue), spec=spec)
            w.uq.queue_changed(queue)
        for i in range(rng.randrange(40)):
            queue = rng.choice("ab")
            job = f.job(
                f"j{i}",
                replicas=rng.randint(1, 3),
                cpu=rng.choice([100, 1000]),
                mem=rng.choice([0, f.GiB // 4, 2 * f.GiB]),
            )
            job.spec.queue = queue
            w.jobs[job.metadata.name] = job
            for pod in f.pods_of(job):
                pod.spec.queue = queue
                w.uq.add_pod(pod, now_ms=0)
        w.take(accept=rng.randrange(4))  # a few at a shard: they count as used, not owed
        got = {q: (o.cpu, o.mem) for q, o in w.uq.owed().items()}
        assert got == every_unit(w.uq)


def test_status_shows_borrowed_and_dominant_share() -> None:
    w = fair_world("drf", a={"min": 3000, "bound": 5000}, b={"min": 6000, "bound": 2000})
    got = w.uq.statuses()
    assert (got["a"].used.milli_cpu, got["a"].borrowed.milli_cpu) == (5000, 2000)
    assert got["a"].dominant_share_permille == 500
    assert not got["b"].HasField("borrowed")  # within its min
    assert got["b"].dominant_share_permille == 200


def test_pending_pods_per_queue() -> None:
    w = World()
    w.submit("a", queue="q", replicas=3)
    w.submit("b", queue="q", replicas=2)
    w.submit("c", queue="other")
    assert w.uq.pending_pods() == {"q": 5, "other": 1}


def test_pending_pods_stay_exact_as_pods_bind_update_and_jobs_go() -> None:
    w = World()
    a = w.submit("a", queue="q", replicas=3)
    b = w.submit("b", queue="q", replicas=2)
    w.submit("c", queue="other", replicas=2)

    def counted() -> dict[str, int]:
        # What the kept counts must equal: every tracked unit's pending pods, by queue.
        out: dict[str, int] = {}
        for entry in w.uq.units.values():
            if entry.pods:
                out[entry.queue] = out.get(entry.queue, 0) + len(entry.pods)
        return out

    w.uq.add_pod(a[0], now_ms=1)  # an update of a pod already counted: still one
    assert w.uq.pending_pods() == counted() == {"q": 5, "other": 2}
    bound = pb.Pod()
    bound.CopyFrom(a[1])
    bound.spec.node_name = "n1"
    bound.status.phase = pb.POD_BOUND
    w.uq.remove_pod(a[1])  # bound: an update is a remove and an add
    w.uq.add_pod(bound, now_ms=2)
    assert w.uq.pending_pods() == counted() == {"q": 4, "other": 2}
    w.uq.remove_pod(a[1])  # removed twice: counted once
    assert w.uq.forget("c") is not None  # its job deleted with pods still pending
    assert w.uq.pending_pods() == counted() == {"q": 4}
    for pod in b:
        w.uq.remove_pod(pod)
    w.uq.drop_if_empty("b")
    assert w.uq.pending_pods() == counted() == {"q": 2}
    w.uq.remove_pod(a[0])
    w.uq.remove_pod(a[2])
    assert w.uq.pending_pods() == counted() == {}


def test_room_is_kept_for_a_queue_below_its_min() -> None:
    w = fair_world("drf", a={"min": 3000}, b={"bound": 7000})
    w.submit("a1", queue="a", cpu=3000, created=1)
    w.uq.back_off(w.uq.units["a1"], now=0.0)  # pending, but not ready this round
    w.submit("b1", queue="b", cpu=1000, created=2)
    assert w.take() == []  # the free 3000 are a's min
    assert w.uq.units["b1"].waiting_for_room
    w.uq.wake_queue("a")
    assert w.take() == ["a1"]


def test_below_its_min_a_unit_waits_for_reclaim_instead_of_failing_at_a_shard() -> None:
    w = fair_world("drf", a={"min": 5000}, b={"bound": 10_000})
    w.submit("a1", queue="a", cpu=1000)
    assert w.take() == []
    assert w.uq.units["a1"].waiting_for_room
    assert {q: n.cpu for q, n in w.uq.reclaim_needs().items()} == {"a": 1000}


def test_freed_room_wakes_the_smallest_share_queues_backed_off_units() -> None:
    w = fair_world("drf", a={"bound": 6000}, b={"bound": 3000})
    (running,) = w.submit("b-done", queue="b", cpu=1000, created=1)
    w.uq.remove_pod(running)
    w.uq.add_pod(bound(running), now_ms=0)
    w.uq.drop_if_empty("b-done")  # the cluster is full: a 6000, b 4000
    w.submit("b1", queue="b", cpu=1000, created=2)
    w.uq.back_off(w.uq.units["b1"], now=0.0)  # it failed at a shard: retries at 1.0
    w.submit("a1", queue="a", cpu=1000, created=3)
    assert w.take(now=0.1) == []  # a1 waits for room while b's unit waits to retry
    assert w.uq.units["a1"].waiting_for_room
    w.uq.remove_pod(bound(running))  # a pod of b finished: its room is free
    # b, the smaller share, retries at once (before its backoff ends) and takes the room first.
    assert w.take(now=0.5)[0] == "b1"


def test_freed_room_wakes_backed_off_units_in_arrival_order_each_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Freed room wakes the smaller-share queue's first backed-off units in arrival order, at
    most MAX_HELD_PER_ROUND of them; units that left backoff meanwhile are skipped, a unit
    that backed off twice is woken once, and the other queue's units stay as they are."""
    monkeypatch.setattr(unitqueue, "MAX_HELD_PER_ROUND", 2)
    w = fair_world("drf", a={"bound": 6000}, b={"bound": 3000})
    for i, (job, queue) in enumerate(
        [("a1", "a"), ("b1", "b"), ("b2", "b"), ("b3", "b"), ("b4", "b")]
    ):
        w.submit(job, queue=queue, cpu=1000, created=i + 1)
        w.uq.back_off(w.uq.units[job], now=0.0)
    w.uq.enqueue(w.uq.units["b2"])  # its backoff ended: queued already
    w.uq.enqueue(w.uq.units["b3"])  # tried again, and backed off again
    w.uq.back_off(w.uq.units["b3"], now=0.0)

    def backing_off() -> list[str]:
        return sorted(j for j, e in w.uq.units.items() if e.state == UnitState.BACKOFF)

    w.uq._wake_for_freed_room()
    assert backing_off() == ["a1", "b4"]  # b1 and b3 woke; b2 was not backing off
    w.uq._wake_for_freed_room()
    assert backing_off() == ["a1"]  # then b4
    w.uq._wake_for_freed_room()
    assert backing_off() == []  # b has none left: a's turn


def test_units_backing_off_again_and_again_keep_the_wake_heap_bounded() -> None:
    """Every backoff pushes an item; items of units that left backoff by their timer are
    never popped by a wake, so the heap is rebuilt once it outgrows its queue."""
    w = World()
    for i in range(3):
        w.submit(f"u{i}", queue="q")
    for _ in range(1000):
        for entry in w.uq.units.values():
            w.uq.enqueue(entry)
            w.uq.back_off(entry, now=0.0)
    assert len(w.uq._backed_off["q"]) <= 2 * 3 + 64
    w.uq._wake_for_freed_room()
    assert all(e.state == UnitState.QUEUED for e in w.uq.units.values())


# ---------------------------------------------------------------------------------------------
# Hierarchical queues: a parent's max bounds its children together
# ---------------------------------------------------------------------------------------------

# (case, queues {name: (parent, max cpu)}, bound cpu per queue, unit (queue, cpu), blocked)
HIERARCHY_CASES: list[tuple[str, dict[str, tuple[str, int]], dict[str, int], tuple[str, int],
                            str]] = [
    ("within the parent's max", {"org": ("", 4000), "a": ("org", 0), "b": ("org", 0)},
     {"a": 2000}, ("b", 2000), ""),
    ("siblings together over the parent's max", {"org": ("", 4000), "a": ("org", 0),
     "b": ("org", 0)}, {"a": 3000}, ("b", 2000), "cpu of parent queue org"),
    ("the child's own max first", {"org": ("", 4000), "a": ("org", 1000)}, {}, ("a", 2000),
     "cpu"),
    ("a grandparent bounds grandchildren", {"top": ("", 3000), "mid": ("top", 0),
     "a": ("mid", 0), "b": ("top", 0)}, {"b": 2000}, ("a", 2000), "cpu of parent queue top"),
    ("the parent's own pods count", {"org": ("", 4000), "a": ("org", 0)}, {"org": 3000},
     ("a", 2000), "cpu of parent queue org"),
    ("other trees do not count", {"org": ("", 4000), "a": ("org", 0), "x": ("", 0)},
     {"x": 9000}, ("a", 2000), ""),
    ("a cycle ends the walk", {"a": ("b", 0), "b": ("a", 5000)}, {}, ("a", 1000), ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("queues", "bound_cpu", "unit", "blocked"),
    [c[1:] for c in HIERARCHY_CASES],
    ids=[c[0] for c in HIERARCHY_CASES],
)
def test_parent_quota_bounds_children(
    queues: dict[str, tuple[str, int]],
    bound_cpu: dict[str, int],
    unit: tuple[str, int],
    blocked: str,
) -> None:
    w = World()
    for name, (parent, max_cpu) in queues.items():
        spec = pb.QueueSpec(parent=parent)
        if max_cpu:
            spec.quota.milli_cpu = max_cpu
        w.queues[name] = pb.Queue(metadata=pb.ObjectMeta(name=name), spec=spec)
    for queue, cpu in bound_cpu.items():
        (pod,) = w.submit(f"{queue}-running", queue=queue, cpu=cpu)
        w.uq.remove_pod(pod)
        w.uq.add_pod(bound(pod), now_ms=0)
        w.uq.drop_if_empty(f"{queue}-running")
    queue, cpu = unit
    assert w.uq.quota_excess(queue, Quantities(cpu=cpu, pods=1)) == blocked


# (pods stored of the job's 4, the job's mark) -> whether the round sends the unit
UNFINISHED_CASES = [
    ("created whole (no mark)", 4, None, True),
    ("an unreadable mark holds it back too", 4, "x", False),
    ("first chunk only", 2, "2", False),
    ("every pod stored, mark not yet cleared", 4, "3", False),
]


@pytest.mark.parametrize(("case", "stored", "mark", "sent"), UNFINISHED_CASES)
def test_a_unit_whose_pods_are_still_being_created_is_not_sent(
    case: str, stored: int, mark: str | None, sent: bool
) -> None:
    """A job created chunk by chunk (creation.py) carries PODS_CREATED_ANNOTATION until its last
    chunk is stored: its unit waits, so a gang is never judged on part of its pods."""
    world = World()
    pods = world.submit("big", replicas=4)
    job = world.jobs["big"]
    if mark is not None:
        job.metadata.annotations[PODS_CREATED_ANNOTATION] = mark
    for pod in pods[stored:]:
        world.uq.remove_pod(pod)
    assert world.take() == (["big"] if sent else [])
    if not sent:  # the last chunk clears the mark: the next round sends it whole
        for pod in pods[stored:]:
            world.uq.add_pod(pod, now_ms=0)
        del job.metadata.annotations[PODS_CREATED_ANNOTATION]
        assert world.take() == ["big"]
        assert len(world.uq.units["big"].pods) == 4


def test_a_unit_whose_job_is_being_deleted_is_not_sent() -> None:
    """A job whose deletion began (deletion.py: marked, its pods going chunk by chunk) is not
    scheduled any more, though some of its pods are still pending in the queue."""
    world = World()
    world.submit("going", replicas=3)
    world.jobs["going"].metadata.deletion_timestamp_ms = 1
    assert world.take() == []


def test_a_started_pod_restates_its_claim_through_the_feed() -> None:
    """Bound -> running, as the feed hands it over, restates the pod's claim (its start, for
    reclaim's order) and counts its requests once; a pod that held no claim restates none."""
    w = World()
    feed = ViewFeed(w.uq, asyncio.Event(), asyncio.Event(), revoke=lambda _job: None)
    pods = w.submit("a", queue="q", replicas=2, cpu=200)
    placed = bound(pods[0])
    feed.on_update("Pod", pods[0], placed)
    running = pb.Pod()
    running.CopyFrom(placed)
    running.status.phase = pb.POD_RUNNING
    running.status.started_ms = 1234
    feed.on_update("Pod", placed, running)
    claims = {c.name: c for c in w.uq.claims()}
    assert set(claims) == {pods[0].metadata.name}
    assert (claims[pods[0].metadata.name].started_ms, w.uq.bound_usage("q").cpu) == (
        1234,
        200,
    )
    assert feed.bound_pods("a") == 1
    assert not w.uq.restate_claim(pods[1])  # pending: no claim to restate


def test_claims_listed_then_summed_leave_the_ledger_as_claims_one_by_one_do() -> None:
    """A restart's listing hands its bound pods' claims over to be counted per node and summed
    per job once listed (``claim_listed``, ``sum_listed``: passes in C, not sums a pod): the
    queues' usage, the room claimed, the nodes with claims and the claims are those of the same
    claims taken one by one, and the listing's claims are counted per job."""
    pods = [
        bound(pod, node)
        for name, queue, replicas, cpu in (("web", "team", 5, 300), ("batch", "default", 3, 100))
        for pod, node in zip(
            World().submit(name, queue=queue, replicas=replicas, cpu=cpu),
            ["n1", "n2", "n3", "n1", "n2"],
            strict=False,
        )
    ]
    one_by_one, listed = World().uq, World().uq
    for pod in pods:
        one_by_one.claim(Claim.of(pod))
    per_job: dict[str, JobShare] = {}
    for pod in pods:
        listed.claim_listed(Claim.of(pod, per_job))
    assert listed.sum_listed() == {"web": 5, "batch": 3}
    for queue in ("team", "default"):
        assert listed.bound_usage(queue) == one_by_one.bound_usage(queue)
    assert listed.bound_usage("team").cpu == 1500
    assert listed.free(GUARANTEED) == one_by_one.free(GUARANTEED)
    assert sorted(listed.nodes_with_claims()) == sorted(one_by_one.nodes_with_claims())
    assert dict(listed.claims_by_pod()) == dict(one_by_one.claims_by_pod())
    assert listed.sum_listed() == {}  # counted once


@pytest.mark.parametrize(
    ("node", "phase", "taken"),
    [
        ("", pb.POD_PENDING, False),  # pending: a unit's, handed on to the handlers
        ("n1", pb.POD_BOUND, True),  # holding a claim: taken
        ("n1", pb.POD_RUNNING, True),
        ("n1", pb.POD_SUCCEEDED, False),  # finished on a node: the pod index's record
        ("n1", pb.POD_FAILED, False),
    ],
)
def test_a_listing_takes_the_pods_holding_claims_and_hands_on_the_others(
    node: str, phase: pb.PodPhase.ValueType, taken: bool
) -> None:
    """``ViewFeed.take_listed`` (the dispatcher's ``Informer(take_listed=)``) takes exactly
    the listed pods holding a claim, each into the ledger as its claim, summed once listed."""
    w = World()
    feed = ViewFeed(w.uq, asyncio.Event(), asyncio.Event(), revoke=lambda _job: None)
    pod = w.submit("a", queue="q", cpu=200)[0]
    pod.spec.node_name, pod.status.phase = node, phase
    assert feed.take_listed(pod) is taken
    feed.on_listed("Pod")
    assert (w.uq.claim_of(pod.metadata.name) == Claim.of(pod)) is taken
    assert w.uq.bound_usage("q").cpu == (200 if taken else 0)
    assert feed.bound_pods("a") == (1 if taken else 0)


def test_a_listing_taken_leaves_the_ledger_and_counts_as_pods_added_one_by_one_do() -> None:
    """A restart's listing through ``take_listed`` (its claims), ``on_listed_refused`` (the
    other pods on nodes) and ``on_add`` (pending ones), then ``on_listed``: the same claims,
    queue usage, bound pods per job and pending units as every pod added one by one."""
    pods: list[pb.Pod] = []
    for name, replicas, phases in (
        ("web", 4, [pb.POD_RUNNING, pb.POD_RUNNING, pb.POD_BOUND, pb.POD_SUCCEEDED]),
        ("batch", 3, [pb.POD_BOUND, pb.POD_FAILED]),  # its third pending
    ):
        for i, pod in enumerate(World().submit(name, queue="team", replicas=replicas, cpu=300)):
            if i < len(phases):
                pod.spec.node_name, pod.status.phase = f"n{i % 2}", phases[i]
            pods.append(pod)
    listed, one_by_one = World(), World()
    for world in (listed, one_by_one):
        for name in ("web", "batch"):
            job = f.job(name, replicas=4 if name == "web" else 3, cpu=300)
            job.spec.queue = "team"
            world.jobs[name] = job
    feed = ViewFeed(listed.uq, asyncio.Event(), asyncio.Event(), revoke=lambda _job: None)
    each = ViewFeed(one_by_one.uq, asyncio.Event(), asyncio.Event(), revoke=lambda _job: None)
    for pod in pods:
        if not feed.take_listed(pod):
            (feed.on_listed_refused if pod.spec.node_name else feed.on_add)("Pod", pod)
        each.on_add("Pod", pod)
    feed.on_listed("Pod")
    assert dict(listed.uq.claims_by_pod()) == dict(one_by_one.uq.claims_by_pod())
    assert len(listed.uq.claims_by_pod()) == 4
    assert listed.uq.bound_usage("team") == one_by_one.uq.bound_usage("team")
    assert [feed.bound_pods(j) for j in ("web", "batch")] == [4, 1]
    assert [each.bound_pods(j) for j in ("web", "batch")] == [4, 1]
    assert sorted(listed.uq.units) == sorted(one_by_one.uq.units) == ["batch"]


def test_a_listings_nodes_wake_infeasible_units_once_all_are_in_and_a_later_node_at_once() -> None:
    """Nodes a listing hands over wake the infeasible units once the kind is listed
    (``on_listed``), not per node (every pending unit looked at per node: nodes × units);
    a node added after the listing wakes them at once."""
    w = World(backoff=BackoffSettings(infeasible_recheck_seconds=300.0))
    listing = [True]
    kick = asyncio.Event()
    feed = ViewFeed(
        w.uq,
        kick,
        asyncio.Event(),
        revoke=lambda _job: None,
        listing_under_way=lambda: listing[0],
    )
    w.submit("a")
    w.uq.park_infeasible(w.uq.units["a"], now=0.0)
    for name in ("n1", "n2"):
        feed.on_add("Node", f.node(name))
    assert w.take(now=1.0) == []  # still infeasible while the listing is under way
    assert not kick.is_set()
    feed.on_listed("Node")
    assert kick.is_set()
    assert w.take(now=1.0) == ["a"]

    listing[0] = False
    kick.clear()
    w.submit("b")
    w.uq.park_infeasible(w.uq.units["b"], now=1.0)
    feed.on_add("Node", f.node("n3"))
    assert kick.is_set()
    assert w.take(now=2.0) == ["b"]


# ---------------------------------------------------------------------------------------------
# A pending pod's bind, straight into its claim (``ViewFeed._just_bound``)
# ---------------------------------------------------------------------------------------------


def _general_path_world() -> tuple[World, ViewFeed]:
    w = World()
    return w, ViewFeed(w.uq, asyncio.Event(), asyncio.Event(), revoke=lambda _job: None)


# (case, replicas, pods bound one by one (by index), the update's new phase and node)
BIND_CASES: list[tuple[str, int, list[int], int, str]] = [
    ("a one-pod job's pod bound", 1, [0], pb.POD_BOUND, "n1"),
    ("a one-pod job's pod bound and running in one update", 1, [0], pb.POD_RUNNING, "n1"),
    ("two of three pods of a gang bound", 3, [0, 2], pb.POD_BOUND, "n1"),
    ("every pod of a job bound", 3, [1, 0, 2], pb.POD_BOUND, "n2"),
    ("a pending pod that failed holds no claim", 1, [0], pb.POD_FAILED, ""),
    ("a pending pod that succeeded on a node holds none", 1, [0], pb.POD_SUCCEEDED, "n1"),
]  # fmt: skip


@pytest.mark.parametrize(("replicas", "order", "phase", "node"), [c[1:] for c in BIND_CASES])
def test_a_pending_pods_bind_leaves_what_forget_and_track_left(
    replicas: int, order: list[int], phase: int, node: str
) -> None:
    """Binds taken straight into their claims (one read of the job's share per unit) leave
    the same claims, usage, bound counts, units and queue counts as forget + track, which
    handles every other update (the feed's general path, a pod removed and added)."""
    straight, feed = _general_path_world()
    general, _ = _general_path_world()
    pods = straight.submit("a", queue="q", replicas=replicas, cpu=200)
    general.submit("a", queue="q", replicas=replicas, cpu=200)
    general_bound: Counter[str] = Counter()
    for index in order:
        new = pb.Pod()
        new.CopyFrom(pods[index])
        new.spec.node_name = node
        new.status.phase = phase  # type: ignore[assignment]
        feed.on_update("Pod", pods[index], new)
        # The general path: forget + track, as the feed did every bind before.
        general.uq.remove_pod(pods[index])
        general.uq.add_pod(new, now_ms=0)
        if node and phase in (pb.POD_BOUND, pb.POD_RUNNING, pb.POD_SUCCEEDED):
            general_bound["a"] += 1
        general.uq.drop_if_empty("a")
    assert dict(straight.uq.claims_by_pod()) == dict(general.uq.claims_by_pod())
    assert straight.uq.bound_usage("q") == general.uq.bound_usage("q")
    assert feed.bound_pods("a") == general_bound["a"]
    assert sorted(straight.uq.units) == sorted(general.uq.units)
    assert straight.uq.pending_pods() == general.uq.pending_pods()
    assert straight.uq.statuses() == general.uq.statuses()
    if "a" in straight.uq.units:
        assert sorted(straight.uq.units["a"].pods) == sorted(general.uq.units["a"].pods)


def test_a_units_pods_share_one_read_of_their_jobs_share() -> None:
    """The first pod of a unit bound reads what its job's pods share; the others take it."""
    w, feed = _general_path_world()
    pods = w.submit("a", queue="q", replicas=3, cpu=200)
    for pod in pods[:2]:
        feed.on_update("Pod", pod, bound(pod))
    first, second = (w.uq.claim_of(p.metadata.name) for p in pods[:2])
    assert first is not None and second is not None
    assert first.requests is second.requests and first.queue is second.queue
    assert w.uq.units["a"].share == JobShare.of(pods[2])


# (case, the unit's state, its pods after take_pending, still tracked after drop_if_empty)
TAKE_PENDING_CASES: list[tuple[str, UnitState, int, bool]] = [
    ("queued unit, its last pod", UnitState.QUEUED, 0, False),
    ("dispatched unit, its last pod: kept until its outcome", UnitState.DISPATCHED, 0, True),
]  # fmt: skip


@pytest.mark.parametrize(("state", "left", "tracked"), [c[1:] for c in TAKE_PENDING_CASES])
def test_take_pending_takes_a_pod_out_of_its_unit(
    state: UnitState, left: int, tracked: bool
) -> None:
    w = World()
    (pod,) = w.submit("a", queue="q")
    entry = w.uq.units["a"]
    if state == UnitState.DISPATCHED:
        assert w.take() == ["a"]
    assert w.uq.take_pending(pod.metadata.name, "a") is entry
    assert len(entry.pods) == left
    assert w.uq.pending_pods() == {}
    assert w.uq.take_pending(pod.metadata.name, "a") is entry  # a second time: nothing more
    assert w.uq.take_pending("other-0", "other") is None
    w.uq.drop_if_empty("a")
    assert ("a" in w.uq.units) is tracked


# ---------------------------------------------------------------------------------------------
# A unit's view kept by its job's stored bytes (``UnitQueue(encoded_jobs=...)``)
# ---------------------------------------------------------------------------------------------


def test_a_units_view_is_kept_while_its_jobs_bytes_are_the_same() -> None:
    """With the jobs' bytes to tell a job's changes by (the informer's), a unit's view is made
    once per job version and pod count, the job decoded only to make it."""
    jobs: dict[str, bytes] = {}
    decoded: list[str] = []

    def job_of(name: str) -> pb.Job | None:
        decoded.append(name)
        data = jobs.get(name)
        return None if data is None else pb.Job.FromString(data)

    uq = UnitQueue(job_of, lambda _q: None, BackoffSettings(), encoded_jobs=jobs.get)
    job = f.job("a", replicas=2, cpu=100)
    job.metadata.resource_version = 7
    jobs["a"] = job.SerializeToString()
    (first, second) = f.pods_of(job)
    uq.add_pod(first, now_ms=0)
    entry = uq.units["a"]
    view = uq.view(entry)
    assert view is not None and view.pods == 1
    assert uq.view(entry) is view and decoded == ["a"]  # queued, then viewed: one decode
    uq.add_pod(second, now_ms=0)
    again = uq.view(entry)
    assert again is not None and again.pods == 2 and decoded == ["a", "a"]  # a pod more
    job.spec.priority = 5
    job.metadata.resource_version = 8
    jobs["a"] = job.SerializeToString()
    changed = uq.view(entry)
    assert changed is not None and changed.priority == 5  # the job changed: made again
    del jobs["a"]
    assert uq.view(entry) is None  # its job unknown: nothing to schedule it as


# (case, the queue's change, whether its queued units are keyed again, the order sent)
QUEUE_CHANGE_CASES: list[tuple[str, int, bool, list[str]]] = [
    ("its status written: the order as it was", pb.SORT_FIFO, False, ["low", "high"]),
    ("fifo to priority: keyed again", pb.SORT_PRIORITY, True, ["high", "low"]),
]  # fmt: skip


@pytest.mark.parametrize(("sort", "rekeyed", "order"), [c[1:] for c in QUEUE_CHANGE_CASES])
def test_a_queue_change_rekeys_its_units_only_when_its_sort_policy_differs(
    sort: int, rekeyed: bool, order: list[str]
) -> None:
    w = World()
    w.queue("q", sort=pb.SORT_FIFO)
    w.submit("low", queue="q", priority=1, created=1)
    w.submit("high", queue="q", priority=9, created=2)
    heap_before = list(w.uq._heaps._heaps["q"])
    changed = pb.Queue()
    changed.CopyFrom(w.queues["q"])
    changed.spec.sort_policy = sort  # type: ignore[assignment]
    changed.status.pending_units = 2  # what the queue status controller writes
    w.queues["q"] = changed
    w.uq.queue_changed("q")
    assert (w.uq._heaps._heaps["q"] != heap_before) is rekeyed
    assert w.take() == order


# (case, the queue's max before, after its change, sent before, sent after)
LIMIT_CHANGE_CASES: list[tuple[str, int, int, list[str], list[str]]] = [
    ("max raised: the held unit goes", 100, 1000, ["a"], ["b"]),
    ("max lowered: the next unit is held", 1000, 100, ["a"], []),
    ("max removed: unlimited", 100, 0, ["a"], ["b"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("before", "after", "sent_before", "sent_after"), [c[1:] for c in LIMIT_CHANGE_CASES]
)
def test_a_queues_max_is_read_again_once_the_queue_changes(
    before: int, after: int, sent_before: list[str], sent_after: list[str]
) -> None:
    """The maxima a unit is judged against are kept per queue until a Queue changes
    (``UnitQueue.queue_changed``, the feed's on every Queue event), then read again."""
    w = World()
    w.queue("q", quota=pb.Resources(milli_cpu=before))
    w.submit("a", queue="q", cpu=100, created=1)
    w.submit("b", queue="q", cpu=100, created=2)
    assert w.take(accept=1) == sent_before  # the queue's max read (and kept)
    w.queue("q", quota=pb.Resources(milli_cpu=after) if after else None)
    assert w.take() == sent_after
