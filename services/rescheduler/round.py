"""One rescheduling round of one policy: detect → propose → validate → check → batch, and for a
dry run, simulate.

The round's view is the cluster as the round found it and is never changed: the algorithm works
on its own copy (its scratch moves never leak into the next step), and validation and the
simulation on theirs; detection and the checks only read it.

1. **Detect**: the detector names the nodes (and pods) to relieve. Nothing found: done.
2. **Propose**: the algorithm proposes moves, consulting the checks as it goes. Every move it
   makes on its view is admitted by the checks at once (as the original assumes each chosen
   move in its check stores): a disruption budget's allowance and a throttle's moves are used up
   by it, so a round never plans more moves than a budget allows; a move the algorithm takes
   back (a drain that could not finish) is retracted.
3. **Validate**: every moving pod is taken off its node first, then each target is re-judged by
   the placement library's filters in order (earlier moves assumed). Targets that no longer fit
   are dropped; more than ``failure_ratio_threshold`` of them aborts the round.
4. **Check**: the checks judge the final plan from scratch; any veto aborts the round (the
   algorithm already respected them, so a veto here means the plan is wrong, not unlucky).
5. **Batch**: the movement generator orders the moves into batches each within the disruption
   budgets; moves that can never be admitted abort the round.
6. **Simulate** (dry run): batch by batch, the moving pods leave their nodes and replacements are
   placed by the real scheduling algorithm (``placement.search``) on a copy of the state, with
   the plan's targets as recommended nodes (``UnitInfo.preferred``), exactly as the shards treat
   a Movement. The figures after come from there.

Plain synchronous code over the view: the service runs it off the event loop.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from placement.budgets import BudgetTracker
from placement.framework import Framework, PodInfo, Profile, UnitInfo
from placement.gpu import gpu_shapes, pin_cards
from placement.gpufrag import Policy as GpuPolicy
from placement.plugins import gpufragmentation, new_in_tree_registry
from placement.plugins.numatopology import pin_numa
from placement.search import UnitScheduler
from placement.snapshot import Snapshot
from protos.godel.v1 import api_pb2 as api
from services.rescheduler import metrics
from services.rescheduler.framework import (
    Algorithm,
    Check,
    ClusterView,
    Detection,
    Detector,
    Move,
)
from services.rescheduler.gangs import GangVeto, drop_partial_gangs, gang_groups, partial_gangs
from services.rescheduler.generator import InfeasiblePlanError, plan_batches
from services.rescheduler.plugins.topologyspread import spread_share

PLANNED = "planned"
NOTHING = "nothing to do"
ABORTED = "aborted"

DEFAULT_WEIGHTS = {"cpu": 1, "memory": 1}
# Suffix of a simulated replacement's name (a real one gets its own name from its job).
REPLACEMENT_SUFFIX = "~replacement"
# How many times the algorithm may run to plan without moving a running gang in part: each run
# leaves the gangs the previous one moved in part (``gangs.py``); what a last run still moves
# in part is dropped.
GANG_PASSES = 3


@dataclass
class Policy:
    """A configured policy with its plugins built."""

    name: str
    detector: Detector
    algorithm: Algorithm
    checks: list[Check]
    scope_labels: dict[str, str] = field(default_factory=dict)
    failure_ratio_threshold: float = 0.2
    # The detector's args: the figures use its resource weights and topology key, if any.
    detector_args: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Figures:
    nodes: int = 0
    pods: int = 0
    free_nodes: int = 0
    utilisation_spread: float = 0.0
    gpu_fragmentation: float = 0.0
    whole_free_gpu_nodes: int = 0
    spread_share: float = 0.0
    unplaced_pods: int = 0
    expected_gpu_fragmentation: float = 0.0

    def to_proto(self) -> api.ClusterFigures:
        return api.ClusterFigures(**dataclasses.asdict(self))


@dataclass
class RoundPlan:
    """What a round decided: the moves in batches, what was dropped and why, the predicted effect."""

    policy: str
    generation: int
    dry_run: bool
    trigger: str
    outcome: str = NOTHING
    message: str = ""
    batches: list[list[Move]] = field(default_factory=list)
    rejected: list[tuple[Move, str]] = field(default_factory=list)
    before: Figures = field(default_factory=Figures)
    after: Figures | None = None
    # Dry run: pod -> the node its simulated replacement got ("" = none).
    simulated: dict[str, str] = field(default_factory=dict)
    started_ms: int = 0
    duration_ms: int = 0
    revision: int = 0
    detected_nodes: int = 0
    # Executed rounds: the Movements created, one per batch evicted, and the pods evicted.
    movements: list[str] = field(default_factory=list)
    evicted: int = 0
    # Running gangs left where they are: job -> why (a gang moves whole or not at all).
    left_whole: dict[str, str] = field(default_factory=dict)
    # Executed rounds: moves dropped before eviction because their room could not be reserved
    # (each in ``rejected`` with why).
    unreserved: int = 0

    @property
    def moves(self) -> list[Move]:
        return [m for batch in self.batches for m in batch]

    def to_proto(self) -> api.Plan:
        out = api.Plan(
            policy=self.policy,
            generation=self.generation,
            dry_run=self.dry_run,
            outcome=self.outcome,
            message=self.message,
            batches=len(self.batches),
            before=self.before.to_proto(),
            started_ms=self.started_ms,
            duration_ms=self.duration_ms,
            revision=self.revision,
            detected_nodes=self.detected_nodes,
            trigger=self.trigger,
            movements=self.movements,
            evicted=self.evicted,
            unreserved=self.unreserved,
        )
        if self.after is not None:
            out.after.CopyFrom(self.after.to_proto())
        for index, batch in enumerate(self.batches):
            for m in batch:
                out.moves.add(
                    pod=m.pod,
                    job=m.job,
                    from_node=m.source,
                    to_node=m.target,
                    batch=index,
                    simulated_node=self.simulated.get(m.pod, ""),
                )
        for m, reason in self.rejected:
            out.rejected.add(pod=m.pod, from_node=m.source, to_node=m.target, reason=reason)
        for job, reason in self.left_whole.items():
            out.left_whole.add(job=job, reason=reason)
        return out


def _vetoes(
    checks: Sequence[Check], view: ClusterView, gangs: GangVeto | None = None
) -> Callable[[Move], str | None]:
    def veto(move: Move) -> str | None:
        if gangs is not None and (reason := gangs(move)) is not None:
            return reason
        for check in checks:
            reason = check.check(view, move)
            if reason is not None:
                return f"{check.NAME}: {reason}"
        return None

    return veto


class _Admissions:
    """Keeps the checks' count of a round's moves in step with the algorithm's view (its
    ``move_listener``): a pod that leaves its node is admitted, one put back is retracted, and
    one moved on again is counted once, from its own node to the latest target."""

    def __init__(self, checks: Sequence[Check], view: ClusterView) -> None:
        self._checks = checks
        self._view = view
        self._admitted: dict[str, Move] = {}  # pod -> its move as the checks count it

    def moved(self, pod: str, source: str, target: str) -> None:
        origin = source
        earlier = self._admitted.pop(pod, None)
        if earlier is not None:
            origin = earlier.source
            for check in self._checks:
                check.retract(self._view, earlier)
        if target == origin:
            return
        move = Move(pod, self._view.pods[pod].job, origin, target)
        for check in self._checks:
            check.admit(self._view, move)
        self._admitted[pod] = move


class _BatchBudget:
    """A fresh copy of the disruption budgets for one batch (the generator's BatchBudget)."""

    def __init__(self, view: ClusterView) -> None:
        self._view = view
        self._tracker = BudgetTracker(view.budgets)

    def admit(self, moves: Sequence[Move]) -> str | None:
        pods = [self._view.pods[m.pod].pod for m in moves if m.pod in self._view.pods]
        broken = self._tracker.violations(pods)
        if broken:
            return "; ".join(broken)
        self._tracker.admit(pods)
        return None


class RoundRunner:
    """Runs rounds; holds the scheduling framework the dry run simulates replacements with."""

    def __init__(self, scheduling: Framework | None = None) -> None:
        self.scheduling = scheduling or Framework(Profile(), new_in_tree_registry())

    def run(
        self,
        policy: Policy,
        view: ClusterView,
        *,
        generation: int,
        dry_run: bool,
        trigger: str,
        now: float | None = None,
    ) -> RoundPlan:
        started = time.time() if now is None else now
        clock = time.perf_counter()
        plan = RoundPlan(
            policy.name,
            generation,
            dry_run,
            trigger,
            started_ms=int(started * 1000),
            revision=view.revision,
        )
        view.share_policy = self.learn_shapes(view)
        plan.before = self._figures(policy, view)
        try:
            self._plan(policy, view, plan, started)
        finally:
            plan.duration_ms = int((time.perf_counter() - clock) * 1000)
        return plan

    def _plan(self, policy: Policy, view: ClusterView, plan: RoundPlan, now: float) -> None:
        # Detectors only read the view (the protocol says so); algorithms get their own copy.
        detections = policy.detector.detect(view)
        plan.detected_nodes = len({d.node for d in detections})
        if not detections:
            plan.message = f"{policy.detector.NAME} found nothing to relieve"
            return

        moves = self._propose(policy, view, detections, plan, now)
        if not moves:
            plan.message = (
                f"{policy.detector.NAME} found {plan.detected_nodes} node(s) to relieve, but "
                f"{policy.algorithm.NAME} found no move that fits and passes the checks"
                + (
                    f" ({len(plan.left_whole)} running gang(s) left whole)"
                    if plan.left_whole
                    else ""
                )
            )
            return

        moves, misfits = validate_targets(view, moves)
        # A gang one of whose targets no longer fits cannot move whole: it stays.
        moves, broken, left = drop_partial_gangs(view, moves, "validation")
        plan.left_whole.update(left)
        plan.rejected = [*plan.rejected, *misfits, *broken]
        total = len(moves) + len(misfits) + len(broken)
        ratio = len(misfits) / total
        if ratio > policy.failure_ratio_threshold:
            plan.outcome = ABORTED
            plan.message = (
                f"{len(misfits)} of {total} planned targets no longer fit (failure ratio "
                f"{ratio:.2f} > {policy.failure_ratio_threshold:g})"
            )
            return
        if not moves:
            plan.message = (
                f"no move left once {len(misfits)} target(s) that no longer fit and the moves "
                f"of {len(left)} gang(s) that could not move whole were dropped"
            )
            return

        # Checks read the view and keep their own round state: the plan is judged against the
        # cluster as it is, move by move.
        for check in policy.checks:
            check.start_round(view, now)
        veto = _vetoes(policy.checks, view, GangVeto(plan.left_whole))
        for move in moves:
            reason = veto(move)
            if reason is not None:
                plan.outcome = ABORTED
                plan.message = f"move of {move.pod} to {move.target} vetoed: {reason}"
                return
            for check in policy.checks:
                check.admit(view, move)

        budget = (lambda: _BatchBudget(view)) if view.budgets else None
        try:
            plan.batches = plan_batches(moves, budget, together=gang_groups(view, moves))
        except InfeasiblePlanError as exc:
            plan.outcome = ABORTED
            pods = ", ".join(m.pod for m in exc.remaining[:5])
            plan.message = f"no batch within the disruption budgets can move {pods}: {exc.reason}"
            return

        plan.outcome = PLANNED
        after = view.copy()
        if plan.dry_run:
            plan.simulated = self.simulate(view, plan.batches)
            for pod, node in plan.simulated.items():
                if node:
                    after.move(pod, node)
                else:
                    after.remove(pod)
        else:
            for move in plan.moves:
                after.move(move.pod, move.target)
        plan.after = self._figures(policy, after)
        plan.after.unplaced_pods = sum(1 for node in plan.simulated.values() if not node)
        batches = len(plan.batches)
        plan.message = f"{len(plan.moves)} move(s) in {batches} batch(es)"

    def _propose(
        self,
        policy: Policy,
        view: ClusterView,
        detections: Sequence[Detection],
        plan: RoundPlan,
        now: float,
    ) -> list[Move]:
        """The algorithm's moves on its own copy of the view, the checks consulted as it goes;
        run again (at most ``GANG_PASSES`` times in all) with the running gangs it moved only in
        part left where they are (``plan.left_whole``), and what a last run still moves in part
        dropped."""
        mover = policy.algorithm.NAME
        moves: list[Move] = []
        for _ in range(GANG_PASSES):
            proposing = view.copy()
            for check in policy.checks:
                check.start_round(proposing, now)
            proposing.move_listener = _Admissions(policy.checks, proposing).moved
            veto = _vetoes(policy.checks, proposing, GangVeto(plan.left_whole))
            moves = policy.algorithm.reschedule(proposing, detections, veto)
            partial = partial_gangs(view, moves)
            if not partial:
                return moves
            for gang in partial:
                plan.left_whole[gang.job] = gang.reason(mover)
        kept, dropped, left = drop_partial_gangs(view, moves, mover)
        plan.left_whole.update(left)
        plan.rejected.extend(dropped)
        return kept

    def learn_shapes(self, view: ClusterView) -> GpuPolicy | None:
        """Teach the scheduling profile's GpuFragmentation score the running pods' GPU shapes
        (the mix the shards' windows hold) and return the policy a share's card is chosen by:
        the simulation's searches and the round's moves (``ClusterView.share_policy``) pick
        the card the shards would. None: best fit (a profile without the score, or one of its
        non-learning policies)."""
        score = self.scheduling.plugins.get(gpufragmentation.NAME)
        if isinstance(score, gpufragmentation.GpuFragmentation):
            score.learn(gpu_shapes(running.info.req for running in view.pods.values()))
        return self.scheduling.share_policy()

    # -- dry run -----------------------------------------------------------------------------

    def simulate(self, view: ClusterView, batches: Sequence[Sequence[Move]]) -> dict[str, str]:
        """Replay ``batches`` on a copy of the state: each batch's pods leave their nodes, then
        their replacements are placed by the scheduling algorithm with the plan's targets as
        recommended nodes — what the shards do with a Movement. Returns pod -> the node its
        replacement got ("" = none fit)."""
        snapshot = Snapshot.of(view.nodes.values())
        search = UnitScheduler(self.scheduling)
        placed: dict[str, str] = {}
        keys: dict[tuple[object, ...], bytes] = {}
        for batch in batches:
            for move in batch:
                snapshot.forget(move.pod, move.source)
            by_job: dict[str, list[Move]] = defaultdict(list)
            for move in batch:
                by_job[move.job].append(move)
            for job, moves in sorted(by_job.items()):
                infos = [_replacement(view, m.pod, keys) for m in moves]
                replacements = {info.name: m for info, m in zip(infos, moves, strict=True)}
                unit = UnitInfo(
                    job,
                    1,
                    0,
                    infos[0].priority,
                    infos,
                    preferred=[(m.target, "plan") for m in moves],
                )
                result = search.schedule(unit, snapshot)
                got = {p.pod: p.node for p in result.placements}
                for name, move in replacements.items():
                    placed[move.pod] = got.get(name, "")
        return placed

    # -- figures -----------------------------------------------------------------------------

    def _figures(self, policy: Policy, view: ClusterView) -> Figures:
        weights = policy.detector_args.get("resources") or DEFAULT_WEIGHTS
        scoped = [view.nodes[n] for n in view.scope if n in view.nodes]
        gpu = metrics.gpu_figures(view)
        figures = Figures(
            nodes=len(scoped),
            pods=sum(len(info.pods) for info in scoped),
            free_nodes=metrics.free_nodes(view),
            utilisation_spread=metrics.utilisation_spread(view, dict(weights)),
            gpu_fragmentation=gpu.fragmentation,
            whole_free_gpu_nodes=gpu.whole_free_nodes,
            expected_gpu_fragmentation=gpu.expected_fragmentation,
        )
        key = policy.detector_args.get("topology_key")
        if isinstance(key, str) and key:
            figures.spread_share = spread_share(
                view,
                key,
                int(policy.detector_args.get("max_skew", 1)),
                int(policy.detector_args.get("min_pods", 2)),
            )
        return figures


def validate_targets(
    view: ClusterView, moves: Sequence[Move]
) -> tuple[list[Move], list[tuple[Move, str]]]:
    """Take every moving pod off its node, then re-judge each target in order with the
    placement filters, assuming the moves that fit. Returns (fitting moves, dropped + why)."""
    nodes = {name: info.clone() for name, info in view.nodes.items()}
    for move in moves:
        source = nodes.get(move.source)
        if source is not None:
            source.remove_pod(move.pod)
    kept: list[Move] = []
    dropped: list[tuple[Move, str]] = []
    for move in moves:
        running = view.pods.get(move.pod)
        target = nodes.get(move.target)
        if running is None:
            dropped.append((move, "pod is gone"))
            continue
        if target is None:
            dropped.append((move, f"node {move.target} is gone"))
            continue
        status = view.framework.run_filters(running.info, target)
        if status is None:
            status = view.job_affinity_status(running, target)
        if status is not None:
            dropped.append((move, f"{status.plugin}: {', '.join(status.reasons)}"))
            continue
        # Its NUMA nodes there, if bound, and its GPU cards there, if it asks GPUs.
        target.add_pod(pin_cards(target, pin_numa(target, running.info.req), view.share_policy))
        kept.append(move)
    return kept, dropped


def _replacement(view: ClusterView, pod: str, keys: dict[tuple[object, ...], bytes]) -> PodInfo:
    """The pod a moved pod's job gets instead: same template, its own name. Its feasible-node
    cache key groups replacements whose filter and score inputs are equal (``keys`` numbers the
    distinct ones), which is what the template key promises, without serialising templates."""
    running = view.pods[pod]
    info, name = running.info, pod + REPLACEMENT_SUFFIX
    req = info.req
    q = req.requests
    inputs = (
        req.pool, q.cpu, q.mem, q.gpus, req.gpu_models, req.host_ports, req.numa_policy,
        info.node_selector, info.required_terms, info.preferred_terms, info.tolerations,
    )  # fmt: skip
    return info.renamed(name, keys.setdefault(inputs, len(keys).to_bytes(8, "big")))
