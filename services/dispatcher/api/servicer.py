"""The public API (`godel.v1.Dispatcher`), composed of one object per RPC group: Submit
(``submit.py``), Apply (``apply.py``), Get and List (``reads.py``), Watch (``watch.py``),
Explain (``explain.py``), Delete (``delete.py``), Drain (``drain.py``), RetryJob (``retry.py``).

Writes are batched per request: a submission is one pipelined round trip of per-job atomic
commits, an Apply is one atomic commit of every valid object. Reads see the caller's own writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from protos.godel.v1 import api_pb2, api_pb2_grpc
from services.dispatcher.api import listing
from services.dispatcher.api.admission import AdmissionLimits
from services.dispatcher.api.apply import ApplyRpc
from services.dispatcher.api.delete import DeleteRpc, pods_of_job_by_scan
from services.dispatcher.api.drain import DrainRpc
from services.dispatcher.api.explain import ExplainRpc
from services.dispatcher.api.reads import ReadRpc
from services.dispatcher.api.retry import RetryRpc
from services.dispatcher.api.submit import SubmitRpc
from services.dispatcher.api.watch import WatchRpc
from services.dispatcher.controllers.creation import PodCreator
from services.dispatcher.controllers.deletion import JobDeleter
from services.dispatcher.controllers.podindex import PodIndex
from services.dispatcher.dispatching.dispatch import UnitDispatcher
from store import Store


class DispatcherServicer(api_pb2_grpc.DispatcherServicer):
    def __init__(
        self,
        store: Store,
        core: UnitDispatcher,
        pods: PodIndex,
        *,
        limits: AdmissionLimits,
        max_pending_pods: int = 200_000,
        creator: PodCreator | None = None,
        deleter: JobDeleter | None = None,
        job_statuses_counted: asyncio.Event | None = None,
    ) -> None:
        # A one-pod job's status is derived from its pod when read (controllers.jobphase.as_read).
        self.pods = pods
        self.snapshots = listing.ListingSnapshots()  # of paged Lists, for their next pages
        # Creates big jobs' pods chunk by chunk; the reconciler resumes what it left unfinished.
        self.creator = creator or PodCreator(store)
        # Deletes jobs with their pods, big ones chunk by chunk; the reconciler resumes them.
        self.deleter = deleter or JobDeleter(store, pods_of_job_by_scan(core.informer))
        self.submitting = SubmitRpc(
            store,
            core,
            self.creator,
            limits=limits,
            max_pending_pods=max_pending_pods,
            pods=pods,
        )
        self.applying = ApplyRpc(store, core.informer, self.submitting, pods)
        # A Job is read once the job status controller's first tick is over (``ReadRpc``).
        self.reading = ReadRpc(store, core, pods, self.snapshots, job_statuses_counted)
        self.watching = WatchRpc(store, core.informer, pods)
        self.explaining = ExplainRpc(store, core)
        self.deleting = DeleteRpc(store, core, self.deleter, pods)
        self.draining = DrainRpc(store, core)
        self.retrying = RetryRpc(store)

    async def Submit(self, request: api_pb2.SubmitRequest, context: Any) -> api_pb2.SubmitResponse:
        return await self.submitting.Submit(request, context)

    async def Apply(self, request: api_pb2.ApplyRequest, context: Any) -> api_pb2.ApplyResponse:
        return await self.applying.Apply(request, context)

    async def Get(self, request: api_pb2.GetRequest, context: Any) -> api_pb2.Object:
        return await self.reading.Get(request, context)

    async def List(self, request: api_pb2.ListRequest, context: Any) -> api_pb2.ListResponse:
        return await self.reading.List(request, context)

    async def Watch(
        self, request: api_pb2.WatchRequest, context: Any
    ) -> AsyncIterator[api_pb2.WatchEvent]:
        # Closed with this stream: the store's watch ends when the client goes.
        async with aclosing(self.watching.Watch(request, context)) as events:
            async for event in events:
                yield event

    async def Explain(
        self, request: api_pb2.ExplainRequest, context: Any
    ) -> api_pb2.ExplainResponse:
        return await self.explaining.Explain(request, context)

    async def Delete(self, request: api_pb2.DeleteRequest, context: Any) -> api_pb2.DeleteResponse:
        return await self.deleting.Delete(request, context)

    async def Drain(self, request: api_pb2.DrainRequest, context: Any) -> api_pb2.DrainResponse:
        return await self.draining.Drain(request, context)

    async def RetryJob(
        self, request: api_pb2.RetryJobRequest, context: Any
    ) -> api_pb2.RetryJobResponse:
        return await self.retrying.RetryJob(request, context)
