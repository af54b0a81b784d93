"""Which scheduler shards are alive: the dispatcher's one judge of it, for dispatch
(``Dispatcher.check_shards``), the node shuffler (a dead shard's partition) and the reconciler
(a dead shard's record).

A shard's sign of life is its stamp in the store's shard heartbeat hash (``store.pulse``),
written from a thread of the shard's own: a shard whose event loop is busy keeps stamping, so
it is never judged dead for being busy. Before its first stamp (a moment after it registered),
the registration time in its record counts (as does a record's ``heartbeat_ms`` kept fresh by a
shard of an earlier version, which wrote no stamps). Every stamp is read in one round trip per
tick, aged by the store server's clock at the read: no clock of ours is compared with the
shards'.

Judging needs continuous contact with the store. Stamps are read directly, so a view of ours
that lags no longer makes them look old; but a store that took no writes for a while (one long
script making every command BUSY, a failover) refused the shards' stamps as it refused our
reads, and right after it every stamp is old through no fault of the shards. So a shard is
judged only when this read succeeded, the previous successful one (if any) was at most half
the grace before it (server clock), and the read is recent (our own loop was not blocked
since). The
informer's staleness (``check_shards``) stays a second sign of the same thing: a watch that
could not read for a while means the store, or our loop, was not there.
"""

from __future__ import annotations

import time

import structlog

from protos.godel.v1 import objects_pb2 as pb
from store import Store, StoreUnavailableError
from store.informer import Informer
from store.nodes import Heartbeats
from store.pulse import last_beat_ms

log = structlog.get_logger(__name__)


class ShardLiveness:
    """The shards' stamps as last read, and whether they may be judged. ``read()`` once per
    tick (the dispatcher's shard loop); the others ask ``live()``/``silent_ms()``."""

    def __init__(self, store: Store, informer: Informer, grace_seconds: float) -> None:
        self.store = store
        self.informer = informer
        self.grace_ms = int(grace_seconds * 1000)
        self.beats: Heartbeats | None = None
        self._read_at = 0.0  # monotonic time of the last successful read
        self._continuous = False  # the last read followed the one before closely

    async def read(self) -> bool:
        """Read every stamp (one round trip); returns whether shards may be judged now."""
        try:
            beats = await self.store.shard_heartbeats()
        except StoreUnavailableError as exc:
            log.warning("could not read shard heartbeats; judging no shard", error=str(exc))
            self._continuous = False
            return False
        previous = self.beats
        # The first read has nothing to follow: at start-up no shard is linked yet, and the
        # view just synced proves a moment's contact (a dead record waits dead_shard_seconds).
        self._continuous = previous is None or beats.now_ms - previous.now_ms <= self.grace_ms // 2
        self.beats = beats
        self._read_at = time.monotonic()
        return self.judging

    @property
    def judging(self) -> bool:
        """Whether the stamps as last read may declare a shard dead (see the module's
        docstring): read recently, and in continuous contact with the store."""
        fresh = time.monotonic() - self._read_at <= self.grace_ms / 2000
        return self.beats is not None and self._continuous and fresh

    def silent_ms(self, inst: pb.SchedulerInstance) -> int:
        """How long the shard had given no sign of life at the last read (0 before any read:
        nobody is presumed dead)."""
        beats = self.beats
        if beats is None:
            return 0
        name: str = inst.metadata.name
        registered_ms: int = inst.status.heartbeat_ms
        silent: int = beats.now_ms - last_beat_ms(beats, name, registered_ms)
        return max(0, silent)

    def live(self) -> dict[str, pb.SchedulerInstance]:
        """Shards with an address whose last sign of life is within the grace, by name."""
        live = {}
        for obj in self.informer.list("SchedulerInstance"):
            assert isinstance(obj, pb.SchedulerInstance)
            if self.beats is None:
                continue
            if obj.spec.address and self.silent_ms(obj) <= self.grace_ms:
                live[obj.metadata.name] = obj
        return live
