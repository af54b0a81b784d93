"""Node partitions: the shuffler rule and the partition operations (tables), the triggers, and
the dispatcher's NodeShuffler against a real store (a dead shard's nodes move to the others, a
new node joins the smallest partition, auto mode follows its triggers)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.partitions import (
    Figures,
    Meter,
    NodeShuffler,
    Partitions,
    PartitionSettings,
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
