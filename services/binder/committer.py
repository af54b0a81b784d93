"""The Decide streams and the one committer: every stream's batches (and every Evict request)
go through one bounded queue to a single task, which decides them one at a time in arrival
order — each batch checked against the authoritative state (``decide.py``) and what it accepts
bound in one fenced commit — and answers each stream in its order."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from placement.framework import Framework
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services import metrics
from services.binder.config import BinderConfig
from services.binder.decide import (
    CONFLICT,
    ERROR,
    NOT_LEADER,
    STALE,
    BatchPlan,
    informed_jobs,
    uniform,
)
from services.binder.evictrpc import Evictions, EvictWork
from services.binder.leadership import Leadership
from services.binder.records import CommitRecords
from services.binder.reserve import ReserveWork, Reserving
from services.binder.state import ClusterState
from store.client import Bind, Fence, Store
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
from store.informer import Informer

log = structlog.get_logger(__name__)


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
class Decision:
    stream: _Stream
    batch: ipb.DecisionBatch | None  # None: the stream half-closed; end it once answered


# What the committer decides, one at a time in arrival order.
Work = Decision | EvictWork | ReserveWork


class Committer:
    def __init__(
        self,
        config: BinderConfig,
        store: Store,
        informer: Informer,
        state: ClusterState,
        rules: Framework,
        leadership: Leadership,
        records: CommitRecords,
        evictions: Evictions,
        queue: asyncio.Queue[Work],
        reserving: Reserving | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.informer = informer
        self.state = state
        self.rules = rules
        self.leadership = leadership
        self.records = records
        self.evictions = evictions
        self.queue = queue
        self.reserving = reserving
        self._streams: set[_Stream] = set()

    # --- streams ----------------------------------------------------------------------------

    async def decide(
        self,
        requests: AsyncIterator[ipb.DecisionBatch],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[ipb.VerdictBatch]:
        fence = self.leadership.fence
        if fence is None:
            await self.leadership.refuse_as_standby(context)
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
                await self.queue.put(Decision(stream, batch))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client went away or sent garbage: the RPC is over
            log.info("decision stream ended", error=str(exc))
            stream.out.put_nowait(None)
            return
        await self.queue.put(Decision(stream, None))

    def abort_streams(self, message: str) -> int:
        """End every open stream with UNAVAILABLE (the leadership is lost); returns how many."""
        for stream in self._streams:
            stream.out.put_nowait(_Abort(grpc.StatusCode.UNAVAILABLE, message))
        return len(self._streams)

    # --- the committer ----------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            work = await self.queue.get()
            if isinstance(work, EvictWork):
                await self.evictions.run(work)
                await self.leadership.step_down_if_fenced()
                continue
            if isinstance(work, ReserveWork):
                if self.reserving is not None:
                    try:
                        await self.reserving.run(work)
                    except Exception:
                        log.exception("committing reservations failed")
                await self.leadership.step_down_if_fenced()
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
            if self.leadership.fenced_by is not None:
                await self.leadership.step_down_if_fenced()

    async def _decide_batch(self, batch: ipb.DecisionBatch, stream: _Stream) -> ipb.VerdictBatch:
        started = time.perf_counter()
        size = sum(len(u.placements) for u in batch.units)
        if size > self.config.max_batch_pods:
            return uniform(
                batch,
                ERROR,
                f"batch has {size} placements; the limit is {self.config.max_batch_pods}",
            )
        fence = await self.leadership.leading_fence(stream.epoch)
        if fence is None:
            return uniform(batch, NOT_LEADER, f"binder {self.config.name} is not the leader")
        if any(u.reservation for u in batch.units):
            return await self._decide_with_reservations(batch, stream, fence)
        # The pods and the victims they name, in one pass over the placements (each field
        # read is ~0.3 µs, and a batch of one-pod jobs holds thousands). The victims are read
        # with the pods, in the same read: the Binder keeps no bytes of a bound pod, and an
        # eviction writes the whole pod.
        named: dict[str, None] = {}
        evicting: dict[str, None] = {}
        for u in batch.units:
            for p in u.placements:
                if name := p.pod:
                    named[name] = None
                if p.victims:
                    evicting.update(dict.fromkeys(p.victims))
        names = list(named)
        victims = [v for v in evicting if v and v not in named]
        known = informed_jobs(
            batch, lambda name: self.informer.get("Job", name), self.informer.revision
        )
        to_read = list(dict.fromkeys(u.job for u in batch.units if u.job and u.job not in known))
        try:
            pods, read = await asyncio.gather(
                self.store.get_many(pb.Pod, names + victims), self.store.get_many(pb.Job, to_read)
            )
        except StoreUnavailableError as exc:
            return uniform(batch, ERROR, f"store unavailable: {exc}")
        jobs: dict[str, pb.Job | None] = {**known, **dict(zip(to_read, read, strict=True))}
        found = dict(zip(names + victims, pods, strict=True))
        plan = BatchPlan(
            batch,
            {n: found[n] for n in names},
            jobs,
            self.state,
            self.rules,
            {v: found.get(v) for v in evicting},
        )
        plan.run()
        bound = await self._commit(plan, fence)
        verdicts = plan.verdicts(bound)
        metrics.record_verdicts(
            batch,
            verdicts,
            bound.values(),
            int(time.time() * 1000),
            refused=plan.refused,
            any_victims=bool(evicting),
        )
        self.records.landings(bound.values())
        self.records.rejections(plan.refused)
        log.debug(
            "batch decided",
            shard=batch.shard,
            batch_id=batch.batch_id,
            placements=size,
            bound=len(bound),
            ms=round((time.perf_counter() - started) * 1000, 2),
        )
        return verdicts

    async def _decide_with_reservations(
        self, batch: ipb.DecisionBatch, stream: _Stream, fence: Fence
    ) -> ipb.VerdictBatch:
        """A batch that places reservations without a node: those first (committed Reserved,
        so the pods' re-check below counts their holds), then its pods' units as ever; one
        verdict batch for both."""
        placing = [u for u in batch.units if u.reservation]
        placed: Sequence[ipb.PodVerdict]
        if self.reserving is None:
            placed = uniform(
                ipb.DecisionBatch(units=placing), ERROR, "this binder does not place reservations"
            ).verdicts
        else:
            placed = await self.reserving.place(placing, self.rules, fence)
        rest = ipb.DecisionBatch(shard=batch.shard, batch_id=batch.batch_id)
        rest.units.extend(u for u in batch.units if not u.reservation)
        out = (
            await self._decide_batch(rest, stream)
            if rest.units
            else ipb.VerdictBatch(batch_id=batch.batch_id)
        )
        out.verdicts.extend(placed)
        return out

    async def _commit(self, plan: BatchPlan, fence: Fence) -> dict[str, pb.Pod]:
        """Commit the plan's accepted pods in one fenced transaction; on a rejected op drop its
        pod (or refresh its job) and retry the rest. Returns the pods bound."""
        for _ in range(self.config.commit_retries + 1):
            if self.leadership.fence is not fence:
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
                self.leadership.fenced_by = exc
                plan.reject_all(NOT_LEADER, f"binder {self.config.name} was deposed: {exc}")
                return {}
            except CommitError as exc:
                kind, name = targets[exc.index]
                if kind == "Pod":
                    code, reason = _verdict_for(exc.cause)
                    plan.drop(name, code, reason)
                elif kind == "Reservation" and isinstance(exc.cause, NotFoundError):
                    # Gone since this view (expired, released): its room is free; forget it.
                    gone = plan.hold_gone(name)
                    if gone is not None:
                        self.state.consumed([gone])
                elif kind == "Reservation":
                    plan.drop(name, CONFLICT, f"its reservation could not be consumed: {exc.cause}")
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
            self.records.evictions(ops)
            self.records.consumptions(plan.consumed())
            return {
                pod.metadata.name: pod
                for i, pod in self.records.written(ops)
                if isinstance(ops[i], Bind)
            }
        plan.reject_all(CONFLICT, f"gave up after {self.config.commit_retries + 1} commit attempts")
        return {}

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
