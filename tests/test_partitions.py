"""Node partitions: the shuffler rule and the partition operations (tables), the triggers, and
the dispatcher's NodeShuffler against a real store (a dead shard's nodes move to the others, a
new node joins the smallest partition, auto mode follows its triggers), the room left per
partition (``PartitionRoom``) and the dispatcher's shard choice by it (``choose_shard``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from placement.nodeinfo import BEST_EFFORT, GUARANTEED
from placement.resources import Quantities
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.dispatch import ShardLink, choose_shard
from services.dispatcher.dispatching.partitions import (
    Figures,
    Meter,
    NodeShuffler,
    PartitionRoom,
    Partitions,
    PartitionSettings,
    PodClaims,
    ShardCounters,
    rebalance_move,
)
from store import NotFoundError, Store
from store.client import Fence
from store.informer import Informer
from tests import factories as f

# (case, node counts per shard, expected (from, to, nodes moved) or None)
REBALANCE_CASES: list[tuple[str, dict[str, int], tuple[str, str, int] | None]] = [
    ("the issue's example: 10 > 2x3, move (10+3)/2-3", {"a": 10, "b": 3}, ("a", "b", 3)),
    ("the original's example 1: (5+2)/2-2", {"a": 5, "b": 2}, ("a", "b", 1)),
    ("the original's example 2: (13+2)/2-2", {"a": 2, "b": 13}, ("b", "a", 5)),
    ("exactly twice: balanced enough", {"a": 6, "b": 3}, None),
    ("equal", {"a": 4, "b": 4}, None),
    ("a new shard gets half", {"a": 10, "b": 0}, ("a", "b", 5)),
    ("one node is never moved", {"a": 1, "b": 0}, None),
    ("two nodes against none", {"a": 2, "b": 0}, ("a", "b", 1)),
    ("largest to smallest of three", {"a": 9, "b": 5, "c": 1}, ("a", "c", 4)),
    ("ties go to the first name", {"a": 8, "b": 8, "c": 2, "d": 2}, ("a", "c", 3)),
    ("one shard: nothing to balance", {"a": 100}, None),
    ("no shards", {}, None),
]


@pytest.mark.parametrize(
    ("loads", "expected"), [c[1:] for c in REBALANCE_CASES], ids=[c[0] for c in REBALANCE_CASES]
)
def test_rebalance_rule(loads: dict[str, int], expected: tuple[str, str, int] | None) -> None:
    assert rebalance_move(loads) == expected


def nodes(n: int) -> list[str]:
    return [f"n{i:02d}" for i in range(n)]


def covered_once(parts: Partitions, all_nodes: list[str]) -> bool:
    flat = [node for members in parts.members.values() for node in members]
    return sorted(flat) == sorted(all_nodes) and len(flat) == len(set(flat))


# (case, starting sizes, shards live after, nodes after, expected sizes after)
SYNC_CASES: list[tuple[str, dict[str, int], list[str], int, dict[str, int]]] = [
    ("first assignment: even", {}, ["a", "b"], 10, {"a": 5, "b": 5}),
    ("a dead shard's nodes go to the others", {"a": 4, "b": 4, "c": 4}, ["a", "b"], 12,
     {"a": 6, "b": 6}),
    ("a new shard gets half of the first largest; 6 <= 2x3 then", {"a": 6, "b": 6},
     ["a", "b", "c"], 12, {"a": 3, "b": 6, "c": 3}),
    ("a new node joins the smallest partition", {"a": 5, "b": 4}, ["a", "b"], 10,
     {"a": 5, "b": 5}),
    ("a node gone leaves its partition", {"a": 5, "b": 5}, ["a", "b"], 9, {"a": 5, "b": 4}),
    ("the last shard takes everything", {"a": 3, "b": 3}, ["b"], 6, {"b": 6}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("start", "live", "node_count", "expected"),
    [c[1:] for c in SYNC_CASES],
    ids=[c[0] for c in SYNC_CASES],
)
def test_partition_sync(
    start: dict[str, int], live: list[str], node_count: int, expected: dict[str, int]
) -> None:
    names = nodes(max(node_count, sum(start.values())))
    stored: dict[str, list[str]] = {}
    i = 0
    for shard, size in start.items():
        stored[shard] = names[i : i + size]
        i += size
    parts = Partitions.seeded(stored, start, names)
    parts.sync(live, names[:node_count])
    assert parts.sizes() == expected
    assert covered_once(parts, names[:node_count])


def test_new_node_goes_to_the_smallest_partition() -> None:
    parts = Partitions.seeded(
        {"a": nodes(3), "b": ["x1", "x2"]}, ["a", "b"], [*nodes(3), "x1", "x2"]
    )
    assert parts.add_node("new") == "b"
    assert "new" in parts.of("b")


def test_seeded_drops_duplicates_and_unknown() -> None:
    parts = Partitions.seeded(
        {"a": ["n1", "n2"], "b": ["n2", "gone"], "dead": ["n3"]}, ["a", "b"], ["n1", "n2", "n3"]
    )
    assert parts.members == {"a": {"n1", "n2"}, "b": set()}


# (case, figures, expected triggers)
TRIGGER_CASES: list[tuple[str, Figures, list[str]]] = [
    ("quiet", Figures(50.0, 100.0, 0.2), []),
    ("allocation above 90%", Figures(95.0, 100.0, 0.0), ["allocation 95.0%"]),
    ("exactly 90% is not above", Figures(90.0, 0.0, 0.0), []),
    ("throughput above 2,000 pods/s", Figures(10.0, 2500.0, 0.0), ["throughput 2500 pods/s"]),
    ("conflicts above 1%", Figures(10.0, 0.0, 1.5), ["conflicts 1.50%"]),
    ("all three", Figures(91.0, 2001.0, 2.0),
     ["allocation 91.0%", "throughput 2001 pods/s", "conflicts 2.00%"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("figures", "expected"), [c[1:] for c in TRIGGER_CASES], ids=[c[0] for c in TRIGGER_CASES]
)
def test_triggers_at_the_papers_defaults(figures: Figures, expected: list[str]) -> None:
    assert figures.triggers(PartitionSettings()) == expected


def test_meter_rates_over_the_window_and_shard_restarts() -> None:
    counters = ShardCounters()
    meter = Meter(window_seconds=10)
    # First sight is a baseline: a shard's history before the dispatcher saw it is not a burst.
    counters.observe("a", proposed=0, bound=0, conflicted=0)
    counters.observe("b", proposed=50_000, bound=50_000, conflicted=0)
    assert meter.sample(0.0, counters) == (0.0, 0.0)
    counters.observe("a", proposed=1000, bound=990, conflicted=10)
    counters.observe("b", proposed=51_000, bound=51_000, conflicted=0)
    throughput, conflicts = meter.sample(2.0, counters)
    assert (throughput, conflicts) == (995.0, 0.5)
    # Shard a restarted: its counters begin again at 0 and count on from there.
    counters.observe("a", proposed=100, bound=90, conflicted=10)
    assert (counters.proposed, counters.bound, counters.conflicted) == (2100, 2080, 20)
    meter.sample(30.0, counters)
    # Nothing new for longer than the window: the rates fall to zero.
    counters.observe("a", proposed=100, bound=90, conflicted=10)
    meter.sample(41.0, counters)
    assert meter.sample(42.0, counters) == (0.0, 0.0)


# ---------------------------------------------------------------------------------------------
# The room left per partition, and the shard choice by it
# ---------------------------------------------------------------------------------------------


def cpu(milli: int, pods: int = 0) -> Quantities:
    return Quantities(cpu=milli, mem=milli * 1000, pods=pods)


# (case, shards as (name, credits, load, asked cpu of undecided units), room left per partition
#  (cpu; absent: no partition), unit (pods, cpu), expected shard or None). Capacity is 10.
CHOICE_CASES: list[
    tuple[str, list[tuple[str, int, int, int]], dict[str, int] | None, tuple[int, int], str | None]
] = [
    ("no partitions: the least loaded", [("a", 10, 4, 0), ("b", 10, 2, 0)], None, (2, 200), "b"),
    ("both have room: the least loaded", [("a", 10, 4, 0), ("b", 10, 2, 0)],
     {"a": 1000, "b": 1000}, (2, 200), "b"),
    ("only the busier has room: it goes there", [("a", 10, 4, 0), ("b", 10, 2, 0)],
     {"a": 1000, "b": 100}, (2, 200), "a"),
    ("room exactly the unit's: enough", [("a", 10, 4, 0), ("b", 10, 2, 0)],
     {"a": 200, "b": 100}, (2, 200), "a"),
    ("room taken by undecided units does not count", [("a", 10, 4, 900), ("b", 10, 2, 0)],
     {"a": 1000, "b": 100}, (2, 200), "b"),
    ("no partition has room: the least loaded", [("a", 10, 4, 0), ("b", 10, 2, 0)],
     {"a": 100, "b": 100}, (2, 200), "b"),
    ("room without credits is no choice", [("a", 1, 4, 0), ("b", 10, 2, 0)],
     {"a": 1000, "b": 100}, (2, 200), "b"),
    ("a shard without a partition is not preferred", [("a", 10, 4, 0), ("b", 10, 2, 0)],
     {"a": 1000}, (2, 200), "a"),
    ("least loaded among those with room", [("a", 10, 6, 0), ("b", 10, 2, 0), ("c", 10, 4, 0)],
     {"a": 1000, "b": 0, "c": 1000}, (2, 200), "c"),
    ("ties go to the first", [("a", 10, 2, 0), ("b", 10, 2, 0)], {"a": 1000, "b": 1000},
     (2, 200), "a"),
    ("larger than capacity: only an empty shard, room or not", [("a", 10, 3, 0), ("b", 5, 0, 0)],
     {"a": 10_000, "b": 0}, (20, 2000), "b"),
    ("no credits anywhere: none", [("a", 0, 4, 0), ("b", 1, 2, 0)], {"a": 1000, "b": 1000},
     (2, 200), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("shards", "rooms", "unit", "expected"),
    [c[1:] for c in CHOICE_CASES],
    ids=[c[0] for c in CHOICE_CASES],
)
def test_shard_choice_prefers_a_partition_with_room(
    shards: list[tuple[str, int, int, int]],
    rooms: dict[str, int] | None,
    unit: tuple[int, int],
    expected: str | None,
) -> None:
    links = []
    for name, credits, load, asked in shards:
        link = ShardLink(name, "", credits=credits, capacity=10, ready=True)
        link.load = load
        if asked:
            link.hold("undecided", 0, GUARANTEED, cpu(asked))
        links.append(link)

    def room(shard: str, pool: str) -> Quantities | None:
        assert pool == GUARANTEED
        left = None if rooms is None else rooms.get(shard)
        return None if left is None else cpu(left, pods=100)

    pods, milli = unit
    chosen = choose_shard(
        links, pods, cpu(milli, pods), GUARANTEED, None if rooms is None else room
    )
    assert (chosen.name if chosen else None) == expected


def test_undecided_asks_are_returned_when_the_unit_settles() -> None:
    link = ShardLink("a", "", credits=10, capacity=10, ready=True)
    link.hold("j1", 2, GUARANTEED, cpu(400, 2))
    link.hold("j2", 1, BEST_EFFORT, cpu(100, 1))
    assert not link.has_room(cpu(700), GUARANTEED, cpu(1000))
    link.settle("j1")
    assert link.has_room(cpu(700), GUARANTEED, cpu(1000)) and link.load == 1
    assert not link.has_room(cpu(950), BEST_EFFORT, cpu(1000))
    link.clear()
    assert link.has_room(cpu(1000), BEST_EFFORT, cpu(1000))


def bound(name: str, node: str, milli: int, qos: int = pb.QOS_GUARANTEED) -> pb.Pod:
    pod = pb.Pod(metadata=pb.ObjectMeta(name=name))
    pod.spec.node_name = node
    pod.spec.qos = qos  # type: ignore[assignment]
    pod.spec.template.requests.milli_cpu = milli
    pod.status.phase = pb.POD_BOUND
    return pod


def test_partition_room_follows_nodes_pods_and_partitions() -> None:
    claims = PodClaims()
    room = PartitionRoom(claims)

    def pod_event(name: str, pod: pb.Pod | None) -> None:  # as the informer hands it to both
        claims.on_pod(name, pod)
        room.on_pod(name, pod)

    for name in ("n1", "n2", "n3"):
        room.on_node(name, f.node(name, cpu=1000, mem=0, pods=10, be_cpu=500))
    pod_event("p1", bound("p1", "n1", 300))
    assert room.of("a", GUARANTEED) is None  # partitioning off: no partition has room
    # ... nor claims per node: taken from the claims kept anyway once partitions exist.
    assert not room.following_pods and room.room.node_claimed("n1", GUARANTEED) is None

    parts = Partitions.seeded({"a": ["n1", "n2"], "b": ["n3"]}, ["a", "b"], ["n1", "n2", "n3"])
    room.regroup(parts, (1, parts.version))
    assert room.of("a", GUARANTEED) == Quantities(cpu=1700, pods=19)
    assert room.of("b", GUARANTEED) == Quantities(cpu=1000, pods=10)
    assert room.of("a", BEST_EFFORT) == Quantities(cpu=1000)

    # Claims come and go per event: a bind, a best-effort bind, a pod that finished.
    pod_event("p2", bound("p2", "n3", 200))
    pod_event("p3", bound("p3", "n2", 100, qos=pb.QOS_BEST_EFFORT))
    done = bound("p1", "n1", 300)
    done.status.phase = pb.POD_SUCCEEDED
    pod_event("p1", done)
    assert room.of("a", GUARANTEED) == Quantities(cpu=2000, pods=20)
    assert room.of("a", BEST_EFFORT).cpu == 900  # type: ignore[union-attr]
    assert room.of("b", GUARANTEED) == Quantities(cpu=800, pods=9)

    # A cordoned node offers nothing; a deleted pod returns its claim.
    cordoned = f.node("n3", cpu=1000, mem=0, pods=10)
    cordoned.spec.unschedulable = True
    room.on_node("n3", cordoned)
    assert room.of("b", GUARANTEED) == Quantities(cpu=-200, pods=-1)
    pod_event("p2", None)
    assert room.of("b", GUARANTEED) == Quantities()

    # The partitions change (n2 moves to b): summed again from the nodes.
    parts.members["a"].discard("n2")
    parts.members["b"].add("n2")
    parts.owner["n2"] = "b"
    parts.version += 1
    room.regroup(parts, (1, parts.version))
    assert room.of("a", GUARANTEED) == Quantities(cpu=1000, pods=10)
    assert room.of("b", GUARANTEED) == Quantities(cpu=1000, pods=10)
    room.regroup(None, None)
    assert room.of("a", GUARANTEED) is None


# ---------------------------------------------------------------------------------------------
# NodeShuffler against a real store
# ---------------------------------------------------------------------------------------------


@pytest.fixture
async def informer(store: Store) -> AsyncIterator[Informer]:
    inf = Informer(store, ["Pod", "Node", "SchedulerInstance"], block_ms=100)
    inf.start()
    await inf.wait_synced(10)
    try:
        yield inf
    finally:
        await inf.stop()


async def caught_up(store: Store, informer: Informer) -> None:
    await informer.wait_for_revision(await store.revision(), timeout=10)


async def heartbeat(store: Store, shard: str, *, at_ms: int | None = None) -> None:
    """What a shard's heartbeat writes (create on first beat)."""
    try:
        inst = await store.get(pb.SchedulerInstance, shard)
    except NotFoundError:
        inst = pb.SchedulerInstance(metadata=pb.ObjectMeta(name=shard))
        inst.spec.address = f"127.0.0.1:{abs(hash(shard)) % 50000 + 1000}"
        inst.status.heartbeat_ms = int(time.time() * 1000) if at_ms is None else at_ms
        await store.create(inst)
        return
    inst.status.heartbeat_ms = int(time.time() * 1000) if at_ms is None else at_ms
    await store.update(inst)


async def stored_partitions(store: Store) -> dict[str, list[str]]:
    instances, _ = await store.list_all(pb.SchedulerInstance)
    return {i.metadata.name: list(i.spec.partition) for i in instances}


async def test_dead_shard_nodes_move_to_the_others_and_new_node_to_smallest(
    store: Store, informer: Informer
) -> None:
    for i in range(12):
        await store.create(f.node(f"n{i:02d}"))
    for shard in ("a", "b", "c"):
        await heartbeat(store, shard)
    await caught_up(store, informer)
    shuffler = NodeShuffler(store, informer, PartitionSettings(mode="on"), shard_grace_seconds=5)
    await shuffler.tick()
    parts = await stored_partitions(store)
    assert {s: len(n) for s, n in parts.items()} == {"a": 4, "b": 4, "c": 4}
    dead = set(parts["c"])

    # c is killed: its heartbeat stops (here: the last one is older than the grace).
    await heartbeat(store, "a")
    await heartbeat(store, "b")
    await heartbeat(store, "c", at_ms=int(time.time() * 1000) - 60_000)
    await caught_up(store, informer)
    await shuffler.tick()
    after = await stored_partitions(store)
    assert {s: len(after[s]) for s in ("a", "b")} == {"a": 6, "b": 6}
    assert dead <= set(after["a"]) | set(after["b"])
    assert set(parts["a"]) <= set(after["a"]) and set(parts["b"]) <= set(after["b"])
    assert sorted(after["a"] + after["b"]) == [f"n{i:02d}" for i in range(12)]

    # A node added goes to the smallest partition.
    await store.create(f.node("n99"))
    await heartbeat(store, "a")
    await heartbeat(store, "b")
    await caught_up(store, informer)
    await shuffler.tick()
    final = await stored_partitions(store)
    assert "n99" in final["a"]  # a tie: the first name
    assert len(final["a"]) == 7 and final["b"] == after["b"]


async def test_auto_mode_follows_the_triggers(store: Store, informer: Informer) -> None:
    for i in range(4):
        await store.create(f.node(f"n{i}", cpu=1000))
    for shard in ("a", "b"):
        await heartbeat(store, shard)
    await caught_up(store, informer)
    shuffler = NodeShuffler(
        store,
        informer,
        PartitionSettings(mode="auto", off_after_seconds=0),
        shard_grace_seconds=5,
    )
    await shuffler.tick()
    assert not shuffler.on
    assert await stored_partitions(store) == {"a": [], "b": []}

    # 95% of the guaranteed CPU bound: partitioning goes on.
    job = f.job("fill", replicas=4, cpu=950)
    pods = f.pods_of(job)
    await store.create_unit(job, pods)
    ok, lease = await store.acquire_lease("binder", "test-binder", 60_000)
    assert ok
    pods = [await store.get(pb.Pod, p.metadata.name) for p in pods]
    for i, pod in enumerate(pods):
        pod.spec.node_name = f"n{i}"
        pod.spec.numa_nodes.append(0)
        pod.status.phase = pb.POD_BOUND
    await store.bind(pods, fence=Fence("binder", lease.epoch))
    await caught_up(store, informer)
    await shuffler.tick()
    assert shuffler.on and shuffler.figures.allocation_percent == 95.0
    assert "allocation 95.0%" in shuffler.reason
    assert {s: len(n) for s, n in (await stored_partitions(store)).items()} == {"a": 2, "b": 2}

    # The pods end: the trigger clears and partitioning goes off again.
    for pod in pods:
        current = await store.get(pb.Pod, pod.metadata.name)
        current.status.phase = pb.POD_SUCCEEDED
        await store.update(current)
    await caught_up(store, informer)
    await shuffler.tick()
    assert not shuffler.on
    assert await stored_partitions(store) == {"a": [], "b": []}


async def test_one_live_shard_gets_no_partition(store: Store, informer: Informer) -> None:
    """Nobody to conflict with: even with partitioning on, a lone shard keeps the whole view
    (and its record stays small)."""
    for i in range(4):
        await store.create(f.node(f"n{i}"))
    await heartbeat(store, "a")
    await caught_up(store, informer)
    shuffler = NodeShuffler(store, informer, PartitionSettings(mode="on"), shard_grace_seconds=5)
    await shuffler.tick()
    assert shuffler.on
    assert await stored_partitions(store) == {"a": []}
    await heartbeat(store, "b")
    await heartbeat(store, "a")
    await caught_up(store, informer)
    await shuffler.tick()
    assert {s: len(n) for s, n in (await stored_partitions(store)).items()} == {"a": 2, "b": 2}


async def test_a_view_behind_the_store_judges_no_shard_dead(
    store: Store, informer: Informer
) -> None:
    """A dispatcher whose view lags sees every heartbeat late: its shuffler leaves the
    partitions as published instead of clearing or moving them."""
    for i in range(4):
        await store.create(f.node(f"n{i}"))
    for shard in ("a", "b"):
        await heartbeat(store, shard)
    await caught_up(store, informer)
    shuffler = NodeShuffler(store, informer, PartitionSettings(mode="on"), shard_grace_seconds=0.4)
    await shuffler.tick()
    before = await stored_partitions(store)
    assert {s: len(n) for s, n in before.items()} == {"a": 2, "b": 2}

    # The view stops keeping up (here: its watch stopped) while the heartbeats grow old in it.
    await informer.stop()
    while informer.staleness() <= 0.4:  # noqa: ASYNC110 (the view ages with the clock alone)
        await asyncio.sleep(0.05)
    await shuffler.tick()
    assert await stored_partitions(store) == before
    assert shuffler.partitions is not None and shuffler.partitions.sizes() == {"a": 2, "b": 2}
