"""The change feed and informers: exact resume, trimmed positions, relists, restarts of the
store server, and the linear history of compare-and-set writes under random interleavings."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from protos.godel.v1 import objects_pb2 as pb
from store import (
    ConflictError,
    ResourceVersionTooNewError,
    ResourceVersionTooOldError,
    Store,
    kinds,
)
from store.client import Create, WatchEvent
from store.encoded import EncodedObjects
from store.informer import Handlers, Informer
from store.kinds import StoredObject
from store.server import StoreServer
from tests.factories import node


async def collect(store: Store, from_rev: int, until_rev: int, **kw: Any) -> list[WatchEvent]:
    events: list[WatchEvent] = []
    async for batch in store.watch(from_rev, block_ms=200, **kw):
        events.extend(batch.events)
        if batch.revision >= until_rev:
            return events
    raise AssertionError("unreachable")


async def test_watch_delivers_every_change_in_order(store: Store) -> None:
    n = await store.create(node("n1"))
    n.spec.unschedulable = True
    await store.update(n)
    await store.create(node("n2"))
    await store.delete(pb.Node, "n1")
    events = await collect(store, 0, 4)
    assert [(e.type, e.name, e.revision) for e in events] == [
        ("ADDED", "n1", 1),
        ("MODIFIED", "n1", 2),
        ("ADDED", "n2", 3),
        ("DELETED", "n1", 4),
    ]
    assert events[1].obj.spec.unschedulable  # type: ignore[union-attr]
    assert events[3].obj.metadata.name == "n1"  # type: ignore[union-attr]  # last state


async def test_watch_reads_entries_in_any_field_order_and_with_sparse_revisions(
    store: Store,
) -> None:
    """commit.lua writes every entry's fields in one order and one entry per revision; an entry
    written otherwise (another order, a revision skipped) is still read right."""
    await store.create(node("n1"))
    odd = node("n2").SerializeToString()
    # Fields in another order, and revision 2 skipped (the read starts at 1, so no trim).
    await store._redis.xadd(store.keys.feed, {"d": odd, "n": "n2", "k": "Node", "t": "A"}, id="3-0")
    events = await collect(store, 0, 2)
    assert [(e.type, e.name, e.revision) for e in events] == [
        ("ADDED", "n1", 1),
        ("ADDED", "n2", 3),
    ]
    assert events[1].obj is not None and events[1].obj.metadata.resource_version == 3  # type: ignore[attr-defined]


async def test_malformed_feed_entries_are_skipped_and_the_watch_goes_on(store: Store) -> None:
    """Garbage in the change feed (fields missing, an unknown event type, odd field counts)
    is skipped; the watch advances past it and delivers what follows."""
    await store.create(node("n1"))
    feed = store.keys.feed
    await store._redis.xadd(feed, {"x": "y"}, id="2-0")
    await store._redis.xadd(feed, {"t": "Z", "k": "Node", "n": "bad", "d": b""}, id="3-0")
    await store._redis.xadd(feed, {"k": "Node", "d": b"\xff"}, id="4-0")
    await store._redis.execute_command("INCRBY", store.keys.revision, 3)
    await store.create(node("n2"))
    events = await collect(store, 0, 2)
    assert [(e.type, e.name, e.revision) for e in events] == [
        ("ADDED", "n1", 1),
        ("ADDED", "n2", 5),
    ]


async def test_watch_filters_kinds_but_advances_past_them(store: Store) -> None:
    await store.create(node("n1"))
    await store.create(pb.Queue(metadata=pb.ObjectMeta(name="q")))
    await store.create(node("n2"))
    events = await collect(store, 0, 3, kinds=["Queue"])
    assert [(e.kind, e.revision) for e in events] == [("Queue", 2)]


async def test_watch_keeps_changes_by_name_before_decoding_them(store: Store) -> None:
    """``keep`` picks changes by kind and name alone: a change it leaves out is not decoded (an
    undecodable one raises nothing), and the watch still advances past it."""
    await store.create(node("a-1"))
    await store._redis.xadd(
        store.keys.feed, {"t": "A", "k": "Node", "n": "b-1", "d": b"\xff\xff"}, id="2-0"
    )
    await store._redis.execute_command("INCRBY", store.keys.revision, 1)
    await store.create(node("a-2"))
    await store.create(node("b-2"))
    events = await collect(store, 0, 4, keep=lambda kind, name: name.startswith(b"a-"))
    assert [(e.name, e.revision, e.error) for e in events] == [("a-1", 1, None), ("a-2", 3, None)]
    unfiltered = await collect(store, 0, 4)
    assert [e.name for e in unfiltered if e.error is not None] == ["b-1"]


async def test_resume_after_disconnect_has_no_gap_and_no_duplicate(store: Store) -> None:
    for i in range(50):
        await store.create(node(f"n{i}"))
    seen: list[int] = []
    async for batch in store.watch(0, count=7, block_ms=100):
        seen.extend(e.revision for e in batch.events)
        if len(seen) >= 20:
            break  # the watcher goes away mid-stream...
    for i in range(50, 80):
        await store.create(node(f"n{i}"))
    seen.extend(e.revision for e in await collect(store, seen[-1], 80))  # ...and resumes
    assert seen == list(range(1, 81))


async def test_trimmed_position_is_a_typed_error(store_url: str, cluster_name: str) -> None:
    small = await Store.connect(store_url, cluster=cluster_name, feed_max_len=10)
    try:
        for i in range(600):
            await small.create(node(f"n{i}"))
        oldest = await small.oldest_revision()
        assert oldest > 1  # approximate trimming removed whole blocks
        with pytest.raises(ResourceVersionTooOldError) as err:
            await collect(small, 0, 600)
        assert err.value.requested == 0 and err.value.oldest == oldest
        assert len(await collect(small, oldest - 1, 600)) == 600 - oldest + 1
    finally:
        await small.close()


async def test_a_call_of_many_commits_keeps_the_feed_a_slow_reader_needs(
    store_url: str, cluster_name: str
) -> None:
    """The feed is trimmed once per script call, after its entries: it keeps at least the
    newest ``feed_max_len`` entries, dense up to the current revision, and trims whole stream
    nodes below them as a trim at every entry would."""
    small = await Store.connect(store_url, cluster=cluster_name, feed_max_len=10)
    try:
        for batch in range(3):
            names = [f"n{batch}-{i}" for i in range(300)]
            await small.create_many([node(n) for n in names])
            current = await small.revision()
            oldest = await small.oldest_revision()
            assert current == 300 * (batch + 1)
            assert 1 < oldest <= current - 10 + 1  # trimmed, never below the last 10
            # A reader 10 entries behind still gets every change after its position.
            tail = await collect(small, current - 10, current)
            assert [e.revision for e in tail] == list(range(current - 9, current + 1))
            assert [e.name for e in tail] == names[-10:]
            with pytest.raises(ResourceVersionTooOldError):
                await collect(small, oldest - 2, current)
    finally:
        await small.close()


async def test_position_beyond_the_store_is_its_own_error(store: Store) -> None:
    """A watcher that remembers a revision the store never reached (the store was reset): told
    so, not that the feed was trimmed; an informer relists all the same (the base class)."""
    await store.create(node("n1"))
    with pytest.raises(ResourceVersionTooNewError) as err:
        await collect(store, 1000, 1000)
    assert isinstance(err.value, ResourceVersionTooOldError)
    assert "ahead of the store's current revision" in str(err.value)
    assert "no longer in the change feed" not in str(err.value)


class Mirror:
    """What a handler-driven consumer reconstructs from informer events."""

    def __init__(self) -> None:
        self.objs: dict[str, Message] = {}
        self.events = 0

    def handlers(self) -> Handlers:
        return Handlers(on_add=self.add, on_update=self.update, on_delete=self.delete)

    def add(self, kind: str, obj: Message) -> None:
        assert obj.metadata.name not in self.objs  # type: ignore[attr-defined]
        self.objs[obj.metadata.name] = obj  # type: ignore[attr-defined]
        self.events += 1

    def update(self, kind: str, old: Message, new: Message) -> None:
        assert self.objs.get(new.metadata.name) == old  # type: ignore[attr-defined]
        self.objs[new.metadata.name] = new  # type: ignore[attr-defined]
        self.events += 1

    def delete(self, kind: str, obj: Message) -> None:
        del self.objs[obj.metadata.name]  # type: ignore[attr-defined]
        self.events += 1


async def assert_mirrors_store(informer: Informer, mirror: Mirror, store: Store) -> None:
    await informer.wait_for_revision(await store.revision(), timeout=10)
    stored, _ = await store.list_all(pb.Node)
    expected = {n.metadata.name: n for n in stored}
    assert informer.cache["Node"] == expected
    assert mirror.objs == expected


async def test_informer_relists_when_its_position_was_trimmed(
    store_url: str, cluster_name: str
) -> None:
    small = await Store.connect(store_url, cluster=cluster_name, feed_max_len=10)
    informer = Informer(small, ["Node"], block_ms=100)
    mirror = Mirror()
    informer.add_handlers(mirror.handlers())
    try:
        for i in range(20):
            await small.create(node(f"n{i}"))
        informer.start()
        await informer.wait_synced(10)
        await assert_mirrors_store(informer, mirror, small)
        await informer.stop()  # falls behind while the feed moves on and is trimmed
        for i in range(20, 700):
            await small.create(node(f"n{i}"))
        for i in range(0, 20, 2):
            await small.delete(pb.Node, f"n{i}")
        n1 = await small.get(pb.Node, "n1")
        n1.spec.unschedulable = True
        await small.update(n1)
        informer.start()
        await assert_mirrors_store(informer, mirror, small)
        assert informer.relists == 1
    finally:
        await informer.stop()
        await small.close()


async def test_informer_selector_caches_and_delivers_only_matching_objects(
    store: Store,
) -> None:
    """Like a field selector: unmatched objects are invisible; leaving the selection is a
    delete, entering it an add; the initial list and the watch agree."""
    await store.create(node("a-listed"))
    await store.create(node("b-listed"))
    informer = Informer(
        store, ["Node"], block_ms=100, selector=lambda _k, n: n.metadata.labels.get("team") != "b"
    )
    mirror = Mirror()
    informer.add_handlers(mirror.handlers())
    informer.start()
    try:
        await informer.wait_synced(10)
        b = await store.get(pb.Node, "b-listed")
        b.metadata.labels["team"] = "b"
        await store.update(b)  # leaves the selection: delivered as a delete
        c = node("c-watched")
        c.metadata.labels["team"] = "b"
        await store.create(c)  # never matches: never seen
        a = await store.get(pb.Node, "a-listed")
        await store.update(a)
        b.metadata.labels["team"] = "a"
        await store.update(b)  # enters the selection again: an add
        await informer.wait_for_revision(await store.revision(), timeout=10)
        assert set(informer.cache["Node"]) == set(mirror.objs) == {"a-listed", "b-listed"}
        assert mirror.events == 2 + 1 + 1 + 1  # two listed, one delete, one update, one add
    finally:
        await informer.stop()


async def test_handlers_for_some_kinds_see_only_those_kinds(store: Store) -> None:
    """Handlers that name their kinds get only those kinds' events, the listed objects (as
    adds) included; handlers without kinds get every kind the informer watches."""
    await store.create(node("listed"))
    informer = Informer(store, ["Node", "Queue"], block_ms=100)
    informer.start()
    try:
        await informer.wait_synced(10)
        seen: dict[str, list[tuple[str, str, str]]] = {"nodes": [], "all": []}

        def recorder(into: str) -> Handlers:
            def add(kind: str, obj: Message) -> None:
                seen[into].append(("add", kind, obj.metadata.name))  # type: ignore[attr-defined]

            def update(kind: str, _old: Message, obj: Message) -> None:
                seen[into].append(("update", kind, obj.metadata.name))  # type: ignore[attr-defined]

            def delete(kind: str, obj: Message) -> None:
                seen[into].append(("delete", kind, obj.metadata.name))  # type: ignore[attr-defined]

            kinds = frozenset({"Node"}) if into == "nodes" else None
            return Handlers(on_add=add, on_update=update, on_delete=delete, kinds=kinds)

        informer.add_handlers(recorder("nodes"))
        informer.add_handlers(recorder("all"))
        await store.create(pb.Queue(metadata=pb.ObjectMeta(name="q")))
        n = await store.get(pb.Node, "listed")
        await store.update(n)
        await store.delete(pb.Queue, "q")
        await informer.wait_for_revision(await store.revision(), timeout=10)
        assert seen["nodes"] == [("add", "Node", "listed"), ("update", "Node", "listed")]
        assert seen["all"] == [
            ("add", "Node", "listed"),
            ("add", "Queue", "q"),
            ("update", "Node", "listed"),
            ("delete", "Queue", "q"),
        ]
    finally:
        await informer.stop()


async def test_informer_survives_a_store_restart(private_server: StoreServer) -> None:
    store = await Store.connect(private_server.url)
    informer = Informer(store, ["Node"], block_ms=100, retry_max_seconds=0.2)
    mirror = Mirror()
    informer.add_handlers(mirror.handlers())
    informer.start()
    try:
        for i in range(30):
            await store.create(node(f"n{i}"))
        await assert_mirrors_store(informer, mirror, store)
        private_server.kill()  # kill -9, mid-watch
        await asyncio.sleep(0.3)
        private_server.restart()
        for i in range(30, 60):
            await store.create(node(f"n{i}"))
        await assert_mirrors_store(informer, mirror, store)
        assert informer.relists == 0  # resumed exactly, no relist needed
        assert mirror.events == 60
    finally:
        await informer.stop()
        await store.close()


async def test_acknowledged_writes_survive_kill_9(private_server: StoreServer) -> None:
    store = await Store.connect(private_server.url)
    try:
        acknowledged = []
        for batch in range(5):
            results = await store.create_many([node(f"n{batch}-{i}") for i in range(100)])
            acknowledged += [r.metadata.name for r in results]  # type: ignore[union-attr]
        private_server.kill()
        private_server.restart()
        stored, rev = await store.list_all(pb.Node)
        assert sorted(n.metadata.name for n in stored) == sorted(acknowledged)
        assert rev == 500
    finally:
        await store.close()


# ---------------------------------------------------------------------------------------------
# Property: compare-and-set writers under any interleaving produce one linear history.
# ---------------------------------------------------------------------------------------------

WRITERS = 4
_example_ids = itertools.count()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(schedule=st.lists(st.integers(min_value=0, max_value=WRITERS - 1), min_size=1, max_size=40))
async def test_cas_history_is_linear_under_any_interleaving(
    store: Store, schedule: list[int]
) -> None:
    """Each writer alternates read and write steps in the order hypothesis picks. Every
    successful write must be based on the version written just before it (no lost update), and
    the feed must show exactly the successful writes, in order."""
    name = f"obj-{next(_example_ids)}"
    base = await store.create(node(name))
    start = base.metadata.resource_version
    reads: dict[int, pb.Node | None] = dict.fromkeys(range(WRITERS))
    history: list[tuple[int, int]] = []  # (version written over, new version)
    for step, writer in enumerate(schedule):
        held = reads[writer]
        if held is None:
            reads[writer] = await store.get(pb.Node, name)
            continue
        held.metadata.labels["step"] = str(step)
        expected = held.metadata.resource_version
        try:
            await store.update(held)
            history.append((expected, held.metadata.resource_version))
        except ConflictError:
            pass
        reads[writer] = None
    chain = [start] + [new for _, new in history]
    assert [old for old, _ in history] == chain[:-1]
    feed = [
        e.revision for e in await collect(store, start, await store.revision()) if e.name == name
    ]
    assert feed == chain[1:]
    final = await store.get(pb.Node, name)
    assert final.metadata.resource_version == chain[-1]


async def test_informer_staleness_tracks_a_backlog_and_an_outage(
    private_server: StoreServer,
) -> None:
    store = await Store.connect(private_server.url)
    informer = Informer(store, ["Node"], block_ms=100)
    assert informer.staleness() == float("inf")  # never synced
    informer.start()
    try:
        await informer.wait_synced(10)
        await informer.wait_for_revision(await store.revision(), timeout=10)
        assert informer.staleness() == 0.0  # waiting at the head of the feed
        private_server.kill()
        await asyncio.sleep(0.5)
        assert informer.staleness() >= 0.3  # cut off: the view ages
        private_server.restart()

        async def current() -> bool:
            return informer.staleness() == 0.0

        deadline = time.monotonic() + 15
        while not await current():
            assert time.monotonic() < deadline, "informer never caught up after the restart"
            await asyncio.sleep(0.05)
    finally:
        await informer.stop()
        await store.close()


async def test_an_informer_whose_event_loop_was_busy_is_stale_until_it_reads_again(
    store: Store,
) -> None:
    """Issue 16 item 7: a dispatcher busy with bulk work (a 100,000-pod submission) on its event
    loop held a view that still claimed to be at the head of the feed, so every shard heartbeat
    in it looked old and live shards were declared lost. A view not confirmed current within
    its watch period is stale, whatever the last read said."""
    informer = Informer(store, ["Node"], block_ms=100)
    informer.start()
    try:
        await informer.wait_synced(10)

        async def current() -> bool:
            return informer.staleness() == 0.0

        deadline = time.monotonic() + 15
        while not await current():
            assert time.monotonic() < deadline, "informer never current"
            await asyncio.sleep(0.05)
        _busy_loop(2.0)  # bulk work on the event loop: nothing else runs meanwhile
        assert informer.staleness() >= 1.0, "a view nobody refreshed for 2 s claimed to be current"
        deadline = time.monotonic() + 15
        while not await current():  # the loop is free again: the next read confirms it
            assert time.monotonic() < deadline, "informer never current again"
            await asyncio.sleep(0.05)
    finally:
        await informer.stop()


async def test_watch_batches_say_whether_they_reached_the_end_of_the_feed(store: Store) -> None:
    start = await store.revision()
    for i in range(5):
        await store.create(node(f"n{i}"))
    seen = []
    async for batch in store.watch(start, count=2, block_ms=100):
        seen.append((len(batch.events), batch.caught_up))
        if batch.revision >= start + 5:
            break
    assert seen == [(2, False), (2, False), (1, True)]


def _busy_loop(seconds: float) -> None:
    """CPU-bound work that holds the event loop, as a long synchronous loop would."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


async def test_informer_keeps_pods_encoded_and_relists_them_like_any_kind(
    store_url: str, cluster_name: str
) -> None:
    """Pods are cached as bytes (store.encoded): handlers still get each add, update and
    delete, an update's old state is the previous one, and a relist after the feed was trimmed
    delivers the difference."""
    small = await Store.connect(store_url, cluster=cluster_name, feed_max_len=10)
    informer = Informer(small, ["Pod"], block_ms=100)
    mirror = Mirror()
    informer.add_handlers(mirror.handlers())

    def pod(name: str) -> pb.Pod:
        p = pb.Pod(metadata=pb.ObjectMeta(name=name))
        p.spec.template.requests.milli_cpu = 100
        return p

    async def mirrors_store() -> None:
        await informer.wait_for_revision(await small.revision(), timeout=10)
        stored, _ = await small.list_all(pb.Pod)
        expected = {p.metadata.name: p for p in stored}
        assert isinstance(informer.cache["Pod"], EncodedObjects)
        assert dict(informer.cache["Pod"]) == expected == mirror.objs

    try:
        for i in range(5):
            await small.create(pod(f"p{i}"))
        informer.start()
        await informer.wait_synced(10)
        await mirrors_store()
        p1 = await small.get(pb.Pod, "p1")
        p1.spec.node_name = "n1"
        await small.update(p1)
        await small.delete(pb.Pod, "p2")
        await mirrors_store()
        assert informer.get("Pod", "p1") == p1 and informer.get("Pod", "p2") is None
        await informer.stop()
        for i in range(5, 300):  # the feed is trimmed approximately: well past its length
            await small.create(pod(f"p{i}"))
        await small.delete(pb.Pod, "p3")
        informer.start()
        await mirrors_store()
        assert informer.relists == 1 and informer.count("Pod") == 298
    finally:
        await informer.stop()
        await small.close()


async def test_an_informer_keeps_none_of_what_hold_refuses_yet_delivers_all_of_it(
    store_url: str, cluster_name: str
) -> None:
    """``hold`` (a shard's: the bytes of pods without a node only): a refused pod is delivered
    like any other, its updates and deletions too (with a name-only message as the state
    before), across a relist after the feed was trimmed, but the cache keeps none of it; the
    holder's names (``held_elsewhere``) say which exist."""
    small = await Store.connect(store_url, cluster=cluster_name, feed_max_len=10)
    bound: dict[str, str] = {}  # the holder's own records: the bound pods, name -> node
    present: dict[str, str] = {}  # every pod, name -> node, as the handlers tell it
    befores: list[str] = []
    informer = Informer(
        small,
        ["Pod"],
        block_ms=100,
        hold=lambda _k, p: not p.spec.node_name,
        held_elsewhere=lambda _k: bound,
    )

    def put(_kind: str, p: pb.Pod) -> None:
        present[p.metadata.name] = p.spec.node_name
        if p.spec.node_name:
            bound[p.metadata.name] = p.spec.node_name
        else:
            bound.pop(p.metadata.name, None)

    def update(_kind: str, before: pb.Pod, p: pb.Pod) -> None:
        befores.append(before.metadata.name)
        put(_kind, p)

    def delete(_kind: str, p: pb.Pod) -> None:
        del present[p.metadata.name]
        bound.pop(p.metadata.name, None)

    informer.add_handlers(Handlers.of(pb.Pod, on_add=put, on_update=update, on_delete=delete))

    def pod(name: str, node_name: str = "") -> pb.Pod:
        return pb.Pod(metadata=pb.ObjectMeta(name=name), spec=pb.PodSpec(node_name=node_name))

    async def delivered_as_stored() -> None:
        await informer.wait_for_revision(await small.revision(), timeout=10)
        stored, _ = await small.list_all(pb.Pod)
        assert present == {p.metadata.name: p.spec.node_name for p in stored}
        pending = {p.metadata.name: p for p in stored if not p.spec.node_name}
        assert dict(informer.cache["Pod"]) == pending  # nothing of the bound pods is kept
        assert all(informer.knows("Pod", p.metadata.name) for p in stored)

    try:
        await small.create(pod("bound-listed", "n1"))
        await small.create(pod("pending-listed"))
        informer.start()
        await informer.wait_synced(10)
        await delivered_as_stored()
        assert informer.get("Pod", "bound-listed") is None and informer.count("Pod") == 1
        placed = await small.get(pb.Pod, "pending-listed")
        placed.spec.node_name = "n2"
        await small.update(placed)  # bound: the cache lets it go
        moved = await small.get(pb.Pod, "bound-listed")
        moved.spec.node_name = "n3"
        await small.update(moved)  # an update of a pod held elsewhere
        await delivered_as_stored()
        assert befores == ["pending-listed", "bound-listed"]
        await small.delete(pb.Pod, "bound-listed")  # a deletion of one held elsewhere
        await small.create(pod("to-go", "n1"))
        await delivered_as_stored()
        await informer.stop()
        await small.delete(pb.Pod, "to-go")  # missed: the relist must deliver it
        for i in range(300):  # the feed is trimmed approximately: well past its length
            await small.create(pod(f"p{i}", "n1" if i % 2 else ""))
        informer.start()
        await delivered_as_stored()
        assert informer.relists == 1 and "to-go" not in present
        assert informer.count("Pod") == 150 and not informer.knows("Pod", "to-go")
    finally:
        await informer.stop()
        await small.close()


async def test_a_listing_hands_what_hold_refuses_to_on_listed_refused_instead_of_on_add(
    store: Store,
) -> None:
    """``Handlers.on_listed_refused``: a first listing hands the objects ``hold`` refuses to it
    instead of ``on_add`` (the dispatcher's pod index reads only the phase of those); what
    ``hold`` keeps, and every add after the listing, refused or not, still goes to
    ``on_add``."""
    added: list[str] = []
    refused: list[str] = []
    bound: set[str] = set()
    informer = Informer(
        store,
        ["Pod"],
        block_ms=100,
        hold=lambda _k, p: not p.spec.node_name,
        held_elsewhere=lambda _k: bound,
        recall=lambda _k, name: pb.Pod(metadata=pb.ObjectMeta(name=name)),
    )

    def add(_kind: str, p: pb.Pod) -> None:
        added.append(p.metadata.name)
        if p.spec.node_name:
            bound.add(p.metadata.name)

    def add_refused(_kind: str, p: pb.Pod) -> None:
        assert informer.delivering_listing
        refused.append(p.metadata.name)
        bound.add(p.metadata.name)

    informer.add_handlers(Handlers(on_add=add, on_listed_refused=add_refused))
    await store.create(
        pb.Pod(metadata=pb.ObjectMeta(name="on-n1"), spec=pb.PodSpec(node_name="n1"))
    )
    await store.create(pb.Pod(metadata=pb.ObjectMeta(name="pending")))
    try:
        informer.start()
        await informer.wait_synced(10)
        assert (added, refused) == (["pending"], ["on-n1"])
        await store.create(
            pb.Pod(metadata=pb.ObjectMeta(name="later"), spec=pb.PodSpec(node_name="n3"))
        )
        await informer.wait_for_revision(await store.revision(), timeout=10)
        assert (added, refused) == (["pending", "later"], ["on-n1"])
    finally:
        await informer.stop()


async def test_a_holders_outline_is_the_state_before_and_a_listing_spares_who_asks(
    store: Store,
) -> None:
    """``recall``: an update of an object held elsewhere comes with the holder's outline of it
    as the state before (not a name alone). A first listing hands a handler that asks
    (``refused_at_listing=False``) only what ``hold`` keeps, and ``on_listed`` tells every
    handler when the kind is handed over (``delivering_listing`` true until then); the cache
    keeps what ``hold`` keeps."""
    bound: dict[str, str] = {}  # the holder's records: name -> node
    everything: list[str] = []
    spared: list[str] = []
    listed: list[tuple[str, bool, list[str]]] = []
    befores: list[tuple[str, str]] = []
    informer = Informer(
        store,
        ["Pod"],
        block_ms=100,
        hold=lambda _k, p: not p.spec.node_name,
        held_elsewhere=lambda _k: bound,
        recall=lambda _k, name: pb.Pod(
            metadata=pb.ObjectMeta(name=name), spec=pb.PodSpec(node_name=bound[name])
        ),
    )

    def put(_kind: str, p: pb.Pod) -> None:
        everything.append(p.metadata.name)
        if p.spec.node_name:
            bound[p.metadata.name] = p.spec.node_name

    def update(_kind: str, before: pb.Pod, p: pb.Pod) -> None:
        befores.append((before.metadata.name, before.spec.node_name))
        put(_kind, p)

    informer.add_handlers(
        Handlers.of(pb.Pod, on_add=put, on_update=update),
    )
    informer.add_handlers(
        Handlers(
            on_add=lambda _k, p: spared.append(p.metadata.name),
            on_listed=lambda kind: listed.append(
                (kind, informer.delivering_listing, sorted(informer.names("Pod")))
            ),
            refused_at_listing=False,
        )
    )
    await store.create(
        pb.Pod(metadata=pb.ObjectMeta(name="on-n1"), spec=pb.PodSpec(node_name="n1"))
    )
    await store.create(pb.Pod(metadata=pb.ObjectMeta(name="pending")))
    try:
        informer.start()
        await informer.wait_synced(10)
        assert sorted(everything) == ["on-n1", "pending"]
        assert spared == ["pending"]  # the listed pod on a node: not handed to who asked
        assert listed == [("Pod", False, ["pending"])]
        assert informer.get("Pod", "on-n1") is None and informer.knows("Pod", "on-n1")
        moved = await store.get(pb.Pod, "on-n1")
        moved.spec.node_name = "n2"
        await store.update(moved)
        await informer.wait_for_revision(await store.revision(), timeout=10)
        assert befores == [("on-n1", "n1")]  # the holder's outline, as it was
        await store.create(
            pb.Pod(metadata=pb.ObjectMeta(name="later"), spec=pb.PodSpec(node_name="n3"))
        )
        await informer.wait_for_revision(await store.revision(), timeout=10)
        assert spared == ["pending", "later"]  # after the listing: every add, as before
    finally:
        await informer.stop()
    with pytest.raises(ValueError, match="recall outlines what is held elsewhere; give it too"):
        Informer(store, ["Pod"], hold=lambda _k, _p: True, recall=lambda _k, n: pb.Pod())


def test_the_holders_names_without_hold_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="held_elsewhere names what hold refuses; give hold"):
        Informer(store, ["Pod"], held_elsewhere=lambda _k: ())


async def test_an_informer_applies_a_long_read_in_slices_and_says_when_it_is_whole(
    store: Store,
) -> None:
    """A read of the feed whose handlers take long (a 100,000-pod job's pods, each indexed
    several ways) is applied a slice at a time, other tasks running between; and
    ``read_applied`` waits until the read is applied whole (the dispatcher's round must not
    see part of a commit)."""
    informer = Informer(store, ["Node"], block_ms=100)
    handled: list[str] = []
    turns_while_applying: list[int] = []
    turns = 0
    began = asyncio.Event()

    def slow_handler(_kind: str, obj: Message) -> None:
        assert isinstance(obj, pb.Node)
        handled.append(obj.metadata.name)
        turns_while_applying.append(turns)
        began.set()
        _busy_loop(0.002)  # a handler's work: 200 events are 0.4 s in all

    async def another_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    informer.add_handlers(Handlers(on_add=slow_handler))
    informer.start()
    ticker = asyncio.create_task(another_task())
    try:
        await informer.wait_synced(10)
        await store.commit([Create(node(f"n{i}")) for i in range(200)])  # one commit, one read
        await began.wait()
        assert len(handled) < 200, "the read was applied in one piece"
        await informer.read_applied()
        assert len(handled) == 200
        assert len(informer.cache["Node"]) == 200
    finally:
        ticker.cancel()
        await informer.stop()
    # Other tasks (this one) ran between the slices of the one read.
    assert turns_while_applying[-1] > turns_while_applying[0]


@pytest.mark.parametrize(
    "resource_version",
    [0, 1, 127, 128, 300, 2**14 - 1, 2**14, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**35, 2**63 - 1],
)
def test_with_resource_version_sets_the_version_without_decoding(resource_version: int) -> None:
    """The stored bytes with ``metadata {resource_version}`` appended decode to the object with
    that version and nothing else changed, at every varint length; the kind's own decode of the
    stored bytes agrees."""
    p = pb.Pod(metadata=pb.ObjectMeta(name="p", uid="u", labels={"a": "b"}))
    p.spec.node_name = "n1"
    p.spec.template.requests.milli_cpu = 250
    stored = p.SerializeToString()  # as stored: no resource_version (kinds.encode)
    got = pb.Pod.FromString(kinds.with_resource_version(stored, resource_version))
    expected = kinds.decode(kinds.kind_named("Pod"), stored, resource_version)
    assert got == expected and got.metadata.resource_version == resource_version


async def test_informer_listing_kept_encoded_skips_an_undecodable_object(store: Store) -> None:
    """The initial listing keeps encoded kinds as listed, the resource version appended
    (``kinds.with_resource_version``) rather than decoded and encoded again: every object reads
    back equal to the store's, versions included, and one whose stored bytes do not decode is
    left out of the cache and never handed to a handler, with a log line naming it."""
    for i in range(3):
        p = pb.Pod(metadata=pb.ObjectMeta(name=f"p{i}", labels={"i": str(i)}))
        p.spec.template.requests.milli_cpu = 100 + i
        await store.create(p)
    await store._redis.hset(store.keys.data("Pod"), "bad", b"\xff\xff\xff")
    await store._redis.hset(store.keys.versions("Pod"), "bad", 99)
    informer = Informer(store, ["Pod"], block_ms=100)
    mirror = Mirror()
    informer.add_handlers(mirror.handlers())
    try:
        with capture_logs() as logs:
            informer.start()
            await informer.wait_synced(10)
        stored = {name: await store.get(pb.Pod, name) for name in ("p0", "p1", "p2")}
        assert dict(informer.cache["Pod"]) == stored == mirror.objs
        assert [p.metadata.resource_version for p in stored.values()] == [1, 2, 3]
        assert not informer.has("Pod", "bad")
        [skipped] = [e for e in logs if e["event"] == "undecodable object in the store; skipped"]
        assert skipped["name"] == "bad"
    finally:
        await informer.stop()


async def test_handlers_before_start_see_each_listed_object_once_and_late_ones_may_skip_it(
    store: Store,
) -> None:
    """Registered before ``start()``, handlers get each listed object once, from the listing;
    registered later they get the cache again as adds, unless ``replay=False``: then only what
    happens from then on (the dispatcher's partitions' room, built from claims kept anyway)."""
    for name in ("a", "b", "c"):
        await store.create(node(name))
    informer = Informer(store, ["Node"], block_ms=100)
    early: list[str] = []
    informer.add_handlers(Handlers(on_add=lambda _k, n: early.append(n.metadata.name)))
    informer.start()
    try:
        await informer.wait_synced(10)
        assert sorted(early) == ["a", "b", "c"]
        replayed: list[str] = []
        later: list[str] = []
        informer.add_handlers(Handlers(on_add=lambda _k, n: replayed.append(n.metadata.name)))
        informer.add_handlers(
            Handlers(on_add=lambda _k, n: later.append(n.metadata.name)), replay=False
        )
        assert sorted(replayed) == ["a", "b", "c"] and later == []
        await store.create(node("d"))
        await informer.wait_for_revision(await store.revision(), timeout=10)
        assert sorted(early) == sorted(replayed) == ["a", "b", "c", "d"] and later == ["d"]
    finally:
        await informer.stop()


async def test_a_handler_failing_on_a_listed_object_stops_neither_the_listing_nor_the_others(
    store: Store,
) -> None:
    """The first listing hands every object to every add handler of its kind, kept encoded
    (pods) or not (queues): a handler that raises on one object is logged, and it and the
    other handlers still get every other object, and the informer syncs."""
    for i in range(3):
        await store.create(pb.Pod(metadata=pb.ObjectMeta(name=f"p{i}")))
        await store.create(pb.Queue(metadata=pb.ObjectMeta(name=f"q{i}")))
    informer = Informer(store, ["Pod", "Queue"], block_ms=100)
    failing: list[str] = []
    others: list[str] = []

    def fail_on_first(_kind: str, obj: Message) -> None:
        assert isinstance(obj, pb.Pod | pb.Queue)
        name = obj.metadata.name
        failing.append(name)
        if name in ("p0", "q0"):
            raise RuntimeError("handler bug")

    informer.add_handlers(Handlers(on_add=fail_on_first))
    informer.add_handlers(Handlers(on_add=lambda _k, o: others.append(o.metadata.name)))
    try:
        with capture_logs() as logs:
            informer.start()
            await informer.wait_synced(10)
        expected = ["p0", "p1", "p2", "q0", "q1", "q2"]
        assert sorted(failing) == sorted(others) == expected
        assert informer.count("Pod") == informer.count("Queue") == 3
        failed = [e["kind"] for e in logs if e["event"] == "informer handler failed"]
        assert sorted(failed) == ["Pod", "Queue"]
    finally:
        await informer.stop()


async def test_a_taker_takes_a_first_listings_objects_and_hands_back_the_rest(
    store: Store,
) -> None:
    """``take_listed``: every object of a first listing is offered to the holder first; what it
    takes no handler sees and the cache keeps none of (its version never read: 0); what it
    declines goes on as without it, with its resource version, kept if ``hold`` keeps it. Later
    changes and a relist do not go through it."""
    bound: dict[str, str] = {}
    offered: list[tuple[str, int]] = []
    handed: list[tuple[str, int]] = []

    def take(p: pb.Pod) -> bool:
        offered.append((p.metadata.name, p.metadata.resource_version))
        if not p.spec.node_name:
            return False
        bound[p.metadata.name] = p.spec.node_name
        return True

    informer = Informer(
        store,
        ["Pod"],
        block_ms=100,
        hold=lambda _k, p: not p.spec.node_name,
        held_elsewhere=lambda _k: bound,
        take_listed={"Pod": take},
    )

    def put(_kind: str, p: pb.Pod) -> None:
        handed.append((p.metadata.name, p.metadata.resource_version))
        if p.spec.node_name:
            bound[p.metadata.name] = p.spec.node_name

    informer.add_handlers(Handlers.of(pb.Pod, on_add=put))
    on_n1 = await store.create(
        pb.Pod(metadata=pb.ObjectMeta(name="on-n1"), spec=pb.PodSpec(node_name="n1"))
    )
    pending = await store.create(pb.Pod(metadata=pb.ObjectMeta(name="pending")))
    try:
        informer.start()
        await informer.wait_synced(10)
        assert sorted(offered) == [("on-n1", 0), ("pending", 0)]
        assert bound == {"on-n1": "n1"}
        assert handed == [("pending", pending.metadata.resource_version)]
        assert informer.get("Pod", "on-n1") is None and informer.knows("Pod", "on-n1")
        assert informer.get("Pod", "pending") == pending
        assert on_n1.metadata.resource_version  # (stored with one; the taker never read it)
        later = await store.create(
            pb.Pod(metadata=pb.ObjectMeta(name="later"), spec=pb.PodSpec(node_name="n2"))
        )
        await informer.wait_for_revision(await store.revision(), timeout=10)
        assert len(offered) == 2  # a change of the feed: a handler's, as always
        assert handed[-1] == ("later", later.metadata.resource_version)
    finally:
        await informer.stop()
    with pytest.raises(ValueError, match="take_listed takes what is held elsewhere; give it too"):
        Informer(store, ["Pod"], hold=lambda _k, _p: True, take_listed={"Pod": take})


async def test_a_first_listing_through_a_selector_and_hold_delivers_and_keeps_the_selected_only(
    store: Store,
) -> None:
    """A node agent's informer: ``selector`` takes its nodes' pods, ``hold`` keeps the bytes of
    one node's of them. Its first listing hands the handlers the selected pods only (each once)
    and keeps the selected pods ``hold`` keeps; what arrives later is selected alike."""
    ours = {"mine", "process"}
    seen: list[str] = []

    def node_of(obj: StoredObject) -> str:
        return obj.spec.node_name if isinstance(obj, pb.Pod) else ""

    informer = Informer(
        store,
        ["Pod"],
        block_ms=100,
        selector=lambda _k, p: node_of(p) in ours,
        hold=lambda _k, p: node_of(p) == "process",
        held_elsewhere=lambda _k: [n for n in seen if n.startswith("on-mine")],
    )
    informer.add_handlers(Handlers.of(pb.Pod, on_add=lambda _k, p: seen.append(p.metadata.name)))

    def pod(name: str, node_name: str) -> pb.Pod:
        return pb.Pod(metadata=pb.ObjectMeta(name=name), spec=pb.PodSpec(node_name=node_name))

    try:
        for name, node in (("on-mine", "mine"), ("on-process", "process"), ("elsewhere", "b")):
            await store.create(pod(name, node))
        informer.start()
        await informer.wait_synced(10)
        assert sorted(seen) == ["on-mine", "on-process"]
        assert informer.names("Pod") == ("on-process",)
        assert informer.get("Pod", "on-process") == await store.get(pb.Pod, "on-process")
        assert informer.knows("Pod", "on-mine") and not informer.knows("Pod", "elsewhere")
        await store.create(pod("later-elsewhere", "b"))
        await store.create(pod("later-process", "process"))
        await informer.wait_for_revision(await store.revision(), timeout=10)
        assert sorted(seen) == ["later-process", "on-mine", "on-process"]
        assert sorted(informer.names("Pod")) == ["later-process", "on-process"]
    finally:
        await informer.stop()
