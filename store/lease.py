"""Leases: the store's lease operations (``Leases``, part of ``Store``); ``LeaderElector``,
which holds a lease, renews it, and steps down the moment it may be lost; and ``LeaseKeeper``,
which runs an elector on a thread of its own, so that its renewals never wait behind its
owner's work.

Leadership is only ever proven by the fencing epoch: a deposed leader's fenced writes are
rejected by the store itself, so the local view here can be conservative without being
load-bearing.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from protos.godel.v1 import objects_pb2 as pb
from store.connection import StoreConnection, translate_errors
from store.errors import StoreUnavailableError
from store.metrics import LEASE_RENEWAL_LATENESS, LEASE_RENEWAL_LATENESS_MAX, LEASE_ROUND_TRIP
from store.ownloop import OwnLoopWorker

T = TypeVar("T")

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Fence:
    """Proof of leadership carried by leader-only writes."""

    lease: str
    epoch: int


class Leases(StoreConnection):
    """Leases on the server's clock (``lua/lease.lua``): a new holder gets epoch + 1, and a write
    fenced with an older epoch is rejected."""

    async def acquire_lease(
        self, name: str, holder: str, duration_ms: int, address: str = ""
    ) -> tuple[bool, pb.Lease]:
        """Take the lease if it is free or expired (new epoch), or extend it if ``holder``
        already has it. Returns (acquired, lease as now stored)."""
        return await self._lease("acquire", name, holder, 0, duration_ms, address)

    async def renew_lease(
        self, name: str, holder: str, epoch: int, duration_ms: int
    ) -> tuple[bool, pb.Lease]:
        """Extend a lease held at ``epoch``; False once it expired or changed hands."""
        return await self._lease("renew", name, holder, epoch, duration_ms, "")

    async def release_lease(self, name: str, holder: str, epoch: int) -> bool:
        """Step down: the lease becomes free at once (the epoch stays, so writes fenced with it
        are rejected from now on)."""
        ok, _ = await self._lease("release", name, holder, epoch, 0, "")
        return ok

    async def get_lease(self, name: str) -> pb.Lease | None:
        """The lease as stored (holder empty if released); None if never taken."""
        _, lease = await self._lease("observe", name, "", 0, 0, "")
        return lease if lease.epoch else None

    async def _lease(
        self, action: str, name: str, holder: str, epoch: int, duration_ms: int, address: str
    ) -> tuple[bool, pb.Lease]:
        with translate_errors(), LEASE_ROUND_TRIP.time():
            if self.replicas and action != "observe":
                # A new epoch must survive a failover: granted only once a replica has it.
                async with self._redis.pipeline(transaction=False) as pipe:
                    await self._lease_script(
                        keys=[self.keys.lease(name)],
                        args=[action, holder, epoch, duration_ms, address],
                        client=pipe,
                    )
                    self._wait_for_replicas(pipe)
                    replies = await pipe.execute()
                self._check_replicated(replies)
                r = replies[0]
            else:
                r = await self._lease_script(
                    keys=[self.keys.lease(name)],
                    args=[action, holder, epoch, duration_ms, address],
                )
        lease = pb.Lease(
            name=name,
            holder=r[1].decode(),
            holder_address=r[2].decode(),
            epoch=int(r[3]),
            duration_ms=int(r[4]),
            acquired_ms=int(r[5]),
            renewed_ms=int(r[6]),
            expires_ms=int(r[7]),
        )
        if lease.expires_ms <= int(r[8]):
            lease.holder = ""  # expired: nobody holds it
        return bool(int(r[0])), lease


def incarnation(name: str) -> str:
    """A lease holder id for this process serving as ``name``: the name and a random token.
    The store takes the same holder asking again for a live lease as its renewal (same epoch),
    so a process started again under the same name must be another holder: it then waits for
    the lease or takes it with a new epoch, and never resumes the epoch of a predecessor that
    may still be alive (frozen, or cut off from the store) and write under it."""
    return f"{name}/{secrets.token_hex(4)}"


def holder_name(holder: str) -> str:
    """The name of the process holding a lease: its holder id without the incarnation token."""
    return holder.split("/", 1)[0]


LeadershipCallback = Callable[[Fence], Awaitable[None]]


class LeaderElector:
    def __init__(
        self,
        store: Leases,
        lease: str,
        holder: str,
        *,
        address: str = "",
        lease_ms: int = 5000,
        renew_every_ms: int = 1000,
        retry_every_ms: int = 500,
        on_elected: LeadershipCallback | None = None,
        on_deposed: LeadershipCallback | None = None,
    ) -> None:
        _check_periods(renew_every_ms, lease_ms)
        self._store = store
        self.lease = lease
        self.holder = holder
        self.address = address
        self.lease_ms = lease_ms
        self._renew_s = renew_every_ms / 1000
        self._retry_s = retry_every_ms / 1000
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self.fence: Fence | None = None
        self._valid_until = 0.0
        self.elected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        # The greatest renewal lateness seen (see LEASE_RENEWAL_LATENESS).
        self.max_lateness_s = 0.0
        self._lateness = LEASE_RENEWAL_LATENESS.labels(lease)
        self._lateness_max = LEASE_RENEWAL_LATENESS_MAX.labels(lease)

    @property
    def is_leader(self) -> bool:
        return self.fence is not None

    @property
    def holds_now(self) -> bool:
        """Leading, and the last successful renewal still covers this moment (local clock).
        False at once after a freeze longer than the lease, before the renewal that proves the
        lease lost: what unfenced writes (a shard's liveness stamps) are gated on."""
        return self.fence is not None and time.monotonic() < self._valid_until

    def start(self) -> None:
        """Campaign in a task of the elector's own. Services should rather supervise
        :meth:`run` themselves (``Service.spawn``), so that a crash of it is not silent."""
        if self._task is None:
            self._stopped = False
            self._task = asyncio.create_task(self.run(), name=f"leader-elector:{self.lease}")

    async def run(self) -> None:
        """Campaign, hold and renew until :meth:`stop`."""
        while not self._stopped:
            if self.fence is None:
                await self._campaign()
            else:
                await self._hold()

    async def step_down(self, reason: str) -> None:
        """Stop leading now (e.g. a fenced write proved the lease lost) and campaign afresh."""
        await self._step_down(reason)

    async def stop(self, *, release: bool = True) -> None:
        """Stop campaigning; release the lease (so a standby takes over at once) if held."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        fence = self.fence
        if fence is not None:
            await self._step_down("stopping")
            if release:
                with contextlib.suppress(StoreUnavailableError):
                    await self._store.release_lease(self.lease, self.holder, fence.epoch)

    async def _campaign(self) -> None:
        try:
            ok, lease = await self._store.acquire_lease(
                self.lease, self.holder, self.lease_ms, self.address
            )
        except StoreUnavailableError as exc:
            log.warning("lease campaign: store unavailable", lease=self.lease, error=str(exc))
            ok = False
        if not ok:
            await asyncio.sleep(self._retry_s)
            return
        if self._stopped:  # stopped while the acquire was in flight: hand it straight back
            with contextlib.suppress(StoreUnavailableError):
                await self._store.release_lease(self.lease, self.holder, lease.epoch)
            return
        self.fence = Fence(self.lease, lease.epoch)
        self._valid_until = time.monotonic() + self.lease_ms / 1000
        self.elected.set()
        log.info("elected leader", lease=self.lease, holder=self.holder, epoch=lease.epoch)
        if self._on_elected:
            await self._on_elected(self.fence)

    async def _hold(self) -> None:
        fence = self.fence
        assert fence is not None
        due = time.monotonic() + self._renew_s
        await asyncio.sleep(self._renew_s)
        if self.fence is not fence:
            return  # stepped down while asleep
        sent = time.monotonic()
        try:
            ok, _ = await asyncio.wait_for(
                self._store.renew_lease(self.lease, self.holder, fence.epoch, self.lease_ms),
                timeout=max(0.05, self._valid_until - sent),
            )
        except (StoreUnavailableError, TimeoutError) as exc:
            # Keep leading only while the last successful renewal still covers us.
            if time.monotonic() >= self._valid_until:
                await self._step_down(f"could not renew: {exc}")
            return
        if self.fence is not fence:
            return
        self._observe_lateness(time.monotonic() - due)
        if ok:
            self._valid_until = sent + self.lease_ms / 1000
        else:
            await self._step_down("lease lost")

    def _observe_lateness(self, seconds: float) -> None:
        late = max(0.0, seconds)
        self._lateness.observe(late)
        if late > self.max_lateness_s:
            self.max_lateness_s = late
            self._lateness_max.set(late)

    async def _step_down(self, reason: str) -> None:
        fence, self.fence = self.fence, None
        self.elected.clear()
        if fence is None:
            return
        log.warning("stepped down", lease=self.lease, epoch=fence.epoch, reason=reason)
        if self._on_deposed:
            await self._on_deposed(fence)


FenceCallback = Callable[[Fence], Coroutine[Any, Any, None]]


class LeaseKeeper(OwnLoopWorker):
    """A :class:`LeaderElector` on a thread of its own, with its own event loop and its own
    connection to the store (``connect``; ``store.ownloop``): its renewals never wait behind the
    owner's event loop — a Binder deciding a 100,000-pod batch, a decode of a large listing —
    which at scale let the lease lapse and leadership change hands while nothing was wrong.

    ``on_elected`` and ``on_deposed`` run in the owner's loop, in the order they happened; the
    elector never waits for them, so a busy owner cannot stall a renewal either. Leadership is
    still proven only by the fence: an owner that learns of a deposition late has its fenced
    writes refused by the store meanwhile.

    :meth:`run` (in the owner's loop) starts the thread and returns when it ends, raising what
    ended it; :meth:`step_down` and :meth:`stop` are the owner's handles on it."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Leases]],
        lease: str,
        holder: str,
        *,
        address: str = "",
        lease_ms: int = 5000,
        renew_every_ms: int = 1000,
        retry_every_ms: int = 500,
        on_elected: FenceCallback | None = None,
        on_deposed: FenceCallback | None = None,
    ) -> None:
        super().__init__()
        _check_periods(renew_every_ms, lease_ms)
        self.thread_name = f"lease-keeper:{lease}"
        self._connect = connect
        self.lease = lease
        self.holder = holder
        self._elector_args: dict[str, Any] = {
            "address": address,
            "lease_ms": lease_ms,
            "renew_every_ms": renew_every_ms,
            "retry_every_ms": retry_every_ms,
        }
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._elector: LeaderElector | None = None
        self._campaign: asyncio.Task[None] | None = None

    @property
    def fence(self) -> Fence | None:
        """The fence while the lease is held (read from any thread: one attribute)."""
        elector = self._elector
        return elector.fence if elector is not None else None

    @property
    def holds_now(self) -> bool:
        """``LeaderElector.holds_now`` (read from any thread)."""
        elector = self._elector
        return elector is not None and elector.holds_now

    @property
    def max_lateness_s(self) -> float:
        elector = self._elector
        return elector.max_lateness_s if elector is not None else 0.0

    async def step_down(self, reason: str) -> None:
        """Stop leading now (a fenced write proved the lease lost) and campaign afresh."""
        elector = self._elector
        if elector is not None:
            await self.in_worker(elector.step_down(reason))

    async def stop(self, *, release: bool = True) -> None:
        """Stop campaigning, releasing the lease if held (a standby takes over at once), and end
        the thread."""
        await self.stop_thread(lambda: self._shut_down(release))

    async def _shut_down(self, release: bool) -> None:
        """In the keeper's loop: end the campaign, then step down (and release)."""
        if self._campaign is not None:
            self._campaign.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._campaign
        if self._elector is not None:
            await self._elector.stop(release=release)

    async def work(self) -> None:
        stopping = self.stopping
        assert stopping is not None
        store = await self._connect()
        try:
            if stopping.is_set():  # stopped while connecting: never campaign
                return
            self._elector = LeaderElector(
                store,
                self.lease,
                self.holder,
                on_elected=self._forward(self._on_elected, "on_elected"),
                on_deposed=self._forward(self._on_deposed, "on_deposed"),
                **self._elector_args,
            )
            self._campaign = asyncio.create_task(self._elector.run())
            waiting = asyncio.create_task(stopping.wait())
            await asyncio.wait({self._campaign, waiting}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            if self._campaign.done() and not self._campaign.cancelled():
                self._campaign.result()  # the elector failed: raise it to the owner
        finally:
            with contextlib.suppress(Exception):
                await store.close()

    def _forward(self, callback: FenceCallback | None, what: str) -> LeadershipCallback | None:
        """``callback`` run in the owner's loop, not awaited by the elector."""
        if callback is None:
            return None

        async def forward(fence: Fence) -> None:
            self.call_owner(lambda: callback(fence), f"lease {self.lease} {what}")

        return forward


def _check_periods(renew_every_ms: int, lease_ms: int) -> None:
    if renew_every_ms * 2 > lease_ms:
        raise ValueError("renew_every_ms must be at most half of lease_ms")
