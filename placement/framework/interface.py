"""The plugin API: Status, the per-pod view plugins read (PodInfo), and the extension points.

Filter and Score are plain synchronous functions over a PodInfo and a NodeInfo (ints, strings and
tuples): they run once per candidate node per pod, so nothing here touches protobuf in the loop.
A Filter returns ``None`` for success (cheap and Go-faithful) or a :class:`Status` saying why not.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping, Set
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Protocol, runtime_checkable

from placement.gpufrag import Policy
from placement.labelselector import (
    PodTerm,
    Requirement,
    Selector,
    pod_term,
    requirement,
    selector,
)
from placement.nodeinfo import NodeInfo, PodRequest, RequestPart, request_part
from placement.topology import PodCounts
from protos.godel.v1 import objects_pb2 as pb

MAX_NODE_SCORE = 100


class Code(enum.IntEnum):
    """In kube-scheduler's order. Unresolvable means preemption cannot help either."""

    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3


@dataclass(frozen=True, slots=True)
class Status:
    code: Code
    reasons: tuple[str, ...] = ()
    plugin: str = ""

    @classmethod
    def unschedulable(cls, *reasons: str, plugin: str = "") -> Status:
        return cls(Code.UNSCHEDULABLE, reasons, plugin)

    @classmethod
    def unresolvable(cls, *reasons: str, plugin: str = "") -> Status:
        return cls(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reasons, plugin)

    @classmethod
    def error(cls, reason: str, plugin: str = "") -> Status:
        return cls(Code.ERROR, (reason,), plugin)


# ---------------------------------------------------------------------------------------------
# The pod as plugins see it: converted from protobuf once per template, then read per node.
# ---------------------------------------------------------------------------------------------

# Label selector operators and requirements live in placement.labelselector (NodeInfo's pod
# records need them too); re-exported here for the plugins.
Term = tuple[Requirement, ...]  # AND of requirements


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    exists: bool  # operator Exists (else Equal)
    value: str
    effect: int  # 0 matches every effect


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """Kubernetes' TopologySpreadConstraint as plain values."""

    max_skew: int
    topology_key: str
    hard: bool  # DoNotSchedule (a filter); else ScheduleAnyway (a score)
    selector: Selector


@dataclass(slots=True)
class PodInfo:
    """What the plugins need from a pod, in plain Python."""

    name: str
    job: str
    resource_version: int
    req: PodRequest
    template_key: bytes = b""
    node_selector: tuple[tuple[str, str], ...] = ()
    required_terms: tuple[Term, ...] = ()  # OR of terms; empty: no constraint
    preferred_terms: tuple[tuple[int, Term], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    # Its job's preemptionPolicy: whether it may evict lower-priority pods when it does not fit
    # is placement.preemption's rule (``preemptor_refusal``), read there only.
    preemption_policy: int = pb.PREEMPTION_POLICY_UNSPECIFIED
    # Inter-pod affinity and topology spread (placement.plugins.interpodaffinity,
    # podtopologyspread). The required anti-affinity terms are ``req.anti_terms``.
    labels: Mapping[str, str] = field(default_factory=dict)
    pod_affinity: tuple[PodTerm, ...] = ()
    # Preferred pod affinity (weight > 0) and anti-affinity (weight < 0) terms.
    preferred_pod_terms: tuple[tuple[int, PodTerm], ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    # The pod has pod affinity, anti-affinity or spread constraints of its own.
    has_topology: bool = False
    # Per attempt: what the topology plugins prepared from the current counts, by plugin name
    # (Framework.prepare). None: no topology rule concerns this pod now, so it takes the plain
    # path (node filters only, the feasible-node cache).
    topology: dict[str, object] | None = None
    # The reservations' holds this pod may take (placement.reservations), hold name -> node:
    # its filters judge those nodes without the one hold it would take there. Empty for nearly
    # every pod; a pod with holds has its own template key (``reservations.own``).
    reservations: Mapping[str, str] = field(default_factory=dict)

    def renamed(self, name: str, template_key: bytes) -> PodInfo:
        """The same pod under another name (a replacement's, in a simulation), not yet stored."""
        copy = object.__new__(PodInfo)
        for slot in PodInfo.__slots__:
            setattr(copy, slot, getattr(self, slot))
        copy.name = name
        # A replacement holds no NUMA nodes or GPU cards until it is placed (the original's
        # stay behind).
        copy.req = self.req.renamed(name)
        if copy.req.numa_nodes:
            copy.req = copy.req.pinned(())
        if copy.req.gpu_cards:
            copy.req = copy.req.with_cards(())
        copy.template_key = template_key
        copy.resource_version = 0
        copy.topology = None
        return copy

    @classmethod
    def from_pod(cls, pod: pb.Pod, *, keyed: bool = True) -> PodInfo:
        """``keyed=False`` leaves the template key (a serialisation of the template, which
        only the feasible-node cache needs) off the result; the part of the pod its template
        and QoS decide is read once per distinct template either way (``TemplateView``, kept
        by ``template_view``): a shard and the Binder build one per pod they judge, and a
        job's pods, or a stream of one-pod jobs of one shape, share it."""
        key = template_key(pod)
        view = _VIEWS.get(key)
        if view is None:
            view = _template_view(key, pod.spec.template, pod.spec.qos)
        meta, spec = pod.metadata, pod.spec
        name = meta.name
        req = PodRequest.from_parts(meta, spec, name, view.part)
        # Every field set here, in slot order (``_POD_INFO_SLOTS``): the dataclass's keyword
        # __init__ with its defaults cost as much as reading the rest of the pod.
        info = _new_pod_info(PodInfo)
        info.name = name
        info.job = spec.job
        info.resource_version = meta.resource_version
        info.req = req
        info.template_key = key if keyed else b""
        info.node_selector = view.node_selector
        info.required_terms = view.required_terms
        info.preferred_terms = view.preferred_terms
        info.tolerations = view.tolerations
        info.priority = spec.priority
        info.preemption_policy = spec.preemption_policy
        info.labels = req.labels
        info.pod_affinity = view.pod_affinity
        info.preferred_pod_terms = view.preferred_pod_terms
        info.spread = view.spread
        info.has_topology = view.has_topology
        info.topology = None
        info.reservations = _NO_RESERVATIONS
        return info


@dataclass(frozen=True, slots=True)
class TemplateView:
    """What a ``PodInfo`` takes from its pod's template and QoS alone (``template_view``):
    equal for every pod whose template serialises to the same bytes with the same QoS, so
    read once for all of them. Immutable values only (tuples, frozen records): the pods'
    ``PodInfo``s share them."""

    part: RequestPart
    node_selector: tuple[tuple[str, str], ...]
    required_terms: tuple[Term, ...]
    preferred_terms: tuple[tuple[int, Term], ...]
    tolerations: tuple[Toleration, ...]
    pod_affinity: tuple[PodTerm, ...]
    preferred_pod_terms: tuple[tuple[int, PodTerm], ...]
    spread: tuple[SpreadConstraint, ...]
    # Pod affinity, anti-affinity or spread constraints: all of them the template's.
    has_topology: bool


def read_template_view(tpl: pb.PodTemplate, qos: int) -> TemplateView:
    """The one reading of a template's ``TemplateView`` (``template_view`` keeps them)."""
    part = request_part(tpl, qos)
    has_affinity = tpl.HasField("affinity")
    node_aff = tpl.affinity.node_affinity if has_affinity else _NO_NODE_AFFINITY
    pod_affinity: tuple[PodTerm, ...] = ()
    preferred: tuple[tuple[int, PodTerm], ...] = ()
    if has_affinity and (
        tpl.affinity.HasField("pod_affinity") or tpl.affinity.HasField("pod_anti_affinity")
    ):
        affinity = tpl.affinity
        pod_affinity = tuple(pod_term(t) for t in affinity.pod_affinity.required)
        preferred = tuple(
            (w.weight, pod_term(w.term)) for w in affinity.pod_affinity.preferred
        ) + tuple((-w.weight, pod_term(w.term)) for w in affinity.pod_anti_affinity.preferred)
    spread = tuple(
        SpreadConstraint(
            c.max_skew,
            c.topology_key,
            c.when_unsatisfiable != pb.TopologySpreadConstraint.SCHEDULE_ANYWAY,
            selector(c.label_selector),
        )
        for c in tpl.topology_spread_constraints
    )
    return TemplateView(
        part=part,
        node_selector=tuple(sorted(tpl.node_selector.items())),
        required_terms=tuple(_term(t) for t in node_aff.required),
        preferred_terms=tuple((p.weight, _term(p.preference)) for p in node_aff.preferred),
        tolerations=tuple(
            Toleration(t.key, t.operator == pb.Toleration.EXISTS, t.value, int(t.effect))
            for t in tpl.tolerations
        ),
        pod_affinity=pod_affinity,
        preferred_pod_terms=preferred,
        spread=spread,
        has_topology=bool(pod_affinity or preferred or spread or part.anti_terms),
    )


# Each distinct template's view, by its template key (the QoS and the template's deterministic
# bytes: everything the view is read from). At most ``_VIEWS_LIMIT`` kept; past that the cache
# starts over (pods that each carry a template of their own gain nothing here, and must not
# make it grow without end).
_VIEWS: dict[bytes, TemplateView] = {}
_VIEWS_LIMIT = 4096


def _template_view(key: bytes, tpl: pb.PodTemplate, qos: int) -> TemplateView:
    if len(_VIEWS) >= _VIEWS_LIMIT:
        _VIEWS.clear()
    view = _VIEWS[key] = read_template_view(tpl, qos)
    return view


_new_pod_info = object.__new__
_NO_RESERVATIONS: Mapping[str, str] = MappingProxyType({})
assert PodInfo.__slots__ == (
    "name",
    "job",
    "resource_version",
    "req",
    "template_key",
    "node_selector",
    "required_terms",
    "preferred_terms",
    "tolerations",
    "priority",
    "preemption_policy",
    "labels",
    "pod_affinity",
    "preferred_pod_terms",
    "spread",
    "has_topology",
    "topology",
    "reservations",
), "PodInfo's fields moved: from_pod sets each of them"


_NO_NODE_AFFINITY = pb.NodeAffinity()


def template_key(pod: pb.Pod) -> bytes:
    """Pods with equal keys get equal filter and score results on equal nodes."""
    return bytes([pod.spec.qos]) + pod.spec.template.SerializeToString(deterministic=True)


def _term(term: pb.NodeSelectorTerm) -> Term:
    return tuple(_requirement(r) for r in term.match_expressions)


def _requirement(r: pb.LabelSelectorRequirement) -> Requirement:
    return requirement(r)


@dataclass(frozen=True, slots=True)
class JobAffinity:
    """A job's JobAffinity (objects.proto) as plain values: the node label keys whose domains
    hold the whole gang (required) and the finer ones tried first (preferred, coarse to fine)."""

    required: tuple[str, ...] = ()
    preferred: tuple[str, ...] = ()

    @classmethod
    def from_job(cls, job: pb.Job) -> JobAffinity | None:
        if not job.spec.HasField("job_affinity"):
            return None
        a = job.spec.job_affinity
        if not a.required_topology_keys and not a.preferred_topology_keys:
            return None
        return cls(tuple(a.required_topology_keys), tuple(a.preferred_topology_keys))


@dataclass(slots=True)
class UnitInfo:
    """A scheduling unit as the unit-level hooks see it."""

    job: str
    min_member: int
    already_bound: int
    priority: int
    pods: list[PodInfo] = field(default_factory=list)
    # Recommended nodes the unit's pods try first, in order, each entry used by one pod at most
    # (a node appears once per pod it should take): (node, tag). The tag — the Movement that
    # recommended the node — travels with the placement. A preference, not a filter: a pod no
    # recommended node fits is placed as usual.
    preferred: list[tuple[str, str]] = field(default_factory=list)
    # Job-level affinity (placement.plugins.joblevelaffinity), and the nodes of the job's pods
    # already placed (bound or in flight), whose domain the rest must join.
    affinity: JobAffinity | None = None
    placed_nodes: tuple[str, ...] = ()
    # Pods of one-pod jobs searched together (the shard batches them so a stream of one-pod
    # jobs does not pay the search's set-up per pod): each pod is placed or not on its own,
    # nothing is undone when another does not fit, and each keeps its own reason.
    independent: bool = False

    @property
    def needed(self) -> int:
        """Placements this attempt must make for the unit to succeed (min-member decision)."""
        return max(self.min_member - self.already_bound, 1 if self.pods else 0)


# ---------------------------------------------------------------------------------------------
# Extension points
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class Plugin(Protocol):
    NAME: ClassVar[str]


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    def filter(self, pod: PodInfo, node: NodeInfo) -> Status | None:
        """None if ``pod`` may run on ``node``; otherwise why not (short lowercase reasons)."""
        ...


class NodeLabels(Protocol):
    """The nodes carrying each label, kept up to date by the shard's cache."""

    def nodes_with(self, key: str, value: str) -> Set[str]: ...


@dataclass(frozen=True, slots=True)
class Candidates:
    """A PreFilter's answer: only ``nodes`` can pass the plugin's filter; every other node would
    fail it with ``reason``."""

    nodes: Set[str]
    reason: str


@runtime_checkable
class PreFilter(Protocol):
    """Optional for Filter plugins (kube-scheduler's PreFilterResult): name the only nodes that can
    pass, from the label index, so a pod pinned to a few nodes is not filtered against all of
    them. None: no narrowing. The filter still runs on every candidate."""

    def pre_filter(self, pod: PodInfo, labels: NodeLabels) -> Candidates | None: ...


@runtime_checkable
class TopologyPlugin(Plugin, Protocol):
    """A Filter or Score plugin that reads the topology index (inter-pod affinity, spread). Once
    per scheduling attempt of a pod, before its filters and scores, ``prepare`` reads what the pod
    needs from the counts; its filter and score read that state (``pod.topology[NAME]``), so the
    per-node work is a few dict lookups. None: nothing to check for this pod. A pod no topology
    plugin prepared for never runs them (and keeps the feasible-node cache)."""

    def prepare(self, pod: PodInfo, counts: PodCounts) -> object | None: ...

    def shape(self, state: object) -> tuple[frozenset[str], Hashable]:
        """What a node's result for the prepared ``state`` depends on besides the node itself:
        the topology keys whose domain counts it reads (a pod added to or removed from a node
        changes only that node's domains), and the values that hold for every node (a spread's
        minimum). The search's feasible-node cache re-checks a cached node only when one of its
        domains changed, and every cached node when this global part did."""
        ...


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    def score(self, pod: PodInfo, node: NodeInfo) -> int:
        """A raw score; 0..100 unless the plugin also normalizes, or its order must decide
        alone (GpuFragmentation's fgd-balance: minus its growth, at a scale where the 0..100
        scores only break its ties)."""
        ...


@runtime_checkable
class SharePolicySource(Protocol):
    """Optional for Score plugins: the policy a share's GPU card is chosen by on the node the
    search picks (``placement.gpu.choose_cards``), so the card the shard proposes is the one
    the score assumed. None: the default (best fit)."""

    def share_policy(self) -> Policy | None: ...


@runtime_checkable
class LearningScore(Protocol):
    """Optional for Score plugins whose answers for an unchanged node move as they learn from
    the pods they see (GpuFragmentation's shape mix). ``observe`` sees each pod once per
    attempt, before the search picks or scores its candidates; ``score_generation`` changes
    whenever an unchanged node's score may have changed since, so the search's feasible-node
    cache (scores kept across pods) scans afresh rather than compare scores of two
    generations: a node left untouched would keep the score of a mix long gone."""

    def observe(self, pod: PodInfo) -> None: ...

    def score_generation(self) -> int: ...


@runtime_checkable
class NormalizeScore(Protocol):
    """Optional for Score plugins: rescale raw scores of all candidate nodes to 0..100.

    A normalizing plugin must score from node properties that the unit's own placements do not
    change (labels, taints): the feasible-node cache re-scores a chosen node without re-running
    the normalization."""

    def normalize_scores(self, pod: PodInfo, scores: list[int]) -> None: ...


@dataclass(slots=True)
class NodeGroups:
    """The node groups a unit tries in order, each on its own (the whole unit in one group).
    ``reason`` says why the unit is confined to them; the search leads a failure with it."""

    groups: list[list[NodeInfo]]
    reason: str = ""


@runtime_checkable
class LocatingPlugin(Plugin, Protocol):
    """Unit level: narrow the nodes a unit may use. None: no opinion on this unit (all)."""

    def locate(self, unit: UnitInfo, nodes: list[NodeInfo]) -> list[NodeInfo] | None: ...


@runtime_checkable
class GroupingPlugin(Plugin, Protocol):
    """Unit level: split located nodes into groups tried in order. None: no opinion on this
    unit (one group of them all, the search's own scan order)."""

    def group(self, unit: UnitInfo, nodes: list[NodeInfo]) -> NodeGroups | None: ...
