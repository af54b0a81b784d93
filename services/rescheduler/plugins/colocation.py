"""CoLocation: keep guaranteed and best-effort work apart, or together, as the policy says.

Guaranteed load is framework.utilisation of the guaranteed pool weighted by ``resources``.
Moving best-effort pods never changes it, so target orders are fixed for the whole call.

``mode: separate`` — best-effort work steps aside when guaranteed load rises. Detect: in-scope
nodes whose guaranteed load is above ``guaranteed_threshold_percentage`` and that run best-effort
pods (those pods; most loaded node first). Reschedule: each such pod (by name) moves to the
in-scope node with the least guaranteed load at or below the threshold that fits and is not
vetoed; a pod without one stays (each pod that leaves relieves the node).

``mode: together`` — best-effort work fills the gaps of guaranteed nodes so whole nodes come free.
Detect: in-scope nodes running best-effort pods and no guaranteed pod (fewest pods first). Reschedule:
each such node is drained all-or-nothing (a half-emptied node frees nothing), its pods (by name)
each to the node with the most guaranteed load among in-scope nodes running guaranteed pods.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from placement.framework import PluginSpec
from placement.nodeinfo import BEST_EFFORT, GUARANTEED, NodeInfo
from placement.reservations import is_hold
from services.rescheduler.framework import (
    ClusterView,
    Detection,
    Move,
    MoveVeto,
    RunningPod,
    utilisation,
)
from services.rescheduler.plugins.args import (
    default_weights,
    validate_percentage,
    validate_weights,
)
from services.rescheduler.plugins.targets import RoomCache, drain, first_target

NAME = "CoLocation"
SEPARATE = "separate"
TOGETHER = "together"
MODES = (SEPARATE, TOGETHER)


@dataclass(frozen=True)
class Args:
    mode: str = SEPARATE
    guaranteed_threshold_percentage: int = 70
    resources: dict[str, int] = field(default_factory=default_weights)

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        validate_percentage("guaranteed_threshold_percentage", self.guaranteed_threshold_percentage)
        validate_weights("resources", self.resources)


def _pods_of_pool(node: NodeInfo, pool: str) -> list[str]:
    """The node's pods of ``pool`` (a reservation's hold is room, not a pod to move)."""
    return sorted(name for name, req in node.pods.items() if req.pool == pool and not is_hold(name))


def _runs(node: NodeInfo, pool: str) -> bool:
    return any(req.pool == pool for req in node.pods.values())


def _best_effort_pods(view: ClusterView, detection: Detection) -> list[RunningPod]:
    """The detection's pods (or all the node's) that are still there and best-effort."""
    wanted = set(detection.pods)
    return [
        p
        for p in view.pods_on(detection.node)
        if p.pool == BEST_EFFORT and (not wanted or p.name in wanted)
    ]


class _Mode:
    """One mode's detect and reschedule; the guaranteed load they both read."""

    def __init__(self, args: Args) -> None:
        self.args = args
        self.threshold = args.guaranteed_threshold_percentage / 100

    def load(self, node: NodeInfo) -> float:
        return utilisation(node, self.args.resources, GUARANTEED)


class _Separate(_Mode):
    def detect(self, view: ClusterView) -> list[Detection]:
        found = []
        for node in view.scoped_nodes():
            best_effort = _pods_of_pool(node, BEST_EFFORT)
            load = self.load(node)
            if best_effort and load > self.threshold:
                found.append((-load, node.name, tuple(best_effort)))
        percent = self.args.guaranteed_threshold_percentage
        return [
            Detection(name, f"guaranteed load {-minus:.1%} > {percent}% beside best-effort", pods)
            for minus, name, pods in sorted(found)
        ]

    def reschedule(
        self, view: ClusterView, detections: Sequence[Detection], veto: MoveVeto
    ) -> list[Move]:
        calm = sorted(
            (self.load(n), n.name) for n in view.scoped_nodes() if self.load(n) <= self.threshold
        )
        targets = [name for _, name in calm]
        room = RoomCache()
        moves: list[Move] = []
        for detection in detections:
            for pod in _best_effort_pods(view, detection):
                target = first_target(view, pod, targets, room, veto)
                if target is not None:
                    moves.append(Move(pod.name, pod.job, pod.node, target))
                    view.move(pod.name, target)
                    room.freed(detection.node)
        return moves


class _Together(_Mode):
    def detect(self, view: ClusterView) -> list[Detection]:
        found = []
        for node in view.scoped_nodes():
            best_effort = _pods_of_pool(node, BEST_EFFORT)
            if best_effort and len(best_effort) == len(node.pods):
                found.append((len(best_effort), node.name, tuple(best_effort)))
        return [
            Detection(name, "best-effort pods only: could join guaranteed nodes", pods)
            for _, name, pods in sorted(found)
        ]

    def reschedule(
        self, view: ClusterView, detections: Sequence[Detection], veto: MoveVeto
    ) -> list[Move]:
        hosts = sorted((-self.load(n), n.name) for n in view.scoped_nodes() if _runs(n, GUARANTEED))
        targets = [name for _, name in hosts]
        room = RoomCache()
        moves: list[Move] = []
        for detection in detections:
            if detection.node not in view.scope or detection.node not in view.nodes:
                continue
            drained = drain(
                view,
                _best_effort_pods(view, detection),
                lambda pod: first_target(view, pod, targets, room, veto),
                lambda move: room.freed(move.source),
            )
            moves.extend(drained or ())
        return moves


class CoLocation:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: Args) -> None:
        self.args = args
        self._mode = _Separate(args) if args.mode == SEPARATE else _Together(args)

    def detect(self, view: ClusterView) -> list[Detection]:
        return self._mode.detect(view)

    def reschedule(
        self, view: ClusterView, detections: Sequence[Detection], veto: MoveVeto
    ) -> list[Move]:
        return self._mode.reschedule(view, detections, veto)


def new(args: Args) -> CoLocation:
    return CoLocation(args)


SPEC = PluginSpec(NAME, Args, new)
