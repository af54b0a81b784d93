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

If the dispatcher stops midway, the mark says how far it got: the reconciler resumes the job
(:meth:`PodCreator.resume`) from the store's copy.
"""

from __future__ import annotations

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
from store import CommitError, ConflictError, NotFoundError, Store
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
