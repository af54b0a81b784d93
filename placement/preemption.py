"""Preemption: who may preempt, who may be a victim, the fewest victims on one node, the order of
candidate nodes, and a quick check that skips nodes where preemption cannot help.

Gödel's semantics (reference/godel-scheduler.md §3.2), as plain synchronous functions over
integers: they run per candidate node, inside a scheduling cycle.

How a caller uses it for one pod::

    if preemptor_refusal(info) is not None:
        ...  # stays pending (preemptionPolicy Never)
    totals = LowerPriorityTotals()  # long-lived: per node, rebuilt only when the node changed
    candidates = []
    for node in nodes_that_failed_for_resolvable_reasons:
        if not could_fit_after_preemption(info, node, totals):
            continue  # hopeless: no pod-by-pod search
        possible = possible_victims(info, pods_on(node), now_ms, claimed)
        victims = select_victims(info, node, possible, fits, budget_violations)
        if victims is not None:
            candidates.append(Candidate(node.name, victims))
    best = order_candidates(candidates)[0]

**Gangs** (several pods of one unit) are placed one pod after the other against the cycle's
snapshot: once a pod's candidate is chosen, the caller removes that node's victims from the
snapshot's NodeInfo (``Snapshot.forget``) and adds the preemptor (``Snapshot.assume``), so the
unit's later pods see the freed and the taken capacity. It passes the victims already chosen in
``claimed`` so no victim is taken twice, and a ``budget_violations`` that counts them with each
node's own, so the unit as a whole keeps every budget. All-or-nothing is the caller's job: if
fewer than ``min_member`` pods find a place, it forgets every placement of the unit (and re-adds
the victims) and nothing is proposed.
"""

from __future__ import annotations

import functools
import sys
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, Protocol

from foundation.frozen import positional_maker
from placement import gpu
from placement.claims import CLAIM_PHASES
from placement.framework.interface import PodInfo
from placement.nodeinfo import (
    NodeInfo,
    PodRequest,
    RequestPart,
    port_conflict,
    request_part,
    resource_fit_failures,
)
from protos.godel.v1 import objects_pb2 as pb

# Why a pod may not preempt at all.
NEVER_PREEMPTS = "preemptionPolicy Never: it may evict no other pod"

# Why a pod is not a possible victim (short, for `godel explain`).
NOT_BOUND = "not bound or running"
OTHER_POOL = "in the other pool"
NOT_LOWER_PRIORITY = "priority not lower than the preemptor's"
NOT_PREEMPTIBLE = "not preemptible"
PROTECTED = "within its protection window"
CLAIMED = "claimed by another preemptor"

# Why a node has no victim set.
NO_ROOM = "does not fit even with every possible victim gone"
BUDGET_BLOCKS = "a disruption budget blocks it"

# Added to each victim's priority in the priority sum (Gödel's MinPrioritySum), so a negative
# priority never makes more victims look cheaper than fewer.
PRIORITY_SUM_OFFSET = 1 << 31

FitFn = Callable[[PodInfo, NodeInfo], bool]
# Victim pod names -> the names of the budgets their eviction together would break ([] = none).
BudgetFn = Callable[[Sequence[str]], list[str]]

# A time after every real one: "protected until further notice", "started last".
_NEVER_ENDS = (1 << 63) - 1


# ---------------------------------------------------------------------------------------------
# Eligibility
# ---------------------------------------------------------------------------------------------


def policy_allows_preemption(policy: int) -> bool:
    """The one home of the rule: a pod may evict others when it does not fit unless its
    ``preemptionPolicy`` (copied from its job) is Never; unset means PreemptLowerPriority."""
    return policy != pb.NEVER


def can_preempt(pod: pb.Pod) -> bool:
    """Whether ``pod`` may evict others when it does not fit."""
    return policy_allows_preemption(pod.spec.preemption_policy)


def preemptor_refusal(preemptor: PodInfo) -> str | None:
    """None if ``preemptor`` may evict others; else why not, naming the rule (the shard's
    PostFilter skips such a pod; the Binder refuses a decision that gives it victims)."""
    if policy_allows_preemption(preemptor.preemption_policy):
        return None
    return f"pod {preemptor.name!r} has {NEVER_PREEMPTS}"


def protected_until_ms(pod: pb.Pod) -> int:
    """Until when ``pod`` cannot be a victim (0: never protected).

    A pod with a protection window that has not started yet (bound, its process not running) is
    protected: its window starts when it starts, as Gödel's NewlyStartedProtectionChecker rejects
    a victim without a start time when the window is set. Without a window it is a fair victim
    as soon as it is bound.
    """
    seconds = pod.spec.protection_seconds
    if seconds <= 0:
        return 0
    started = pod.status.started_ms
    if not started:
        return _NEVER_ENDS
    return started + seconds * 1000


def victim_reason(
    preemptor: PodInfo, candidate: pb.Pod, now_ms: int, claimed: Set[str]
) -> str | None:
    """None if ``candidate`` may be evicted for ``preemptor``; else why not.

    ``claimed``: pods other preemptors already claimed (the Binder's claims, and victims this
    cycle already chose for other pods). A pod claimed by this very preemptor (``preempted_by``
    its name, e.g. on a retry) stays a possible victim.
    """
    if candidate.status.phase not in CLAIM_PHASES:
        return NOT_BOUND
    return candidate_reason(preemptor, VictimCandidate.from_pod(candidate), now_ms, claimed)


def candidate_reason(
    preemptor: PodInfo, c: VictimCandidate, now_ms: int, claimed: Set[str]
) -> str | None:
    """:func:`victim_reason` on the compact record of a pod known to be bound or running (what
    the shard's cache keeps per bound pod)."""
    if c.req.pool != preemptor.req.pool:
        return OTHER_POOL
    if c.priority >= preemptor.priority:
        return NOT_LOWER_PRIORITY
    if not c.preemptible:
        return NOT_PREEMPTIBLE
    if c.protected_until_ms > now_ms:
        return PROTECTED
    if c.name in claimed or (c.preempted_by and c.preempted_by != preemptor.name):
        return CLAIMED
    return None


NO_LABELS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class VictimCandidate:
    """A possible victim as the victim search reads it: a bound pod's compact record (no
    protobuf), kept per bound pod by the shard's cache. ``name`` is ``req.name``."""

    name: str
    job: str
    priority: int
    started_ms: int  # 0: not started yet
    req: PodRequest
    preemptible: bool = True
    protected_until_ms: int = 0  # see protected_until_ms()
    preempted_by: str = ""
    # The node it is bound to, one string per node ("" where the holder knows it otherwise):
    # the shard's cache keeps the record alone per bound pod, not a (node, record) pair.
    node: str = ""
    # Its template's labels, one mapping shared by every pod with the same ones: what a
    # label-selector disruption budget reads (a shard keeps no bytes of its bound pods).
    labels: Mapping[str, str] = field(default_factory=lambda: NO_LABELS)

    @classmethod
    def from_pod(
        cls,
        pod: pb.Pod,
        held: VictimCandidate | None = None,
        request: PodRequest | None = None,
        node: str = "",
    ) -> VictimCandidate:
        """``held``: the pod's record while it stayed on the same node, whose request (and so
        job, name and node) still stands; only what a later state changes is read again.
        ``request``: the pod's request as its node already accounts it (an assumed placement
        now bound), shared rather than read again. ``node``: the record's node."""
        if held is not None:
            return cls(
                held.name,
                held.job,
                held.priority,
                pod.status.started_ms,
                held.req,
                held.preemptible,
                protected_until_ms(pod),
                pod.status.preempted_by,
                held.node,
                held.labels,
            )
        return cls.from_parts(pod.metadata, pod.spec, pod.status, request, node)

    def started_at(self, started_ms: int) -> VictimCandidate | None:
        """This record once its pod started at ``started_ms``, nothing else changed (a start
        the change feed hints, ``store.ops.POD_STARTED``); None where its protection window
        runs from the start (the record does not keep the window: the pod is read instead)."""
        if self.protected_until_ms:
            return None
        return _make_candidate(
            self.name,
            self.job,
            self.priority,
            started_ms,
            self.req,
            self.preemptible,
            0,
            self.preempted_by,
            self.node,
            self.labels,
        )

    @classmethod
    def from_parts(
        cls,
        meta: pb.ObjectMeta,
        spec: pb.PodSpec,
        status: pb.PodStatus,
        request: PodRequest | None = None,
        node: str = "",
        part: TemplatePart | None = None,
    ) -> VictimCandidate:
        """``from_pod`` (no ``held``) of the pod with these parts, for a caller that read them
        already. Each read once, protected_until_ms's rule on them, and the record made without
        the frozen dataclass's __init__ (``_make_candidate``): every bound pod comes through
        here when a shard (re)starts. ``part``: what the pod's template decides, read once per
        distinct template (``TemplateParts``); the template is then not read here at all."""
        if part is None:
            labels = spec.template.labels
            template_labels = shared_labels(labels) if labels else NO_LABELS
            req = PodRequest.from_parts(meta, spec) if request is None else request
        else:
            request_part, template_labels = part
            req = (
                PodRequest.from_parts(meta, spec, None, request_part)
                if request is None
                else request
            )
        started = status.started_ms
        seconds = spec.protection_seconds
        return _make_candidate(
            req.name,
            sys.intern(spec.job),  # shared by the job's pods
            spec.priority,
            started,
            req,
            spec.preemptible,
            0 if seconds <= 0 else started + seconds * 1000 if started else _NEVER_ENDS,
            status.preempted_by,
            node,
            template_labels,
        )


class TemplatePart(NamedTuple):
    """What a bound pod's record takes from its template and QoS alone: its request's part
    (``placement.nodeinfo.RequestPart``) and the template's labels a budget reads."""

    request: RequestPart
    labels: Mapping[str, str]


class TemplateParts:
    """Each distinct pod template's ``TemplatePart``, read once: a shard (re)starting makes a
    record of every bound pod, and at the paper's scale a million pods carry a few thousand
    templates (one a job). Keyed by the template's encoded bytes and the QoS — everything the
    part is read from — so two pods share a part only if their templates are equal to the last
    field (the same template encoded in another field order only costs a second entry). At most
    ``limit`` templates are kept; past that the cache starts over (pods that each carry a
    template of their own gain nothing here, and must not make it grow without end)."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._parts: dict[tuple[bytes, int], TemplatePart] = {}

    def __len__(self) -> int:
        return len(self._parts)

    def of(self, spec: pb.PodSpec) -> TemplatePart:
        """The part of the pod with this spec (its template and QoS)."""
        tpl, qos = spec.template, spec.qos
        key = (tpl.SerializeToString(), qos)
        part = self._parts.get(key)
        if part is None:
            if len(self._parts) >= self._limit:
                self._parts.clear()
            labels = tpl.labels
            part = self._parts[key] = TemplatePart(
                request_part(tpl, qos), shared_labels(labels) if labels else NO_LABELS
            )
        return part


def shared_labels(labels: Mapping[str, str]) -> Mapping[str, str]:
    """A read-only copy of ``labels``, the same object for equal labels (a job's pods carry its
    template's: one mapping a job, not one a pod)."""
    return _labels_of(tuple(sorted(labels.items())))


@functools.lru_cache(maxsize=4096)
def _labels_of(items: tuple[tuple[str, str], ...]) -> Mapping[str, str]:
    return MappingProxyType(dict(items))


# A VictimCandidate from its fields in order, without the frozen __init__'s object.__setattr__
# per field (``foundation.frozen``): every bound pod of a shard's restart is made here.
_make_candidate = positional_maker(VictimCandidate)
assert VictimCandidate.__slots__ == (
    "name",
    "job",
    "priority",
    "started_ms",
    "req",
    "preemptible",
    "protected_until_ms",
    "preempted_by",
    "node",
    "labels",
), "VictimCandidate's fields moved: from_parts passes them in this order"


def possible_victims(
    preemptor: PodInfo, pods: Iterable[pb.Pod], now_ms: int, claimed: Set[str]
) -> list[VictimCandidate]:
    """The pods of ``pods`` (one node's) that ``preemptor`` may evict."""
    return [
        VictimCandidate.from_pod(p)
        for p in pods
        if victim_reason(preemptor, p, now_ms, claimed) is None
    ]


# ---------------------------------------------------------------------------------------------
# The fewest victims on one node
# ---------------------------------------------------------------------------------------------


def resources_fit(pod: PodInfo, node: NodeInfo) -> bool:
    """The default fit judgement: the pod's pool, pod slots, host ports and GPU cards."""
    return (
        not resource_fit_failures(node, pod.req)
        and not port_conflict(node, pod.req)
        and (not pod.req.requests.gpus or gpu.fit_failure(node, pod.req) is None)
    )


@dataclass(frozen=True, slots=True)
class VictimSearch:
    """The answer for one node: ``victims`` (most valuable first; [] = fits already), or None
    and ``reason`` when preemption on this node cannot place the pod."""

    victims: list[VictimCandidate] | None
    reason: str = ""
    budgets: tuple[str, ...] = ()  # the budgets a victim set would break, when they block it


def search_victims(
    preemptor: PodInfo,
    node: NodeInfo,
    candidates: Sequence[VictimCandidate],
    fits: FitFn | None = None,
    budget_violations: BudgetFn | None = None,
) -> VictimSearch:
    """The minimal victim set on ``node`` as Gödel and kube-scheduler find it, with the reason
    when there is none. ``node`` is not changed.

    ``fits`` judges whether the preemptor fits a node (e.g. the framework's filters), called on a
    clone of ``node`` as candidates are taken off and put back. None: the default,
    :func:`resources_fit`, computed on a few integers without a clone — or, for a preemptor
    asking GPUs, on a clone, so victims free cards, not only counts (a share needs one card
    with its milli freed, whole cards need that many cards freed wholly).

    Remove every candidate; if the preemptor still does not fit, no set helps. Otherwise re-add
    candidates from the most valuable down (higher priority first; at equal priority the
    earlier-started, and pods not started yet last), keeping each one the preemptor still fits
    beside: those left out are the victims, so they are the least valuable pods that make room.

    Budgets (``budget_violations``): candidates whose eviction would break a disruption budget
    are re-added first, so a set that breaks none is found whenever re-adding them leaves room
    (kube-scheduler's violating / non-violating split). A set that still breaks a budget is no
    answer (as Gödel's PDBChecker, and the Binder would refuse it): None with the budgets named.
    """
    if fits is None and preemptor.req.requests.gpus:
        fits = resources_fit
    trial: _Trial = _Room(node, preemptor.req) if fits is None else _Clone(node, preemptor, fits)
    if trial.fits():
        return VictimSearch([])
    present = [c for c in candidates if trial.remove(c)]
    if not trial.fits():
        return VictimSearch(None, NO_ROOM)
    order = sorted(present, key=_most_valuable_first)
    if budget_violations is not None:
        order = _budget_breakers_first(order, budget_violations)
    victims: list[VictimCandidate] = []
    for c in order:
        if not trial.keep(c):
            victims.append(c)
    if budget_violations is not None and victims:
        broken = budget_violations([v.name for v in victims])
        if broken:
            return VictimSearch(None, f"{BUDGET_BLOCKS}: {'; '.join(broken)}", tuple(broken))
    victims.sort(key=_most_valuable_first)
    return VictimSearch(victims)


def select_victims(
    preemptor: PodInfo,
    node: NodeInfo,
    candidates: Sequence[VictimCandidate],
    fits: FitFn | None = None,
    budget_violations: BudgetFn | None = None,
) -> list[VictimCandidate] | None:
    """:func:`search_victims` without the reason: the victims ([] = fits already), or None."""
    return search_victims(preemptor, node, candidates, fits, budget_violations).victims


def fits_without(preemptor: PodInfo, node: NodeInfo, candidates: Iterable[VictimCandidate]) -> bool:
    """Whether ``preemptor`` fits ``node`` once every one of ``candidates`` is gone, by the
    default judgement on integers: :func:`search_victims`' first question alone (for
    ``placement.preemption_blockers``, which asks it of pods that are not possible victims)."""
    trial = _Room(node, preemptor.req)
    for c in candidates:
        trial.remove(c)
    return trial.fits()


class _Trial(Protocol):
    """The node as the victim search changes it: candidates taken off, then put back one by one
    while the preemptor still fits."""

    def fits(self) -> bool: ...

    def remove(self, c: VictimCandidate) -> bool:
        """Take ``c`` off; False if it is not on the node."""
        ...

    def keep(self, c: VictimCandidate) -> bool:
        """Put ``c`` back if the preemptor still fits beside it; else leave it off (a victim)."""
        ...


class _Clone:
    """Any fit judgement (the caller's filters) on a clone of the node."""

    def __init__(self, node: NodeInfo, preemptor: PodInfo, fits: FitFn) -> None:
        self._node = node.clone()
        self._preemptor = preemptor
        self._fits = fits

    def fits(self) -> bool:
        return self._fits(self._preemptor, self._node)

    def remove(self, c: VictimCandidate) -> bool:
        return self._node.remove_pod(c.req.name) is not None

    def keep(self, c: VictimCandidate) -> bool:
        self._node.add_pod(c.req)
        if self._fits(self._preemptor, self._node):
            return True
        self._node.remove_pod(c.req.name)
        return False


class _Room:
    """The default judgement (:func:`resources_fit`) on a few integers, without cloning the node:
    what is free in the preemptor's pool, free pod slots, and how many of the preemptor's host
    ports are held. It answers as ``resources_fit`` on the changed node would (the victim tables
    run through both)."""

    def __init__(self, node: NodeInfo, req: PodRequest) -> None:
        self._req = req
        self._pods = node.pods
        self._taken: set[str] = set()
        self.cpu, self.mem, self.gpu = node.free(req.pool)
        self.slots = node.max_pods - len(node.pods)
        self._ports = frozenset(req.host_ports)
        self.held = len(self._ports & node.used_ports)

    def fits(self) -> bool:
        q = self._req.requests
        return (
            self.slots >= 1
            and not self.held
            and (not q.cpu or q.cpu <= self.cpu)
            and (not q.mem or q.mem <= self.mem)
            and (not q.gpus or q.gpus <= self.gpu)
        )

    def remove(self, c: VictimCandidate) -> bool:
        name = c.req.name
        on_node = self._pods.get(name)  # what the node holds for it, as a clone would drop
        if on_node is None or name in self._taken:
            return False
        self._taken.add(name)
        self.slots += 1
        if on_node.pool == self._req.pool:
            q = on_node.requests
            self.cpu += q.cpu
            self.mem += q.mem
            self.gpu += q.gpus
        if self._ports:
            self.held -= len(self._ports.intersection(on_node.host_ports))
        return True

    def keep(self, c: VictimCandidate) -> bool:
        # Called only while the preemptor fits, so only what ``c`` takes can break the fit.
        r, need = c.req, self._req
        if self.slots < 2 or (self._ports and not self._ports.isdisjoint(r.host_ports)):
            return False
        if r.pool == need.pool:
            q, want = r.requests, need.requests
            cpu, mem, gpu = self.cpu - q.cpu, self.mem - q.mem, self.gpu - q.gpus
            if (
                (want.cpu and want.cpu > cpu)
                or (want.mem and want.mem > mem)
                or (want.gpus and want.gpus > gpu)
            ):
                return False
            self.cpu, self.mem, self.gpu = cpu, mem, gpu
        self.slots -= 1
        return True


def _most_valuable_first(c: VictimCandidate) -> tuple[int, int, str]:
    # A pod not started yet has lost no work: the least valuable of its priority.
    return -c.priority, c.started_ms or _NEVER_ENDS, c.name


def _budget_breakers_first(
    order: list[VictimCandidate], budget_violations: BudgetFn
) -> list[VictimCandidate]:
    """``order`` (most valuable first) with the candidates whose eviction would break a budget
    moved to the front. Taken as the search takes victims, least valuable first, a candidate
    breaks a budget when evicting it with the non-breaking ones before it would."""
    allowed: list[str] = []
    breakers: list[VictimCandidate] = []
    others: list[VictimCandidate] = []
    for c in reversed(order):
        if budget_violations([*allowed, c.name]):
            breakers.append(c)
        else:
            allowed.append(c.name)
            others.append(c)
    return breakers[::-1] + others[::-1]


# ---------------------------------------------------------------------------------------------
# Quick check: skip hopeless nodes without looking at their pods one by one
# ---------------------------------------------------------------------------------------------

# (milli-CPU, memory bytes, GPUs, pod count)
Totals = tuple[int, int, int, int]
_ZERO: Totals = (0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class _PoolTotals:
    priorities: list[int]  # ascending, distinct
    # below[i]: what the pods of priorities[:i] hold together; below[len(priorities)]: all.
    below: list[Totals]

    def lower_than(self, priority: int) -> Totals:
        return self.below[bisect_left(self.priorities, priority)]


def _pool_totals(reqs: Iterable[PodRequest]) -> _PoolTotals:
    per: dict[int, list[int]] = {}
    for r in reqs:
        t = per.setdefault(r.priority, [0, 0, 0, 0])
        q = r.requests
        t[0] += q.cpu
        t[1] += q.mem
        t[2] += q.gpus
        t[3] += 1
    priorities = sorted(per)
    below = [_ZERO]
    cpu = mem = gpu = count = 0
    for p in priorities:
        t = per[p]
        cpu, mem, gpu, count = cpu + t[0], mem + t[1], gpu + t[2], count + t[3]
        below.append((cpu, mem, gpu, count))
    return _PoolTotals(priorities, below)


class LowerPriorityTotals:
    """Per node and pool, what the pods below each priority hold, for the quick check.

    Kept beside NodeInfo, not in it: maintaining it in ``NodeInfo.add_pod``/``remove_pod`` (the
    scheduler's hot path) nearly doubled their cost. Instead a node's totals are computed from its
    pods when first asked and reused while the node is unchanged: the same NodeInfo object at the
    same generation (a snapshot clone that later diverges is another object). During a preemption
    storm most nodes do not change between pods, so the check is a lookup and a bisect.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[NodeInfo, int, dict[str, _PoolTotals]]] = {}

    def lower_than(self, node: NodeInfo, pool: str, priority: int) -> Totals:
        """What ``node``'s pods of ``pool`` with priority below ``priority`` hold together."""
        entry = self._nodes.get(node.name)
        if entry is None or entry[0] is not node or entry[1] != node.generation:
            pools = {
                p: _pool_totals(r for r in node.pods.values() if r.pool == p) for p in node.capacity
            }
            entry = self._nodes[node.name] = (node, node.generation, pools)
        pool_totals = entry[2].get(pool)
        return pool_totals.lower_than(priority) if pool_totals else _ZERO

    def forget(self, node: str) -> None:
        """Drop a node that left the cluster."""
        self._nodes.pop(node, None)


def could_fit_after_preemption(
    preemptor: PodInfo, node: NodeInfo, totals: LowerPriorityTotals | None = None
) -> bool:
    """Whether evicting every lower-priority pod of the preemptor's pool could make room: free
    capacity plus their requests covers the request (cpu, memory, GPUs, a pod slot).

    A necessary condition only (it ignores preemptibility, protection, claims, ports and the
    other filters): False means no victim set on this node can help, True means search it.
    Pass a long-lived ``totals`` so an unchanged node is not summed pod by pod again.
    """
    req = preemptor.req
    lower = (totals or LowerPriorityTotals()).lower_than(node, req.pool, preemptor.priority)
    free_cpu, free_mem, free_gpu = node.free(req.pool)
    q = req.requests
    return (
        node.max_pods - len(node.pods) + lower[3] >= 1
        and (not q.cpu or q.cpu <= free_cpu + lower[0])
        and (not q.mem or q.mem <= free_mem + lower[1])
        and (not q.gpus or q.gpus <= free_gpu + lower[2])
    )


# ---------------------------------------------------------------------------------------------
# Candidate nodes and their order
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Candidate:
    node: str
    victims: list[VictimCandidate]


def order_candidates(cands: Iterable[Candidate]) -> list[Candidate]:
    """Best first, as Gödel sorts them: a node needing no victims; then the lowest highest-victim
    priority; the lowest priority sum; the fewest victims; the latest earliest start time among
    the highest-priority victims (kube-scheduler's rule: the least work lost; a node whose
    victims have a start time beats one whose have none); then the node name, so the order is
    deterministic."""
    return sorted(cands, key=_candidate_key)


def _candidate_key(c: Candidate) -> tuple[int, int, int, int, int, int, str]:
    victims = c.victims
    if not victims:
        return 0, 0, 0, 0, 0, 0, c.node
    highest = max(v.priority for v in victims)
    priority_sum = sum(v.priority + PRIORITY_SUM_OFFSET for v in victims)
    starts = [v.started_ms for v in victims if v.priority == highest and v.started_ms]
    no_start, latest_first = (0, -min(starts)) if starts else (1, 0)
    return 1, highest, priority_sum, len(victims), no_start, latest_first, c.node
