"""Submit: jobs validated as one request (nothing stored if the request is refused), each valid
job stored with its pods as its own atomic commit, all in one round trip; a job too big for one
store script is stored with its first chunk of pods and answered at once, its other pods created
chunk by chunk in the background (``controllers/creation.py``). A retry
of the same request (``request_id``) is answered with the jobs its first attempt made. Each job
is held to the caller's admission limits (``admission.py``: pods per job, a tenant's live
pods); a tenant's Submits take turns."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import structlog

from placement.quotas import DEFAULT_QUEUE
from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services import tenancy
from services.dispatcher import priorityclasses
from services.dispatcher.api import validation as v
from services.dispatcher.api.admission import (
    AdmissionLimits,
    TenantPods,
    TenantTurns,
    ViewBehindError,
)
from services.dispatcher.api.rpc import abort, refuse_if, store_violation
from services.dispatcher.controllers.creation import PodCreator, first_commit
from services.dispatcher.controllers.podindex import PodIndex
from services.dispatcher.controllers.pods import normalise_job
from services.dispatcher.dispatching.dispatch import UnitDispatcher
from services.dispatcher.objects import pods_complete
from services.dispatcher.priorityclasses import PriorityClasses
from services.runtime.auth import caller
from store import AlreadyExistsError, CommitError, Store, StoreError, StoreUnavailableError

log = structlog.get_logger(__name__)

# The Submit request that created a job (SubmitRequest.request_id), so a retry recognises it.
REQUEST_ID_ANNOTATION = "godel.io/request-id"


class SubmitRpc:
    def __init__(
        self,
        store: Store,
        core: UnitDispatcher,
        creator: PodCreator,
        *,
        limits: AdmissionLimits,
        max_pending_pods: int,
        pods: PodIndex | None = None,
    ) -> None:
        self.store = store
        self.core = core
        self.creator = creator
        self.limits = limits
        self.max_pending_pods = max_pending_pods
        # Each tenant's live pods, from the informer's pod events (a listing's pods on nodes
        # from the pod index's records, once listed).
        self.tenant_pods = TenantPods(
            core.informer, pods.live_on_nodes_by_owner if pods is not None else None
        )
        self.turns = TenantTurns(store, core.informer)

    async def Submit(self, request: api_pb2.SubmitRequest, context: Any) -> api_pb2.SubmitResponse:
        # The whole request is refused before anything is stored: a batch never half-lands.
        identity = caller()
        try:
            if tenancy.unrestricted(identity):  # the admin's thousands of jobs skip the loop
                return await self.submit(request)
            assert identity is not None  # a tenant
            for job in request.jobs:
                await refuse_if(context, tenancy.submit_refusal(identity, job))
            async with self.turns.turn(identity.name):
                return await self.submit(request)
        except (StoreUnavailableError, ViewBehindError) as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))

    def _limits(self, queue: pb.Queue | None, max_replicas: int) -> v.QueueLimits:
        spec = queue.spec if queue is not None else pb.QueueSpec()
        return v.QueueLimits(
            spec.max_pods_per_job or max_replicas,
            spec.max_pending_pods or self.max_pending_pods,
        )

    def _tenant_limit(self, tenant: str) -> v.TenantLimit | None:
        """The calling tenant's live pods and their limit; None for the admin (``tenant`` "")."""
        if not tenant:
            return None
        return v.TenantLimit(tenant, self.tenant_pods.of(tenant), self.limits.max_pods_per_tenant)

    async def submit(self, request: api_pb2.SubmitRequest) -> api_pb2.SubmitResponse:
        """Submit without the caller's checks (also Apply's path for jobs not stored yet)."""
        jobs = list(request.jobs)
        if not jobs:
            return api_pb2.SubmitResponse()
        names = [j.metadata.name for j in jobs]
        problems, replayed, queue_objects, classes = await self._judge(request, jobs, names)
        results = [
            api_pb2.SubmitResult(job=n, violations=p) for n, p in zip(names, problems, strict=True)
        ]
        for i, stored in replayed.items():
            results[i].existing = True
            results[i].resource_version = stored.metadata.resource_version
        valid = [i for i, p in enumerate(problems) if not p and i not in replayed]
        if request.dry_run or not valid:
            if replayed and not request.dry_run:
                await self.store.replication_barrier()  # as below
            return api_pb2.SubmitResponse(results=results)
        units = {i: normalise_job(jobs[i]) for i in valid}
        owner = _owner()
        for unit in units.values():
            unit.metadata.owner = owner  # never what the request said
            if request.request_id:
                unit.metadata.annotations[REQUEST_ID_ANNOTATION] = request.request_id
        preemptible: dict[int, bool] = {}
        for i, unit in units.items():
            klass = classes.class_for(unit.spec)
            priorityclasses.resolve(unit, klass)
            queue = queue_objects.get(unit.spec.queue)
            preemptible[i] = priorityclasses.pod_preemptible(unit.spec, klass, queue)
        outcomes = await self._store_jobs(units, preemptible, valid)
        raced: list[int] = []
        for i, outcome in zip(valid, outcomes, strict=True):
            if isinstance(outcome, StoreError):
                cause = outcome.cause if isinstance(outcome, CommitError) else outcome
                if request.request_id and isinstance(cause, AlreadyExistsError):
                    raced.append(i)  # perhaps a concurrent retry of this request: look below
                results[i].violations.append(store_violation(f"jobs[{i}]", outcome))
            else:
                results[i].created = True
                results[i].resource_version = outcome[0]
        if raced:
            await self._settle_races(request, jobs, raced, results)
        if any(r.existing for r in results):
            # Found by a retry, its first attempt perhaps unacknowledged: confirm it is on the
            # replicas before reporting it stored.
            await self.store.replication_barrier()
        created = sum(r.created for r in results)
        log.info(
            "submitted",
            jobs=len(jobs),
            created=created,
            existing=len(replayed) + sum(r.existing for i, r in enumerate(results) if i in raced),
            rejected=sum(1 for r in results if r.violations),
        )
        return api_pb2.SubmitResponse(results=results)

    async def _judge(
        self, request: api_pb2.SubmitRequest, jobs: list[pb.Job], names: list[str]
    ) -> tuple[list[v.Violations], dict[int, pb.Job], dict[str, pb.Queue], PriorityClasses]:
        """Each job's violations (none for a job a retry of this request finds stored), the
        jobs found so, the stored queues the jobs name, and the priority classes."""
        # The default queue need not exist as an object; it is read too for its defaults.
        queues = sorted({j.spec.queue or DEFAULT_QUEUE for j in jobs})
        # The three reads at once: one round trip's wait on the Submit path, not three. The
        # classes from the store, not the informer: a class applied a moment ago is there.
        existing, found_queues, (stored_classes, _) = await asyncio.gather(
            self.store.get_many(pb.Job, names),
            self.store.get_many(pb.Queue, queues),
            self.store.list_all(pb.PriorityClass),
        )
        classes = PriorityClasses.of(stored_classes)
        queue_objects = {
            q: obj for q, obj in zip(queues, found_queues, strict=True) if isinstance(obj, pb.Queue)
        }
        # A retry of this very request (its reply was lost): those jobs are reported, not made.
        replayed = {
            i: stored
            for i, stored in enumerate(existing)
            if isinstance(stored, pb.Job) and _is_replay(request.request_id, jobs[i], stored)
        }
        max_replicas, replicas_setting = self.limits.replicas_for(caller())
        ctx = v.SubmitContext(
            existing_jobs=frozenset(
                n
                for i, (n, j) in enumerate(zip(names, existing, strict=True))
                if j and i not in replayed
            ),
            queues=frozenset(queue_objects),
            node_shapes=self.core.node_shapes(),
            max_replicas=max_replicas,
            max_replicas_setting=replicas_setting,
            queue_limits={q: self._limits(queue_objects.get(q), max_replicas) for q in queues},
            pending_pods=self.core.queue.pending_pods(),
            tenant_limit=self._tenant_limit(_owner()),
            priority_classes=classes,
        )
        problems = v.validate_submission(jobs, ctx)
        for i in replayed:
            # Validated when first stored; the cluster may have changed since, the job has not.
            problems[i] = []
        return problems, replayed, queue_objects, classes

    async def _store_jobs(
        self, units: dict[int, pb.Job], preemptible: dict[int, bool], valid: list[int]
    ) -> list[list[int] | StoreError]:
        """Each job is its own atomic commit; all of them travel in one round trip. A job too
        big for one store script goes in with its first chunk of pods, marked unfinished, and
        the rest follow in the creator's background (creation.py: no script holds the store for
        long, and the reply does not wait for minutes of commits; the mark, stored with the
        first chunk, is what makes the reply a promise: the reconciler finishes a job whose
        creator stopped)."""
        chunk_ops = self.creator.chunk_ops
        commits = [first_commit(units[i], preemptible[i], chunk_ops) for i in valid]
        unfinished = [i for i in valid if not pods_complete(units[i])]
        # Ours from before the first commit (the reconciler resumes only jobs nobody is
        # creating); the background creation keeps them until it is done.
        self.creator.active.update(units[i].metadata.name for i in unfinished)
        outcomes: list[list[int] | StoreError] = []
        try:
            outcomes = await self.store.commit_many(commits)
        finally:
            stored = {
                i for i, o in zip(valid, outcomes, strict=False) if not isinstance(o, StoreError)
            }
            for i in unfinished:
                if i in stored:
                    self.creator.finish_in_background(units[i], preemptible[i])
                else:
                    self.creator.active.discard(units[i].metadata.name)
        return outcomes

    async def _settle_races(
        self,
        request: api_pb2.SubmitRequest,
        jobs: list[pb.Job],
        raced: list[int],
        results: list[api_pb2.SubmitResult],
    ) -> None:
        """Two attempts of one request raced (the first was still running when the client
        retried): the loser reports the winner's job instead of AlreadyExists."""
        stored_now = await self.store.get_many(pb.Job, [jobs[i].metadata.name for i in raced])
        for i, now in zip(raced, stored_now, strict=True):
            if isinstance(now, pb.Job) and _is_replay(request.request_id, jobs[i], now):
                del results[i].violations[:]
                results[i].existing = True
                results[i].resource_version = now.metadata.resource_version


def _owner() -> str:
    """What a new job's ``metadata.owner`` is: the calling tenant; empty for the admin."""
    identity = caller()
    return "" if tenancy.unrestricted(identity) or identity is None else identity.name


def _is_replay(request_id: str, submitted: pb.Job, stored: pb.Job) -> bool:
    """Whether ``stored`` is what an earlier attempt of this request made of ``submitted``: the
    same request id and the same spec (a different spec under a reused id is a client's bug, and
    answered with AlreadyExists like any other clash)."""
    return (
        bool(request_id)
        and stored.metadata.annotations.get(REQUEST_ID_ANNOTATION) == request_id
        and _admitted(submitted, stored) == stored.spec
    )


def _admitted(submitted: pb.Job, stored: pb.Job) -> pb.JobSpec:
    """The spec ``submitted`` was stored with, if ``stored`` is it: its class resolved as it was."""
    spec = normalise_job(submitted).spec
    priorityclasses.as_admitted(spec, stored.spec)
    return spec
