"""The PostFilter step of the unit search: preemption for a pod no node fits as things stand.

Gödel's scheduler-side preemption (reference/godel-scheduler.md §3.2) over the cycle's snapshot,
with the pure pieces of ``placement.preemption``. For one pod:

0. When no bound pod has a priority below the pod's (``VictimSource.lowest_bound_priority``),
   no node can hold a victim: the search is skipped and every node tallied as step 4 does,
   from its totals and bound count (``_no_victim_anywhere``). A storm of pods that fit nowhere
   at equal priority, as a full GPU cluster makes, walked every node's pods per pod for nothing.
1. Nodes in the search's scan order from a rotating offset (so a storm of preemptors spreads
   over the cluster instead of re-examining the same full nodes), skipping the nodes where
   preemption cannot help: the quick check (free room plus the lower-priority pods of the pool,
   on integers), then the filters other than the resource and port fits — a node failing one
   of those for a reason preemption cannot resolve (taints, affinity, cordon) is skipped.
2. On the rest, the possible victims (``candidate_reason`` over the compact records the shard's
   cache keeps) and the fewest of them (``search_victims``), preferring sets that break no
   disruption budget and refusing sets that do.
3. The search stops at ``candidates`` nodes with a victim set (not all 5,000 nodes pod by pod);
   ``order_candidates`` picks the best of them.
4. When no node has a victim set, the nodes that failed (the quick check, or no victim set)
   are tallied under why (``placement.preemption_blockers``): what `godel explain` tells a
   user. While searching, a failed node is only noted in a list; a search that finds a place
   judges none of them.

The caller assumes the preemptor there with its victims taken off (``take``), so the unit's later
pods see the room taken and freed, and undoes it (``undo``) when the unit fails as a whole.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from typing import Protocol

from placement.framework import Code, Framework, PodInfo
from placement.gpu import pin_cards
from placement.nodeinfo import NodeInfo, PodRequest
from placement.plugins.numatopology import pin_numa
from placement.preemption import (
    NO_ROOM,
    BudgetFn,
    Candidate,
    FitFn,
    LowerPriorityTotals,
    VictimCandidate,
    candidate_reason,
    could_fit_after_preemption,
    order_candidates,
    search_victims,
)
from placement.preemption_blockers import (
    NodeBlocker,
    PreemptionTally,
    node_blocker,
    preemption_sentence,
    quick_check_blocker,
)
from placement.scan import rotated
from placement.snapshot import Snapshot

# Filters whose failures the default victim search models on integers; any other resolvable
# failure makes the search re-run every filter on a clone of the node.
_RESOURCE_FILTERS = frozenset({"NodeResourcesFit", "NodePorts"})
NO_VICTIMS = "no node where preemption helps"


class VictimSource(Protocol):
    """What the victim search reads beyond the snapshot (the shard's cache and budgets)."""

    def running(self, pod: str) -> VictimCandidate | None:
        """A bound pod's record; None for a pod not bound (e.g. assumed by this shard)."""
        ...

    def bound_on(self, node: str) -> int:
        """How many bound pods ``node`` holds (the records ``running`` answers for)."""
        ...

    def lowest_bound_priority(self) -> int | None:
        """The lowest priority among the bound pods (None: none is bound)."""
        ...

    @property
    def claimed(self) -> Set[str]:
        """Victims claimed by this shard's preemptors in flight."""
        ...

    def budget_violations(self, victims: Sequence[str]) -> list[str]:
        """The names of the budgets that evicting all of ``victims`` together would break
        ([] = none)."""
        ...


@dataclass(slots=True)
class _Failed:
    """The nodes one search found no victim set on, noted for the tally should it find none."""

    skipped: list[NodeInfo] = field(default_factory=list)  # by the quick check
    no_room: list[NodeInfo] = field(default_factory=list)  # even every possible victim gone
    budgets: list[tuple[str, ...]] = field(default_factory=list)  # per node, the budgets


@dataclass(slots=True)
class Preempted:
    """A preemptor's place: its node and its victims (most valuable first)."""

    node: str
    victims: list[VictimCandidate] = field(default_factory=list)


class Preemption:
    def __init__(self, framework: Framework, source: VictimSource, candidates: int = 5) -> None:
        self.framework = framework
        self.source = source
        self.candidates = max(1, candidates)
        self.totals = LowerPriorityTotals()
        self._others = [
            f
            for name, f in zip(framework.filter_names, framework.filters, strict=True)
            if name not in _RESOURCE_FILTERS
        ]
        self._offset = 0
        self.examined = 0  # nodes looked at (metrics, tests)
        # Why the last find() found nothing: per node, as data (`godel explain` renders it),
        # and the sentence for the pod's condition.
        self.blocked = PreemptionTally()
        self.why = ""

    def find(
        self,
        pod: PodInfo,
        segments: Sequence[Sequence[NodeInfo]],
        now_ms: int,
        chosen: Set[str] = frozenset(),
    ) -> Preempted | None:
        """The best node and victims for ``pod``, or None. ``chosen``: victims earlier pods of
        the same unit already took (they count against the budgets with this pod's)."""
        lowest = self.source.lowest_bound_priority()
        if lowest is None or lowest >= pod.priority:
            self._no_victim_anywhere(pod, segments, now_ms)
            return None
        claimed = self.source.claimed
        budgets = self._budget_fn(chosen)
        found: list[Candidate] = []
        failed = _Failed()
        for seg in segments:
            for node in rotated(seg, self._offset):
                self.examined += 1
                self._offset += 1
                victims = self._victims_on(pod, node, now_ms, claimed, chosen, budgets, failed)
                if victims is not None:
                    found.append(Candidate(node.name, victims))
                    if len(found) >= self.candidates or not victims:
                        break
            if len(found) >= self.candidates or (found and not found[-1].victims):
                break
        if not found:
            self.blocked = tally = self._tally(pod, failed, now_ms, claimed, chosen)
            self.why = preemption_sentence(
                tally.reasons(),
                priority=pod.priority,
                protection_ends_ms=tally.stored_protection_end(),
                now_ms=now_ms,
            )
            if not self.why:  # no node the search could judge (none left to examine)
                self.why = f"preemption: {NO_VICTIMS}"
            return None
        best = order_candidates(found)[0]
        return Preempted(best.node, best.victims)

    def _no_victim_anywhere(
        self, pod: PodInfo, segments: Sequence[Sequence[NodeInfo]], now_ms: int
    ) -> None:
        """The fast path: no bound pod is below ``pod``'s priority, so no node holds a possible
        victim, and the search would walk every node and its pods to find none (a storm of
        pods that fit nowhere at equal priority did, pod after pod). Each node is tallied as a
        node the quick check ruled out is (``quick_check_blocker``: from its totals and bound
        count, its pods read only when some are not bound), except a node that would have room
        as it is and fails a filter no eviction can change (the search skips it too). Where the
        search would have looked for victims (room as it is, by the integers) and named the
        smallest group of pods in the way, this names priority: it holds for every pod there."""
        totals, bound_on = self.totals, self.source.bound_on
        tally = PreemptionTally()
        for seg in segments:
            for node in seg:
                if could_fit_after_preemption(pod, node, totals) and self._unresolvable(pod, node):
                    continue
                records = functools.partial(self._records, node, frozenset())
                reason = quick_check_blocker(pod, node, totals, bound_on(node.name), records)
                tally.add(NodeBlocker(reason))
            self.examined += len(seg)
        self.blocked = tally
        self.why = (
            preemption_sentence(
                tally.reasons(), priority=pod.priority, protection_ends_ms=0, now_ms=now_ms
            )
            or f"preemption: {NO_VICTIMS}"
        )

    def _unresolvable(self, pod: PodInfo, node: NodeInfo) -> bool:
        """Whether a filter other than the resource fits turns ``pod`` away for good."""
        for f in self._others:
            status = f(pod, node)
            if status is not None:
                return status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        return False

    def _victims_on(
        self,
        pod: PodInfo,
        node: NodeInfo,
        now_ms: int,
        claimed: Set[str],
        chosen: Set[str],
        budgets: BudgetFn | None,
        failed: _Failed,
    ) -> list[VictimCandidate] | None:
        if not could_fit_after_preemption(pod, node, self.totals):
            failed.skipped.append(node)
            return None
        fits: FitFn | None = None
        for f in self._others:
            status = f(pod, node)
            if status is not None:
                if status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                    return None
                fits = self._all_filters  # a resolvable failure the integers do not model
                break
        possible = []
        for name in node.pods:
            c = self.source.running(name)
            if c is None or name in chosen:
                continue
            if candidate_reason(pod, c, now_ms, claimed) is None:
                possible.append(c)
        search = search_victims(pod, node, possible, fits, budgets)
        if search.victims is None:
            if search.budgets:
                failed.budgets.append(search.budgets)
            elif search.reason == NO_ROOM:
                failed.no_room.append(node)
        return search.victims

    def _tally(
        self, pod: PodInfo, failed: _Failed, now_ms: int, claimed: Set[str], chosen: Set[str]
    ) -> PreemptionTally:
        """Why each node ``failed`` notes could not help (the snapshot is as it was searched)."""
        tally = PreemptionTally()
        # A victim an earlier pod chose is off its node in the snapshot, yet still bound: the
        # node's bound count no longer tells whether all its pods are bound.
        bound_on = self.source.bound_on if not chosen else _unknown_bound
        for node in failed.skipped:
            reason = quick_check_blocker(
                pod,
                node,
                self.totals,
                bound_on(node.name),
                functools.partial(self._records, node, chosen),
            )
            tally.add(NodeBlocker(reason))
        for node in failed.no_room:
            tally.add(node_blocker(pod, node, self._records(node, chosen), now_ms, claimed))
        for names in failed.budgets:
            tally.add_budgets(names)
        return tally

    def _records(self, node: NodeInfo, chosen: Set[str]) -> list[VictimCandidate]:
        """The records of ``node``'s bound pods the search looks at (not those ``chosen``)."""
        running = self.source.running
        records = (running(name) for name in node.pods if name not in chosen)
        return [c for c in records if c is not None]

    def _all_filters(self, pod: PodInfo, node: NodeInfo) -> bool:
        return self.framework.run_filters(pod, node) is None

    def _budget_fn(self, chosen: Set[str]) -> BudgetFn:
        violations = self.source.budget_violations
        earlier = list(chosen)
        if not earlier:
            return violations
        return lambda names: violations([*earlier, *names])


def _unknown_bound(_node: str) -> int:
    """No bound count to trust: the blocker reads the node's records."""
    return -1


def take(snapshot: Snapshot, req: PodRequest, place: Preempted) -> PodRequest:
    """Assume ``req`` on its node with its victims taken off; returns the request as assumed
    (a NUMA-bound pod holding the NUMA nodes its victims left, a pod asking GPUs their cards)."""
    for v in place.victims:
        snapshot.forget(v.name, place.node)
    req = pin_cards(snapshot.infos[place.node], pin_numa(snapshot.infos[place.node], req))
    snapshot.assume(req, place.node)
    return req


def undo(snapshot: Snapshot, pod: str, place: Preempted) -> None:
    """Reverse :func:`take`."""
    snapshot.forget(pod, place.node)
    for v in place.victims:
        snapshot.assume(v.req, place.node)
