"""Why preemption cannot help (placement/preemption_blockers.py), table by table: the reason a
node with no victim set counts under (each reason, the smallest group that would make room,
the largest when only several together would, no room), the quick check's judgement on
totals, the tally over nodes, and the sentence `godel explain` shows."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from placement.preemption import LowerPriorityTotals, VictimCandidate, could_fit_after_preemption
from placement.preemption_blockers import (
    BLOCKED_CLAIMED,
    BLOCKED_NO_ROOM,
    BLOCKED_NOT_PREEMPTIBLE,
    BLOCKED_PRIORITY,
    BLOCKED_PROTECTED,
    NEVER_SENTENCE,
    NodeBlocker,
    PreemptionTally,
    budget_reason,
    explain_preemption,
    node_blocker,
    preemption_sentence,
    quick_check_blocker,
)
from protos.godel.v1 import objects_pb2 as pb
from tests.test_preemption import NOW, P, node_with, preemptor

NOT_STARTED = (1 << 63) - 1  # placement.preemption's "protected until further notice"
STARTED = NOW - 1000


def records(pods: Sequence[P]) -> list[VictimCandidate]:
    return [VictimCandidate.from_pod(p.pod()) for p in pods]


# ---------------------------------------------------------------------------------------------
# One node's reason
# ---------------------------------------------------------------------------------------------

NODE_BLOCKERS = [
    # id, pods on a 4000m node, preemptor cpu, claimed, expected blocker
    ("not preemptible", [P("a-0", 10, cpu=4000, preemptible=False)], 1000, set(),
     NodeBlocker(BLOCKED_NOT_PREEMPTIBLE)),
    ("protected: until the window ends",
     [P("a-0", 10, cpu=4000, started_ms=STARTED, protection_seconds=60)], 1000, set(),
     NodeBlocker(BLOCKED_PROTECTED, STARTED + 60_000)),
    ("protected: the last of the pods in the way to come free",
     [P("a-0", 10, cpu=2000, started_ms=STARTED, protection_seconds=60),
      P("b-0", 10, cpu=2000, started_ms=STARTED, protection_seconds=90)], 4000, set(),
     NodeBlocker(BLOCKED_PROTECTED, STARTED + 90_000)),
    ("protected: not started yet",
     [P("a-0", 10, cpu=4000, phase=pb.POD_BOUND, started_ms=0, protection_seconds=60)], 1000,
     set(), NodeBlocker(BLOCKED_PROTECTED, NOT_STARTED)),
    ("equal or higher priority", [P("a-0", 100, cpu=2000), P("b-0", 200, cpu=2000)], 1000,
     set(), NodeBlocker(BLOCKED_PRIORITY)),
    ("claimed by another preemptor", [P("a-0", 10, cpu=4000)], 1000, {"a-0"},
     NodeBlocker(BLOCKED_CLAIMED)),
    ("the possible victims count: only the blocked rest is named",
     [P("low-0", 10, cpu=2000), P("np-0", 10, cpu=2000, preemptible=False)], 4000, set(),
     NodeBlocker(BLOCKED_NOT_PREEMPTIBLE)),
    ("several groups would each do: the smallest",
     [P("np-0", 10, cpu=2000, preemptible=False), P("hi-0", 200, cpu=1000),
      P("hi-1", 200, cpu=1000)], 2000, set(), NodeBlocker(BLOCKED_NOT_PREEMPTIBLE)),
    ("a group that would not do loses to a larger one that would",
     [P("np-0", 10, cpu=500, preemptible=False), P("hi-0", 200, cpu=1500),
      P("hi-1", 200, cpu=2000)], 3000, set(), NodeBlocker(BLOCKED_PRIORITY)),
    ("equal groups that would each do: in the order of the rule",
     [P("hi-0", 200, cpu=2000), P("np-0", 10, cpu=2000, preemptible=False)], 2000, set(),
     NodeBlocker(BLOCKED_NOT_PREEMPTIBLE)),
    ("only several groups together would do: the largest",
     [P("np-0", 10, cpu=2000, preemptible=False), P("hi-0", 200, cpu=1000),
      P("hi-1", 200, cpu=1000)], 4000, set(), NodeBlocker(BLOCKED_PRIORITY)),
    ("too small even empty: no room", [P("np-0", 10, cpu=4000, preemptible=False)], 8000, set(),
     NodeBlocker(BLOCKED_NO_ROOM)),
    ("only the other pool's pods: no room",
     [P("be-0", 10, cpu=1000, qos=pb.QOS_BEST_EFFORT)], 8000, set(),
     NodeBlocker(BLOCKED_NO_ROOM)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pods", "cpu", "claimed", "expected"),
    [c[1:] for c in NODE_BLOCKERS],
    ids=[c[0] for c in NODE_BLOCKERS],
)
def test_node_blocker(pods: list[P], cpu: int, claimed: set[str], expected: NodeBlocker) -> None:
    info = node_with(pods)
    before = (dict(info.pods), info.generation)

    blocker = node_blocker(preemptor(cpu=cpu), info, records(pods), NOW, claimed)

    assert blocker == expected
    assert (dict(info.pods), info.generation) == before  # judged without changing the node


QUICK_CHECK = [
    # id, pods on a 4000m node, of them bound (None: all), preemptor cpu, expected reason,
    # whether judging it walks the node's pods (only when some there are not bound)
    ("equal and higher priority fill the node", [P("a-0", 100, cpu=2000), P("b-0", 200, cpu=2000)],
     None, 1000, BLOCKED_PRIORITY, False),
    ("too small even empty", [P("a-0", 200, cpu=2000)], None, 8000, BLOCKED_NO_ROOM, False),
    ("too small even empty, some not bound", [P("g-0", 100, cpu=2000)], [], 8000,
     BLOCKED_NO_ROOM, False),
    ("the unit's own members, assumed there, not bound",
     [P("g-0", 100, cpu=2000), P("g-1", 100, cpu=2000)], [], 1000, BLOCKED_NO_ROOM, True),
    ("one bound pod of higher priority would do", [P("g-0", 100, cpu=2000), P("h-0", 200, cpu=2000)],
     [P("h-0", 200, cpu=2000)], 2000, BLOCKED_PRIORITY, True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pods", "bound", "cpu", "expected", "walks"),
    [c[1:] for c in QUICK_CHECK],
    ids=[c[0] for c in QUICK_CHECK],
)
def test_quick_check_blocker(
    pods: list[P], bound: list[P] | None, cpu: int, expected: str, walks: bool
) -> None:
    pre, info, totals = preemptor(cpu=cpu), node_with(pods), LowerPriorityTotals()
    assert not could_fit_after_preemption(pre, info, totals)  # the node the check skips
    held = records(pods if bound is None else bound)
    walked: list[bool] = []

    def bound_records() -> list[VictimCandidate]:
        walked.append(True)
        return held

    assert quick_check_blocker(pre, info, totals, len(held), bound_records) == expected
    assert bool(walked) == walks


# ---------------------------------------------------------------------------------------------
# The tally
# ---------------------------------------------------------------------------------------------


def test_tally_counts_nodes_per_reason_and_the_soonest_protection_end() -> None:
    tally = PreemptionTally()
    for blocker in (
        NodeBlocker(BLOCKED_NOT_PREEMPTIBLE),
        NodeBlocker(BLOCKED_PROTECTED, NOW + 90_000),
        NodeBlocker(BLOCKED_NOT_PREEMPTIBLE),
        NodeBlocker(BLOCKED_PROTECTED, NOW + 41_000),
        NodeBlocker(BLOCKED_PROTECTED, NOT_STARTED),
    ):
        tally.add(blocker)
    tally.add_budgets(["web-pdb"])
    tally.add_budgets(["db-pdb", "web-pdb"])  # a node under each budget that blocks it

    assert tally.reasons() == (
        (BLOCKED_PROTECTED, 3),
        (budget_reason("web-pdb"), 2),  # equal counts: by reason
        (BLOCKED_NOT_PREEMPTIBLE, 2),
        (budget_reason("db-pdb"), 1),
    )
    assert tally.stored_protection_end() == NOW + 41_000


def test_tally_stores_a_protection_not_started_as_zero() -> None:
    tally = PreemptionTally()
    tally.add(NodeBlocker(BLOCKED_PROTECTED, NOT_STARTED))
    assert tally.stored_protection_end() == 0
    assert PreemptionTally().stored_protection_end() == 0  # no node blocked by protection


# ---------------------------------------------------------------------------------------------
# The sentence
# ---------------------------------------------------------------------------------------------

NOT_PREEMPTIBLE_HOW = (
    "the pods that would have to go are not preemptible (mark their job `preemptible: true` or "
    "set their queue's `preemptibleDefault`)"
)

SENTENCES = [
    # id, (reason, nodes) pairs, protection end (ms), expected sentence
    ("every reason, most nodes first",
     [(BLOCKED_NOT_PREEMPTIBLE, 12), (BLOCKED_PRIORITY, 5), (BLOCKED_PROTECTED, 3),
      (budget_reason("web-pdb"), 2)], NOW + 40_001,
     f"preemption cannot help: on 12 nodes {NOT_PREEMPTIBLE_HOW}; on 5 nodes they have equal or "
     "higher priority (100 or more); on 3 nodes they are protected for 41 more seconds "
     "(`protectionSeconds`); on 2 nodes budget web-pdb allows no more evictions"),
    ("one node", [(BLOCKED_NOT_PREEMPTIBLE, 1)], 0,
     f"preemption cannot help: on 1 node {NOT_PREEMPTIBLE_HOW}"),
    ("protected for one more second", [(BLOCKED_PROTECTED, 2)], NOW + 1000,
     "preemption cannot help: on 2 nodes they are protected for 1 more second "
     "(`protectionSeconds`)"),
    ("protected, not started yet", [(BLOCKED_PROTECTED, 2)], 0,
     "preemption cannot help: on 2 nodes they are protected until they have run for their "
     "`protectionSeconds`"),
    ("protection ended since the attempt", [(BLOCKED_PROTECTED, 1)], NOW - 5000,
     "preemption cannot help: on 1 node they were protected (`protectionSeconds`) until moments "
     "ago: the next attempt may do"),
    ("claimed and no room", [(BLOCKED_CLAIMED, 2), (BLOCKED_NO_ROOM, 1)], 0,
     "preemption cannot help: on 2 nodes they are already being evicted for other pods; on 1 "
     "node evicting cannot make room (what holds it is not bound yet or in the other pool, or "
     "the node is too small)"),
    ("a reason a newer shard knows, as it is", [("frobnicated", 3)], 0,
     "preemption cannot help: on 3 nodes frobnicated"),
    ("nothing tallied", [], 0, ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("reasons", "ends", "expected"), [c[1:] for c in SENTENCES], ids=[c[0] for c in SENTENCES]
)
def test_preemption_sentence(reasons: list[tuple[str, int]], ends: int, expected: str) -> None:
    text = preemption_sentence(reasons, priority=100, protection_ends_ms=ends, now_ms=NOW)
    assert text == expected
    stored = pb.SchedulingDiagnosis(
        preemption_reasons=[pb.ReasonCount(reason=r, nodes=n) for r, n in reasons],
        protection_ends_ms=ends,
        priority=100,
    )
    assert explain_preemption(stored, NOW) == expected  # the same from the stored diagnosis


def test_a_pod_that_never_preempts_is_told_so() -> None:
    assert explain_preemption(pb.SchedulingDiagnosis(preemption_never=True), NOW) == (
        "preemption cannot help: this pod's `preemptionPolicy` is Never (it evicts no other pod "
        "and waits for room)"
    )
    assert NEVER_SENTENCE in explain_preemption(pb.SchedulingDiagnosis(preemption_never=True), 0)
