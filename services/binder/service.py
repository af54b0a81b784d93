"""The binder: the leader-elected serialisation point that checks and commits bindings.

One instance holds the store lease ``binder``; the others are warm standbys (their informer runs,
so a new leader only has to catch up, not to list). Shards stream DecisionBatches to the leader;
every stream's batches go through one queue to a single committer task, which checks each batch
against the authoritative state (see ``decide.py``) and binds what it accepts in one fenced commit.
See README.md for the invariants.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health_pb2

from placement.rules import hard_rules
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services import events, metrics, movements
from services.binder.decide import (
    BOUND,
    CONFLICT,
    ERROR,
    NOT_LEADER,
    STALE,
    BatchPlan,
    informed_jobs,
    uniform,
)
from services.binder.evict import EvictPlan
from services.binder.state import ClusterState
from services.eviction import EVICTION_REASONS
from services.peers.binder import LEADER_METADATA_KEY, LEASE
from services.runtime import Service, ServiceConfig
from services.runtime.config import ConfigError, option
from store.client import Bind, Create, Fence, Op, Release
from store.errors import (
    AlreadyBoundError,
    CommitError,
    ConflictError,
    FencedError,
    InsufficientCapacityError,
    NotFoundError,
    StoreError,
    StoreUnavailableError,
)
from store.informer import Handlers, Informer
from store.lease import LeaderElector

log = structlog.get_logger(__name__)

BINDER_SERVICE = ipb.DESCRIPTOR.services_by_name["Binder"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass(frozen=True)
class BinderConfig(ServiceConfig):
    """Binder settings."""

    lease_ms: int = field(
        default=3000,
        metadata=option("leader lease duration; a dead leader is replaced after this", minimum=100),
    )
    renew_ms: int = field(
        default=500,
        metadata=option("how often the leader renews (at most half of lease_ms)", minimum=10),
    )
    queue_depth: int = field(
        default=256,
        metadata=option("decision batches queued for the committer before streams wait", minimum=1),
    )
    max_batch_pods: int = field(
        default=20000,
        metadata=option("placements accepted in one DecisionBatch", minimum=1),
    )
    commit_retries: int = field(
        default=16,
        metadata=option("commit attempts per batch after the store rejects one pod", minimum=0),
    )
    sync_timeout_seconds: float = field(
        default=30.0,
        metadata=option("how long to wait for the informer to list or catch up", minimum=0.1),
    )

    def __post_init__(self) -> None:
        if self.renew_ms * 2 > self.lease_ms:
            raise ConfigError(
                f"renew_ms ({self.renew_ms}) must be at most half of lease_ms ({self.lease_ms})"
            )


@dataclass(frozen=True, slots=True)
class _Abort:
    code: grpc.StatusCode
    message: str


class _Stream:
    """One open Decide stream: answers (or an abort, or None = done) in order."""

    __slots__ = ("epoch", "out")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.out: asyncio.Queue[ipb.VerdictBatch | _Abort | None] = asyncio.Queue()


@dataclass(slots=True)
class _Work:
    stream: _Stream
    batch: ipb.DecisionBatch | None  # None: the stream half-closed; end it once answered


@dataclass(slots=True)
class _EvictWork:
    request: ipb.EvictRequest
    epoch: int
    done: asyncio.Future[ipb.EvictResponse]


class BinderService(Service[BinderConfig]):
    component = "binder"
    config_class = BinderConfig
    grpc_services = (BINDER_SERVICE,)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rules = hard_rules()
        self.informer = Informer(self.store, ["Node", "Pod", "Job", "DisruptionBudget"])
        self.state = ClusterState(self.informer.objects)
        self.informer.add_handlers(
            Handlers(self.state.on_add, self.state.on_update, self.state.on_delete)
        )
        self.elector: LeaderElector | None = None
        self._fence: Fence | None = None
        self._ready = asyncio.Event()  # leading and caught up with the store
        self._role_changed = asyncio.Event()
        # Decision batches and eviction requests, decided one at a time in arrival order.
        self._queue: asyncio.Queue[_Work | _EvictWork] = asyncio.Queue(
            maxsize=self.config.queue_depth
        )
        self._streams: set[_Stream] = set()
        self._fenced_by: FencedError | None = None
        # Preemptions, evictions and bind rejections, written in batches off the commit path.
        self.events = events.EventRecorder(self.store, self.config.name)

    # --- lifecycle --------------------------------------------------------------------------

    def add_servicers(self, server: grpc.aio.Server) -> None:
        internal_pb2_grpc.add_BinderServicer_to_server(_BinderServicer(self), server)

    @property
    def is_leader(self) -> bool:
        return self._fence is not None and self._ready.is_set()

    async def on_start(self) -> None:
        self.informer.start()
        await self.informer.wait_synced(self.config.sync_timeout_seconds)
        self.elector = LeaderElector(
            self.store,
            LEASE,
            self.config.name,
            address=self.address,
            lease_ms=self.config.lease_ms,
            renew_every_ms=self.config.renew_ms,
            retry_every_ms=self.config.renew_ms,
            on_elected=self._on_elected,
            on_deposed=self._on_deposed,
        )
        self.spawn(self._commit_loop(), name="binder-committer")
        self.spawn(self.events.run(), name="binder-events")
        self.spawn(self._health_loop(), name="binder-health")
        self.spawn(self._resign_on_stop(), name="binder-resign")
        self.spawn(self.elector.run(), name="binder-elector")
        log.info("campaigning", lease=LEASE, address=self.address)

    def sample_metrics(self) -> None:
        leading = self.is_leader and self._fence is not None
        metrics.BINDER_IS_LEADER.set(1 if leading else 0)
        metrics.BINDER_LEASE_EPOCH.set(self._fence.epoch if leading and self._fence else 0)
        metrics.BINDER_QUEUED_WORK.set(self._queue.qsize())

    async def on_stop(self) -> None:
        if self.elector is not None:
            await self.elector.stop(release=True)
        await self.informer.stop()

    async def _resign_on_stop(self) -> None:
        # Release the lease as the stop begins, not after the gRPC grace: a standby takes over
        # at once and open streams end now instead of holding the shutdown.
        await self.stop_requested.wait()
        self._step_down("shutting down")
        if self.elector is not None:
            await self.elector.stop(release=True)

    # --- leadership -------------------------------------------------------------------------

    async def _on_elected(self, fence: Fence) -> None:
        self._fence = fence
        self._ready.clear()
        self._role_changed.set()
        # Not awaited here: the elector must get back to renewing while we catch up.
        self.spawn(self._catch_up(fence), name="binder-catch-up")

    async def _catch_up(self, fence: Fence) -> None:
        """Accept decisions only once the view holds every write made before this epoch (the
        previous leader's binds included; fencing guarantees none can land after)."""
        while self._fence is fence:
            try:
                revision = await self.store.revision()
                await self.informer.wait_for_revision(revision, self.config.sync_timeout_seconds)
            except (StoreUnavailableError, TimeoutError) as exc:
                log.warning("leader catch-up failed; retrying", error=repr(exc))
                await asyncio.sleep(self.config.renew_ms / 1000)
                continue
            if self._fence is fence:
                self._ready.set()
                self._role_changed.set()
                log.info("leading", epoch=fence.epoch, revision=revision, address=self.address)
            return

    async def _on_deposed(self, fence: Fence) -> None:
        self._step_down("lease lost", fence)

    def _step_down(self, reason: str, fence: Fence | None = None) -> None:
        """Stop committing at once and end open streams so shards look the leader up again."""
        if self._fence is None or (fence is not None and fence != self._fence):
            return
        epoch = self._fence.epoch
        self._fence = None
        self._ready.clear()
        self._role_changed.set()
        message = f"binder {self.config.name} is no longer the leader ({reason})"
        for stream in self._streams:
            stream.out.put_nowait(_Abort(grpc.StatusCode.UNAVAILABLE, message))
        log.warning("stepped down", epoch=epoch, reason=reason, open_streams=len(self._streams))

    async def _fenced(self, exc: FencedError) -> None:
        """The store refused our epoch: step down now, then campaign afresh."""
        self._step_down(f"fenced: {exc}")
        if self.elector is not None:
            await self.elector.step_down(f"fenced: {exc}")

    async def _health_loop(self) -> None:
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

    # --- streams ----------------------------------------------------------------------------

    async def decide(
        self,
        requests: AsyncIterator[ipb.DecisionBatch],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[ipb.VerdictBatch]:
        fence = self._fence
        if fence is None:
            await self._refuse_as_standby(context)
            return
        stream = _Stream(fence.epoch)
        self._streams.add(stream)
        reader = asyncio.create_task(self._read(requests, stream), name="binder-stream-reader")
        try:
            while True:
                item = await stream.out.get()
                if item is None:
                    return
                if isinstance(item, _Abort):
                    await context.abort(item.code, item.message)
                    return
                yield item
        finally:
            self._streams.discard(stream)
            reader.cancel()

    async def _read(self, requests: AsyncIterator[ipb.DecisionBatch], stream: _Stream) -> None:
        """Decode a stream's batches into the committer's queue (streams read concurrently)."""
        try:
            async for batch in requests:
                await self._queue.put(_Work(stream, batch))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client went away or sent garbage: the RPC is over
            log.info("decision stream ended", error=str(exc))
            stream.out.put_nowait(None)
            return
        await self._queue.put(_Work(stream, None))

    # --- the committer ----------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        while True:
            work = await self._queue.get()
            if isinstance(work, _EvictWork):
                await self._evict_work(work)
                continue
            if work.batch is None:
                work.stream.out.put_nowait(None)
                continue
            try:
                verdicts = await self._decide_batch(work.batch, work.stream)
            except Exception as exc:
                # A bug on one batch must not take the leader down for every shard.
                log.exception("deciding a batch failed", batch_id=work.batch.batch_id)
                verdicts = uniform(work.batch, ERROR, f"binder internal error: {exc}")
            work.stream.out.put_nowait(verdicts)
            if self._fenced_by is not None:
                fenced, self._fenced_by = self._fenced_by, None
                await self._fenced(fenced)

    async def _leading_fence(self, stream: _Stream) -> Fence | None:
        while True:
            fence = self._fence
            if fence is None or fence.epoch != stream.epoch:
                return None
            if self._ready.is_set():
                return fence
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), 0.1)

    async def _decide_batch(self, batch: ipb.DecisionBatch, stream: _Stream) -> ipb.VerdictBatch:
        started = time.perf_counter()
        size = sum(len(u.placements) for u in batch.units)
        if size > self.config.max_batch_pods:
            return uniform(
                batch,
                ERROR,
                f"batch has {size} placements; the limit is {self.config.max_batch_pods}",
            )
        fence = await self._leading_fence(stream)
        if fence is None:
            return uniform(batch, NOT_LEADER, f"binder {self.config.name} is not the leader")
        names = list(dict.fromkeys(p.pod for u in batch.units for p in u.placements if p.pod))
        known = informed_jobs(
            batch, lambda name: self.informer.get("Job", name), self.informer.revision
        )
        to_read = list(dict.fromkeys(u.job for u in batch.units if u.job and u.job not in known))
        try:
            pods, read = await asyncio.gather(
                self.store.get_many(pb.Pod, names), self.store.get_many(pb.Job, to_read)
            )
        except StoreUnavailableError as exc:
            return uniform(batch, ERROR, f"store unavailable: {exc}")
        jobs: dict[str, pb.Job | None] = {**known, **dict(zip(to_read, read, strict=True))}
        plan = BatchPlan(batch, dict(zip(names, pods, strict=True)), jobs, self.state, self.rules)
        plan.run()
        bound = await self._commit(plan, fence)
        verdicts = plan.verdicts(bound)
        metrics.record_verdicts(batch, verdicts, bound.values(), int(time.time() * 1000))
        self._record_landings(bound.values())
        self._record_rejections(verdicts)
        log.debug(
            "batch decided",
            shard=batch.shard,
            batch_id=batch.batch_id,
            placements=size,
            bound=len(bound),
            ms=round((time.perf_counter() - started) * 1000, 2),
        )
        return verdicts

    async def _commit(self, plan: BatchPlan, fence: Fence) -> dict[str, pb.Pod]:
        """Commit the plan's accepted pods in one fenced transaction; on a rejected op drop its
        pod (or refresh its job) and retry the rest. Returns the pods bound."""
        for _ in range(self.config.commit_retries + 1):
            if self._fence is not fence:
                plan.reject_all(NOT_LEADER, f"binder {self.config.name} lost the leadership")
                return {}
            ops, targets = plan.ops()
            if not ops:
                return {}
            try:
                await self.store.commit(ops, fence=fence)
            except FencedError as exc:
                # Stop committing now; the step-down (which aborts the streams) waits until this
                # batch's NOT_LEADER answer is queued, so the shard learns why.
                self._fenced_by = exc
                plan.reject_all(NOT_LEADER, f"binder {self.config.name} was deposed: {exc}")
                return {}
            except CommitError as exc:
                kind, name = targets[exc.index]
                if kind == "Pod":
                    code, reason = _verdict_for(exc.cause)
                    plan.drop(name, code, reason)
                elif kind == "Victim":
                    # A victim changed since this view (e.g. it started running): the shard
                    # decides again against a view that shows the change.
                    plan.drop(name, CONFLICT, f"a victim changed: {exc.cause}")
                else:
                    await self._refresh_job(plan, name)
                continue
            except StoreUnavailableError as exc:
                # The outcome is unknown; a retried decision would find its pods bound (STALE).
                plan.reject_all(ERROR, f"store unavailable; the bind may or may not apply: {exc}")
                return {}
            except StoreError as exc:
                plan.reject_all(ERROR, f"store rejected the batch: {exc}")
                return {}
            self._record_evictions(ops)
            return {
                pod.metadata.name: pod
                for i, pod in self._record_written(ops)
                if isinstance(ops[i], Bind)
            }
        plan.reject_all(CONFLICT, f"gave up after {self.config.commit_retries + 1} commit attempts")
        return {}

    def _record_written(self, ops: Sequence[Op]) -> list[tuple[int, pb.Pod]]:
        """Account each pod a committed batch of ``ops`` wrote (bound, evicted or created) in the
        binder's state, unless the informer already shows that write; returns (the index of its
        op, the pod) for each, in op order."""
        written_pods: list[tuple[int, pb.Pod]] = []
        for i, op in enumerate(ops):
            written = op.obj if isinstance(op, Create) else getattr(op, "pod", None)
            if not isinstance(written, pb.Pod):
                continue
            seen = self.informer.get(pb.Pod, written.metadata.name)
            seen_rv = seen.metadata.resource_version if seen is not None else 0
            self.state.record_written(written, seen_rv)
            written_pods.append((i, written))
        return written_pods

    def _record_evictions(self, ops: Iterable[Op]) -> None:
        """An event per pod a commit evicted (a preemption's victims, a rescheduling's or a
        drain's pods): its reason and message, the preemptor or the node it left."""
        for op in ops:
            if not isinstance(op, Release) or op.pod.status.reason not in EVICTION_REASONS:
                continue
            pod = op.pod
            related = (
                events.ref("Pod", name=pod.status.preempted_by)
                if pod.status.preempted_by
                else events.ref("Node", name=pod.spec.node_name)
            )
            self.events.record(
                events.ref("Pod", pod),
                pod.status.reason,
                pod.status.message,
                type_=events.WARNING,
                related=related,
            )

    def _record_rejections(self, verdicts: ipb.VerdictBatch) -> None:
        """An event per pod the Binder refused to bind, with why. A leadership change, or a
        pod that changed or went since the decision (STALE), is no news about it: not
        recorded."""
        for verdict in verdicts.verdicts:
            if verdict.code in (BOUND, NOT_LEADER, STALE, ipb.VERDICT_UNSPECIFIED):
                continue
            self.events.record(
                events.ref("Pod", name=verdict.pod),
                events.BIND_REJECTED,
                f"{ipb.VerdictCode.Name(verdict.code)} on {verdict.node or 'no node'}: "
                f"{verdict.reason}",
                type_=events.WARNING,
                related=events.ref("Node", name=verdict.node) if verdict.node else None,
            )

    def _record_landings(self, bound: Iterable[pb.Pod]) -> None:
        """Replacements of a Movement's jobs that bound: recorded on the Movement (actual on a
        recommended node, else mismatched) after the commit, off the committer's path — the
        record informs the rescheduler's failure ratio, it does not gate the bind."""
        landed: dict[str, list[pb.Pod]] = defaultdict(list)
        for pod in bound:
            if pod.status.movement:
                landed[pod.status.movement].append(pod)
        for movement, pods in landed.items():
            self.spawn(self._record_landing(movement, pods), name=f"binder-landing-{movement}")

    async def _record_landing(self, movement: str, pods: list[pb.Pod]) -> None:
        try:
            await movements.change(self.store, movement, movements.record_landing(pods))
        except StoreError as exc:
            log.warning("recording landings failed", movement=movement, error=str(exc))

    # --- evictions --------------------------------------------------------------------------

    async def evict(
        self, request: ipb.EvictRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ipb.EvictResponse:
        fence = self._fence
        if fence is None or not self._ready.is_set():
            await self._refuse_as_standby(context)
        assert fence is not None
        if len(request.pods) > self.config.max_batch_pods:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(request.pods)} pods in one request; the limit is "
                f"{self.config.max_batch_pods}",
            )
        if not request.reason:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "reason: required")
        done: asyncio.Future[ipb.EvictResponse] = asyncio.get_running_loop().create_future()
        await self._queue.put(_EvictWork(request, fence.epoch, done))
        try:
            return await done
        except StoreUnavailableError as exc:
            # The outcome is unknown: the caller asks again, and finds the pods gone if it applied.
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {exc}")
        except StoreError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        raise AssertionError("unreachable: abort raises")

    async def _evict_work(self, work: _EvictWork) -> None:
        try:
            response = await self._evict(work.request, work.epoch)
        except Exception as exc:
            log.exception("evicting failed", requester=work.request.requester)
            response = None
            if not work.done.done():
                work.done.set_exception(exc)
        if response is not None and not work.done.done():
            work.done.set_result(response)
        if self._fenced_by is not None:
            fenced, self._fenced_by = self._fenced_by, None
            await self._fenced(fenced)

    async def _evict(self, request: ipb.EvictRequest, epoch: int) -> ipb.EvictResponse:
        """All of the request's live pods evicted in one fenced commit, or none (see evict.py).
        A pod that changed under the commit is seen again through the informer and re-judged."""
        for _ in range(self.config.commit_retries + 1):
            fence = self._fence
            if fence is None or fence.epoch != epoch:
                raise StoreError(f"binder {self.config.name} lost the leadership")
            plan = EvictPlan(request, self.state, int(time.time() * 1000))
            ops, targets = plan.ops()
            if plan.refused or not ops:
                return plan.response()
            try:
                await self.store.commit(ops, fence=fence)
            except FencedError as exc:
                self._fenced_by = exc
                raise
            except CommitError as exc:
                log.info("eviction raced a change; re-reading", pod=targets[exc.index])
                await self.informer.wait_for_revision(
                    await self.store.revision(), self.config.sync_timeout_seconds
                )
                continue
            replacements = {
                targets[i]: pod.metadata.name
                for i, pod in self._record_written(ops)
                if isinstance(ops[i], Create)
            }
            plan.evicted(replacements)
            self._record_evictions(ops)
            log.info(
                "evicted",
                requester=request.requester,
                reason=request.reason,
                movement=request.movement,
                pods=len(plan.live),
            )
            return plan.response()
        raise StoreError(f"gave up after {self.config.commit_retries + 1} commit attempts")

    async def _refuse_as_standby(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
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

    async def _refresh_job(self, plan: BatchPlan, name: str) -> None:
        """The job changed under us (e.g. its status counts): re-read it for the next attempt."""
        try:
            plan.jobs[name] = await self.store.get(pb.Job, name)
        except NotFoundError:
            plan.drop_job(name, STALE, f"job {name!r} was deleted")


def _verdict_for(cause: StoreError) -> tuple[ipb.VerdictCode.ValueType, str]:
    if isinstance(cause, AlreadyBoundError | ConflictError):
        return STALE, str(cause)
    if isinstance(cause, NotFoundError):
        return (CONFLICT if cause.kind == "Node" else STALE), str(cause)
    if isinstance(cause, InsufficientCapacityError):
        return CONFLICT, str(cause)
    return ERROR, str(cause)


class _BinderServicer(internal_pb2_grpc.BinderServicer):
    def __init__(self, service: BinderService) -> None:
        self._service = service

    async def Decide(self, request_iterator: Any, context: Any) -> AsyncIterator[ipb.VerdictBatch]:
        # gRPC streams the answers only from an async generator function, hence the re-yield.
        async for verdicts in self._service.decide(request_iterator, context):
            yield verdicts

    async def Evict(
        self, request: ipb.EvictRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ipb.EvictResponse:
        return await self._service.evict(request, context)
