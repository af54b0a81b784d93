"""Informer: a local cache of some kinds kept current by list + watch, with event handlers.

It lists once (an atomic snapshot and its revision), then watches from that revision. A lost
connection resumes from the last applied revision with no gap and no duplicate; a trimmed feed
(ResourceVersionTooOldError) makes it relist and deliver the difference to the handlers as
ordinary add/update/delete events, so handlers never see a jump. Services act only after
``wait_synced()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Collection, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, cast, overload

import structlog
from google.protobuf.message import DecodeError, Message

from foundation.retry import Backoff, Retry
from store import kinds as kinds_mod
from store.client import Store, StoredListing, WatchEvent
from store.encoded import EncodedObjects
from store.errors import InvalidObjectError, ResourceVersionTooOldError, StoreUnavailableError
from store.kinds import S, StoredObject
from store.metrics import INFORMER_LAG

log = structlog.get_logger(__name__)

# Handlers and selectors get the kind's name and its object; ``isinstance`` narrows the object
# to the kind's message (a handler of one kind may take that message: see Handlers.kinds).
Selector = Callable[[str, StoredObject], bool]
AddHandler = Callable[[str, StoredObject], None]
UpdateHandler = Callable[[str, StoredObject, StoredObject], None]
DeleteHandler = Callable[[str, StoredObject], None]


# Kinds cached encoded (store.encoded): those a cluster holds by the ten thousand or more (a
# decoded pod or node is ~2.6 KiB, encoded ~0.2). Jobs are among them: a stream of one-pod jobs
# holds a job per pod, and a decoded one-pod job is 1.25 KiB against ~0.1 encoded (a million
# of them were 1.2 GiB in each process that watches jobs). Their reads decode a fresh message
# each time (0.3 µs for a one-pod job); the other kinds are few and read often, kept as
# messages.
ENCODED_KINDS = frozenset({"Pod", "Node", "Job"})

# Events applied between two turns of the event loop at most (handlers included): a read of the
# feed brings up to WATCH_BATCH_EVENTS, and a 100,000-pod job's pods created or bound come as
# a run of full reads; applied whole, a read held a dispatcher's loop (its handlers index every
# pod several ways) for most of a second. Each slice is also bounded in time.
APPLY_SLICE_SECONDS = 0.02
_APPLY_CHECK_EVERY = 32
# Events per read of the feed: decoded at once, before any is applied (a read of 4,096 pods
# took some 100 ms to decode on a busy machine, in one piece).
WATCH_BATCH_EVENTS = 1024

# Beyond block_ms, how late a watch read at the head of the feed may return before the cache
# counts as stale: a loaded process answers a little late without having fallen behind.
_CONFIRMATION_SLACK_SECONDS = 0.5

# Whether what a listing builds is frozen (``gc.freeze``) as it is built, rather than left to
# the collector: set for the whole process by ``freeze_what_listings_build`` (a service process
# does, services/runtime/gcpolicy.py, which freezes every full collection's survivors anyway).
_freezing = False


def freeze_what_listings_build(on: bool = True) -> None:
    """From now on, every informer's listing ends by freezing (``gc.freeze``) what it and its
    handlers built, a collection run first so nothing collectable from before is frozen.

    Built with the collector off (``Informer._replace``), a million pods' records were all in
    its youngest generation when it came back on: the first young collection walked every one
    of them (0.27 s at a restart over 1,000,000 pods), a full one soon after walked them all
    again (0.34 s), before the service answered its first health check. Frozen, no collection
    walks them; the price is gcpolicy's: a cycle the build made and dropped is never freed
    (the handlers build records, not cycles). Tests that run services in-process leave it off,
    their runner's collector as it is."""
    global _freezing
    _freezing = on


@dataclass(slots=True)
class Handlers:
    """Callbacks run in the informer's task; keep them quick and non-blocking. The first
    argument is the kind. ``kinds`` limits them to events of those kinds (None: every kind the
    informer watches): an event is handed only to the handlers that want it, which matters
    when a process has many and most care about one kind."""

    on_add: AddHandler | None = None
    on_update: UpdateHandler | None = None
    on_delete: DeleteHandler | None = None
    kinds: frozenset[str] | None = None
    # Called with the kind once a listing has handed every object of it to the handlers as
    # adds (nothing of the kind known before; ``Informer.delivering_listing`` is true while
    # it does): a holder that builds some state from the whole listing at once rather than
    # per object (the dispatcher's pod index groups the claims by job).
    on_listed: Callable[[str], None] | None = None
    # Whether a listing (as ``on_listed`` means it) hands these handlers the objects ``hold``
    # refuses. False: their ``on_listed`` takes what it needs of those from their holder's
    # records (the dispatcher's job retry, finished-job collector and tenant counts read the
    # pod index's records, not a pod a listed bound pod: ~1 µs a pod of a restart).
    refused_at_listing: bool = True
    # What a listing hands those objects to instead of ``on_add`` (with ``refused_at_listing``):
    # a holder that needs few of them picks those out in one read (the dispatcher's pod index
    # keeps a record of a listed pod on a node only if it holds no claim: ~0.5 µs a pod, of a
    # restart over a million, spent on the others by ``on_add``'s general tests).
    on_listed_refused: AddHandler | None = None

    def wants(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds

    @classmethod
    def of(
        cls,
        kind: type[S],
        *,
        on_add: Callable[[str, S], None] | None = None,
        on_update: Callable[[str, S, S], None] | None = None,
        on_delete: Callable[[str, S], None] | None = None,
    ) -> Handlers:
        """Handlers of one kind, named by its message class and typed by it."""
        # ``kinds`` is this kind alone, so they are handed this kind's messages only.
        return cls(
            cast("AddHandler | None", on_add),
            cast("UpdateHandler | None", on_update),
            cast("DeleteHandler | None", on_delete),
            frozenset({kinds_mod.kind_for_class(kind).name}),
        )


class Informer:
    def __init__(
        self,
        store: Store,
        kinds: Sequence[str],
        *,
        resync_seconds: float = 0.0,
        retry_max_seconds: float = 1.0,
        block_ms: int = 1000,
        selector: Selector | None = None,
        hold: Selector | None = None,
        held_elsewhere: Callable[[str], Collection[str]] | None = None,
        reads: Callable[[str, bytes], bool] | None = None,
        hinted: Callable[[str, str, bytes], bool] | None = None,
        recall: Callable[[str, str], StoredObject] | None = None,
        take_listed: Mapping[str, Callable[[Any], bool]] | None = None,
    ) -> None:
        """``selector(kind, obj)`` narrows the cache to the objects it accepts, like a
        Kubernetes field selector: others are neither cached nor delivered, and an object that
        stops matching is delivered as deleted (a node agent caches only its nodes' pods).

        ``hold(kind, obj)`` narrows what the cache keeps, not what it delivers: an object it
        refuses is delivered like any other but not kept at all (``get`` gives None), for a
        holder that keeps its own record of such objects — a shard keeps the bytes of pods
        without a node only; its bound pods are its cache's records. ``held_elsewhere(kind)``
        (given with ``hold``) names the refused objects of ``kind`` that still exist, as that
        holder knows them (the shard's bound pods' names; nothing for another kind): the informer reads it to deliver their updates
        (with a message carrying only the name as the object before) and deletions (with the
        object's last state from the feed, or, when a relist finds one gone, its name alone),
        and ``knows`` answers from it. ``recall(kind, name)`` (given with ``held_elsewhere``)
        is what handlers get instead of the name alone: the holder's outline of the object as
        it was, with the fields its handlers read of an object before (the dispatcher keeps a
        record of each bound pod, not its bytes). The holder must add a name on the add or update
        delivering an object ``hold`` refuses, and drop it on its deletion. Without
        ``held_elsewhere`` the informer knows nothing of refused objects: one that comes to be
        held is delivered as an add, and the deletion of one refused is not delivered (for a
        process with no handlers of the kind: the rescheduler keeps GPU nodes' pods only).

        ``reads(kind, name)`` picks, by name and before decoding, the changes of the feed the
        informer takes at all (``ChangeFeed.watch``'s ``keep``); one it refuses is as if it had
        never happened, and counted in ``unread``. It is asked about each change in feed order,
        before any change of the same read is applied; listings are not filtered. For a holder
        whose ``hold`` would refuse the object anyway and who takes no events of its kind (the
        rescheduler reads no pod changes while no node has GPUs): it must not refuse a change
        of an object cached, or the cache would keep its old state.

        ``hinted(kind, name, hint)`` is asked about a change whose writer said what it was
        (the feed entry's hint, ``store.ops``: ``R<started_ms>``, a pod started) when the
        informer may pass over it undecoded: the cache keeps no bytes of the object (none kept
        by ``hold``, or ``selector`` refused it, or it is unknown) and no earlier change of the
        same read names it — so the informer's state of it is the version the writer changed,
        the one the hint describes the change from. False: passed over, counted in
        ``passed_over`` (with ``reads``, asked first, as any change); True: read as any other.
        For a holder whose ``selector``, ``hold``, records and handlers make nothing of such a
        change, or who takes what it needs from the hint itself (a shard's record of a bound
        pod takes its start time, then answers False): the Binder, a node agent (its own
        writes' echo, and other agents' pods). Without it every change is read.

        ``retry_max_seconds`` caps the wait between tries to reach a lost store (doubling from
        0.05 s): a store failover takes 3–5 s, and with a cap of 5 s the service's view came
        back up to 3 s after the store did; a try a second costs one connection attempt.

        ``take_listed`` (given with ``held_elsewhere``), per kind, is offered every object of a
        first listing of that kind (nothing of it known before, held here or elsewhere; an
        informer without ``selector``, of a kind it keeps encoded) before
        ``hold`` is asked: True means the holder took it — an object ``hold`` refuses, now in
        its records, as its ``on_add`` would have put it — and no handler is handed it; False,
        that it did not (the informer goes on as without it). For a holder whose ``on_add`` is
        the kind's only handler: a shard's cache takes each bound pod of its (re)start's
        listing in one step, without ``hold`` and the handler each reading the pod again. The
        object it is offered is decoded from the stored bytes *without* its resource version (0:
        the taker keeps none; an object it does not take has it set before anyone else sees
        it)."""
        if held_elsewhere is not None and hold is None:
            raise ValueError("informer: held_elsewhere names what hold refuses; give hold too")
        if recall is not None and held_elsewhere is None:
            raise ValueError("informer: recall outlines what is held elsewhere; give it too")
        if take_listed is not None and held_elsewhere is None:
            raise ValueError("informer: take_listed takes what is held elsewhere; give it too")
        self._take_listed = dict(take_listed or {})
        self._store = store
        self._selector = selector
        self._hold = hold
        self._elsewhere = held_elsewhere
        self._reads = reads
        # Changes of the feed ``reads`` refused: never decoded.
        self.unread = 0
        self._hinted = hinted
        # Hinted changes passed over (``hinted``): never decoded.
        self.passed_over = 0
        # Changes of the feed read (decoded), counted as their reads are applied.
        self.changes_read = 0
        # (kind, name) of each change taken so far in the read being parsed, when ``hinted``
        # is given: a hinted change of one of them is read, not asked about.
        self._taken_now: set[tuple[str, bytes]] = set()
        self._recall = recall or _name_alone
        self.kinds = list(kinds)
        self.cache: dict[str, MutableMapping[str, StoredObject]] = {
            k: self._empty(k) for k in self.kinds
        }
        self.revision = 0
        self.relists = 0
        # When (time.monotonic) the cache last held everything the store had, and whether it
        # still does (the last read reached the end of the feed; we wait there for more).
        self.current_at = 0.0
        self._at_head = False
        # The callbacks of each (callback name, kind), in registration order.
        self._routes: dict[tuple[str, str], list[Callable[..., None]]] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._resync_seconds = resync_seconds
        self._retry_max = retry_max_seconds
        self._block_ms = block_ms
        # True while a listing hands its objects to the handlers as adds (``Handlers.on_listed``).
        self.delivering_listing = False
        # The revision of the read being applied (ahead of ``revision`` until it is applied).
        self._applying_to = 0
        # Waiters for wait_for_revision(), woken as batches apply.
        self._progress = asyncio.Condition()

    @staticmethod
    def _empty(kind: str) -> MutableMapping[str, StoredObject]:
        if kind in ENCODED_KINDS:
            return EncodedObjects(kinds_mod.kind_named(kind).message)
        return {}

    def add_handlers(self, handlers: Handlers, *, replay: bool = True) -> None:
        """Register handlers; objects already cached are delivered to them as adds, unless
        ``replay`` is False: events from now on only, for a caller that built its state from
        the cache another way (without decoding every object again). Registered before
        ``start()``, handlers get every listed object once, from the listing itself."""
        for kind in self.kinds:
            if handlers.wants(kind):
                for callback in ("on_add", "on_update", "on_delete", "on_listed"):
                    fn = getattr(handlers, callback)
                    if fn is not None:
                        self._routes.setdefault((callback, kind), []).append(fn)
                if handlers.on_add is not None and handlers.refused_at_listing:
                    self._routes.setdefault(("on_add_refused", kind), []).append(
                        handlers.on_listed_refused or handlers.on_add
                    )
        if handlers.on_add and replay:
            for kind, objs in self.cache.items():
                if handlers.wants(kind):
                    for obj in objs.values():
                        handlers.on_add(kind, obj)

    # Reads name the kind by its message class, typed by it (``get(pb.Pod, name)`` is a
    # ``pb.Pod``), or by its name (``get("Pod", name)``: a kind chosen at run time, untyped).

    def objects(self, cls: type[S]) -> Mapping[str, S]:
        """The cache of a kind, by name, typed by its message class. The informer replaces the
        mapping when it relists: read it again rather than keep it."""
        # The cache of a kind holds that kind's messages only (store.kinds decodes them).
        return cast("Mapping[str, S]", self.cache[kinds_mod.kind_for_class(cls).name])

    @overload
    def get(self, kind: type[S], name: str) -> S | None: ...

    @overload
    def get(self, kind: str, name: str) -> Message | None: ...

    def get(self, kind: str | type[Message], name: str) -> Any:
        return self._cache_of(kind).get(name)

    @overload
    def list(self, kind: type[S]) -> list[S]: ...

    @overload
    def list(self, kind: str) -> list[Message]: ...

    def list(self, kind: str | type[Message]) -> list[Any]:
        return list(self._cache_of(kind).values())

    @overload
    def each(self, kind: type[S]) -> Iterator[S]: ...

    @overload
    def each(self, kind: str) -> Iterator[Message]: ...

    def each(self, kind: str | type[Message]) -> Iterator[Any]:
        """The cached objects one at a time: a scan that keeps few of them does not hold them
        all decoded at once (a million pods are 2.6 GiB decoded). Do not await while iterating:
        the cache changes between event-loop steps."""
        return iter(self._cache_of(kind).values())

    def _cache_of(self, kind: str | type[Message]) -> MutableMapping[str, StoredObject]:
        return self.cache[kind if isinstance(kind, str) else kinds_mod.kind_for_class(kind).name]

    def encoded(self, kind: str, name: str) -> bytes | None:
        """A cached object's bytes, not decoded (None: not cached, or a kind not held encoded):
        a holder that keeps a copy of an object shares these rather than encoding its own."""
        objs = self.cache[kind]
        return objs.get_encoded(name) if isinstance(objs, EncodedObjects) else None

    def has(self, kind: str, name: str) -> bool:
        """Whether the object is cached, without reading (decoding) it."""
        return name in self.cache[kind]

    def knows(self, kind: str, name: str) -> bool:
        """Whether the object exists as far as this view goes: cached, or refused by ``hold``
        and held elsewhere."""
        return name in self.cache[kind] or self._held_elsewhere(kind, name)

    def _held_elsewhere(self, kind: str, name: str) -> bool:
        return self._elsewhere is not None and name in self._elsewhere(kind)

    def names(self, kind: str) -> tuple[str, ...]:
        return tuple(self.cache[kind])

    def count(self, kind: str) -> int:
        return len(self.cache[kind])

    def staleness(self) -> float:
        """0 while the cache keeps up with the store; otherwise the seconds since it last held
        everything the store had (infinite before the first sync). Anything judged by age from
        this cache, heartbeats above all, is only as current as this: a watcher behind sees
        every heartbeat late.

        Keeping up is proven, not assumed: at the head of the feed a watch read returns at least
        every ``block_ms``, each confirming the cache current. So a cache whose last
        confirmation is older than that is stale too, even at the head — its process's event
        loop was busy with other work (or the store was), and heartbeats written meanwhile are
        not in it yet."""
        if not self.current_at:
            return float("inf")
        since = time.monotonic() - self.current_at
        if self._at_head:
            return max(0.0, since - self._block_ms / 1000 - _CONFIRMATION_SLACK_SECONDS)
        return since

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._synced.wait(), timeout)

    async def wait_for_revision(self, revision: int, timeout: float | None = None) -> None:
        """Wait until the cache reflects every change up to ``revision``."""

        async def reached() -> None:
            async with self._progress:
                await self._progress.wait_for(lambda: self.revision >= revision)

        await asyncio.wait_for(reached(), timeout)

    async def read_applied(self) -> None:
        """Wait until the read of the feed being applied now, if any, is applied whole. Its
        events are applied in slices with other tasks run between (``_apply_all``); one that
        must not act on part of a commit — the dispatcher's round, which would send a unit
        with part of its pods — waits for this first, as it did when a read was applied in
        one piece."""
        if self._applying_to > self.revision:
            await self.wait_for_revision(self._applying_to)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"informer{self.kinds}")
            INFORMER_LAG.track(self)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        INFORMER_LAG.forget(self)
        # redis-py's read timeout can swallow a cancellation that lands during a blocking
        # XREAD, so flag the loop too and cancel until the task has really ended.
        self._stopping = True
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.05)
        self._stopping = False
        with contextlib.suppress(asyncio.CancelledError):
            task.result()

    async def _run(self) -> None:
        need_list = not self._synced.is_set()  # a restarted informer resumes where it stopped
        retry = Retry(Backoff(0.05, cap=self._retry_max))
        last_resync = time.monotonic()
        while not self._stopping:
            try:
                if need_list:
                    listed_at = time.monotonic()
                    listing = await self._store.list_stored(self.kinds)
                    fetched_at = time.monotonic()
                    self._replace(listing)
                    self.current_at, self._at_head = listed_at, True
                    # Where a (re)start's seconds go: the store's reply, then the cache and
                    # every handler's state built from it (bench/README.md, restarts).
                    log.info(
                        "informer listed",
                        kinds=self.kinds,
                        objects=sum(len(c) for c in self.cache.values()),
                        revision=self.revision,
                        fetch_s=round(fetched_at - listed_at, 3),
                        build_s=round(time.monotonic() - fetched_at, 3),
                    )
                    need_list = False
                    self._synced.set()
                    await self._notify()
                # When the read that brings the next batch was sent: what it brings is current
                # as of then at least. Not when the batch is applied — a reply that waited in the
                # socket while the event loop was busy elsewhere is as old as its request, and
                # judging heartbeats by it declared live shards dead.
                asked_at = time.monotonic()
                self._taken_now.clear()
                keep: Callable[[str, bytes], bool] | None = None
                if self._hinted is not None:
                    keep = self._taken
                elif self._reads is not None:
                    keep = self._read_or_count
                async for batch in self._store.watch(
                    self.revision,
                    self.kinds,
                    block_ms=self._block_ms,
                    count=WATCH_BATCH_EVENTS,
                    keep=keep,
                    hinted=None if self._hinted is None else self._hinted_or_taken,
                ):
                    # This read is parsed whole (the next one is parsed only once this one
                    # is applied): what it took matters to no later hinted change.
                    self._taken_now.clear()
                    self.changes_read += len(batch.events)
                    if self._stopping:
                        return
                    self._applying_to = batch.revision
                    await self._apply_all(batch.events)
                    self.revision = batch.revision
                    self._at_head = batch.caught_up
                    if batch.caught_up:
                        self.current_at = asked_at
                    await self._notify()
                    # A long feed (a 100,000-pod job being stored) must not keep this task
                    # applying batch after batch: heartbeats and streams get a turn between.
                    await asyncio.sleep(0)
                    retry.reset()
                    asked_at = time.monotonic()  # the generator reads the next batch now
                    if self._resync_seconds and (
                        time.monotonic() - last_resync >= self._resync_seconds
                    ):
                        last_resync = time.monotonic()
                        self._resync()
            except ResourceVersionTooOldError as exc:
                self.relists += 1
                log.info("informer relisting", kinds=self.kinds, reason=str(exc))
                need_list = True
            except StoreUnavailableError as exc:
                self._at_head = False  # cut off from the store: the view ages from now on
                delay = retry.next_delay()
                log.warning("informer lost the store; retrying", error=str(exc), delay_s=delay)
                await asyncio.sleep(delay)

    async def _notify(self) -> None:
        async with self._progress:
            self._progress.notify_all()

    def _replace(self, listing: StoredListing) -> None:
        """Swap in a fresh listing and tell handlers what changed since the old cache.

        Two passes, so memory stays flat: the listing is decoded one object at a time into the
        new cache (a million pods decoded at once were 2.6 GiB); then, with the cache whole,
        handlers get the difference, each object read back from it.

        Without the cyclic collector: the handlers build a long-lived record or two per object
        in one go, and the collector would walk them again and again as they pile up (a
        shard's build of 100,000 pods: 460 collections, 6 % of its CPU). A service process
        freezes them as they are built (``freeze_what_listings_build``)."""
        collecting = gc.isenabled()
        freezing = _freezing
        if freezing:
            gc.collect()  # what is garbage now is not frozen with the build
        gc.disable()
        try:
            self._swap_in(listing)
        finally:
            if freezing:
                gc.freeze()  # the records built: out of every collection's sight
            if collecting:
                gc.enable()

    def _swap_in(self, listing: StoredListing) -> None:
        fresh: dict[str, MutableMapping[str, StoredObject]] = {}
        # A first listing of a kind some of whose objects ``hold`` refuses: its bytes are put
        # in the cache as they are handed over, those it keeps (and ``selector`` takes) only
        # (put all and dropped, a million pods of which a few are kept cost a dict of a million
        # and its deletions; put through the selector, each was encoded again and decoded
        # twice: a node agent's start, ~3 µs a pod).
        as_listed: dict[str, Iterator[tuple[str, bytes]]] = {}
        # The same for a kind whose holder takes what it holds (``take_listed``): the bytes as
        # stored, each with its resource version.
        versioned: dict[str, tuple[dict[bytes, bytes], dict[bytes, bytes]]] = {}
        for kind in self.kinds:
            new = fresh[kind] = self._empty(kind)
            if (
                isinstance(new, EncodedObjects)
                and self._hold is not None
                and not self.cache[kind]
                and not (self._elsewhere is not None and self._elsewhere(kind))
            ):
                if kind in self._take_listed:
                    versioned[kind] = listing.stored_of(kind)
                else:
                    as_listed[kind] = listing.encoded(kind)
                continue
            if isinstance(new, EncodedObjects) and self._selector is None:
                # Kept as listed, the resource version appended: not decoded and encoded again
                # (two thirds of a listing's own time); decoded once below, for the handlers.
                new.put_many_encoded(listing.encoded(kind))
                continue
            for obj in listing.objects(kind):
                if self._selector is None or self._selector(kind, obj):
                    new[obj.metadata.name] = obj
        for kind in self.kinds:
            old, new = self.cache[kind], fresh[kind]
            self.cache[kind] = new
            elsewhere = self._elsewhere(kind) if self._elsewhere is not None else ()
            listed = as_listed.pop(kind, None)
            stored = versioned.pop(kind, None)
            if stored is not None and isinstance(new, EncodedObjects):
                if old or elsewhere:  # (not so: the general path below)
                    new.put_many_encoded(_with_versions(*stored))
                    stored = None
            if listed is not None and (old or elsewhere) and isinstance(new, EncodedObjects):
                # (not so: the general path below)
                new.put_many_encoded(self._selected(kind, new.message_class, listed))
                listed = None
            if not old and not elsewhere:
                self.delivering_listing = True
                try:
                    if stored is not None and isinstance(new, EncodedObjects):
                        self._deliver_taken(kind, new, listing, *stored)
                    else:
                        self._deliver_listed(kind, new, listing, listed)
                finally:
                    self.delivering_listing = False
                for fn in self._routes.get(("on_listed", kind), ()):
                    try:
                        fn(kind)
                    except Exception:
                        log.exception("informer handler failed", handler="on_listed", kind=kind)
                continue
            # Known before and not listed now: deleted meanwhile (read before any handler runs:
            # the holder's names change as they do).
            gone = [n for n in old if n not in new]
            gone_elsewhere = [n for n in elsewhere if n not in new and n not in old]
            dropped: list[str] = []  # undecodable, or refused by hold
            for name in new:
                try:
                    obj = new[name]
                except DecodeError as exc:
                    listing.errors.append(
                        (kind, name, InvalidObjectError(f"bytes are not a valid {kind}: {exc}"))
                    )
                    dropped.append(name)
                    continue
                if not self._holds(kind, obj):
                    dropped.append(name)
                before = old.get(name)
                if before is None and name in elsewhere:
                    before = self._recall(kind, name)  # its earlier version is not kept here
                    self._emit("on_update", kind, before, obj)
                elif before is None:
                    self._emit("on_add", kind, obj)
                elif before.metadata.resource_version != obj.metadata.resource_version:
                    self._emit("on_update", kind, before, obj)
            self._drop(kind, new, dropped)
            for name in gone:
                self._emit("on_delete", kind, old[name])
            for name in gone_elsewhere:
                self._emit("on_delete", kind, self._recall(kind, name))
        for kind, name, error in listing.errors:
            log.error(
                "undecodable object in the store; skipped", kind=kind, name=name, error=str(error)
            )
        self.revision = listing.revision

    def _selected(
        self, kind: str, message: type[Message], listed: Iterator[tuple[str, bytes]]
    ) -> Iterator[tuple[str, bytes]]:
        """The listed bytes ``selector`` takes (all without one); undecodable ones too, for
        the caller's pass to report."""
        selector = self._selector
        for name, data in listed:
            if selector is not None:
                try:
                    if not selector(kind, cast("StoredObject", message.FromString(data))):
                        continue
                except DecodeError:
                    pass
            yield name, data

    def _deliver_listed(
        self,
        kind: str,
        new: MutableMapping[str, StoredObject],
        listing: StoredListing,
        as_listed: Iterator[tuple[str, bytes]] | None = None,
    ) -> None:
        """The first listing of ``kind`` (nothing cached before: every object an add), handed
        to its add handlers. What ``_swap_in``'s general loop does, without what the first
        listing needs none of — a look-up in the empty old cache and the handler routes looked
        up again per object — as every object a (re)starting service lists comes through here
        (at 1,000,000 pods, each ~0.1 µs here is 0.1 s of its restart). ``as_listed``: the
        kind's bytes as listed, not yet in ``new``: each kept there as it is handed over, if
        ``hold`` keeps it (and ``selector`` takes it: one it does not is skipped)."""
        handlers = self._routes.get(("on_add", kind), ())
        # What an object ``hold`` refuses is handed to (``Handlers.refused_at_listing``).
        if self._elsewhere is not None:
            refused = self._routes.get(("on_add_refused", kind), ())
        else:
            refused = handlers  # the informer knows nothing of them otherwise: everyone's
        dropped: list[str] = []  # undecodable, or refused by hold (once all are delivered)
        hold = self._hold
        if isinstance(new, EncodedObjects):
            decode = new.message_class.FromString
            put = new.put_encoded if as_listed is not None else None
            # The listing's own objects are not selected yet (the cache's were, as they came).
            selector = self._selector if as_listed is not None else None
            for name, data in new.encoded_items() if as_listed is None else as_listed:
                try:
                    obj = decode(data)
                except DecodeError as exc:
                    listing.errors.append(
                        (kind, name, InvalidObjectError(f"bytes are not a valid {kind}: {exc}"))
                    )
                    if put is None:
                        dropped.append(name)
                    continue
                if selector is not None and not selector(kind, obj):
                    continue
                to = handlers
                if hold is not None and not hold(kind, obj):
                    to = refused
                    if put is None:
                        dropped.append(name)
                elif put is not None:
                    put(name, data)
                for fn in to:
                    try:
                        fn(kind, obj)
                    except Exception:
                        log.exception("informer handler failed", handler="on_add", kind=kind)
            self._drop(kind, new, dropped)
            return
        for obj in new.values():
            to = handlers
            if hold is not None and not hold(kind, obj):
                to = refused
                dropped.append(obj.metadata.name)
            for fn in to:
                try:
                    fn(kind, obj)
                except Exception:
                    log.exception("informer handler failed", handler="on_add", kind=kind)
        self._drop(kind, new, dropped)

    def _deliver_taken(
        self,
        kind: str,
        new: EncodedObjects[Any],
        listing: StoredListing,
        datas: dict[bytes, bytes],
        versions: dict[bytes, bytes],
    ) -> None:
        """``_deliver_listed`` of a kind its holder takes (``take_listed``): each object offered
        to the taker first; what it does not take goes on as there, its bytes kept if ``hold``
        keeps it. Each is decoded as stored, and its resource version read and set on it only
        if the taker does not take it: a version appended to the bytes of every object listed
        cost a bytes copy each, and a shard keeps none of its bound pods' bytes nor versions."""
        take = self._take_listed[kind]
        handlers = self._routes.get(("on_add", kind), ())
        refused = self._routes.get(("on_add_refused", kind), ())
        hold = self._hold
        decode = new.message_class.FromString
        put = new.put_encoded
        with_rv = kinds_mod.with_resource_version
        version_of = versions.get
        for raw_name, data in datas.items():
            version = version_of(raw_name)
            if version is None:  # (as ``StoredListing.encoded``: no version, not listed)
                continue
            try:
                obj = decode(data)
            except DecodeError as exc:
                name = raw_name.decode(errors="replace")
                listing.errors.append(
                    (kind, name, InvalidObjectError(f"bytes are not a valid {kind}: {exc}"))
                )
                continue
            try:
                if take(obj):
                    continue
            except Exception:  # handed on as if not taken: its handlers may hold it yet
                log.exception("informer handler failed", handler="take_listed", kind=kind)
            rv = int(version)
            obj.metadata.resource_version = rv
            to = handlers
            if hold is not None and not hold(kind, obj):
                to = refused
            else:
                put(raw_name.decode(), with_rv(data, rv))
            for fn in to:
                try:
                    fn(kind, obj)
                except Exception:
                    log.exception("informer handler failed", handler="on_add", kind=kind)

    def _drop(
        self, kind: str, new: MutableMapping[str, StoredObject], names: Sequence[str]
    ) -> None:
        """Take ``names`` out of a fresh listing's cache of ``kind``. A dict never shrinks: one
        that listed a million pods and keeps a few (``hold``) is copied to its size (its table
        was ~40 bytes a pod listed)."""
        for name in names:
            del new[name]
        if len(names) > len(new):
            self.cache[kind] = new.copy() if isinstance(new, EncodedObjects) else dict(new)

    async def _apply_all(self, events: Sequence[WatchEvent]) -> None:
        """Apply a read's events in order, handing the loop to others every
        ``APPLY_SLICE_SECONDS``. The revision moves only once all are applied, so whoever
        waits for one (``wait_for_revision``) finds everything up to it in the cache; a
        reader between two slices sees some of the read's changes, as it would between two
        reads."""
        until = time.monotonic() + APPLY_SLICE_SECONDS
        for i, event in enumerate(events, 1):
            self._apply(event)
            if i % _APPLY_CHECK_EVERY == 0 and time.monotonic() >= until:
                await asyncio.sleep(0)
                until = time.monotonic() + APPLY_SLICE_SECONDS

    def _apply(self, event: WatchEvent) -> None:
        if event.obj is None:
            log.error(
                "undecodable object in the change feed; skipped",
                kind=event.kind,
                name=event.name,
                revision=event.revision,
                error=str(event.error),
            )
            return
        kind, name, obj = event.kind, event.name, event.obj
        objs = self.cache[kind]
        if event.type == "DELETED" or (
            self._selector is not None and not self._selector(kind, obj)
        ):
            if name in objs:
                del objs[name]
                self._emit("on_delete", kind, obj)
            elif self._held_elsewhere(kind, name):
                self._emit("on_delete", kind, obj)
            return
        held = self._hold is None or self._hold(kind, obj)
        if ("on_update", kind) not in self._routes:
            # Nobody takes the object as it was (the rescheduler takes no events at all): not
            # decoded from the cache (5 % of the rescheduler's CPU under a stream of pods).
            known = name in objs or self._held_elsewhere(kind, name)
            if held:
                objs[name] = obj
            elif name in objs:
                del objs[name]  # not ``pop``: an encoded cache's decodes what it returns
            if not known:
                self._emit("on_add", kind, obj)
            return
        before = objs.get(name)
        if before is None and self._held_elsewhere(kind, name):
            before = self._recall(kind, name)
        if held:
            objs[name] = obj
        elif before is not None and name in objs:
            # Not ``pop``: an encoded cache's pop decodes what it returns (a pod just bound,
            # in every process that keeps pending pods only).
            del objs[name]
        if before is None:
            self._emit("on_add", kind, obj)
        else:
            self._emit("on_update", kind, before, obj)

    def _read_or_count(self, kind: str, name: bytes) -> bool:
        assert self._reads is not None
        if self._reads(kind, name):
            return True
        self.unread += 1
        return False

    def _taken(self, kind: str, name: bytes) -> bool:
        """``keep`` with ``hinted`` given: ``reads``' answer, each change taken noted."""
        if self._reads is not None and not self._reads(kind, name):
            self.unread += 1
            return False
        self._taken_now.add((kind, name))
        return True

    def _hinted_or_taken(self, kind: str, name: bytes, hint: bytes) -> bool:
        """Whether a hinted change is read (see ``hinted``)."""
        if self._reads is not None and not self._reads(kind, name):
            self.unread += 1
            return False
        key = (kind, name)
        if key not in self._taken_now:
            assert self._hinted is not None
            text = name.decode(errors="replace")
            # ``in`` an encoded cache is True only where its bytes are kept.
            if text not in self.cache[kind] and not self._hinted(kind, text, hint):
                self.passed_over += 1
                return False
        self._taken_now.add(key)
        return True

    def _holds(self, kind: str, obj: StoredObject) -> bool:
        """Whether the cache keeps ``obj`` (see ``hold``)."""
        return self._hold is None or self._hold(kind, obj)

    def _resync(self) -> None:
        # Objects held elsewhere are not resynced: their holder keeps its own record.
        for kind, objs in self.cache.items():
            for obj in list(objs.values()):
                self._emit("on_update", kind, obj, obj)

    def _emit(self, callback: str, kind: str, *objs: StoredObject) -> None:
        # A failing handler must not stop the informer or starve the other handlers.
        for fn in self._routes.get((callback, kind), ()):
            try:
                fn(kind, *objs)
            except Exception:
                log.exception("informer handler failed", handler=callback, kind=kind)


def _name_alone(kind: str, name: str) -> StoredObject:
    """An object known by name alone (held elsewhere), as handlers get it: its kind's message
    with that name."""
    message: Any = kinds_mod.kind_named(kind).message()
    message.metadata.name = name
    return cast("StoredObject", message)


def _with_versions(
    datas: dict[bytes, bytes], versions: dict[bytes, bytes]
) -> Iterator[tuple[str, bytes]]:
    """``StoredListing.stored_of``'s objects as ``StoredListing.encoded`` gives them."""
    with_rv = kinds_mod.with_resource_version
    for raw_name, data in datas.items():
        version = versions.get(raw_name)
        if version is not None:
            yield raw_name.decode(), with_rv(data, int(version))
