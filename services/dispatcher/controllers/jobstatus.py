"""The job status controller: the one writer of ``Job.status`` (jobs of more than one pod)."""

from __future__ import annotations

import asyncio
import time

import structlog

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.gangtimeout import (
    SCHEDULE_TIMEOUT,
    ScheduleDeadlines,
    drop_timeout_condition,
    timed_out,
    timeout_message,
)
from services.dispatcher.controllers.jobphase import (
    FINISHED_JOB_PHASES,
    JobCounts,
    derives_status,
)
from services.dispatcher.controllers.podindex import LoopTurns, PodIndex
from services.dispatcher.controllers.ticking import tick_forever
from services.dispatcher.objects import being_deleted, pods_complete
from services.events import WARNING, EventRecorder, ref
from store import CommitError, ConflictError, NotFoundError, Store, StoreError
from store.informer import Informer

log = structlog.get_logger(__name__)


def _current(job: pb.Job) -> JobCounts:
    s = job.status
    return s.phase, s.bound, s.running, s.succeeded, s.failed


# Bound on the job status controller's record of its own writes not yet seen back.
_MAX_UNSEEN_WRITES = 100_000


def _written_status(job: pb.Job) -> tuple[int, ...]:
    """The fields of a job's status that the job status controller writes."""
    s = job.status
    return (s.phase, s.bound, s.running, s.succeeded, s.failed, s.finished_ms)


class JobStatusController:
    """Keeps ``Job.status`` counts and phase (see :func:`job_status`) current, in the store, for
    jobs of more than one replica (a one-pod job's is derived when read: :func:`derives_status`).

    Jobs whose pods (or themselves) changed are recomputed every ``interval_seconds`` and the
    changed ones written with one ``update_many``, so a job is written at most once per
    interval. Writes are compare-and-set on the job's cached version; a conflict (the Binder set
    ``ever_scheduled``, the dispatcher a condition) re-reads those jobs and writes again on top
    of the fresh copies, so their fields are kept. Only phase and counts are ever changed, and
    a gang's ``Timeout`` condition when it times out.

    A waiting gang's schedule deadline is kept in a heap (``deadlines``): the tick it falls due
    brings the job back for a look, which finds it Timeout (``jobphase.job_status``), records
    why (``gangtimeout.timed_out``) and an Event; no tick scans every job for it.
    """

    def __init__(
        self,
        store: Store,
        informer: Informer,
        *,
        interval_seconds: float = 1.0,
        pods: PodIndex | None = None,
        events: EventRecorder | None = None,
        counted: asyncio.Event | None = None,
    ) -> None:
        self._store = store
        self._events = events
        self.deadlines = ScheduleDeadlines()
        self._informer = informer
        self.interval = interval_seconds
        self.pods = pods or PodIndex(informer)
        # The status this controller wrote to each job, until the update comes back through
        # the watch. That update changes nothing the status is computed from (it is what was
        # computed), so it does not bring the job back for another look: with one-pod jobs that
        # look was a second status computation per job, each reading the job's pods. Recorded
        # before the write, since the watch may deliver the update before the write's reply.
        self._written: dict[str, tuple[int, ...]] = {}
        # jobs to look at on the next tick
        self.changed_jobs = self.pods.subscribe(ignore=self._own_write, stored_status_only=True)
        # The jobs of the tick under way: their writes may be in flight (seconds, on a busy
        # store), so the reconciler does not judge them meanwhile.
        self.writing: set[str] = set()
        self.writes = 0  # update_many round trips, for tests and metrics
        # Set once the first tick has ended: every job's status counted from the view and
        # written (a restart's first tick looks at every job). Until then a job's stored status
        # is what the previous dispatcher wrote, so readers of it wait for this (the API's Get
        # and List of Jobs, ``ReadRpc``); the dispatcher starts this controller after SERVING.
        self.counted = counted if counted is not None else asyncio.Event()

    def _own_write(self, job: pb.Job) -> bool:
        return self._written.pop(job.metadata.name, None) == _written_status(job)

    async def run(self) -> None:
        await tick_forever("job status", self._informer, self.tick, self.interval)

    async def tick(self) -> None:
        self.changed_jobs.update(self.deadlines.due(int(time.time() * 1000)))
        dirty = set(self.changed_jobs)
        self.changed_jobs.clear()
        self.writing |= dirty  # the reconciler may run a tick of its own meanwhile
        try:
            await self._tick(dirty)
        finally:
            self.writing -= dirty
            # Even when it failed (the store unreachable: the readers' reads fail as well, and
            # the jobs are looked at again next tick): readers wait for one look, not forever.
            self.counted.set()

    async def _tick(self, dirty: set[str]) -> None:
        jobs: list[pb.Job] = []
        for name in dirty:
            job = self._informer.get("Job", name)
            # A job whose pods are still being created is pending, nothing of it placed (it is
            # not dispatched): recounting its growing pods every tick would only cost. The
            # update that completes it brings it back here.
            if (
                isinstance(job, pb.Job)
                and not derives_status(job)  # most jobs, with one-pod jobs: asked first
                and pods_complete(job)
                and not being_deleted(job)
            ):
                jobs.append(job)
        try:
            retry = await self._write(jobs)
            if retry:
                fresh = await self._store.get_many(pb.Job, retry)
                retry = await self._write([j for j in fresh if j is not None])
        except StoreError:
            self.changed_jobs |= dirty  # try them all again next tick
            raise
        self.changed_jobs.update(retry)

    async def _write(self, jobs: list[pb.Job]) -> list[str]:
        """Write the jobs whose status changed; returns the names that conflicted."""
        updates: list[pb.Job] = []
        now_ms = int(time.time() * 1000)
        timeouts: set[str] = set()  # the jobs that time out now
        turns = LoopTurns()  # every job of a restart's first tick: the loop served between
        for job in jobs:
            computed = await self.pods.status_of(job, now_ms, turns)
            self.deadlines.watch(job, computed[0])
            finished = computed[0] in FINISHED_JOB_PHASES
            # A job finished before finished_ms existed gets it now (its TTL counts from here).
            stamp = finished and not job.status.finished_ms
            if computed == _current(job) and not stamp:
                continue
            new = pb.Job()
            new.CopyFrom(job)
            s = new.status
            s.phase, s.bound, s.running, s.succeeded, s.failed = computed
            if stamp:
                s.finished_ms = now_ms
            elif not finished:
                s.finished_ms = 0
            if s.phase == pb.JOB_TIMEOUT and job.status.phase != pb.JOB_TIMEOUT:
                timed_out(
                    new, timeout_message(job, self.pods.outlines_of(job.metadata.name)), now_ms
                )
                timeouts.add(job.metadata.name)
            elif s.phase != pb.JOB_TIMEOUT:
                drop_timeout_condition(new)  # scheduled after all (it was under way)
            updates.append(new)
        if not updates:
            return []
        self.writes += 1
        conflicts: list[str] = []
        if len(self._written) > _MAX_UNSEEN_WRITES:
            # Left by jobs deleted before their update was seen (a relist skips it): forgetting
            # them costs at most one more look each.
            self._written.clear()
        for job in updates:
            self._written[job.metadata.name] = _written_status(job)
        for job, result in zip(updates, await self._store.update_many(updates), strict=True):
            if isinstance(result, pb.Job):
                if job.metadata.name in timeouts:
                    self._record_timeout(job)
                continue
            # Not written: any update that comes is someone else's.
            self._written.pop(job.metadata.name, None)
            if isinstance(result, ConflictError):
                conflicts.append(job.metadata.name)
            elif isinstance(result, NotFoundError | CommitError):
                continue  # deleted meanwhile
            elif isinstance(result, StoreError):
                log.error("job status write failed", job=job.metadata.name, error=str(result))
        return conflicts

    def _record_timeout(self, job: pb.Job) -> None:
        log.info("gang schedule timeout", job=job.metadata.name)
        if self._events is None:
            return
        cond = next(c for c in job.status.conditions if c.reason == SCHEDULE_TIMEOUT)
        self._events.record(
            ref("Job", job),
            SCHEDULE_TIMEOUT,
            cond.message,
            type_=WARNING,
            owner=job.metadata.owner,
        )
