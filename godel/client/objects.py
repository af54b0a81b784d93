"""What SDK users hold: objects in the shape of their manifests, never protobuf messages.

An ``Object`` wraps the manifest dict that ``godel get -o yaml`` prints (``apiVersion``,
``kind``, ``metadata``, ``spec``, ``status``; field names as the CLI prints them) and adds typed
accessors for what programs look at most (``phase``, ``node``). ``Job`` is also what one
submits: built from a manifest dict, a YAML string or the ``job(...)`` helper, and checked by
the same converter as ``godel apply`` (godel.manifest), so a mistake is reported before any call
with the field it is in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
import yaml
from google.protobuf.message import Message

from godel.client._transport import Invalid, Violation
from godel.manifest import (
    API_VERSION,
    ManifestError,
    enum_word,
    load,
    parse_document,
    to_manifest,
)
from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from store.kinds import unwrap

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
# Jobs pass through these in order; waiting for one is satisfied by any later one (a short job
# may go from Pending to Succeeded between two events; only gangs are ever PreScheduling).
# Failed, Unschedulable and Timeout (a gang not scheduled in time) stand apart.
JOB_PROGRESS = ("Pending", "PreScheduling", "Scheduled", "Running", "Succeeded")
POD_PROGRESS = ("Pending", "Bound", "Running", "Succeeded")


def invalid_manifest(exc: ManifestError) -> Invalid:
    """A manifest the converter refused, as the SDK reports any refused request."""
    return Invalid(grpc.StatusCode.INVALID_ARGUMENT, str(exc), [Violation(exc.field, exc.reason)])


def _phase(value: str | None) -> str:
    """The phase a manifest holds (``Running``), ``Pending`` when unset."""
    return value or "Pending"


@dataclass(frozen=True)
class Object:
    """Any stored object, as its manifest. ``manifest`` is a plain dict: print it, dump it as
    YAML (``to_yaml()``), or read fields from it."""

    manifest: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.manifest.get("kind", ""))

    @property
    def name(self) -> str:
        return str(self.manifest.get("metadata", {}).get("name", ""))

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.manifest.get("metadata", {}).get("labels", {}))

    @property
    def resource_version(self) -> int:
        return int(self.manifest.get("metadata", {}).get("resourceVersion", 0))

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self.manifest.get("spec", {}))

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.manifest.get("status", {}))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.manifest, sort_keys=False)

    def __hash__(self) -> int:
        # The manifest is a dict (unhashable); an object's identity at a version is enough.
        return hash((self.kind, self.name, self.resource_version))

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


class Job(Object):
    """A job: what one submits, and what the cluster reports of it."""

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any] | str | bytes) -> Job:
        """A job from a manifest dict or a YAML text (str, or UTF-8 bytes) holding one Job
        document; raises Invalid naming the field of any mistake."""
        try:
            if isinstance(manifest, str | bytes):
                docs = load(manifest, "<manifest>")
                if len(docs) != 1 or docs[0].kind != "Job":
                    raise ManifestError("expected exactly one Job document", source="<manifest>")
                obj = docs[0].obj
            else:
                parsed = parse_document(manifest, "<manifest>")
                if parsed.kind != "Job":
                    raise ManifestError(f"is {parsed.kind!r}, not 'Job'", "kind", "<manifest>")
                obj = parsed.obj
        except ManifestError as exc:
            raise invalid_manifest(exc) from None
        return cls(to_manifest("Job", obj))

    @property
    def phase(self) -> str:
        """Pending, PreScheduling (a gang being scheduled), Scheduled, Running, Succeeded,
        Failed, Timeout (a gang not scheduled within its scheduleTimeoutSeconds: see
        ``AsyncJobHandle.retry``) or Unschedulable."""
        return _phase(self.status.get("phase"))

    def to_proto(self) -> pb.Job:
        """The job as the API takes it (what the system set, status above all, left out)."""
        doc = {k: v for k, v in self.manifest.items() if k != "status"}
        meta = {
            k: v
            for k, v in doc.get("metadata", {}).items()
            if k not in ("uid", "resourceVersion", "creationTimestampMs")
        }
        parsed = parse_document({**doc, "metadata": meta}, self.name)
        assert isinstance(parsed.obj, pb.Job)
        return parsed.obj


class Pod(Object):
    @property
    def phase(self) -> str:
        """Pending, Bound, Running, Succeeded or Failed."""
        return _phase(self.status.get("phase"))

    @property
    def node(self) -> str:
        """The node it is bound to ("" while pending)."""
        return str(self.spec.get("nodeName", ""))

    @property
    def job(self) -> str:
        return str(self.spec.get("job", ""))


class PriorityClass(Object):
    """A priority class (Kubernetes' PriorityClass): what a job naming it
    (``spec.priorityClassName``, ``job(..., priority_class_name=)``) is admitted with. Its
    fields sit beside ``metadata``, as Kubernetes writes them; build one with
    ``priority_class(...)`` or from a manifest."""

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any] | str | bytes) -> PriorityClass:
        """A class from a manifest dict or a YAML text holding one PriorityClass document;
        raises Invalid naming the field of any mistake."""
        try:
            if isinstance(manifest, str | bytes):
                docs = load(manifest, "<manifest>")
                if len(docs) != 1 or docs[0].kind != "PriorityClass":
                    raise ManifestError(
                        "expected exactly one PriorityClass document", source="<manifest>"
                    )
                obj = docs[0].obj
            else:
                parsed = parse_document(manifest, "<manifest>")
                if parsed.kind != "PriorityClass":
                    raise ManifestError(
                        f"is {parsed.kind!r}, not 'PriorityClass'", "kind", "<manifest>"
                    )
                obj = parsed.obj
        except ManifestError as exc:
            raise invalid_manifest(exc) from None
        return cls(to_manifest("PriorityClass", obj))

    @property
    def value(self) -> int:
        return int(self.manifest.get("value", 0))

    @property
    def global_default(self) -> bool:
        return bool(self.manifest.get("globalDefault", False))

    @property
    def description(self) -> str:
        return str(self.manifest.get("description", ""))

    @property
    def preemption_policy(self) -> str:
        """PreemptLowerPriority (also when unset) or Never."""
        return str(self.manifest.get("preemptionPolicy") or "PreemptLowerPriority")

    @property
    def preemptible(self) -> bool | None:
        """Whether its pods may be preempted when their job does not say; None: their queue's
        ``preemptibleDefault`` decides."""
        value = self.manifest.get("preemptible")
        return None if value is None else bool(value)


class Reservation(Object):
    """Room held on a node for an owner's pods until one of them binds there, its TTL runs out,
    its owner job is deleted or its node is lost."""

    @property
    def phase(self) -> str:
        """Reserved (holding room on ``node``) or Pending (waiting for a node)."""
        return _phase(self.status.get("phase"))

    @property
    def node(self) -> str:
        """Where the room is held ("" while pending)."""
        return str(self.status.get("node", "") or self.spec.get("node", ""))

    @property
    def owner(self) -> dict[str, Any]:
        """``{"job": ..., "index": ...}`` or ``{"selector": ...}``."""
        return dict(self.spec.get("owner", {}))

    def to_proto(self) -> pb.Reservation:
        """The reservation as the API takes it (what the system set left out)."""
        doc = {k: v for k, v in self.manifest.items() if k != "status"}
        try:
            parsed = parse_document(doc, self.name)
        except ManifestError as exc:
            raise invalid_manifest(exc) from None
        assert isinstance(parsed.obj, pb.Reservation)
        return parsed.obj


_CLASSES: dict[str, type[Object]] = {
    "Job": Job,
    "Pod": Pod,
    "PriorityClass": PriorityClass,
    "Reservation": Reservation,
}


def from_proto(kind: str, obj: Message) -> Object:
    """The SDK object of a stored protobuf object."""
    cls = _CLASSES.get(kind)
    if cls is None:
        # Nodes, queues, budgets, ...: the manifest with its kind, no extra accessors.
        return Object(to_manifest(kind, obj))
    return cls(to_manifest(kind, obj))


def object_from_wire(wrapped: api_pb2.Object) -> Object:
    """The SDK object of an api.Object off the wire."""
    return from_proto(*unwrap(wrapped))


@dataclass(frozen=True)
class Event:
    """One change seen by a watch: ``object`` after it (for DELETED, its last state)."""

    type: EventType
    object: Object
    revision: int


@dataclass(frozen=True)
class Explanation:
    """Why a pod is where it is: bound to ``node``, or pending for ``summary``'s reasons
    (``reasons`` counts the nodes that failed each check; ``preemption_reasons`` the nodes
    where preemption could not help, per reason, as `godel explain` words them from
    ``placement.preemption_blockers``), or preempting ``victims`` on ``nominated_node`` while
    the Binder has its decision."""

    pod: str
    phase: str
    node: str
    summary: str
    total_nodes: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    scheduler: str = ""
    nominated_node: str = ""
    victims: list[str] = field(default_factory=list)
    preemption_reasons: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, response: api_pb2.ExplainResponse) -> Explanation:
        return cls(
            pod=response.pod,
            phase=_phase(
                enum_word(pb.PodPhase.DESCRIPTOR, response.phase) if response.phase else ""
            ),
            node=response.node,
            summary=response.summary,
            total_nodes=response.total_nodes,
            reasons={r.reason: r.nodes for r in response.reasons},
            scheduler=response.scheduler,
            nominated_node=response.nominated_node,
            victims=list(response.victims),
            preemption_reasons={r.reason: r.nodes for r in response.diagnosis.preemption_reasons},
        )


def job(
    name: str,
    *,
    replicas: int = 1,
    min_member: int | None = None,
    cpu: str | int | float = "100m",
    memory: str | int = "128Mi",
    gpus: int = 0,
    gpu_milli: int = 0,
    gpu_models: list[str] | None = None,
    queue: str = "",
    priority: int = 0,
    qos: str = "",
    labels: dict[str, str] | None = None,
    pod_labels: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
    duration_ms: int = 0,
    preemptible: bool | None = None,
    replace_lost_pods: bool = False,
    schedule_timeout_seconds: int | None = None,
    priority_class_name: str = "",
    keep_room_seconds: int | None = None,
) -> Job:
    """A job from keywords: ``replicas`` pods with these requests, placed all together when
    ``min_member`` (default: ``replicas``, a gang) of them fit. Quantities are written as in a
    manifest (``cpu="500m"``, ``memory="4Gi"``); ``gpus`` whole cards, or with ``gpus=1`` a
    share ``gpu_milli`` (1..999) of one, of ``gpu_models`` (default: any). ``command`` runs on
    process-mode nodes; ``duration_ms`` is how long a pod runs on a hollow node (0: until
    deleted). ``schedule_timeout_seconds``: how long a gang may wait to be scheduled before it
    is Timeout (default 300). ``priority_class_name`` names a PriorityClass, which gives the
    job its priority. ``keep_room_seconds``: a pod drained or evicted from a live node keeps its
    room there for its replacement this long (``spec.reservation.ttlSeconds``)."""
    template: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        template["requests"]["gpus"] = gpus
    optional: dict[str, Any] = {
        "labels": pod_labels,
        "nodeSelector": node_selector,
        "command": command,
        "env": env,
        "durationMs": duration_ms,
        "gpuMilli": gpu_milli,
        "gpuModels": gpu_models,
    }
    template.update((k, v) for k, v in optional.items() if v)
    spec: dict[str, Any] = {
        "replicas": replicas,
        "minMember": replicas if min_member is None else min_member,
        "template": template,
    }
    optional = {
        "queue": queue,
        "priority": priority,
        "qos": qos,
        "replaceLostPods": replace_lost_pods,
        "priorityClassName": priority_class_name,
    }
    spec.update((k, v) for k, v in optional.items() if v)
    if preemptible is not None:
        spec["preemptible"] = preemptible
    if schedule_timeout_seconds is not None:
        spec["scheduleTimeoutSeconds"] = schedule_timeout_seconds
    if keep_room_seconds is not None:
        spec["reservation"] = {"ttlSeconds": keep_room_seconds}
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    return Job.from_manifest(
        {"apiVersion": API_VERSION, "kind": "Job", "metadata": metadata, "spec": spec}
    )


def priority_class(
    name: str,
    value: int,
    *,
    global_default: bool = False,
    description: str = "",
    preemption_policy: str = "",
    preemptible: bool | None = None,
) -> PriorityClass:
    """A priority class from keywords: jobs naming it get priority ``value``; ``global_default``
    makes it the class of jobs that name none and give no priority; ``preemption_policy``
    (``"Never"`` or ``"PreemptLowerPriority"``) and ``preemptible`` apply to the jobs that do
    not say theirs (``preemptible`` None: their queue's default)."""
    manifest: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }
    optional: dict[str, Any] = {
        "globalDefault": global_default,
        "description": description,
        "preemptionPolicy": preemption_policy,
    }
    manifest.update((k, v) for k, v in optional.items() if v)
    if preemptible is not None:
        manifest["preemptible"] = preemptible
    return PriorityClass.from_manifest(manifest)


def reservation(
    name: str,
    *,
    ttl_seconds: int,
    node: str = "",
    job: str = "",
    index: int | None = None,
    selector: str = "",
    cpu: str | int | float = "100m",
    memory: str | int = "128Mi",
    gpus: int = 0,
    qos: str = "",
    labels: dict[str, str] | None = None,
) -> Reservation:
    """A reservation from keywords: room of these requests on ``node`` (empty: wherever the
    shards place it, like a pod) for the pods of ``job`` (only pod ``index`` of it, when given)
    or those ``selector`` picks, for ``ttl_seconds``.
    Quantities as in a manifest; mistakes are Invalid naming the field, before any call."""
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpus:
        requests["gpus"] = gpus
    owner: dict[str, Any] = {"selector": selector} if selector else {"job": job}
    if index is not None:
        owner["index"] = index
    spec: dict[str, Any] = {
        "template": {"requests": requests},
        "owner": owner,
        "ttlSeconds": ttl_seconds,
    }
    if node:
        spec["node"] = node
    if qos:
        spec["qos"] = qos
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    doc = {"apiVersion": API_VERSION, "kind": "Reservation", "metadata": metadata, "spec": spec}
    try:
        parsed = parse_document(doc, "<reservation>")
    except ManifestError as exc:
        raise invalid_manifest(exc) from None
    return Reservation(to_manifest("Reservation", parsed.obj))
