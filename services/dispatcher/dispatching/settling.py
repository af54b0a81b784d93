"""Units whose attempt ended, waiting for the dispatcher's view to catch up with the store before
they queue again (``Settler``), so pods the Binder just bound are not sent again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from services.dispatcher.dispatching.entries import UnitEntry
from services.dispatcher.dispatching.unitqueue import UnitQueue
from store import Store, StoreError
from store.informer import Informer

log = structlog.get_logger(__name__)

# How long to wait for the informer to catch up with the store before re-queueing a unit whose
# attempt ended (so pods the Binder just bound are not sent again).
SETTLE_TIMEOUT_SECONDS = 5.0


class Settler:
    """Collects the units whose attempt ended and, once the informer has reached the store's
    revision (or the timeout passed), hands them back to the queue (``UnitQueue.settled``) and
    kicks the dispatch loop."""

    def __init__(
        self, store: Store, informer: Informer, queue: UnitQueue, kick: asyncio.Event
    ) -> None:
        self._store = store
        self._informer = informer
        self._queue = queue
        self._kick = kick
        self._jobs: set[str] = set()
        self._wake = asyncio.Event()

    def add(self, entry: UnitEntry) -> None:
        """The unit's attempt ended (the queue has it SETTLING): queue it again once settled."""
        self._jobs.add(entry.job)
        self._wake.set()

    async def run(self, closing: Callable[[], bool]) -> None:
        """Settle batches until ``closing()`` (or cancelled)."""
        while not closing():
            await self._wake.wait()
            self._wake.clear()
            batch, self._jobs = self._jobs, set()
            try:
                revision = await self._store.revision()
                await self._informer.wait_for_revision(revision, SETTLE_TIMEOUT_SECONDS)
            except TimeoutError:
                # Our view is behind the store (a busy dispatcher, a burst of writes): the units
                # go back anyway; a shard that finds their pods bound answers STALE.
                log.warning(
                    "view of the store still behind after the settle timeout; re-queueing",
                    timeout_s=SETTLE_TIMEOUT_SECONDS,
                    units=len(batch),
                )
            except StoreError as exc:
                log.warning("could not settle against the store; re-queueing", error=str(exc))
            for job in batch:
                self._queue.settled(job)
            self._kick.set()
