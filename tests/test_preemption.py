"""Preemption in the placement library, table by table: who may preempt, who may be a victim
(and why not), the fewest victims on one node, the candidate order with every tie-break, the
quick check that skips hopeless nodes, and the stored objects from before the preemption
fields."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from placement.framework.interface import PodInfo
from placement.nodeinfo import NodeInfo, PodRequest
from placement.preemption import (
    BUDGET_BLOCKS,
    CLAIMED,
    NO_ROOM,
    NOT_BOUND,
    NOT_LOWER_PRIORITY,
    NOT_PREEMPTIBLE,
    OTHER_POOL,
    PROTECTED,
    BudgetFn,
    Candidate,
    FitFn,
    LowerPriorityTotals,
    VictimCandidate,
    can_preempt,
    could_fit_after_preemption,
    order_candidates,
    possible_victims,
    resources_fit,
    search_victims,
    select_victims,
    victim_reason,
)
from protos.godel.v1 import objects_pb2 as pb
from tests.factories import GiB, node

G, BE = pb.QOS_GUARANTEED, pb.QOS_BEST_EFFORT
NOW = 1_000_000  # ms


@dataclass(frozen=True)
class P:
    """A pod as the tables write it."""

    name: str
    priority: int = 0
    cpu: int = 1000
    qos: int = G
    phase: int = pb.POD_RUNNING
    preemptible: bool = True
    started_ms: int = 1
    protection_seconds: int = 0
    preempted_by: str = ""
    host_port: int = 0

    def pod(self) -> pb.Pod:
        p = pb.Pod(metadata=pb.ObjectMeta(name=self.name))
        p.spec.job = self.name.rsplit("-", 1)[0]
        p.spec.priority = self.priority
        p.spec.qos = self.qos  # type: ignore[assignment]
        p.spec.preemptible = self.preemptible
        p.spec.protection_seconds = self.protection_seconds
        p.spec.template.requests.milli_cpu = self.cpu
        if self.host_port:
            p.spec.template.ports.add(container_port=80, host_port=self.host_port)
        p.status.phase = self.phase  # type: ignore[assignment]
        p.status.started_ms = self.started_ms
        p.status.preempted_by = self.preempted_by
        return p


def preemptor(priority: int = 100, cpu: int = 1000, qos: int = G, host_port: int = 0) -> PodInfo:
    pod = P("pre-0", priority, cpu, qos, pb.POD_PENDING, host_port=host_port).pod()
    return PodInfo.from_pod(pod)


def node_with(pods: Sequence[P], cpu: int = 4000, be_cpu: int = 4000, slots: int = 110) -> NodeInfo:
    info = NodeInfo.from_node(node("n", cpu=cpu, be_cpu=be_cpu, be_mem=GiB, pods=slots))
    for p in pods:
        info.add_pod(PodRequest.from_pod(p.pod()))
    return info


# ---------------------------------------------------------------------------------------------
# Who may preempt
# ---------------------------------------------------------------------------------------------

CAN_PREEMPT = [
    ("unspecified preempts lower priority", pb.PREEMPTION_POLICY_UNSPECIFIED, True),
    ("PreemptLowerPriority", pb.PREEMPT_LOWER_PRIORITY, True),
    ("Never", pb.NEVER, False),
]


@pytest.mark.parametrize(
    ("policy", "expected"), [c[1:] for c in CAN_PREEMPT], ids=[c[0] for c in CAN_PREEMPT]
)
def test_can_preempt_unless_policy_is_never(policy: int, expected: bool) -> None:
    pod = pb.Pod()
    pod.spec.preemption_policy = policy  # type: ignore[assignment]
    assert can_preempt(pod) is expected


# ---------------------------------------------------------------------------------------------
# Who may be a victim, and why not
# ---------------------------------------------------------------------------------------------

VICTIM_REASONS = [
    # id, candidate, preemptor qos, claimed, expected reason (None: a possible victim)
    ("running, lower priority, preemptible", P("a-0", 10), G, set(), None),
    ("bound but not running is a victim", P("a-0", 10, phase=pb.POD_BOUND, started_ms=0), G,
     set(), None),
    ("pending is not", P("a-0", 10, phase=pb.POD_PENDING), G, set(), NOT_BOUND),
    ("finished is not", P("a-0", 10, phase=pb.POD_SUCCEEDED), G, set(), NOT_BOUND),
    ("best-effort is not a victim of guaranteed", P("a-0", 10, qos=BE), G, set(), OTHER_POOL),
    ("guaranteed is not a victim of best-effort", P("a-0", 10), BE, set(), OTHER_POOL),
    ("equal priority is not", P("a-0", 100), G, set(), NOT_LOWER_PRIORITY),
    ("higher priority is not", P("a-0", 101), G, set(), NOT_LOWER_PRIORITY),
    ("non-preemptible is not", P("a-0", 10, preemptible=False), G, set(), NOT_PREEMPTIBLE),
    ("inside its protection window",
     P("a-0", 10, started_ms=NOW - 29_999, protection_seconds=30), G, set(), PROTECTED),
    ("its protection window just passed",
     P("a-0", 10, started_ms=NOW - 30_000, protection_seconds=30), G, set(), None),
    ("protected and not started yet: its window has not begun",
     P("a-0", 10, phase=pb.POD_BOUND, started_ms=0, protection_seconds=30), G, set(), PROTECTED),
    ("claimed by another preemptor", P("a-0", 10), G, {"a-0"}, CLAIMED),
    ("preempted_by another pod", P("a-0", 10, preempted_by="other-0"), G, set(), CLAIMED),
    ("preempted_by this preemptor (a retry) is still its victim",
     P("a-0", 10, preempted_by="pre-0"), G, set(), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("candidate", "qos", "claimed", "expected"),
    [c[1:] for c in VICTIM_REASONS],
    ids=[c[0] for c in VICTIM_REASONS],
)
def test_victim_reason(candidate: P, qos: int, claimed: set[str], expected: str | None) -> None:
    assert victim_reason(preemptor(100, qos=qos), candidate.pod(), NOW, claimed) == expected


# ---------------------------------------------------------------------------------------------
# The fewest victims on one node
# ---------------------------------------------------------------------------------------------


def budgets(*specs: tuple[str, set[str], int]) -> dict[str, tuple[set[str], int]]:
    """Disruption budgets as (name, pods they protect, evictions allowed)."""
    return {name: (pods, allowed) for name, pods, allowed in specs}


def budget_fn(table: dict[str, tuple[set[str], int]]) -> BudgetFn | None:
    """The budgets as the optional callback (None when there are none)."""
    if not table:
        return None

    def violations(victims: Sequence[str]) -> list[str]:
        return [
            name
            for name, (pods, allowed) in sorted(table.items())
            if sum(v in pods for v in victims) > allowed
        ]

    return violations


VICTIMS = [
    # id, pods on a 4-core node, preemptor (priority 100 unless said), claimed, budgets,
    # expected victims (None: preemption cannot help on this node)
    ("fits without victims", [P("a-0", 10)], preemptor(cpu=3000), set(), {}, []),
    ("one lower-priority pod is enough: exactly it",
     [P("a-0", 10, cpu=2000), P("b-0", 10, cpu=2000)], preemptor(cpu=2000), set(), {}, ["b-0"]),
    ("equal priority is never a victim", [P("a-0", 100, cpu=4000)], preemptor(), set(), {}, None),
    ("non-preemptible is never a victim",
     [P("a-0", 10, cpu=4000, preemptible=False)], preemptor(), set(), {}, None),
    ("protected until its window passes",
     [P("a-0", 10, cpu=4000, started_ms=NOW - 1000, protection_seconds=2)], preemptor(), set(),
     {}, None),
    ("then taken",
     [P("a-0", 10, cpu=4000, started_ms=NOW - 2000, protection_seconds=2)], preemptor(), set(),
     {}, ["a-0"]),
    ("the highest-priority pod is spared when a lower one suffices",
     [P("hi-0", 50, cpu=2000), P("lo-0", 10, cpu=2000)], preemptor(cpu=2000), set(), {},
     ["lo-0"]),
    ("several low pods rather than one higher",
     [P("hi-0", 50, cpu=2000), P("lo-0", 10, cpu=1000), P("lo-1", 10, cpu=1000)],
     preemptor(cpu=2000), set(), {}, ["lo-0", "lo-1"]),
    ("only what is needed of the lowest",
     [P("lo-0", 10, cpu=1000, started_ms=5), P("lo-1", 10, cpu=1000, started_ms=6),
      P("lo-2", 10, cpu=1000, started_ms=7), P("lo-3", 10, cpu=1000, started_ms=8)],
     preemptor(cpu=2000), set(), {}, ["lo-2", "lo-3"]),
    ("equal priority: the earlier-started is spared",
     [P("old-0", 10, cpu=2000, started_ms=5), P("new-0", 10, cpu=2000, started_ms=9)],
     preemptor(cpu=2000), set(), {}, ["new-0"]),
    ("equal priority: a pod not started yet goes before a started one",
     [P("ran-0", 10, cpu=2000, started_ms=9), P("idle-0", 10, cpu=2000, started_ms=0,
      phase=pb.POD_BOUND)], preemptor(cpu=2000), set(), {}, ["idle-0"]),
    ("best-effort is never a victim of guaranteed",
     [P("be-0", 10, cpu=4000, qos=BE), P("g-0", 10, cpu=4000)], preemptor(cpu=1000), set(), {},
     ["g-0"]),
    ("guaranteed is never a victim of best-effort",
     [P("g-0", 10, cpu=4000), P("be-0", 10, cpu=4000, qos=BE)], preemptor(cpu=1000, qos=BE),
     set(), {}, ["be-0"]),
    ("best-effort preemptor with only guaranteed pods to take", [P("g-0", 10, cpu=4000),
     P("be-0", 100, cpu=4000, qos=BE)], preemptor(cpu=1000, qos=BE), set(), {}, None),
    ("a claimed pod is skipped",
     [P("a-0", 10, cpu=2000), P("b-0", 20, cpu=2000)], preemptor(cpu=2000), {"a-0"}, {},
     ["b-0"]),
    ("only claimed pods would make room",
     [P("a-0", 10, cpu=4000)], preemptor(), {"a-0"}, {}, None),
    ("a budget-protected pod is spared when another suffices",
     [P("safe-0", 10, cpu=2000), P("other-0", 20, cpu=2000)], preemptor(cpu=2000), set(),
     budgets(("pdb", {"safe-0"}, 0)), ["other-0"]),
    ("a budget allowing one eviction lets one go",
     [P("a-0", 10, cpu=2000), P("a-1", 10, cpu=2000)], preemptor(cpu=2000), set(),
     budgets(("pdb", {"a-0", "a-1"}, 1)), ["a-1"]),
    ("every set breaks a budget",
     [P("a-0", 10, cpu=2000), P("a-1", 10, cpu=2000)], preemptor(cpu=4000), set(),
     budgets(("pdb", {"a-0", "a-1"}, 1)), None),
    ("the pod holding a needed host port",
     [P("a-0", 10, cpu=100, host_port=8080), P("b-0", 10, cpu=100)],
     preemptor(cpu=100, host_port=8080), set(), {}, ["a-0"]),
]  # fmt: skip


# The default judgement runs on integers; passing resources_fit runs it on a NodeInfo clone, the
# path the caller's filters take: both must choose alike.
FIT_PATHS = [("integers", None), ("clone", resources_fit)]


@pytest.mark.parametrize(
    ("pods", "pre", "claimed", "budget_table", "expected"),
    [c[1:] for c in VICTIMS],
    ids=[c[0] for c in VICTIMS],
)
@pytest.mark.parametrize("fits", [c[1] for c in FIT_PATHS], ids=[c[0] for c in FIT_PATHS])
def test_select_victims(
    fits: FitFn | None,
    pods: list[P],
    pre: PodInfo,
    claimed: set[str],
    budget_table: dict[str, tuple[set[str], int]],
    expected: list[str] | None,
) -> None:
    info = node_with(pods)
    before = (dict(info.pods), info.generation)
    candidates = possible_victims(pre, (p.pod() for p in pods), NOW, claimed)

    victims = select_victims(pre, info, candidates, fits, budget_fn(budget_table))

    assert (None if victims is None else sorted(v.name for v in victims)) == expected
    assert (dict(info.pods), info.generation) == before  # the search works on a clone


SEARCH_REASONS = [
    # id, pods, preemptor cpu, budgets, expected reason
    ("nothing to take", [P("a-0", 100, cpu=4000)], 1000, {}, NO_ROOM),
    ("a budget blocks it", [P("a-0", 10, cpu=4000)], 1000, budgets(("web-pdb", {"a-0"}, 0)),
     f"{BUDGET_BLOCKS}: web-pdb"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pods", "cpu", "budget_table", "reason"),
    [c[1:] for c in SEARCH_REASONS],
    ids=[c[0] for c in SEARCH_REASONS],
)
def test_search_victims_says_why_a_node_cannot_help(
    pods: list[P], cpu: int, budget_table: dict[str, tuple[set[str], int]], reason: str
) -> None:
    pre = preemptor(cpu=cpu)
    candidates = possible_victims(pre, (p.pod() for p in pods), NOW, set())
    found = search_victims(
        pre,
        node_with(pods),
        candidates,
        budget_violations=budget_fn(budget_table),
    )
    assert (found.victims, found.reason) == (None, reason)


SLOT_VICTIMS = [
    # id, pod priorities on a node with 2 pod slots (no cpu requested), expected victims
    ("a full node frees a pod slot from its lowest pod", [10, 50], ["p10-0"]),
    ("no lower-priority pod to free a slot", [100, 200], None),
]


@pytest.mark.parametrize(
    ("priorities", "expected"), [c[1:] for c in SLOT_VICTIMS], ids=[c[0] for c in SLOT_VICTIMS]
)
@pytest.mark.parametrize("fits", [c[1] for c in FIT_PATHS], ids=[c[0] for c in FIT_PATHS])
def test_select_victims_frees_pod_slots(
    fits: FitFn | None, priorities: list[int], expected: list[str] | None
) -> None:
    pods = [P(f"p{pr}-0", pr, cpu=0) for pr in priorities]
    pre = preemptor(cpu=100)
    candidates = possible_victims(pre, (p.pod() for p in pods), NOW, set())
    victims = select_victims(pre, node_with(pods, slots=2), candidates, fits)
    assert (None if victims is None else [v.name for v in victims]) == expected


FITS: list[tuple[str, FitFn, list[str] | None]] = [
    # id, the caller's fit judgement, expected victims
    ("the caller's filters judge fit: never fits", lambda pod, n: False, None),
    ("the caller's filters judge fit: room for 2 cores", lambda pod, n: n.free("g")[0] >= 2000,
     ["b-0"]),
]  # fmt: skip


@pytest.mark.parametrize(("fits", "expected"), [c[1:] for c in FITS], ids=[c[0] for c in FITS])
def test_select_victims_uses_the_callers_fit(fits: FitFn, expected: list[str] | None) -> None:
    pods = [P("a-0", 20, cpu=2000), P("b-0", 10, cpu=2000)]
    pre = preemptor(cpu=10)
    candidates = possible_victims(pre, (p.pod() for p in pods), NOW, set())
    victims = select_victims(pre, node_with(pods), candidates, fits)
    assert (None if victims is None else [v.name for v in victims]) == expected


@pytest.mark.parametrize("fits", [c[1] for c in FIT_PATHS], ids=[c[0] for c in FIT_PATHS])
def test_select_victims_ignores_candidates_not_on_the_node(fits: FitFn | None) -> None:
    pods = [P("a-0", 10, cpu=4000)]
    pre = preemptor(cpu=1000)
    elsewhere = VictimCandidate.from_pod(P("gone-0", 1, cpu=4000).pod())
    candidates = [elsewhere, *possible_victims(pre, (p.pod() for p in pods), NOW, set())]
    victims = select_victims(pre, node_with(pods), candidates, fits)
    assert victims is not None and [v.name for v in victims] == ["a-0"]


# ---------------------------------------------------------------------------------------------
# Candidate order
# ---------------------------------------------------------------------------------------------


def v(priority: int, started_ms: int = 1, name: str = "") -> VictimCandidate:
    return VictimCandidate(
        name or f"v{priority}-{started_ms}",
        "j",
        priority,
        started_ms,
        PodRequest(name or "v", "g", 0, 0, 0),
    )


ORDER = [
    # id, candidates (node, victims), expected node order
    ("a node needing no victims first",
     [("a", [v(1)]), ("b", [])], ["b", "a"]),
    ("lowest highest-victim priority",
     [("a", [v(5)]), ("b", [v(1), v(3)])], ["b", "a"]),
    ("then lowest priority sum",
     [("a", [v(3), v(3)]), ("b", [v(3), v(1)])], ["b", "a"]),
    ("the priority sum counts negative priorities as costs too",
     [("a", [v(-5), v(-5)]), ("b", [v(-5)])], ["b", "a"]),
    ("then fewest victims (equal sums)",
     [("a", [v(0), v(0), v(0)]), ("b", [v(0), v(0)])], ["b", "a"]),
    ("then latest earliest start among the highest-priority victims",
     [("a", [v(3, 10), v(3, 50)]), ("b", [v(3, 20), v(3, 30)])], ["b", "a"]),
    ("lower-priority victims' start times do not count",
     [("a", [v(3, 100), v(1, 500)]), ("b", [v(3, 200), v(1, 5)])], ["b", "a"]),
    ("a node whose victims have a start time beats one whose have none",
     [("a", [v(3, 0)]), ("b", [v(3, 10)])], ["b", "a"]),
    ("then the node name",
     [("b", [v(3, 10)]), ("a", [v(3, 10)]), ("c", [])], ["c", "a", "b"]),
]  # fmt: skip


@pytest.mark.parametrize(("cands", "expected"), [c[1:] for c in ORDER], ids=[c[0] for c in ORDER])
def test_order_candidates(
    cands: list[tuple[str, list[VictimCandidate]]], expected: list[str]
) -> None:
    ordered = order_candidates(Candidate(n, victims) for n, victims in cands)
    assert [c.node for c in ordered] == expected


# ---------------------------------------------------------------------------------------------
# Quick check
# ---------------------------------------------------------------------------------------------

QUICK = [
    # id, pods on a 4-core node (4 cores best-effort), preemptor, expected
    ("free capacity alone", [P("a-0", 10, cpu=1000)], preemptor(cpu=3000), True),
    ("free plus lower-priority requests", [P("a-0", 10, cpu=2000), P("b-0", 200, cpu=1000)],
     preemptor(cpu=3000), True),
    ("equal and higher priorities do not count",
     [P("a-0", 100, cpu=2000), P("b-0", 200, cpu=1000)], preemptor(cpu=2000), False),
    ("the other pool does not count",
     [P("a-0", 10, cpu=4000, qos=BE), P("b-0", 200, cpu=2000)], preemptor(cpu=3000), False),
    ("best-effort counts its own pool",
     [P("a-0", 10, cpu=4000, qos=BE), P("b-0", 10, cpu=4000)], preemptor(cpu=3000, qos=BE), True),
    ("short by one milli-CPU", [P("a-0", 10, cpu=1000), P("b-0", 200, cpu=2001)],
     preemptor(cpu=2000), False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pods", "pre", "expected"), [c[1:] for c in QUICK], ids=[c[0] for c in QUICK]
)
def test_could_fit_after_preemption(pods: list[P], pre: PodInfo, expected: bool) -> None:
    info = node_with(pods)
    assert could_fit_after_preemption(pre, info) is expected
    assert could_fit_after_preemption(pre, info, LowerPriorityTotals()) is expected


SLOTS = [
    # id, pod priorities on a node with 2 slots, expected
    ("a full node with a lower-priority pod to free a slot", [10, 200], True),
    ("a full node of equal or higher priority pods", [100, 200], False),
]


@pytest.mark.parametrize(
    ("priorities", "expected"), [c[1:] for c in SLOTS], ids=[c[0] for c in SLOTS]
)
def test_could_fit_after_preemption_counts_pod_slots(priorities: list[int], expected: bool) -> None:
    info = node_with([P(f"p{i}-0", pr, cpu=0) for i, pr in enumerate(priorities)], slots=2)
    assert could_fit_after_preemption(preemptor(cpu=100), info) is expected


CACHE_CHANGES = [
    # id, change to the node after the first check, expected second answer
    ("unchanged node answers the same", None, False),
    ("the node's pods changed is seen", "replace", True),
    ("another NodeInfo at the same generation is not confused", "clone", True),
]


@pytest.mark.parametrize(
    ("change", "expected"), [c[1:] for c in CACHE_CHANGES], ids=[c[0] for c in CACHE_CHANGES]
)
def test_lower_priority_totals_follow_node_changes(change: str | None, expected: bool) -> None:
    totals = LowerPriorityTotals()
    pre = preemptor(cpu=2000)
    info = node_with([P("hi-0", 200, cpu=3000)], cpu=4000)
    assert not could_fit_after_preemption(pre, info, totals)
    if change == "replace":
        info.remove_pod("hi-0")
        info.add_pod(PodRequest("lo-0", "g", 3000, 0, 0, priority=10))
    elif change == "clone":
        # A snapshot clone that diverged: same name, same generation, other pods.
        other = node_with([P("lo-0", 10, cpu=3000)], cpu=4000)
        other.generation = info.generation
        info = other
    assert could_fit_after_preemption(pre, info, totals) is expected


# ---------------------------------------------------------------------------------------------
# Objects stored before the preemption fields
# ---------------------------------------------------------------------------------------------

# JobSpec bytes as the old schema wrote them: replicas=3 (field 1), priority=7 (field 3) and, when
# true, `bool preemptible = 6` (proto3 never wrote a false bool).
OLD_JOB_SPECS = [
    ("old preemptible true reads as set true", b"\x08\x03\x18\x07\x30\x01", True, True),
    ("old preemptible false (not written) reads as unset", b"\x08\x03\x18\x07", False, False),
]


@pytest.mark.parametrize(
    ("data", "present", "preemptible"),
    [c[1:] for c in OLD_JOB_SPECS],
    ids=[c[0] for c in OLD_JOB_SPECS],
)
def test_old_job_spec_decodes_with_defaults(data: bytes, present: bool, preemptible: bool) -> None:
    spec = pb.JobSpec.FromString(data)
    assert (spec.replicas, spec.priority) == (3, 7)
    assert (spec.HasField("preemptible"), spec.preemptible) == (present, preemptible)
    assert spec.preemption_policy == pb.PREEMPTION_POLICY_UNSPECIFIED
    assert spec.protection_seconds == 0 and not spec.HasField("backoff_limit")


def test_old_pod_decodes_with_defaults() -> None:
    # Old Pod: spec {job "j" (field 1), preemptible true (field 5)}, status {phase RUNNING}.
    pod = pb.Pod.FromString(b"\x12\x05\x0a\x01j\x28\x01\x1a\x02\x08\x03")
    assert (pod.spec.job, pod.spec.preemptible, pod.status.phase) == ("j", True, pb.POD_RUNNING)
    assert pod.spec.preemption_policy == pb.PREEMPTION_POLICY_UNSPECIFIED
    assert pod.spec.protection_seconds == 0 and pod.spec.template.termination_grace_seconds == 0
    assert pod.status.nominated_node == "" and pod.status.preempted_by == ""
    assert can_preempt(pod)
