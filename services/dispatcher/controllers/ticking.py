"""The loop every controller of the dispatcher runs: a tick per interval once the view synced."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from store import StoreError
from store.informer import Informer

log = structlog.get_logger(__name__)


async def tick_forever(
    name: str, informer: Informer, tick: Callable[[], Awaitable[None]], interval: float
) -> None:
    """Run ``tick`` every ``interval`` once the view has synced; a store failure skips a tick
    (the next one decides again from the then-current view)."""
    await informer.wait_synced()
    while True:
        try:
            await tick()
        except StoreError as exc:
            log.warning("controller tick failed", controller=name, error=str(exc))
        await asyncio.sleep(interval)
