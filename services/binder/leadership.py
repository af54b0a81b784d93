"""The Binder's leadership: the lease campaign, the catch-up before deciding, the fence every
commit carries, the step-down, and the health entry that shows the role (see README.md)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2

from protos.godel.v1 import internal_pb2 as ipb
from services.binder.config import BinderConfig
from services.peers.binder import LEADER_METADATA_KEY, LEASE
from store.client import Fence, Store
from store.errors import FencedError, StoreUnavailableError
from store.informer import Informer
from store.lease import LeaseKeeper, Leases, incarnation

log = structlog.get_logger(__name__)

BINDER_SERVICE = ipb.DESCRIPTOR.services_by_name["Binder"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

Spawn = Callable[..., asyncio.Task[None]]


class Leadership:
    """The lease ``binder`` held (or campaigned for) by this instance. ``fence`` is the epoch
    every commit carries while leading; ``ready`` is set once the view has caught up, so
    decisions are accepted only then. A step-down ends the open streams through
    ``abort_streams`` (it returns how many it ended)."""

    def __init__(
        self,
        config: BinderConfig,
        store: Store,
        informer: Informer,
        health_servicer: health.aio.HealthServicer,
        spawn: Spawn,
        abort_streams: Callable[[str], int],
    ) -> None:
        self.config = config
        self.store = store
        self.informer = informer
        self.health = health_servicer
        self.spawn = spawn
        self.abort_streams = abort_streams
        self.elector: LeaseKeeper | None = None
        self.fence: Fence | None = None
        self.ready = asyncio.Event()  # leading and caught up with the store
        self._role_changed = asyncio.Event()
        # A commit the store refused for its epoch; the committer steps down once the refused
        # work is answered (``step_down_if_fenced``), so the shard learns why.
        self.fenced_by: FencedError | None = None
        self._address = ""
        # This process's holder id: its name and a token, so a Binder started again under the
        # same name never resumes its predecessor's epoch.
        self.holder = incarnation(config.name)

    @property
    def is_leader(self) -> bool:
        return self.fence is not None and self.ready.is_set()

    def campaign(self, address: str) -> Coroutine[Any, Any, None]:
        """The elector for this instance at ``address``; returns its loop, to be spawned. It
        renews from a thread of its own, over a connection of its own (``LeaseKeeper``): a busy
        event loop here never lets the lease lapse."""
        self._address = address
        url, cluster = self.config.store_connection_url(), self.config.cluster
        self.elector = LeaseKeeper(
            lambda: Leases.connect(url, cluster=cluster, max_connections=4),
            LEASE,
            self.holder,
            address=address,
            lease_ms=self.config.lease_ms,
            renew_every_ms=self.config.renew_ms,
            retry_every_ms=self.config.renew_ms,
            on_elected=self._on_elected,
            on_deposed=self._on_deposed,
        )
        return self.elector.run()

    async def release(self) -> None:
        if self.elector is not None:
            await self.elector.stop(release=True)

    async def resign_on(self, stop_requested: asyncio.Event) -> None:
        # Release the lease as the stop begins, not after the gRPC grace: a standby takes over
        # at once and open streams end now instead of holding the shutdown.
        await stop_requested.wait()
        self.step_down("shutting down")
        await self.release()

    async def _on_elected(self, fence: Fence) -> None:
        self.fence = fence
        self.ready.clear()
        self._role_changed.set()
        # Not awaited here: the elector must get back to renewing while we catch up.
        self.spawn(self._catch_up(fence), name="binder-catch-up")

    async def _catch_up(self, fence: Fence) -> None:
        """Accept decisions only once the view holds every write made before this epoch (the
        previous leader's binds included; fencing guarantees none can land after)."""
        while self.fence is fence:
            try:
                revision = await self.store.revision()
                await self.informer.wait_for_revision(revision, self.config.sync_timeout_seconds)
            except (StoreUnavailableError, TimeoutError) as exc:
                log.warning("leader catch-up failed; retrying", error=repr(exc))
                await asyncio.sleep(self.config.renew_ms / 1000)
                continue
            if self.fence is fence:
                self.ready.set()
                self._role_changed.set()
                log.info("leading", epoch=fence.epoch, revision=revision, address=self._address)
            return

    async def _on_deposed(self, fence: Fence) -> None:
        self.step_down("lease lost", fence)

    def step_down(self, reason: str, fence: Fence | None = None) -> None:
        """Stop committing at once and end open streams so shards look the leader up again."""
        if self.fence is None or (fence is not None and fence != self.fence):
            return
        epoch = self.fence.epoch
        self.fence = None
        self.ready.clear()
        self._role_changed.set()
        message = f"binder {self.config.name} is no longer the leader ({reason})"
        open_streams = self.abort_streams(message)
        log.warning("stepped down", epoch=epoch, reason=reason, open_streams=open_streams)

    async def step_down_if_fenced(self) -> None:
        """The store refused our epoch (``fenced_by``): step down now, then campaign afresh."""
        if self.fenced_by is None:
            return
        exc, self.fenced_by = self.fenced_by, None
        self.step_down(f"fenced: {exc}")
        if self.elector is not None:
            await self.elector.step_down(f"fenced: {exc}")

    async def leading_fence(self, epoch: int) -> Fence | None:
        """The fence of ``epoch`` once caught up; None once that epoch is no longer ours."""
        while True:
            fence = self.fence
            if fence is None or fence.epoch != epoch:
                return None
            if self.ready.is_set():
                return fence
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), 0.1)

    async def keep_health(self) -> None:
        # The runtime marks every entry SERVING once on_start returns; wait for that so our own
        # "leader only" status is not overwritten, then keep it in line with the role.
        request = health_pb2.HealthCheckRequest(service=BINDER_SERVICE)
        while (await self.health.Check(request, None)).status != SERVING:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # the runtime offers no event for it
        while True:
            self._role_changed.clear()
            await self.health.set(BINDER_SERVICE, SERVING if self.is_leader else NOT_SERVING)
            await self._role_changed.wait()

    async def leader_address(self) -> str:
        lease = await self.store.get_lease(LEASE)
        return lease.holder_address if lease is not None and lease.holder else ""

    async def refuse_as_standby(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        try:
            leader = await self.leader_address()
        except StoreUnavailableError:
            leader = ""
        context.set_trailing_metadata(((LEADER_METADATA_KEY, leader),))
        where = f"the leader is at {leader}" if leader else "no leader is elected right now"
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"binder {self.config.name} is a standby; {where}",
        )
