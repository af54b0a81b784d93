"""Feed hints (issue 34 item 4, CPU per pod): the writer of an update says what it was
(``Update.hint``; the node agent's start of a pod, ``R<started_ms>``), its feed entry carries
it, and a reader that makes nothing of such a change passes over it undecoded
(``ChangeFeed.watch``'s ``hinted``, ``Informer(hinted=)``) — only where its cache keeps no bytes
of the object and no earlier change of the same read names it. The Binders, the node agents
and the shards (which take the start time from the hint) pass over a pod's start, and still
see its end and its deletion; a compare-and-set over it, from a fresh read, succeeds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from placement.claims import holds_claim
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.binder.config import BinderConfig
from services.binder.service import BinderService
from services.nodeagent.service import NodeAgentService
from services.runtime.service import ServiceHost
from services.scheduler.service import SchedulerConfig, SchedulerService
from store import InvalidObjectError, Store
from store.client import (
    POD_STARTED,
    Bind,
    Create,
    Release,
    Update,
    WatchEvent,
    hinted_start,
    pod_started_hint,
)
from store.encoded import EncodedObjects
from store.informer import Handlers, Informer
from store.keys import Keys
from store.kinds import StoredObject
from store.ops import ScriptCall
from tests import factories as f
from tests.test_binder import config as binder_config
from tests.test_binder import eventually, evict, leading, numa_node, prio, submit_prio
from tests.test_nodeagent import agent_config, phases, submit_and_bind

V = ipb.VerdictCode


# ---------------------------------------------------------------------------------------------
# The hint's forms
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hint", "started_ms"),
    [
        (b"R1764000000123", 1764000000123),
        (pod_started_hint(42).encode(), 42),
        (b"R", None),  # no time: not a start hint
        (b"R12a", None),
        (b"X12", None),  # another hint
        (b"", None),
    ],
)
def test_a_start_hint_carries_its_time(hint: bytes, started_ms: int | None) -> None:
    assert hinted_start(hint) == started_ms


def _pod(name: str, version: int = 5) -> pb.Pod:
    pod = pb.Pod(metadata=pb.ObjectMeta(name=name, resource_version=version))
    pod.spec.node_name, pod.status.phase = "n1", pb.POD_RUNNING
    return pod


@pytest.mark.parametrize(
    ("op", "header_type"),
    [
        (Update(_pod("p"), hint="R17"), "UR17"),
        (Update(_pod("p"), hint="Started1"), "UStarted1"),
        (Update(_pod("p")), "U"),
        (Update(_pod("p"), force=True), "U"),
    ],
)
def test_a_hinted_update_names_its_hint_with_its_type(op: Update, header_type: str) -> None:
    call = ScriptCall(Keys("hints"), None, 100)
    call.add([op], 1 << 20)
    header = call.args[4]
    assert header.split(" ")[0] == header_type


@pytest.mark.parametrize(
    "op",
    [
        Update(_pod("p"), force=True, hint="R17"),  # not a compare-and-set: no change described
        Update(_pod("p"), hint="1R"),  # a letter first
        Update(_pod("p"), hint="R 17"),  # one word
        Update(_pod("p"), hint="R-17"),
        Update(_pod("p"), hint="R" + "1" * 40),  # short
    ],
)
def test_a_hint_of_another_form_or_on_a_forced_write_is_refused(op: Update) -> None:
    call = ScriptCall(Keys("hints"), None, 100)
    with pytest.raises(InvalidObjectError, match="feed hint"):
        call.add([op], 1 << 20)
    assert call.op_count == 0


# ---------------------------------------------------------------------------------------------
# The feed
# ---------------------------------------------------------------------------------------------


async def _bound(store: Store, name: str, node: str = "n1") -> pb.Pod:
    """A pod created and bound (with a claim) on ``node``, as stored."""
    pod = f.pods_of(f.job(name.rsplit("-", 1)[0], replicas=1))[0]
    await store.commit([Create(pod)])
    pod.spec.node_name, pod.status.phase = node, pb.POD_BOUND
    await store.commit([Bind(pod)])
    return pod


def _started(pod: pb.Pod, started_ms: int = 1_000) -> Update:
    """The node agent's start of ``pod`` (a compare-and-set on its version), hinted."""
    pod.status.phase, pod.status.started_ms = pb.POD_RUNNING, started_ms
    return Update(pod, hint=pod_started_hint(started_ms))


async def _collect(store: Store, since: int, until: int, **kw: Any) -> list[WatchEvent]:
    events: list[WatchEvent] = []
    async for batch in store.watch(since, ["Pod"], block_ms=100, **kw):
        events.extend(batch.events)
        if batch.revision >= until:
            return events
    raise AssertionError("unreachable")


async def test_a_hinted_update_writes_its_hint_last_in_its_feed_entry(store: Store) -> None:
    """The entry of a hinted update is ``t k n d h``; ``hinted`` is asked about it instead of
    ``keep``, and one it passes over is not decoded; without ``hinted`` it is read as any
    change (``keep`` asked). Entries without a hint, or with their fields in another order,
    read as before."""
    await store.create(f.node("n1"))
    pod = await _bound(store, "hint-0")
    [revision] = await store.commit([_started(pod, 1234)])
    entries = await store._redis.xrange(store.keys.feed, f"{revision}-0", f"{revision}-0")
    fields = entries[0][1]
    assert list(fields) == [b"t", b"k", b"n", b"d", b"h"]
    assert fields[b"t"] == b"M" and fields[b"h"] == b"R1234"
    # The same change written by hand with its fields in another order, and undecodable.
    await store._redis.xadd(
        store.keys.feed,
        {"h": "R5", "n": "hint-0", "d": b"\xff\xff", "k": "Pod", "t": "M"},
        id=f"{revision + 1}-0",
    )
    await store._redis.execute_command("INCRBY", store.keys.revision, 1)

    kept: list[bytes] = []
    asked: list[tuple[str, bytes, bytes]] = []

    def keep(kind: str, name: bytes) -> bool:
        kept.append(name)
        return True

    def hinted(kind: str, name: bytes, hint: bytes) -> bool:
        asked.append((kind, name, hint))
        return False

    events = await _collect(store, 0, revision + 1, keep=keep, hinted=hinted)
    assert [(e.type, e.revision) for e in events] == [("ADDED", 2), ("MODIFIED", 3)]
    assert kept == [b"hint-0", b"hint-0"]
    assert asked == [("Pod", b"hint-0", b"R1234"), ("Pod", b"hint-0", b"R5")]

    kept.clear()
    events = await _collect(store, 0, revision + 1, keep=keep)
    assert [(e.revision, e.error is None) for e in events] == [
        (2, True),
        (3, True),
        (revision, True),
        (revision + 1, False),  # read: its bytes are not a pod
    ]
    running = events[2].obj
    assert isinstance(running, pb.Pod) and running.status.started_ms == 1234
    assert kept == [b"hint-0"] * 4


# ---------------------------------------------------------------------------------------------
# The informer's rule: when a hinted change may be passed over
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bytes_kept", "taken_in_this_read", "reads", "holder", "read", "asked", "counted"),
    [
        # No bytes kept, nothing of it earlier in the read: the holder decides.
        (False, False, None, False, False, True, "passed_over"),
        (False, False, None, True, True, True, ""),
        # Bytes kept: read (the cache would keep its old state), the holder not asked.
        (True, False, None, False, True, False, ""),
        # An earlier change of the same read names it: the informer's state is not yet the
        # version the hint describes the change from.
        (False, True, None, False, True, False, ""),
        # ``reads`` first, as for any change.
        (False, False, False, True, False, False, "unread"),
        (False, False, True, False, False, True, "passed_over"),
    ],
)
def test_an_informer_passes_over_a_hinted_change_only_of_what_it_keeps_no_bytes_of(
    store: Store,
    bytes_kept: bool,
    taken_in_this_read: bool,
    reads: bool | None,
    holder: bool,
    read: bool,
    asked: bool,
    counted: str,
) -> None:
    holder_asked: list[tuple[str, str, bytes]] = []

    def hinted(kind: str, name: str, hint: bytes) -> bool:
        holder_asked.append((kind, name, hint))
        return holder

    informer = Informer(
        store,
        ["Pod"],
        reads=None if reads is None else (lambda _kind, _name: reads),
        hinted=hinted,
    )
    cache = informer.cache["Pod"]
    assert isinstance(cache, EncodedObjects)
    cache["other"] = _pod("other")
    if bytes_kept:
        cache["p"] = _pod("p")
    if taken_in_this_read:
        assert informer._taken("Pod", b"p")
    assert informer._hinted_or_taken("Pod", b"p", b"R9") is read
    assert holder_asked == ([("Pod", "p", b"R9")] if asked else [])
    assert informer.passed_over == (counted == "passed_over")
    assert informer.unread == (counted == "unread")
    # A change taken is one of this read's: a later hinted change of it is read.
    if read:
        assert informer._hinted_or_taken("Pod", b"p", b"R10")


def _claim_holders(kind: str, obj: StoredObject) -> bool:
    """A hold that refuses the pods holding a claim (their holder keeps records, not bytes),
    as the Binder's."""
    return not (isinstance(obj, pb.Pod) and holds_claim(obj))


class _Records:
    """A holder of records of the pods ``hold`` refuses, by name (what a Binder or a shard
    keeps), and of every placed pod's phase as delivered."""

    def __init__(self, hold: Callable[[str, StoredObject], bool]) -> None:
        self.hold = hold
        self.held: set[str] = set()  # what the informer asks: ``held_elsewhere``
        self.phases: dict[str, int] = {}
        self.seen: list[tuple[str, str, int, int]] = []  # event, name, phase, version

    def handlers(self) -> Handlers:
        return Handlers.of(
            pb.Pod,
            on_add=lambda _k, p: self._set("add", p),
            on_update=lambda _k, _o, p: self._set("update", p),
            on_delete=lambda _k, p: self._gone(p),
        )

    def _set(self, event: str, pod: pb.Pod) -> None:
        name = pod.metadata.name
        self.seen.append((event, name, pod.status.phase, pod.metadata.resource_version))
        if pod.spec.node_name and pod.status.phase in (pb.POD_BOUND, pb.POD_RUNNING):
            self.phases[name] = pod.status.phase
        else:
            self.phases.pop(name, None)
        if self.hold("Pod", pod):
            self.held.discard(name)
        else:
            self.held.add(name)

    def _gone(self, pod: pb.Pod) -> None:
        self.seen.append(("delete", pod.metadata.name, 0, 0))
        self.phases.pop(pod.metadata.name, None)
        self.held.discard(pod.metadata.name)


async def _informer(store: Store, records: _Records) -> Informer:
    informer = Informer(
        store,
        ["Pod"],
        hold=records.hold,
        held_elsewhere=lambda _kind: records.held,
        hinted=lambda _kind, _name, hint: hint[:1] != POD_STARTED,
        block_ms=50,
    )
    informer.add_handlers(records.handlers())
    informer.start()
    await informer.wait_synced()
    return informer


async def test_a_passed_over_start_leaves_the_end_and_the_deletion_delivered(
    store: Store,
) -> None:
    """A holder of records passes over a bound pod's start, yet gets its end (a compare-and-set
    from the store's version, after the start it did not read) and another pod's deletion."""
    await store.create(f.node("n1"))
    records = _Records(_claim_holders)
    informer = await _informer(store, records)
    try:
        ended, deleted = await _bound(store, "ended-0"), await _bound(store, "deleted-0")
        await informer.wait_for_revision(await store.revision())  # the binds read first
        await store.commit_many([[_started(ended)], [_started(deleted)]])
        await informer.wait_for_revision(await store.revision())
        assert informer.passed_over == 2
        assert records.phases == {"ended-0": pb.POD_BOUND, "deleted-0": pb.POD_BOUND}

        stored = await store.get(pb.Pod, "ended-0")  # a writer's fresh read: the start's version
        stored.status.phase = pb.POD_SUCCEEDED
        [succeeded] = await store.commit([Release(stored)])
        await store.delete(pb.Pod, "deleted-0")
        await informer.wait_for_revision(await store.revision())
        assert records.phases == {}
        assert ("update", "ended-0", pb.POD_SUCCEEDED, succeeded) in records.seen
        assert records.seen[-1] == ("delete", "deleted-0", 0, 0)
        assert records.held == set() and informer.get(pb.Pod, "ended-0") is not None
        assert informer.passed_over == 2
    finally:
        await informer.stop()


async def test_a_start_in_the_read_of_its_bind_or_of_a_pod_kept_whole_is_read(
    store: Store,
) -> None:
    """The informer's state must be the version a hint describes the change from: a start in
    the same read as the bind it follows is read; so is the start of a pod whose bytes the
    cache keeps (a process node's pods in an agent), whose cached copy is then the started
    one at its version."""
    await store.create(f.node("n1"))
    await store.create(f.node("proc"))
    records = _Records(
        lambda kind, obj: not (isinstance(obj, pb.Pod) and obj.spec.node_name == "n1")
    )
    informer = await _informer(store, records)
    try:
        whole = await _bound(store, "whole-0", node="proc")
        await informer.wait_for_revision(await store.revision())
        await informer.stop()  # the bind and the start below in one read when it resumes
        both = await _bound(store, "both-0")
        await store.commit_many([[_started(both)], [_started(whole)]])
        informer.start()
        await informer.wait_for_revision(await store.revision())
        assert informer.passed_over == 0
        assert records.phases == {"both-0": pb.POD_RUNNING, "whole-0": pb.POD_RUNNING}
        cached = informer.get(pb.Pod, "whole-0")
        assert cached is not None and cached.status.phase == pb.POD_RUNNING
        assert cached.metadata.resource_version == whole.metadata.resource_version
    finally:
        await informer.stop()


# ---------------------------------------------------------------------------------------------
# The services
# ---------------------------------------------------------------------------------------------


@pytest.fixture
async def binders(
    store: Store, store_url: str, cluster_name: str
) -> AsyncIterator[tuple[ServiceHost[BinderConfig], ServiceHost[BinderConfig]]]:
    for name in ("a1", "a2"):
        await store.create(numa_node(name))
    leader = ServiceHost(BinderService, binder_config(store_url, cluster_name, "b1"))
    standby = ServiceHost(BinderService, binder_config(store_url, cluster_name, "b2"))
    async with leader:
        await eventually(lambda: leading(leader), what="leadership")
        async with standby:
            yield leader, standby


def _binder(host: ServiceHost[BinderConfig]) -> BinderService:
    service = host.service
    assert isinstance(service, BinderService)
    return service


async def test_binders_pass_over_a_start_and_still_see_the_eviction_and_deletion(
    store: Store, binders: tuple[ServiceHost[BinderConfig], ServiceHost[BinderConfig]]
) -> None:
    """Leader and standby pass over the starts of the pods they placed (their records say the
    same either way); the leader's eviction of a started pod (a compare-and-set on the pod
    read from the store) succeeds, and both see it end and another pod's deletion."""
    leader, _ = binders
    web = prio(f.job("web", replicas=2, cpu=1000), 1)
    pods = await submit_prio(store, web)
    for name, node in (("web-0", "a1"), ("web-1", "a2")):
        pod = pods[name]
        pod.spec.node_name, pod.status.phase = node, pb.POD_BOUND
        await store.commit([Bind(pod)])
    for host in binders:
        state = _binder(host).state
        await eventually(
            lambda s=state: _true(set(s.pod_node) == {"web-0", "web-1"}), what="the binds"
        )
    before = [_binder(h).informer.passed_over for h in binders]
    await store.commit_many([[_started(pods["web-0"])], [_started(pods["web-1"])]])
    revision = await store.revision()
    for host, passed in zip(binders, before, strict=True):
        service = _binder(host)
        await service.informer.wait_for_revision(revision)
        assert service.informer.passed_over == passed + 2
        assert set(service.state.pod_node) == {"web-0", "web-1"}

    results = await evict(leader.address, [await store.get(pb.Pod, "web-0")])
    assert results["web-0"].outcome == ipb.EvictResult.EVICTED, results["web-0"].reason
    evicted = await store.get(pb.Pod, "web-0")
    assert (evicted.status.phase, evicted.status.started_ms) == (pb.POD_FAILED, 1_000)
    await store.delete(pb.Pod, "web-1")
    for host in binders:
        state = _binder(host).state
        await eventually(lambda s=state: _true(not s.pod_node), what="the end and the deletion")
        assert "web-1" not in state.names_of_job("web")


async def _true(value: bool) -> bool:
    return value


async def test_a_node_agent_passes_over_its_own_start_and_ends_the_pod(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """The agent's start of a hollow pod is hinted in the feed, and its own informer passes
    over the echo; the pod's end (a compare-and-set over the start, from the store's version)
    is written, and a deleted pod stops."""
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=1, node_prefix="hint")
    async with ServiceHost(NodeAgentService, cfg) as host:
        agent = host.service
        assert isinstance(agent, NodeAgentService)
        short = f.job("short", replicas=1, cpu=500)
        short.spec.template.duration_ms = 800
        long = f.job("long", replicas=1, cpu=500)
        names = [
            p.metadata.name
            for j in (short, long)
            for p in await submit_and_bind(store, j, ["hint-0"])
        ]

        async def running_then_done() -> bool:
            return await phases(store, names) == [pb.POD_SUCCEEDED, pb.POD_RUNNING]

        await eventually(running_then_done, what="the short pod done, the long one running")
        starts = [
            fields
            for _, fields in await store._redis.xrange(store.keys.feed)
            if fields.get(b"h", b"")[:1] == POD_STARTED
        ]
        assert sorted(f[b"n"] for f in starts) == [b"long-0", b"short-0"]
        await agent.informer.wait_for_revision(await store.revision())
        assert agent.informer.passed_over == 2
        done = await store.get(pb.Pod, "short-0")
        assert done.status.started_ms and done.status.reason == "Completed"

        await store.delete(pb.Pod, "long-0")

        async def stopped() -> bool:
            return "long-0" not in agent.runner.runs and not agent.informer.knows("Pod", "long-0")

        await eventually(stopped, what="the deleted pod stopped")


@pytest.fixture
def shard_config(store_url: str, cluster_name: str) -> SchedulerConfig:
    return SchedulerConfig(
        name="shard-h",
        store_url=store_url,
        cluster=cluster_name,
        port=0,
        heartbeat_seconds=0.1,
        status_seconds=0.1,
        grace_seconds=0.5,
        insecure=True,
        log_level="warning",
    )


async def test_a_shard_takes_a_start_from_its_hint_and_still_sees_the_end(
    store: Store, shard_config: SchedulerConfig
) -> None:
    """A shard's record of a bound pod keeps its start (what the victim order and protection
    read): it takes it from the hint without reading the pod — unless the pod's protection
    window runs from its start (the record does not keep the window), then the pod is read.
    Its end and its deletion still reach the records."""
    await store.create(f.node("n1", cpu=8000))
    plain, windowed = await _bound(store, "plain-0"), await _bound(store, "windowed-0")
    async with ServiceHost(SchedulerService, shard_config) as host:
        shard = host.service
        assert isinstance(shard, SchedulerService)
        assert set(shard.cache.bound) == {"plain-0", "windowed-0"}
        windowed = await store.get(pb.Pod, "windowed-0")
        windowed.spec.protection_seconds = 60
        await store.update(windowed)  # now protected until it starts (read: not hinted)
        await store.commit_many([[_started(plain, 5_000)], [_started(windowed, 7_000)]])
        await shard.informer.wait_for_revision(await store.revision())
        assert shard.informer.passed_over == 1
        record = shard.cache.running("plain-0")
        assert record is not None and (record.started_ms, record.protected_until_ms) == (5_000, 0)
        record = shard.cache.running("windowed-0")
        assert record is not None
        assert (record.started_ms, record.protected_until_ms) == (7_000, 7_000 + 60_000)

        stored = await store.get(pb.Pod, "plain-0")
        stored.status.phase = pb.POD_SUCCEEDED
        await store.commit([Release(stored)])
        await store.delete(pb.Pod, "windowed-0")
        await shard.informer.wait_for_revision(await store.revision())
        assert shard.cache.bound == {}
