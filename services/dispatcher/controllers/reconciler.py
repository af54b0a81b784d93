"""The dispatcher's reconciler: every ``interval_seconds`` it looks for what fell between the
cracks of the normal paths, repairs it, and logs and counts every repair (``repairs`` by kind).

- ``orphaned_unit``: a unit the dispatch core believes DISPATCHED to a shard that has no stream
  any more, or whose stream does not hold it (its outcome can never come): queued again.
- ``dead_shard``: a ``SchedulerInstance`` whose liveness stamps (``store.pulse``) lapsed more
  than ``dead_shard_seconds`` ago, as the dispatcher's ``ShardLiveness`` last read them and only
  while it judges (a shard killed without its graceful stop leaves one behind, with its
  partition): deleted, compare-and-set, and its stamp forgotten. A shard that was only cut off
  (or frozen) registers again when its next stamp finds no record.
- ``job_status``: a job whose stored status disagrees with its pods on two checks in a row,
  unchanged in between (``jobs_per_pass`` jobs are checked per pass, round robin), although the
  job status controller has nothing pending or in flight for it (a write that failed for good;
  one pass alone could be the moment between the controller's write and our view of it; no
  pass judges while our view is behind the store): handed back to that controller, the one
  writer of ``Job.status``, which writes it now. A one-pod job stores no status (it is derived
  when read) and is not judged.
- ``unfinished_job``: a job whose pods are not all stored (``objects.PODS_CREATED_ANNOTATION``)
  that nobody in this process is creating — the dispatcher that began it stopped midway: its
  remaining pods are created, chunk by chunk, from where the mark says it got
  (``creation.PodCreator.resume``), so its unit is dispatched whole.
- ``unfinished_deletion``: a job marked for deletion (``metadata.deletion_timestamp_ms``) that
  nobody in this process is deleting — the dispatcher deleting it chunk by chunk stopped midway:
  its remaining pods and then the job are deleted, in the deleter's background
  (``deletion.JobDeleter.resume_in_background``).

Placements a shard proposed and never got a verdict for are the shard's to repair (its own
reconciler, ``services/scheduler/service.py``): only it holds them.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import structlog
from google.protobuf.message import Message

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.creation import PodCreator
from services.dispatcher.controllers.deletion import JobDeleter
from services.dispatcher.controllers.jobphase import derives_status
from services.dispatcher.controllers.jobstatus import JobStatusController
from services.dispatcher.dispatching.dispatch import UnitDispatcher
from services.dispatcher.dispatching.entries import UnitState
from services.dispatcher.objects import being_deleted, pods_complete
from store import ConflictError, NotFoundError, Store, StoreError
from store.informer import Handlers, Informer

log = structlog.get_logger(__name__)


class Reconciler:
    def __init__(
        self,
        store: Store,
        informer: Informer,
        core: UnitDispatcher,
        job_status_controller: JobStatusController,
        *,
        interval_seconds: float = 5.0,
        dead_shard_seconds: float = 60.0,
        jobs_per_pass: int = 2_000,
        creator: PodCreator | None = None,
        deleter: JobDeleter | None = None,
    ) -> None:
        self.store = store
        self.informer = informer
        self.core = core
        self.job_status = job_status_controller
        self.interval = interval_seconds
        self.dead_shard_ms = int(dead_shard_seconds * 1000)
        self.repairs: Counter[str] = Counter()
        # Jobs whose status disagreed when last checked, with the version they had then.
        self._suspect: dict[str, int] = {}
        # Job statuses are checked a slice per pass (``jobs_per_pass``), round robin: a full
        # recount of every job's pods each pass would cost in proportion to the cluster.
        self.jobs_per_pass = jobs_per_pass
        self._to_check: list[str] = []
        # Jobs whose pods (or themselves) changed since they were last checked, and the version
        # each job had when its status last agreed with its pods: a job that agreed and has not
        # changed since is not counted again (a 100,000-pod job recounted every pass took most
        # of the dispatcher's CPU while it waited to be scheduled).
        # Only jobs whose status is stored: a one-pod job's is derived (``_job_statuses``
        # skips it), and its every pod event would add its name here for nothing.
        self._changed = job_status_controller.pods.subscribe(stored_status_only=True)
        self._agreed: dict[str, int] = {}
        self.creator = creator or PodCreator(store)
        # Jobs whose pods are not all stored, kept from job events (no scan of every job).
        self._unfinished: set[str] = set()
        self.deleter = deleter or JobDeleter(store, lambda _job: ())
        # Jobs whose deletion began (in chunks), kept from job events likewise.
        self._deleting: set[str] = set()
        informer.add_handlers(
            Handlers(
                on_add=lambda _, job: self._on_job(job),
                on_update=lambda _, __, job: self._on_job(job),
                on_delete=lambda _, job: self._on_job(job, deleted=True),
                kinds=frozenset({"Job"}),
            )
        )

    async def run(self) -> None:
        await self.informer.wait_synced()
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.tick()
            except StoreError as exc:
                log.warning("reconciler tick failed", error=str(exc))

    async def tick(self) -> Counter[str]:
        """One pass; returns the repairs it made, by kind."""
        made: Counter[str] = Counter()
        made["orphaned_unit"] = self._orphaned_units()
        made["dead_shard"] = await self._dead_shards()
        made["job_status"] = await self._job_statuses()
        made["unfinished_job"] = await self._unfinished_jobs()
        made["unfinished_deletion"] = await self._unfinished_deletions()
        made = +made  # drop the zeros
        self.repairs.update(made)
        return made

    def _repaired(self, kind: str, **details: object) -> None:
        log.warning("reconciler repaired", kind=kind, total=self.repairs[kind] + 1, **details)

    def _on_job(self, job: Message, deleted: bool = False) -> None:
        if not isinstance(job, pb.Job):
            return
        name = job.metadata.name
        if deleted or pods_complete(job) or being_deleted(job):
            self._unfinished.discard(name)
        else:
            self._unfinished.add(name)
        if not deleted and being_deleted(job):
            self._deleting.add(name)
        else:
            self._deleting.discard(name)

    async def _unfinished_jobs(self) -> int:
        """Last in a pass: a big job takes a while (each chunk is a commit)."""
        count = 0
        for name in sorted(self._unfinished - self.creator.active):
            created = await self.creator.resume(name)
            if created:
                self._repaired("unfinished_job", job=name, pods_created=created)
                count += 1
        return count

    async def _unfinished_deletions(self) -> int:
        """A job marked for deletion that nobody here is deleting: the dispatcher that began
        it stopped midway (``deletion.py``). Resumed in the deleter's background, as a Delete
        is: a big job's pods take minutes, and the other repairs do not wait for them."""
        count = 0
        for name in sorted(self._deleting - self.deleter.active):
            if await self.deleter.resume_in_background(name):
                self._repaired("unfinished_deletion", job=name)
                count += 1
        return count

    def _orphaned_units(self) -> int:
        count = 0
        for entry in list(self.core.units.values()):
            if entry.state != UnitState.DISPATCHED:
                continue
            link = self.core.links.get(entry.shard)
            if link is not None and entry.job in link.undecided:
                continue
            self._repaired("orphaned_unit", job=entry.job, shard=entry.shard)
            self.core.requeue(entry)
            count += 1
        return count

    async def _dead_shards(self) -> int:
        liveness = self.core.liveness
        if not liveness.judging:
            return 0  # out of touch with the store: every stamp looks old (ShardLiveness)
        count = 0
        for obj in self.informer.list("SchedulerInstance"):
            assert isinstance(obj, pb.SchedulerInstance)
            silent_ms = liveness.silent_ms(obj)
            if silent_ms <= self.dead_shard_ms:
                continue
            name = obj.metadata.name
            try:
                await self.store.delete(
                    pb.SchedulerInstance, name, expected_version=obj.metadata.resource_version
                )
            except (ConflictError, NotFoundError):
                continue  # it wrote its record meanwhile, or is gone already
            await self.store.forget_shard_heartbeat(name)
            silent_s = silent_ms // 1000
            self._repaired("dead_shard", shard=name, silent_s=silent_s)
            count += 1
        return count

    async def _job_statuses(self) -> int:
        if self.informer.staleness() > 0:
            # A view behind the store shows statuses the controller has rewritten since: two
            # passes would both see the old version and "repair" what is not broken.
            return 0
        pods = self.job_status.pods
        stuck = []
        if not self._to_check:  # a new round over every job
            names = self.informer.names("Job")
            self._to_check = list(reversed(names))
            known = set(names)
            self._suspect = {n: v for n, v in self._suspect.items() if n in known}
            self._agreed = {n: v for n, v in self._agreed.items() if n in known}
        for _ in range(min(self.jobs_per_pass, len(self._to_check))):
            name = self._to_check.pop()
            job = self.informer.get("Job", name)
            if (
                not isinstance(job, pb.Job)
                or derives_status(job)  # nothing stored to disagree: derived when read
                or name in self.job_status.changed_jobs
                or name in self.job_status.writing
                or not pods_complete(job)  # still being created: the controller skips it too
                or being_deleted(job)  # going: the controller leaves its status alone too
            ):
                self._suspect.pop(name, None)  # gone, or the controller writes it next tick
                continue
            version = job.metadata.resource_version
            if self._agreed.get(name) == version and name not in self._changed:
                continue  # agreed when last counted, and nothing of it changed since
            self._changed.discard(name)
            computed = await pods.status_of(job)
            s = job.status
            if computed == (s.phase, s.bound, s.running, s.succeeded, s.failed):
                self._suspect.pop(name, None)
                self._agreed[name] = version
                continue
            self._agreed.pop(name, None)
            if self._suspect.get(name) != version:
                self._suspect[name] = version  # first sight: it may be a write on its way
                continue
            del self._suspect[name]
            self._repaired("job_status", job=name, stored=str(s).replace("\n", " "))
            stuck.append(name)
        if stuck:
            self.job_status.changed_jobs.update(stuck)
            await self.job_status.tick()
        return len(stuck)
