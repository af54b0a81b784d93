"""Unit scheduling against a snapshot: the min-member decision over the pod-level cycle
(filter -> score -> select), with Gödel's feasible-node search.

Gödel mode (default): per pod template, a feasible-node cache. The first pod of a template scans
nodes from a rotating offset, own partition first (the others only when it has no feasible
node), until it has found ``len(unit pods) + scan_extra`` feasible nodes; they are scored once
and kept in a heap (without the cache, every pod scans for ``scan_extra`` nodes more than its
gang needs). Later pods of the same template take the best cached node; after each assume only
the chosen node is re-checked (and re-scored), since no other node changed. The cache outlives
the unit: the next unit of the same template (a stream of one-pod jobs) takes it over,
re-checking and re-scoring only the cached nodes changed since (``Snapshot.changed_since``),
for as many pods as its scan found nodes; then the template scans afresh from the rotating
offset, so the stream spreads as the scores want instead of piling onto the first nodes found.
Pods a topology rule concerns (inter-pod affinity, spread) keep a cache of their own, re-checked
before each pod only where the counts moved (``_Template.refresh``: the changed nodes, the candidates
sharing a domain with them, all of them when a global value such as a spread's minimum moved).
A template that found no node is remembered across units (``_NoFit``): the next unit of the same template scans only the nodes that changed since
(``Snapshot.changed_since``), so a stream of one-pod jobs waiting on a full cluster (a
preemption storm) does not scan every node per pod. Kube mode, for comparison: no cache, every
pod scans until it has ``num_feasible_nodes_to_find(n)`` feasible nodes (kube-scheduler's
adaptive percentageOfNodesToScore) and scores them.

Select: the best score in the template's heap; among equal scores the profile's ``tieBreak``
decides (``first``: the scan order from the rotating offset; ``random``: a draw made as each
candidate enters the heap, so uniformly among the top scores as kube-scheduler's selectHost).

PostFilter (both modes): a pod no node fits, for reasons preemption can resolve, asks
``placement.postfilter.Preemption`` for a node and victims; it is assumed there with its victims
taken off the snapshot, so the unit's later pods see both. A gang preempts as a unit: if fewer
than ``needed`` pods are placed, every placement is undone and every victim put back.

Everything here is synchronous; the caller updates the snapshot before a cycle. ``steps`` is the
same search as a generator that yields after every pod, so a service can let its event loop run
(streams, heartbeats, signals) while a large unit is placed: the snapshot is the cycle's own.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
import random
import time
from collections.abc import Callable, Generator, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from placement.framework import Code, Framework, NodeLabels, PodInfo, UnitInfo
from placement.framework.profile import TIE_BREAK_RANDOM
from placement.gpu import pin_cards
from placement.gpufrag import Policy
from placement.nodeinfo import NodeInfo, PodRequest
from placement.plugins.numatopology import pin_numa
from placement.postfilter import Preempted, Preemption, take, undo
from placement.preemption import preemptor_refusal
from placement.preemption_blockers import NEVER_SENTENCE
from placement.reservations import hold_for
from placement.scan import partition_first, rotated
from placement.snapshot import Snapshot
from protos.godel.v1 import objects_pb2 as pb

Mode = Literal["godel", "kube"]
# Templates remembered as fitting nowhere (a memory bound; forgetting one only costs a scan).
_MAX_NO_FIT = 10_000
# Feasible-node caches kept between units (the most recently used; forgetting one costs a scan).
_MAX_KEPT = 1_000
# Heap entries' sequence numbers: an entry's tie-break among equal scores after the profile's
# draw (first pushed first) and its identity (``_Template.live``: an entry pushed again
# supersedes the older one).
_SEQUENCE = itertools.count(1)
# Random tie-break draws: wide enough that two equal draws among one template's candidates are
# rare (the sequence number decides them, which stays uniform enough).
_TIE_BITS = 62


def _scan_order() -> int:
    """The ``first`` tie-break's draw: every entry the same, so the sequence number (the scan
    order from the rotating offset) decides."""
    return 0


def tie_breaker(profile_tie_break: str, seed: int | None) -> Callable[[], int]:
    """The draw each heap entry is pushed with, under its score: ``first`` (0: scan order) or
    ``random`` (kube-scheduler's selectHost: uniformly among the top scores; ``seed`` None
    draws from the OS's entropy)."""
    if profile_tie_break == TIE_BREAK_RANDOM:
        rng = random.Random(seed)
        return functools.partial(rng.getrandbits, _TIE_BITS)
    return _scan_order


@dataclass(frozen=True)
class SearchConfig:
    mode: Mode = "godel"
    feasible_cache: bool = True
    scan_extra: int = 50
    # Kube mode: 0 = adaptive max(5, 50 - nodes/125)%, else this percentage; at least min_nodes.
    percentage_of_nodes_to_score: int = 0
    min_feasible_nodes: int = 100


def num_feasible_nodes_to_find(n: int, percentage: int = 0, min_nodes: int = 100) -> int:
    """kube-scheduler's numFeasibleNodesToFind."""
    if n < min_nodes or percentage >= 100:
        return n
    if percentage <= 0:
        percentage = max(5, 50 - n // 125)
    return min(n, max(n * percentage // 100, min_nodes))


@dataclass(slots=True)
class Placement:
    pod: str
    resource_version: int
    node: str
    victims: list[str] = field(default_factory=list)  # pods to evict first (preemption)
    # The tag of the recommendation the pod used (UnitInfo.preferred), if any.
    recommendation: str = ""
    # The NUMA nodes a NUMA-bound pod would hold there (the Binder verifies them).
    numa_nodes: tuple[int, ...] = ()
    # The GPU cards a pod asking GPUs would hold there (placement.gpu; the Binder verifies them).
    gpu_cards: tuple[int, ...] = ()
    # The reservation's hold it takes there (placement.reservations), if any: the shard's cache
    # takes it off the node while the pod is assumed, as the Binder's commit will consume it.
    hold: str = ""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why a pod was placed nowhere, as data: the nodes considered and, per reason, how many
    failed (most first); for a gang short of min_member, how many pods it needs and how many
    fit; what preemption found. The shard stores it on the pod; `godel explain` renders it."""

    total_nodes: int
    reasons: tuple[tuple[str, int], ...] = ()
    gang_needed: int = 0
    gang_placed: int = 0
    note: str = ""
    # Why preemption could not help (placement.preemption_blockers): nodes per reason, the
    # soonest protection end, the pod's own preemptionPolicy Never, and its priority.
    preemption_reasons: tuple[tuple[str, int], ...] = ()
    protection_ends_ms: int = 0
    preemption_never: bool = False
    priority: int = 0

    def to_proto(self) -> pb.SchedulingDiagnosis:
        return pb.SchedulingDiagnosis(
            total_nodes=self.total_nodes,
            reasons=[pb.ReasonCount(reason=r, nodes=n) for r, n in self.reasons],
            gang_needed=self.gang_needed,
            gang_placed=self.gang_placed,
            note=self.note,
            preemption_reasons=[
                pb.ReasonCount(reason=r, nodes=n) for r, n in self.preemption_reasons
            ],
            protection_ends_ms=self.protection_ends_ms,
            preemption_never=self.preemption_never,
            priority=self.priority,
        )


def diagnose(total: int, diag: dict[str, int]) -> Diagnosis:
    return Diagnosis(total, tuple(sorted(diag.items(), key=lambda kv: (-kv[1], kv[0]))))


@dataclass(slots=True)
class UnitResult:
    placements: list[Placement] = field(default_factory=list)
    # Pods not placed and why (the message `godel explain` shows).
    unplaced: dict[str, str] = field(default_factory=dict)
    # The same as data, for the pods whose reason is a search's (not a skipped gang member's).
    diagnoses: dict[str, Diagnosis] = field(default_factory=dict)
    success: bool = False
    reason: str = ""
    examined: int = 0  # node filter passes (the cost of the search)
    scans: int = 0
    infeasible: bool = False  # no node could ever fit (every node failed for unresolvable reasons)
    # Of an independent unit (UnitInfo.independent): the unplaced pods no node could ever fit,
    # each judged alone as ``infeasible`` judges a unit.
    infeasible_pods: set[str] = field(default_factory=set)


def describe(total: int, fit: int, diag: dict[str, int]) -> str:
    parts = sorted(diag.items(), key=lambda kv: (-kv[1], kv[0]))
    detail = ", ".join(f"{count} {reason}" for reason, count in parts)
    return f"{fit}/{total} nodes fit" + (f": {detail}" if detail else "")


@dataclass(frozen=True, slots=True)
class _NoFit:
    """No node fit a template at ``version`` of the snapshot ``snapshot`` (its token)."""

    snapshot: int
    version: int
    failure: str
    unresolvable: bool
    diagnosis: Diagnosis | None = None


@dataclass(slots=True)
class _Template:
    # (-score, tie-break draw, sequence number, node): the best score first, then the profile's
    # tie-break (``tie_breaker``), then the first pushed.
    heap: list[tuple[int, int, int, str]] = field(default_factory=list)
    draw: Callable[[], int] = _scan_order
    # The entry of each cached node that still counts (its sequence number): an entry pushed
    # again when a node is re-scored supersedes the older one, which is skipped when popped.
    live: dict[str, int] = field(default_factory=dict)
    static: dict[str, int] = field(default_factory=dict)
    # Pods the cache may still place before the template scans afresh: as many as its last
    # scan found nodes. Kept across units, a cache would otherwise pile a stream of one-pod jobs
    # onto the few nodes it found, where a fresh scan from the rotating offset spreads them as
    # the scores want (kube-scheduler scans anew for every pod).
    budget: int = 0
    # The framework's score generation its scores were taken in (``Framework.score_generation``):
    # a learning score plugin's answers moved since, the cache is dropped, not reused.
    generation: int = 0
    failure: str = ""
    diagnosis: Diagnosis | None = None
    # Set when a PreFilter narrowed the nodes: what to scan, and why the rest were skipped.
    segments: list[list[NodeInfo]] | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    unresolvable: bool = False  # the failure is one no eviction can change
    # Preemption found nowhere for a pod of this template: its siblings will not either.
    preemption_failure: str = ""
    preemption_diagnosis: Diagnosis | None = None
    # Scanning only the nodes changed since an earlier unit found none (``changed``; the
    # PostFilter still looks everywhere): that unit's verdict.
    known: _NoFit | None = None
    changed: list[list[NodeInfo]] | None = None
    # Pods a topology rule concerns (their ``Framework.topology_shape``; None: a plain
    # template). Their candidates are brought up to the counts before each pod (``refresh``):
    # the nodes changed since ``version`` of snapshot ``token`` are checked again in full, the
    # cached nodes sharing a domain of ``shape``'s keys with one of them by the topology
    # filters, and every cached node when the shape's global part moved.
    shape: tuple[frozenset[str], Hashable] | None = None
    token: int = 0
    version: int = 0
    dynamic: dict[str, int] = field(default_factory=dict)
    raw: dict[str, tuple[int, ...]] = field(default_factory=dict)  # topology raw scores
    norm: dict[str, int] = field(default_factory=dict)  # ... normalized over the candidates
    by_domain: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    # Candidates only a topology rule turned away (a spread's domain at its skew): re-checked
    # with the rest, and back among the candidates when the counts allow them again.
    parked: set[str] = field(default_factory=set)

    def push(self, node: str, score: int) -> None:
        """(Re-)enter ``node`` with ``score``; an older entry of it is skipped when popped."""
        seq = next(_SEQUENCE)
        heapq.heappush(self.heap, (-score, self.draw(), seq, node))
        self.live[node] = seq

    # -- topology templates ------------------------------------------------------------------

    def score_topology(
        self, framework: Framework, pod: PodInfo, feasible: list[NodeInfo], snapshot: Snapshot
    ) -> None:
        """A topology template's fresh candidates: scores kept in parts (node-only normalized,
        per-node dynamic, topology raw and normalized) so ``refresh`` can redo the moving ones."""
        static, dynamic = framework.score_parts(pod, feasible, topology_apart=True)
        raws = [framework.topology_raw(pod, info) for info in feasible]
        norm = framework.topology_scores(pod, raws)
        self.heap.clear()
        self.live.clear()
        self.parked.clear()
        self.static.clear()
        self.dynamic.clear()
        self.raw.clear()
        self.norm.clear()
        for info, s, d, r, t in zip(feasible, static, dynamic, raws, norm, strict=True):
            name = info.name
            self.static[name], self.dynamic[name], self.raw[name], self.norm[name] = s, d, r, t
            self.push(name, s + d + t)
        self.budget = len(feasible)
        self.index_domains(snapshot.infos)

    def index_domains(self, infos: dict[str, NodeInfo]) -> None:
        """The cached candidates by domain of the shape's keys."""
        assert self.shape is not None
        by_domain: dict[tuple[str, str], set[str]] = {}
        self.by_domain = by_domain
        for name in [*self.live, *self.parked]:
            info = infos.get(name)
            if info is None:
                continue
            for key in self.shape[0]:
                value = info.labels.get(key)
                if value is not None:
                    by_domain.setdefault((key, value), set()).add(name)

    def refresh(
        self,
        framework: Framework,
        pod: PodInfo,
        shape: tuple[frozenset[str], Hashable],
        snapshot: Snapshot,
    ) -> None:
        """Bring a topology template's candidates up to the snapshot for ``pod`` (prepared
        now). A node's topology filters and scores read only its own domains of ``shape``'s keys
        and ``shape``'s global part, and a domain's counts move only when a pod is added to or
        removed from one of its nodes (relabels are in the global part: ``relabels``). So: the
        nodes changed since are checked again in full; the others in a domain of a changed node
        (or all, when the shape moved) by the topology filters, and their raw topology scores
        read again. Topology scores are normalized over the candidates: when a raw score moved,
        all are normalized again and the heap rebuilt (no plugin call per node)."""
        changed = snapshot.changed_since(self.version) if self.token == snapshot.token else None
        if changed is None:
            self.heap.clear()
            self.live.clear()
            self.parked.clear()
            return
        self.version = snapshot.version
        every = shape != self.shape
        self.shape = shape
        full, domain = self._to_recheck(shape, changed, snapshot.infos, every)
        if not full and not domain:
            return
        back: list[str] = []  # parked nodes the counts allow again
        moved = self._recheck_changed(framework, pod, full, snapshot.infos, back)
        moved = self._recheck_domain(framework, pod, domain, snapshot.infos, back) or moved
        for name in back:
            self.live[name] = -1  # pushed below
        if every or moved:
            self._renormalize(framework, pod)
            return
        for name in (full & self.live.keys()) | set(back):  # only their own part of the score moved
            self.push(name, self.static[name] + self.dynamic[name] + self.norm[name])

    def _to_recheck(
        self,
        shape: tuple[frozenset[str], Hashable],
        changed: set[str],
        infos: dict[str, NodeInfo],
        every: bool,
    ) -> tuple[set[str], set[str]]:
        """The candidates to check again in full (changed themselves) and by the topology
        filters only (sharing a domain with a changed node; all of them when ``every``)."""
        known = self.live.keys() | self.parked
        full = changed & known
        if every:
            self.index_domains(infos)
            return full, known - full
        domain: set[str] = set()
        by_domain = self.by_domain
        for name in changed:
            info = infos.get(name)
            if info is None:
                continue
            for key in shape[0]:
                value = info.labels.get(key)
                if value is not None and (key, value) in by_domain:
                    domain |= by_domain[key, value]
        return full, (domain & known) - full

    def _recheck_changed(
        self,
        framework: Framework,
        pod: PodInfo,
        full: set[str],
        infos: dict[str, NodeInfo],
        back: list[str],
    ) -> bool:
        """Every filter and score again on the changed candidates; True when a raw topology
        score moved. Parked nodes that pass again are added to ``back``."""
        live, parked, moved = self.live, self.parked, False
        topology_names = {p.NAME for p in framework.topology}
        for name in full:
            info = infos.get(name)
            status = framework.run_filters(pod, info) if info is not None else None
            if info is None or status is not None:
                live.pop(name, None)
                if status is not None and status.plugin in topology_names:
                    parked.add(name)
                else:
                    parked.discard(name)
                continue
            if name in parked:
                parked.discard(name)
                back.append(name)
            self.dynamic[name] = framework.dynamic_score(pod, info)
            raw = framework.topology_raw(pod, info)
            if raw != self.raw.get(name):
                self.raw[name] = raw
                moved = True
        return moved

    def _recheck_domain(
        self,
        framework: Framework,
        pod: PodInfo,
        domain: set[str],
        infos: dict[str, NodeInfo],
        back: list[str],
    ) -> bool:
        """The topology filters and raw scores again on candidates whose domains moved; True
        when a raw score moved. Parked nodes that pass again are added to ``back``."""
        live, parked, moved = self.live, self.parked, False
        topology_filters = framework.topology_filters
        for name in domain:
            info = infos[name]
            if any(f(pod, info) is not None for f in topology_filters):
                live.pop(name, None)
                parked.add(name)
                continue
            if name in parked:
                # The node itself did not change, but a custom profile may order a node filter
                # after the topology ones: the whole list judges its return.
                if framework.run_filters(pod, info) is not None:
                    continue
                parked.discard(name)
                back.append(name)
            raw = framework.topology_raw(pod, info)
            if raw != self.raw[name]:
                self.raw[name] = raw
                moved = True
        return moved

    def _renormalize(self, framework: Framework, pod: PodInfo) -> None:
        """Topology scores normalized again over every candidate, and the heap rebuilt."""
        live = self.live
        names = list(live)
        norm = framework.topology_scores(pod, [self.raw[n] for n in names])
        self.heap.clear()
        for name, score in zip(names, norm, strict=True):
            self.norm[name] = score
            seq = next(_SEQUENCE)
            total = self.static[name] + self.dynamic[name] + score
            self.heap.append((-total, self.draw(), seq, name))
            live[name] = seq
        heapq.heapify(self.heap)


class _TemplateMemory:
    """What the search remembers of templates between units: the feasible-node caches kept
    (the most recently used; forgetting one costs a scan) and the templates no node fit."""

    def __init__(self) -> None:
        self.no_fit: dict[bytes, _NoFit] = {}  # Gödel mode with the cache only
        # Feasible-node caches between units, by template: (snapshot token, version, cache).
        self.kept: dict[bytes, tuple[int, int, _Template]] = {}

    def keep(
        self, templates: dict[bytes, _Template], snapshot: Snapshot, partition: frozenset[str]
    ) -> None:
        """Keep the unit's feasible-node caches for the next units of the same templates (a
        stream of one-pod jobs reuses one cache, as Gödel keys it by template, not by unit).
        Only caches over the whole view that still hold candidates are kept."""
        kept = self.kept
        for key, tmpl in templates.items():
            if partition:
                # Another shard's nodes were scanned only because ours had none: the next unit
                # looks in our own partition first again.
                for node in [n for n in tmpl.live if n not in partition]:
                    del tmpl.live[node]
                tmpl.parked &= partition
            if (
                tmpl.live
                and tmpl.budget > 0
                and tmpl.segments is None
                and tmpl.changed is None
                and not tmpl.failure
            ):
                kept.pop(key, None)  # most recently used last
                kept[key] = (snapshot.token, snapshot.version, tmpl)
        while len(kept) > _MAX_KEPT:
            del kept[next(iter(kept))]

    def reuse(
        self,
        framework: Framework,
        pod: PodInfo,
        snapshot: Snapshot,
        shape: tuple[frozenset[str], Hashable] | None,
        partition: frozenset[str],
    ) -> _Template | None:
        """An earlier unit's cache for ``pod``'s template, brought up to the snapshot: each
        cached node changed since (others' binds, deletions, our own cycle's assumes) is checked
        and re-scored again, or dropped. None when there is none or the changes are not known."""
        kept = self.kept.pop(pod.template_key, None)  # one unit at a time uses a cache
        if kept is None:
            return None
        token, version, tmpl = kept
        if (
            (tmpl.shape is None) != (shape is None)
            or token != snapshot.token
            # Scored by a learning plugin's older answers: its untouched nodes would keep them.
            or tmpl.generation != framework.score_generation()
        ):
            return None
        if tmpl.shape is not None:
            if partition and not tmpl.live.keys() <= partition:
                return None
            return tmpl  # brought up to the snapshot by ``refresh``, from its own version
        changed = snapshot.changed_since(version)
        if changed is None:
            return None
        if partition and not tmpl.live.keys() <= partition:
            return None  # the partition moved: scan it afresh
        infos = snapshot.infos
        for node in changed & tmpl.live.keys():
            info = infos.get(node)
            if info is None or framework.run_filters(pod, info) is not None:
                del tmpl.live[node]  # its heap entry is skipped when popped
            else:
                tmpl.push(node, tmpl.static[node] + framework.dynamic_score(pod, info))
        return tmpl

    def since_no_fit(self, pod: PodInfo, snapshot: Snapshot, tmpl: _Template) -> None:
        """If an earlier unit's pod of this template found no node, scan only what changed."""
        known = self.no_fit.get(pod.template_key)
        if known is None or known.snapshot != snapshot.token:
            return
        changed = snapshot.changed_since(known.version)
        if changed is None:
            return
        infos = snapshot.infos
        tmpl.changed = [[infos[n] for n in sorted(changed) if n in infos]]
        tmpl.known = known

    def remember_no_fit(self, pod: PodInfo, snapshot: Snapshot, tmpl: _Template) -> None:
        """Record that no node fits the template now; the verdict of the full scan is kept when
        only changed nodes were scanned (their diagnosis alone would not describe the cluster)."""
        known = tmpl.known
        if known is not None:
            tmpl.failure = known.failure
            tmpl.diagnosis = known.diagnosis
            tmpl.unresolvable = tmpl.unresolvable and known.unresolvable
        if len(self.no_fit) >= _MAX_NO_FIT:  # many distinct failing templates: start afresh
            self.no_fit.clear()
        self.no_fit[pod.template_key] = _NoFit(
            snapshot.token, snapshot.version, tmpl.failure, tmpl.unresolvable, tmpl.diagnosis
        )


def run_steps(
    steps: Generator[None, None, UnitResult], until: float = math.inf
) -> UnitResult | None:
    """Drive a search's steps (``UnitScheduler.steps``): its result once it ends, or None when
    ``time.monotonic()`` reached ``until`` first (call again to go on). A service gives the
    event loop a turn between calls; ``UnitScheduler.schedule`` runs it to the end at once."""
    try:
        if until == math.inf:
            while True:
                next(steps)
        while True:
            next(steps)
            if time.monotonic() >= until:
                return None
    except StopIteration as done:
        result: UnitResult = done.value
        return result


def _best_fit() -> Policy | None:
    return None


class _UnitRun:
    """One unit's pass over one node group (``UnitScheduler._schedule_in``): what its pods'
    cycles share, and what they placed so far. Written out rather than a dataclass: one is made
    per unit, and a stream of one-pod jobs makes thousands a second (a dataclass's default
    factories cost five times the literals)."""

    __slots__ = (
        "all_unresolvable",
        "allowed_failures",
        "cards",
        "changed",
        "holds",
        "labels",
        "limit",
        "needed",
        "now_ms",
        "numa",
        "placements",
        "preempted",
        "preferred",
        "recommended",
        "result",
        "segments",
        "share_policy",
        "snapshot",
        "templates",
        "total_nodes",
        "unit",
        "unplaced",
        "use_cache",
        "within",
    )

    def __init__(
        self,
        config: SearchConfig,
        unit: UnitInfo,
        snapshot: Snapshot,
        segments: list[list[NodeInfo]],
        labels: NodeLabels | None,
        result: UnitResult,
        within: set[str] | None,
    ) -> None:
        self.unit = unit
        self.needed = needed = unit.needed  # placements for the unit to succeed (min-member)
        self.snapshot = snapshot
        self.segments = segments
        self.labels = labels  # for PreFilters; None: a node group (already narrowed)
        self.result = result
        self.within = within  # a grouped unit takes recommendations only inside its group
        self.total_nodes = total_nodes = sum(map(len, segments))
        # Feasible nodes a scan looks for.
        if config.mode == "kube":
            self.limit = num_feasible_nodes_to_find(
                total_nodes, config.percentage_of_nodes_to_score, config.min_feasible_nodes
            )
        elif config.feasible_cache or unit.min_member > 1:
            # With the cache one scan serves every pod of a template, so it must find a node
            # for each of them.
            self.limit = min(total_nodes, len(unit.pods) + config.scan_extra)
        else:
            # Without it every pod scans anew, for ``AllMember + scan_extra`` as Gödel does:
            # all the unit's pods for a gang, one for a unit placed independently.
            self.limit = min(total_nodes, 1 + config.scan_extra)
        self.use_cache = config.mode == "godel" and config.feasible_cache
        self.now_ms = int(time.time() * 1000)
        # Pods that may go unplaced before the rest are skipped: an independent unit's pods
        # never skip, each is placed or not on its own.
        pods = len(unit.pods)
        self.allowed_failures = pods if unit.independent else pods - needed
        # Recommendations by node (in first-mention order), each with the tags still open.
        preferred: dict[str, list[str]] = {}
        for recommended_node, tag in unit.preferred:
            preferred.setdefault(recommended_node, []).append(tag)
        self.preferred = preferred
        self.templates: dict[bytes, _Template] = {}
        self.placements: list[tuple[PodInfo, str]] = []
        self.preempted: dict[str, Preempted] = {}  # pod -> its node and victims
        self.unplaced: dict[str, str] = {}  # pod -> why
        self.recommended: dict[str, str] = {}  # pod -> the tag of the recommendation it used
        self.numa: dict[str, tuple[int, ...]] = {}  # NUMA-bound pod -> the NUMA nodes it holds
        self.cards: dict[str, tuple[int, ...]] = {}  # pod asking GPUs -> the cards it holds
        # How a share's card is chosen (Framework.share_policy: the GpuFragmentation score's
        # policy as it is when the pod is placed, so the card proposed is the one the score
        # assumed); None: best fit.
        self.share_policy: Callable[[], Policy | None] = _best_fit
        # Pod -> the reservation's hold it took on its node (placement.reservations), off the
        # snapshot while the pod is assumed there (a later pod of the unit takes another).
        self.holds: dict[str, PodRequest] = {}
        # Nodes changed by placements outside a template's own bookkeeping (recommendations):
        # a cached candidate among them is re-checked before it is taken.
        self.changed: set[str] = set()
        self.all_unresolvable = True

    def assume(self, pod: PodInfo, node: str) -> None:
        """Assume ``pod`` on ``node``, a NUMA-bound pod holding the NUMA nodes chosen for it
        there and a pod asking GPUs the cards, so the unit's later pods see them taken. A pod that
        takes a reservation's hold there (the one its filters were lent) takes it off the node."""
        info = self.snapshot.infos[node]
        if pod.reservations:
            hold = hold_for(pod.reservations, info)
            if hold is not None:
                self.holds[pod.name] = info.pods[hold]
                self.snapshot.forget(hold, node)
        req = pin_numa(info, pod.req)
        if req.numa_nodes:
            self.numa[pod.name] = req.numa_nodes
        if req.requests.gpus:
            req = pin_cards(info, req, self.share_policy())
            self.cards[pod.name] = req.gpu_cards  # () when the node has no card for it
        self.snapshot.assume(req, node)

    def place_recommended(self, framework: Framework, pod: PodInfo) -> bool:
        """Place ``pod`` on the first recommended node that fits it (filters only, as Gödel's
        preferred nodes are tried) and lies ``within`` the unit's node group, if it has one,
        consuming one of its recommendations. False: none does. A pod that may take a
        reservation's hold tries the nodes of its own holds first (the unit's list holds its
        siblings' too: a sibling's node with room to spare would take it off its own)."""
        preferred, within, infos = self.preferred, self.within, self.snapshot.infos
        order: Iterable[tuple[str, list[str]]] = preferred.items()
        if pod.reservations:
            own = set(pod.reservations.values())
            order = sorted(order, key=lambda item: item[0] not in own)  # stable: own first
        for node, tags in order:
            if within is not None and node not in within:
                continue
            info = infos.get(node)
            if info is not None and framework.run_filters(pod, info) is None:
                self.recommended[pod.name] = tags.pop(0)
                if not tags:
                    del preferred[node]
                self.assume(pod, node)
                self.placements.append((pod, node))
                self.changed.add(node)
                self.all_unresolvable = False
                return True
        return False

    # -- the unit's verdict (min-member) ------------------------------------------------------

    def succeed(self) -> None:
        """The unit succeeds (an independent one whatever fits: its pods' own reasons stay
        theirs): its placements stand."""
        result, unplaced, diagnosed = self.result, self.unplaced, self.result.diagnoses
        preempted, recommended, numa, cards = (
            self.preempted,
            self.recommended,
            self.numa,
            self.cards,
        )
        result.success = True
        result.placements = [
            Placement(
                p.name,
                p.resource_version,
                n,
                [v.name for v in preempted[p.name].victims] if p.name in preempted else [],
                recommended.get(p.name, ""),
                numa.get(p.name, ()),
                cards.get(p.name, ()),
                self.holds[p.name].name if p.name in self.holds else "",
            )
            for p, n in self.placements
        ]
        result.unplaced = unplaced
        result.reason = ""
        if diagnosed:
            for name in set(diagnosed) - set(unplaced):
                del diagnosed[name]

    def fail(self) -> None:
        """Fewer than ``needed`` pods fit: every placement is undone (a gang preempts as a
        unit, or not at all) and every pod gets the first pod's reason."""
        snapshot, result, unplaced = self.snapshot, self.result, self.unplaced
        needed, placed, diagnosed = self.needed, len(self.placements), result.diagnoses
        for pod, node in self.placements:
            place = self.preempted.get(pod.name)
            if place is not None:
                undo(snapshot, pod.name, place)
            else:
                snapshot.forget(pod.name, node)
            hold = self.holds.get(pod.name)
            if hold is not None:
                snapshot.assume(hold, node)
        result.placements = []
        first = next(iter(unplaced.values()), "")
        # The node summary first: it is what `godel explain` leads with.
        result.reason = (
            f"{first}; min_member needs {needed} pod(s) placed, {placed} fit"
            if needed > 1
            else first
        )
        result.unplaced = {p.name: result.reason for p in self.unit.pods}
        first_diagnosis = next((diagnosed[p] for p in unplaced if p in diagnosed), None)
        diagnosed.clear()
        if first_diagnosis is not None:
            if needed > 1:
                first_diagnosis = replace(first_diagnosis, gang_needed=needed, gang_placed=placed)
            diagnosed.update(dict.fromkeys(result.unplaced, first_diagnosis))
        result.infeasible = bool(unplaced) and self.all_unresolvable and not placed


class UnitScheduler:
    def __init__(
        self,
        framework: Framework,
        config: SearchConfig | None = None,
        preemption: Preemption | None = None,
    ) -> None:
        self.framework = framework
        self.config = config or SearchConfig()
        # The PostFilter; None (or a profile with preemption off): pods that fit nowhere wait.
        self.preemption = preemption if framework.profile.preemption else None
        self._topology_plugins = bool(framework.topology)
        # Select among equal scores: the profile's tie-break (scan order, or at random).
        profile = framework.profile
        self._draw = tie_breaker(profile.tie_break, profile.tie_break_seed)
        self.partition: frozenset[str] = frozenset()
        self._offset = 0
        # The partitioned scan order, kept between units: (snapshot token, layout, partition)
        # it was built for, each node's (segment, position), and the snapshot version it is
        # current at.
        self._segments: list[list[NodeInfo]] = []
        self._segments_key: tuple[int, int, frozenset[str]] | None = None
        self._segments_at: dict[str, tuple[int, int]] = {}
        self._segments_version = 0
        self._memory = _TemplateMemory()

    def segments(self, snapshot: Snapshot) -> list[list[NodeInfo]]:
        """Nodes in scan order: own partition first, then the rest."""
        if not self.partition:
            return [snapshot.nodes]
        key = (snapshot.token, snapshot.layout, self.partition)
        changed = (
            snapshot.changed_since(self._segments_version) if key == self._segments_key else None
        )
        if changed is None:
            self._segments = partition_first(snapshot.nodes, self.partition)
            self._segments_at = {
                n.name: (k, i) for k, seg in enumerate(self._segments) for i, n in enumerate(seg)
            }
            self._segments_key = key
        else:
            # Same nodes at the same places: only the entries re-cloned since are replaced
            # (a unit's own assumes, others' binds), not all 10,000 resolved again per unit.
            segments, infos = self._segments, snapshot.infos
            for name in changed:
                at = self._segments_at.get(name)
                info = infos.get(name)
                if at is not None and info is not None:
                    segments[at[0]][at[1]] = info
        self._segments_version = snapshot.version
        return self._segments

    # -- unit level --------------------------------------------------------------------------

    def schedule(self, unit: UnitInfo, snapshot: Snapshot) -> UnitResult:
        """Place the unit's pods, or none of them if fewer than ``unit.needed`` fit. Placements
        are assumed into ``snapshot`` (so no node is over-committed within the cycle) and kept
        there only on success."""
        result = run_steps(self.steps(unit, snapshot))
        assert result is not None  # no deadline: run to the end
        return result

    def steps(self, unit: UnitInfo, snapshot: Snapshot) -> Generator[None, None, UnitResult]:
        """:meth:`schedule`, yielding after each pod; returns the result."""
        result = UnitResult()
        grouped = self.framework.node_groups(unit, snapshot.nodes)
        if grouped is None:
            candidates: list[list[list[NodeInfo]]] = [self.segments(snapshot)]
        else:
            candidates = [[g] for g in grouped.groups if g]
        if not candidates or not any(candidates[0]):
            # A grouping that left nothing explains itself ("no single rack domain ...").
            result.reason = grouped.reason if grouped and grouped.reason else describe(0, 0, {})
            result.unplaced = {p.name: result.reason for p in unit.pods}
            note = grouped.reason if grouped else ""
            result.diagnoses = {p.name: Diagnosis(0, note=note) for p in unit.pods}
            return result
        # PreFilters narrow the whole view only: a node group is already a narrowed list.
        labels = snapshot.labels if grouped is None else None
        first_failure = ""
        for segments in candidates:
            # A grouped unit takes recommendations only inside the group it is placed in.
            within = None if grouped is None else {n.name for seg in segments for n in seg}
            yield from self._schedule_in(unit, snapshot, segments, labels, result, within)
            if result.success:
                return result
            first_failure = first_failure or result.reason
        if grouped is not None and grouped.reason and len(candidates) > 0:
            # Every group failed: say why in the best one, and that the gang cannot split.
            result.reason = (
                f"{first_failure} (in the best of {len(candidates)} node group(s) tried; "
                f"{grouped.reason})"
            )
            result.unplaced = {p.name: result.reason for p in unit.pods}
            # The data `godel explain` renders says it too.
            note = f"in the best of {len(candidates)} node group(s) tried; {grouped.reason}"
            result.diagnoses = {
                name: dataclasses.replace(d, note=f"{d.note}; {note}" if d.note else note)
                for name, d in result.diagnoses.items()
            }
            result.infeasible = False  # room may free up in a domain
        return result

    def _narrow(
        self, pod: PodInfo, snapshot: Snapshot, labels: NodeLabels, total: int
    ) -> tuple[list[list[NodeInfo]], dict[str, int]] | None:
        """The segments to scan for ``pod`` when a PreFilter leaves few candidates (a quarter of
        the nodes or fewer: with more, a scan from the rotating offset meets enough feasible
        nodes sooner than building the list would take), and the diagnosis of the rest."""
        found = self.framework.candidates(pod, labels)
        if found is None or len(found.nodes) * 4 > total:
            return None
        infos = snapshot.infos
        nodes = [infos[name] for name in sorted(found.nodes) if name in infos]
        if self.partition:
            segments = partition_first(nodes, self.partition)
        else:
            segments = [nodes] if nodes else []
        skipped = total - len(nodes)
        return segments, ({found.reason: skipped} if skipped else {})

    # -- one unit over one node group: the pods' scheduling cycles ----------------------------

    def _schedule_in(
        self,
        unit: UnitInfo,
        snapshot: Snapshot,
        segments: list[list[NodeInfo]],
        labels: NodeLabels | None,
        result: UnitResult,
        within: set[str] | None = None,
    ) -> Generator[None, None, None]:
        """Each pod through its cycle (``_schedule_pod``), yielding before each; then the unit's
        min-member verdict: its placements kept (``_UnitRun.succeed``) or all undone (``fail``)."""
        run = _UnitRun(self.config, unit, snapshot, segments, labels, result, within)
        run.share_policy = self.framework.share_policy
        unplaced, allowed_failures = run.unplaced, run.allowed_failures
        for pod in unit.pods:
            yield
            if len(unplaced) > allowed_failures:
                unplaced[pod.name] = "skipped: the unit cannot reach min_member"
                continue
            self._schedule_pod(run, pod)
        if unit.independent or (len(run.placements) >= run.needed and run.placements):
            run.succeed()
        else:
            run.fail()
        if run.use_cache and run.labels is not None:
            self._memory.keep(run.templates, snapshot, self.partition)

    def _schedule_pod(self, run: _UnitRun, pod: PodInfo) -> None:
        """One pod's cycle, as kube-scheduler's reads: PreFilter (the topology counts, the
        template's candidates), Select the best candidate the template's cache holds, or Filter
        and Score a fresh scan first (``_scan``); Reserve it (assume). PostFilter (preemption)
        when nothing fits."""
        snapshot = run.snapshot
        self.framework.observe(pod)
        shape = None
        if self._topology_plugins and (pod.has_topology or snapshot.topology.has_anti):
            shape = self._prefilter_topology(pod, snapshot)
        else:
            pod.topology = None  # no topology rule concerns it: no counts to read
        if run.preferred and run.place_recommended(self.framework, pod):
            return
        # A plain template the unit already holds is the common case (a gang's later pods):
        # taken here without the call; ``_template`` decides every other case.
        tmpl = run.templates.get(pod.template_key) if shape is None else None
        generation = self.framework.score_generation()
        if tmpl is not None and tmpl.generation != generation:
            del run.templates[pod.template_key]  # scored by a learning plugin's older answers
            tmpl = None
        if tmpl is None or tmpl.shape is not None:
            tmpl = self._template(run, pod, shape)
        if tmpl.failure:  # a pod of this template found no node: its siblings cannot either
            self._post_filter(run, pod, tmpl, shape is not None)
            return
        node = None
        if run.use_cache:
            if shape is not None and tmpl.live:
                tmpl.refresh(self.framework, pod, shape, snapshot)
            node = self._take(tmpl, pod, snapshot, run.changed)
        if node is None:
            node = self._scan(run, pod, tmpl, shape)
            if node is None:
                return
        self._reserve(run, pod, tmpl, node, shape)

    def _scan(
        self,
        run: _UnitRun,
        pod: PodInfo,
        tmpl: _Template,
        shape: tuple[frozenset[str], Hashable] | None,
    ) -> str | None:
        """Filter nodes, Score the feasible ones into the template's cache and Select the
        best; None when no node fits (the PostFilter has had its turn)."""
        snapshot = run.snapshot
        # A topology template scans one node and the usual margin at a time: its candidates
        # are re-checked as counts move, a long list would cost more there.
        limit = run.limit
        if shape is not None:
            if run.use_cache:
                limit = min(limit, 1 + self.config.scan_extra)
            # What the fresh candidates are judged by.
            tmpl.shape, tmpl.token, tmpl.version = shape, snapshot.token, snapshot.version
        feasible, unresolvable = self._filter(pod, run, limit, tmpl)
        if not feasible:
            self._no_feasible_node(run, pod, tmpl, unresolvable, shape is not None)
            return None
        run.all_unresolvable = False
        self._score(pod, feasible, tmpl, snapshot)
        node = self._take(tmpl, pod, snapshot, run.changed)
        assert node is not None
        return node

    def _prefilter_topology(
        self, pod: PodInfo, snapshot: Snapshot
    ) -> tuple[frozenset[str], Hashable] | None:
        """Called for a pod with pod affinity, anti-affinity or spread constraints (or that an
        existing pod's anti-affinity may concern): it reads the counts as the unit's earlier placements left
        them. Its template's cache is kept apart by this shape (None: no topology rule concerns
        the pod) and brought up to the counts before each pod (``_Template.refresh``): a placement moves
        only its node's domains."""
        framework = self.framework
        if framework.prepare(pod, snapshot.pod_counts()):
            keys, every = framework.topology_shape(pod)
            return keys, (every, snapshot.topology.relabels)
        return None  # prepare() left pod.topology None

    def _template(
        self, run: _UnitRun, pod: PodInfo, shape: tuple[frozenset[str], Hashable] | None
    ) -> _Template:
        """The feasible-node cache ``pod``'s template uses in this unit: the unit's own, an
        earlier unit's brought up to the snapshot (``_reuse``), or a fresh one (narrowed by a
        PreFilter, or scanning only the nodes changed since the template last fit nowhere)."""
        topo, use_cache, labels = shape is not None, run.use_cache, run.labels
        key = pod.template_key
        generation = self.framework.score_generation()
        tmpl = None if topo and not use_cache else run.templates.get(key)
        if tmpl is not None and (
            tmpl.generation != generation  # a learning score plugin's answers moved
            or (tmpl.shape is None) != (shape is None)  # a topology rule came or went
            # A topology failure holds only while nothing changed: others' placements
            # move counts (a spread's minimum rises).
            or (tmpl.shape is not None and tmpl.failure and tmpl.version != run.snapshot.version)
        ):
            tmpl = None
        if tmpl is None and use_cache and labels is not None:
            tmpl = self._memory.reuse(self.framework, pod, run.snapshot, shape, self.partition)
            if tmpl is not None:
                run.templates[key] = tmpl
        if tmpl is None:
            tmpl = _Template(shape=shape, draw=self._draw, generation=generation)
            if not topo or use_cache:
                run.templates[key] = tmpl
            narrowed = labels and self._narrow(pod, run.snapshot, labels, run.total_nodes)
            if narrowed:
                tmpl.segments, tmpl.skipped = narrowed
            elif use_cache and labels is not None and shape is None:
                self._memory.since_no_fit(pod, run.snapshot, tmpl)
        return tmpl

    def _no_feasible_node(
        self, run: _UnitRun, pod: PodInfo, tmpl: _Template, unresolvable: bool, topo: bool
    ) -> None:
        """A fresh scan found no node for ``pod``: the template's failure is remembered (its
        siblings, and the next units of the template, start from it) and ``pod`` goes to the
        PostFilter."""
        tmpl.unresolvable = unresolvable
        if run.use_cache and run.labels is not None and not tmpl.skipped and not topo:
            self._memory.remember_no_fit(pod, run.snapshot, tmpl)
        # Pods bound or gone elsewhere can lift a topology rule: such a unit is unschedulable
        # (retried after a backoff), never infeasible (parked until a node changes);
        # preemption still does not try (the failure is unresolvable).
        run.all_unresolvable = run.all_unresolvable and tmpl.unresolvable and not topo
        self._post_filter(run, pod, tmpl, topo)

    def _post_filter(self, run: _UnitRun, pod: PodInfo, tmpl: _Template, topo: bool) -> None:
        """No node fits ``pod``: preemption when an eviction can help, else its reason."""
        if tmpl.unresolvable:  # no eviction can change taints, affinity or cordons
            run.unplaced[pod.name] = tmpl.failure
            _diagnosed(run.result.diagnoses, pod.name, tmpl.diagnosis)
            if run.unit.independent and not topo:
                run.result.infeasible_pods.add(pod.name)
        elif self._preempt(pod, run, tmpl):
            run.placements.append((pod, run.preempted[pod.name].node))

    def _reserve(
        self,
        run: _UnitRun,
        pod: PodInfo,
        tmpl: _Template,
        node: str,
        shape: tuple[frozenset[str], Hashable] | None,
    ) -> None:
        """Assume ``pod`` on the selected ``node``; only that node changed, so only it is
        re-checked and re-scored in the template's cache."""
        snapshot = run.snapshot
        info = snapshot.infos[node]
        run.assume(pod, node)
        run.placements.append((pod, node))
        if not run.use_cache:
            tmpl.heap.clear()
            tmpl.live.clear()
        elif shape is not None:
            # Kept as a candidate: the next pod's refresh re-checks it with the new counts.
            tmpl.live[node] = -1
        elif self.framework.run_filters(pod, info) is None:
            tmpl.push(node, tmpl.static[node] + self.framework.dynamic_score(pod, info))

    def _preempt(self, pod: PodInfo, run: _UnitRun, tmpl: _Template) -> bool:
        """The PostFilter for a pod the filters placed nowhere: True when it is assumed on a node
        with its victims taken off; else its reason is in ``run.unplaced``."""
        unplaced, diagnosed = run.unplaced, run.result.diagnoses
        if self.preemption is None:
            unplaced[pod.name] = tmpl.failure
            _diagnosed(diagnosed, pod.name, tmpl.diagnosis)
            return False
        if preemptor_refusal(pod) is not None:
            unplaced[pod.name] = f"{tmpl.failure}; {NEVER_SENTENCE}"
            if tmpl.diagnosis is not None:
                diagnosed[pod.name] = replace(tmpl.diagnosis, preemption_never=True)
            return False
        if tmpl.preemption_failure:
            unplaced[pod.name] = tmpl.preemption_failure
            _diagnosed(diagnosed, pod.name, tmpl.preemption_diagnosis)
            return False
        chosen = {v.name for place in run.preempted.values() for v in place.victims}
        scan = tmpl.segments if tmpl.segments is not None else run.segments
        place = self.preemption.find(pod, scan, run.now_ms, chosen)
        if place is None:
            tmpl.preemption_failure = f"{tmpl.failure}; {self.preemption.why}"
            if tmpl.diagnosis is not None:
                tmpl.preemption_diagnosis = self._preemption_diagnosis(tmpl.diagnosis, pod)
            unplaced[pod.name] = tmpl.preemption_failure
            _diagnosed(diagnosed, pod.name, tmpl.preemption_diagnosis)
            return False
        req = take(run.snapshot, pod.req, place)
        if req.numa_nodes:
            run.numa[pod.name] = req.numa_nodes
        if req.requests.gpus:
            run.cards[pod.name] = req.gpu_cards
        run.preempted[pod.name] = place
        return True

    def _preemption_diagnosis(self, diagnosis: Diagnosis, pod: PodInfo) -> Diagnosis:
        """``diagnosis`` with what the failed victim search tallied (its sentence as the note
        only when it tallied no node)."""
        assert self.preemption is not None
        blocked = self.preemption.blocked
        if not blocked.nodes:
            return replace(diagnosis, note=self.preemption.why)
        return replace(
            diagnosis,
            preemption_reasons=blocked.reasons(),
            protection_ends_ms=blocked.stored_protection_end(),
            priority=pod.priority,
        )

    # -- pod level ---------------------------------------------------------------------------

    def _take(
        self, tmpl: _Template, pod: PodInfo, snapshot: Snapshot, changed: set[str]
    ) -> str | None:
        """The best cached candidate; one among ``changed`` is taken only if it still fits."""
        while tmpl.heap:
            _, _, seq, node = heapq.heappop(tmpl.heap)
            if tmpl.live.get(node) != seq:
                continue  # superseded by a later entry, or dropped
            del tmpl.live[node]
            if node not in changed or self.framework.run_filters(pod, snapshot.infos[node]) is None:
                tmpl.budget -= 1
                return node
        return None

    def _filter(
        self, pod: PodInfo, run: _UnitRun, limit: int, tmpl: _Template
    ) -> tuple[list[NodeInfo], bool]:
        """Filter nodes from the rotating offset until ``limit`` are feasible. Segments are
        scanned in order (own partition first) and a later one only if the earlier ones had no
        feasible node. Returns (the feasible nodes, every failure was unresolvable); with none,
        the template's failure says why."""
        filters = self.framework.filters_for(pod)
        feasible: list[NodeInfo] = []
        diag = dict(tmpl.skipped)
        segments: Sequence[list[NodeInfo]] = run.segments
        if tmpl.changed is not None:
            segments = tmpl.changed
        elif tmpl.segments is not None:
            segments = tmpl.segments
        unresolvable = True
        examined = 0
        for seg in segments:
            for node in rotated(seg, self._offset):
                examined += 1
                for f in filters:
                    status = f(pod, node)
                    if status is not None:
                        for r in status.reasons:
                            diag[r] = diag.get(r, 0) + 1
                        if status.code != Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                            unresolvable = False
                        break
                else:
                    feasible.append(node)
                    if len(feasible) >= limit:
                        break
            # Past the own partition only when it had no feasible node at all (Gödel's rule):
            # fewer than ``limit`` there still serve the template, and the other shards' nodes
            # are where their decisions would conflict with ours.
            if feasible:
                break
        self._offset += examined
        run.result.examined += examined
        run.result.scans += 1
        if not feasible:
            tmpl.failure = describe(run.total_nodes, 0, diag)
            tmpl.diagnosis = diagnose(run.total_nodes, diag)
            return feasible, unresolvable
        return feasible, False

    def _score(
        self, pod: PodInfo, feasible: list[NodeInfo], tmpl: _Template, snapshot: Snapshot
    ) -> None:
        """Score the feasible nodes into the template's heap (the candidates ``_take`` selects
        from), as many pods' worth as the scan found nodes."""
        if tmpl.shape is not None:
            tmpl.score_topology(self.framework, pod, feasible, snapshot)
            tmpl.generation = self.framework.score_generation()
            return
        static, dynamic = self.framework.score_parts(pod, feasible)
        tmpl.generation = self.framework.score_generation()
        for info, s, d in zip(feasible, static, dynamic, strict=True):
            tmpl.static[info.name] = s
            tmpl.push(info.name, s + d)
        tmpl.budget = len(feasible)


def _diagnosed(diagnosed: dict[str, Diagnosis], pod: str, diagnosis: Diagnosis | None) -> None:
    if diagnosis is not None:
        diagnosed[pod] = diagnosis
