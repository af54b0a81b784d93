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
before each pod only where the counts moved (``_refresh``: the changed nodes, the candidates
sharing a domain with them, all of them when a global value such as a spread's minimum moved).
A template that found no node is remembered across units (``_NoFit``): the next unit of the same template scans only the nodes that changed since
(``Snapshot.changed_since``), so a stream of one-pod jobs waiting on a full cluster (a
preemption storm) does not scan every node per pod. Kube mode, for comparison: no cache, every
pod scans until it has ``num_feasible_nodes_to_find(n)`` feasible nodes (kube-scheduler's
adaptive percentageOfNodesToScore) and scores them.

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
import heapq
import math
import time
from collections.abc import Generator, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from placement.framework import Code, Framework, NodeLabels, PodInfo, UnitInfo
from placement.nodeinfo import NodeInfo
from placement.plugins.numatopology import pin_numa
from placement.postfilter import Preempted, Preemption, take, undo
from placement.scan import partition_first, rotated
from placement.snapshot import Snapshot
from protos.godel.v1 import objects_pb2 as pb

Mode = Literal["godel", "kube"]
# Templates remembered as fitting nowhere (a memory bound; forgetting one only costs a scan).
_MAX_NO_FIT = 10_000
# Feasible-node caches kept between units (the most recently used; forgetting one costs a scan).
_MAX_KEPT = 1_000


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

    def to_proto(self) -> pb.SchedulingDiagnosis:
        return pb.SchedulingDiagnosis(
            total_nodes=self.total_nodes,
            reasons=[pb.ReasonCount(reason=r, nodes=n) for r, n in self.reasons],
            gang_needed=self.gang_needed,
            gang_placed=self.gang_placed,
            note=self.note,
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
    heap: list[tuple[int, int, str]] = field(default_factory=list)
    # The entry of each cached node that still counts (its sequence number): an entry pushed
    # again when a node is re-scored supersedes the older one, which is skipped when popped.
    live: dict[str, int] = field(default_factory=dict)
    static: dict[str, int] = field(default_factory=dict)
    # Pods the cache may still place before the template scans afresh: as many as its last
    # scan found nodes. Kept across units, a cache would otherwise pile a stream of one-pod jobs
    # onto the few nodes it found, where a fresh scan from the rotating offset spreads them as
    # the scores want (kube-scheduler scans anew for every pod).
    budget: int = 0
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
    # template). Their candidates are brought up to the counts before each pod (``_refresh``):
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


class _UnitRun:
    """One unit's pass over one node group (``UnitScheduler._schedule_in``): what its pods'
    cycles share, and what they placed so far. Written out rather than a dataclass: one is made
    per unit, and a stream of one-pod jobs makes thousands a second (a dataclass's default
    factories cost five times the literals)."""

    __slots__ = (
        "all_unresolvable",
        "allowed_failures",
        "changed",
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
        self.total_nodes = total_nodes = sum(len(s) for s in segments)
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
        # Nodes changed by placements outside a template's own bookkeeping (recommendations):
        # a cached candidate among them is re-checked before it is taken.
        self.changed: set[str] = set()
        self.all_unresolvable = True


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
        self.partition: frozenset[str] = frozenset()
        self._offset = 0
        self._seq = 0
        # The partitioned scan order, kept between units: (snapshot token, layout, partition)
        # it was built for, each node's (segment, position), and the snapshot version it is
        # current at.
        self._segments: list[list[NodeInfo]] = []
        self._segments_key: tuple[int, int, frozenset[str]] | None = None
        self._segments_at: dict[str, tuple[int, int]] = {}
        self._segments_version = 0
        self._no_fit: dict[bytes, _NoFit] = {}  # Gödel mode with the cache only
        # Feasible-node caches between units, by template: (snapshot token, version, cache).
        self._kept: dict[bytes, tuple[int, int, _Template]] = {}

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
        min-member verdict: its placements kept (``_keep_unit``) or all undone (``_undo_unit``)."""
        run = _UnitRun(self.config, unit, snapshot, segments, labels, result, within)
        unplaced, allowed_failures = run.unplaced, run.allowed_failures
        for pod in unit.pods:
            yield
            if len(unplaced) > allowed_failures:
                unplaced[pod.name] = "skipped: the unit cannot reach min_member"
                continue
            self._schedule_pod(run, pod)
        if unit.independent or (len(run.placements) >= run.needed and run.placements):
            self._keep_unit(run)
        else:
            self._undo_unit(run)

    def _schedule_pod(self, run: _UnitRun, pod: PodInfo) -> None:
        """One pod's cycle, as kube-scheduler's reads: PreFilter (the topology counts, the
        template's candidates), Select the best candidate the template's cache holds, or Filter
        and Score a fresh scan first (``_scan``); Reserve it (assume). PostFilter (preemption)
        when nothing fits."""
        snapshot = run.snapshot
        shape = None
        if self._topology_plugins and (pod.has_topology or snapshot.topology.has_anti):
            shape = self._prefilter_topology(pod, snapshot)
        else:
            pod.topology = None  # no topology rule concerns it: no counts to read
        if run.preferred and self._place_recommended(run, pod):
            return
        tmpl = self._template(run, pod, shape)
        if tmpl.failure:  # a pod of this template found no node: its siblings cannot either
            self._post_filter(run, pod, tmpl, shape is not None)
            return
        node = None
        if run.use_cache:
            if shape is not None and tmpl.live:
                self._refresh(tmpl, pod, shape, snapshot)
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
        the pod) and brought up to the counts before each pod (``_refresh``): a placement moves
        only its node's domains."""
        framework = self.framework
        if framework.prepare(pod, snapshot.pod_counts()):
            keys, every = framework.topology_shape(pod)
            return keys, (every, snapshot.topology.relabels)
        return None  # prepare() left pod.topology None

    def _place_recommended(self, run: _UnitRun, pod: PodInfo) -> bool:
        """Place ``pod`` on a node a Movement recommended, if one fits."""
        taken = self._take_recommended(pod, run.snapshot, run.preferred, run.within)
        if taken is None:
            return False
        target, run.recommended[pod.name] = taken
        self._assume(pod, run.snapshot, target, run.numa)
        run.placements.append((pod, target))
        run.changed.add(target)
        run.all_unresolvable = False
        return True

    def _template(
        self, run: _UnitRun, pod: PodInfo, shape: tuple[frozenset[str], Hashable] | None
    ) -> _Template:
        """The feasible-node cache ``pod``'s template uses in this unit: the unit's own, an
        earlier unit's brought up to the snapshot (``_reuse``), or a fresh one (narrowed by a
        PreFilter, or scanning only the nodes changed since the template last fit nowhere)."""
        topo, use_cache, labels = shape is not None, run.use_cache, run.labels
        key = pod.template_key
        tmpl = None if topo and not use_cache else run.templates.get(key)
        if tmpl is not None and (
            (tmpl.shape is None) != (shape is None)  # a topology rule came or went
            # A topology failure holds only while nothing changed: others' placements
            # move counts (a spread's minimum rises).
            or (tmpl.shape is not None and tmpl.failure and tmpl.version != run.snapshot.version)
        ):
            tmpl = None
        if tmpl is None and use_cache and labels is not None:
            tmpl = self._reuse(pod, run.snapshot, shape)
            if tmpl is not None:
                run.templates[key] = tmpl
        if tmpl is None:
            tmpl = _Template(shape=shape)
            if not topo or use_cache:
                run.templates[key] = tmpl
            narrowed = labels and self._narrow(pod, run.snapshot, labels, run.total_nodes)
            if narrowed:
                tmpl.segments, tmpl.skipped = narrowed
            elif use_cache and labels is not None and shape is None:
                self._since_no_fit(pod, run.snapshot, tmpl)
        return tmpl

    def _no_feasible_node(
        self, run: _UnitRun, pod: PodInfo, tmpl: _Template, unresolvable: bool, topo: bool
    ) -> None:
        """A fresh scan found no node for ``pod``: the template's failure is remembered (its
        siblings, and the next units of the template, start from it) and ``pod`` goes to the
        PostFilter."""
        tmpl.unresolvable = unresolvable
        if run.use_cache and run.labels is not None and not tmpl.skipped and not topo:
            self._remember_no_fit(pod, run.snapshot, tmpl)
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
        self._assume(pod, snapshot, node, run.numa)
        run.placements.append((pod, node))
        if not run.use_cache:
            tmpl.heap.clear()
            tmpl.live.clear()
        elif shape is not None:
            # Kept as a candidate: the next pod's refresh re-checks it with the new counts.
            tmpl.live[node] = -1
        elif self.framework.run_filters(pod, info) is None:
            self._push(tmpl, node, tmpl.static[node] + self.framework.dynamic_score(pod, info))

    def _keep_unit(self, run: _UnitRun) -> None:
        """The unit succeeds (an independent one whatever fits: its pods' own reasons stay
        theirs): its placements stand."""
        result, unplaced, diagnosed = run.result, run.unplaced, run.result.diagnoses
        preempted, recommended, numa = run.preempted, run.recommended, run.numa
        result.success = True
        result.placements = [
            Placement(
                p.name,
                p.resource_version,
                n,
                [v.name for v in preempted[p.name].victims] if p.name in preempted else [],
                recommended.get(p.name, ""),
                numa.get(p.name, ()),
            )
            for p, n in run.placements
        ]
        result.unplaced = unplaced
        result.reason = ""
        if diagnosed:
            for name in set(diagnosed) - set(unplaced):
                del diagnosed[name]
        if run.use_cache and run.labels is not None:
            self._keep(run.templates, run.snapshot)

    def _undo_unit(self, run: _UnitRun) -> None:
        """Fewer than ``needed`` pods fit: every placement is undone (a gang preempts as a
        unit, or not at all) and every pod gets the first pod's reason."""
        snapshot, result, unplaced = run.snapshot, run.result, run.unplaced
        needed, placed, diagnosed = run.needed, len(run.placements), result.diagnoses
        for pod, node in run.placements:
            place = run.preempted.get(pod.name)
            if place is not None:
                undo(snapshot, pod.name, place)
            else:
                snapshot.forget(pod.name, node)
        if run.use_cache and run.labels is not None:
            self._keep(run.templates, snapshot)
        result.placements = []
        first = next(iter(unplaced.values()), "")
        # The node summary first: it is what `godel explain` leads with.
        result.reason = (
            f"{first}; min_member needs {needed} pod(s) placed, {placed} fit"
            if needed > 1
            else first
        )
        result.unplaced = {p.name: result.reason for p in run.unit.pods}
        first_diagnosis = next((diagnosed[p] for p in unplaced if p in diagnosed), None)
        diagnosed.clear()
        if first_diagnosis is not None:
            if needed > 1:
                first_diagnosis = replace(first_diagnosis, gang_needed=needed, gang_placed=placed)
            diagnosed.update(dict.fromkeys(result.unplaced, first_diagnosis))
        result.infeasible = bool(unplaced) and run.all_unresolvable and not placed

    def _keep(self, templates: dict[bytes, _Template], snapshot: Snapshot) -> None:
        """Keep the unit's feasible-node caches for the next units of the same templates (a
        stream of one-pod jobs reuses one cache, as Gödel keys it by template, not by unit).
        Only caches over the whole view that still hold candidates are kept."""
        partition = self.partition
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
                self._kept.pop(key, None)  # most recently used last
                self._kept[key] = (snapshot.token, snapshot.version, tmpl)
        while len(self._kept) > _MAX_KEPT:
            del self._kept[next(iter(self._kept))]

    def _reuse(
        self, pod: PodInfo, snapshot: Snapshot, shape: tuple[frozenset[str], Hashable] | None
    ) -> _Template | None:
        """An earlier unit's cache for ``pod``'s template, brought up to the snapshot: each
        cached node changed since (others' binds, deletions, our own cycle's assumes) is checked
        and re-scored again, or dropped. None when there is none or the changes are not known."""
        kept = self._kept.pop(pod.template_key, None)  # one unit at a time uses a cache
        if kept is None:
            return None
        token, version, tmpl = kept
        if (tmpl.shape is None) != (shape is None) or token != snapshot.token:
            return None
        if tmpl.shape is not None:
            if self.partition and not tmpl.live.keys() <= self.partition:
                return None
            return tmpl  # brought up to the snapshot by ``_refresh``, from its own version
        changed = snapshot.changed_since(version)
        if changed is None:
            return None
        if self.partition and not tmpl.live.keys() <= self.partition:
            return None  # the partition moved: scan it afresh
        framework, infos = self.framework, snapshot.infos
        for node in changed & tmpl.live.keys():
            info = infos.get(node)
            if info is None or framework.run_filters(pod, info) is not None:
                del tmpl.live[node]  # its heap entry is skipped when popped
            else:
                self._push(tmpl, node, tmpl.static[node] + framework.dynamic_score(pod, info))
        return tmpl

    def _refresh(
        self,
        tmpl: _Template,
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
        framework, infos, live = self.framework, snapshot.infos, tmpl.live
        changed = snapshot.changed_since(tmpl.version) if tmpl.token == snapshot.token else None
        parked = tmpl.parked
        if changed is None:
            tmpl.heap.clear()
            live.clear()
            parked.clear()
            return
        tmpl.version = snapshot.version
        every = shape != tmpl.shape
        tmpl.shape = shape
        known = live.keys() | parked
        full = changed & known
        if every:
            self._index_domains(tmpl, infos)
            domain = known - full
        else:
            domain = set()
            by_domain = tmpl.by_domain
            for name in changed:
                info = infos.get(name)
                if info is None:
                    continue
                for key in shape[0]:
                    value = info.labels.get(key)
                    if value is not None and (key, value) in by_domain:
                        domain |= by_domain[key, value]
            domain = (domain & known) - full
        if not full and not domain:
            return
        moved = every
        topology_names = {p.NAME for p in framework.topology}
        back: list[str] = []  # parked nodes the counts allow again
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
            tmpl.dynamic[name] = framework.dynamic_score(pod, info)
            raw = framework.topology_raw(pod, info)
            if raw != tmpl.raw.get(name):
                tmpl.raw[name] = raw
                moved = True
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
            if raw != tmpl.raw[name]:
                tmpl.raw[name] = raw
                moved = True
        for name in back:
            live[name] = -1  # pushed below
        if moved:
            names = list(live)
            norm = framework.topology_scores(pod, [tmpl.raw[n] for n in names])
            tmpl.heap.clear()
            for name, score in zip(names, norm, strict=True):
                tmpl.norm[name] = score
                self._seq += 1
                total = tmpl.static[name] + tmpl.dynamic[name] + score
                tmpl.heap.append((-total, self._seq, name))
                live[name] = self._seq
            heapq.heapify(tmpl.heap)
            return
        for name in (full & live.keys()) | set(back):  # only their own part of the score moved
            self._push(tmpl, name, tmpl.static[name] + tmpl.dynamic[name] + tmpl.norm[name])

    @staticmethod
    def _index_domains(tmpl: _Template, infos: dict[str, NodeInfo]) -> None:
        """The cached candidates by domain of the shape's keys."""
        assert tmpl.shape is not None
        by_domain: dict[tuple[str, str], set[str]] = {}
        tmpl.by_domain = by_domain
        for name in [*tmpl.live, *tmpl.parked]:
            info = infos.get(name)
            if info is None:
                continue
            for key in tmpl.shape[0]:
                value = info.labels.get(key)
                if value is not None:
                    by_domain.setdefault((key, value), set()).add(name)

    def _since_no_fit(self, pod: PodInfo, snapshot: Snapshot, tmpl: _Template) -> None:
        """If an earlier unit's pod of this template found no node, scan only what changed."""
        known = self._no_fit.get(pod.template_key)
        if known is None or known.snapshot != snapshot.token:
            return
        changed = snapshot.changed_since(known.version)
        if changed is None:
            return
        infos = snapshot.infos
        tmpl.changed = [[infos[n] for n in sorted(changed) if n in infos]]
        tmpl.known = known

    def _remember_no_fit(self, pod: PodInfo, snapshot: Snapshot, tmpl: _Template) -> None:
        """Record that no node fits the template now; the verdict of the full scan is kept when
        only changed nodes were scanned (their diagnosis alone would not describe the cluster)."""
        known = tmpl.known
        if known is not None:
            tmpl.failure = known.failure
            tmpl.diagnosis = known.diagnosis
            tmpl.unresolvable = tmpl.unresolvable and known.unresolvable
        if len(self._no_fit) >= _MAX_NO_FIT:  # many distinct failing templates: start afresh
            self._no_fit.clear()
        self._no_fit[pod.template_key] = _NoFit(
            snapshot.token, snapshot.version, tmpl.failure, tmpl.unresolvable, tmpl.diagnosis
        )

    def _preempt(self, pod: PodInfo, run: _UnitRun, tmpl: _Template) -> bool:
        """The PostFilter for a pod the filters placed nowhere: True when it is assumed on a node
        with its victims taken off; else its reason is in ``run.unplaced``."""
        unplaced, diagnosed = run.unplaced, run.result.diagnoses
        if self.preemption is None or not pod.can_preempt:
            unplaced[pod.name] = tmpl.failure
            _diagnosed(diagnosed, pod.name, tmpl.diagnosis)
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
                tmpl.preemption_diagnosis = replace(tmpl.diagnosis, note=self.preemption.why)
            unplaced[pod.name] = tmpl.preemption_failure
            _diagnosed(diagnosed, pod.name, tmpl.preemption_diagnosis)
            return False
        req = take(run.snapshot, pod.req, place)
        if req.numa_nodes:
            run.numa[pod.name] = req.numa_nodes
        run.preempted[pod.name] = place
        return True

    @staticmethod
    def _assume(
        pod: PodInfo, snapshot: Snapshot, node: str, numa: dict[str, tuple[int, ...]]
    ) -> None:
        """Assume ``pod`` on ``node``, a NUMA-bound pod holding the NUMA nodes chosen for it
        there, so the unit's later pods see them taken."""
        req = pin_numa(snapshot.infos[node], pod.req)
        if req.numa_nodes:
            numa[pod.name] = req.numa_nodes
        snapshot.assume(req, node)

    # -- pod level ---------------------------------------------------------------------------

    def _take(
        self, tmpl: _Template, pod: PodInfo, snapshot: Snapshot, changed: set[str]
    ) -> str | None:
        """The best cached candidate; one among ``changed`` is taken only if it still fits."""
        while tmpl.heap:
            _, seq, node = heapq.heappop(tmpl.heap)
            if tmpl.live.get(node) != seq:
                continue  # superseded by a later entry, or dropped
            del tmpl.live[node]
            if node not in changed or self.framework.run_filters(pod, snapshot.infos[node]) is None:
                tmpl.budget -= 1
                return node
        return None

    def _take_recommended(
        self,
        pod: PodInfo,
        snapshot: Snapshot,
        preferred: dict[str, list[str]],
        within: set[str] | None,
    ) -> tuple[str, str] | None:
        """The first recommended node that fits ``pod`` (filters only, as Gödel's preferred
        nodes are tried) and lies ``within`` the unit's node group, if it has one; consuming
        one of its recommendations."""
        for node, tags in preferred.items():
            if within is not None and node not in within:
                continue
            info = snapshot.infos.get(node)
            if info is not None and self.framework.run_filters(pod, info) is None:
                tag = tags.pop(0)
                if not tags:
                    del preferred[node]
                return node, tag
        return None

    def _push(self, tmpl: _Template, node: str, score: int) -> None:
        self._seq += 1
        heapq.heappush(tmpl.heap, (-score, self._seq, node))
        tmpl.live[node] = self._seq

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
            self._scored_topology(pod, feasible, tmpl, snapshot)
            return
        static, dynamic = self.framework.score_parts(pod, feasible)
        for info, s, d in zip(feasible, static, dynamic, strict=True):
            tmpl.static[info.name] = s
            self._push(tmpl, info.name, s + d)
        tmpl.budget = len(feasible)

    def _scored_topology(
        self, pod: PodInfo, feasible: list[NodeInfo], tmpl: _Template, snapshot: Snapshot
    ) -> None:
        """A topology template's fresh candidates: scores kept in parts (node-only normalized,
        per-node dynamic, topology raw and normalized) so ``_refresh`` can redo the moving ones."""
        framework = self.framework
        static, dynamic = framework.score_parts(pod, feasible, topology_apart=True)
        raws = [framework.topology_raw(pod, info) for info in feasible]
        norm = framework.topology_scores(pod, raws)
        tmpl.heap.clear()
        tmpl.live.clear()
        tmpl.parked.clear()
        tmpl.static.clear()
        tmpl.dynamic.clear()
        tmpl.raw.clear()
        tmpl.norm.clear()
        for info, s, d, r, t in zip(feasible, static, dynamic, raws, norm, strict=True):
            name = info.name
            tmpl.static[name], tmpl.dynamic[name], tmpl.raw[name], tmpl.norm[name] = s, d, r, t
            self._push(tmpl, name, s + d + t)
        tmpl.budget = len(feasible)
        self._index_domains(tmpl, snapshot.infos)


def _diagnosed(diagnosed: dict[str, Diagnosis], pod: str, diagnosis: Diagnosis | None) -> None:
    if diagnosis is not None:
        diagnosed[pod] = diagnosis
