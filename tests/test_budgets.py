"""Disruption budgets (placement/budgets.py): which pods a budget selects, which count as healthy,
the status (Kubernetes' PodDisruptionBudget arithmetic) and the tracker that charges evictions.
Also: budgets stored before min_available / max_unavailable had presence still read right."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from placement.budgets import (
    BudgetTracker,
    SelectorMembers,
    compute_status,
    compute_statuses,
    current_status,
    expected_pods,
    healthy,
    selects,
)
from protos.godel.v1 import objects_pb2 as pb

Req = pb.LabelSelectorRequirement
P, B, R, S, F = pb.POD_PENDING, pb.POD_BOUND, pb.POD_RUNNING, pb.POD_SUCCEEDED, pb.POD_FAILED


def pod(
    name: str,
    phase: int = R,
    *,
    job: str = "web",
    labels: dict[str, str] | None = None,
    deleting: bool = False,
) -> pb.Pod:
    p = pb.Pod(metadata=pb.ObjectMeta(name=name))
    p.spec.job = job
    p.spec.template.labels.update(labels or {})
    p.status.phase = phase  # type: ignore[assignment]
    if deleting:
        p.metadata.deletion_timestamp_ms = 1
    return p


def budget(
    name: str = "b",
    *,
    job: str = "",
    selector: list[pb.LabelSelectorRequirement] | None = None,
    min_available: int | None = None,
    max_unavailable: int | None = None,
    allowed: int | None = None,
) -> pb.DisruptionBudget:
    b = pb.DisruptionBudget(metadata=pb.ObjectMeta(name=name))
    b.spec.job = job
    b.spec.selector.extend(selector or [])
    if min_available is not None:
        b.spec.min_available = min_available
    if max_unavailable is not None:
        b.spec.max_unavailable = max_unavailable
    if allowed is not None:
        b.status.disruptions_allowed = allowed
    return b


def req(key: str, op: int, *values: str) -> pb.LabelSelectorRequirement:
    return Req(key=key, operator=op, values=values)  # type: ignore[arg-type]


def job(name: str, replicas: int) -> pb.Job:
    j = pb.Job(metadata=pb.ObjectMeta(name=name))
    j.spec.replicas = replicas
    return j


# ---------------------------------------------------------------------------------------------
# selects
# ---------------------------------------------------------------------------------------------

APP_WEB = {"app": "web", "tier": "3"}
# (id, budget, pod's job, pod's template labels, selected?)
SELECTS = [
    ("job budget selects its job's pods", budget(job="web"), "web", {}, True),
    ("job budget ignores other jobs", budget(job="web"), "db", APP_WEB, False),
    ("job wins over the selector", budget(job="db", selector=[req("app", Req.IN, "web")]),
     "web", APP_WEB, False),
    ("empty budget selects nothing", budget(), "web", APP_WEB, False),
    ("In matches a listed value", budget(selector=[req("app", Req.IN, "db", "web")]),
     "x", APP_WEB, True),
    ("In fails on another value", budget(selector=[req("app", Req.IN, "db")]), "x", APP_WEB, False),
    ("In fails on a missing key", budget(selector=[req("zone", Req.IN, "a")]), "x", APP_WEB, False),
    ("NotIn matches another value", budget(selector=[req("app", Req.NOT_IN, "db")]),
     "x", APP_WEB, True),
    ("NotIn matches a missing key", budget(selector=[req("zone", Req.NOT_IN, "a")]),
     "x", APP_WEB, True),
    ("NotIn fails on a listed value", budget(selector=[req("app", Req.NOT_IN, "web")]),
     "x", APP_WEB, False),
    ("Exists matches a present key", budget(selector=[req("app", Req.EXISTS)]), "x", APP_WEB, True),
    ("Exists fails on a missing key", budget(selector=[req("zone", Req.EXISTS)]),
     "x", APP_WEB, False),
    ("DoesNotExist matches a missing key", budget(selector=[req("zone", Req.DOES_NOT_EXIST)]),
     "x", APP_WEB, True),
    ("DoesNotExist fails on a present key", budget(selector=[req("app", Req.DOES_NOT_EXIST)]),
     "x", APP_WEB, False),
    ("Gt compares integers", budget(selector=[req("tier", Req.GT, "2")]), "x", APP_WEB, True),
    ("Lt compares integers", budget(selector=[req("tier", Req.LT, "2")]), "x", APP_WEB, False),
    ("Gt on a non-integer label fails", budget(selector=[req("app", Req.GT, "2")]),
     "x", APP_WEB, False),
    ("every requirement must hold", budget(selector=[req("app", Req.IN, "web"),
                                                     req("zone", Req.EXISTS)]), "x", APP_WEB, False),
    ("all requirements holding selects", budget(selector=[req("app", Req.IN, "web"),
                                                          req("zone", Req.DOES_NOT_EXIST)]),
     "x", APP_WEB, True),
    ("unspecified operator matches nothing", budget(selector=[req("app", 0)]), "x", APP_WEB, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("b", "pod_job", "labels", "expected"), [c[1:] for c in SELECTS], ids=[c[0] for c in SELECTS]
)
def test_selects(
    b: pb.DisruptionBudget, pod_job: str, labels: dict[str, str], expected: bool
) -> None:
    assert selects(b, pod("p", job=pod_job, labels=labels)) is expected


# (id, phase, being deleted, healthy?)
HEALTHY = [
    ("pending is not", P, False, False),
    ("bound is", B, False, True),
    ("running is", R, False, True),
    ("succeeded is not", S, False, False),
    ("failed is not", F, False, False),
    ("running but being deleted is not", R, True, False),
]


@pytest.mark.parametrize(
    ("phase", "deleting", "expected"), [c[1:] for c in HEALTHY], ids=[c[0] for c in HEALTHY]
)
def test_healthy(phase: int, deleting: bool, expected: bool) -> None:
    assert healthy(pod("p", phase, deleting=deleting)) is expected


# ---------------------------------------------------------------------------------------------
# Status
# ---------------------------------------------------------------------------------------------

# (id, min_available, max_unavailable, phases of the job's pods, expected,
#  (current_healthy, desired_healthy, disruptions_allowed))
STATUS = [
    ("minAvailable 2 of 3 healthy", 2, None, [R, R, B], 3, (3, 2, 1)),
    ("minAvailable 3 of 3 healthy", 3, None, [R, R, R], 3, (3, 3, 0)),
    ("minAvailable 0 allows every healthy pod", 0, None, [R, R, P], 3, (2, 0, 2)),
    ("minAvailable above healthy floors at 0", 5, None, [R, R], 3, (2, 5, 0)),
    ("maxUnavailable 1 of 3", None, 1, [R, R, R], 3, (3, 2, 1)),
    ("maxUnavailable 0 never disrupts", None, 0, [R, R, R], 3, (3, 3, 0)),
    ("maxUnavailable counts missing pods", None, 1, [R, R, P], 3, (2, 2, 0)),
    ("maxUnavailable above expected floors desired at 0", None, 5, [R, R], 3, (2, 0, 2)),
    ("terminal pods are not healthy", 1, None, [S, F, R], 3, (1, 1, 0)),
    ("neither set (stored before presence) protects nothing", None, None, [R, R], 2, (2, 0, 2)),
]


@pytest.mark.parametrize(
    ("min_available", "max_unavailable", "phases", "expected", "want"),
    [c[1:] for c in STATUS],
    ids=[c[0] for c in STATUS],
)
def test_compute_status(
    min_available: int | None,
    max_unavailable: int | None,
    phases: list[int],
    expected: int,
    want: tuple[int, int, int],
) -> None:
    b = budget(job="web", min_available=min_available, max_unavailable=max_unavailable)
    pods = [pod(f"web-{i}", ph) for i, ph in enumerate(phases)]
    pods.append(pod("other-0", R, job="other"))  # not selected: never counted
    status = compute_status(b, pods, expected)
    got = (status.current_healthy, status.desired_healthy, status.disruptions_allowed)
    assert got == want
    assert status.expected_pods == expected


JOBS = {"web": job("web", 3), "api": job("api", 2), "db": job("db", 4)}
# (id, budget, pods as (name, job, labels), expected pods)
EXPECTED = [
    ("job budget: its job's replicas", budget(job="web"), [("web-0", "web", {})], 3),
    ("job budget before any pod", budget(job="web"), [], 3),
    ("job budget of an unknown job", budget(job="gone"), [], 0),
    ("selector spanning two jobs sums their replicas",
     budget(selector=[req("app", Req.EXISTS)]),
     [("web-0", "web", {"app": "w"}), ("web-1", "web", {"app": "w"}), ("api-0", "api", {"app": "a"}),
      ("db-0", "db", {})], 5),
    ("selected pod of a deleted job counts alone",
     budget(selector=[req("app", Req.EXISTS)]),
     [("old-0", "old", {"app": "o"}), ("old-1", "old", {"app": "o"}), ("web-0", "web", {"app": "w"})],
     5),
]  # fmt: skip


@pytest.mark.parametrize(
    ("b", "pods", "expected"), [c[1:] for c in EXPECTED], ids=[c[0] for c in EXPECTED]
)
def test_expected_pods(
    b: pb.DisruptionBudget, pods: list[tuple[str, str, dict[str, str]]], expected: int
) -> None:
    assert expected_pods(b, [pod(n, job=j, labels=lb) for n, j, lb in pods], JOBS) == expected


def test_compute_statuses_looks_at_each_budgets_pods() -> None:
    budgets = [
        budget("web-pdb", job="web", max_unavailable=1),
        budget("apps", selector=[req("app", Req.EXISTS)], min_available=1),
    ]
    pods = [
        pod("web-0", R, labels={"app": "w"}),
        pod("web-1", R, labels={"app": "w"}),
        pod("web-2", P, labels={"app": "w"}),
        pod("api-0", R, job="api", labels={"app": "a"}),
        pod("db-0", R, job="db"),
    ]
    got = {
        name: (s.current_healthy, s.desired_healthy, s.disruptions_allowed, s.expected_pods)
        for name, s in compute_statuses(budgets, pods, JOBS).items()
    }
    assert got == {"web-pdb": (2, 2, 0, 3), "apps": (3, 1, 2, 5)}
    for b in budgets:  # one budget at a time over every pod: the same
        assert (
            current_status(b, pods, JOBS) == compute_statuses(budgets, pods, JOBS)[b.metadata.name]
        )


# ---------------------------------------------------------------------------------------------
# Tracker
# ---------------------------------------------------------------------------------------------


def healthy_web(n: int) -> list[pb.Pod]:
    return [pod(f"web-{i}", R) for i in range(n)]


def tracker_over(pods: list[pb.Pod], *budgets: pb.DisruptionBudget) -> BudgetTracker:
    """A tracker from budgets whose status was computed over ``pods``, as the controller does."""
    for b in budgets:
        b.status.CopyFrom(compute_status(b, pods, expected_pods(b, pods, JOBS)))
    return BudgetTracker(budgets)


def test_three_victims_under_min_available_3_are_blocked() -> None:
    pods = healthy_web(3)
    tracker = tracker_over(pods, budget("web-db", job="web", min_available=3))
    assert tracker.violations(pods) == [
        "disruption budget web-db allows 0 more disruptions (3 needed)"
    ]
    assert all(tracker.violations([p]) for p in pods)


def test_min_available_2_admits_exactly_one_then_blocks() -> None:
    pods = healthy_web(3)
    tracker = tracker_over(pods, budget("web-db", job="web", min_available=2))
    assert tracker.violations(pods[:2]) == [
        "disruption budget web-db allows 1 more disruption (2 needed)"
    ]
    assert tracker.violations(pods[:1]) == []
    tracker.admit(pods[:1])
    assert tracker.remaining("web-db") == 0
    assert tracker.violations(pods[1:2]) == [
        "disruption budget web-db allows 0 more disruptions (1 needed)"
    ]
    # The pod already admitted costs nothing again.
    assert tracker.violations(pods[:1]) == []


# (id, budgets, victims, violated budget names)
TRACKER = [
    ("a pod no budget selects is always allowed", [budget("web-db", job="web", allowed=0)],
     [pod("db-0", R, job="db")], []),
    ("no budgets at all", [], healthy_web(3), []),
    ("an unhealthy victim costs nothing", [budget("web-db", job="web", allowed=0)],
     [pod("web-0", P), pod("web-1", F), pod("web-2", R, deleting=True)], []),
    ("the same pod twice counts once", [budget("web-db", job="web", allowed=1)],
     [pod("web-0"), pod("web-0")], []),
    ("two budgets on one pod: the tighter one blocks",
     [budget("by-job", job="web", allowed=1),
      budget("by-label", selector=[req("app", Req.IN, "web")], allowed=0)],
     [pod("web-0", labels={"app": "web"})], ["by-label"]),
    ("two budgets on one pod: both allow", [budget("by-job", job="web", allowed=1),
      budget("by-label", selector=[req("app", Req.IN, "web")], allowed=1)],
     [pod("web-0", labels={"app": "web"})], []),
    ("both broken, named in order", [budget("z-job", job="web", allowed=1),
      budget("a-label", selector=[req("app", Req.EXISTS)], allowed=1)],
     [pod("web-0", labels={"app": "web"}), pod("web-1", labels={"app": "web"})],
     ["a-label", "z-job"]),
    ("a budget without status allows nothing", [budget("fresh", job="web", min_available=0)],
     [pod("web-0")], ["fresh"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("budgets", "victims", "violated"), [c[1:] for c in TRACKER], ids=[c[0] for c in TRACKER]
)
def test_tracker_violations(
    budgets: list[pb.DisruptionBudget], victims: list[pb.Pod], violated: list[str]
) -> None:
    messages = BudgetTracker(budgets).violations(victims)
    assert [m.split()[2] for m in messages] == violated


def test_tracker_from_fresh_statuses_ignores_a_stale_stored_one() -> None:
    # The stored status still allows 1, but one web pod was evicted since: none is left.
    pods = [*healthy_web(2), pod("web-2", F)]
    stale = budget("web-db", job="web", min_available=2, allowed=1)
    assert BudgetTracker([stale]).violations(pods[:1]) == []
    fresh = BudgetTracker([stale], compute_statuses([stale], pods, JOBS))
    assert fresh.violations(pods[:1]) == [
        "disruption budget web-db allows 0 more disruptions (1 needed)"
    ]


def test_tracker_copy_is_independent() -> None:
    tracker = BudgetTracker([budget("web-db", job="web", allowed=1)])
    trial = tracker.copy()
    trial.admit([pod("web-0")])
    assert (trial.remaining("web-db"), tracker.remaining("web-db")) == (0, 1)
    assert tracker.violations([pod("web-1")]) == []
    assert trial.violations([pod("web-1")]) != []


def test_try_admit_is_all_or_nothing() -> None:
    tracker = BudgetTracker([budget("web-db", job="web", allowed=1)])
    gang_victims = [pod("web-0"), pod("web-1")]
    assert tracker.try_admit(gang_victims) == [
        "disruption budget web-db allows 1 more disruption (2 needed)"
    ]
    assert tracker.remaining("web-db") == 1  # nothing of the refused set was charged
    assert tracker.try_admit(gang_victims[:1]) == []
    assert tracker.remaining("web-db") == 0


def test_tracker_admits_across_calls_of_one_round() -> None:
    tracker = BudgetTracker([budget("web-db", job="web", allowed=2)])
    for name in ("web-0", "web-1"):
        assert tracker.violations([pod(name)]) == []
        tracker.admit([pod(name)])
    assert tracker.violations([pod("web-2")]) != []


def test_release_gives_an_admitted_pods_disruption_back_and_nothing_else() -> None:
    both = [budget("by-job", job="web", allowed=1),
            budget("by-label", selector=[req("app", Req.IN, "web")], allowed=1)]  # fmt: skip
    tracker = BudgetTracker(both)
    taken = pod("web-0", labels={"app": "web"})
    tracker.admit([taken])
    assert (tracker.remaining("by-job"), tracker.remaining("by-label")) == (0, 0)
    tracker.release([pod("web-1", labels={"app": "web"})])  # never admitted: no change
    assert (tracker.remaining("by-job"), tracker.remaining("by-label")) == (0, 0)
    tracker.release([taken])
    assert (tracker.remaining("by-job"), tracker.remaining("by-label")) == (1, 1)
    tracker.release([taken])  # released already: no disruption given back twice
    assert tracker.remaining("by-job") == 1
    assert tracker.violations([pod("web-1", labels={"app": "web"})]) == []


# ---------------------------------------------------------------------------------------------
# Objects stored before the fields had presence
# ---------------------------------------------------------------------------------------------

# Encoded by hand as the pre-presence code wrote them: proto3 left a 0 out of the wire, so a
# budget written with max_unavailable 0 carried no field 3 at all.
#   0a 05 {0a 03 "web"}  metadata.name = "web"
#   12 05 {0a 03 "web"}  spec.job = "web"                (max_unavailable 0: absent)
#   12 07 {0a 03 "web" 18 01}  spec.job, max_unavailable = 1
#   12 07 {0a 03 "web" 20 02}  spec.job, min_available = 2
OLD_SHAPES = [
    ("zero was never written: reads as unset", "0a050a0377656212050a03776562", None, None),
    ("max_unavailable 1", "0a050a0377656212070a037765621801", None, 1),
    ("min_available 2", "0a050a0377656212070a037765622002", 2, None),
]


@pytest.mark.parametrize(
    ("hex_bytes", "min_available", "max_unavailable"),
    [c[1:] for c in OLD_SHAPES],
    ids=[c[0] for c in OLD_SHAPES],
)
def test_budget_bytes_of_the_old_shape_decode(
    hex_bytes: str, min_available: int | None, max_unavailable: int | None
) -> None:
    b = pb.DisruptionBudget.FromString(bytes.fromhex(hex_bytes))
    assert (b.metadata.name, b.spec.job) == ("web", "web")
    spec = b.spec
    assert (spec.min_available if spec.HasField("min_available") else None) == min_available
    assert (spec.max_unavailable if spec.HasField("max_unavailable") else None) == max_unavailable


def test_zero_is_written_now() -> None:
    b = budget("web", job="web", max_unavailable=0)
    again = pb.DisruptionBudget.FromString(b.SerializeToString())
    assert again.spec.HasField("max_unavailable") and not again.spec.HasField("min_available")


# ---------------------------------------------------------------------------------------------
# Selector members (the Binder's incremental index)
# ---------------------------------------------------------------------------------------------


Step = tuple[str, str, dict[str, str]]  # (what, name or selector, labels)


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # Pods first, then the budget: it picks out its pods from those known.
        (
            [("pod", "a-0", {"app": "a"}), ("pod", "b-0", {"app": "b"}), ("budget", "a", {})],
            {"a-0"},
        ),
        # The budget first: pods are tested as they come.
        ([("budget", "a", {}), ("pod", "a-0", {"app": "a"}), ("pod", "b-0", {})], {"a-0"}),
        # A pod whose labels change leaves (or joins); a deleted pod leaves.
        ([("budget", "a", {}), ("pod", "a-0", {"app": "a"}), ("pod", "a-0", {"app": "x"})], set()),
        ([("budget", "a", {}), ("pod", "a-0", {"app": "a"}), ("delete", "a-0", {})], set()),
        # A changed selector re-selects; a removed budget keeps nothing.
        ([("pod", "a-0", {"app": "a"}), ("budget", "a", {}), ("budget", "z", {})], set()),
        ([("pod", "a-0", {"app": "a"}), ("budget", "a", {}), ("remove", "", {})], set()),
        # A job budget is not kept here (its pods are its job's).
        ([("pod", "a-0", {"app": "a"}), ("job-budget", "a", {})], set()),
    ],
)
def test_selector_members(steps: list[Step], expected: set[str]) -> None:
    members = SelectorMembers()
    pods: dict[str, pb.Pod] = {}
    for what, name, labels in steps:
        if what == "pod":
            pods[name] = pod(name, labels=labels)
            members.set_pod(pods[name])
        elif what == "delete":
            del pods[name]
            members.remove_pod(name)
        elif what == "remove":
            members.remove_budget("b")
        elif what == "job-budget":
            members.set_budget(budget(job=name, min_available=1), _parts(pods))
        else:  # a budget selecting app=<name>
            selector = [req("app", Req.IN, name)]
            members.set_budget(budget(selector=selector, min_available=1), _parts(pods))
    assert set(members.members("b")) == expected
    assert all(job == pods[p].spec.job for p, job in members.members("b").items())


def _parts(pods: dict[str, pb.Pod]) -> list[tuple[str, str, Mapping[str, str]]]:
    return [(p.metadata.name, p.spec.job, p.spec.template.labels) for p in pods.values()]
