"""Finished jobs do not pile up: a job that Succeeded or Failed is deleted with its pods once its
``spec.ttl_seconds_after_finished`` (else the cluster default, ``--finished-job-ttl-seconds``)
has passed since ``status.finished_ms`` (a one-pod job's status is derived: when its pod
finished).

Off the hot path and in batches: a heap of expiry times is kept from informer events (no scan of
every job), and each tick deletes at most ``batch_jobs`` due jobs, each job with all its pods in
one commit (as the Delete RPC does) and the commits pipelined in one ``commit_many``; a job too
big for one store script goes through the Delete RPC's ``JobDeleter``, in chunks. A job that
changed meanwhile, or whose pods the view did not know yet, fails its own commit only; it is
looked at again at the next tick.
"""

from __future__ import annotations

import heapq
import time

import structlog
from google.protobuf.message import Message

from placement.claims import TERMINAL_PHASES
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.deletion import JobDeleter
from services.dispatcher.controllers.jobphase import FINISHED_JOB_PHASES, derives_status
from services.dispatcher.controllers.podindex import PodIndex
from services.dispatcher.controllers.ticking import tick_forever
from store import Store
from store.client import Delete, Op
from store.errors import StoreError
from store.informer import Handlers, Informer

log = structlog.get_logger(__name__)


class FinishedJobCollector:
    def __init__(
        self,
        store: Store,
        informer: Informer,
        pods: PodIndex,
        *,
        deleter: JobDeleter | None = None,
        default_ttl_seconds: int | None,
        interval_seconds: float = 5.0,
        batch_jobs: int = 500,
    ) -> None:
        self._store = store
        self._informer = informer
        self._pods = pods  # shared with the job status controller (one index, not another)
        self._deleter = deleter or JobDeleter(store, pods.by_job.get)
        self.default_ttl_seconds = default_ttl_seconds
        self.interval = interval_seconds
        self.batch_jobs = batch_jobs
        self._due: list[tuple[int, str]] = []  # (expiry ms, job), a heap; stale entries skipped
        self.deleted_jobs = 0  # for tests and metrics
        self.deleted_pods = 0
        informer.add_handlers(
            Handlers(
                on_add=self._seen,
                on_update=self._updated,
                kinds=frozenset({"Job", "Pod"}),
                # A listed pod on a node is not handed over: every listed job is, with its
                # status as read from its pods' records (``_seen``), finished ones too.
                refused_at_listing=False,
            )
        )

    def expiry_ms(self, job: pb.Job) -> int | None:
        """When the finished job goes; None while it runs or when it is kept for good. ``job``
        as read (``PodIndex.job_as_read``: a one-pod job's status derived from its pod)."""
        if job.status.phase not in FINISHED_JOB_PHASES or not job.status.finished_ms:
            return None
        if job.spec.HasField("ttl_seconds_after_finished"):
            ttl: int | None = job.spec.ttl_seconds_after_finished
        else:
            ttl = self.default_ttl_seconds
        if ttl is None or ttl < 0:
            return None
        return job.status.finished_ms + ttl * 1000

    def _updated(self, kind: str, _old: Message, new: Message) -> None:
        if type(new) is pb.Pod and new.status.phase not in TERMINAL_PHASES:
            return  # most pod updates (bound, running): nothing finished, asked first
        self._seen(kind, new)

    def _seen(self, kind: str, obj: Message) -> None:
        if isinstance(obj, pb.Pod):
            # A one-pod job finishes when its pod does, with no update of its own (its status
            # is derived); the pods of other jobs finish theirs through its status update.
            if obj.status.phase not in TERMINAL_PHASES:
                return
            job = self._informer.get("Job", obj.spec.job)
            if isinstance(job, pb.Job) and derives_status(job):
                self._push(self._pods.job_as_read(job, newer=obj))
        elif isinstance(obj, pb.Job):
            if derives_status(obj) and obj.metadata.name not in self._pods.by_job:
                return  # no pod yet (a job just created): its pod's finish brings it here
            self._push(self._pods.job_as_read(obj))

    def _push(self, job: pb.Job) -> None:
        """Remember when the job (as read) goes, if it is finished and has a TTL."""
        expiry = self.expiry_ms(job)
        if expiry is not None:
            heapq.heappush(self._due, (expiry, job.metadata.name))

    async def run(self) -> None:
        await tick_forever("finished jobs", self._informer, self.tick, self.interval)

    async def tick(self, now_ms: int | None = None) -> None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        jobs: dict[str, pb.Job] = {}
        while self._due and self._due[0][0] <= now and len(jobs) < self.batch_jobs:
            _, name = heapq.heappop(self._due)
            job = self._informer.get("Job", name)
            if not isinstance(job, pb.Job) or name in jobs:
                continue  # gone already, or a duplicate entry
            expiry = self.expiry_ms(self._pods.job_as_read(job))
            if expiry is None:
                continue  # running again, or its TTL was removed
            if expiry > now:
                heapq.heappush(self._due, (expiry, name))  # its TTL was raised
                continue
            jobs[name] = job
        if not jobs:
            return
        big = {
            name: job
            for name, job in jobs.items()
            if self._pods.by_job.count(name) + 1 > self._deleter.chunk_ops
        }
        for name in big:
            del jobs[name]
        commits: list[list[Op]] = []
        for name, job in jobs.items():
            ops: list[Op] = [Delete("Job", name, job.metadata.resource_version)]
            ops += [Delete("Pod", pod) for pod in self._pods.by_job.get(name)]
            commits.append(ops)
        for name, job in big.items():
            try:
                gone = await self._deleter.delete(job)
            except StoreError as exc:
                log.debug("finished job not deleted yet", job=name, error=str(exc))
                heapq.heappush(self._due, (now, name))  # due: tried again next tick
                continue
            self.deleted_jobs += 1
            self.deleted_pods += gone - 1
        if not commits:
            return
        try:
            results = await self._store.commit_many(commits)
        except StoreError:
            for name in jobs:  # all of them again next tick
                heapq.heappush(self._due, (now, name))  # due: tried again next tick
            raise
        pods = 0
        for name, ops, result in zip(jobs, commits, results, strict=True):
            if isinstance(result, StoreError):
                # Changed meanwhile (its update re-queues it) or a pod the view lacks: retry.
                log.debug("finished job not deleted yet", job=name, error=str(result))
                heapq.heappush(self._due, (now, name))  # due: tried again next tick
                continue
            self.deleted_jobs += 1
            pods += len(ops) - 1
        self.deleted_pods += pods
        log.info("finished jobs deleted", jobs=len(jobs), pods=pods)
