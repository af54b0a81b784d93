"""The binder: the leader-elected serialisation point that checks and commits bindings.

One instance holds the store lease ``binder``; the others are warm standbys (their informer runs,
so a new leader only has to catch up, not to list). Shards stream DecisionBatches to the leader;
every stream's batches go through one queue to a single committer task, which checks each batch
against the authoritative state (see ``decide.py``) and binds what it accepts in one fenced commit.
See README.md for the invariants.

``BinderService`` composes the parts, each in its own module: the leadership
(``leadership.py``), the Decide streams and the committer (``committer.py``), the Evict RPC
(``evictrpc.py``) and what a commit leaves behind (``records.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from placement.rules import hard_rules
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from services import events, metrics
from services.binder.committer import Committer, Work
from services.binder.config import BinderConfig
from services.binder.evictrpc import Evictions
from services.binder.leadership import BINDER_SERVICE, Leadership
from services.binder.records import CommitRecords
from services.binder.reserve import Reserving
from services.binder.state import watched
from services.peers.binder import LEASE
from services.runtime import Service

__all__ = ["BinderConfig", "BinderService"]

log = structlog.get_logger(__name__)


class BinderService(Service[BinderConfig]):
    component = "binder"
    config_class = BinderConfig
    grpc_services = (BINDER_SERVICE,)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.config
        self.rules = hard_rules()
        self.informer, self.state = watched(self.store)
        # Preemptions, evictions and bind rejections, written in batches off the commit path.
        self.events = events.EventRecorder(self.store, cfg.name)
        self.leadership = Leadership(
            cfg, self.store, self.informer, self.health, self.spawn, self._abort_streams
        )
        records = CommitRecords(self.store, self.informer, self.state, self.events, self.spawn)
        # Decision batches and eviction requests, decided one at a time in arrival order.
        queue: asyncio.Queue[Work] = asyncio.Queue(maxsize=cfg.queue_depth)
        self.evictions = Evictions(
            cfg, self.store, self.informer, self.state, self.leadership, records, queue.put
        )
        self.reserving = Reserving(
            cfg, self.store, self.informer, self.state, self.leadership, self.events, queue.put
        )
        self.state.on_pending = self.reserving.wanted.set
        self.committer = Committer(
            cfg,
            self.store,
            self.informer,
            self.state,
            self.rules,
            self.leadership,
            records,
            self.evictions,
            queue,
            self.reserving,
        )

    def _abort_streams(self, message: str) -> int:
        return self.committer.abort_streams(message)

    def add_servicers(self, server: grpc.aio.Server) -> None:
        internal_pb2_grpc.add_BinderServicer_to_server(_BinderServicer(self), server)

    @property
    def is_leader(self) -> bool:
        return self.leadership.is_leader

    async def on_start(self) -> None:
        self.informer.start()
        await self.informer.wait_synced(self.config.sync_timeout_seconds)
        elector = self.leadership.campaign(self.address)
        self.spawn(self.committer.run(), name="binder-committer")
        self.spawn(self.reserving.sweep_forever(), name="binder-reservations")
        self.spawn(self.events.run(), name="binder-events")
        self.spawn(self.leadership.keep_health(), name="binder-health")
        self.spawn(self.leadership.resign_on(self.stop_requested), name="binder-resign")
        self.spawn(elector, name="binder-elector")
        log.info("campaigning", lease=LEASE, address=self.address)

    def sample_metrics(self) -> None:
        fence = self.leadership.fence
        leading = self.is_leader and fence is not None
        metrics.BINDER_IS_LEADER.set(1 if leading else 0)
        metrics.BINDER_LEASE_EPOCH.set(fence.epoch if leading and fence else 0)
        metrics.BINDER_QUEUED_WORK.set(self.committer.queue.qsize())

    async def on_stop(self) -> None:
        await self.leadership.release()
        await self.informer.stop()


class _BinderServicer(internal_pb2_grpc.BinderServicer):
    def __init__(self, service: BinderService) -> None:
        self._service = service

    async def Decide(self, request_iterator: Any, context: Any) -> AsyncIterator[ipb.VerdictBatch]:
        # gRPC streams the answers only from an async generator function, hence the re-yield.
        async for verdicts in self._service.committer.decide(request_iterator, context):
            yield verdicts

    async def Evict(
        self, request: ipb.EvictRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ipb.EvictResponse:
        return await self._service.evictions.evict(request, context)
