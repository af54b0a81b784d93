"""Events: what happened to which object, in the manner of `kubectl get events`.

The service that knows records them — the Binder (preemptions, evictions, bind rejections), the
rescheduler (movements), the dispatcher (lost scheduler shards) — through an ``EventRecorder``:
``record`` only appends to a buffer, and a background task writes the buffer in one pipelined
store round trip per interval, so no scheduling path waits for an event. Events are stored
objects (kind ``Event``) with a bounded life: the dispatcher's ``EventReaper`` deletes those
older than the retention, and the oldest beyond a count.

An event is a record, not state: a crash may lose the last interval's events, never a binding.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

import structlog

from protos.godel.v1 import objects_pb2 as pb
from store import Store, StoreError
from store.client import Delete, Op, new_uid

log = structlog.get_logger(__name__)

NORMAL = "Normal"
WARNING = "Warning"

# Reasons beside the eviction reasons of services.eviction (Preempted, Rescheduled, Drained...).
BIND_REJECTED = "BindRejected"
SHARD_LOST = "ShardLost"
MOVEMENT_PLANNED = "MovementPlanned"
MOVEMENT_DONE = "MovementDone"
MOVEMENT_STOPPED = "MovementStopped"
# A reservation's owner pod bound on its node (the Binder), or it was released unused (expired,
# its owner job deleted, its node lost: the dispatcher's reservation controller).
RESERVATION_HELD = "ReservationHeld"
RESERVATION_CONSUMED = "ReservationConsumed"
RESERVATION_RELEASED = "ReservationReleased"

# Buffered events beyond this are dropped (and counted in the log): a flood of rejections must
# not grow a service's memory without bound while the store is away.
MAX_BUFFERED = 1000
FLUSH_SECONDS = 1.0
DEFAULT_RETENTION_SECONDS = 3600.0
DEFAULT_MAX_EVENTS = 20000


def ref(kind: str, obj: object | None = None, *, name: str = "") -> pb.ObjectReference:
    """A reference to a stored object (its name and uid), or to a name alone."""
    meta = getattr(obj, "metadata", None)
    if meta is None:
        return pb.ObjectReference(kind=kind, name=name)
    return pb.ObjectReference(kind=kind, name=meta.name, uid=meta.uid)


def make_event(
    regarding: pb.ObjectReference,
    reason: str,
    message: str,
    *,
    source: str,
    type_: str = NORMAL,
    related: pb.ObjectReference | None = None,
    now_ms: int | None = None,
    owner: str = "",
) -> pb.Event:
    """An event named ``<object>.<random>`` (unique without a round trip, as Kubernetes names
    them). ``owner``: the tenant whose pod or job it regards (that object's ``metadata.owner``),
    the only tenant that may read it (``services.tenancy``); empty for the cluster's own
    events (nodes, movements, shards), which only the admin reads."""
    when = now_ms if now_ms is not None else int(time.time() * 1000)
    event = pb.Event(
        metadata=pb.ObjectMeta(name=f"{regarding.name}.{new_uid()[:16]}", owner=owner),
        regarding=regarding,
        reason=reason,
        message=message,
        type=type_,
        source=source,
        event_time_ms=when,
    )
    if related is not None:
        event.related.CopyFrom(related)
    return event


class EventRecorder:
    """Buffers events and writes them in batches (``run`` is the flushing task)."""

    def __init__(self, store: Store, source: str, *, flush_seconds: float = FLUSH_SECONDS) -> None:
        self.store = store
        self.source = source
        self.flush_seconds = flush_seconds
        self._buffer: list[pb.Event] = []
        self._dropped = 0
        self._wake = asyncio.Event()

    def record(
        self,
        regarding: pb.ObjectReference,
        reason: str,
        message: str,
        *,
        type_: str = NORMAL,
        related: pb.ObjectReference | None = None,
        owner: str = "",
    ) -> None:
        """Buffer an event; ``owner`` as ``make_event``'s."""
        if len(self._buffer) >= MAX_BUFFERED:
            self._dropped += 1
            return
        self._buffer.append(
            make_event(
                regarding,
                reason,
                message,
                source=self.source,
                type_=type_,
                related=related,
                owner=owner,
            )
        )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_seconds)
            await self.flush()

    async def flush(self) -> None:
        """Write what is buffered, in one pipelined round trip."""
        if self._dropped:
            log.warning("events dropped: the buffer was full", dropped=self._dropped)
            self._dropped = 0
        batch, self._buffer = self._buffer, []
        if not batch:
            return
        try:
            outcomes = await self.store.create_many(batch)
        except StoreError as exc:
            log.warning("events not recorded", events=len(batch), error=str(exc))
            return
        failed = [o for o in outcomes if isinstance(o, StoreError)]
        if failed:
            log.warning("events not recorded", events=len(failed), error=str(failed[0]))


@dataclass(frozen=True, slots=True)
class Retention:
    seconds: float = DEFAULT_RETENTION_SECONDS
    max_events: int = DEFAULT_MAX_EVENTS


def expired(events: Iterable[pb.Event], retention: Retention, now_ms: int) -> list[pb.Event]:
    """The events to delete: older than the retention, then the oldest beyond the count."""
    by_age = sorted(events, key=lambda e: (e.event_time_ms, e.metadata.name))
    cutoff = now_ms - int(retention.seconds * 1000)
    old = [e for e in by_age if e.event_time_ms < cutoff]
    kept = by_age[len(old) :]
    excess = max(0, len(kept) - retention.max_events)
    return old + kept[:excess]


class EventReaper:
    """Deletes expired events (the dispatcher runs it): one commit of deletions per pass."""

    def __init__(
        self, store: Store, retention: Retention, *, interval_seconds: float = 30.0
    ) -> None:
        self.store = store
        self.retention = retention
        self.interval = interval_seconds

    async def run(self) -> None:
        while True:
            try:
                await self.reap()
            except StoreError as exc:
                log.warning("reaping events failed", error=str(exc))
            await asyncio.sleep(self.interval)

    async def reap(self) -> int:
        events, _ = await self.store.list_all(pb.Event)
        doomed = expired(events, self.retention, int(time.time() * 1000))
        if not doomed:
            return 0
        # Unconditional deletes: an event is never changed, and one already gone is no loss.
        ops: list[Op] = [Delete("Event", e.metadata.name) for e in doomed]
        outcomes = await self.store.commit_many([[op] for op in ops])
        return sum(1 for o in outcomes if not isinstance(o, StoreError))
