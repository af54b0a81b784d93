"""`godel apply|get|describe|delete|explain|logs|scale`: kubectl-like commands over the API.

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
from typing import Annotated, Any

import typer
from google.protobuf.message import Message

from godel import local
from godel.cli.cluster import HomeOption, local_address
from godel.cli.output import fail, print_json, print_table
from godel.cli.reschedule import ReschedulerOption, get_policies
from godel.client import ClientError, ProtoClient
from godel.client import logs as pod_logs
from godel.manifest import ManifestError, dump_yaml, load, to_manifest
from placement.budgets import selects
from protos.godel.v1 import objects_pb2 as pb

ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        "-s",
        envvar="GODEL_SERVER",
        help="Dispatcher address host:port (default: the local cluster's).",
        show_default=False,
    ),
]
OutputOption = Annotated[
    str, typer.Option("--output", "-o", help="table (default), wide, json, yaml or name.")
]

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
}


def register(app: typer.Typer) -> None:
    for command in (apply, get, describe, delete, explain, logs, scale):
        app.command(command.__name__)(command)


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
            "disruptionbudgets, movements, schedulers)"
        )
    return kind


def _split_target(words: Sequence[str]) -> tuple[str, str | None]:
    """`pods`, `pod NAME` or `pod/NAME`."""
    if len(words) == 1 and "/" in words[0]:
        kind, name = words[0].split("/", 1)
        return _kind(kind), name
    if len(words) == 1:
        return _kind(words[0]), None
    if len(words) == 2:
        return _kind(words[0]), words[1]
    fail("expected TYPE [NAME] or TYPE/NAME")


def _guard(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except ClientError as exc:
        fail(str(exc))


def _age(obj: Message) -> str:
    created = obj.metadata.creation_timestamp_ms  # type: ignore[attr-defined]
    if not created:
        return "<unknown>"
    seconds = max(0, int(time.time() - created / 1000))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _cpu(milli: int) -> str:
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


def _mem(size: int) -> str:
    for unit, scale_ in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if size >= scale_ and size % scale_ == 0:
            return f"{size // scale_}{unit}"
    return str(size)


def _enum(value: int, enum: Any, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix).replace("_", "-").lower()


def _optional(msg: Message, field: str) -> object:
    """A field with presence: its value (0 included), or ``<none>`` when unset (as kubectl)."""
    return getattr(msg, field) if msg.HasField(field) else "<none>"


# kubectl's spelling of selector requirements: `app in (a,b)`, `!zone`, `tier>2`.
_SELECTOR_FORMATS = {
    pb.LabelSelectorRequirement.IN: "{key} in ({values})",
    pb.LabelSelectorRequirement.NOT_IN: "{key} notin ({values})",
    pb.LabelSelectorRequirement.EXISTS: "{key}",
    pb.LabelSelectorRequirement.DOES_NOT_EXIST: "!{key}",
    pb.LabelSelectorRequirement.GT: "{key}>{values}",
    pb.LabelSelectorRequirement.LT: "{key}<{values}",
}


def _budget_selects(budget: pb.DisruptionBudget) -> str:
    """What a budget selects: ``job=web`` or its label selector."""
    if budget.spec.job:
        return f"job={budget.spec.job}"
    return ",".join(
        _SELECTOR_FORMATS.get(r.operator, "{key} ?").format(key=r.key, values=",".join(r.values))
        for r in budget.spec.selector
    )


# Columns per kind: (header, getter, wide-only).
Column = tuple[str, Callable[[Any], object], bool]
COLUMNS: dict[str, list[Column]] = {
    "Job": [
        ("NAME", lambda o: o.metadata.name, False),
        ("QUEUE", lambda o: o.spec.queue or "default", False),
        ("QOS", lambda o: _enum(o.spec.qos or pb.QOS_GUARANTEED, pb.QoS, "QOS_"), False),
        ("REPLICAS", lambda o: o.spec.replicas, False),
        ("MIN", lambda o: o.spec.min_member, False),
        ("BOUND", lambda o: o.status.bound, False),
        ("RUNNING", lambda o: o.status.running, False),
        ("SUCCEEDED", lambda o: o.status.succeeded, False),
        ("PHASE", lambda o: _enum(o.status.phase or pb.JOB_PENDING, pb.JobPhase, "JOB_"), False),
        ("PRIORITY", lambda o: o.spec.priority, True),
        ("RV", lambda o: o.metadata.resource_version, True),
        ("AGE", _age, False),
    ],
    "Pod": [
        ("NAME", lambda o: o.metadata.name, False),
        ("JOB", lambda o: o.spec.job, False),
        ("PHASE", lambda o: _enum(o.status.phase or pb.POD_PENDING, pb.PodPhase, "POD_"), False),
        ("NODE", lambda o: o.spec.node_name, False),
        # The NUMA nodes the Binder assigned (NUMA-bound pods), e.g. "0,1".
        ("NUMA", lambda o: ",".join(map(str, o.spec.numa_nodes)), True),
        ("QOS", lambda o: _enum(o.spec.qos or pb.QOS_GUARANTEED, pb.QoS, "QOS_"), True),
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
        ("READY", lambda o: "True" if o.status.ready else "False", False),
        ("CPU", lambda o: _cpu(o.status.allocatable.milli_cpu), False),
        ("MEMORY", lambda o: _mem(o.status.allocatable.memory_bytes), False),
        ("PODS", lambda o: o.status.allocatable.pods, False),
        ("BE-CPU", lambda o: _cpu(o.status.reclaimable.milli_cpu), True),
        ("BE-MEMORY", lambda o: _mem(o.status.reclaimable.memory_bytes), True),
        ("MODE", lambda o: o.spec.mode, True),
        ("TAINTS", lambda o: ",".join(f"{t.key}={t.value}" for t in o.spec.taints), True),
        (
            "LABELS",
            lambda o: ",".join(f"{k}={v}" for k, v in sorted(o.metadata.labels.items())),
            True,
        ),
        ("AGE", _age, False),
    ],
    "Queue": [
        ("NAME", lambda o: o.metadata.name, False),
        (
            "POLICY",
            lambda o: _enum(o.spec.sort_policy or pb.SORT_FIFO, pb.SortPolicy, "SORT_"),
            False,
        ),
        (
            "QUOTA-CPU",
            lambda o: _cpu(o.spec.quota.milli_cpu) if o.spec.quota.milli_cpu else "",
            False,
        ),
        (
            "QUOTA-MEMORY",
            lambda o: _mem(o.spec.quota.memory_bytes) if o.spec.quota.memory_bytes else "",
            False,
        ),
        ("PENDING", lambda o: o.status.pending_pods, True),
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
}
_DEFAULT_COLUMNS: list[Column] = [("NAME", lambda o: o.metadata.name, False), ("AGE", _age, False)]


def _movement_counts(movement: pb.Movement) -> tuple[int, int]:
    """(replacements on a recommended node, replacements elsewhere)."""
    owners = movement.status.owners
    actual = sum(len(r.actual_pods) for o in owners for r in o.recommended_nodes)
    return actual, sum(len(o.mismatched_tasks) for o in owners)


def _print(kind: str, objs: Sequence[Message], output: str) -> None:
    if output in ("json", "yaml"):
        docs = [to_manifest(kind, o) for o in objs]
        if output == "json":
            print_json(docs[0] if len(docs) == 1 else {"items": docs})
        else:
            typer.echo(dump_yaml(docs), nl=False)
    elif output == "name":
        for o in objs:
            typer.echo(f"{kind.lower()}/{o.metadata.name}")  # type: ignore[attr-defined]
    elif output in ("table", "wide"):
        columns = [c for c in COLUMNS.get(kind, _DEFAULT_COLUMNS) if output == "wide" or not c[2]]
        print_table([c[0] for c in columns], [[c[1](o) for c in columns] for o in objs])
    else:
        fail(f"unknown output format {output!r} (table, wide, json, yaml, name)")


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------


def apply(
    filename: Annotated[
        list[str], typer.Option("--filename", "-f", help="Manifest file(s); - reads stdin.")
    ],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Validate only.")] = False,
    server: ServerOption = None,
    home: HomeOption = None,
) -> None:
    """Create or update the jobs, nodes, queues and budgets in manifest files."""
    manifests = []
    for name in filename:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text()
        except OSError as exc:
            fail(f"cannot read {name}: {exc.strerror}")
        try:
            manifests += load(text, "<stdin>" if name == "-" else name)
        except ManifestError as exc:
            fail(str(exc))
    jobs = [m for m in manifests if m.kind == "Job"]
    others = [m for m in manifests if m.kind != "Job"]
    failed = False
    with _client(server, home) as client:
        suffix = " (dry run)" if dry_run else ""
        if others:
            applied = _guard(
                lambda: client.apply([(m.kind, m.obj) for m in others], dry_run=dry_run)
            )
            for result in applied.results:
                if result.violations:
                    failed = True
                    _report_violations(f"{result.kind.lower()}/{result.name}", result.violations)
                else:
                    typer.echo(f"{result.kind.lower()}/{result.name} {result.action}{suffix}")
        if jobs:
            submitted = _guard(
                lambda: client.submit(
                    [m.obj for m in jobs],  # type: ignore[misc]
                    dry_run=dry_run,
                    # The channel retries UNAVAILABLE: a retry after a lost reply then finds
                    # the jobs its first attempt stored instead of reporting them as clashes.
                    request_id=uuid.uuid4().hex,
                )
            )
            for result in submitted.results:
                if result.violations:
                    failed = True
                    _report_violations(f"job/{result.job}", result.violations)
                else:
                    typer.echo(
                        f"job/{result.job} "
                        f"{'created' if result.created or result.existing else 'valid'}{suffix}"
                    )
    if failed:
        raise typer.Exit(1)


def _report_violations(target: str, violations: Sequence[Any]) -> None:
    for v in violations:
        typer.echo(f"error: {target}: {v.field}: {v.description}", err=True)


def get(
    target: Annotated[list[str], typer.Argument(help="TYPE [NAME] or TYPE/NAME")],
    output: OutputOption = "table",
    job: Annotated[str, typer.Option("--job", help="Pods of this job only.")] = "",
    selector: Annotated[
        str, typer.Option("--selector", "-l", help="Label equality selector: k=v,k2=v2")
    ] = "",
    server: ServerOption = None,
    home: HomeOption = None,
    rescheduler: ReschedulerOption = None,
) -> None:
    """List objects of a type, or show one (`get policies` asks the rescheduler)."""
    if target and target[0].lower() in ("policy", "policies"):
        get_policies(output, rescheduler, home)
        return
    kind, name = _split_target(target)
    labels = dict(kv.split("=", 1) for kv in selector.split(",") if "=" in kv)
    with _client(server, home) as client:
        if name:
            objs = [_guard(lambda: client.get(kind, name))]
        else:
            objs = _guard(lambda: client.list(kind, job=job, labels=labels))
    if not objs and output in ("table", "wide"):
        typer.echo(f"No {kind.lower()}s found.", err=True)
        return
    _print(kind, objs, output)


def describe(
    target: Annotated[list[str], typer.Argument(help="TYPE NAME or TYPE/NAME")],
    server: ServerOption = None,
    home: HomeOption = None,
) -> None:
    """Everything about one object: its manifest, and for pods why they are (not) placed."""
    kind, name = _split_target(target)
    if not name:
        fail("describe needs a NAME")
    with _client(server, home) as client:
        obj = _guard(lambda: client.get(kind, name))
        typer.echo(dump_yaml([to_manifest(kind, obj)]), nl=False)
        if kind == "Pod":
            typer.echo(f"scheduling: {_guard(lambda: client.explain(name)).summary}")
        elif kind == "Job":
            pods = _guard(lambda: client.list("Pod", job=name))
            typer.echo("pods:")
            _print("Pod", pods, "table")
        elif kind == "DisruptionBudget":
            assert isinstance(obj, pb.DisruptionBudget)
            pods = _guard(lambda: client.list("Pod", job=obj.spec.job))  # every pod if no job
            _describe_budget(obj, [p for p in pods if isinstance(p, pb.Pod) and selects(obj, p)])
        elif kind == "Movement":
            assert isinstance(obj, pb.Movement)
            _describe_movement(obj)


def _describe_movement(movement: pb.Movement) -> None:
    """A Movement's story: its batch, who acknowledged, and where each job's replacements went
    against where they were recommended."""
    s, spec = movement.status, movement.spec
    typer.echo(
        f"movement: batch {spec.batch} of round {spec.generation} of policy {spec.policy} "
        f"({spec.creator}), {s.phase}{': ' + s.message if s.message else ''}"
    )
    acks = ", ".join(s.notified_schedulers) or "none yet"
    typer.echo(f"acknowledged by: {acks}")
    typer.echo("evicted:")
    print_table(["POD", "FROM"], [[t.pod, t.node] for t in spec.deleted_tasks])
    typer.echo("replacements:")
    rows: list[list[object]] = []
    for owner in s.owners:
        for rec in owner.recommended_nodes:
            landed = ",".join(t.pod for t in rec.actual_pods) or "<none>"
            rows.append([owner.job, rec.node, rec.desired_pod_count, len(rec.actual_pods), landed])
        for task in owner.mismatched_tasks:
            rows.append([owner.job, f"(elsewhere: {task.node})", "", "", task.pod])
    print_table(["JOB", "RECOMMENDED", "DESIRED", "ACTUAL", "PODS"], rows)


def _describe_budget(budget: pb.DisruptionBudget, pods: Sequence[pb.Pod]) -> None:
    s = budget.status
    allowed = f"{s.disruptions_allowed} disruption{'' if s.disruptions_allowed == 1 else 's'}"
    typer.echo(
        f"budget: {allowed} allowed now ({s.current_healthy} healthy, "
        f"{s.desired_healthy} desired, {s.expected_pods} expected)"
    )
    typer.echo("pods:")
    _print("Pod", pods, "table")


def delete(
    target: Annotated[list[str], typer.Argument(help="TYPE NAME or TYPE/NAME")],
    server: ServerOption = None,
    home: HomeOption = None,
) -> None:
    """Delete an object; deleting a job deletes its pods."""
    kind, name = _split_target(target)
    if not name:
        fail("delete needs a NAME")
    with _client(server, home) as client:
        _guard(lambda: client.delete(kind, name))
    typer.echo(f"{kind.lower()}/{name} deleted")


def explain(
    pod: Annotated[str, typer.Argument(help="Pod name")],
    output: OutputOption = "table",
    server: ServerOption = None,
    home: HomeOption = None,
) -> None:
    """Why a pod is pending (or where it runs)."""
    with _client(server, home) as client:
        result = _guard(lambda: client.explain(pod))
    if output == "json":
        from google.protobuf import json_format

        print_json(json_format.MessageToDict(result, preserving_proto_field_name=True))
        return
    typer.echo(f"pod/{result.pod}: {result.summary}")


def logs(
    pod: Annotated[str, typer.Argument(help="Pod name")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until it ends.")] = False,
    tail: Annotated[int, typer.Option("--tail", help="Last N lines (0 = all).")] = 0,
    server: ServerOption = None,
    home: HomeOption = None,
) -> None:
    """The output of a process-mode pod."""
    with _client(server, home) as client:
        obj = _guard(lambda: client.get("Pod", pod))
        if not obj.spec.node_name:  # type: ignore[attr-defined]
            fail(f"pod {pod} has not been placed on a node yet")
        node = _guard(lambda: client.get("Node", obj.spec.node_name))  # type: ignore[attr-defined]
    agent = _agent_address(node.spec, home)  # type: ignore[attr-defined]
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


def scale(
    target: Annotated[str, typer.Argument(help="KIND=N, e.g. scheduler=4")],
    home: HomeOption = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for SERVING.")] = 30.0,
) -> None:
    """Set the number of scheduler shards (or binders) of the local cluster."""
    kind, _, count = target.partition("=")
    if not count.isdigit():
        fail(f"expected KIND=N, e.g. scheduler=4, not {target!r}")
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
        typer.echo(line)
