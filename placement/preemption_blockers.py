"""Why preemption cannot help a pod: per candidate node, what blocks every victim set there,
tallied over one victim search, and the sentence `godel explain` shows.

The victim search (``placement.postfilter.Preemption``) asks only about a node where it found no
victim set, so a search that succeeds pays nothing here. A node counts once, under one reason
(under each budget it names when several budgets block it):

- **budget <name>**: a victim set exists, but evicting it would break that disruption budget.
- Otherwise even every possible victim gone leaves no room. The node's pods that are not
  possible victims are grouped by why not (``placement.preemption.candidate_reason``):
  **not preemptible**, **protected** (within ``protectionSeconds``), **priority** (equal to the
  preemptor's or higher), **claimed** (another preemptor's victims). The node's reason is the
  group that, were its pods possible victims as well, would make room — the smallest such group
  when several would (the least a user has to change); when only several groups together
  would, the largest of them.
  Judged by the default resource fit on integers (``preemption.fits_without``), also
  where other filters decide the search.
- **no room**: none of the groups would help, even all together: the node is too small even with
  every pod of the pool gone, or what is in the way is in the other pool or not bound yet.

A node the quick check skips (``could_fit_after_preemption``: not even every lower-priority pod
gone makes room) is blocked by **priority** when evicting every bound pod of the pool would make
room, else **no room** (e.g. a gang's own members, assumed there but not bound, hold it). Nodes skipped for a failure no eviction
resolves (taints, affinity, cordon) are not counted: the filter reasons already explain them.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass, field

from placement.framework.interface import PodInfo
from placement.nodeinfo import NodeInfo
from placement.preemption import (
    CLAIMED,
    NOT_LOWER_PRIORITY,
    NOT_PREEMPTIBLE,
    PROTECTED,
    LowerPriorityTotals,
    VictimCandidate,
    candidate_reason,
    fits_without,
)
from protos.godel.v1 import objects_pb2 as pb

BLOCKED_NOT_PREEMPTIBLE = "not preemptible"
BLOCKED_PROTECTED = "protected"
BLOCKED_PRIORITY = "priority"
BLOCKED_CLAIMED = "claimed"
BLOCKED_NO_ROOM = "no room"
_BUDGET = "budget "

# candidate_reason's answer -> the node's reason; ties between groups go in this order.
_GROUPS = {
    NOT_PREEMPTIBLE: BLOCKED_NOT_PREEMPTIBLE,
    PROTECTED: BLOCKED_PROTECTED,
    NOT_LOWER_PRIORITY: BLOCKED_PRIORITY,
    CLAIMED: BLOCKED_CLAIMED,
}
_ORDER = list(_GROUPS.values())

# A protection window that has not started (the pod has not started): placement.preemption's.
_NOT_STARTED = (1 << 63) - 1
# Above every pod's priority (an int32): "whatever its priority".
_ABOVE_EVERY_PRIORITY = 1 << 31


def budget_reason(budget: str) -> str:
    """The reason a node counts under when ``budget`` blocks its victim set."""
    return _BUDGET + budget


@dataclass(frozen=True, slots=True)
class NodeBlocker:
    """Why one node has no victim set; ``protection_ends_ms``: for ``protected``, when the
    pods in the way there are all past their window (placement.preemption's far-future value
    when one has not started)."""

    reason: str
    protection_ends_ms: int = 0


def node_blocker(
    preemptor: PodInfo,
    node: NodeInfo,
    pods: Sequence[VictimCandidate],
    now_ms: int,
    claimed: Set[str],
) -> NodeBlocker:
    """Why ``node`` has no room for ``preemptor`` even with every possible victim gone (see the
    module's rule). ``pods``: the records of the node's bound pods the search looked at."""
    possible: list[VictimCandidate] = []
    groups: dict[str, list[VictimCandidate]] = {}
    for c in pods:
        why = candidate_reason(preemptor, c, now_ms, claimed)
        if why is None:
            possible.append(c)
        elif why in _GROUPS:
            groups.setdefault(_GROUPS[why], []).append(c)
    if not groups:
        return NodeBlocker(BLOCKED_NO_ROOM)
    helping = [
        reason for reason, group in groups.items() if _makes_room(preemptor, node, possible, group)
    ]
    if helping:
        reason = min(helping, key=lambda r: (len(groups[r]), _ORDER.index(r)))
    elif len(groups) > 1 and _makes_room(preemptor, node, possible, *groups.values()):
        reason = min(groups, key=lambda r: (-len(groups[r]), _ORDER.index(r)))
    else:
        return NodeBlocker(BLOCKED_NO_ROOM)
    if reason != BLOCKED_PROTECTED:
        return NodeBlocker(reason)
    return NodeBlocker(reason, max(c.protected_until_ms for c in groups[reason]))


def _makes_room(
    preemptor: PodInfo,
    node: NodeInfo,
    possible: list[VictimCandidate],
    *groups: list[VictimCandidate],
) -> bool:
    return fits_without(preemptor, node, itertools.chain(possible, *groups))


def room_without_every_pod(preemptor: PodInfo, node: NodeInfo, totals: LowerPriorityTotals) -> bool:
    """Whether ``node`` would have room for ``preemptor`` (cpu, memory, GPUs, a pod slot) were
    every pod of its pool gone, whatever its priority: from the totals, on integers."""
    req = preemptor.req
    everyone = totals.lower_than(node, req.pool, _ABOVE_EVERY_PRIORITY)
    free_cpu, free_mem, free_gpu = node.free(req.pool)
    q = req.requests
    return (
        node.max_pods - len(node.pods) + everyone[3] >= 1
        and (not q.cpu or q.cpu <= free_cpu + everyone[0])
        and (not q.mem or q.mem <= free_mem + everyone[1])
        and (not q.gpus or q.gpus <= free_gpu + everyone[2])
    )


def quick_check_blocker(
    preemptor: PodInfo,
    node: NodeInfo,
    totals: LowerPriorityTotals,
    bound: int,
    records: Callable[[], Sequence[VictimCandidate]],
) -> str:
    """Why a node the quick check skipped cannot help: ``priority`` when evicting every bound
    pod of the pool, whatever its priority, would make room; else ``no room``. Judged from the
    node's totals and ``bound`` (how many of its pods are bound) alone when not even every pod
    gone would do, or when every pod there is bound: the common case, as a storm of pods no
    node fits at equal priority has it, costs no walk of the node's pods. Only a node holding
    pods not bound yet (a unit's own members assumed there) reads ``records`` (its bound pods'
    records) to judge what the bound ones alone would free."""
    if not room_without_every_pod(preemptor, node, totals):
        return BLOCKED_NO_ROOM
    if bound == len(node.pods):  # every pod there is bound: the totals are theirs
        return BLOCKED_PRIORITY
    pods = records()
    if len(pods) == len(node.pods):
        return BLOCKED_PRIORITY
    # Pods not bound yet (a unit's own members assumed here) are no one's to evict.
    return BLOCKED_PRIORITY if fits_without(preemptor, node, pods) else BLOCKED_NO_ROOM


@dataclass(slots=True)
class PreemptionTally:
    """One search's count of nodes per reason, and the soonest protection end among the nodes
    protection blocks."""

    nodes: Counter[str] = field(default_factory=Counter)
    protection_ends_ms: int = 0  # 0: no node blocked by protection

    def add(self, blocker: NodeBlocker) -> None:
        self.nodes[blocker.reason] += 1
        if blocker.reason == BLOCKED_PROTECTED:
            ends = blocker.protection_ends_ms
            if not self.protection_ends_ms or ends < self.protection_ends_ms:
                self.protection_ends_ms = ends

    def add_budgets(self, budgets: Sequence[str]) -> None:
        for name in budgets:
            self.nodes[budget_reason(name)] += 1

    def reasons(self) -> tuple[tuple[str, int], ...]:
        """(reason, nodes), most nodes first, then by reason."""
        return tuple(sorted(self.nodes.items(), key=lambda kv: (-kv[1], kv[0])))

    def stored_protection_end(self) -> int:
        """``protection_ends_ms`` as ``SchedulingDiagnosis`` stores it (0: not started)."""
        ends = self.protection_ends_ms
        return 0 if ends == _NOT_STARTED else ends


# ---------------------------------------------------------------------------------------------
# The sentence
# ---------------------------------------------------------------------------------------------


def _nodes(n: int) -> str:
    return f"on {n} node{'' if n == 1 else 's'}"


def _protected_for(ends_ms: int, now_ms: int) -> str:
    if not ends_ms:
        return "are protected until they have run for their `protectionSeconds`"
    seconds = -(-(ends_ms - now_ms) // 1000)  # rounded up: never "0 more seconds" too early
    if seconds <= 0:
        return "were protected (`protectionSeconds`) until moments ago: the next attempt may do"
    return f"are protected for {seconds} more second{'' if seconds == 1 else 's'} (`protectionSeconds`)"


# What a pod whose preemptionPolicy is Never is told.
NEVER_SENTENCE = (
    "preemption cannot help: this pod's `preemptionPolicy` is Never (it evicts no other pod and "
    "waits for room)"
)


def _clause(reason: str, n: int, priority: int, protection_ends_ms: int, now_ms: int) -> str:
    where = _nodes(n)
    if reason == BLOCKED_NOT_PREEMPTIBLE:
        return (
            f"{where} the pods that would have to go are not preemptible (mark their job "
            "`preemptible: true` or set their queue's `preemptibleDefault`)"
        )
    if reason == BLOCKED_PROTECTED:
        return f"{where} they {_protected_for(protection_ends_ms, now_ms)}"
    if reason == BLOCKED_PRIORITY:
        return f"{where} they have equal or higher priority ({priority} or more)"
    if reason == BLOCKED_CLAIMED:
        return f"{where} they are already being evicted for other pods"
    if reason == BLOCKED_NO_ROOM:
        return (
            f"{where} evicting cannot make room (what holds it is not bound yet or in the other "
            "pool, or the node is too small)"
        )
    if reason.startswith(_BUDGET):
        return f"{where} budget {reason.removeprefix(_BUDGET)} allows no more evictions"
    return f"{where} {reason}"  # a reason a newer shard knows: as it is


def preemption_sentence(
    reasons: Iterable[tuple[str, int]], *, priority: int, protection_ends_ms: int, now_ms: int
) -> str:
    """Why preemption could not help, from a tally's (reason, nodes) pairs, most first ("" when
    there are none). ``priority``: the preemptor's; ``protection_ends_ms`` as stored (0: not
    started); ``now_ms``: the time to count protection's remaining seconds from."""
    clauses = [_clause(r, n, priority, protection_ends_ms, now_ms) for r, n in reasons]
    return "preemption cannot help: " + "; ".join(clauses) if clauses else ""


def explain_preemption(d: pb.SchedulingDiagnosis, now_ms: int) -> str:
    """:func:`preemption_sentence` of a stored diagnosis, or :data:`NEVER_SENTENCE`: what
    `godel explain` says of preemption ("" when the diagnosis says nothing of it)."""
    if d.preemption_never:
        return NEVER_SENTENCE
    return preemption_sentence(
        ((r.reason, r.nodes) for r in d.preemption_reasons),
        priority=d.priority,
        protection_ends_ms=d.protection_ends_ms,
        now_ms=now_ms,
    )
