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

Small jobs (the common case) are one commit as before. A big job's steps 2 and 3 take from
seconds to minutes (100,000 pods, some bound, on a busy store), so the ``Delete`` RPC does not
wait for them: :meth:`JobDeleter.start` marks the job and leaves the rest to a background task of
the deleter's; the caller follows the job, which reads as phase Deleting with the pods it has
left, until it is gone. If the dispatcher stops midway, the mark stays on the job (the store is
the truth): the reconciler of the next one resumes the deletion in the background
(:meth:`JobDeleter.resume_in_background`), and a second ``Delete`` of the job does the same.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.creation import CHUNK_OPS
from services.dispatcher.objects import being_deleted
from services.runtime import cancel_and_wait
from store import CommitError, ConflictError, NotFoundError, Store, StoreError
from store.client import Delete, Op, Update

log = structlog.get_logger(__name__)

_RETRIES = 5


@dataclass(frozen=True, slots=True)
class Deletion:
    """What :meth:`JobDeleter.start` did: ``deleted`` objects went at once (a small job, whole);
    or ``in_progress``: the job is marked and a background task deletes the rest."""

    deleted: int
    in_progress: bool


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
        # The deletions running in the background (start, resume_in_background), until done.
        self._tasks: set[asyncio.Task[int]] = set()
        self._closed = False

    def _pod_names(self, job: pb.Job) -> list[str]:
        """The job's pods by index, then the others (replacements) in name order: built in
        one pass (a set of 100,000 names sorted held the loop for some 100 ms)."""
        name = job.metadata.name
        names = [f"{name}-{i}" for i in range(job.spec.replicas)]
        by_index = set(names)
        names += sorted(p for p in self.pods_of(name) if p not in by_index)
        return names

    async def delete(self, job: pb.Job, expected: int = 0) -> int:
        """Delete ``job`` (as read; ``expected``: the version the caller insists on, 0 for any)
        and its pods, to the end. Returns how many objects went. Raises ConflictError if
        ``expected`` is stale, NotFoundError if the job is gone before anything of it was
        deleted."""
        begun = await self._begin(job, expected)
        if isinstance(begun, int):
            return begun
        marked, names = begun
        if marked.metadata.name in self.active:
            # Ours in the background already: finish it together (what one of the two
            # deletes, the other finds gone).
            return await self._in_chunks(marked, names)
        self.active.add(marked.metadata.name)
        return await self._owned(marked, names)

    async def start(self, job: pb.Job, expected: int = 0) -> Deletion:
        """As :meth:`delete`, but a big job (or one marked already) is only marked here: its
        pods and then the job go in a background task, and this returns at once. Raises as
        :meth:`delete` does, before anything is deleted."""
        begun = await self._begin(job, expected)
        if isinstance(begun, int):
            return Deletion(deleted=begun, in_progress=False)
        marked, names = begun
        self._in_background(marked, names)
        return Deletion(deleted=0, in_progress=True)

    async def _begin(self, job: pb.Job, expected: int) -> int | tuple[pb.Job, list[str]]:
        """A small job deleted whole (how many objects went), or a big one marked (the marked
        job and its pods' names, for :meth:`_in_chunks`)."""
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
                return marked, names
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

    async def resume_in_background(self, name: str) -> bool:
        """Finish, in a background task, the deletion of a marked job a stopped dispatcher left
        behind, unless someone here deletes it; whether a task was started."""
        if name in self.active:
            return False
        job = (await self.store.get_many(pb.Job, [name]))[0]
        if job is None or not being_deleted(job) or name in self.active:
            return False
        self._in_background(job)
        return True

    def _in_background(self, job: pb.Job, names: list[str] | None = None) -> None:
        """Delete the marked ``job``'s pods and then the job in a task of this deleter's,
        unless one of this process deletes it already."""
        name = job.metadata.name
        if name in self.active or self._closed:  # closed: the next dispatcher finishes it
            return
        self.active.add(name)  # now, not when the task first runs: a second Delete sees it
        task = asyncio.create_task(self._owned(job, names), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[int]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, StoreError):
            # The job stays marked: the reconciler (or a second Delete) resumes it.
            log.warning(
                "job deletion stopped; it is resumed", job=task.get_name(), error=str(error)
            )
        elif error is not None:
            log.error("job deletion failed", job=task.get_name(), exc_info=error)

    async def close(self) -> None:
        """Stop the background deletions (the service stops): each job stays marked, and the
        next dispatcher's reconciler finishes it. None starts after this."""
        self._closed = True
        await cancel_and_wait(list(self._tasks))

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

    async def _owned(self, job: pb.Job, names: list[str] | None = None) -> int:
        """:meth:`_in_chunks` for a job the caller put in ``active``; it leaves when done."""
        try:
            return await self._in_chunks(job, names)
        finally:
            self.active.discard(job.metadata.name)

    async def _in_chunks(self, job: pb.Job, names: list[str] | None = None) -> int:
        """Delete a marked job's pods chunk by chunk, then the job. ``names``: its pods' names
        if the caller has them already (100,000 names are not built twice)."""
        name, uid = job.metadata.name, job.metadata.uid
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
                if fresh is None or fresh.metadata.uid != uid:
                    return deleted  # gone (another deleter of it finished first)
                job, names = fresh, late
                continue
            deleted += done
            log.info("job deleted", job=name, objects=deleted)
            return deleted

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
