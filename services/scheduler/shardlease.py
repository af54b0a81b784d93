"""A shard's name as a lease: the process that holds the store lease ``shard:<name>`` is that
shard (it registers the ``SchedulerInstance``, stamps its liveness, schedules); any other
process configured for the name waits as a warm standby — informer synced, unregistered, idle —
and takes the name when the lease expires (its holder was killed or froze) or is released (its
holder stopped). A spare configured for several names takes whichever frees first. README.md,
"Standby shards".

As with the Binder's leadership (``services/binder/leadership.py``), the lease is renewed from
a thread of its own (``store.lease.LeaseKeeper``), so a busy shard never loses it; the shard's
writes as that name (registration, counters, the deletion on stop) are fenced with the lease's
epoch, so the store refuses them from a holder deposed while it was frozen; and its liveness
stamps (one unfenced HSET each) are written only while the last renewal still covers the moment
(``LeaseKeeper.holds_now``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import structlog

from store.errors import StoreUnavailableError
from store.lease import Fence, LeaseKeeper, Leases

log = structlog.get_logger(__name__)

LEASE_PREFIX = "shard:"

Spawn = Callable[..., asyncio.Task[None]]
TakenCallback = Callable[[str, Fence], Coroutine[Any, Any, None]]
LostCallback = Callable[[Fence], Coroutine[Any, Any, None]]


def shard_lease(shard: str) -> str:
    """The lease whose holder is shard ``shard``."""
    return LEASE_PREFIX + shard


class ShardLease:
    """The shard name this process holds or waits for. ``candidates`` are the names it may
    take, in order of preference: one for a shard, several for a spare. Once it took a name it
    campaigns for that name alone — its view, partition and units are that shard's now.

    A ``spare`` takes only names some process held before (their lease exists): it replaces a
    shard that failed, and never wins the start-up race against the shard's own process (every
    process of `godel up` starts at once).

    ``on_taken(name, fence)`` and ``on_lost(fence)`` run in the owner's loop each time the lease
    is won and lost (``LeaseKeeper``: not awaited by the renewals)."""

    def __init__(
        self,
        store: Leases,
        connect: Callable[[], Awaitable[Leases]],
        candidates: Sequence[str],
        holder: str,
        *,
        lease_ms: int,
        renew_ms: int,
        spare: bool,
        spawn: Spawn,
        on_taken: TakenCallback,
        on_lost: LostCallback,
    ) -> None:
        if not candidates:
            raise ValueError("a shard lease needs at least one candidate name")
        self._store = store
        self._connect = connect
        self.candidates = tuple(candidates)
        self.holder = holder
        self.lease_ms = lease_ms
        self.renew_ms = renew_ms
        self.spare = spare
        self._spawn = spawn
        self._on_taken = on_taken
        self._on_lost = on_lost
        self.keeper: LeaseKeeper | None = None
        self.name = ""  # the name taken; "" while none was
        self._stopped = False

    @property
    def fence(self) -> Fence | None:
        return self.keeper.fence if self.keeper is not None else None

    def holds_now(self) -> bool:
        """Whether the lease is held and still covered by its last renewal (any thread)."""
        keeper = self.keeper
        return keeper is not None and keeper.holds_now

    async def try_once(self, address: str) -> str:
        """Ask for each free candidate once; the name taken, or "" (all held, or no store)."""
        for name in self.candidates:
            try:
                if self.spare and await self._store.get_lease(shard_lease(name)) is None:
                    continue  # its shard never started: nothing to replace
                ok, lease = await self._store.acquire_lease(
                    shard_lease(name), self.holder, self.lease_ms, address
                )
            except StoreUnavailableError as exc:
                log.warning("shard lease: store unavailable", error=str(exc))
                return ""
            if ok:
                if self._stopped:  # stopped while the acquire was in flight: hand it back
                    with contextlib.suppress(StoreUnavailableError):
                        await self._store.release_lease(shard_lease(name), self.holder, lease.epoch)
                    return ""
                self._keep(name, address)
                return name
        return ""

    async def campaign(self, address: str) -> None:
        """Wait as a standby: ask every ``renew_ms`` until a candidate is free (its holder's
        lease expired or was released), then keep that one."""
        while not self.name and not self._stopped:
            if await self.try_once(address):
                return
            await asyncio.sleep(self.renew_ms / 1000)

    def _keep(self, name: str, address: str) -> None:
        """Hand ``name`` to a keeper of its own thread. Its first acquire extends ours (same
        holder, same epoch) and reports it through ``on_taken``."""
        self.name = name

        async def taken(fence: Fence) -> None:
            await self._on_taken(name, fence)

        self.keeper = LeaseKeeper(
            self._connect,
            shard_lease(name),
            self.holder,
            address=address,
            lease_ms=self.lease_ms,
            renew_every_ms=self.renew_ms,
            retry_every_ms=self.renew_ms,
            on_elected=taken,
            on_deposed=self._on_lost,
        )
        self._spawn(self.keeper.run(), name=f"scheduler-lease:{name}")
        log.info("shard name taken", shard=name, holder=self.holder)

    async def step_down(self, reason: str) -> None:
        """The store refused our epoch: stop holding now, and campaign for the name afresh."""
        if self.keeper is not None:
            await self.keeper.step_down(reason)

    async def stop(self) -> None:
        """Stop campaigning, and release the name if held (a standby takes it at once)."""
        self._stopped = True
        if self.keeper is not None:
            await self.keeper.stop(release=True)
