"""Validation of what users submit and apply: pure functions returning FieldViolations.

Every violation names the field by its path in the request (``jobs[0].spec.min_member``), so a
client can point at the offending line of a manifest. Nothing here touches the store: the caller
looks up what validation needs (existing jobs, queues, node capacities) and passes it in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from placement import labels
from placement.nodeinfo import POOL_NAMES, pool_of
from placement.quotas import DEFAULT_QUEUE
from placement.resources import MILLI_PER_CARD
from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.objects import NodeShape
from services.dispatcher.priorityclasses import PriorityClasses

# A DNS-1123 label: every pod name `<job>-<index>` must be one too. Matched whole (fullmatch):
# a '$' would let a trailing newline through.
_DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MAX_LABEL_LENGTH = 63
# Kubernetes' range for user priorities (system classes sit above it).
MIN_PRIORITY = -1_000_000_000
MAX_PRIORITY = 1_000_000_000
# A priority class's description: a sentence or a paragraph, not a document.
MAX_DESCRIPTION_LENGTH = 1024

Violations = list[api_pb2.FieldViolation]

_LABEL_OPS = pb.LabelSelectorRequirement
_QOS_VALUES = frozenset(pb.QoS.values())
_PREEMPTION_POLICIES = frozenset(pb.PreemptionPolicy.values())
_NUMA_VALUES = frozenset(pb.NumaPolicy.values())
_SORT_VALUES = frozenset(pb.SortPolicy.values())
# Values SortPolicy once had, now the dispatcher's queue_fairness (queues stored with them read
# as FIFO; new ones are refused).
_RETIRED_SORT_POLICIES = {3: "DRF", 4: "FairShare"}
_SCALAR_RESOURCES = ("milli_cpu", "memory_bytes", "gpus", "pods")
_TAINT_EFFECTS = frozenset(pb.TaintEffect.values())


def violation(field: str, description: str) -> api_pb2.FieldViolation:
    return api_pb2.FieldViolation(field=field, description=description)


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue's admission limits, defaults resolved (the dispatcher's ``max_replicas`` and
    ``max_pending_pods`` where its spec leaves them 0)."""

    max_pods_per_job: int
    max_pending_pods: int


@dataclass(frozen=True, slots=True)
class TenantLimit:
    """A tenant's live pods now, and the most it may hold (``max_pods_per_tenant``)."""

    tenant: str
    live_pods: int
    max_pods: int


@dataclass(frozen=True, slots=True)
class SubmitContext:
    """What validating a submission needs to know about the cluster and the caller."""

    existing_jobs: frozenset[str] = frozenset()
    queues: frozenset[str] = frozenset()
    # Distinct node capacities per pool (placement.nodeinfo.GUARANTEED, BEST_EFFORT); empty when there are no nodes at all.
    node_shapes: dict[str, frozenset[NodeShape]] | None = None
    # The most pods one job of the caller may have, and the dispatcher's setting that says so
    # (admission.AdmissionLimits.replicas_for).
    max_replicas: int = 100_000
    max_replicas_setting: str = "admin_max_replicas"
    # Per queue named by the request: its limits, and its pods pending now. A queue absent from
    # ``queue_limits`` has none.
    queue_limits: Mapping[str, QueueLimits] = field(default_factory=dict)
    pending_pods: Mapping[str, int] = field(default_factory=dict)
    # A tenant caller's live pods and their limit; None for the admin (no such limit).
    tenant_limit: TenantLimit | None = None
    # The stored priority classes (a job's spec.priority_class_name must name one).
    priority_classes: PriorityClasses = field(default_factory=lambda: PriorityClasses({}))


def validate_label_name(name: str, field: str, *, max_length: int = MAX_LABEL_LENGTH) -> Violations:
    """An object's name: a DNS-1123 label of at most ``max_length`` characters."""
    if not name:
        return [violation(field, "is required")]
    if len(name) > max_length:
        return [violation(field, f"must be at most {max_length} characters (got {len(name)})")]
    if not _DNS_LABEL_RE.fullmatch(name):
        return [
            violation(
                field,
                f"{name!r} is not a DNS-1123 label (lowercase letters, digits and '-', "
                "starting and ending with a letter or digit)",
            )
        ]
    return []


def validate_label_value(value: str, field: str) -> Violations:
    """A label value (or a selector's: held to the same syntax), as ``placement.labels`` says."""
    problem = labels.value_problem(value)
    return [] if problem is None else [violation(field, problem)]


def validate_label_key(key: str, field: str) -> Violations:
    """A label key (a selector's, a topology key), as ``placement.labels`` says; an empty one
    "is required"."""
    if not key:
        return [violation(field, "is required")]
    problem = labels.key_problem(key)
    return [] if problem is None else [violation(field, problem)]


def validate_labels(label_map: Mapping[str, str], field: str) -> Violations:
    """A map of labels: each key and value, the field naming the key (``…labels['team']``)."""
    out: Violations = []
    for key in sorted(label_map):
        here = f"{field}[{key!r}]"
        if (problem := labels.key_problem(key)) is not None:
            out.append(violation(here, problem))
        out += validate_label_value(label_map[key], here)
    return out


# ---------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------


def validate_submission(jobs: Sequence[pb.Job], ctx: SubmitContext) -> list[Violations]:
    """One list of violations per job (empty = valid). Duplicates within the request are
    reported on the later occurrences; jobs that already exist are reported per job."""
    first_index: dict[str, int] = {}
    out: list[Violations] = []
    # Specs already found valid in this request: the many jobs of one template (one-pod jobs
    # submitted together) have their spec checked once, not once per job.
    valid_specs: set[bytes] = set()
    for i, job in enumerate(jobs):
        prefix = f"jobs[{i}]"
        found = validate_job(job, prefix, ctx, valid_specs)
        name = job.metadata.name
        if name:
            if name in first_index:
                found.insert(
                    0,
                    violation(
                        f"{prefix}.metadata.name",
                        f"duplicate of jobs[{first_index[name]}]: job names are unique",
                    ),
                )
            else:
                first_index[name] = i
            if name in ctx.existing_jobs:
                found.insert(0, already_exists(prefix, name))
        out.append(found)
    _check_pending_limits(jobs, out, ctx)
    _check_tenant_limit(jobs, out, ctx)
    return out


def _check_pending_limits(
    jobs: Sequence[pb.Job], found: list[Violations], ctx: SubmitContext
) -> None:
    """A queue's max_pending_pods, counting the pods already pending in it and those of the
    request's earlier valid jobs: one submission cannot swamp the dispatcher."""
    pending = dict(ctx.pending_pods)
    for i, job in enumerate(jobs):
        queue = job.spec.queue or DEFAULT_QUEUE
        limits = ctx.queue_limits.get(queue)
        if found[i] or limits is None:
            continue
        have = pending.get(queue, 0)
        if have + job.spec.replicas > limits.max_pending_pods:
            found[i].append(
                violation(
                    f"jobs[{i}].spec.replicas",
                    f"queue {queue!r} allows at most {limits.max_pending_pods} pending pods "
                    f"(max_pending_pods): {have} are pending and this job adds "
                    f"{job.spec.replicas}",
                )
            )
        else:
            pending[queue] = have + job.spec.replicas


def _check_tenant_limit(
    jobs: Sequence[pb.Job], found: list[Violations], ctx: SubmitContext
) -> None:
    """A tenant's max_pods_per_tenant, counting its live pods and those of the request's
    earlier valid jobs."""
    limit = ctx.tenant_limit
    if limit is None:
        return
    held = limit.live_pods
    for i, job in enumerate(jobs):
        if found[i]:
            continue
        if held + job.spec.replicas > limit.max_pods:
            found[i].append(
                violation(
                    f"jobs[{i}].spec.replicas",
                    f"tenant {limit.tenant!r} may hold at most {limit.max_pods} live pods "
                    f"(max_pods_per_tenant): it holds {held} and this job adds "
                    f"{job.spec.replicas}",
                )
            )
        else:
            held += job.spec.replicas


def already_exists(prefix: str, name: str) -> api_pb2.FieldViolation:
    return violation(f"{prefix}.metadata.name", f"AlreadyExists: job {name!r} already exists")


def validate_job(
    job: pb.Job, prefix: str, ctx: SubmitContext, valid_specs: set[bytes]
) -> Violations:
    """The job's violations. ``valid_specs``: specs (serialised) known valid under ``ctx``; a
    spec among them is not checked again, and one found valid is added."""
    spec = job.spec
    # Pod names are `<job>-<index>` and must be labels too: leave room for the largest index.
    suffix = len(f"-{max(spec.replicas - 1, 0)}")
    out = validate_label_name(
        job.metadata.name, f"{prefix}.metadata.name", max_length=MAX_LABEL_LENGTH - suffix
    )
    out += validate_labels(job.metadata.labels, f"{prefix}.metadata.labels")
    key = spec.SerializeToString(deterministic=True)
    if key in valid_specs:
        return out
    found = _validate_spec(spec, f"{prefix}.spec", ctx)
    if not found:
        valid_specs.add(key)
    return out + found


def _validate_spec(spec: pb.JobSpec, s: str, ctx: SubmitContext) -> Violations:
    out: Violations = []
    if spec.replicas < 1:
        out.append(violation(f"{s}.replicas", f"must be at least 1 (got {spec.replicas})"))
    elif spec.replicas > ctx.max_replicas:
        out.append(
            violation(
                f"{s}.replicas",
                f"must be at most {ctx.max_replicas} (got {spec.replicas}): the dispatcher's "
                f"{ctx.max_replicas_setting}",
            )
        )
    if spec.min_member < 1:
        out.append(violation(f"{s}.min_member", f"must be at least 1 (got {spec.min_member})"))
    elif spec.replicas >= 1 and spec.min_member > spec.replicas:
        out.append(
            violation(
                f"{s}.min_member",
                f"must not exceed replicas ({spec.min_member} > {spec.replicas})",
            )
        )
    if not MIN_PRIORITY <= spec.priority <= MAX_PRIORITY:
        out.append(
            violation(
                f"{s}.priority",
                f"must be within [{MIN_PRIORITY}, {MAX_PRIORITY}] (got {spec.priority})",
            )
        )
    if spec.qos not in _QOS_VALUES:
        out.append(violation(f"{s}.qos", f"unknown QoS value {spec.qos}"))
    out += _validate_priority_class_name(spec, s, ctx.priority_classes)
    out += _validate_preemption(spec, s)
    out += _validate_job_affinity(spec.job_affinity, f"{s}.job_affinity")
    queue = spec.queue or DEFAULT_QUEUE
    limits = ctx.queue_limits.get(queue)
    if queue != DEFAULT_QUEUE and queue not in ctx.queues:
        out.append(violation(f"{s}.queue", f"queue {queue!r} does not exist"))
    elif limits is not None and limits.max_pods_per_job < spec.replicas <= ctx.max_replicas:
        out.append(
            violation(
                f"{s}.replicas",
                f"queue {queue!r} allows at most {limits.max_pods_per_job} pods per job "
                f"(max_pods_per_job); this job asks for {spec.replicas}",
            )
        )
    out += validate_template(spec.template, f"{s}.template")
    # A request already refused (its amounts, or its GPU share or models) is not measured
    # against the nodes too.
    refused = (f"{s}.template.requests", f"{s}.template.gpu_")
    if not any(v.field.startswith(refused) for v in out):
        out += _check_some_node_fits(spec, f"{s}.template.requests", ctx)
    return out


def _validate_priority_class_name(spec: pb.JobSpec, s: str, classes: PriorityClasses) -> Violations:
    """A named class must exist; a raw priority beside it must be its value (Kubernetes' rule:
    the priority comes from the class)."""
    name = spec.priority_class_name
    if not name:
        return []
    found = validate_label_name(name, f"{s}.priority_class_name")
    if found:
        return found
    klass = classes.by_name.get(name)
    if klass is None:
        return [violation(f"{s}.priority_class_name", f"priority class {name!r} does not exist")]
    if spec.priority and spec.priority != klass.value:
        return [
            violation(
                f"{s}.priority",
                f"{spec.priority} differs from the value of priority class {name!r} "
                f"({klass.value}) named by {s}.priority_class_name: the class gives the job its "
                "priority; leave priority out or give the class's value",
            )
        ]
    return []


def _validate_job_affinity(a: pb.JobAffinity, prefix: str) -> Violations:
    """Label keys, each once across both lists (a preferred key equal to a required one could
    never narrow anything)."""
    out: Violations = []
    seen: set[str] = set()
    for name, keys in (
        ("required_topology_keys", a.required_topology_keys),
        ("preferred_topology_keys", a.preferred_topology_keys),
    ):
        for i, key in enumerate(keys):
            f = f"{prefix}.{name}[{i}]"
            out += validate_label_key(key, f)
            if key in seen:
                out.append(violation(f, f"label key {key!r} is listed twice"))
            seen.add(key)
    return out


def _validate_preemption(spec: pb.JobSpec, s: str) -> Violations:
    out: Violations = []
    if spec.preemption_policy not in _PREEMPTION_POLICIES:
        out.append(
            violation(
                f"{s}.preemption_policy", f"unknown preemption policy {spec.preemption_policy}"
            )
        )
    if spec.protection_seconds < 0:
        out.append(
            violation(
                f"{s}.protection_seconds",
                f"must not be negative (got {spec.protection_seconds})",
            )
        )
    if spec.HasField("backoff_limit") and spec.backoff_limit < 0:
        out.append(
            violation(f"{s}.backoff_limit", f"must not be negative (got {spec.backoff_limit})")
        )
    ttl = spec.ttl_seconds_after_finished
    if spec.HasField("ttl_seconds_after_finished") and ttl < 0:
        out.append(
            violation(f"{s}.ttl_seconds_after_finished", f"must not be negative (got {ttl})")
        )
    out += validate_schedule_timeout(spec, s)
    out += validate_job_reservation(spec, s)
    return out


def validate_schedule_timeout(spec: pb.JobSpec, s: str) -> Violations:
    """``scheduleTimeoutSeconds``: unset (300) or a positive number of seconds."""
    timeout = spec.schedule_timeout_seconds
    if spec.HasField("schedule_timeout_seconds") and timeout <= 0:
        return [
            violation(
                f"{s}.schedule_timeout_seconds",
                f"scheduleTimeoutSeconds must be a positive integer (got {timeout})",
            )
        ]
    return []


def validate_job_reservation(spec: pb.JobSpec, s: str) -> Violations:
    """``reservation``: unset (no room kept) or a positive ``ttlSeconds``."""
    ttl = spec.reservation.ttl_seconds
    if spec.HasField("reservation") and ttl <= 0:
        return [
            violation(
                f"{s}.reservation.ttl_seconds",
                f"reservation.ttlSeconds must be a positive integer (got {ttl})",
            )
        ]
    return []


def validate_template(t: pb.PodTemplate, prefix: str) -> Violations:
    out = validate_requests(t.requests, f"{prefix}.requests")
    if t.duration_ms < 0:
        out.append(
            violation(f"{prefix}.duration_ms", f"must not be negative (got {t.duration_ms})")
        )
    if not 0 <= t.hollow_usage_percent <= 1000:
        out.append(
            violation(
                f"{prefix}.hollow_usage_percent",
                f"must be within 0..1000 (got {t.hollow_usage_percent})",
            )
        )
    if t.termination_grace_seconds < 0:
        out.append(
            violation(
                f"{prefix}.termination_grace_seconds",
                f"must not be negative (got {t.termination_grace_seconds})",
            )
        )
    if t.numa_policy not in _NUMA_VALUES:
        out.append(violation(f"{prefix}.numa_policy", f"unknown NUMA policy {t.numa_policy}"))
    out += validate_gpus(t, prefix)
    out += validate_labels(t.node_selector, f"{prefix}.node_selector")
    out += validate_labels(t.labels, f"{prefix}.labels")
    out += validate_ports(t.ports, f"{prefix}.ports")
    out += validate_tolerations(t.tolerations, f"{prefix}.tolerations")
    if t.HasField("affinity"):
        out += validate_affinity(t.affinity, f"{prefix}.affinity")
    out += validate_spread(t.topology_spread_constraints, f"{prefix}.topology_spread_constraints")
    return out


_WHEN_UNSATISFIABLE = frozenset(pb.TopologySpreadConstraint.WhenUnsatisfiable.values())


def validate_spread(constraints: Iterable[pb.TopologySpreadConstraint], prefix: str) -> Violations:
    out: Violations = []
    seen: dict[tuple[str, int], int] = {}
    for k, c in enumerate(constraints):
        f = f"{prefix}[{k}]"
        if c.max_skew < 1:
            out.append(violation(f"{f}.max_skew", f"must be at least 1 (got {c.max_skew})"))
        if not c.topology_key:
            out.append(violation(f"{f}.topology_key", "is required"))
        else:
            out += validate_label_key(c.topology_key, f"{f}.topology_key")
        if c.when_unsatisfiable not in _WHEN_UNSATISFIABLE:
            out.append(
                violation(f"{f}.when_unsatisfiable", f"unknown value {c.when_unsatisfiable}")
            )
        out += validate_requirements(c.label_selector, f"{f}.label_selector")
        # As Kubernetes: one constraint per (topology key, whenUnsatisfiable).
        hard = c.when_unsatisfiable != pb.TopologySpreadConstraint.SCHEDULE_ANYWAY
        key = (c.topology_key, int(hard))
        if key in seen:
            out.append(
                violation(
                    f,
                    f"duplicate of {prefix}[{seen[key]}] (same topology_key and "
                    "when_unsatisfiable)",
                )
            )
        seen.setdefault(key, k)
    return out


def validate_gpus(t: pb.PodTemplate, prefix: str) -> Violations:
    """A share of one card (``gpu_milli`` 1..999 with ``requests.gpus: 1``) and the models the
    pod accepts (each named as a label value is, non-empty, once)."""
    out: Violations = []
    share, cards = t.gpu_milli, t.requests.gpus
    if share and not 0 < share < MILLI_PER_CARD:
        out.append(
            violation(
                f"{prefix}.gpu_milli",
                f"must be 1..{MILLI_PER_CARD - 1} milli-GPU, a share of one card (got {share}; "
                "whole cards are asked in requests.gpus)",
            )
        )
    elif share and cards != 1:
        out.append(
            violation(
                f"{prefix}.gpu_milli",
                f"a share of one card needs requests.gpus: 1 (got {cards})",
            )
        )
    if t.gpu_models and cards <= 0:
        out.append(violation(f"{prefix}.gpu_models", "set without requests.gpus: no GPU asked"))
    seen: set[str] = set()
    for k, model in enumerate(t.gpu_models):
        field = f"{prefix}.gpu_models[{k}]"
        if not model:
            out.append(violation(field, "must not be empty (a GPU model name, e.g. V100M32)"))
            continue
        problem = labels.value_problem(model)
        if problem:
            out.append(violation(field, f"not a GPU model name: {problem}"))
        elif model in seen:
            out.append(violation(field, f"{model!r} is listed twice"))
        seen.add(model)
    return out


def validate_requests(r: pb.Resources, prefix: str) -> Violations:
    out = _non_negative(r, prefix)
    if r.milli_gpus:
        out.append(
            violation(
                f"{prefix}.milli_gpus",
                "is a figure the scheduler writes: ask whole cards in gpus, a share of one "
                "card in the template's gpu_milli",
            )
        )
    if not out and r.milli_cpu == 0 and r.memory_bytes == 0:
        out.append(violation(prefix, "at least one of milli_cpu, memory_bytes must be set"))
    return out


def _check_some_node_fits(spec: pb.JobSpec, field: str, ctx: SubmitContext) -> Violations:
    """A pod no node could hold even when empty would pend forever: report it instead. With no
    nodes at all the cluster is still being built, so the job is accepted and pends."""
    if not ctx.node_shapes or not any(ctx.node_shapes.values()):
        return []
    pool = pool_of(spec.qos)
    shapes = ctx.node_shapes.get(pool, frozenset())
    r = spec.template.requests
    if any(s.cpu >= r.milli_cpu and s.mem >= r.memory_bytes and s.gpus >= r.gpus for s in shapes):
        return []
    where = f"in the {POOL_NAMES[pool]} pool"
    most = NodeShape(
        max((s.cpu for s in shapes), default=0),
        max((s.mem for s in shapes), default=0),
        max((s.gpus for s in shapes), default=0),
    )
    prefix = "no node can ever hold this pod: "
    if r.milli_cpu > most.cpu:
        return [
            violation(f"{field}.milli_cpu", f"{prefix}largest node has {most.cpu}m cpu {where}")
        ]
    if r.memory_bytes > most.mem:
        return [
            violation(
                f"{field}.memory_bytes", f"{prefix}largest node has {most.mem} bytes memory {where}"
            )
        ]
    if r.gpus > most.gpus:
        return [violation(f"{field}.gpus", f"{prefix}largest node has {most.gpus} gpus {where}")]
    return [violation(field, f"{prefix}no single node has this cpu, memory and gpus {where}")]


def validate_ports(ports: Iterable[pb.ContainerPort], prefix: str) -> Violations:
    out: Violations = []
    seen: dict[tuple[str, int], int] = {}
    for k, p in enumerate(ports):
        f = f"{prefix}[{k}]"
        if not 0 <= p.container_port <= 65535:
            out.append(
                violation(
                    f"{f}.container_port", f"must be within 0..65535 (got {p.container_port})"
                )
            )
        if p.host_port != 0 and not 1 <= p.host_port <= 65535:
            out.append(violation(f"{f}.host_port", f"must be within 1..65535 (got {p.host_port})"))
        if p.protocol not in ("", "TCP", "UDP"):
            out.append(violation(f"{f}.protocol", f"must be TCP or UDP (got {p.protocol!r})"))
        if p.host_port:
            key = (p.protocol or "TCP", p.host_port)
            if key in seen:
                out.append(
                    violation(f"{f}.host_port", f"duplicate of {prefix}[{seen[key]}].host_port")
                )
            seen.setdefault(key, k)
    return out


def validate_tolerations(tolerations: Iterable[pb.Toleration], prefix: str) -> Violations:
    out: Violations = []
    for k, t in enumerate(tolerations):
        f = f"{prefix}[{k}]"
        if t.operator == pb.Toleration.OPERATOR_UNSPECIFIED:
            out.append(violation(f"{f}.operator", "must be set (EQUAL or EXISTS)"))
        elif t.operator not in (pb.Toleration.EQUAL, pb.Toleration.EXISTS):
            out.append(violation(f"{f}.operator", f"unknown operator {t.operator}"))
        elif t.operator == pb.Toleration.EXISTS and t.value:
            out.append(violation(f"{f}.value", "must be empty when operator is EXISTS"))
        elif t.operator == pb.Toleration.EQUAL and not t.key:
            out.append(violation(f"{f}.key", "is required when operator is EQUAL"))
        if t.key:  # empty with EXISTS: every taint
            out += validate_label_key(t.key, f"{f}.key")
        out += validate_label_value(t.value, f"{f}.value")
        if t.effect not in _TAINT_EFFECTS:
            out.append(violation(f"{f}.effect", f"unknown taint effect {t.effect}"))
    return out


def validate_requirements(reqs: Iterable[pb.LabelSelectorRequirement], prefix: str) -> Violations:
    out: Violations = []
    for k, r in enumerate(reqs):
        f = f"{prefix}[{k}]"
        out += validate_label_key(r.key, f"{f}.key")
        op = r.operator
        if op == _LABEL_OPS.OPERATOR_UNSPECIFIED:
            out.append(
                violation(
                    f"{f}.operator", "must be set (IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT)"
                )
            )
        elif op in (_LABEL_OPS.IN, _LABEL_OPS.NOT_IN):
            if not r.values:
                out.append(violation(f"{f}.values", "must not be empty for IN and NOT_IN"))
            for v, value in enumerate(r.values):
                out += validate_label_value(value, f"{f}.values[{v}]")
        elif op in (_LABEL_OPS.EXISTS, _LABEL_OPS.DOES_NOT_EXIST):
            if r.values:
                out.append(violation(f"{f}.values", "must be empty for EXISTS and DOES_NOT_EXIST"))
        elif op in (_LABEL_OPS.GT, _LABEL_OPS.LT):
            if len(r.values) != 1 or not _is_int(r.values[0]):
                out.append(violation(f"{f}.values", "GT and LT need exactly one integer value"))
        else:
            out.append(violation(f"{f}.operator", f"unknown operator {op}"))
    return out


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _check_weight(weight: int, field: str) -> Violations:
    if not 1 <= weight <= 100:
        return [violation(field, f"must be within 1..100 (got {weight})")]
    return []


def validate_affinity(a: pb.Affinity, prefix: str) -> Violations:
    out: Violations = []
    na = f"{prefix}.node_affinity"
    for t, term in enumerate(a.node_affinity.required):
        out += validate_requirements(
            term.match_expressions, f"{na}.required[{t}].match_expressions"
        )
    for t, pref in enumerate(a.node_affinity.preferred):
        out += _check_weight(pref.weight, f"{na}.preferred[{t}].weight")
        out += validate_requirements(
            pref.preference.match_expressions, f"{na}.preferred[{t}].preference.match_expressions"
        )
    for name in ("pod_affinity", "pod_anti_affinity"):
        pa: pb.PodAffinity = getattr(a, name)
        p = f"{prefix}.{name}"
        for t, pod_term in enumerate(pa.required):
            out += _validate_pod_term(pod_term, f"{p}.required[{t}]")
        for t, weighted in enumerate(pa.preferred):
            out += _check_weight(weighted.weight, f"{p}.preferred[{t}].weight")
            out += _validate_pod_term(weighted.term, f"{p}.preferred[{t}].term")
    return out


def _validate_pod_term(term: pb.PodAffinityTerm, prefix: str) -> Violations:
    out = validate_requirements(term.label_selector, f"{prefix}.label_selector")
    if not term.topology_key:
        out.append(violation(f"{prefix}.topology_key", "is required"))
    else:
        out += validate_label_key(term.topology_key, f"{prefix}.topology_key")
    return out


# ---------------------------------------------------------------------------------------------
# Applied objects: nodes, queues, disruption budgets, priority classes
# ---------------------------------------------------------------------------------------------


def validate_queue(q: pb.Queue, prefix: str) -> Violations:
    out = validate_label_name(q.metadata.name, f"{prefix}.metadata.name")
    out += validate_labels(q.metadata.labels, f"{prefix}.metadata.labels")
    out += _non_negative(q.spec.quota, f"{prefix}.spec.quota")
    out += _non_negative(q.spec.min, f"{prefix}.spec.min")
    if q.spec.sort_policy in _RETIRED_SORT_POLICIES:
        out.append(
            violation(
                f"{prefix}.spec.sort_policy",
                f"{_RETIRED_SORT_POLICIES[q.spec.sort_policy]} is no longer a queue's sort policy: "
                "it orders queues against each other, set by the dispatcher's queue_fairness "
                "(use FIFO or Priority here)",
            )
        )
    elif q.spec.sort_policy not in _SORT_VALUES:
        out.append(
            violation(f"{prefix}.spec.sort_policy", f"unknown sort policy {q.spec.sort_policy}")
        )
    for name in ("weight", "max_pods_per_job", "max_pending_pods"):
        value = getattr(q.spec, name)
        if value < 0:
            out.append(violation(f"{prefix}.spec.{name}", f"must not be negative (got {value})"))
    if q.spec.parent:
        out += validate_label_name(q.spec.parent, f"{prefix}.spec.parent")
        if q.spec.parent == q.metadata.name:
            out.append(violation(f"{prefix}.spec.parent", "a queue cannot be its own parent"))
    if q.spec.HasField("min") and q.spec.HasField("quota"):
        out += _min_within_max(q.spec.min, q.spec.quota, prefix)
    return out


def queue_cycles(parents: Mapping[str, str]) -> dict[str, str]:
    """Queues whose chain of parents (``parents``: queue -> parent, "" for none) comes back to
    them, each with the cycle in words."""
    out: dict[str, str] = {}
    for queue in parents:
        chain = [queue]
        parent = parents.get(queue, "")
        while parent and parent not in chain:
            chain.append(parent)
            parent = parents.get(parent, "")
        if parent == queue:
            out[queue] = " -> ".join([*chain, queue])
    return out


def _min_within_max(low: pb.Resources, high: pb.Resources, prefix: str) -> Violations:
    """A queue's min may not exceed its max (``quota``; a 0 there is unlimited)."""
    out: Violations = []
    pairs = [(f, getattr(low, f), getattr(high, f)) for f in _SCALAR_RESOURCES]
    pairs += [(f"extended[{k}]", v, high.extended.get(k, 0)) for k, v in low.extended.items()]
    for name, floor, ceiling in pairs:
        if ceiling and floor > ceiling:
            out.append(
                violation(
                    f"{prefix}.spec.min.{name}",
                    f"must not exceed the queue's max (spec.quota.{name}: {floor} > {ceiling})",
                )
            )
    return out


def validate_node(n: pb.Node, prefix: str) -> Violations:
    out = validate_label_name(n.metadata.name, f"{prefix}.metadata.name")
    out += validate_labels(n.metadata.labels, f"{prefix}.metadata.labels")
    out += _non_negative(n.status.allocatable, f"{prefix}.status.allocatable")
    out += _non_negative(n.status.reclaimable, f"{prefix}.status.reclaimable")
    model = n.status.gpu_model
    if model:
        problem = labels.value_problem(model)
        if problem:
            out.append(violation(f"{prefix}.status.gpu_model", f"not a GPU model name: {problem}"))
        elif n.status.allocatable.gpus <= 0:
            out.append(violation(f"{prefix}.status.gpu_model", "set on a node without GPU cards"))
    for k, taint in enumerate(n.spec.taints):
        f = f"{prefix}.spec.taints[{k}]"
        # A taint's key and value have a label's syntax (as Kubernetes validates them).
        out += validate_label_key(taint.key, f"{f}.key")
        out += validate_label_value(taint.value, f"{f}.value")
        if taint.effect == pb.TAINT_EFFECT_UNSPECIFIED:
            out.append(
                violation(
                    f"{f}.effect", "must be set (NO_SCHEDULE, PREFER_NO_SCHEDULE, NO_EXECUTE)"
                )
            )
        elif taint.effect not in _TAINT_EFFECTS:
            out.append(violation(f"{f}.effect", f"unknown taint effect {taint.effect}"))
    return out


def validate_priority_class(c: pb.PriorityClass, prefix: str) -> Violations:
    """A priority class on its own (one globalDefault among the stored ones, and what may not
    change of a stored one, are judged by Apply against them)."""
    out = validate_label_name(c.metadata.name, f"{prefix}.metadata.name")
    out += validate_labels(c.metadata.labels, f"{prefix}.metadata.labels")
    if not MIN_PRIORITY <= c.value <= MAX_PRIORITY:
        out.append(
            violation(
                f"{prefix}.value",
                f"must be within [{MIN_PRIORITY}, {MAX_PRIORITY}] (got {c.value}): "
                "higher values are reserved for the system, as in Kubernetes",
            )
        )
    if c.preemption_policy not in _PREEMPTION_POLICIES:
        out.append(
            violation(
                f"{prefix}.preemption_policy", f"unknown preemption policy {c.preemption_policy}"
            )
        )
    if len(c.description) > MAX_DESCRIPTION_LENGTH:
        out.append(
            violation(
                f"{prefix}.description",
                f"must be at most {MAX_DESCRIPTION_LENGTH} characters (got {len(c.description)})",
            )
        )
    return out


def validate_budget(b: pb.DisruptionBudget, prefix: str) -> Violations:
    out = validate_label_name(b.metadata.name, f"{prefix}.metadata.name")
    out += validate_labels(b.metadata.labels, f"{prefix}.metadata.labels")
    s = b.spec
    has_max, has_min = s.HasField("max_unavailable"), s.HasField("min_available")
    if has_max and s.max_unavailable < 0:
        out.append(
            violation(
                f"{prefix}.spec.max_unavailable", f"must not be negative (got {s.max_unavailable})"
            )
        )
    if has_min and s.min_available < 0:
        out.append(
            violation(
                f"{prefix}.spec.min_available", f"must not be negative (got {s.min_available})"
            )
        )
    if has_max and has_min:
        out.append(
            violation(
                f"{prefix}.spec.min_available",
                "set exactly one of min_available and max_unavailable, not both",
            )
        )
    elif not has_max and not has_min:
        out.append(
            violation(
                f"{prefix}.spec.max_unavailable",
                "set exactly one of min_available and max_unavailable (0 is a value: "
                "max_unavailable: 0 never allows a disruption)",
            )
        )
    if not s.job and not s.selector:
        out.append(violation(f"{prefix}.spec", "set job or selector: a budget must select pods"))
    out += validate_requirements(s.selector, f"{prefix}.spec.selector")
    return out


def _non_negative(r: pb.Resources, prefix: str) -> Violations:
    out: Violations = []
    for name in ("milli_cpu", "memory_bytes", "gpus", "pods"):
        value = getattr(r, name)
        if value < 0:
            out.append(violation(f"{prefix}.{name}", f"must not be negative (got {value})"))
    for key, value in r.extended.items():
        if value < 0:
            out.append(
                violation(f"{prefix}.extended[{key}]", f"must not be negative (got {value})")
            )
    return out
