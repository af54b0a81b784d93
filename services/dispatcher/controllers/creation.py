"""Creating a job's pods in bounded chunks, so no store script holds the server for long.

One commit of a job and all its pods is atomic, but a store script cannot be interrupted: a
100,000-pod commit held Valkey for tens of seconds, past its busy threshold, and every other
client — shard heartbeats, the Binder's lease — got BUSY. So a job with more pods than one
script should carry (the job and ``store.client.MAX_OPS_PER_CALL`` pods, about the bound the
store already puts on the scripts it batches: 0.1-0.2 s of server time on this busy machine,
measured) is created as: the job, marked unfinished (``objects.PODS_CREATED_ANNOTATION``),
with its first chunk of pods in one commit; then each further chunk in a commit that also
advances the mark (compare-and-set on the job, so a job deleted or replaced meanwhile gets no
stray pods); the last one clears it. Until then its unit is not dispatched (``UnitQueue.view``). Small jobs — the
common case — are one commit as before.

Submit does not wait for the further chunks: a 100,000-pod job took 60-150 s to store, past a
client's default deadline. Once the first commit has landed the job is acknowledged, and the rest
is created in a background task of the creator's (:meth:`PodCreator.finish_in_background`); the
job reads as Pending with the pods stored so far (``JobStatus.pods_created``). The first commit
is what makes this safe: from then on the mark is in the store, so if the dispatcher stops
midway — a crash, a kill -9 — the mark says how far it got, and the reconciler of the next one
resumes the job (:meth:`PodCreator.resume`) from the store's copy. An acknowledged job ends up
with all its pods, each created once (every pod is a create of its own name: a chunk that
landed is never made again).
"""

from __future__ import annotations

import asyncio

import structlog

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.pods import pods_for
from services.dispatcher.objects import (
    PODS_CREATED_ANNOTATION,
    being_deleted,
    pods_complete,
    pods_created,
)
from services.dispatcher.priorityclasses import pod_preemptible
from services.runtime import cancel_and_wait
from store import CommitError, ConflictError, NotFoundError, Store, StoreError
from store.client import MAX_OPS_PER_CALL, Create, Op, Update

log = structlog.get_logger(__name__)

# Ops per commit of a chunked creation: the job (or its update) and up to MAX_OPS_PER_CALL
# pods. A job of 1,000 pods — the usual big one — stays a single commit: with a bound of 1,000
# ops it was split into a commit of 999 pods and another of the job's update and one pod,
# writing the job twice and holding its unit back until the second landed.
CHUNK_OPS = MAX_OPS_PER_CALL + 1


def first_commit(job: pb.Job, preemptible: bool, chunk_ops: int = CHUNK_OPS) -> list[Op]:
    """The ops of a new job's first commit: the job and its pods if they fit in one chunk, else
    the job marked unfinished with as many pods as fit (``job`` is marked in place)."""
    first = min(job.spec.replicas, chunk_ops - 1)
    if first < job.spec.replicas:
        job.metadata.annotations[PODS_CREATED_ANNOTATION] = str(first)
    return [Create(job), *(Create(p) for p in pods_for(job, preemptible, 0, first))]


class PodCreator:
    """Creates the remaining pods of unfinished jobs, a chunk per commit. ``active``: the jobs
    this process is creating now (the reconciler leaves them alone)."""

    def __init__(self, store: Store, chunk_ops: int = CHUNK_OPS) -> None:
        self.store = store
        self.chunk_ops = max(2, chunk_ops)
        self.active: set[str] = set()
        # The creations running in the background (finish_in_background), until done.
        self._tasks: set[asyncio.Task[int]] = set()
        self._closed = False

    def finish_in_background(self, job: pb.Job, preemptible_default: bool) -> None:
        """:meth:`finish` in a task of this creator's: Submit answers once the job's first
        commit is stored. A task that stops on a store error leaves the job marked, and the
        reconciler resumes it; so does the next dispatcher after this one stops (:meth:`close`)
        or dies."""
        name = job.metadata.name
        if self._closed:
            self.active.discard(name)
            return
        self.active.add(name)  # now, not when the task first runs: the reconciler sees it
        task = asyncio.create_task(self.finish(job, preemptible_default), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[int]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, StoreError):
            log.warning(
                "job's pods not all created; the reconciler finishes them",
                job=task.get_name(),
                error=str(error),
            )
        elif error is not None:
            log.error("creating a job's pods failed", job=task.get_name(), exc_info=error)

    async def close(self) -> None:
        """Stop the background creations (the service stops): each job stays marked, and the
        next dispatcher's reconciler finishes it. None starts after this."""
        self._closed = True
        await cancel_and_wait(list(self._tasks))

    async def finish(self, job: pb.Job, preemptible: bool) -> int:
        """Create the rest of the pods of ``job`` (as stored: its ``resource_version`` current),
        chunk by chunk; each commit is an await, so the event loop serves heartbeats, streams
        and other requests in between. Returns how many pods it created; stops early if the job
        was deleted or replaced meanwhile. Store errors propagate: the job stays marked, and the
        reconciler resumes it."""
        name, uid = job.metadata.name, job.metadata.uid
        self.active.add(name)
        created = 0
        try:
            while not pods_complete(job):
                done = pods_created(job)
                stop = min(job.spec.replicas, done + self.chunk_ops - 1)
                advanced = pb.Job()
                advanced.CopyFrom(job)
                if stop >= job.spec.replicas:
                    del advanced.metadata.annotations[PODS_CREATED_ANNOTATION]
                else:
                    advanced.metadata.annotations[PODS_CREATED_ANNOTATION] = str(stop)
                pods = pods_for(job, preemptible, done, stop)
                try:
                    await self.store.commit([Update(advanced), *(Create(p) for p in pods)])
                except CommitError as exc:
                    if exc.index != 0 or not isinstance(exc.cause, ConflictError | NotFoundError):
                        raise
                    # The job changed meanwhile (its status, an Apply): go on from the fresh
                    # copy, unless it is gone or another job of the same name.
                    fresh = (await self.store.get_many(pb.Job, [name]))[0]
                    if fresh is None or fresh.metadata.uid != uid or being_deleted(fresh):
                        log.info("job deleted while its pods were being created", job=name)
                        return created
                    job = fresh
                    continue
                created += len(pods)
                job = advanced  # the commit set its resource_version
        finally:
            self.active.discard(name)
        return created

    async def resume(self, name: str) -> int:
        """Finish a job a stopped dispatcher left unfinished, from the store's copy; its pods
        keep what its first pod was created with (``preemptible`` as resolved then).
        Returns how many pods it created (0: nothing was left to do)."""
        if name in self.active:
            return 0
        job = (await self.store.get_many(pb.Job, [name]))[0]
        if job is None or pods_complete(job) or being_deleted(job):
            return 0
        first = (await self.store.get_many(pb.Pod, [f"{name}-0"]))[0]
        # Without a first pod (deleted since), what the job itself says: its class and queue
        # are not read again (they may have changed since).
        preemptible = (
            first.spec.preemptible if first is not None else pod_preemptible(job.spec, None, None)
        )
        return await self.finish(job, preemptible)
