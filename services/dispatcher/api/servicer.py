"""The public API (`godel.v1.Dispatcher`): Submit, Apply, Get, List, Delete, Explain, Watch.

Writes are batched per request: a submission is one pipelined round trip of per-job atomic
commits, an Apply is one atomic commit of every valid object. Reads go to the store (not the
informer cache), so a client reads its own writes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

import grpc
import structlog
from google.protobuf.message import Message

from foundation.tls import Identity
from placement import labelselector
from placement.claims import holds_claim
from protos.godel.v1 import api_pb2, api_pb2_grpc
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services import tenancy
from services.dispatcher.api import listing
from services.dispatcher.api import validation as v
from services.dispatcher.controllers.creation import PodCreator, first_commit
from services.dispatcher.controllers.deletion import JobDeleter
from services.dispatcher.controllers.jobphase import as_read, derives_status
from services.dispatcher.controllers.podindex import PodIndex
from services.dispatcher.controllers.pods import normalise_job
from services.dispatcher.dispatching.dispatch import UnitDispatcher
from services.dispatcher.dispatching.unitqueue import is_pending
from services.dispatcher.objects import DEFAULT_QUEUE, PODS_CREATED_ANNOTATION, pods_complete
from services.eviction import DRAINED
from services.peers.binder import EvictError
from services.runtime.auth import caller
from store import (
    AlreadyExistsError,
    CommitError,
    ConflictError,
    InvalidObjectError,
    NotFoundError,
    ResourceVersionTooNewError,
    ResourceVersionTooOldError,
    Store,
    StoreError,
    StoreUnavailableError,
)
from store import kinds as kinds_mod
from store.client import Create, Op, Update
from store.encoded import EncodedList
from store.informer import ENCODED_KINDS
from store.kinds import USER_KINDS, unwrap, wrap

log = structlog.get_logger(__name__)

DEFAULT_PAGE = 500
# How long a List waits for the dispatcher's view to reach the store's revision before it reads
# the store instead.
LIST_CATCH_UP_SECONDS = 2.0
MAX_PAGE = 5000
_CAS_RETRIES = 3
# What an applied Job may change of a stored one (besides labels and annotations): what the job
# controller reads from the job. The rest is copied into its pods or decided its placement.
MUTABLE_JOB_SPEC = frozenset({"backoff_limit", "replace_lost_pods"})
# Annotations the system sets on a job (e.g. its request id): an applied manifest without them
# keeps them.
SYSTEM_ANNOTATION_PREFIX = "godel.io/"
_EVENT = {
    "ADDED": api_pb2.WatchEvent.ADDED,
    "MODIFIED": api_pb2.WatchEvent.MODIFIED,
    "DELETED": api_pb2.WatchEvent.DELETED,
}
# The Submit request that created a job (SubmitRequest.request_id), so a retry recognises it.
REQUEST_ID_ANNOTATION = "godel.io/request-id"


async def _abort(context: Any, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("unreachable")  # context.abort raises


def _kind(name: str) -> kinds_mod.Kind:
    return kinds_mod.kind_named(name)


class DispatcherServicer(api_pb2_grpc.DispatcherServicer):
    def __init__(
        self,
        store: Store,
        core: UnitDispatcher,
        pods: PodIndex,
        *,
        max_replicas: int,
        max_pending_pods: int = 200_000,
        creator: PodCreator | None = None,
        deleter: JobDeleter | None = None,
    ) -> None:
        self.store = store
        self.core = core
        # A one-pod job's status is derived from its pod when read (controllers.as_read).
        self.pods = pods
        self.snapshots = listing.ListingSnapshots()  # of paged Lists, for their next pages
        self.max_replicas = max_replicas
        self.max_pending_pods = max_pending_pods
        # Creates big jobs' pods chunk by chunk; the reconciler resumes what it left unfinished.
        self.creator = creator or PodCreator(store)
        # Deletes jobs with their pods, big ones chunk by chunk; the reconciler resumes them.
        self.deleter = deleter or JobDeleter(store, self._replacement_pods)

    # -----------------------------------------------------------------------------------------
    # Submit
    # -----------------------------------------------------------------------------------------

    async def Submit(self, request: api_pb2.SubmitRequest, context: Any) -> api_pb2.SubmitResponse:
        # The whole request is refused before anything is stored: a batch never half-lands.
        identity = caller()
        if not tenancy.unrestricted(identity):  # the admin's thousands of jobs skip the loop
            for job in request.jobs:
                await _refuse_if(context, tenancy.submit_refusal(identity, job))
        try:
            return await self._submit(request)
        except StoreUnavailableError as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))

    def _refuse_queue_cycles(
        self, checked: list[tuple[int, str, Message]], results: list[api_pb2.ApplyResult]
    ) -> list[tuple[int, str, Message]]:
        """Queues whose parents would lead back to them (with the queues known and this
        request's) are invalid; the rest of the request stands."""
        parents = {
            q.metadata.name: q.spec.parent  # type: ignore[attr-defined]
            for q in self.core.informer.list("Queue")
        }
        for _, _, obj in checked:
            if isinstance(obj, pb.Queue):
                parents[obj.metadata.name] = obj.spec.parent
        cycles = v.queue_cycles(parents)
        kept = []
        for i, kind, obj in checked:
            name = obj.metadata.name  # type: ignore[attr-defined]
            if isinstance(obj, pb.Queue) and name in cycles:
                results[i].violations.append(
                    v.violation(
                        f"objects[{i}].queue.spec.parent",
                        f"the parents would form a cycle: {cycles[name]}",
                    )
                )
                results[i].action = "invalid"
            else:
                kept.append((i, kind, obj))
        return kept

    def _limits(self, queue: pb.Queue | None) -> v.QueueLimits:
        spec = queue.spec if queue is not None else pb.QueueSpec()
        return v.QueueLimits(
            spec.max_pods_per_job or self.max_replicas,
            spec.max_pending_pods or self.max_pending_pods,
        )

    async def _submit(self, request: api_pb2.SubmitRequest) -> api_pb2.SubmitResponse:
        jobs = list(request.jobs)
        if not jobs:
            return api_pb2.SubmitResponse()
        names = [j.metadata.name for j in jobs]
        # The default queue need not exist as an object; it is read too for its defaults.
        queues = sorted({j.spec.queue or DEFAULT_QUEUE for j in jobs})
        existing = await self.store.get_many(pb.Job, names)
        found_queues = await self.store.get_many(pb.Queue, queues)
        queue_objects = {
            q: obj for q, obj in zip(queues, found_queues, strict=True) if isinstance(obj, pb.Queue)
        }
        # A retry of this very request (its reply was lost): those jobs are reported, not made.
        replayed = {
            i: stored
            for i, stored in enumerate(existing)
            if isinstance(stored, pb.Job) and _is_replay(request.request_id, jobs[i], stored)
        }
        ctx = v.SubmitContext(
            existing_jobs=frozenset(
                n
                for i, (n, j) in enumerate(zip(names, existing, strict=True))
                if j and i not in replayed
            ),
            queues=frozenset(queue_objects),
            node_shapes=self.core.node_shapes(),
            max_replicas=self.max_replicas,
            queue_limits={q: self._limits(queue_objects.get(q)) for q in queues},
            pending_pods=self.core.queue.pending_pods(),
        )
        problems = v.validate_submission(jobs, ctx)
        for i in replayed:
            # Validated when first stored; the cluster may have changed since, the job has not.
            problems[i] = []
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
        preemptible = {i: _preemptible_default(units[i], queue_objects) for i in valid}
        # Each job is its own atomic commit; all of them travel in one round trip. A job too big
        # for one store script goes in with its first chunk of pods, marked unfinished, and the
        # rest follow below (creation.py: no script holds the store for long).
        commits = [first_commit(units[i], preemptible[i]) for i in valid]
        unfinished = [i for i in valid if not pods_complete(units[i])]
        # Ours until finished below (the reconciler resumes only jobs nobody is creating).
        self.creator.active.update(units[i].metadata.name for i in unfinished)
        try:
            outcomes = await self.store.commit_many(commits)
            await self._finish(unfinished, units, preemptible, outcomes, valid)
        finally:
            self.creator.active.difference_update(units[i].metadata.name for i in unfinished)
        raced: list[int] = []
        for i, outcome in zip(valid, outcomes, strict=True):
            if isinstance(outcome, StoreError):
                cause = outcome.cause if isinstance(outcome, CommitError) else outcome
                if request.request_id and isinstance(cause, AlreadyExistsError):
                    raced.append(i)  # perhaps a concurrent retry of this request: look below
                results[i].violations.append(_store_violation(f"jobs[{i}]", outcome))
            else:
                results[i].created = True
                results[i].resource_version = outcome[0]
        if raced:
            # Two attempts of one request raced (the first was still running when the client
            # retried): the loser reports the winner's job instead of AlreadyExists.
            stored_now = await self.store.get_many(pb.Job, [names[i] for i in raced])
            for i, now in zip(raced, stored_now, strict=True):
                if isinstance(now, pb.Job) and _is_replay(request.request_id, jobs[i], now):
                    del results[i].violations[:]
                    results[i].existing = True
                    results[i].resource_version = now.metadata.resource_version
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

    async def _finish(
        self,
        unfinished: list[int],
        units: dict[int, pb.Job],
        preemptible: dict[int, bool],
        outcomes: list[list[int] | StoreError],
        valid: list[int],
    ) -> None:
        """Create the rest of the pods of the big jobs whose first commit succeeded, one job
        after another, so the reply says every pod is stored."""
        stored = {i for i, o in zip(valid, outcomes, strict=True) if not isinstance(o, StoreError)}
        for i in unfinished:
            if i not in stored:
                continue
            try:
                await self.creator.finish(units[i], preemptible[i])
            except StoreError as exc:
                # The job is stored, and marked: the reconciler finishes it (and the job is
                # reported created, as it is).
                log.warning(
                    "job's pods not all created; the reconciler finishes them",
                    job=units[i].metadata.name,
                    error=str(exc),
                )

    # -----------------------------------------------------------------------------------------
    # Apply
    # -----------------------------------------------------------------------------------------

    async def Apply(self, request: api_pb2.ApplyRequest, context: Any) -> api_pb2.ApplyResponse:
        try:
            for attempt in range(_CAS_RETRIES):
                try:
                    return await self._apply(request)
                except CommitError as exc:
                    # Someone wrote one of these objects between our read and our commit; the
                    # client asked for no particular version, so merge again.
                    cas = any(o.metadata.resource_version for o in _applied(request))  # type: ignore[attr-defined]
                    if cas or attempt == _CAS_RETRIES - 1:
                        await _abort(context, grpc.StatusCode.ABORTED, str(exc.cause))
        except _Aborted as exc:
            await _abort(context, grpc.StatusCode.ABORTED, str(exc))
        except _Refused as exc:
            await _abort(context, grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except StoreUnavailableError as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        raise AssertionError("unreachable")

    async def _apply(self, request: api_pb2.ApplyRequest) -> api_pb2.ApplyResponse:
        if request.objects and (why := tenancy.apply_refusal(caller())) is not None:
            raise _Refused(why)
        results: list[api_pb2.ApplyResult] = []
        checked: list[tuple[int, str, Message]] = []
        seen: dict[tuple[str, str], int] = {}
        for i, wrapped in enumerate(request.objects):
            prefix = f"objects[{i}]"
            field = wrapped.WhichOneof("kind")
            if field is None:
                results.append(_invalid("", "", f"{prefix}", "empty object: set one kind"))
                continue
            kind, obj = unwrap(wrapped)
            name = obj.metadata.name  # type: ignore[attr-defined]
            if kind not in USER_KINDS:
                results.append(
                    _invalid(kind, name, f"{prefix}.{field}", f"{kind} is managed by the system")
                )
                continue
            # A new job is validated as a submission (below), a stored one by what may change.
            found = [] if kind == "Job" else _validate_applied(kind, obj, f"{prefix}.{field}")
            if (kind, name) in seen:
                found.append(
                    v.violation(
                        f"{prefix}.{field}.metadata.name",
                        f"duplicate of objects[{seen[kind, name]}]",
                    )
                )
            seen.setdefault((kind, name), i)
            results.append(api_pb2.ApplyResult(kind=kind, name=name, violations=found))
            if found:
                results[-1].action = "invalid"
            else:
                checked.append((i, kind, obj))

        checked = self._refuse_queue_cycles(checked, results)
        current: dict[tuple[str, str], Message | None] = {}
        for kind in USER_KINDS:
            names = [o.metadata.name for _, k, o in checked if k == kind]  # type: ignore[attr-defined]
            cls = kinds_mod.kind_named(kind).message
            for name, got in zip(names, await self.store.get_many(cls, names), strict=True):
                current[kind, name] = got

        ops: list[Op] = []
        targets: list[tuple[int, Message]] = []
        new_jobs: list[tuple[int, pb.Job]] = []
        for i, kind, obj in checked:
            name = obj.metadata.name  # type: ignore[attr-defined]
            existing = current[kind, name]
            wanted = obj.metadata.resource_version  # type: ignore[attr-defined]
            if wanted and (existing is None or existing.metadata.resource_version != wanted):  # type: ignore[attr-defined]
                have = existing.metadata.resource_version if existing else "absent"  # type: ignore[attr-defined]
                raise _Aborted(
                    f"{kind} {name!r} is not at resource_version {wanted} (it is {have})"
                )
            if isinstance(obj, pb.Job):
                if existing is None:
                    new_jobs.append((i, obj))
                    continue
                assert isinstance(existing, pb.Job)
                changed, immutable = _job_update(existing, obj)
                if immutable:
                    results[i].action = "invalid"
                    results[i].violations.extend(
                        v.violation(f"objects[{i}].job.{path}", why) for path, why in immutable
                    )
                    continue
                if changed == existing:
                    results[i].action = "unchanged"
                    results[i].resource_version = existing.metadata.resource_version
                    continue
                results[i].action = "configured"
                ops.append(Update(changed))
                targets.append((i, changed))
                continue
            if existing is None:
                new = _fresh(obj)
                results[i].action = "created"
                ops.append(Create(new))
            else:
                new = _merge(kind, existing, obj)
                if new == existing:
                    results[i].action = "unchanged"
                    results[i].resource_version = existing.metadata.resource_version  # type: ignore[attr-defined]
                    continue
                results[i].action = "configured"
                ops.append(Update(new))
            targets.append((i, new))
        if ops and not request.dry_run:
            try:
                await self.store.commit(ops)
            except CommitError as exc:
                if isinstance(exc.cause, ConflictError | AlreadyExistsError | NotFoundError):
                    raise
                i = targets[exc.index][0]
                results[i].action = "invalid"
                results[i].violations.append(_store_violation(f"objects[{i}]", exc.cause))
                return api_pb2.ApplyResponse(results=results)
            for i, new in targets:
                results[i].resource_version = new.metadata.resource_version  # type: ignore[attr-defined]
        if new_jobs:
            await self._create_jobs(request, new_jobs, results)
        return api_pb2.ApplyResponse(results=results)

    async def _create_jobs(
        self,
        request: api_pb2.ApplyRequest,
        jobs: list[tuple[int, pb.Job]],
        results: list[api_pb2.ApplyResult],
    ) -> None:
        """Applied jobs not stored yet go through Submit: validated as submissions, stored with
        their pods, and found again by a retry of the same request."""
        submitted = await self._submit(
            api_pb2.SubmitRequest(
                jobs=[job for _, job in jobs],
                dry_run=request.dry_run,
                request_id=request.request_id,
            )
        )
        for (i, _), outcome in zip(jobs, submitted.results, strict=True):
            result = results[i]
            for violation in outcome.violations:
                # "jobs[k].spec.x" of the submission is "objects[i].job.spec.x" of this request.
                _, _, rest = violation.field.partition(".")
                result.violations.append(
                    v.violation(
                        f"objects[{i}].job" + (f".{rest}" if rest else ""), violation.description
                    )
                )
            if result.violations:
                result.action = "invalid"
            else:
                result.action = "created"
                result.resource_version = outcome.resource_version

    # -----------------------------------------------------------------------------------------
    # Reads
    # -----------------------------------------------------------------------------------------

    async def Get(self, request: api_pb2.GetRequest, context: Any) -> api_pb2.Object:
        try:
            kind = _kind(request.kind)
            obj = await self.store.get(kind.message, request.name)
            if isinstance(obj, pb.Node):
                await self._live_heartbeats([obj])
            elif isinstance(obj, pb.Pod):
                self._show_nominations([obj])
            elif isinstance(obj, pb.Job):
                obj = self.pods.job_as_read(obj)
        except InvalidObjectError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except NotFoundError as exc:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except StoreUnavailableError as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        await _refuse_if(context, tenancy.read_refusal(caller(), kind.name, obj))
        return wrap(kind.name, obj)

    async def List(self, request: api_pb2.ListRequest, context: Any) -> api_pb2.ListResponse:
        try:
            kind = _kind(request.kind)
        except InvalidObjectError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if request.job and kind.name != "Pod":
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "job: only Pods have a job")
        if not 0 <= request.limit <= MAX_PAGE:
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"limit: must be within 0..{MAX_PAGE}"
            )
        snapshot_id, after = "", ""
        if request.continue_token:
            try:
                snapshot_id, after = listing.decode_token(request.continue_token)
            except listing.MalformedTokenError as exc:
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        selects = await _selector(request, context)
        identity = caller()
        limit = request.limit or DEFAULT_PAGE
        # What a snapshot was made for: another request may not page through it.
        key = (
            kind.name,
            request.selector,
            tuple(sorted(request.label_selector.items())),
            request.job,
            identity,
        )
        kept = self.snapshots.window(snapshot_id, key, after, limit + 1) if snapshot_id else None
        if kept is not None:
            window, revision = kept
        else:
            try:
                items, revision = await self._listing(kind.name, kind.message)
            except StoreUnavailableError as exc:
                await _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
            matches = (
                o
                for o in items
                if o.metadata.name > after  # type: ignore[attr-defined]
                and selects(o.metadata.labels)  # type: ignore[attr-defined]
                and (not request.job or o.spec.job == request.job)  # type: ignore[attr-defined]
                and tenancy.owns(identity, kind.name, o)
            )
            picked: Sequence[Message]
            if kind.name in ENCODED_KINDS:  # kept encoded: a million decoded pods are 2.6 GiB
                picked = EncodedList(kind.message, matches)
            else:
                picked = sorted(matches, key=lambda o: o.metadata.name)  # type: ignore[attr-defined]
            window = picked[: limit + 1]
            snapshot_id = self.snapshots.keep(key, picked, revision) if len(picked) > limit else ""
        page = [wrap(kind.name, o) for o in window[:limit]]  # copies: the cache stays untouched
        if kind.name == "Pod":
            self._show_nominations([o.pod for o in page])
        if kind.name == "Job":
            for o in page:
                if derives_status(o.job):
                    o.job.status.CopyFrom(self.pods.job_as_read(o.job).status)
        if kind.name == "Node":
            try:
                await self._live_heartbeats([o.node for o in page])
            except StoreUnavailableError as exc:
                await _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        token = ""
        if len(window) > limit:
            last = window[limit - 1].metadata.name  # type: ignore[attr-defined]
            token = listing.encode_token(snapshot_id, last)
        elif snapshot_id:
            self.snapshots.drop(snapshot_id)  # the last page
        return api_pb2.ListResponse(items=page, resource_version=revision, continue_token=token)

    async def _listing(self, kind: str, message: type[Message]) -> tuple[Iterable[Message], int]:
        """Every object of a kind, at least as new as the store's current revision (so a List
        sees the caller's own writes). Kinds the dispatcher watches come from its informer
        cache, once it has caught up with that revision, instead of decoding the whole kind
        from the store for each page; the store is the fallback when the view lags."""
        informer = self.core.informer
        if kind in informer.kinds:
            revision = await self.store.revision()
            try:
                await informer.wait_for_revision(revision, LIST_CATCH_UP_SECONDS)
            except TimeoutError:
                pass
            else:
                # Read lazily: pods are decoded one at a time as the caller filters them.
                return informer.cache[kind].values(), informer.revision
        return await self.store.list_all(message)

    # -----------------------------------------------------------------------------------------
    # Delete
    # -----------------------------------------------------------------------------------------

    async def Delete(self, request: api_pb2.DeleteRequest, context: Any) -> api_pb2.DeleteResponse:
        try:
            kind = _kind(request.kind)
            if not tenancy.unrestricted(identity := caller()):
                stored = await self.store.get_many(kind.message, [request.name])
                await _refuse_if(context, tenancy.delete_refusal(identity, kind.name, stored[0]))
            if kind.name == "Job":
                deleted = await self._delete_job(request.name, request.resource_version)
                self.core.revoke(request.name)
                return api_pb2.DeleteResponse(deleted=deleted)
            await self.store.delete(
                kind.message, request.name, expected_version=request.resource_version
            )
            return api_pb2.DeleteResponse(deleted=1)
        except InvalidObjectError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except NotFoundError as exc:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except (ConflictError, _Aborted) as exc:
            await _abort(context, grpc.StatusCode.ABORTED, str(exc))
        except StoreUnavailableError as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))

    def _replacement_pods(self, job: str) -> list[str]:
        """Pods of ``job`` by the informer (replacements are not ``<job>-<index>``): a scan,
        for a servicer built without the dispatcher's pod index."""
        return [
            p.metadata.name  # type: ignore[attr-defined]
            for p in self.core.informer.each("Pod")
            if p.spec.job == job  # type: ignore[attr-defined]
        ]

    async def _delete_job(self, name: str, expected: int) -> int:
        """The job and every pod of it (bound pods return their claims): one commit, or in
        chunks for a big job (``deletion.JobDeleter``)."""
        job = await self.store.get(pb.Job, name)
        try:
            return await self.deleter.delete(job, expected)
        except CommitError as exc:
            raise _Aborted(str(exc.cause)) from exc

    # -----------------------------------------------------------------------------------------
    # Explain
    # -----------------------------------------------------------------------------------------

    async def _live_heartbeats(self, nodes: list[pb.Node]) -> None:
        """Serve each node's last heartbeat from the store's heartbeat hash: the stored Node
        keeps its registration time, since heartbeats stay out of the change feed."""
        if not nodes:
            return
        beats = (await self.store.heartbeats()).last_ms
        for node in nodes:
            node.status.heartbeat_ms = beats.get(node.metadata.name, node.status.heartbeat_ms)

    def _show_nominations(self, pods: list[pb.Pod]) -> None:
        """Fill ``status.nominated_node`` of pending preemptors from the dispatcher's memory
        (see services/dispatcher/dispatching/nominations.py): the stored pod never carries it."""
        if not len(self.core.nominations):
            return
        for pod in pods:
            if is_pending(pod):
                nomination = self.core.nominations.of(pod.spec.job, pod.metadata.name)
                if nomination is not None:
                    pod.status.nominated_node = nomination.node

    async def Explain(
        self, request: api_pb2.ExplainRequest, context: Any
    ) -> api_pb2.ExplainResponse:
        try:
            pod = await self.store.get(pb.Pod, request.pod)
        except NotFoundError as exc:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except StoreUnavailableError as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        await _refuse_if(context, tenancy.read_refusal(caller(), "Pod", pod))
        return self.explain(pod)

    def explain(self, pod: pb.Pod) -> api_pb2.ExplainResponse:
        out = api_pb2.ExplainResponse(
            pod=pod.metadata.name,
            phase=pod.status.phase,
            node=pod.spec.node_name,
            scheduler=pod.status.scheduler,
        )
        if pod.status.phase in (pb.POD_SUCCEEDED, pb.POD_FAILED) and pod.status.reason:
            # Ended (an evicted pod keeps its node): why, and by whom (e.g. its preemptor).
            phase = pb.PodPhase.Name(pod.status.phase)
            out.summary = f"{phase}: {pod.status.reason}"
            if pod.status.message:
                out.summary += f": {pod.status.message}"
            return out
        if pod.spec.node_name:
            out.summary = f"bound to {pod.spec.node_name}"
            if pod.status.phase != pb.POD_BOUND:
                out.summary += f" ({pb.PodPhase.Name(pod.status.phase)})"
            return out
        if not is_pending(pod):
            phase = pb.PodPhase.Name(pod.status.phase)
            out.summary = f"{phase}: {pod.status.reason or pod.status.message or 'not scheduled'}"
            return out
        nomination = self.core.nominations.of(pod.spec.job, pod.metadata.name)
        if nomination is not None:
            # In flight with the Binder: an earlier attempt's condition is no longer the story.
            out.nominated_node = nomination.node
            out.victims.extend(nomination.victims)
            count = len(nomination.victims)
            out.summary = (
                f"preempting {count} pod{'' if count == 1 else 's'} on {nomination.node}: "
                + ", ".join(nomination.victims)
            )
            return out
        for cond in pod.status.conditions:
            if cond.type == "PodScheduled" and cond.status == "False":
                out.summary = cond.message or cond.reason
                out.last_attempt_ms = cond.last_transition_ms
                if pod.status.HasField("unschedulable"):
                    # The shard's counts as it recorded them: no sentence is parsed back.
                    out.diagnosis.CopyFrom(pod.status.unschedulable)
                    out.total_nodes = pod.status.unschedulable.total_nodes
                    out.reasons.extend(pod.status.unschedulable.reasons)
                return out
        out.summary = self.core.describe(pod.spec.job)
        return out

    # -----------------------------------------------------------------------------------------
    # Drain
    # -----------------------------------------------------------------------------------------

    async def Drain(self, request: api_pb2.DrainRequest, context: Any) -> api_pb2.DrainResponse:
        try:
            return await self._drain(request)
        except NotFoundError as exc:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except ConflictError as exc:
            await _abort(context, grpc.StatusCode.ABORTED, str(exc))
        except EvictError as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        except StoreUnavailableError as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))

    async def _drain(self, request: api_pb2.DrainRequest) -> api_pb2.DrainResponse:
        """Cordon the node, then evict each of its pods through the Binder (the one eviction
        path, which charges disruption budgets): one request per pod, so a pod its budget
        protects now waits without holding back the others."""
        node = await self.store.get(pb.Node, request.node)
        out = api_pb2.DrainResponse()
        if not node.spec.unschedulable and not request.dry_run:
            node.spec.unschedulable = True
            await self.store.update(node)
            out.cordoned = True
        pods = sorted(
            (
                p
                for p in self.core.informer.each("Pod")
                if isinstance(p, pb.Pod) and p.spec.node_name == request.node and holds_claim(p)
            ),
            key=lambda p: p.metadata.name,
        )
        if request.dry_run:
            for pod in pods:
                out.pods.add(pod=pod.metadata.name, outcome="would evict")
        elif pods:
            evictor = self.core.evictor
            if evictor is None:
                raise EvictError("this dispatcher has no way to reach the Binder")
            # One partial request: each pod its disruption budgets allow goes, the rest wait.
            response = await evictor.evict(
                ipb.EvictRequest(
                    pods=[ipb.PodRef(name=p.metadata.name, uid=p.metadata.uid) for p in pods],
                    reason=DRAINED,
                    message=f"node {request.node} drained",
                    partial=True,
                )
            )
            for result in response.results:
                if result.outcome == ipb.EvictResult.EVICTED:
                    out.pods.add(pod=result.pod, outcome="evicted", replacement=result.replacement)
                elif result.outcome == ipb.EvictResult.REFUSED:
                    out.pods.add(pod=result.pod, outcome="waiting", reason=result.reason)
        log.info(
            "drain",
            node=request.node,
            evicted=sum(p.outcome == "evicted" for p in out.pods),
            waiting=sum(p.outcome == "waiting" for p in out.pods),
        )
        return out

    # -----------------------------------------------------------------------------------------
    # Watch
    # -----------------------------------------------------------------------------------------

    async def Watch(
        self, request: api_pb2.WatchRequest, context: Any
    ) -> AsyncIterator[api_pb2.WatchEvent]:
        try:
            kinds = [_kind(k).name for k in request.kinds] or list(kinds_mod.KINDS)
        except InvalidObjectError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if request.from_revision < 0:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "from_revision: negative")
        if request.job and not set(kinds) <= {"Job", "Pod"}:
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, "job: only Jobs and Pods have a job"
            )
        matches = _watch_filter(await _selector(request, context), request.job, caller())
        revision = request.from_revision
        # A one-pod job's status is derived from its pod (controllers.as_read): the feed has no
        # update of the job when its pod changes, so a watcher of Jobs gets one made from the
        # pod's, at the pod's revision. Pods are read for that even when not asked for.
        jobs_wanted, pods_wanted = "Job" in kinds, "Pod" in kinds
        feed_kinds = [*kinds, "Pod"] if jobs_wanted and not pods_wanted else kinds
        try:
            if revision == 0:
                snapshot = await self.store.list_kinds(kinds)
                for kind, objs in snapshot.items.items():
                    for obj in sorted(objs, key=lambda o: o.metadata.resource_version):  # type: ignore[attr-defined]
                        if isinstance(obj, pb.Job):
                            obj = self.pods.job_as_read(obj)
                        if matches(kind, obj):
                            yield api_pb2.WatchEvent(
                                type=api_pb2.WatchEvent.ADDED,
                                object=wrap(kind, obj),
                                revision=obj.metadata.resource_version,  # type: ignore[attr-defined]
                            )
                revision = snapshot.revision
                yield api_pb2.WatchEvent(type=api_pb2.WatchEvent.BOOKMARK, revision=revision)
            async for batch in self.store.watch(
                revision, feed_kinds, keep=_of_job(request.job) if request.job else None
            ):
                sent = False
                for event in batch.events:
                    if event.obj is None:
                        continue
                    obj = event.obj
                    if jobs_wanted and isinstance(obj, pb.Pod) and event.type != "DELETED":
                        job = await self._job_of_changed_pod(obj, event.type)
                        if job is not None and matches("Job", job):
                            sent = True
                            yield api_pb2.WatchEvent(
                                type=api_pb2.WatchEvent.MODIFIED,
                                object=wrap("Job", job),
                                revision=event.revision,
                            )
                        if not pods_wanted:
                            continue
                    elif isinstance(obj, pb.Job) and event.type == "ADDED":
                        obj = as_read(obj, ())  # created with its pods: nothing of it placed
                    elif isinstance(obj, pb.Job) and event.type == "MODIFIED":
                        obj = self.pods.job_as_read(obj)
                    if not matches(event.kind, obj):
                        continue
                    sent = True
                    yield api_pb2.WatchEvent(
                        type=_EVENT[event.type],
                        object=wrap(event.kind, obj),
                        revision=event.revision,
                    )
                if not sent:
                    # Nothing (or nothing matching): tell the watcher how far the feed got, so
                    # it resumes from here rather than re-reading changes it does not want.
                    yield api_pb2.WatchEvent(
                        type=api_pb2.WatchEvent.BOOKMARK, revision=batch.revision
                    )
        except ResourceVersionTooNewError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"from_revision: {exc}")
        except ResourceVersionTooOldError as exc:
            await _abort(context, grpc.StatusCode.OUT_OF_RANGE, str(exc))
        except StoreUnavailableError as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))

    async def _job_of_changed_pod(self, pod: pb.Pod, event_type: str) -> pb.Job | None:
        """The job of a pod that changed, as read now, if its status is derived from that pod
        (a one-pod job); None for other jobs, whose status updates are in the feed. A pod's
        creation changes nothing: its job was just created with it, pending."""
        if event_type == "ADDED" or not pod.spec.job:
            return None
        job = self.core.informer.get("Job", pod.spec.job)
        if job is None:  # the view lags the feed: ask the store
            job = (await self.store.get_many(pb.Job, [pod.spec.job]))[0]
        if not isinstance(job, pb.Job) or not derives_status(job):
            return None
        return self.pods.job_as_read(job, newer=pod)


async def _selector(
    request: api_pb2.ListRequest | api_pb2.WatchRequest, context: Any
) -> Callable[[Mapping[str, str]], bool]:
    """Whether labels match a request's selectors: the equality map and the selector text (an
    unparsable text is INVALID_ARGUMENT, never ignored)."""
    try:
        parsed = labelselector.parse(request.selector)
    except labelselector.SelectorSyntaxError as exc:
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"selector: {exc}")
    equal = dict(request.label_selector)

    def selects(labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == val for k, val in equal.items()) and labelselector.matches(
            parsed, labels
        )

    return selects


def _watch_filter(
    selects: Callable[[Mapping[str, str]], bool], job: str, identity: Identity | None = None
) -> Callable[[str, Message], bool]:
    """Whether a watched object matches a WatchRequest's label selectors and job, and is one
    the caller may see (a tenant's own jobs and pods; a filtered-out change is a bookmark)."""

    def matches(kind: str, obj: Message) -> bool:
        if not tenancy.owns(identity, kind, obj):
            return False
        if not selects(obj.metadata.labels):  # type: ignore[attr-defined]
            return False
        if not job:
            return True
        if kind == "Job":
            return bool(obj.metadata.name == job)  # type: ignore[attr-defined]
        return kind == "Pod" and bool(obj.spec.job == job)  # type: ignore[attr-defined]

    return matches


def _of_job(job: str) -> Callable[[str, bytes], bool]:
    """Whether a change of the feed may be of ``job`` or its pods, by the object's name alone
    (pods are ``<job>-<index>``, replacements ``<job>-<index>-r<n>``), so a watch of one job
    decodes only those: ``_watch_filter`` then decides on the object itself."""
    name, pods = job.encode(), f"{job}-".encode()

    def named(kind: str, obj_name: bytes) -> bool:
        return obj_name == name if kind == "Job" else obj_name.startswith(pods)

    return named


class _Aborted(Exception):
    """A compare-and-set the client asked for failed: answered with ABORTED."""


class _Refused(Exception):
    """The caller's identity may not do this (``tenancy``): answered with PERMISSION_DENIED."""


async def _refuse_if(context: Any, refusal: str | None) -> None:
    if refusal is not None:
        await _abort(context, grpc.StatusCode.PERMISSION_DENIED, refusal)


def _owner() -> str:
    """What a new job's ``metadata.owner`` is: the calling tenant; empty for the admin."""
    identity = caller()
    return "" if tenancy.unrestricted(identity) or identity is None else identity.name


def _applied(request: api_pb2.ApplyRequest) -> Sequence[Message]:
    out = []
    for wrapped in request.objects:
        field = wrapped.WhichOneof("kind")
        if field is not None:
            out.append(getattr(wrapped, field))
    return out


def _invalid(kind: str, name: str, field: str, description: str) -> api_pb2.ApplyResult:
    return api_pb2.ApplyResult(
        kind=kind, name=name, action="invalid", violations=[v.violation(field, description)]
    )


def _validate_applied(kind: str, obj: Message, prefix: str) -> v.Violations:
    if isinstance(obj, pb.Node):
        return v.validate_node(obj, prefix)
    if isinstance(obj, pb.Queue):
        return v.validate_queue(obj, prefix)
    assert isinstance(obj, pb.DisruptionBudget)
    return v.validate_budget(obj, prefix)


def _fresh(obj: Message) -> Message:
    new = type(obj)()
    new.CopyFrom(obj)
    meta = new.metadata  # type: ignore[attr-defined]
    meta.resource_version = 0
    meta.uid = ""
    meta.creation_timestamp_ms = 0
    meta.deletion_timestamp_ms = 0
    return new


def _merge(kind: str, existing: Message, applied: Message) -> Message:
    """The stored object with what a user may declare replaced: labels, annotations, spec, and
    for a node its capacities and topology (heartbeat, readiness and conditions stay the node
    agent's)."""
    new = type(existing)()
    new.CopyFrom(existing)
    meta, src = new.metadata, applied.metadata  # type: ignore[attr-defined]
    meta.labels.clear()
    meta.labels.update(src.labels)
    meta.annotations.clear()
    meta.annotations.update(src.annotations)
    if applied.HasField("spec"):
        new.spec.CopyFrom(applied.spec)  # type: ignore[attr-defined]
    else:
        new.ClearField("spec")
    if kind == "Node":
        assert isinstance(new, pb.Node) and isinstance(applied, pb.Node)
        for name in ("allocatable", "reclaimable", "topology"):
            # CopyFrom of an absent field would make it present: "unchanged" would never hold.
            if applied.status.HasField(name):
                getattr(new.status, name).CopyFrom(getattr(applied.status, name))
            else:
                new.status.ClearField(name)  # type: ignore[arg-type]
    return new


def _job_update(stored: pb.Job, applied: pb.Job) -> tuple[pb.Job, list[tuple[str, str]]]:
    """The stored job with what ``applied`` may change (labels, annotations, MUTABLE_JOB_SPEC),
    and each field it would change that may not: (path, why)."""
    wanted = normalise_job(applied)
    new = pb.Job()
    new.CopyFrom(stored)
    meta = new.metadata
    meta.labels.clear()
    meta.labels.update(applied.metadata.labels)
    system = {
        k: val
        for k, val in stored.metadata.annotations.items()
        if k.startswith(SYSTEM_ANNOTATION_PREFIX)
    }
    meta.annotations.clear()
    meta.annotations.update({**system, **applied.metadata.annotations})
    # How far its pods' creation got is the system's alone to say.
    meta.annotations.pop(PODS_CREATED_ANNOTATION, None)
    if PODS_CREATED_ANNOTATION in system:
        meta.annotations[PODS_CREATED_ANNOTATION] = system[PODS_CREATED_ANNOTATION]
    immutable: list[tuple[str, str]] = []
    for path in _differences(stored.spec, wanted.spec, "spec"):
        top = path.split(".")[1].split("[")[0]
        if top in MUTABLE_JOB_SPEC:
            continue
        immutable.append((path, "is immutable: delete the job and apply it again to change it"))
    new.spec.replace_lost_pods = wanted.spec.replace_lost_pods
    if wanted.spec.HasField("backoff_limit"):
        new.spec.backoff_limit = wanted.spec.backoff_limit
    else:
        new.spec.ClearField("backoff_limit")
    return new, immutable


def _differences(a: Message, b: Message, path: str) -> list[str]:
    """The fields (dotted paths) where two messages of one type differ: into singular
    messages, whole for repeated fields and maps."""
    out: list[str] = []
    for fd in a.DESCRIPTOR.fields:
        here = f"{path}.{fd.name}"
        if fd.message_type is not None and not fd.is_repeated:
            if a.HasField(fd.name) or b.HasField(fd.name):
                out += _differences(getattr(a, fd.name), getattr(b, fd.name), here)
        elif fd.has_presence and a.HasField(fd.name) != b.HasField(fd.name):
            out.append(here)
        elif getattr(a, fd.name) != getattr(b, fd.name):
            out.append(here)
    return out


def _store_violation(prefix: str, exc: StoreError) -> api_pb2.FieldViolation:
    cause = exc.cause if isinstance(exc, CommitError) else exc
    if isinstance(cause, AlreadyExistsError):
        what = "job" if cause.kind == "Job" else cause.kind.lower()
        return v.violation(
            f"{prefix}.metadata.name", f"AlreadyExists: {what} {cause.name!r} already exists"
        )
    if isinstance(cause, InvalidObjectError):
        field = f"{prefix}.{cause.field}" if cause.field else prefix
        return v.violation(field, cause.reason)
    return v.violation(prefix, f"the store rejected it: {cause}")


def _is_replay(request_id: str, submitted: pb.Job, stored: pb.Job) -> bool:
    """Whether ``stored`` is what an earlier attempt of this request made of ``submitted``: the
    same request id and the same spec (a different spec under a reused id is a client's bug, and
    answered with AlreadyExists like any other clash)."""
    return (
        bool(request_id)
        and stored.metadata.annotations.get(REQUEST_ID_ANNOTATION) == request_id
        and stored.spec == normalise_job(submitted).spec
    )


def _preemptible_default(job: pb.Job, queues: dict[str, pb.Queue]) -> bool:
    """What the job's pods' ``preemptible`` defaults to: its queue's ``preemptible_default`` (a
    queue that is not stored, e.g. "default" before anyone applied it, defaults to false)."""
    queue = queues.get(job.spec.queue)
    return queue is not None and queue.spec.preemptible_default
