"""The rescheduler's checks (table per check) and one round end to end on a built view:
detection, validation with the shared filters, the checks on the final plan, budget-safe batches,
the failure ratio, and the dry run's simulation with the real scheduling algorithm."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from placement.framework import PluginConfigError
from placement.rules import hard_rules
from protos.godel.v1 import objects_pb2 as pb
from services.rescheduler.checks import new_check_registry
from services.rescheduler.checks.disruptionbudget import DisruptionBudget
from services.rescheduler.checks.pendingchecker import PendingChecker, PendingCheckerArgs
from services.rescheduler.checks.protection import Protection
from services.rescheduler.checks.throttle import GroupThrottle, Throttle, ThrottleArgs
from services.rescheduler.config import PolicyConfigError, load_policies
from services.rescheduler.framework import (
    EXCLUDE_FROM_RESCHEDULING,
    Check,
    ClusterView,
    Detection,
    Move,
    MoveVeto,
)
from services.rescheduler.manager import PolicyManager, UnknownPolicyError
from services.rescheduler.plugins import new_plugin_registry
from services.rescheduler.plugins.binpacking import Args as BinPackingArgs
from services.rescheduler.plugins.binpacking import BinPacking
from services.rescheduler.round import ABORTED, NOTHING, PLANNED, Policy, RoundRunner
from services.rescheduler.service import ReschedulerConfig, build_policy
from services.rescheduler.view import build_view
from tests import factories as f

GPU = {"gpu": 1}


# --------------------------------------------------------------------------------------------
# Building views
# --------------------------------------------------------------------------------------------


@dataclass
class Spec:
    """Nodes and the pods bound to them: node -> [(pod, job, cpu milli, gpus)]."""

    nodes: dict[str, list[tuple[str, str, int, int]]]
    cpu: int = 4000
    gpus: int = 0
    jobs: dict[str, dict[str, str]] = field(default_factory=dict)  # job -> labels
    budgets: list[pb.DisruptionBudget] = field(default_factory=list)
    pending: int = 0
    pod_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    # Pending pods with a node selector each (besides the ``pending`` ones, which have none).
    pending_selectors: list[dict[str, str]] = field(default_factory=list)
    # Placed pods' node selectors, and the preemptible ones.
    pod_selectors: dict[str, dict[str, str]] = field(default_factory=dict)
    preemptible: frozenset[str] = frozenset()
    scope_labels: dict[str, str] = field(default_factory=dict)
    min_members: dict[str, int] = field(default_factory=dict)  # job -> minMember (gangs)


def view_of(spec: Spec) -> ClusterView:
    nodes = [f.node(name, cpu=spec.cpu, gpus=spec.gpus) for name in spec.nodes]
    pods, jobs = [], {}
    for node, placed in spec.nodes.items():
        for pod_name, job_name, cpu, gpus in placed:
            pod = pb.Pod(metadata=pb.ObjectMeta(name=pod_name))
            pod.spec.job = job_name
            pod.spec.node_name = node
            pod.spec.template.requests.milli_cpu = cpu
            pod.spec.template.requests.memory_bytes = f.MiB
            pod.spec.template.requests.gpus = gpus
            pod.spec.template.labels.update(spec.pod_labels.get(pod_name, {}))
            pod.spec.template.node_selector.update(spec.pod_selectors.get(pod_name, {}))
            pod.spec.preemptible = pod_name in spec.preemptible
            pod.status.phase = pb.POD_RUNNING
            pods.append(pod)
            job = jobs.setdefault(job_name, pb.Job(metadata=pb.ObjectMeta(name=job_name)))
            job.metadata.labels.update(spec.jobs.get(job_name, {}))
            job.spec.replicas += 1
            job.spec.min_member = spec.min_members.get(job_name, 1)
    selectors = [{}] * spec.pending + spec.pending_selectors
    for i, selector in enumerate(selectors):
        pending = pb.Pod(metadata=pb.ObjectMeta(name=f"pending-{i}"))
        pending.spec.template.node_selector.update(selector)
        pending.status.phase = pb.POD_PENDING
        pods.append(pending)
    return build_view(
        nodes, pods, jobs.values(), spec.budgets, hard_rules(), scope_labels=spec.scope_labels
    )


def budget(name: str, job: str, *, max_unavailable: int, allowed: int) -> pb.DisruptionBudget:
    b = pb.DisruptionBudget(metadata=pb.ObjectMeta(name=name))
    b.spec.job = job
    b.spec.max_unavailable = max_unavailable
    b.status.disruptions_allowed = allowed
    b.status.current_healthy = 3
    return b


def move(pod: str, job: str = "web", source: str = "a", target: str = "b") -> Move:
    return Move(pod, job, source, target)


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------

BASE = Spec({"a": [("p1", "web", 100, 0), ("p2", "web", 100, 0), ("q1", "db", 100, 0)], "b": []})


@dataclass
class CheckCase:
    id: str
    check: Check
    spec: Spec
    # Moves admitted before the one judged.
    admitted: list[Move]
    judged: Move
    # Substring of the veto, or None when allowed.
    vetoed: str | None
    # Moves of earlier rounds: (moves, generation, seconds before now).
    history: list[tuple[list[Move], int, float]] = field(default_factory=list)
    # Admitted moves taken back before the judged one (a drain that could not finish).
    retracted: list[Move] = field(default_factory=list)


def throttle(
    max_moves: int, window: int = 3600, label_key: str = "", preemptible: bool | None = None
) -> ThrottleArgs:
    return ThrottleArgs(
        label_key=label_key, window_seconds=window, max_moves=max_moves, preemptible=preemptible
    )


def pending(
    max_pending: int | None = None, key: str = "", thresholds: dict[str, int] | None = None
) -> PendingChecker:
    args = PendingCheckerArgs(max_pending, key, thresholds or {})
    args.validate()
    return PendingChecker(args)


GPU_POD = {"p1": {"pool": "gpu"}}  # p1 asks for the gpu sub-cluster; p2 and q1 name none
WEB_PREEMPTIBLE = frozenset({"p1", "p2"})


CHECK_CASES = [
    CheckCase("protection: unmarked pod moves", Protection(), BASE, [], move("p1"), None),
    CheckCase(
        "protection: pod label",
        Protection(),
        Spec(BASE.nodes, pod_labels={"p1": {EXCLUDE_FROM_RESCHEDULING: "true"}}),
        [], move("p1"), "protected",
    ),
    CheckCase(
        "protection: job label protects every pod of the job",
        Protection(),
        Spec(BASE.nodes, jobs={"web": {EXCLUDE_FROM_RESCHEDULING: "True"}}),
        [], move("p2"), "protected",
    ),
    CheckCase(
        "budget: maxUnavailable 0 never disrupted",
        DisruptionBudget(),
        Spec(BASE.nodes, budgets=[budget("web", "web", max_unavailable=0, allowed=0)]),
        [], move("p1"), "web",
    ),
    CheckCase(
        "budget: one allowed: the first move of a round passes",
        DisruptionBudget(),
        Spec(BASE.nodes, budgets=[budget("web", "web", max_unavailable=1, allowed=1)]),
        [], move("p1"), None,
    ),
    CheckCase(
        "budget: one allowed: a second move of the round is refused (the first used it)",
        DisruptionBudget(),
        Spec(BASE.nodes, budgets=[budget("web", "web", max_unavailable=1, allowed=1)]),
        [move("p2")], move("p1"), "allows 0 more disruptions",
    ),
    CheckCase(
        "budget: two allowed: a second move passes",
        DisruptionBudget(),
        Spec(BASE.nodes, budgets=[budget("web", "web", max_unavailable=2, allowed=2)]),
        [move("p2")], move("p1"), None,
    ),
    CheckCase(
        "budget: a retracted move gives its disruption back",
        DisruptionBudget(),
        Spec(BASE.nodes, budgets=[budget("web", "web", max_unavailable=1, allowed=1)]),
        [move("p2")], move("p1"), None, retracted=[move("p2")],
    ),
    CheckCase(
        "budget: a pod no budget selects",
        DisruptionBudget(),
        Spec(BASE.nodes, budgets=[budget("web", "web", max_unavailable=0, allowed=0)]),
        [], move("q1", "db"), None,
    ),
    CheckCase("throttle: first move of a job", Throttle(throttle(1)), BASE, [], move("p1"), None),
    CheckCase(
        "throttle: second move of a job in one round",
        Throttle(throttle(1)), BASE, [move("p2")], move("p1"), "already moved 1",
    ),
    CheckCase(
        "throttle: another job is counted apart",
        Throttle(throttle(1)), BASE, [move("p2")], move("q1", "db"), None,
    ),
    CheckCase(
        "throttle: a move of an earlier round inside the window",
        Throttle(throttle(1)), BASE, [], move("p1"), "already moved 1",
        history=[([move("p2")], 1, 60.0)],
    ),
    CheckCase(
        "throttle: a move of an earlier round outside the window",
        Throttle(throttle(1, window=30)), BASE, [], move("p1"), None,
        history=[([move("p2")], 1, 60.0)],
    ),
    CheckCase(
        "throttle: by label value",
        Throttle(throttle(1, label_key="app")),
        Spec(BASE.nodes, pod_labels={"p1": {"app": "x"}, "q1": {"app": "x"}}),
        [move("q1", "db")], move("p1"), "app=x",
    ),
    CheckCase(
        "throttle: a pod without the label is not throttled",
        Throttle(throttle(0, label_key="app")), BASE, [], move("p1"), None,
    ),
    CheckCase(
        "throttle: a retracted move is not counted",
        Throttle(throttle(1)), BASE, [move("p2")], move("p1"), None, retracted=[move("p2")],
    ),
    CheckCase(
        "throttle limited to preemptible pods: a preemptible pod's second move",
        Throttle(throttle(1, preemptible=True)), Spec(BASE.nodes, preemptible=WEB_PREEMPTIBLE),
        [move("p2")], move("p1"), "already moved 1",
    ),
    CheckCase(
        "throttle limited to preemptible pods: a non-preemptible pod is not limited",
        Throttle(throttle(1, preemptible=True)), BASE, [move("p2")], move("p1"), None,
    ),
    CheckCase(
        "throttle limited to preemptible pods: a non-preemptible pod's move is not counted",
        Throttle(throttle(1, preemptible=True)), Spec(BASE.nodes, preemptible=frozenset({"p1"})),
        [move("p2")], move("p1"), None,
    ),
    CheckCase(
        "throttle limited to preemptible pods: earlier rounds' moves of them count",
        Throttle(throttle(1, preemptible=True)), Spec(BASE.nodes, preemptible=WEB_PREEMPTIBLE),
        [], move("p1"), "already moved 1", history=[([move("p2")], 1, 60.0)],
    ),
    CheckCase(
        "throttle limited to non-preemptible pods: a non-preemptible pod's second move",
        Throttle(throttle(1, preemptible=False)), BASE, [move("p2")], move("p1"), "already moved",
    ),
    CheckCase(
        "throttle limited to non-preemptible pods: a preemptible pod is not limited",
        Throttle(throttle(1, preemptible=False)), Spec(BASE.nodes, preemptible=WEB_PREEMPTIBLE),
        [move("p2")], move("p1"), None,
    ),
    CheckCase(
        "group throttle limited to preemptible pods: a non-preemptible pod is not limited",
        GroupThrottle(throttle(1, preemptible=True)), BASE, [], move("p1"), None,
        history=[([move("p2")], 7, 60.0)],
    ),
    CheckCase(
        "group throttle: many moves in one round count once",
        GroupThrottle(throttle(1)), BASE, [move("p2")], move("p1"), None,
    ),
    CheckCase(
        "group throttle: a second round in the window",
        GroupThrottle(throttle(1)), BASE, [], move("p1"), "round(s)",
        history=[([move("p2")], 7, 60.0)],
    ),
    CheckCase(
        "group throttle: two earlier rounds allowed by max 3",
        GroupThrottle(throttle(3)), BASE, [], move("p1"), None,
        history=[([move("p2")], 7, 60.0), ([move("p2")], 8, 30.0)],
    ),
    CheckCase(
        "pending: no threshold is no limit",
        pending(), Spec(BASE.nodes, pending=50), [], move("p1"), None,
    ),
    CheckCase(
        "pending: within the threshold",
        pending(2), Spec(BASE.nodes, pending=2), [], move("p1"), None,
    ),
    CheckCase(
        "pending: over the threshold",
        pending(2), Spec(BASE.nodes, pending=3), [], move("p1"), "3 pods are pending",
    ),
    CheckCase(
        "pending: only pods that could run in the policy's scope count",
        pending(0),
        Spec(BASE.nodes, pending_selectors=[{"pool": "cpu"}] * 3, scope_labels={"pool": "gpu"}),
        [], move("p1"), None,
    ),
    CheckCase(
        "pending: a threshold counts the pod's own sub-cluster: within",
        pending(1, "pool"),
        Spec(BASE.nodes, pod_selectors=GPU_POD,
             pending_selectors=[{"pool": "cpu"}] * 3 + [{"pool": "gpu"}]),
        [], move("p1"), None,
    ),
    CheckCase(
        "pending: a threshold counts the pod's own sub-cluster: over",
        pending(1, "pool"),
        Spec(BASE.nodes, pod_selectors=GPU_POD, pending_selectors=[{"pool": "gpu"}] * 2),
        [], move("p1"), "2 pods are pending in sub-cluster pool='gpu' (max 1)",
    ),
    CheckCase(
        "pending: a pod naming no sub-cluster is in the default one",
        pending(0, "pool"),
        Spec(BASE.nodes, pending_selectors=[{"pool": "gpu"}] * 3),
        [], move("p2"), None,
    ),
    CheckCase(
        "pending: the default sub-cluster's own pending pods",
        pending(0, "pool"), Spec(BASE.nodes, pending=1), [], move("p2"), "1 pods are pending",
    ),
    CheckCase(
        "pending: a per-sub-cluster threshold beside the default",
        pending(0, "pool", {"gpu": 5}),
        Spec(BASE.nodes, pod_selectors=GPU_POD, pending_selectors=[{"pool": "gpu"}] * 5),
        [], move("p1"), None,
    ),
    CheckCase(
        "pending: the default threshold for a sub-cluster not listed",
        pending(0, "pool", {"gpu": 5}),
        Spec(BASE.nodes, pod_selectors={"q1": {"pool": "cpu"}},
             pending_selectors=[{"pool": "cpu"}]),
        [], move("q1", "db"), "1 pods are pending in sub-cluster pool='cpu' (max 0)",
    ),
    CheckCase(
        "pending: per-sub-cluster thresholds only: other sub-clusters have no limit",
        pending(None, "pool", {"gpu": 0}),
        Spec(BASE.nodes, pod_selectors={"q1": {"pool": "cpu"}},
             pending_selectors=[{"pool": "cpu"}] * 9 + [{"pool": "gpu"}]),
        [], move("q1", "db"), None,
    ),
    CheckCase(
        "pending: per-sub-cluster thresholds only: a listed sub-cluster over its own",
        pending(None, "pool", {"gpu": 0}),
        Spec(BASE.nodes, pod_selectors=GPU_POD, pending_selectors=[{"pool": "gpu"}]),
        [], move("p1"), "(max 0)",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CHECK_CASES, ids=[c.id for c in CHECK_CASES])
def test_check(case: CheckCase) -> None:
    view = view_of(case.spec)
    now = 10_000.0
    for moves, generation, ago in case.history:
        case.check.record(moves, view, generation, now - ago)
    case.check.start_round(view, now)
    for admitted in case.admitted:
        assert case.check.check(view, admitted) is None, admitted
        case.check.admit(view, admitted)
    for retracted in case.retracted:
        case.check.retract(view, retracted)
    reason = case.check.check(view, case.judged)
    if case.vetoed is None:
        assert reason is None
    else:
        assert reason is not None and case.vetoed in reason, reason


# --------------------------------------------------------------------------------------------
# A round
# --------------------------------------------------------------------------------------------


class Fixed:
    """A detector and algorithm that propose exactly the given moves (for round mechanics), as
    the protocol asks: each one the checks do not veto is made on the view."""

    NAME: ClassVar[str] = "Fixed"

    def __init__(self, moves: Sequence[Move]) -> None:
        self.moves = list(moves)

    def detect(self, view: ClusterView) -> list[Detection]:
        return [Detection(m.source, "fixed") for m in self.moves]

    def reschedule(
        self, view: ClusterView, detections: Sequence[Detection], veto: MoveVeto
    ) -> list[Move]:
        chosen = []
        for m in self.moves:
            if veto(m) is None:
                view.move(m.pod, m.target)
                chosen.append(m)
        return chosen


def policy(plugin: Any, checks: Sequence[Check] = (), **kw: Any) -> Policy:
    return Policy(name="p", detector=plugin, algorithm=plugin, checks=list(checks), **kw)


def fragmented_gpus() -> Spec:
    """Three 8-GPU nodes with 2, 1 and 5 GPUs busy: moving a and b onto c frees two nodes."""
    return Spec(
        {
            "a": [("a1", "train", 100, 1), ("a2", "train", 100, 1)],
            "b": [("b1", "train", 100, 1)],
            "c": [(f"c{i}", "infer", 100, 1) for i in range(5)],
        },
        cpu=32000,
        gpus=8,
    )


def test_dry_run_predicts_freed_gpu_nodes_and_changes_nothing() -> None:
    view = view_of(fragmented_gpus())
    bp = BinPacking(BinPackingArgs(resources=GPU, threshold_percentage=50))
    plan = RoundRunner().run(
        policy(bp, detector_args={"resources": GPU}),
        view,
        generation=1,
        dry_run=True,
        trigger="rpc",
    )
    assert plan.outcome == PLANNED, plan.message
    assert sorted((m.pod, m.target) for m in plan.moves) == [("a1", "c"), ("a2", "c"), ("b1", "c")]
    assert plan.simulated == {"a1": "c", "a2": "c", "b1": "c"}
    assert plan.before.whole_free_gpu_nodes == 0 and plan.after is not None
    assert plan.after.whole_free_gpu_nodes == 2
    assert plan.before.gpu_fragmentation > 0.5 and plan.after.gpu_fragmentation == 0.0
    assert plan.after.unplaced_pods == 0
    # The view the round planned against is untouched.
    assert {p.name: p.node for p in view.pods.values()}["a1"] == "a"
    assert len(view.nodes["c"].pods) == 5


def default_policy(name: str) -> Policy:
    """A built-in policy (default_policies.yaml), built as the service builds it."""
    [config] = [c for c in ReschedulerConfig().policy_configs() if c.name == name]
    return build_policy(config)


@pytest.mark.parametrize("name", ["gpu-defrag", "binpacking"])
def test_the_built_in_packing_policies_run_while_large_gpu_pods_wait(name: str) -> None:
    # Whole-machine pods waiting for a free 8-GPU node are what defragmentation is for.
    spec = fragmented_gpus()
    spec.pending_selectors = [{}] * 4
    plan = RoundRunner().run(
        default_policy(name), view_of(spec), generation=1, dry_run=True, trigger="rpc"
    )
    assert plan.outcome == PLANNED, plan.message
    assert plan.moves


def test_a_built_in_policy_holds_back_behind_a_backlog() -> None:
    spec = fragmented_gpus()
    spec.pending = 1001
    plan = RoundRunner().run(
        default_policy("gpu-defrag"), view_of(spec), generation=1, dry_run=True, trigger="rpc"
    )
    assert plan.outcome == NOTHING and not plan.moves, plan.message


@pytest.mark.parametrize(
    ("check", "raw", "named"),
    [
        pytest.param("PendingChecker", {"max_pending": -1}, "max_pending", id="max-pending<0"),
        pytest.param("PendingChecker", {"max_pending": True}, "max_pending", id="max-pending-bool"),
        pytest.param("PendingChecker", {"thresholds": ["gpu"], "sub_cluster_key": "pool"},
                     "thresholds", id="thresholds-not-a-map"),
        pytest.param("PendingChecker", {"thresholds": {"gpu": -1}, "sub_cluster_key": "pool"},
                     "thresholds.gpu", id="threshold<0"),
        pytest.param("PendingChecker", {"thresholds": {"gpu": 1}}, "sub_cluster_key",
                     id="thresholds-without-key"),
        pytest.param("PendingChecker", {"sub_cluster_key": 3}, "sub_cluster_key", id="key-type"),
        pytest.param("PendingChecker", {"max_pendin": 3}, "max_pendin", id="unknown-arg"),
        pytest.param("Throttle", {"preemptible": "yes"}, "preemptible", id="preemptible-str"),
        pytest.param("GroupThrottle", {"preemptible": 1}, "preemptible", id="preemptible-int"),
    ],
)  # fmt: skip
def test_invalid_check_args_are_refused_naming_the_field(
    check: str, raw: dict[str, Any], named: str
) -> None:
    with pytest.raises(PluginConfigError) as refused:
        new_check_registry().get(check).parse_args(raw)
    message = str(refused.value)
    assert message.startswith(f"{check}: ") and named in message and "\n" not in message


def test_a_bad_check_arg_in_a_policy_file_is_one_line_naming_the_entry() -> None:
    text = """
policies:
  - name: pack
    detector: {name: BinPacking}
    algorithm: {name: BinPacking}
    checks: [Protection, {name: PendingChecker, args: {max_pending: -5}}]
"""
    plugins = new_plugin_registry()
    with pytest.raises(PolicyConfigError) as refused:
        load_policies(text, plugins, plugins, new_check_registry())
    assert str(refused.value) == (
        "policies[0] (pack): checks[1]: args: PendingChecker: max_pending must be an int >= 0 "
        "(omitted: no limit), got -5"
    )


def test_valid_check_args_build() -> None:
    registry = new_check_registry()
    checker = registry.get("PendingChecker").build(
        {"max_pending": 10, "sub_cluster_key": "pool", "thresholds": {"gpu": 100}}
    )
    assert isinstance(checker, PendingChecker)
    assert checker.args == PendingCheckerArgs(10, "pool", {"gpu": 100})
    throttle = registry.get("Throttle").build({"preemptible": True, "max_moves": 3})
    assert isinstance(throttle, Throttle) and throttle.args.preemptible is True


def test_nothing_to_do_when_no_node_is_below_threshold() -> None:
    spec = Spec({"a": [("a1", "w", 3000, 0)], "b": [("b1", "w", 3000, 0)]})
    bp = BinPacking(BinPackingArgs(resources={"cpu": 1}, threshold_percentage=50))
    plan = RoundRunner().run(policy(bp), view_of(spec), generation=1, dry_run=True, trigger="rpc")
    assert plan.outcome == NOTHING and plan.moves == []
    assert "found nothing" in plan.message


def test_validation_drops_targets_that_no_longer_fit_and_aborts_past_the_ratio() -> None:
    # b has room for one 3-CPU pod; two are sent there: the second no longer fits.
    spec = Spec({"a": [("a1", "w", 3000, 0), ("a2", "w", 3000, 0)], "b": []}, cpu=4000)
    moves = [move("a1", "w"), move("a2", "w")]
    lenient = RoundRunner().run(
        policy(Fixed(moves), failure_ratio_threshold=0.5),
        view_of(spec), generation=1, dry_run=False, trigger="rpc",
    )  # fmt: skip
    assert lenient.outcome == PLANNED
    assert [m.pod for m in lenient.moves] == ["a1"]
    assert [(m.pod, "insufficient cpu" in r) for m, r in lenient.rejected] == [("a2", True)]
    strict = RoundRunner().run(
        policy(Fixed(moves), failure_ratio_threshold=0.2),
        view_of(spec), generation=1, dry_run=False, trigger="rpc",
    )  # fmt: skip
    assert strict.outcome == ABORTED and "failure ratio 0.50 > 0.2" in strict.message
    assert strict.moves == []


def test_validation_judges_targets_with_every_moving_pod_gone() -> None:
    # A swap: neither fits while the other is still there; with both lifted both fit.
    spec = Spec({"a": [("a1", "w", 3000, 0)], "b": [("b1", "w", 3000, 0)]}, cpu=4000)
    swap = [move("a1", "w", "a", "b"), move("b1", "w", "b", "a")]
    plan = RoundRunner().run(
        policy(Fixed(swap), failure_ratio_threshold=0.0),
        view_of(spec), generation=1, dry_run=True, trigger="rpc",
    )  # fmt: skip
    assert plan.outcome == PLANNED and plan.rejected == []
    assert len(plan.batches) == 1  # a cycle is evicted whole


def test_a_check_veto_on_the_final_plan_aborts_the_round() -> None:
    class VetoAfterProposing(Fixed):
        """Ignores the veto while proposing (a buggy algorithm)."""

        def reschedule(
            self, view: ClusterView, detections: Sequence[Detection], veto: MoveVeto
        ) -> list[Move]:
            return list(self.moves)

    spec = Spec(BASE.nodes, pod_labels={"p1": {EXCLUDE_FROM_RESCHEDULING: "true"}})
    plan = RoundRunner().run(
        policy(VetoAfterProposing([move("p1")]), [Protection()]),
        view_of(spec), generation=1, dry_run=True, trigger="rpc",
    )  # fmt: skip
    assert plan.outcome == ABORTED and "Protection" in plan.message and "p1" in plan.message


def three_web_pods(allowed: int) -> tuple[Spec, list[Move]]:
    """One pod of `web` on each of a, b and c, a budget allowing ``allowed``, and the moves of
    all three to d."""
    spec = Spec(
        {"a": [("w1", "web", 100, 0)], "b": [("w2", "web", 100, 0)], "c": [("w3", "web", 100, 0)],
         "d": []},
        budgets=[budget("web", "web", max_unavailable=allowed, allowed=allowed)],
    )  # fmt: skip
    moves = [move("w1", "web", "a", "d"), move("w2", "web", "b", "d"), move("w3", "web", "c", "d")]
    return spec, moves


@pytest.mark.parametrize(
    ("allowed", "planned"), [(1, 1), (2, 2), (3, 3)], ids=["budget 1", "budget 2", "budget 3"]
)
def test_a_round_plans_no_more_moves_of_a_budget_than_it_allows(allowed: int, planned: int) -> None:
    spec, moves = three_web_pods(allowed)
    plan = RoundRunner().run(
        policy(Fixed(moves), [DisruptionBudget()]),
        view_of(spec), generation=1, dry_run=False, trigger="rpc",
    )  # fmt: skip
    assert plan.outcome == PLANNED, plan.message
    assert [m.pod for m in plan.moves] == [m.pod for m in moves[:planned]]
    # What the plan promises runs at once: one batch within the budget.
    assert len(plan.batches) == 1


def test_the_budget_is_used_up_across_a_drain_and_given_back_when_it_is_undone() -> None:
    """BinPacking drains a first (least used): w1 takes the budget's one disruption, w2 then
    finds none, so a cannot be emptied and w1's move is taken back, with its disruption. b's lone
    pod w3 then moves. Without the check consuming the budget the plan would hold all three moves
    of a budget of one; without the giving back, none."""
    spec = Spec(
        {"a": [("w1", "web", 100, 0), ("w2", "web", 100, 0)], "b": [("w3", "web", 400, 0)],
         "c": [("f1", "filler", 2400, 0)]},
        budgets=[budget("web", "web", max_unavailable=1, allowed=1)],
    )  # fmt: skip
    cpu = BinPacking(BinPackingArgs(resources={"cpu": 1}, threshold_percentage=50))
    plan = RoundRunner().run(
        policy(cpu, [DisruptionBudget()]), view_of(spec), generation=1, dry_run=False,
        trigger="rpc",
    )  # fmt: skip
    assert plan.outcome == PLANNED, plan.message
    assert [(m.pod, m.source, m.target) for m in plan.moves] == [("w3", "b", "c")]


@pytest.mark.parametrize(
    ("allowed", "batches"), [(1, 3), (2, 2), (3, 1)], ids=["budget 1", "budget 2", "budget 3"]
)
def test_without_the_check_batches_respect_the_disruption_budget(
    allowed: int, batches: int
) -> None:
    # A policy that does not list DisruptionBudget plans every move; the generator then cuts
    # the plan into batches each within the budgets (the executor waits for them between).
    spec, moves = three_web_pods(allowed)
    plan = RoundRunner().run(
        policy(Fixed(moves)), view_of(spec), generation=1, dry_run=False, trigger="rpc"
    )
    assert plan.outcome == PLANNED, plan.message
    assert len(plan.batches) == batches
    assert all(len(b) <= allowed for b in plan.batches)


def test_a_swap_that_no_budget_admits_aborts_the_round() -> None:
    # Without the DisruptionBudget check the swap is planned whole; no batch can hold it.
    spec = Spec(
        {"a": [("w1", "web", 100, 0)], "b": [("w2", "web", 100, 0)]},
        budgets=[budget("web", "web", max_unavailable=1, allowed=1)],
    )
    swap = [move("w1", "web", "a", "b"), move("w2", "web", "b", "a")]
    plan = RoundRunner().run(
        policy(Fixed(swap)), view_of(spec), generation=1, dry_run=False, trigger="rpc"
    )
    assert plan.outcome == ABORTED and "disruption budget" in plan.message


def test_simulation_places_a_replacement_elsewhere_when_its_target_does_not_fit() -> None:
    # The plan sends a1 to b, which cannot take it: the simulated scheduler places the
    # replacement wherever its algorithm finds room (a is free once a1 left it, c is empty).
    spec = Spec({"a": [("a1", "w", 3000, 0)], "b": [("b1", "x", 3000, 0)], "c": []}, cpu=4000)
    placed = RoundRunner().simulate(view_of(spec), [[move("a1", "w", "a", "b")]])
    assert set(placed) == {"a1"} and placed["a1"] in ("a", "c")


# --------------------------------------------------------------------------------------------
# The policy manager
# --------------------------------------------------------------------------------------------


async def test_rounds_never_overlap_and_each_starts_from_a_fresh_view() -> None:
    events: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    class Slow(Fixed):
        def detect(self, view: ClusterView) -> list[Detection]:
            events.append(f"detect {view.revision}")
            inside.set()
            release.wait(10)
            return []

    views = 0

    async def fresh(scope: Any) -> ClusterView:
        nonlocal views
        views += 1
        events.append(f"view {views}")
        view = view_of(BASE)
        view.revision = views
        return view

    first, second = (
        Policy("first", Slow([]), Slow([]), []),
        Policy("second", Slow([]), Slow([]), []),
    )
    manager = PolicyManager([first, second], fresh)
    a = asyncio.create_task(manager.run("first", trigger="rpc", dry_run=True))
    await asyncio.to_thread(inside.wait, 10)
    b = asyncio.create_task(manager.run("second", trigger="periodic", dry_run=True))
    await asyncio.sleep(0.2)
    # The second round has not even built its view while the first is planning.
    assert events == ["view 1", "detect 1"]
    assert manager.state("first").running and not manager.state("second").running
    release.set()
    plan_a, plan_b = await asyncio.gather(a, b)
    assert events == ["view 1", "detect 1", "view 2", "detect 2"]
    assert plan_b.generation == plan_a.generation + 1
    assert (plan_a.revision, plan_b.trigger) == (1, "periodic")
    assert manager.state("second").last is plan_b
    with pytest.raises(UnknownPolicyError, match="unknown policy 'third'"):
        await manager.run("third", trigger="rpc", dry_run=True)


# --------------------------------------------------------------------------------------------
# Running gangs: moved whole or not at all
# --------------------------------------------------------------------------------------------


def test_a_gang_the_algorithm_moves_whole_is_moved_in_one_batch() -> None:
    spec = fragmented_gpus()  # every pod of "train" (a1, a2 on a; b1 on b) goes to c
    spec.min_members = {"train": 3}
    bp = BinPacking(BinPackingArgs(resources=GPU, threshold_percentage=50))
    plan = RoundRunner().run(
        policy(bp, [DisruptionBudget()], detector_args={"resources": GPU}),
        view_of(spec), generation=1, dry_run=True, trigger="rpc",
    )  # fmt: skip
    assert plan.outcome == PLANNED, plan.message
    assert sorted(m.pod for m in plan.moves) == ["a1", "a2", "b1"]
    assert [sorted(m.pod for m in batch) for batch in plan.batches] == [["a1", "a2", "b1"]]
    assert plan.left_whole == {}


def test_a_gang_the_algorithm_would_move_in_part_is_left_whole_and_said_so() -> None:
    """ "train" has a third pod on c, the target: draining a would move 2 of its 3 pods, so the
    round plans again with train left where it is (a cannot be drained then), and the plan
    says so; b's pod of another job still moves."""
    spec = fragmented_gpus()
    spec.nodes["b"] = [("b1", "solo", 100, 1)]
    spec.nodes["c"] = [*spec.nodes["c"][:4], ("c4", "train", 100, 1)]
    spec.min_members = {"train": 2}
    bp = BinPacking(BinPackingArgs(resources=GPU, threshold_percentage=50))
    plan = RoundRunner().run(
        policy(bp, detector_args={"resources": GPU}),
        view_of(spec), generation=1, dry_run=True, trigger="rpc",
    )  # fmt: skip
    assert plan.outcome == PLANNED, plan.message
    assert [m.pod for m in plan.moves] == ["b1"]
    assert plan.left_whole == {
        "train": "a running gang (minMember 2) is moved whole or not at all; "
        "BinPacking would move 2 of its 3 pods"
    }
    [left] = plan.to_proto().left_whole
    assert (left.job, left.reason) == ("train", plan.left_whole["train"])
    # The same cluster with train no gang: a is drained as before.
    spec.min_members = {}
    plain = RoundRunner().run(
        policy(bp, detector_args={"resources": GPU}),
        view_of(spec), generation=1, dry_run=True, trigger="rpc",
    )  # fmt: skip
    assert sorted(m.pod for m in plain.moves) == ["a1", "a2", "b1"]


def test_a_gang_whose_target_no_longer_fits_at_validation_is_left_whole() -> None:
    # b has room for one 3-CPU pod; both pods of the gang "w" are sent there.
    spec = Spec({"a": [("a1", "w", 3000, 0), ("a2", "w", 3000, 0)], "b": []}, cpu=4000)
    spec.min_members = {"w": 2}
    moves = [move("a1", "w"), move("a2", "w")]
    plan = RoundRunner().run(
        policy(Fixed(moves), failure_ratio_threshold=0.5),
        view_of(spec), generation=1, dry_run=False, trigger="rpc",
    )  # fmt: skip
    assert plan.outcome == NOTHING and plan.moves == []
    assert dict((m.pod, r.split(":")[0]) for m, r in plan.rejected) == {
        "a2": "NodeResourcesFit",
        "a1": "left whole",
    }
    assert "validation would move 1 of its 2 pods" in plan.left_whole["w"]


def test_godel_reschedule_lists_the_gangs_left_whole_and_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from godel.cli.reschedule import print_plan

    spec = fragmented_gpus()
    spec.nodes["b"] = [("b1", "solo", 100, 1)]
    spec.nodes["c"] = [*spec.nodes["c"][:4], ("c4", "train", 100, 1)]
    spec.min_members = {"train": 2}
    bp = BinPacking(BinPackingArgs(resources=GPU, threshold_percentage=50))
    plan = RoundRunner().run(
        policy(bp, detector_args={"resources": GPU}),
        view_of(spec), generation=1, dry_run=True, trigger="rpc",
    )  # fmt: skip
    print_plan(plan.to_proto())
    out = capsys.readouterr().out
    assert "left whole (a running gang moves whole or not at all):" in out
    [row] = [line for line in out.splitlines() if line.startswith("train ")]
    assert "BinPacking would move 2 of its 3 pods" in row
