"""The Binder's ``Evict`` RPC: a request queued with the decision batches (so it is decided one
at a time with them, against the same view), judged against its caller's identity
(``evictrules.py``), then all of its live pods evicted in one fenced commit, or none (the plan
is ``evict.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from foundation.tls import Identity
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.binder import evictrules
from services.binder.config import BinderConfig
from services.binder.evict import EvictPlan
from services.binder.leadership import Leadership
from services.binder.records import CommitRecords
from services.binder.state import ClusterState
from services.runtime.auth import caller
from store.client import Create, Store
from store.errors import CommitError, FencedError, StoreError, StoreUnavailableError
from store.informer import Informer

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class EvictWork:
    request: ipb.EvictRequest
    epoch: int
    done: asyncio.Future[ipb.EvictResponse]
    caller: Identity | None
    """Who asks, from its certificate (None: insecure mode)."""


class EvictRefused(Exception):
    """The caller may not ask this eviction; the message names the rule (``evictrules``)."""


class Evictions:
    """``evict`` answers the RPC once the committer has run its ``EvictWork`` (``run``)."""

    def __init__(
        self,
        config: BinderConfig,
        store: Store,
        informer: Informer,
        state: ClusterState,
        leadership: Leadership,
        records: CommitRecords,
        enqueue: Callable[[EvictWork], Awaitable[None]],
    ) -> None:
        self.config = config
        self.store = store
        self.informer = informer
        self.state = state
        self.leadership = leadership
        self.records = records
        self.enqueue = enqueue

    async def evict(
        self, request: ipb.EvictRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ipb.EvictResponse:
        fence = self.leadership.fence
        if fence is None or not self.leadership.ready.is_set():
            await self.leadership.refuse_as_standby(context)
        assert fence is not None
        if len(request.pods) > self.config.max_batch_pods:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(request.pods)} pods in one request; the limit is "
                f"{self.config.max_batch_pods}",
            )
        if not request.reason:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "reason: required")
        identity = caller()
        if identity is not None and not request.requester:
            request.requester = evictrules.requester_of(identity)
        done: asyncio.Future[ipb.EvictResponse] = asyncio.get_running_loop().create_future()
        await self.enqueue(EvictWork(request, fence.epoch, done, identity))
        try:
            return await done
        except EvictRefused as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except StoreUnavailableError as exc:
            # The outcome is unknown: the caller asks again, and finds the pods gone if it applied.
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {exc}")
        except StoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        raise AssertionError("unreachable: abort raises")

    async def run(self, work: EvictWork) -> None:
        """The committer's turn for one request: its answer (or its error) to the waiting RPC."""
        try:
            response = await self._evict(work)
        except EvictRefused as exc:
            log.warning("eviction refused", requester=work.request.requester, why=str(exc))
            response = None
            if not work.done.done():
                work.done.set_exception(exc)
        except Exception as exc:
            log.exception("evicting failed", requester=work.request.requester)
            response = None
            if not work.done.done():
                work.done.set_exception(exc)
        if response is not None and not work.done.done():
            work.done.set_result(response)

    async def _evict(self, work: EvictWork) -> ipb.EvictResponse:
        """All of the request's live pods evicted in one fenced commit, or none (see evict.py).
        The request's pods are read from the store (one read an attempt); a pod that changed
        under the commit is read again and re-judged, the caller's rights included, once the
        informer has caught up (the records the budgets are counted from)."""
        request, epoch = work.request, work.epoch
        for _ in range(self.config.commit_retries + 1):
            fence = self.leadership.fence
            if fence is None or fence.epoch != epoch:
                raise StoreError(f"binder {self.config.name} lost the leadership")
            names = list(dict.fromkeys(ref.name for ref in request.pods))
            pods = dict(zip(names, await self.store.get_many(pb.Pod, names), strict=True))
            why = evictrules.refusal(work.caller, request, pods.get)
            if why is not None:
                raise EvictRefused(why)
            plan = EvictPlan(request, pods, self.state, int(time.time() * 1000))
            ops, targets = plan.ops()
            if plan.refused or not ops:
                return plan.response()
            try:
                await self.store.commit(ops, fence=fence)
            except FencedError as exc:
                self.leadership.fenced_by = exc
                raise
            except CommitError as exc:
                log.info("eviction raced a change; re-reading", pod=targets[exc.index])
                await self.informer.wait_for_revision(
                    await self.store.revision(), self.config.sync_timeout_seconds
                )
                continue
            replacements = {
                targets[i]: pod.metadata.name
                for i, pod in self.records.written(ops)
                if isinstance(ops[i], Create)
            }
            plan.evicted(replacements)
            self.records.kept(plan.kept)
            self.records.evictions(ops)
            log.info(
                "evicted",
                requester=request.requester,
                reason=request.reason,
                movement=request.movement,
                pods=len(plan.live),
            )
            return plan.response()
        raise StoreError(f"gave up after {self.config.commit_retries + 1} commit attempts")
