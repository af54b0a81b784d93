"""Workload files (``bench/workloads/*.yaml``): what a benchmark run starts and submits.

    name: SchedulingBasic-500          # must equal the file name without .yaml
    description: ...
    cluster:
      nodes: 500
      node: {cpu: "4", memory: 32Gi, pods: 110, gpus: 0}
      labels: {disk: ssd}              # on every hollow node (each also has hostname, zone)
      shards: 1                        # scheduler processes
      binders: 1
      nodes_per_agent: 5000            # one node agent process per this many nodes
      pin_shards: false                # shard i runs on CPU i mod cores only (taskset)
      node_list: bench/data/openb/openb_node_list_gpu_node.csv
                                       # hollow nodes each of its own shape from an openb-format
                                       # CSV (path from the repository's root): ``nodes`` of its
                                       # rows, evenly spaced (all of them when equal); no ``node``
      scheduler: {mode: kube}          # extra flags per service kind (scheduler, binder, ...)
    init:     {count: 500, job_size: 100, template: {requests: {cpu: 100m, memory: 500Mi}}}
    measured:
      count: 1000
      job_size: 100
      template: {requests: {cpu: 100m, memory: 500Mi}}   # a PodTemplate as in a Job manifest
      job: {priority: 100}             # other Job spec fields, as in a manifest (both phases)
      min_member: 1                    # gang size of every job ...
      gang_percent: 0                  # ... or this share of jobs is a full gang
      per_node: false                  # one 1-pod job per node; "$node" in the template
                                       # (init too: pins a pod to each of the first count nodes)
      rate: 0                          # offered pods/s; 0 = as fast as possible
      queues: 0                        # jobs spread round-robin over this many queues
                                       # (tenant-0..; created first), 0 = the default queue
      gpu_shares: default              # each job's pods take one GPU-share task's shape of this
                                       # openb pod list (a trace name of bench.gputrace or a
                                       # path): cpu, memory, gpu: 1 and its gpuMilli, drawn at
                                       # random (seeded by the phase) from the list's shares
    reservations: {count: 1000, template: {requests: {cpu: "1", memory: 4Gi}}, ttl_seconds: 3600}
                                       # before the init pods: one Reservation on each of the
                                       # first count nodes, for a job that never comes
    reschedule: {policy: gpu-defrag, dry_run: true}   # after the measured pods: one round
    restart: false                     # after the measured pods: each service restarted in
                                       # turn, timed until it serves (its informer synced)
    timeout: 600                       # seconds for the measured pods to be bound
    quick: {cluster: {nodes: 100}, measured: {count: 300}}   # merged over the above by --quick
    baseline: kube                     # series only: the variant the others are compared to
    variants:                          # series only: each merged over the above, run in order
      - {name: godel}
      - {name: kube, cluster: {scheduler: {mode: kube}}, quick: {...}}

Every error names the file and the field.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bench.gputrace import POD_LISTS, TraceError, load_pods
from godel.manifest import ManifestError, parse_document, parse_quantity
from placement.gpufrag import TaskShape
from protos.godel.v1 import objects_pb2 as pb
from services.nodeagent.nodelist import ListedNode, load_node_list

WORKLOADS_DIR = Path(__file__).resolve().parent / "workloads"
REPO_ROOT = Path(__file__).resolve().parent.parent
NODE_PLACEHOLDER = "$node"
TENANT_QUEUE_PREFIX = "tenant-"
SERVICE_KINDS = ("dispatcher", "scheduler", "binder", "rescheduler", "nodeagent")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

_TOP = {
    "name",
    "description",
    "cluster",
    "init",
    "measured",
    "reschedule",
    "reservations",
    "restart",
    "timeout",
    "quick",
    "variants",
}
_SERIES = {"baseline"}
_CLUSTER = {
    "nodes",
    "node",
    "labels",
    "shards",
    "standby_shards",
    "binders",
    "nodes_per_agent",
    "pin_shards",
    "node_list",
    *SERVICE_KINDS,
}
_NODE = {"cpu", "memory", "pods", "gpus"}
_RESCHEDULE = {"policy", "dry_run"}
_RESERVATIONS = {"count", "template", "ttl_seconds"}
_PHASE = {
    "count",
    "job_size",
    "template",
    "job",
    "min_member",
    "gang_percent",
    "per_node",
    "rate",
    "queues",
    "gpu_shares",
}
# Job spec fields a phase's ``job`` may not set: the phase itself decides them.
_PHASE_OWNED = {"replicas", "minMember", "min_member", "template"}


class WorkloadError(ValueError):
    """A workload file is missing, malformed or invalid; the message names file and field."""


@dataclass(frozen=True)
class ClusterShape:
    nodes: int
    cpu_milli: int = 4000
    memory_bytes: int = 32 << 30
    max_pods: int = 110
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    shards: int = 1
    standby_shards: int = 0
    """Spare scheduler processes, each a warm standby for every shard's name."""
    binders: int = 1
    nodes_per_agent: int = 5000
    service_args: dict[str, dict[str, str]] = field(default_factory=dict)
    """Extra flags per service kind: {"scheduler": {"mode": "kube"}} -> --mode kube."""
    pin_shards: bool = False
    """Shard i runs on CPU i mod cores only, as ``taskset`` would: the capacity model's check
    (bench/capacity.py) that shards on cores of their own scale as predicted."""
    node_list: str = ""
    """An openb-format node list (absolute path): the hollow nodes are ``nodes`` of its rows,
    evenly spaced, each of its own cpu, memory, cards and model (``selected_nodes``)."""

    def selected_nodes(self) -> list[ListedNode]:
        """The rows of ``node_list`` this cluster serves: ``nodes`` of them, evenly spaced
        through the list (its mix of models and sizes kept), all of them when equal."""
        listed = load_node_list(self.node_list)
        return [listed[i * len(listed) // self.nodes] for i in range(self.nodes)]

    @property
    def nodeagents(self) -> int:
        return max(1, -(-self.nodes // self.nodes_per_agent))


@dataclass(frozen=True)
class PodPhase:
    count: int
    job_size: int
    template: dict[str, Any]
    """A PodTemplate as written in a Job manifest (camelCase or snake_case)."""
    min_member: int = 1
    gang_percent: int = 0
    per_node: bool = False
    rate: float = 0.0
    job: dict[str, Any] = field(default_factory=dict)
    """Other Job spec fields (``priority``, ``preemptible``, ...) as written in a manifest."""
    queues: int = 0
    """Jobs go round-robin to queues ``tenant-0`` .. ``tenant-<queues-1>`` (0: the default)."""
    gpu_shares: str = ""
    """An openb pod list (trace name or path): each job's pods take one of its GPU-share tasks'
    shapes (``share_shapes``); empty: every pod is the template as written."""

    def queue_names(self) -> list[str]:
        return [f"{TENANT_QUEUE_PREFIX}{i}" for i in range(self.queues)]

    @property
    def priority(self) -> int:
        return int(self.job.get("priority", 0))

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "job_size": self.job_size,
            "template": self.template,
            "job": self.job,
            "min_member": self.min_member,
            "gang_percent": self.gang_percent,
            "per_node": self.per_node,
            "rate": self.rate,
            "queues": self.queues,
            "gpu_shares": self.gpu_shares,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PodPhase:
        return cls(**data)


@dataclass(frozen=True)
class Reschedule:
    """A rescheduling round triggered once the measured pods are bound."""

    policy: str
    dry_run: bool = True


@dataclass(frozen=True)
class Reservations:
    """Live reservations held through the run: one on each of the first ``count`` nodes (by
    name), of ``template``'s requests, owned by a job that never comes (so every placement
    judgement counts them the whole run)."""

    count: int
    template: dict[str, Any]
    ttl_seconds: int = 3600

    def manifests(self, nodes: list[str]) -> list[pb.Reservation]:
        out = []
        for i, node in enumerate(nodes[: self.count]):
            doc = {
                "apiVersion": "godel/v1",
                "kind": "Reservation",
                "metadata": {"name": f"bench-reserved-{i}"},
                "spec": {
                    "node": node,
                    "ttlSeconds": self.ttl_seconds,
                    "owner": {"job": f"bench-reserved-{i}"},
                    "template": self.template,
                },
            }
            parsed = parse_document(doc, "")
            assert isinstance(parsed.obj, pb.Reservation)
            out.append(parsed.obj)
        return out


@dataclass(frozen=True)
class Workload:
    """One run: a cluster and the pods submitted to it."""

    name: str
    """The file's name; for a series variant ``<file name>/<variant>``."""
    variant: str
    description: str
    cluster: ClusterShape
    init: PodPhase | None
    measured: PodPhase
    timeout: float
    reschedule: Reschedule | None = None
    restart: bool = False
    reservations: Reservations | None = None

    @property
    def preempts(self) -> bool:
        """The measured pods outrank the init pods, which fill the cluster: each measured pod
        bound evicts init pods, so progress is the measured pods' claims, not all claims."""
        return self.init is not None and self.measured.priority > self.init.priority


@dataclass(frozen=True)
class Suite:
    """What one workload file defines: one run, or a series of variants run side by side."""

    name: str
    description: str
    path: Path
    runs: list[Workload]
    baseline: str | None
    """The variant the others are compared to (same run), if any."""


def select(suite: Suite, variants: list[str]) -> Suite:
    """Only the named variants of a series, plus its baseline if it has one (so every ratio is
    still to a baseline measured in the same invocation)."""
    if not variants:
        return suite
    known = [r.variant for r in suite.runs]
    if not any(known):
        raise WorkloadError(f"{suite.path}: not a series; --variant needs a file with variants")
    unknown = [v for v in variants if v not in known]
    if unknown:
        raise WorkloadError(
            f"{suite.path}: no variant {', '.join(map(repr, unknown))} (variants: {', '.join(known)})"
        )
    wanted = {*variants, *([suite.baseline] if suite.baseline else [])}
    return replace(suite, runs=[r for r in suite.runs if r.variant in wanted])


def available() -> list[str]:
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.yaml"))


def resolve(name_or_path: str) -> Path:
    """A workload by name (``bench/workloads/<name>.yaml``) or by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    candidate = WORKLOADS_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    raise WorkloadError(
        f"no workload {name_or_path!r}: expected a file or one of {', '.join(available())}"
    )


def load(name_or_path: str, *, quick: bool = False) -> Suite:
    path = resolve(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise WorkloadError(f"{path}: cannot read: {exc}") from None
    return parse(raw, path, quick=quick)


def parse(raw: Any, path: Path, *, quick: bool = False) -> Suite:
    """Validate a workload document and expand it into its runs."""
    src = str(path)
    doc = _mapping(raw, src, "")
    _known(doc, _TOP | _SERIES, src, "")
    name = doc.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise WorkloadError(f"{src}: name: required, letters, digits, '.', '_', '-' (got {name!r})")
    if path.suffix in (".yaml", ".yml") and path.stem != name:
        raise WorkloadError(f"{src}: name: {name!r} must equal the file name {path.stem!r}")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise WorkloadError(f"{src}: description: must be a string")
    base = {k: v for k, v in doc.items() if k not in ("quick", "variants", "baseline")}
    base_quick = _mapping(doc.get("quick", {}), src, "quick")
    variants = doc.get("variants")
    baseline = doc.get("baseline")
    if variants is None:
        if baseline is not None:
            raise WorkloadError(f"{src}: baseline: only a series (with variants) has a baseline")
        merged = _merge(base, base_quick) if quick else base
        return Suite(name, description, path, [_workload(merged, src, name, "")], None)
    if not isinstance(variants, list) or not variants:
        raise WorkloadError(f"{src}: variants: must be a non-empty list")
    runs: list[Workload] = []
    for i, v in enumerate(variants):
        at = f"variants[{i}]"
        variant = _mapping(v, src, at)
        vname = variant.get("name")
        if not isinstance(vname, str) or not _NAME.match(vname):
            raise WorkloadError(f"{src}: {at}.name: required, a simple name (got {vname!r})")
        if any(r.variant == vname for r in runs):
            raise WorkloadError(f"{src}: {at}.name: duplicate variant {vname!r}")
        _known(variant, (_TOP - {"variants", "name", "description"}) | {"name"}, src, at)
        own = {k: x for k, x in variant.items() if k not in ("name", "quick")}
        merged = _merge(base, own)
        if quick:
            merged = _merge(merged, base_quick)
            merged = _merge(merged, _mapping(variant.get("quick", {}), src, f"{at}.quick"))
        runs.append(_workload(merged, f"{src} ({at} {vname})", f"{name}/{vname}", vname))
    if baseline is not None and baseline not in {r.variant for r in runs}:
        raise WorkloadError(f"{src}: baseline: {baseline!r} is not a variant name")
    return Suite(name, description, path, runs, baseline)


def _workload(doc: dict[str, Any], src: str, name: str, variant: str) -> Workload:
    _known(doc, _TOP, src, "")
    cluster = _cluster(_mapping(doc.get("cluster"), src, "cluster"), src)
    init = None
    if doc.get("init") is not None:
        init = _phase(_mapping(doc["init"], src, "init"), src, "init", measured=False)
    measured = _phase(_mapping(doc.get("measured"), src, "measured"), src, "measured")
    if init is not None and init.per_node and init.count > cluster.nodes:
        raise WorkloadError(
            f"{src}: init.count: per_node pins one pod to each node; {cluster.nodes} nodes,"
            f" got {init.count}"
        )
    if measured.per_node and measured.count != cluster.nodes:
        raise WorkloadError(
            f"{src}: measured.count: per_node needs one pod per node "
            f"({cluster.nodes}, got {measured.count})"
        )
    timeout = _number(doc.get("timeout", 600), src, "timeout", minimum=1)
    reschedule = None
    if doc.get("reschedule") is not None:
        reschedule = _reschedule(_mapping(doc["reschedule"], src, "reschedule"), src)
    restart = doc.get("restart", False)
    if not isinstance(restart, bool):
        raise WorkloadError(f"{src}: restart: must be true or false")
    reservations = None
    if doc.get("reservations") is not None:
        reservations = _reservations(_mapping(doc["reservations"], src, "reservations"), src)
        if reservations.count > cluster.nodes:
            raise WorkloadError(
                f"{src}: reservations.count: one per node; {cluster.nodes} nodes, "
                f"got {reservations.count}"
            )
    return Workload(
        name=name,
        variant=variant,
        description=str(doc.get("description", "")),
        cluster=cluster,
        init=init,
        measured=measured,
        timeout=timeout,
        reschedule=reschedule,
        restart=restart,
        reservations=reservations,
    )


def _reservations(doc: dict[str, Any], src: str) -> Reservations:
    _known(doc, _RESERVATIONS, src, "reservations")
    count = _int(doc.get("count"), src, "reservations.count", minimum=1)
    ttl = _int(doc.get("ttl_seconds", 3600), src, "reservations.ttl_seconds", minimum=1)
    template = _mapping(doc.get("template"), src, "reservations.template")
    wanted = Reservations(count, template, ttl)
    try:
        wanted.manifests(["node-0"])  # validates the template
    except ManifestError as exc:
        where = exc.field.removeprefix("spec.") or "template"
        raise WorkloadError(f"{src}: reservations.{where}: {exc.reason}") from None
    return wanted


def _reschedule(doc: dict[str, Any], src: str) -> Reschedule:
    _known(doc, _RESCHEDULE, src, "reschedule")
    policy = doc.get("policy")
    if not isinstance(policy, str) or not policy:
        raise WorkloadError(f"{src}: reschedule.policy: required, a policy name")
    dry_run = doc.get("dry_run", True)
    if not isinstance(dry_run, bool):
        raise WorkloadError(f"{src}: reschedule.dry_run: must be true or false")
    return Reschedule(policy, dry_run)


def _cluster(doc: dict[str, Any], src: str) -> ClusterShape:
    _known(doc, _CLUSTER, src, "cluster")
    node = _mapping(doc.get("node", {}), src, "cluster.node")
    _known(node, _NODE, src, "cluster.node")
    try:
        cpu = parse_quantity(node.get("cpu", "4"), cpu=True, field="cluster.node.cpu")
        memory = parse_quantity(node.get("memory", "32Gi"), cpu=False, field="cluster.node.memory")
    except ManifestError as exc:
        raise WorkloadError(f"{src}: {exc}") from None
    labels = _mapping(doc.get("labels", {}), src, "cluster.labels")
    for k, v in labels.items():
        if not isinstance(k, str) or not isinstance(v, str | int) or "," in f"{k}={v}":
            raise WorkloadError(f"{src}: cluster.labels.{k}: keys and values must be plain strings")
    pin_shards = doc.get("pin_shards", False)
    if not isinstance(pin_shards, bool):
        raise WorkloadError(f"{src}: cluster.pin_shards: must be true or false")
    nodes = _int(doc.get("nodes"), src, "cluster.nodes", minimum=1)
    node_list = _node_list(doc.get("node_list", ""), node, nodes, src)
    args: dict[str, dict[str, str]] = {}
    for kind in SERVICE_KINDS:
        flags = _mapping(doc.get(kind, {}), src, f"cluster.{kind}")
        args[kind] = {str(k): _flag(v) for k, v in flags.items()}
    return ClusterShape(
        nodes=nodes,
        cpu_milli=cpu,
        memory_bytes=memory,
        max_pods=_int(node.get("pods", 110), src, "cluster.node.pods", minimum=1),
        gpus=_int(node.get("gpus", 0), src, "cluster.node.gpus", minimum=0),
        labels={str(k): str(v) for k, v in labels.items()},
        shards=_int(doc.get("shards", 1), src, "cluster.shards", minimum=1),
        standby_shards=_int(doc.get("standby_shards", 0), src, "cluster.standby_shards", minimum=0),
        binders=_int(doc.get("binders", 1), src, "cluster.binders", minimum=1),
        nodes_per_agent=_int(
            doc.get("nodes_per_agent", 5000), src, "cluster.nodes_per_agent", minimum=1
        ),
        service_args={k: v for k, v in args.items() if v},
        pin_shards=pin_shards,
        node_list=node_list,
    )


def _node_list(value: Any, node: dict[str, Any], nodes: int, src: str) -> str:
    """``cluster.node_list`` as an absolute path ("" without one), its rows checked."""
    if value == "":
        return ""
    if not isinstance(value, str):
        raise WorkloadError(f"{src}: cluster.node_list: must be a path (got {value!r})")
    if node:
        raise WorkloadError(
            f"{src}: cluster.node: the node list gives each node its shape: no node with it"
        )
    path = Path(value) if Path(value).is_absolute() else REPO_ROOT / value
    try:
        listed = load_node_list(path)
    except ValueError as exc:
        raise WorkloadError(f"{src}: cluster.node_list: {exc}") from None
    if nodes > len(listed):
        raise WorkloadError(
            f"{src}: cluster.nodes: the node list has {len(listed)} nodes (got {nodes})"
        )
    return str(path)


@functools.cache
def share_shapes(pod_list: str) -> tuple[TaskShape, ...]:
    """The GPU-share tasks of an openb pod list (a name of ``bench.gputrace.POD_LISTS`` or a
    path from the repository's root), in file order; TraceError if it has none."""
    path = POD_LISTS.get(pod_list) or (
        Path(pod_list) if Path(pod_list).is_absolute() else REPO_ROOT / pod_list
    )
    shapes = tuple(pod.shape for pod in load_pods(path) if pod.shape.is_share)
    if not shapes:
        raise TraceError(f"{path}: no GPU-share tasks (num_gpu 1, gpu_milli 1..999)")
    return shapes


def _phase(doc: dict[str, Any], src: str, at: str, *, measured: bool = True) -> PodPhase:
    _known(doc, _PHASE if measured else _PHASE - {"rate", "queues"}, src, at)
    count = _int(doc.get("count"), src, f"{at}.count", minimum=0 if not measured else 1)
    per_node = doc.get("per_node", False)
    if not isinstance(per_node, bool):
        raise WorkloadError(f"{src}: {at}.per_node: must be true or false")
    job_size = _int(doc.get("job_size", 1 if per_node else 100), src, f"{at}.job_size", minimum=1)
    if per_node and job_size != 1:
        raise WorkloadError(f"{src}: {at}.job_size: per_node jobs have one pod each")
    min_member = _int(doc.get("min_member", 1), src, f"{at}.min_member", minimum=1)
    if min_member > job_size:
        raise WorkloadError(f"{src}: {at}.min_member: {min_member} exceeds job_size {job_size}")
    gang = _int(doc.get("gang_percent", 0), src, f"{at}.gang_percent", minimum=0)
    if gang > 100:
        raise WorkloadError(f"{src}: {at}.gang_percent: must be within 0..100 (got {gang})")
    template = _mapping(doc.get("template"), src, f"{at}.template")
    text = json.dumps(template)
    if NODE_PLACEHOLDER in text and not per_node:
        raise WorkloadError(f"{src}: {at}.template: {NODE_PLACEHOLDER} needs per_node: true")
    job = _mapping(doc.get("job", {}), src, f"{at}.job")
    owned = sorted(set(job) & _PHASE_OWNED)
    if owned:
        raise WorkloadError(f"{src}: {at}.job.{owned[0]}: set by the phase itself")
    queues = _int(doc.get("queues", 0), src, f"{at}.queues", minimum=0)
    if queues and "queue" in job:
        raise WorkloadError(f"{src}: {at}.job.queue: set by the phase's queues")
    job_template(template, 1, 1, node="node-0", source=f"{src}: {at}", job=job)  # validates it
    gpu_shares = doc.get("gpu_shares", "")
    if not isinstance(gpu_shares, str):
        raise WorkloadError(f"{src}: {at}.gpu_shares: must be a trace name or a path")
    if gpu_shares:
        if per_node:
            raise WorkloadError(f"{src}: {at}.gpu_shares: not with per_node")
        try:
            share_shapes(gpu_shares)
        except TraceError as exc:
            raise WorkloadError(f"{src}: {at}.gpu_shares: {exc}") from None
    return PodPhase(
        count=count,
        job_size=job_size,
        template=template,
        min_member=min_member,
        gang_percent=gang,
        per_node=per_node,
        rate=_number(doc.get("rate", 0), src, f"{at}.rate", minimum=0),
        job=job,
        queues=queues,
        gpu_shares=gpu_shares,
    )


def job_template(
    template: dict[str, Any],
    replicas: int,
    min_member: int,
    *,
    node: str = "",
    source: str = "",
    job: dict[str, Any] | None = None,
) -> pb.Job:
    """A Job (unnamed) with this pod template, replicas and gang size, and the other spec
    fields of ``job``."""
    tmpl = template
    if node:
        tmpl = json.loads(json.dumps(template).replace(NODE_PLACEHOLDER, node))
    doc = {
        "apiVersion": "godel/v1",
        "kind": "Job",
        "metadata": {"name": "template"},
        "spec": {**(job or {}), "replicas": replicas, "minMember": min_member, "template": tmpl},
    }
    try:
        parsed = parse_document(doc, "")
    except ManifestError as exc:
        where = exc.field.replace("spec.template", "template", 1) if exc.field else "template"
        where = where.replace("spec.", "job.", 1)
        raise WorkloadError(f"{source}.{where}: {exc.reason}") from None
    assert isinstance(parsed.obj, pb.Job)
    return parsed.obj


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "template":
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _mapping(value: Any, src: str, at: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        what = f"{at}: " if at else ""
        raise WorkloadError(f"{src}: {what}must be a mapping (got {type(value).__name__})")
    return value


def _known(doc: dict[str, Any], allowed: set[str], src: str, at: str) -> None:
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        where = f"{at}." if at else ""
        raise WorkloadError(
            f"{src}: {where}{unknown[0]}: unknown field (expected one of {', '.join(sorted(allowed))})"
        )


def _int(value: Any, src: str, at: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(f"{src}: {at}: must be an integer (got {value!r})")
    if value < minimum:
        raise WorkloadError(f"{src}: {at}: must be at least {minimum} (got {value})")
    return value


def _number(value: Any, src: str, at: str, *, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WorkloadError(f"{src}: {at}: must be a number (got {value!r})")
    if value < minimum:
        raise WorkloadError(f"{src}: {at}: must be at least {minimum:g} (got {value})")
    return float(value)


def _flag(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
