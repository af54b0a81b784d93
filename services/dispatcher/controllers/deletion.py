"""Deleting a job and its pods in bounded chunks: the mirror of ``creation.py``.

A job and all its pods deleted in one commit is atomic, but a store script cannot be
interrupted: deleting a 100,000-pod job in one would hold Valkey past its busy threshold, and
every other client (shard heartbeats, the Binder's lease) would get BUSY. So a job whose
deletion takes more ops than one script should carry (``CHUNK_OPS``) goes in three steps:

1. The job is **marked** (``metadata.deletion_timestamp_ms``, compare-and-set on the version the
   caller read). From then on nothing new is made for it: its unit is not dispatched
   (``UnitQueue.view``), the Binder refuses its pods, no replacement or retry pod is created,
   and its status is left alone.
2. Its pods are deleted a chunk per commit; each commit is an await, so the event loop serves
   heartbeats, streams and other requests in between.
3. The job goes with whatever pods remain (read again: a pod may have appeared meanwhile).

Small jobs (the common case) are one commit as before. If the dispatcher stops midway, the mark
stays on the job: the reconciler resumes the deletion (:meth:`JobDeleter.resume`); a second
``Delete`` of the job does the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import structlog

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.creation import CHUNK_OPS
from services.dispatcher.objects import being_deleted
from store import CommitError, ConflictError, NotFoundError, Store
from store.client import Delete, Op, Update

log = structlog.get_logger(__name__)

_RETRIES = 5


class JobDeleter:
    """Deletes jobs with their pods, in chunks when big. ``pods_of(job)``: names of the job's
    pods other than ``<job>-<index>`` (replacements), from the caller's view. ``active``: the
    jobs this process is deleting now (the reconciler leaves them alone)."""

    def __init__(
        self,
        store: Store,
        pods_of: Callable[[str], Iterable[str]],
        chunk_ops: int = CHUNK_OPS,
    ) -> None:
        self.store = store
        self.pods_of = pods_of
        self.chunk_ops = max(2, chunk_ops)
        self.active: set[str] = set()

    def _pod_names(self, job: pb.Job) -> list[str]:
        name = job.metadata.name
        names = {f"{name}-{i}" for i in range(job.spec.replicas)}
        names.update(self.pods_of(name))
        return sorted(names)

    async def delete(self, job: pb.Job, expected: int = 0) -> int:
        """Delete ``job`` (as read; ``expected``: the version the caller insists on, 0 for any)
        and its pods. Returns how many objects went. Raises ConflictError if ``expected`` is
        stale, NotFoundError if the job is gone before anything of it was deleted."""
        name = job.metadata.name
        for _ in range(_RETRIES):
            if expected and job.metadata.resource_version != expected:
                raise ConflictError("Job", name, expected, job.metadata.resource_version)
            names = self._pod_names(job)
            if being_deleted(job) or len(names) + 1 > self.chunk_ops:
                try:
                    marked = await self._mark(job)
                except CommitError:
                    # The job changed since it was read (its status, most likely): again.
                    if expected:
                        raise
                    job = await self.store.get(pb.Job, name)
                    continue
                return await self._in_chunks(marked, names)
            pods = await self._found(name, names)
            ops: list[Op] = [Delete("Job", name, job.metadata.resource_version)]
            ops += [Delete("Pod", p) for p in pods]
            try:
                await self.store.commit(ops)
            except CommitError:
                # A pod vanished or the job changed meanwhile: read again.
                if expected:
                    raise
                job = await self.store.get(pb.Job, name)
                continue
            log.info("job deleted", job=name, pods=len(pods))
            return len(ops)
        raise ConflictError("Job", name, 0, job.metadata.resource_version)

    async def resume(self, name: str) -> int:
        """Finish the deletion of a marked job a stopped dispatcher left behind."""
        if name in self.active:
            return 0
        job = (await self.store.get_many(pb.Job, [name]))[0]
        if job is None or not being_deleted(job):
            return 0
        return await self._in_chunks(job)

    async def _found(self, job: str, names: list[str]) -> list[str]:
        """Which of ``names`` are stored pods of ``job``, read a chunk per round trip (the loop
        serves others between: decoding 100,000 pods at once would hold it for seconds)."""
        found: list[str] = []
        for first in range(0, len(names), self.chunk_ops):
            chunk = await self.store.get_many(pb.Pod, names[first : first + self.chunk_ops])
            found += [p.metadata.name for p in chunk if p is not None and p.spec.job == job]
        return found

    async def _mark(self, job: pb.Job) -> pb.Job:
        """The job marked for deletion (compare-and-set: CommitError if it changed since it
        was read); a job already marked as it is."""
        if being_deleted(job):
            return job
        marked = pb.Job()
        marked.CopyFrom(job)
        marked.metadata.deletion_timestamp_ms = int(time.time() * 1000)
        await self.store.commit([Update(marked)])
        log.info("job deletion begun, in chunks", job=job.metadata.name, replicas=job.spec.replicas)
        return marked

    async def _in_chunks(self, job: pb.Job, names: list[str] | None = None) -> int:
        """Delete a marked job's pods chunk by chunk, then the job. ``names``: its pods' names
        if the caller has them already (100,000 names are not built twice)."""
        name = job.metadata.name
        self.active.add(name)
        try:
            deleted = 0
            names = self._pod_names(job) if names is None else names
            while True:
                for first in range(0, len(names), self.chunk_ops):
                    found = await self._found(name, names[first : first + self.chunk_ops])
                    if found:
                        deleted += await self._delete_pods(found)
                # Nothing new is made for a marked job, but a pod may have appeared before its
                # maker saw the mark (a replacement): the pod index names it, the job takes it.
                late = await self._found(name, sorted(set(self.pods_of(name))))
                if len(late) + 1 > self.chunk_ops:
                    names = late
                    continue
                done = await self._last(job, late)
                if done is None:  # the job changed (its status) or a pod went: read again
                    fresh = (await self.store.get_many(pb.Job, [name]))[0]
                    if fresh is None:
                        return deleted
                    job, names = fresh, late
                    continue
                deleted += done
                log.info("job deleted", job=name, objects=deleted)
                return deleted
        finally:
            self.active.discard(name)

    async def _delete_pods(self, names: list[str]) -> int:
        """One chunk; a pod that went meanwhile is skipped (read again)."""
        for _ in range(_RETRIES):
            try:
                await self.store.commit([Delete("Pod", n) for n in names])
                return len(names)
            except CommitError as exc:
                if not isinstance(exc.cause, NotFoundError):
                    raise
                names = [p.metadata.name for p in await self.store.get_many(pb.Pod, names) if p]
        return 0  # the next listing finds what is left

    async def _last(self, job: pb.Job, pods: list[str]) -> int | None:
        """The job with its remaining pods; None if the job changed or a pod went meanwhile."""
        ops: list[Op] = [Delete("Job", job.metadata.name, job.metadata.resource_version)]
        ops += [Delete("Pod", n) for n in pods]
        try:
            await self.store.commit(ops)
        except CommitError as exc:
            if isinstance(exc.cause, ConflictError | NotFoundError):
                return None
            raise
        return len(ops)
