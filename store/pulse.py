"""Scheduler shards' liveness: ``ShardHeartbeats`` (part of ``Store``), a server-time stamp per
shard in a hash outside the change feed, kept like node heartbeats (``lua/heartbeat.lua``); and
``ShardPulse``, which writes a shard's stamp from a thread of its own, over a connection of its
own, so that a shard whose event loop is busy (a 10,000-pod gang, a burst of units) is never
judged dead for it.

A stamp is one HSET; the ``SchedulerInstance`` record (address, partition, counters) is no
longer rewritten to say "alive", so every informer's change feed stops carrying a ~100 KB record
per shard per second. Who judges liveness reads every stamp in one round trip
(:meth:`ShardHeartbeats.shard_heartbeats`), with the server's time of the read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

from store.connection import StoreConnection, translate_errors
from store.errors import StoreUnavailableError
from store.metrics import HEARTBEAT_ROUND_TRIP, SHARD_HEARTBEAT_GAP_MAX
from store.nodes import Heartbeats
from store.ownloop import OwnLoopWorker

log = structlog.get_logger(__name__)

SHARD_KIND = "SchedulerInstance"


class ShardHeartbeats(StoreConnection):
    """Shard liveness stamps: server-time, one field per shard, outside the change feed."""

    async def record_shard_heartbeat(self, shard: str) -> bool:
        """Stamp ``shard`` with the server's time. False (and no stamp) when it has no
        ``SchedulerInstance`` record: deleted (declared dead, or stopping) or never registered."""
        reply = await self._shard_heartbeat(["record", shard])
        return len(reply) == 1

    async def shard_heartbeats(self) -> Heartbeats:
        """Every shard's last stamp and the server's time now, in one round trip."""
        reply = await self._shard_heartbeat(["read"])
        flat = reply[1:]
        last = {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}
        return Heartbeats(now_ms=int(reply[0]), last_ms=last)

    async def forget_shard_heartbeat(self, shard: str) -> None:
        """Drop a shard's stamp (it stopped, or its record was deleted as dead)."""
        await self._shard_heartbeat(["forget", shard])

    async def _shard_heartbeat(self, args: list[str]) -> Any:
        with translate_errors(), HEARTBEAT_ROUND_TRIP.time():
            return await self._heartbeat_script(
                keys=[self.keys.shard_heartbeats, self.keys.versions(SHARD_KIND)], args=args
            )


def last_beat_ms(beats: Heartbeats, shard: str, registered_ms: int) -> int:
    """A shard's last sign of life: its stamp, or, before its first stamp (a moment after it
    registered), the registration time its record holds."""
    return beats.last_ms.get(shard) or registered_ms


OwnerCallback = Callable[[], Coroutine[Any, Any, None]]


class ShardPulse(OwnLoopWorker):
    """Stamps one shard's liveness every ``every_seconds`` from a thread of its own, with its
    own event loop and its own store connection (``connect``), as ``store.lease.LeaseKeeper``
    renews the Binder's lease: the stamps never wait behind the owner's event loop. (The GIL
    still passes between the threads every few milliseconds.)

    The stamps stop with the process (kill -9: the thread dies with it) and with :meth:`stop`.
    A loop that is busy is not dead, but one that never comes back is: once the owner's loop
    has not run a callback for ``max_owner_silence_seconds``, the stamps stop until it does,
    so a wedged shard is still judged dead and its units go elsewhere.

    ``may_stamp`` (called from the pulse's thread before each stamp) gates the stamps: a shard
    stamps only while it holds its name's lease (``services/scheduler/shardlease.py``), so a
    holder frozen past its lease and woken after a standby took its name stamps nothing.

    ``on_missing`` runs in the owner's loop (not awaited by the thread) each time a stamp finds
    no record of the shard — deleted as dead while it was frozen, say: the owner registers
    again (once: it may be asked again while it does).

    :meth:`run` (in the owner's loop) starts the thread and returns when it ends, raising what
    ended it; :meth:`stop` ends it."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[ShardHeartbeats]],
        shard: str,
        *,
        every_seconds: float = 1.0,
        max_owner_silence_seconds: float = 60.0,
        on_missing: OwnerCallback | None = None,
        may_stamp: Callable[[], bool] | None = None,
    ) -> None:
        if every_seconds <= 0 or max_owner_silence_seconds <= every_seconds:
            raise ValueError("need 0 < every_seconds < max_owner_silence_seconds")
        super().__init__()
        self.thread_name = f"shard-pulse:{shard}"
        self._connect = connect
        self.shard = shard
        self.every_seconds = every_seconds
        self.max_owner_silence_seconds = max_owner_silence_seconds
        self._on_missing = on_missing
        self._may_stamp = may_stamp
        # When the owner's loop last ran a callback of ours (written by the owner's thread).
        self._owner_seen = time.monotonic()
        self.stamps = 0  # stamps written, for tests and logs
        # The longest time between two stamps written (from the thread's own clock).
        self.max_gap_s = 0.0
        self._gap_max = SHARD_HEARTBEAT_GAP_MAX.labels(shard)

    async def run(self) -> None:
        """Stamp from a thread of its own until :meth:`stop`; raises if the thread failed."""
        self._owner_seen = time.monotonic()
        await super().run()

    async def stop(self) -> None:
        """Stop stamping and end the thread: no stamp is written once this returns."""
        await self.stop_thread()

    async def work(self) -> None:
        stopping = self.stopping
        assert stopping is not None
        store: ShardHeartbeats | None = None
        while store is None:  # the store may be restarting: a pulse outlives that
            try:
                store = await self._connect()
            except StoreUnavailableError as exc:
                log.warning("shard pulse cannot reach the store", shard=self.shard, error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), self.every_seconds)
                if stopping.is_set():
                    return
        try:
            last: float | None = None
            silent = False
            while not stopping.is_set():
                self.call_owner_soon(self._owner_answered)
                owner_silence = time.monotonic() - self._owner_seen
                if owner_silence > self.max_owner_silence_seconds:
                    if not silent:
                        log.error(
                            "the shard's event loop has not run for too long; liveness stamps "
                            "stop until it does",
                            shard=self.shard,
                            silent_s=round(owner_silence, 1),
                        )
                    silent = True
                else:
                    silent = False
                    if self._may_stamp is None or self._may_stamp():
                        last = await self._stamp(store, last)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), self.every_seconds)
        finally:
            with contextlib.suppress(Exception):
                await store.close()

    async def _stamp(self, store: ShardHeartbeats, last: float | None) -> float | None:
        """One stamp; returns when it was written (``last`` if it was not)."""
        try:
            # Bounded, so a store that stopped answering does not hold up stop().
            recorded = await asyncio.wait_for(
                store.record_shard_heartbeat(self.shard), timeout=max(1.0, 2 * self.every_seconds)
            )
        except (StoreUnavailableError, TimeoutError) as exc:
            log.warning("shard liveness stamp failed", shard=self.shard, error=str(exc))
            return last
        now = time.monotonic()
        if not recorded:
            self._tell_owner_missing()  # each beat until the owner has registered again
            return last
        self.stamps += 1
        if last is not None and now - last > self.max_gap_s:
            self.max_gap_s = now - last
            self._gap_max.set(self.max_gap_s)
        return now

    def _owner_answered(self) -> None:
        self._owner_seen = time.monotonic()

    def _tell_owner_missing(self) -> None:
        if self._on_missing is not None:
            self.call_owner(self._on_missing, "shard pulse's on_missing")
