"""LoadBalance: move pods off nodes above a high watermark onto nodes below a low one.

Utilisation is framework.utilisation of ``pool`` weighted by ``resources``, by **requests**:
usage reported by the node agent is not in the ClusterView yet, so a node that requests much but
uses little still counts as hot.

Detect: in-scope nodes above ``high_percentage``, most utilised first.

Reschedule: for each detected node (the detection's pods, or all its pods) pods leave one at a
time until the node is ≤ high or no remaining pod can move. Which pod goes next: the smallest
pod whose leaving alone brings the node to ≤ high (one move, and no more load shifted than
needed); if none does, the biggest (fewest moves); ties by name. A pod of the other pool frees
nothing and stays. Its target is the least utilised in-scope node currently below
``low_percentage`` that fits, is not vetoed, and stays ≤ high with the pod; a target that reaches
low stops being one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from placement.framework import PluginSpec
from placement.nodeinfo import GUARANTEED, NodeInfo
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
    validate_pool,
    validate_weights,
)
from services.rescheduler.plugins.targets import RankedNodes, RoomCache, first_target, pod_share

NAME = "LoadBalance"


@dataclass(frozen=True)
class Args:
    resources: dict[str, int] = field(default_factory=default_weights)
    high_percentage: int = 80
    low_percentage: int = 30
    pool: str = GUARANTEED

    def validate(self) -> None:
        validate_weights("resources", self.resources)
        validate_percentage("high_percentage", self.high_percentage)
        validate_percentage("low_percentage", self.low_percentage)
        if self.low_percentage >= self.high_percentage:
            raise ValueError(
                f"low_percentage ({self.low_percentage}) must be below "
                f"high_percentage ({self.high_percentage})"
            )
        validate_pool("pool", self.pool)


class LoadBalance:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: Args) -> None:
        self.args = args

    def detect(self, view: ClusterView) -> list[Detection]:
        high = self.args.high_percentage / 100
        found = []
        for node in view.scoped_nodes():
            used = utilisation(node, self.args.resources, self.args.pool)
            if used > high:
                found.append((-used, node.name))
        return [
            Detection(name, f"utilisation {-minus:.1%} > {self.args.high_percentage}%")
            for minus, name in sorted(found)
        ]

    def reschedule(
        self, view: ClusterView, detections: Sequence[Detection], veto: MoveVeto
    ) -> list[Move]:
        return _Balancing(self.args, view, veto).run(detections)


class _Balancing:
    """The state of one reschedule call: the cool targets ranked least utilised first and the
    room memo."""

    def __init__(self, args: Args, view: ClusterView, veto: MoveVeto) -> None:
        self.weights, self.pool = args.resources, args.pool
        self.high, self.low = args.high_percentage / 100, args.low_percentage / 100
        self.view, self.veto = view, veto
        self.room = RoomCache()
        cool = (n.name for n in view.scoped_nodes() if self._utilisation(n.name) < self.low)
        self.targets = RankedNodes(self._utilisation, cool, descending=False)

    def _utilisation(self, name: str) -> float:
        return utilisation(self.view.nodes[name], self.weights, self.pool)

    def run(self, detections: Sequence[Detection]) -> list[Move]:
        moves: list[Move] = []
        for detection in detections:
            if detection.node in self.view.scope and detection.node in self.view.nodes:
                moves.extend(self._relieve(detection))
        return moves

    def _relieve(self, detection: Detection) -> list[Move]:
        source = detection.node
        node = self.view.nodes[source]
        wanted = set(detection.pods)
        movable = [
            p
            for p in self.view.pods_on(source)
            if (not wanted or p.name in wanted) and self._share(node, p) > 0
        ]
        moves: list[Move] = []
        while movable and self._utilisation(source) > self.high:
            move = self._move_one(node, movable)
            if move is None:
                break
            moves.append(move)
        return moves

    def _move_one(self, node: NodeInfo, movable: list[RunningPod]) -> Move | None:
        """Move the first pod (in :meth:`_next_pods` order) that has a target. Every pod tried
        leaves ``movable``: one without a target now has none later either, as targets only
        fill up or drop out."""
        for pod in self._next_pods(node, movable):
            movable.remove(pod)
            target = first_target(self.view, pod, self._candidates(pod), self.room, self.veto)
            if target is not None:
                move = Move(pod.name, pod.job, node.name, target)
                self.view.move(pod.name, target)
                self.room.freed(node.name)
                self._moved(target)
                return move
        return None

    def _next_pods(self, node: NodeInfo, pods: list[RunningPod]) -> list[RunningPod]:
        """The smallest pods whose leaving alone brings ``node`` to ≤ high, then the rest biggest
        first; ties by name."""
        excess = self._utilisation(node.name) - self.high
        shares = {p.name: self._share(node, p) for p in pods}
        enough = sorted(
            (p for p in pods if shares[p.name] >= excess), key=lambda p: (shares[p.name], p.name)
        )
        short = sorted(
            (p for p in pods if shares[p.name] < excess), key=lambda p: (-shares[p.name], p.name)
        )
        return enough + short

    def _share(self, node: NodeInfo, pod: RunningPod) -> float:
        return pod_share(node, pod.info.req, self.weights, self.pool)

    def _candidates(self, pod: RunningPod) -> Iterator[str]:
        """Cool nodes, least utilised first, that the pod would not push above high (lazy:
        the search usually stops at the first)."""
        for used, name in self.targets.items():
            if used + self._share(self.view.nodes[name], pod) <= self.high:
                yield name

    def _moved(self, target: str) -> None:
        if self._utilisation(target) < self.low:
            self.targets.rank(target)
        else:
            self.targets.discard(target)


def new(args: Args) -> LoadBalance:
    return LoadBalance(args)


SPEC = PluginSpec(NAME, Args, new)
