"""Apply (Node, Queue, DisruptionBudget, PriorityClass, Reservation; a Job's labels, annotations,
failure policy and schedule timeout; a timed-out gang applied again is restarted, as RetryJob
does): every valid object in one atomic commit, each reported ``created`` / ``configured`` /
``unchanged`` / ``invalid``. With ``metadata.resource_version`` set it is a compare-and-set (a
mismatch is ABORTED, nothing written); without, a concurrent write is merged again
(``_CAS_RETRIES``). A job not stored yet goes through Submit. A tenant applies only Jobs (into its
queues, and over stored jobs only its own) and Reservations (``services.tenancy``); one object it
may not apply refuses the whole request (PERMISSION_DENIED). A priority class may change only
its globalDefault, description, labels and annotations, and at most one class is the
globalDefault (``services/dispatcher/priorityclasses.py``). A Reservation is checked against its
node as stored (``reservations``) and stored with the caller's tenant as its owner."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

import grpc
from google.protobuf.message import Message

from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services import tenancy
from services.dispatcher import priorityclasses
from services.dispatcher.api import reservations
from services.dispatcher.api import validation as v
from services.dispatcher.api.rpc import Aborted, Refused, abort, store_violation
from services.dispatcher.api.submit import SubmitRpc
from services.dispatcher.controllers.gangtimeout import restarted
from services.dispatcher.controllers.podindex import PodIndex
from services.dispatcher.controllers.pods import normalise_job
from services.dispatcher.objects import PODS_CREATED_ANNOTATION, metadata_of
from services.runtime.auth import caller
from store import (
    AlreadyExistsError,
    CommitError,
    ConflictError,
    NotFoundError,
    Store,
    StoreUnavailableError,
)
from store import kinds as kinds_mod
from store.client import Create, Op, Update
from store.informer import Informer
from store.kinds import USER_KINDS, unwrap

_CAS_RETRIES = 3
# What an applied Job may change of a stored one (besides labels and annotations): what the job
# controller reads from the job. The rest is copied into its pods or decided its placement.
MUTABLE_JOB_SPEC = frozenset({"backoff_limit", "replace_lost_pods", "schedule_timeout_seconds"})
# Annotations the system sets on a job (e.g. its request id): an applied manifest without them
# keeps them.
SYSTEM_ANNOTATION_PREFIX = "godel.io/"

# What Apply merges into a stored object (a stored Job changes by _job_update instead), and
# what a Node declares of its status (the rest is its agent's).
_MERGED_MESSAGES = (pb.Node, pb.Queue, pb.DisruptionBudget)
_DECLARED_NODE_STATUS: tuple[Literal["allocatable", "reclaimable", "topology"], ...] = (
    "allocatable",
    "reclaimable",
    "topology",
)

# An object of the request that passed its checks: (its index in the request, kind, object).
Checked = tuple[int, str, Message]


class ApplyRpc:
    def __init__(
        self,
        store: Store,
        informer: Informer,
        submitter: SubmitRpc,
        pods: PodIndex | None = None,
    ) -> None:
        self.store = store
        self.informer = informer
        self.submitter = submitter
        # Pods by node, for a new reservation's room on its node (None: that check is skipped).
        self.pods = pods

    async def Apply(self, request: api_pb2.ApplyRequest, context: Any) -> api_pb2.ApplyResponse:
        try:
            for attempt in range(_CAS_RETRIES):
                try:
                    return await self._apply(request)
                except CommitError as exc:
                    # Someone wrote one of these objects between our read and our commit; the
                    # client asked for no particular version, so merge again.
                    cas = any(metadata_of(o).resource_version for o in _applied(request))
                    if cas or attempt == _CAS_RETRIES - 1:
                        await abort(context, grpc.StatusCode.ABORTED, str(exc.cause))
        except Aborted as exc:
            await abort(context, grpc.StatusCode.ABORTED, str(exc))
        except Refused as exc:
            await abort(context, grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except StoreUnavailableError as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        raise AssertionError("unreachable")

    async def _apply(self, request: api_pb2.ApplyRequest) -> api_pb2.ApplyResponse:
        identity = caller()
        # A refused object refuses the whole request before anything is read or written.
        if not tenancy.unrestricted(identity):
            for wrapped in request.objects:
                if wrapped.WhichOneof("kind") is not None:
                    _refuse_if(tenancy.apply_refusal(identity, *unwrap(wrapped)))
        results, checked = _check(request)
        checked = self._refuse_queue_cycles(checked, results)
        checked = await self._check_reservation_nodes(checked, results)
        tenant = "" if tenancy.unrestricted(identity) or identity is None else identity.name
        for _, _, obj in checked:
            if isinstance(obj, pb.Reservation):
                obj.metadata.owner = tenant  # never what the request said
        current: dict[tuple[str, str], Message | None] = {}
        for kind in USER_KINDS:
            names = [metadata_of(o).name for _, k, o in checked if k == kind]
            cls = kinds_mod.kind_named(kind).message
            for name, got in zip(names, await self.store.get_many(cls, names), strict=True):
                current[kind, name] = got
        if not tenancy.unrestricted(identity):
            for (kind, _), stored in current.items():
                if stored is not None:
                    _refuse_if(tenancy.apply_over_refusal(identity, kind, stored))
        checked = await self._refuse_class_conflicts(checked, current, results)
        ops, targets, new_jobs = _plan(checked, current, results)
        if ops and not request.dry_run:
            try:
                await self.store.commit(ops)
            except CommitError as exc:
                if isinstance(exc.cause, ConflictError | AlreadyExistsError | NotFoundError):
                    raise
                i = targets[exc.index][0]
                results[i].action = "invalid"
                results[i].violations.append(store_violation(f"objects[{i}]", exc.cause))
                return api_pb2.ApplyResponse(results=results)
            for i, new in targets:
                results[i].resource_version = metadata_of(new).resource_version
        if new_jobs:
            await self._create_jobs(request, new_jobs, results)
        return api_pb2.ApplyResponse(results=results)

    def _refuse_queue_cycles(
        self, checked: list[Checked], results: list[api_pb2.ApplyResult]
    ) -> list[Checked]:
        """Queues whose parents would lead back to them (with the queues known and this
        request's) are invalid; the rest of the request stands."""
        parents = {
            q.metadata.name: q.spec.parent
            for q in self.informer.list("Queue")
            if isinstance(q, pb.Queue)
        }
        for _, _, obj in checked:
            if isinstance(obj, pb.Queue):
                parents[obj.metadata.name] = obj.spec.parent
        cycles = v.queue_cycles(parents)
        kept = []
        for i, kind, obj in checked:
            name = metadata_of(obj).name
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

    async def _refuse_class_conflicts(
        self,
        checked: list[Checked],
        current: dict[tuple[str, str], Message | None],
        results: list[api_pb2.ApplyResult],
    ) -> list[Checked]:
        """Priority classes that would change what their jobs were admitted with (value,
        policy, preemptibility), or be a second globalDefault (with the stored classes and this
        request's), are invalid; the rest of the request stands."""
        applied = [(i, o) for i, _, o in checked if isinstance(o, pb.PriorityClass)]
        if not applied:
            return checked
        defaults: dict[str, str] = {}  # globalDefault class -> where it is
        if any(o.global_default for _, o in applied):
            stored, _ = await self.store.list_all(pb.PriorityClass)
            defaults = {c.metadata.name: "" for c in stored if c.global_default}
        refused: set[int] = set()
        for i, obj in applied:
            name, field = obj.metadata.name, f"objects[{i}].priority_class"
            existing = current.get(("PriorityClass", name))
            if isinstance(existing, pb.PriorityClass):
                for changed in priorityclasses.immutable_changes(existing, obj):
                    refused.add(i)
                    results[i].violations.append(
                        v.violation(
                            f"{field}.{changed}",
                            "is immutable: its jobs were admitted with it; delete the class "
                            "(once no job names it) and apply it again to change it",
                        )
                    )
            others = [n for n in defaults if n != name]
            if obj.global_default and others:
                refused.add(i)
                results[i].violations.append(
                    v.violation(
                        f"{field}.global_default",
                        f"priority class {others[0]!r}{defaults[others[0]]} is already the "
                        "globalDefault: at most one class is",
                    )
                )
            elif obj.global_default:
                defaults[name] = f" (objects[{i}] of this request)"
            else:
                defaults.pop(name, None)  # this request takes it back
        for i in refused:
            results[i].action = "invalid"
        return [c for c in checked if c[0] not in refused]

    async def _check_reservation_nodes(
        self, checked: list[Checked], results: list[api_pb2.ApplyResult]
    ) -> list[Checked]:
        """Reservations whose node does not exist, or is too small for them, are invalid; the
        rest of the request stands. Nodes are read from the store (one read for all)."""
        named = sorted(
            {o.spec.node for _, _, o in checked if isinstance(o, pb.Reservation) and o.spec.node}
        )
        if not named:
            return checked
        nodes = dict(zip(named, await self.store.get_many(pb.Node, named), strict=True))
        kept = []
        earlier: list[pb.Reservation] = []  # this request's, counted for the ones after them
        for i, kind, obj in checked:
            if isinstance(obj, pb.Reservation):
                prefix, node = f"objects[{i}].reservation", nodes.get(obj.spec.node)
                found = reservations.validate_node(obj, prefix, node)
                if not found and node is not None and self._is_new(obj):
                    held = self._reservations_on(node) + [
                        reservations.to_store(r, "")
                        for r in earlier
                        if r.spec.node == obj.spec.node
                    ]
                    found = reservations.validate_room(
                        obj, prefix, node, await self._pods_on(node), held
                    )
                if not found:
                    earlier.append(obj)
                if found:
                    results[i].violations.extend(found)
                    results[i].action = "invalid"
                    continue
            kept.append((i, kind, obj))
        return kept

    def _is_new(self, rsv: pb.Reservation) -> bool:
        return self.informer.get("Reservation", rsv.metadata.name) is None

    async def _pods_on(self, node: pb.Node) -> list[pb.Pod]:
        """The node's pods holding a claim, whole (read from the store: the view keeps their
        records only)."""
        if self.pods is None:
            return []
        return await self.pods.fetch(self.pods.names_on({node.metadata.name}))

    def _reservations_on(self, node: pb.Node) -> list[pb.Reservation]:
        name = node.metadata.name
        return [
            r
            for r in self.informer.each("Reservation")
            if isinstance(r, pb.Reservation) and (r.status.node or r.spec.node) == name
        ]

    async def _create_jobs(
        self,
        request: api_pb2.ApplyRequest,
        jobs: list[tuple[int, pb.Job]],
        results: list[api_pb2.ApplyResult],
    ) -> None:
        """Applied jobs not stored yet go through Submit: validated as submissions, stored with
        their pods, and found again by a retry of the same request."""
        submitted = await self.submitter.submit(
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


def _check(request: api_pb2.ApplyRequest) -> tuple[list[api_pb2.ApplyResult], list[Checked]]:
    """A result per object of the request, ``invalid`` for those that fail their own checks
    (kind, validation, a duplicate name), and the objects that pass them."""
    results: list[api_pb2.ApplyResult] = []
    checked: list[Checked] = []
    seen: dict[tuple[str, str], int] = {}
    for i, wrapped in enumerate(request.objects):
        prefix = f"objects[{i}]"
        field = wrapped.WhichOneof("kind")
        if field is None:
            results.append(_invalid("", "", f"{prefix}", "empty object: set one kind"))
            continue
        kind, obj = unwrap(wrapped)
        name = metadata_of(obj).name
        if kind not in USER_KINDS:
            results.append(
                _invalid(kind, name, f"{prefix}.{field}", f"{kind} is managed by the system")
            )
            continue
        found = _validate_applied(kind, obj, f"{prefix}.{field}")
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
    return results, checked


def _plan(
    checked: list[Checked],
    current: dict[tuple[str, str], Message | None],
    results: list[api_pb2.ApplyResult],
) -> tuple[list[Op], list[tuple[int, Message]], list[tuple[int, pb.Job]]]:
    """What to write of each checked object against its stored copy: the ops, the objects they
    write (by index in the request), and the jobs not stored yet (for Submit). Sets each
    result's action; a compare-and-set that cannot hold raises Aborted."""
    ops: list[Op] = []
    targets: list[tuple[int, Message]] = []
    new_jobs: list[tuple[int, pb.Job]] = []
    for i, kind, obj in checked:
        meta = metadata_of(obj)
        existing = current[kind, meta.name]
        wanted = meta.resource_version
        if wanted and (existing is None or metadata_of(existing).resource_version != wanted):
            have = metadata_of(existing).resource_version if existing else "absent"
            raise Aborted(
                f"{kind} {meta.name!r} is not at resource_version {wanted} (it is {have})"
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
        if isinstance(obj, pb.Reservation):
            if existing is None:
                created = reservations.to_store(obj, obj.metadata.owner)
                results[i].action = "created"
                ops.append(Create(created))
                targets.append((i, created))
                continue
            assert isinstance(existing, pb.Reservation)
            updated, fixed = reservations.update(existing, obj)
            if fixed:
                results[i].action = "invalid"
                results[i].violations.extend(
                    v.violation(
                        f"objects[{i}].reservation.spec.{name}",
                        "is immutable: delete the reservation and apply it again to change it",
                    )
                    for name in fixed
                )
                continue
            if updated == existing:
                results[i].action = "unchanged"
                results[i].resource_version = existing.metadata.resource_version
                continue
            results[i].action = "configured"
            ops.append(Update(updated))
            targets.append((i, updated))
            continue
        if existing is None:
            new = _fresh(obj)
            results[i].action = "created"
            ops.append(Create(new))
        else:
            new = _merge(kind, existing, obj)
            if new == existing:
                results[i].action = "unchanged"
                results[i].resource_version = metadata_of(existing).resource_version
                continue
            results[i].action = "configured"
            ops.append(Update(new))
        targets.append((i, new))
    return ops, targets, new_jobs


def _refuse_if(why: str | None) -> None:
    if why is not None:
        raise Refused(why)


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
    if isinstance(obj, pb.Job):
        # The whole of a new job is validated as a submission (later); of a stored one only
        # what may change is taken, and of that only its labels need a syntax.
        return (
            v.validate_labels(obj.metadata.labels, f"{prefix}.metadata.labels")
            + v.validate_schedule_timeout(obj.spec, f"{prefix}.spec")
            + v.validate_job_reservation(obj.spec, f"{prefix}.spec")
        )
    if isinstance(obj, pb.Node):
        return v.validate_node(obj, prefix)
    if isinstance(obj, pb.Queue):
        return v.validate_queue(obj, prefix)
    if isinstance(obj, pb.PriorityClass):
        return v.validate_priority_class(obj, prefix)
    if isinstance(obj, pb.Reservation):
        return reservations.validate(obj, prefix)
    assert isinstance(obj, pb.DisruptionBudget)
    return v.validate_budget(obj, prefix)


def _fresh(obj: Message) -> Message:
    new = type(obj)()
    new.CopyFrom(obj)
    meta = metadata_of(new)
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
    meta, src = metadata_of(new), metadata_of(applied)
    meta.labels.clear()
    meta.labels.update(src.labels)
    meta.annotations.clear()
    meta.annotations.update(src.annotations)
    if isinstance(new, pb.PriorityClass):  # its fields sit beside its metadata: no spec
        assert isinstance(applied, pb.PriorityClass)
        kept = pb.ObjectMeta()
        kept.CopyFrom(meta)
        new.CopyFrom(applied)
        new.metadata.CopyFrom(kept)
        return new
    if applied.HasField("spec"):
        _spec_of(new).CopyFrom(_spec_of(applied))
    else:
        new.ClearField("spec")
    if kind == "Node":
        assert isinstance(new, pb.Node) and isinstance(applied, pb.Node)
        for name in _DECLARED_NODE_STATUS:
            # CopyFrom of an absent field would make it present: "unchanged" would never hold.
            if applied.status.HasField(name):
                getattr(new.status, name).CopyFrom(getattr(applied.status, name))
            else:
                new.status.ClearField(name)
    return new


def _spec_of(obj: Message) -> Message:
    """The spec of an applied Node, Queue or DisruptionBudget (Jobs: ``_job_update``)."""
    assert isinstance(obj, _MERGED_MESSAGES)
    return obj.spec


def _job_update(stored: pb.Job, applied: pb.Job) -> tuple[pb.Job, list[tuple[str, str]]]:
    """The stored job with what ``applied`` may change (labels, annotations, MUTABLE_JOB_SPEC),
    and each field it would change that may not: (path, why)."""
    wanted = normalise_job(applied)
    # What admission resolved from the job's priority class, where the manifest leaves it out.
    priorityclasses.as_admitted(wanted.spec, stored.spec)
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
    if wanted.spec.HasField("schedule_timeout_seconds"):
        new.spec.schedule_timeout_seconds = wanted.spec.schedule_timeout_seconds
    else:
        new.spec.ClearField("schedule_timeout_seconds")
    if stored.status.phase == pb.JOB_TIMEOUT and not immutable:
        # Applying a timed-out gang again starts it again, as RetryJob does.
        new = restarted(new, int(time.time() * 1000))
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
