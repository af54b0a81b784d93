"""`godel apply|get|describe|delete|explain|logs|scale|cordon|uncordon|drain`: kubectl-like
commands over the API.

Commands find the cluster's dispatcher through ``--server`` / ``$GODEL_SERVER``, else the local
cluster in ``$GODEL_HOME`` (what `godel up` started).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
import grpc
from google.protobuf.message import Message

from foundation.retry import Backoff, Retry
from godel import local
from godel.cli import output
from godel.cli.common import home_option, local_address, rescheduler_option, server_option
from godel.cli.output import age_of_ms, fail, print_json, print_table
from godel.client import (
    ClientError,
    DeadlineExceeded,
    NotFound,
    ProtoClient,
    Unavailable,
    unwrap,
)
from godel.client import logs as pod_logs
from godel.manifest import (
    Manifest,
    ManifestError,
    dump_yaml,
    enum_word,
    format_bytes,
    format_cpu,
    load,
    load_file,
    to_list,
    to_manifest,
)
from placement.preemption_blockers import explain_preemption
from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from store.kinds import StoredObject, stored

output_option = click.option(
    "--output",
    "-o",
    default="table",
    help="table (default), wide, json, yaml or name.",
    shell_complete=lambda _ctx, _param, incomplete: [
        w for w in ("table", "wide", "json", "yaml", "name") if w.startswith(incomplete)
    ],
)

# Every spelling a user may type for a kind, kubectl-style.
KIND_ALIASES = {
    **dict.fromkeys(("job", "jobs", "j"), "Job"),
    **dict.fromkeys(("pod", "pods", "po"), "Pod"),
    **dict.fromkeys(("node", "nodes", "no"), "Node"),
    **dict.fromkeys(("queue", "queues", "q"), "Queue"),
    **dict.fromkeys(("disruptionbudget", "disruptionbudgets", "db", "pdb"), "DisruptionBudget"),
    **dict.fromkeys(("movement", "movements", "mv"), "Movement"),
    **dict.fromkeys(
        ("scheduler", "schedulers", "schedulerinstance", "schedulerinstances"), "SchedulerInstance"
    ),
    **dict.fromkeys(("event", "events", "ev"), "Event"),
    **dict.fromkeys(("priorityclass", "priorityclasses", "pc"), "PriorityClass"),
    **dict.fromkeys(("reservation", "reservations", "rsv"), "Reservation"),
}
# What shell completion offers for TYPE: each kind's plural.
_KIND_WORDS = [
    "jobs",
    "pods",
    "nodes",
    "queues",
    "disruptionbudgets",
    "movements",
    "schedulers",
    "events",
    "priorityclasses",
    "policies",
    "reservations",
]
# How often `drain` asks again for the pods it waits for.
DRAIN_RETRY_SECONDS = 2.0
# How often `delete` reads a job whose deletion it follows.
DELETE_POLL_SECONDS = 1.0

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Plumbing
# ---------------------------------------------------------------------------------------------


def _client(server: str | None, home: Path | None) -> ProtoClient:
    # $GODEL_ADDRESS too, as the SDK reads it: one variable points programs and CLI elsewhere.
    address = server or os.environ.get("GODEL_ADDRESS")
    address = address or local_address("dispatcher", home, "--server")
    try:  # the credentials as the SDK finds them: $GODEL_TLS_DIR, else the home's
        return ProtoClient(address, home=home)
    except ClientError as exc:
        fail(str(exc))


def _kind(word: str) -> str:
    kind = KIND_ALIASES.get(word.lower())
    if kind is None:
        fail(
            f"unknown resource type {word!r} (one of jobs, pods, nodes, queues, "
            "disruptionbudgets, movements, schedulers, events, priorityclasses,"
            " reservations)"
        )
    return kind


def _complete_target(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    return [w for w in _KIND_WORDS if w.startswith(incomplete)]


def _split_target(words: Sequence[str]) -> tuple[str, str | None]:
    """`pods`, `pod NAME` or `pod/NAME`."""
    kinds, name = _split_targets(words)
    if len(kinds) != 1:
        fail("expected one TYPE here, not a list")
    return kinds[0], name


def _split_targets(words: Sequence[str]) -> tuple[list[str], str | None]:
    """`pods`, `job,pod`, `pod NAME` or `pod/NAME`: the kinds, and the name if one is given
    (only with a single kind)."""
    if len(words) == 1 and "/" in words[0]:
        kind, name = words[0].split("/", 1)
        return [_kind(kind)], name
    if not words or len(words) > 2:
        fail("expected TYPE [NAME], TYPE/NAME or TYPE,TYPE")
    kinds = list(dict.fromkeys(_kind(w) for w in words[0].split(",") if w))
    if not kinds:
        fail(f"no resource type in {words[0]!r}")
    if len(words) == 2:
        if len(kinds) != 1:
            fail("a NAME goes with a single TYPE")
        return kinds, words[1]
    return kinds, None


def _selector(text: str) -> str:
    """A -l selector checked here, so a mistake is reported before any call (the server checks
    it again)."""
    if not text:  # everything: no parser needed
        return text
    from placement import labelselector  # only a `get -l` pays for the parser

    try:
        labelselector.parse(text)
    except labelselector.SelectorSyntaxError as exc:
        fail(str(exc))
    return text


def _guard(call: Callable[[], T]) -> T:
    try:
        return call()
    except ClientError as exc:
        fail(str(exc))


def _age(obj: StoredObject) -> str:
    return age_of_ms(obj.metadata.creation_timestamp_ms)


def _cpu(milli: int) -> str:
    return format_cpu(milli)


def _mem(size: int) -> str:
    return str(format_bytes(size))


def _enum(value: int, enum: Any) -> str:
    """An enum value as manifests write it (``BestEffort``, ``Running``)."""
    return enum_word(enum.DESCRIPTOR, value)


def _node_status(node: pb.Node) -> str:
    """kubectl's node STATUS: ``Ready`` / ``NotReady``, ``,SchedulingDisabled`` when cordoned."""
    status = "Ready" if node.status.ready else "NotReady"
    return status + (",SchedulingDisabled" if node.spec.unschedulable else "")


def _cpu_load(node: pb.Node) -> str:
    """The node's measured CPU load, its agent's last report: cores in use and the share of its
    allocatable (``<none>`` before any report)."""
    if not node.status.HasField("load"):
        return "<none>"
    milli, alloc = node.status.load.milli_cpu, node.status.allocatable.milli_cpu
    share = f" ({milli * 100 // alloc}%)" if alloc else ""
    return f"{_cpu(milli)}{share}"


def _network_load(node: pb.Node) -> str:
    """The node's measured network load: bytes/s and the share of its bandwidth."""
    if not node.status.HasField("load"):
        return "<none>"
    load = node.status.load
    rate, cap = load.network_bytes_per_second, load.network_capacity_bytes_per_second
    share = f" ({rate * 100 // cap}%)" if cap else ""
    return f"{_bytes_per_second(rate)}{share}"


def _bytes_per_second(rate: int) -> str:
    for unit, size in (("GB/s", 10**9), ("MB/s", 10**6), ("kB/s", 10**3)):
        if rate >= size:
            return f"{rate / size:.1f}{unit}"
    return f"{rate}B/s"


def _sort_policy(value: int) -> str:
    """A queue's sort policy; the retired DRF/FairShare values of old queues read as FIFO."""
    known = value in pb.SortPolicy.values() and value != pb.SORT_POLICY_UNSPECIFIED
    return _enum(value if known else pb.SORT_FIFO, pb.SortPolicy)


def _cpu_or_blank(res: pb.Resources) -> str:
    return _cpu(res.milli_cpu) if res.milli_cpu else ""


def _mem_or_blank(res: pb.Resources) -> str:
    return _mem(res.memory_bytes) if res.memory_bytes else ""


def _optional(msg: Message, field: str) -> object:
    """A field with presence: its value (0 included), or ``<none>`` when unset (as kubectl)."""
    return getattr(msg, field) if msg.HasField(field) else "<none>"


def _pod_gpus(pod: pb.Pod) -> str:
    """The cards the Binder gave a pod: ``0,1`` (whole cards), ``2 (300m)`` (a share of card 2);
    blank when it holds none."""
    cards = ",".join(map(str, pod.spec.gpu_cards))
    milli = pod.spec.template.gpu_milli
    return f"{cards} ({milli}m)" if cards and milli else cards


def _phase_condition(job: pb.Job) -> tuple[str, str]:
    """Why a job is in its phase, when a condition of that phase says so (a gang's Timeout
    with its last attempt's diagnosis, a Failed job's BackoffLimitExceeded): its reason and
    message."""
    phase = _enum(job.status.phase or pb.JOB_PENDING, pb.JobPhase)
    for cond in job.status.conditions:
        if cond.type == phase and cond.status == "True":
            return cond.reason, cond.message
    return "", ""


def _budget_selects(budget: pb.DisruptionBudget) -> str:
    """What a budget selects: ``job=web`` or its label selector in kubectl's grammar."""
    from placement import labelselector

    if budget.spec.job:
        return f"job={budget.spec.job}"
    return labelselector.to_text(labelselector.selector(budget.spec.selector))


def _reservation_owner(rsv: pb.Reservation) -> str:
    """Whose pods may take it: ``job=train``, ``job=train/3`` (one index) or the selector."""
    owner = rsv.spec.owner
    if owner.selector:
        return owner.selector
    return f"job={owner.job}" + (f"/{owner.index}" if owner.HasField("index") else "")


def _reservation_expiry(rsv: pb.Reservation) -> str:
    """Time left before it is released unused (``placement.reservations.expires_ms``)."""
    import time

    from placement.reservations import expires_ms

    return output.age(max(0.0, expires_ms(rsv) / 1000 - time.time()))


def _job_phase(job: pb.Job) -> str:
    """A job's phase; while a big job's pods are still being created, how many are stored."""
    phase = _enum(job.status.phase or pb.JOB_PENDING, pb.JobPhase)
    if job.status.pods_created:
        return f"{phase} ({job.status.pods_created}/{job.spec.replicas} pods created)"
    return phase


# Columns per kind: (header, getter, wide-only).
Column = tuple[str, Callable[[Any], object], bool]
COLUMNS: dict[str, list[Column]] = {
    "Job": [
        ("NAME", lambda o: o.metadata.name, False),
        ("QUEUE", lambda o: o.spec.queue or "default", False),
        ("QOS", lambda o: _enum(o.spec.qos or pb.QOS_GUARANTEED, pb.QoS), False),
        ("REPLICAS", lambda o: o.spec.replicas, False),
        ("MIN", lambda o: o.spec.min_member, False),
        ("BOUND", lambda o: o.status.bound, False),
        ("RUNNING", lambda o: o.status.running, False),
        ("SUCCEEDED", lambda o: o.status.succeeded, False),
        ("PHASE", _job_phase, False),
        ("REASON", lambda o: _phase_condition(o)[0], False),
        ("PRIORITY", lambda o: o.spec.priority, True),
        ("PRIORITY-CLASS", lambda o: o.spec.priority_class_name, True),
        ("RV", lambda o: o.metadata.resource_version, True),
        ("AGE", _age, False),
        # Words, so last (scripts split the rest on whitespace), as kubectl's events' MESSAGE.
        ("MESSAGE", lambda o: _phase_condition(o)[1], False),
    ],
    "Pod": [
        ("NAME", lambda o: o.metadata.name, False),
        ("JOB", lambda o: o.spec.job, False),
        ("PHASE", lambda o: _enum(o.status.phase or pb.POD_PENDING, pb.PodPhase), False),
        ("NODE", lambda o: o.spec.node_name, False),
        # The NUMA nodes the Binder assigned (NUMA-bound pods), e.g. "0,1".
        ("NUMA", lambda o: ",".join(map(str, o.spec.numa_nodes)), True),
        ("GPU", _pod_gpus, True),
        ("QOS", lambda o: _enum(o.spec.qos or pb.QOS_GUARANTEED, pb.QoS), True),
        ("CPU", lambda o: _cpu(o.spec.template.requests.milli_cpu), True),
        ("MEMORY", lambda o: _mem(o.spec.template.requests.memory_bytes), True),
        ("SCHEDULER", lambda o: o.status.scheduler, True),
        ("PRIORITY", lambda o: o.spec.priority, True),
        ("REASON", lambda o: o.status.reason, True),
        ("NOMINATED", lambda o: o.status.nominated_node, True),
        ("PREEMPTED-BY", lambda o: o.status.preempted_by, True),
        ("RV", lambda o: o.metadata.resource_version, True),
        ("AGE", _age, False),
    ],
    "Node": [
        ("NAME", lambda o: o.metadata.name, False),
        ("STATUS", _node_status, False),
        ("CPU", lambda o: _cpu(o.status.allocatable.milli_cpu), False),
        ("MEMORY", lambda o: _mem(o.status.allocatable.memory_bytes), False),
        ("PODS", lambda o: o.status.allocatable.pods, False),
        ("BE-CPU", lambda o: _cpu(o.status.reclaimable.milli_cpu), True),
        ("BE-MEMORY", lambda o: _mem(o.status.reclaimable.memory_bytes), True),
        ("GPUS", lambda o: o.status.allocatable.gpus, True),
        ("GPU-MODEL", lambda o: o.status.gpu_model, True),
        ("CPU-LOAD", _cpu_load, True),
        ("NET-LOAD", _network_load, True),
        ("MODE", lambda o: o.spec.mode, True),
        ("TAINTS", lambda o: ",".join(f"{t.key}={t.value}" for t in o.spec.taints), True),
        (
            "LABELS",
            lambda o: ",".join(f"{k}={v}" for k, v in sorted(o.metadata.labels.items())),
            True,
        ),
        ("AGE", _age, False),
    ],
    # min / max (spec.quota) / used / borrowed per cpu and memory, pending and the dominant share.
    "Queue": [
        ("NAME", lambda o: o.metadata.name, False),
        ("POLICY", lambda o: _sort_policy(o.spec.sort_policy), False),
        ("PARENT", lambda o: o.spec.parent, True),
        ("WEIGHT", lambda o: max(1, o.spec.weight), True),
        ("MIN-CPU", lambda o: _cpu_or_blank(o.spec.min), True),
        ("MAX-CPU", lambda o: _cpu_or_blank(o.spec.quota), False),
        ("MIN-MEMORY", lambda o: _mem_or_blank(o.spec.min), True),
        ("MAX-MEMORY", lambda o: _mem_or_blank(o.spec.quota), False),
        ("USED-CPU", lambda o: _cpu(o.status.used.milli_cpu), True),
        ("USED-MEMORY", lambda o: _mem(o.status.used.memory_bytes), True),
        ("BORROWED-CPU", lambda o: _cpu(o.status.borrowed.milli_cpu), True),
        ("BORROWED-MEMORY", lambda o: _mem(o.status.borrowed.memory_bytes), True),
        ("PENDING", lambda o: o.status.pending_pods, True),
        ("SHARE", lambda o: f"{o.status.dominant_share_permille / 10:g}%", True),
        ("AGE", _age, False),
    ],
    # As `kubectl get pdb`, plus what it selects and its counts in wide.
    "DisruptionBudget": [
        ("NAME", lambda o: o.metadata.name, False),
        ("MIN-AVAILABLE", lambda o: _optional(o.spec, "min_available"), False),
        ("MAX-UNAVAILABLE", lambda o: _optional(o.spec, "max_unavailable"), False),
        ("ALLOWED-DISRUPTIONS", lambda o: o.status.disruptions_allowed, False),
        ("SELECTOR", _budget_selects, True),
        ("HEALTHY", lambda o: o.status.current_healthy, True),
        ("DESIRED", lambda o: o.status.desired_healthy, True),
        ("EXPECTED", lambda o: o.status.expected_pods, True),
        ("AGE", _age, False),
    ],
    "Movement": [
        ("NAME", lambda o: o.metadata.name, False),
        ("POLICY", lambda o: o.spec.policy, False),
        ("BATCH", lambda o: o.spec.batch, False),
        ("PHASE", lambda o: o.status.phase, False),
        ("PODS", lambda o: len(o.spec.deleted_tasks), False),
        ("ACKS", lambda o: len(o.status.notified_schedulers), False),
        ("ACTUAL", lambda o: _movement_counts(o)[0], False),
        ("MISMATCHED", lambda o: _movement_counts(o)[1], False),
        ("ROUND", lambda o: o.spec.generation, True),
        ("MESSAGE", lambda o: o.status.message.replace(" ", "_"), True),
        ("AGE", _age, False),
    ],
    # LAST-BEAT: the shard's last liveness stamp (served from the shard heartbeat hash).
    "SchedulerInstance": [
        ("NAME", lambda o: o.metadata.name, False),
        ("ADDRESS", lambda o: o.spec.address, False),
        ("LAST-BEAT", lambda o: age_of_ms(o.status.heartbeat_ms), False),
        ("UNDECIDED", lambda o: o.status.undecided_pods, False),
        ("PARTITION", lambda o: len(o.spec.partition), True),
        ("PROPOSED", lambda o: o.status.proposed_pods, True),
        ("BOUND", lambda o: o.status.bound_pods, True),
        ("CONFLICTED", lambda o: o.status.conflicted_pods, True),
        ("AGE", _age, False),
    ],
    "Reservation": [
        ("NAME", lambda o: o.metadata.name, False),
        (
            "PHASE",
            lambda o: _enum(o.status.phase or pb.RESERVATION_PENDING, pb.ReservationPhase),
            False,
        ),
        ("NODE", lambda o: o.status.node or o.spec.node, False),
        ("OWNER", _reservation_owner, False),
        ("CPU", lambda o: _cpu(o.spec.template.requests.milli_cpu), False),
        ("MEMORY", lambda o: _mem(o.spec.template.requests.memory_bytes), False),
        ("GPUS", lambda o: o.spec.template.requests.gpus, True),
        ("QOS", lambda o: _enum(o.spec.qos or pb.QOS_GUARANTEED, pb.QoS), True),
        ("TTL", lambda o: f"{o.spec.ttl_seconds}s", True),
        ("EXPIRES-IN", _reservation_expiry, False),
        ("TENANT", lambda o: o.metadata.owner, True),
        ("AGE", _age, False),
    ],
    # As `kubectl get events`.
    "Event": [
        ("LAST-SEEN", lambda o: age_of_ms(o.event_time_ms), False),
        ("TYPE", lambda o: o.type, False),
        ("REASON", lambda o: o.reason, False),
        ("OBJECT", lambda o: f"{o.regarding.kind.lower()}/{o.regarding.name}", False),
        ("SOURCE", lambda o: o.source, True),
        ("MESSAGE", lambda o: o.message, False),
    ],
    # As `kubectl get priorityclasses`, with what its pods are when their job does not say.
    "PriorityClass": [
        ("NAME", lambda o: o.metadata.name, False),
        ("VALUE", lambda o: o.value, False),
        ("GLOBAL-DEFAULT", lambda o: str(o.global_default).lower(), False),
        (
            "PREEMPTION-POLICY",
            lambda o: _enum(o.preemption_policy or pb.PREEMPT_LOWER_PRIORITY, pb.PreemptionPolicy),
            False,
        ),
        # Unset: the job's queue's preemptible_default.
        (
            "PREEMPTIBLE",
            lambda o: str(o.preemptible).lower() if o.HasField("preemptible") else "<queue>",
            False,
        ),
        ("DESCRIPTION", lambda o: o.description, True),
        ("AGE", _age, False),
    ],
}
_DEFAULT_COLUMNS: list[Column] = [("NAME", lambda o: o.metadata.name, False), ("AGE", _age, False)]


def _movement_counts(movement: pb.Movement) -> tuple[int, int]:
    """(replacements on a recommended node, replacements elsewhere)."""
    owners = movement.status.owners
    actual = sum(len(r.actual_pods) for o in owners for r in o.recommended_nodes)
    return actual, sum(len(o.mismatched_tasks) for o in owners)


OUTPUTS = ("table", "wide", "json", "yaml", "name")


def _check_output(output: str) -> None:
    if output not in OUTPUTS:
        fail(f"unknown output format {output!r} ({', '.join(OUTPUTS)})")


def _columns(kind: str, output: str) -> list[Column]:
    return [c for c in COLUMNS.get(kind, _DEFAULT_COLUMNS) if output == "wide" or not c[2]]


def _row(kind: str, obj: StoredObject, columns: list[Column], prefixed: bool) -> list[object]:
    """A table row; with ``prefixed`` (several kinds in one listing) the name is `kind/name`,
    as kubectl prints `get job,pod`."""
    row = [c[1](obj) for c in columns]
    if prefixed and columns and columns[0][0] == "NAME":
        row[0] = f"{kind.lower()}/{row[0]}"
    return row


def _print(kind: str, objs: Sequence[StoredObject], output: str, *, single: bool = False) -> None:
    """Objects of one kind; ``single``: one object asked for by name (-o json/yaml print it
    alone, a listing prints a List, as kubectl does)."""
    _print_listing([(kind, objs)], output, single=single)


def _print_listing(
    listing: Sequence[tuple[str, Sequence[StoredObject]]], output: str, *, single: bool = False
) -> None:
    _check_output(output)
    if output in ("json", "yaml"):
        docs = [to_manifest(kind, o) for kind, objs in listing for o in objs]
        document = docs[0] if single else to_list(docs)
        if output == "json":
            print_json(document)
        else:
            click.echo(dump_yaml([document]), nl=False)
    elif output == "name":
        for kind, objs in listing:
            for o in objs:
                click.echo(f"{kind.lower()}/{o.metadata.name}")
    else:
        prefixed = len(listing) > 1
        printed = False
        for kind, objs in listing:
            if not objs:
                continue
            if printed:
                click.echo("")
            columns = _columns(kind, output)
            print_table([c[0] for c in columns], [_row(kind, o, columns, prefixed) for o in objs])
            printed = True


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------


def _read_manifests(filenames: Sequence[str]) -> list[Manifest]:
    """Every manifest of the files (``-``: stdin, read as bytes like a file), all read before
    any call: one that cannot be read, is not UTF-8 text or not a manifest is a one-line error
    naming it, and nothing is sent."""
    manifests: list[Manifest] = []
    for name in filenames:
        try:
            manifests += (
                load(sys.stdin.buffer.read(), "<stdin>") if name == "-" else load_file(name)
            )
        except ManifestError as exc:
            fail(str(exc))
    return manifests


@click.command("apply")
@click.option(
    "--filename", "-f", multiple=True, required=True, help="Manifest file(s); - reads stdin."
)
@click.option("--dry-run", is_flag=True, help="Validate only.")
@server_option
@home_option
def apply(filename: tuple[str, ...], dry_run: bool, server: str | None, home: Path | None) -> None:
    """Create, update or leave unchanged the objects in manifest files (a List too).

    Each is reported `created`, `configured` or `unchanged`; a change to a field that cannot
    change (a job's replicas, say) is an error naming the field, and nothing is written for it.
    """
    manifests = _read_manifests(filename)
    with _client(server, home) as client:
        applied = _guard(
            lambda: client.apply(
                [(m.kind, m.obj) for m in manifests],
                dry_run=dry_run,
                # The channel retries UNAVAILABLE: a retry after a lost reply then finds the
                # jobs its first attempt stored instead of reporting them as clashes.
                request_id=uuid.uuid4().hex,
            )
        )
    suffix = " (dry run)" if dry_run else ""
    failed = False
    for result in applied.results:
        target = f"{result.kind.lower()}/{result.name}"
        if result.violations:
            failed = True
            _report_violations(target, result.violations)
        else:
            click.echo(f"{target} {result.action}{suffix}")
    if failed:
        raise click.exceptions.Exit(1)


def _report_violations(target: str, violations: Sequence[Any]) -> None:
    for v in violations:
        click.echo(f"error: {target}: {v.field}: {v.description}", err=True)


@click.command("get")
@click.argument(
    "target",
    nargs=-1,
    required=True,
    help="TYPE [NAME], TYPE/NAME or TYPE,TYPE (e.g. job,pod)",
    shell_complete=_complete_target,
)
@output_option
@click.option("--job", default="", show_default=False, help="Pods of this job only.")
@click.option(
    "--selector",
    "-l",
    default="",
    show_default=False,
    help="Label selector, kubectl's grammar: 'app=web,tier!=db,zone in (a,b),!canary'.",
)
@click.option("--watch", "-w", is_flag=True, help="After listing, print each change as it happens.")
@server_option
@home_option
@rescheduler_option
def get(
    target: tuple[str, ...],
    output: str,
    job: str,
    selector: str,
    watch: bool,
    server: str | None,
    home: Path | None,
    rescheduler: str | None,
) -> None:
    """List objects of one or more types, or show one (`get policies` asks the rescheduler)."""
    if target and target[0].lower() in ("policy", "policies"):
        from godel.cli.reschedule import get_policies

        get_policies(output, rescheduler, home)
        return
    _check_output(output)
    kinds, name = _split_targets(target)
    selector = _selector(selector)
    if job and not set(kinds) <= {"Job", "Pod"}:
        fail("--job picks a job's pods: only with pods (or jobs)")
    with _client(server, home) as client:
        if watch:
            _watch(client, kinds, name, output, selector=selector, job=job)
            return
        listing: list[tuple[str, Sequence[StoredObject]]] = []
        if name:
            listing.append((kinds[0], [_guard(lambda: client.get(kinds[0], name))]))
        for kind in kinds if not name else []:
            pods_of = job if kind == "Pod" else ""
            objs = _guard(lambda: client.list(kind, job=pods_of, selector=selector))  # noqa: B023
            listing.append((kind, objs))
    if not any(objs for _, objs in listing) and output in ("table", "wide"):
        plural = ", ".join(k.lower() + ("es" if k.endswith("s") else "s") for k in kinds)
        click.echo(f"No {plural} found.", err=True)
        return
    _print_listing(listing, output, single=bool(name))


def _watch(
    client: ProtoClient,
    kinds: list[str],
    name: str | None,
    output: str,
    *,
    selector: str,
    job: str,
) -> None:
    """`get -w`: the objects now, then one line (or document) per change, from the Watch
    stream, until interrupted. Tables keep the first listing's columns."""
    widths: dict[str, list[int]] = {}
    listed: dict[str, list[StoredObject]] = {k: [] for k in kinds}
    listing = True
    prefixed = len(kinds) > 1

    def show(kind: str, objs: Sequence[StoredObject], header: bool) -> None:
        if output in ("table", "wide"):
            columns = _columns(kind, output)
            widths[kind] = print_table(
                [c[0] for c in columns],
                [_row(kind, o, columns, prefixed) for o in objs],
                widths=widths.get(kind),
                header=header,
            )
        else:
            for obj in objs:
                _print(kind, [obj], output, single=True)
                if output == "yaml":
                    click.echo("---")

    try:
        for event in client.watch(
            kinds, selector=selector, job=job if set(kinds) <= {"Job", "Pod"} else ""
        ):
            if event.type == api_pb2.WatchEvent.BOOKMARK:
                if listing:
                    listing = False
                    for kind in kinds:
                        if listed[kind] or output not in ("table", "wide"):
                            show(kind, listed[kind], header=True)
                continue
            kind, message = unwrap(event.object)
            obj = stored(message)
            if name and obj.metadata.name != name:
                continue
            if listing:
                listed[kind].append(obj)
            else:
                show(kind, [obj], header=kind not in widths)
    except ClientError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        pass


@click.command("describe")
@click.argument(
    "target",
    nargs=-1,
    required=True,
    help="TYPE NAME or TYPE/NAME",
    shell_complete=_complete_target,
)
@server_option
@home_option
def describe(target: tuple[str, ...], server: str | None, home: Path | None) -> None:
    """Everything about one object: its manifest, for pods why they are (not) placed, and the
    events that concern it."""
    kind, name = _split_target(target)
    if not name:
        fail("describe needs a NAME")
    with _client(server, home) as client:
        obj = _guard(lambda: client.get(kind, name))
        click.echo(dump_yaml([to_manifest(kind, obj)]), nl=False)
        if kind == "Pod":
            click.echo(f"scheduling: {render_explanation(_guard(lambda: client.explain(name)))}")
        elif kind == "Job":
            pods = _guard(lambda: client.list(pb.Pod, job=name))
            click.echo("pods:")
            _print("Pod", pods, "table")
        elif kind == "DisruptionBudget":
            from placement.budgets import selects

            assert isinstance(obj, pb.DisruptionBudget)
            pods = _guard(lambda: client.list(pb.Pod, job=obj.spec.job))  # every pod if no job
            _describe_budget(obj, [p for p in pods if selects(obj, p)])
        elif kind == "Movement":
            assert isinstance(obj, pb.Movement)
            _describe_movement(obj)
        elif kind == "Node" and isinstance(obj, pb.Node) and obj.status.allocatable.gpus:
            pods = _guard(lambda: client.list(pb.Pod))
            _describe_gpu_cards(obj, [p for p in pods if p.spec.node_name == name])
        elif kind == "PriorityClass":
            jobs = [
                j for j in _guard(lambda: client.list(pb.Job)) if j.spec.priority_class_name == name
            ]
            click.echo("jobs:")
            if jobs:
                _print("Job", jobs, "table")
            else:
                click.echo("  <none>")
        elif kind == "Reservation":
            assert isinstance(obj, pb.Reservation)
            _describe_reservation(obj)
        events = [
            e
            for e in _guard(lambda: client.list(pb.Event))
            if e.regarding.kind == kind and e.regarding.name == name
        ]
    click.echo("events:")
    events.sort(key=lambda e: e.event_time_ms)
    if events:
        _print("Event", events, "table")
    else:
        click.echo("  <none>")


def _describe_movement(movement: pb.Movement) -> None:
    """A Movement's story: its batch, who acknowledged, and where each job's replacements went
    against where they were recommended."""
    s, spec = movement.status, movement.spec
    click.echo(
        f"movement: batch {spec.batch} of round {spec.generation} of policy {spec.policy} "
        f"({spec.creator}), {s.phase}{': ' + s.message if s.message else ''}"
    )
    acks = ", ".join(s.notified_schedulers) or "none yet"
    click.echo(f"acknowledged by: {acks}")
    click.echo("evicted:")
    print_table(["POD", "FROM"], [[t.pod, t.node] for t in spec.deleted_tasks])
    click.echo("replacements:")
    rows: list[list[object]] = []
    for owner in s.owners:
        for rec in owner.recommended_nodes:
            landed = ",".join(t.pod for t in rec.actual_pods) or "<none>"
            rows.append([owner.job, rec.node, rec.desired_pod_count, len(rec.actual_pods), landed])
        for task in owner.mismatched_tasks:
            rows.append([owner.job, f"(elsewhere: {task.node})", "", "", task.pod])
    print_table(["JOB", "RECOMMENDED", "DESIRED", "ACTUAL", "PODS"], rows)


def _describe_gpu_cards(node: pb.Node, pods: Sequence[pb.Pod]) -> None:
    """A node's cards: each one's milli held (1000 a whole card) and the pods holding it,
    counted from the cards the Binder wrote into the pods that have not finished."""
    from placement.claims import TERMINAL_PHASES

    cards = node.status.allocatable.gpus
    used = [0] * cards
    holders: list[list[str]] = [[] for _ in range(cards)]
    for pod in pods:
        if pod.status.phase in TERMINAL_PHASES:
            continue
        for card in pod.spec.gpu_cards:
            if 0 <= card < cards:
                used[card] += pod.spec.template.gpu_milli or 1000
                holders[card].append(pod.metadata.name)
    free = sum(1 for u in used if u == 0)
    click.echo(f"gpu cards: {cards} {node.status.gpu_model or '(model unknown)'}, {free} free")
    print_table(
        ["CARD", "USED", "PODS"],
        [[i, f"{used[i]}m", ",".join(holders[i]) or "<none>"] for i in range(cards)],
    )


def _describe_reservation(rsv: pb.Reservation) -> None:
    """Where its room is held, for whom, and until when."""
    if rsv.status.node:
        where = f"on {rsv.status.node}"
    elif rsv.spec.node:
        where = f"on {rsv.spec.node} once the Binder commits it"
    else:
        where = "waiting for a node"
    click.echo(
        f"reservation: {_enum(rsv.status.phase or pb.RESERVATION_PENDING, pb.ReservationPhase)} "
        f"{where}, for {_reservation_owner(rsv)}, released unused in {_reservation_expiry(rsv)}"
    )
    if rsv.status.message:
        click.echo(f"status: {rsv.status.message}")


def _describe_budget(budget: pb.DisruptionBudget, pods: Sequence[pb.Pod]) -> None:
    s = budget.status
    allowed = f"{s.disruptions_allowed} disruption{'' if s.disruptions_allowed == 1 else 's'}"
    click.echo(
        f"budget: {allowed} allowed now ({s.current_healthy} healthy, "
        f"{s.desired_healthy} desired, {s.expected_pods} expected)"
    )
    click.echo("pods:")
    _print("Pod", pods, "table")


def _delete_targets(words: Sequence[str]) -> list[tuple[str, str]]:
    """`TYPE NAME [NAME...]` or `TYPE/NAME [TYPE/NAME...]`, as kubectl takes them: (kind, name)
    pairs in the order given."""
    if all("/" in word for word in words):
        pairs = [word.split("/", 1) for word in words]
        if not all(name for _, name in pairs):
            fail("delete needs a NAME after each TYPE/")
        return [(_kind(kind), name) for kind, name in pairs]
    if any("/" in word for word in words):
        fail("give TYPE NAME [NAME...] or TYPE/NAME [TYPE/NAME...], not both forms")
    kind, names = words[0], words[1:]
    if "," in kind:
        fail("a NAME goes with a single TYPE")
    if not names:
        fail("delete needs a NAME")
    return [(_kind(kind), name) for name in names]


@click.command("delete")
@click.argument(
    "target",
    nargs=-1,
    help="TYPE NAME [NAME...] or TYPE/NAME [TYPE/NAME...]",
    shell_complete=_complete_target,
)
@click.option("--filename", "-f", multiple=True, help="Delete the objects of these manifests.")
@click.option(
    "--wait/--no-wait",
    default=True,
    help="Follow a big job's deletion, which goes on in the dispatcher, until it is done "
    "(default); --no-wait returns once it has begun.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=0.0,
    help="With --wait: seconds to follow a deletion (0: until it is done); it goes on after.",
)
@server_option
@home_option
def delete(
    target: tuple[str, ...],
    filename: tuple[str, ...],
    wait: bool,
    timeout: float,
    server: str | None,
    home: Path | None,
) -> None:
    """Delete objects, or those of manifest files; deleting a job deletes its pods. Each name is
    reported on its own line; one that fails does not stop the others (the exit status is 1).

    A job too big for one store commit is marked and its pods go in the background: the
    dispatcher answers at once, the job reads as Deleting with the pods it has left, and this
    follows it until it is gone (a dispatcher restarted meanwhile finishes it)."""
    if bool(target) == bool(filename):
        fail("give TYPE NAME or -f FILE (not both)")
    if filename:
        targets = [(m.kind, m.name) for m in _read_manifests(filename)]
    else:
        targets = _delete_targets(target)
    failed = False
    with _client(server, home) as client:
        in_progress: dict[str, int] = {}  # job -> its pods left
        for kind, name in targets:
            try:
                response = client.delete_object(kind, name)
            except ClientError as exc:
                # As kubectl: report it and go on with the others; the exit status says so.
                click.echo(f"error: {kind.lower()}/{name}: {exc}", err=True)
                failed = True
            else:
                if response.in_progress:
                    click.echo(
                        f"{kind.lower()}/{name} deletion in progress: "
                        f"{_pods(response.pods_remaining)} remaining"
                    )
                    in_progress[name] = response.pods_remaining
                else:
                    click.echo(f"{kind.lower()}/{name} deleted")
        if not wait:
            for name in in_progress:
                click.echo(f"job/{name}: the dispatcher goes on; `godel get job {name}` follows it")
        else:
            retry = Retry(Backoff(DELETE_POLL_SECONDS), deadline_seconds=timeout or None)
            for name, remaining in in_progress.items():
                failed |= not _follow_deletion(client, name, remaining, retry)
    if failed:
        raise click.exceptions.Exit(1)


def _pods(count: int) -> str:
    return f"{count} pod{'' if count == 1 else 's'}"


def _follow_deletion(client: ProtoClient, name: str, remaining: int, retry: Retry) -> bool:
    """Follow a job's deletion (it reads as Deleting) until it is gone, printing the pods it has
    left as they change from ``remaining``; False (and said why) when ``retry``'s deadline
    passes first. A
    dispatcher that does not answer meanwhile (restarting, or busy past a call's deadline) is
    waited for: the deletion goes on, or the next dispatcher finishes it."""
    uid = ""
    shown = remaining
    silent = False  # the dispatcher did not answer the last read
    while True:
        try:
            job = client.get(pb.Job, name)
        except NotFound:
            click.echo(f"job/{name} deleted")
            return True
        except (Unavailable, DeadlineExceeded) as exc:
            if not silent:
                click.echo(
                    f"job/{name}: no answer from the dispatcher ({exc}); still waiting", err=True
                )
            silent = True
        except ClientError as exc:
            click.echo(f"error: job/{name}: {exc}", err=True)
            return False
        else:
            silent = False
            if (uid and job.metadata.uid != uid) or not job.metadata.deletion_timestamp_ms:
                click.echo(f"job/{name} deleted")  # and another of that name made since
                return True
            uid = job.metadata.uid
            if job.status.pods_remaining != shown:
                shown = job.status.pods_remaining
                click.echo(f"job/{name} deleting: {_pods(shown)} remaining")
        if retry.remaining() < DELETE_POLL_SECONDS:
            click.echo(
                f"error: job/{name} still being deleted ({_pods(shown)} remaining); "
                f"the dispatcher goes on: `godel get job {name}` follows it",
                err=True,
            )
            return False
        retry.sleep_sync()


@click.command("explain")
@click.argument("pod", help="Pod name")
@output_option
@server_option
@home_option
def explain(pod: str, output: str, server: str | None, home: Path | None) -> None:
    """Why a pod is pending (or where it runs)."""
    with _client(server, home) as client:
        result = _guard(lambda: client.explain(pod))
    if output == "json":
        from google.protobuf import json_format

        print_json(json_format.MessageToDict(result, preserving_proto_field_name=True))
        return
    click.echo(f"pod/{result.pod}: {render_explanation(result)}")


def render_explanation(result: api_pb2.ExplainResponse) -> str:
    """A pending pod's explanation rendered from the shard's counts (``0/5 nodes fit: 4
    insufficient cpu, 1 node unschedulable; preemption cannot help: on 5 nodes the pods that
    would have to go are not preemptible (...); min_member needs 8 pod(s) placed, 3 fit``,
    worded as the shard's own condition message, protection's seconds counted from now); for
    any other pod, the dispatcher's summary (where it runs, or why it ended)."""
    if not result.HasField("diagnosis"):
        return result.summary
    from services.dispatcher.controllers.gangtimeout import TIMEOUT_SUMMARY

    if result.summary.startswith(TIMEOUT_SUMMARY):
        return result.summary  # a timed-out gang's says so, its last diagnosis in words
    d = result.diagnosis
    text = f"0/{d.total_nodes} nodes fit"
    if d.reasons:
        text += ": " + ", ".join(f"{r.nodes} {r.reason}" for r in d.reasons)
    if d.note:
        text += f"; {d.note}"
    preemption = explain_preemption(d, int(time.time() * 1000))
    if preemption:
        text += f"; {preemption}"
    if d.gang_needed:
        text += f"; min_member needs {d.gang_needed} pod(s) placed, {d.gang_placed} fit"
    return text


@click.command("retry")
@click.argument("target", nargs=-1, required=True, help="job NAME or job/NAME")
@server_option
@home_option
def retry(target: tuple[str, ...], server: str | None, home: Path | None) -> None:
    """Start a gang whose scheduling timed out (phase Timeout) again: back to Pending, its
    scheduleTimeoutSeconds counted afresh, its pods dispatched again."""
    kind, name = _split_target(target)
    if kind != "Job" or not name:
        fail("retry takes a job: job/NAME")
    with _client(server, home) as client:
        job = _guard(lambda: client.retry_job(name))
    phase = _enum(job.status.phase or pb.JOB_PENDING, pb.JobPhase)
    click.echo(f"job/{name} retried ({phase})")


@click.command("logs")
@click.argument("pod", help="Pod name")
@click.option("--follow", "-f", is_flag=True, help="Stream until it ends.")
@click.option("--tail", default=0, help="Last N lines (0 = all).")
@server_option
@home_option
def logs(pod: str, follow: bool, tail: int, server: str | None, home: Path | None) -> None:
    """The output of a process-mode pod."""
    with _client(server, home) as client:
        obj = _guard(lambda: client.get(pb.Pod, pod))
        if not obj.spec.node_name:
            fail(f"pod {pod} has not been placed on a node yet")
        node = _guard(lambda: client.get(pb.Node, obj.spec.node_name))
    agent = _agent_address(node.spec, home)
    try:
        for data in pod_logs(agent, pod, follow=follow, tail_lines=tail, home=home):
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
    except ClientError as exc:
        fail(str(exc))


def _agent_address(spec: pb.NodeSpec, home: Path | None) -> str:
    """Where the node's agent serves logs: the address the agent publishes on its nodes (all a
    compose deployment has: there is no local cluster state), else, for a node registered by an
    agent that predates ``agent_address``, its name looked up in the local cluster state."""
    if spec.agent_address:
        return spec.agent_address
    agent = spec.agent
    if ":" in agent:
        return agent
    state = local.GodelHome(home or local.default_home()).load()
    record = state.component(agent) if state else None
    if record is None:
        fail(f"cannot find node agent {agent!r}")
    return record.address


@click.command("scale")
@click.argument("target", help="KIND=N, e.g. scheduler=4")
@home_option
@click.option(
    "--timeout", type=click.FloatRange(min=1), default=30.0, help="Seconds to wait for SERVING."
)
def scale(target: str, home: Path | None, timeout: float) -> None:
    """Set the number of scheduler shards (or binders) of the local cluster."""
    kind, _, count = target.partition("=")
    if not count.isdigit():
        fail(f"expected KIND=N, e.g. scheduler=4, not {target!r}")
    output.configure_logging(output.VERBOSE)  # the local-cluster machinery logs (to stderr)
    try:
        changes = local.scale(
            local.GodelHome(home or local.default_home()),
            kind.removesuffix("s"),
            int(count),
            timeout,
        )
    except local.ClusterError as exc:
        fail(str(exc))
    for line in changes or [f"{kind} already has {count} replica(s)"]:
        click.echo(line)


# ---------------------------------------------------------------------------------------------
# Node maintenance
# ---------------------------------------------------------------------------------------------


@click.command("cordon")
@click.argument("node", help="Node name")
@server_option
@home_option
def cordon(node: str, server: str | None, home: Path | None) -> None:
    """Mark a node unschedulable: no new pod is placed on it; its pods stay."""
    _set_unschedulable(node, True, server, home)


@click.command("uncordon")
@click.argument("node", help="Node name")
@server_option
@home_option
def uncordon(node: str, server: str | None, home: Path | None) -> None:
    """Let new pods be placed on a cordoned node again."""
    _set_unschedulable(node, False, server, home)


def _set_unschedulable(node: str, value: bool, server: str | None, home: Path | None) -> None:
    word = "cordoned" if value else "uncordoned"
    with _client(server, home) as client:
        for _ in range(3):  # another writer between our read and our write: read again
            current = _guard(lambda: client.get(pb.Node, node))
            if current.spec.unschedulable == value:
                click.echo(f"node/{node} already {word}")
                return
            current.spec.unschedulable = value
            try:
                # The node as read, with its resource_version: Apply compare-and-sets on it.
                result = client.apply([("Node", current)]).results[0]
            except ClientError as exc:
                if exc.code == grpc.StatusCode.ABORTED:
                    continue
                fail(str(exc))
            if result.violations:
                _report_violations(f"node/{node}", result.violations)
                raise click.exceptions.Exit(1)
            click.echo(f"node/{node} {word}")
            return
    fail(f"node/{node} kept changing; try again")


@click.command("drain")
@click.argument("node", help="Node name")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=300.0,
    help="Seconds to keep evicting what disruption budgets hold back (0: one pass).",
)
@click.option("--dry-run", is_flag=True, help="List what would be evicted; change nothing.")
@server_option
@home_option
def drain(node: str, timeout: float, dry_run: bool, server: str | None, home: Path | None) -> None:
    """Cordon a node and evict its pods, within their disruption budgets.

    Evictions go through the Binder's one eviction path (reason Drained; a replacement is
    queued for each). A pod whose budget allows no disruption now is waited for, and the drain
    asks again until `--timeout`; it exits 1 naming the pods still there."""
    retry = Retry(Backoff(DRAIN_RETRY_SECONDS), deadline_seconds=timeout)
    reported: dict[str, str] = {}
    with _client(server, home) as client:
        while True:
            response = _guard(lambda: client.drain(node, dry_run=dry_run))
            if response.cordoned:
                click.echo(f"node/{node} cordoned")
            waiting = []
            for pod in response.pods:
                if pod.outcome == "waiting":
                    waiting.append(pod.pod)
                    if reported.get(pod.pod) != pod.reason:
                        click.echo(f"pod/{pod.pod} waiting: {pod.reason}")
                        reported[pod.pod] = pod.reason
                elif pod.outcome == "evicted":
                    replaced = f" (replacement {pod.replacement})" if pod.replacement else ""
                    click.echo(f"pod/{pod.pod} evicted{replaced}")
                else:
                    click.echo(f"pod/{pod.pod} {pod.outcome}")
            if dry_run:
                return
            if not waiting:
                click.echo(f"node/{node} drained")
                return
            if retry.remaining() < DRAIN_RETRY_SECONDS:  # no time left for another pass
                fail(f"node/{node} not drained: still waiting for {', '.join(waiting)}")
            retry.sleep_sync()
