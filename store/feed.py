"""The change feed: every write's entry in one stream (stream ID = revision), read in order by
``watch``, which parses the entries itself and decodes only the changes asked for."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from store import kinds as kinds_mod
from store.connection import StoreConnection, read_with_retry, translate_errors
from store.errors import InvalidObjectError, ResourceVersionTooNewError, ResourceVersionTooOldError
from store.kinds import StoredObject

log = structlog.get_logger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
_EVENT_TYPES: dict[bytes, EventType] = {b"A": "ADDED", b"M": "MODIFIED", b"D": "DELETED"}
# The field names of a change feed entry, in the order commit.lua writes them; a hinted
# update's entry has its hint last (store/ops.py ``Update.hint``).
_FEED_FIELDS = [b"t", b"k", b"n", b"d"]
_HINTED_FIELDS = [b"t", b"k", b"n", b"d", b"h"]


@dataclass(slots=True)
class WatchEvent:
    type: EventType
    kind: str
    name: str
    revision: int
    # The object after the change; for DELETED, its last state. None if the stored bytes could
    # not be decoded (reported in ``error``).
    obj: StoredObject | None
    error: InvalidObjectError | None = None


@dataclass(slots=True)
class WatchBatch:
    events: list[WatchEvent]
    # The feed position after this batch, including events of kinds not asked for.
    revision: int
    # The read reached the end of the feed (fewer entries than asked for): the watcher was
    # current as of this batch, not working through a backlog.
    caught_up: bool = True


class ChangeFeed(StoreConnection):
    """The change feed: the current revision and ``watch``, every change after a revision."""

    async def revision(self) -> int:
        """The current global revision (the last one assigned)."""
        raw = await read_with_retry(lambda: self._redis.get(self.keys.revision))
        return int(raw or 0)

    async def oldest_revision(self) -> int:
        """The oldest revision still in the change feed (0 if the feed is empty)."""
        with translate_errors():
            first: Any = await self._redis.xrange(self.keys.feed, count=1)
        return int(first[0][0].split(b"-")[0]) if first else 0

    async def watch(
        self,
        from_revision: int,
        kinds: Sequence[str] | None = None,
        *,
        block_ms: int = 1000,
        count: int = 4096,
        keep: Callable[[str, bytes], bool] | None = None,
        hinted: Callable[[str, bytes, bytes], bool] | None = None,
    ) -> AsyncIterator[WatchBatch]:
        """Every change after ``from_revision``, in order, in batches; an empty batch after
        ``block_ms`` without changes. Raises ResourceVersionTooOldError when the feed no longer
        holds the next revision (trimmed, or the store was reset): the caller must relist.
        ``keep(kind, name)``, if given, picks the changes wanted by the object's name before
        the object is decoded (a watch of one job's pods need not decode every pod).
        ``hinted(kind, name, hint)``, if given, is asked instead of ``keep`` about a change
        whose writer said what it was (``Update.hint``; ``keep`` is not asked about those):
        False passes over it undecoded. Both are asked in feed order, as each read is parsed,
        before the read is handed over."""
        wanted = {kinds_mod.kind_named(k).name.encode() for k in kinds} if kinds else None
        decoders = {k.name.encode(): k for k in kinds_mod.KINDS.values()}
        last = from_revision
        with translate_errors():
            current = await self.revision()
            if last > current:
                raise ResourceVersionTooNewError(last, current)
            if last < current and await self._redis.xlen(self.keys.feed) == 0:
                raise ResourceVersionTooOldError(last, current + 1)
        feed = self.keys.feed
        while True:
            with translate_errors():
                entries: list[Any] = await self._redis.execute_command(  # type: ignore[no-untyped-call]  # redis-py leaves execute_command unannotated
                    "XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", feed, f"{last}-0"
                )
            if not entries:
                yield WatchBatch([], last)
                continue
            first = int(entries[0][0].split(b"-", 1)[0])
            if first != last + 1:
                raise ResourceVersionTooOldError(last, first)
            final = int(entries[-1][0].split(b"-", 1)[0])
            events = _feed_events(entries, first, final, wanted, decoders, keep, hinted)
            last = final
            yield WatchBatch(events, last, caught_up=len(entries) < count)


def _feed_events(
    entries: list[Any],
    first: int,
    final: int,
    wanted: set[bytes] | None,
    decoders: dict[bytes, kinds_mod.Kind],
    keep: Callable[[str, bytes], bool] | None,
    hinted: Callable[[str, bytes, bytes], bool] | None = None,
) -> list[WatchEvent]:
    """The events of one read of the change feed (revisions ``first`` to ``final``), of the
    ``wanted`` kinds and the names ``keep`` picks (``hinted``, of a hinted change), each
    decoded (or carrying its decoding error); a malformed entry is logged and skipped."""
    events: list[WatchEvent] = []
    # Revisions are dense (commit.lua writes one entry per revision): entry i of a read
    # is revision first + i, unless the ends say otherwise.
    revisions: Sequence[int] = range(first, final + 1)
    if len(revisions) != len(entries):
        revisions = [int(entry[0].split(b"-", 1)[0]) for entry in entries]
    for revision, (_, fields) in zip(revisions, entries, strict=True):
        # commit.lua writes the fields in this order: t <type> k <kind> n <name> d <data>
        # [h <hint>]
        hint = b""
        if len(fields) == 8 and fields[::2] == _FEED_FIELDS:
            type_, kind_name, name, data = fields[1], fields[3], fields[5], fields[7]
        elif len(fields) == 10 and fields[::2] == _HINTED_FIELDS:
            type_, kind_name, name, data = fields[1], fields[3], fields[5], fields[7]
            hint = fields[9]
        else:  # written otherwise: read by name
            named = dict(zip(fields[::2], fields[1::2], strict=False))
            type_, kind_name = named.get(b"t", b""), named.get(b"k", b"")
            name, data = named.get(b"n", b""), named.get(b"d", b"")
            hint = named.get(b"h", b"")
        event_type = _EVENT_TYPES.get(type_)
        if event_type is None or not name:
            log.error(
                "malformed change feed entry; skipped",
                revision=revision,
                fields=[bytes(f[:40]) for f in fields[::2]],
            )
            continue
        if wanted is not None and kind_name not in wanted:
            continue
        kind = decoders.get(kind_name)
        if kind is None:
            continue
        if hint and hinted is not None:
            if not hinted(kind.name, name, hint):
                continue
        elif keep is not None and not keep(kind.name, name):
            continue
        obj: StoredObject | None = None
        error: InvalidObjectError | None = None
        try:
            obj = kinds_mod.decode(kind, data, revision)
        except InvalidObjectError as exc:
            error = exc
        events.append(
            WatchEvent(
                event_type,
                kind.name,
                name.decode(errors="replace"),
                revision,
                obj,
                error,
            )
        )
    return events
