"""BinPacking (defragmentation): empty the least-used nodes onto already-used ones so whole nodes
come free — with ``resources: {gpu: 1}``, whole GPU machines (scope such a policy to GPU nodes, or
CPU-only nodes, at utilisation 0, are drained onto them).

Detect: in-scope nodes running at least one pod whose utilisation (framework.utilisation of
``pool``, weighted by ``resources``) is ≤ ``threshold_percentage``, least utilised first.

Reschedule: each detected node in turn is drained all-or-nothing (a half-emptied node frees
nothing): its pods, biggest share of the node first, each to the fullest in-scope node that fits,
is not vetoed, already has utilisation > 0 (an empty node is never a target) and passes the
target rule. If some pod has no target, the node's earlier moves are undone in the view and the
next node is tried. A node that received pods in this call is not drained later in it.

The target rule is the original's (its BinPacking check): the target's utilisation must be at
least the source's **after the moving pod has left it** — a pod never leaves a node that would
still be fuller than where it goes. With the original's case (10-CPU nodes, ``cpu`` weighted):

    ======================  ======================  ==========  ========================
    source (pods, CPU)      target (pods, CPU)      moving pod  verdict
    ======================  ======================  ==========  ========================
    n2: p2 2 + p3 2 = 40 %  n1: p1 2 = 20 %         p3          allowed (20 % ≤ 20 %)
    n2: p2 3 + p3 2 = 50 %  n1: p1 2 = 20 %         p3          refused (30 % > 20 %)
    ======================  ======================  ==========  ========================

The source's utilisation before the pod leaves (40 % in the first row) is not the bound: that
would refuse moves the original makes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from placement.framework import PluginSpec
from placement.nodeinfo import GUARANTEED
from services.rescheduler.framework import (
    RESOURCE_INDEX,
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
from services.rescheduler.plugins.targets import (
    RankedNodes,
    RoomCache,
    drain,
    first_target,
    pod_share,
    undo,
    utilisation_ceiling,
)

NAME = "BinPacking"


@dataclass(frozen=True)
class Args:
    resources: dict[str, int] = field(default_factory=default_weights)
    threshold_percentage: int = 50
    pool: str = GUARANTEED

    def validate(self) -> None:
        validate_weights("resources", self.resources)
        validate_percentage("threshold_percentage", self.threshold_percentage)
        validate_pool("pool", self.pool)


class BinPacking:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: Args) -> None:
        self.args = args

    def detect(self, view: ClusterView) -> list[Detection]:
        limit = self.args.threshold_percentage / 100
        found = []
        for node in view.scoped_nodes():
            if node.pods:
                used = utilisation(node, self.args.resources, self.args.pool)
                if used <= limit:
                    found.append((used, node.name))
        threshold = self.args.threshold_percentage
        return [
            Detection(name, f"utilisation {used:.1%} <= {threshold}%")
            for used, name in sorted(found)
        ]

    def reschedule(
        self, view: ClusterView, detections: Sequence[Detection], veto: MoveVeto
    ) -> list[Move]:
        return pack(self.args, view, detections, veto)


def pack(
    args: Args,
    view: ClusterView,
    detections: Sequence[Detection],
    veto: MoveVeto,
    keep: Callable[[list[Move]], bool] | None = None,
) -> list[Move]:
    """Drain the detected nodes in turn (the module docstring's rule). ``keep`` judges each
    complete drain once it is made in the view: False undoes it (GpuDefrag keeps only drains
    that do not raise the expected GPU fragmentation)."""
    return _Packing(args, view, veto, keep).run(detections)


class _Packing:
    """The state of one reschedule call: targets ranked fullest first, the room memo, the node
    being drained and the nodes that received pods."""

    def __init__(
        self,
        args: Args,
        view: ClusterView,
        veto: MoveVeto,
        keep: Callable[[list[Move]], bool] | None = None,
    ) -> None:
        self.weights, self.pool = args.resources, args.pool
        self.view, self.veto, self.keep = view, veto, keep
        self.room = RoomCache()
        self.received: set[str] = set()
        self.draining = ""
        scoped = view.scoped_nodes()
        used = (n.name for n in scoped if self._utilisation(n.name) > 0)
        # The smallest request per pool and resource of any pod in the view: a node with less
        # free than that (or no pod slot) can take no pod at all, and leaves the ranking.
        self.smallest = _smallest_requests(view)
        used = (name for name in used if self._can_take_any(name))
        self.targets = RankedNodes(self._utilisation, used, descending=True)
        # Per resource, the biggest capacity among the candidates (see utilisation_ceiling).
        self.largest = [
            max((n.capacity[self.pool][i] for n in scoped), default=0)
            for i in RESOURCE_INDEX.values()
        ]

    def _utilisation(self, name: str) -> float:
        return utilisation(self.view.nodes[name], self.weights, self.pool)

    def run(self, detections: Sequence[Detection]) -> list[Move]:
        moves: list[Move] = []
        for detection in detections:
            source = detection.node
            if source in self.received or source not in self.view.scope:
                continue
            if source in self.view.nodes:
                moves.extend(self._drain(source))
        return moves

    def _drain(self, source: str) -> list[Move]:
        node = self.view.nodes[source]
        pods = sorted(
            self.view.pods_on(source),
            key=lambda p: (-pod_share(node, p.info.req, self.weights, p.pool), p.name),
        )
        self.draining = source
        self.targets.discard(source)
        moves = drain(self.view, pods, self._target_for, self._moved)
        self.draining = ""
        if moves is not None and self.keep is not None and not self.keep(moves):
            undo(self.view, moves, self._moved)
            moves = None
        if moves is None:
            self._rerank(source)
            return []
        self.received.update(move.target for move in moves)
        return moves

    def _target_for(self, pod: RunningPod) -> str | None:
        floor = source_after_leaving(self.view, pod, self.weights, self.pool)
        # Skip, by bisection, the nodes too full to take the pod whatever their shape.
        ceiling = utilisation_ceiling(pod.info.req, self.weights, self.pool, self.largest)
        ranked = self.targets.items() if ceiling is None else self.targets.items_below(ceiling)
        return first_target(self.view, pod, _at_least(floor, ranked), self.room, self.veto)

    def _moved(self, move: Move) -> None:
        self.room.freed(move.source)
        self._rerank(move.source)
        self._rerank(move.target)

    def _rerank(self, name: str) -> None:
        if name != self.draining and self._utilisation(name) > 0 and self._can_take_any(name):
            self.targets.rank(name)
        else:
            self.targets.discard(name)

    def _can_take_any(self, name: str) -> bool:
        """False when ``name`` is too full for even the smallest pod: the scan for every later
        pod would only walk past it (full nodes rank first)."""
        node = self.view.nodes[name]
        if len(node.pods) >= node.max_pods:
            return False
        for pool, smallest in self.smallest.items():
            free = node.free(pool)
            if all(f >= need for f, need in zip(free, smallest, strict=True)):
                return True
        return False


def source_after_leaving(
    view: ClusterView, pod: RunningPod, weights: dict[str, int], pool: str
) -> float:
    """The target rule's floor: the utilisation of the pod's node (as the view has it) once the
    pod has left it. Utilisation is linear in the requests, so that is the node's less the pod's
    share; a hair is taken off so that a target exactly as full is not lost to rounding."""
    node = view.nodes[pod.node]
    return utilisation(node, weights, pool) - pod_share(node, pod.info.req, weights, pool) - 1e-9


def target_allowed(view: ClusterView, pod: str, target: str, args: Args) -> bool:
    """The target rule (see the module docstring): ``target``'s utilisation is at least that of
    ``pod``'s node after the pod left it."""
    running = view.pods[pod]
    floor = source_after_leaving(view, running, args.resources, args.pool)
    return utilisation(view.nodes[target], args.resources, args.pool) >= floor


def _smallest_requests(view: ClusterView) -> dict[str, tuple[int, int, int]]:
    """Per pool, the smallest cpu, memory and gpu request among the view's pods."""
    smallest: dict[str, list[int]] = {}
    for pod in view.pods.values():
        req = pod.info.req
        q = req.requests
        amounts = (q.cpu, q.mem, q.gpus)
        current = smallest.get(req.pool)
        if current is None:
            smallest[req.pool] = list(amounts)
        else:
            for i, amount in enumerate(amounts):
                current[i] = min(current[i], amount)
    return {pool: (v[0], v[1], v[2]) for pool, v in smallest.items()}


def _at_least(floor: float, ranked: Iterator[tuple[float, str]]) -> Iterator[str]:
    """The names of a descending ranking down to utilisation ``floor``."""
    for used, name in ranked:
        if used < floor:
            return
        yield name


def new(args: Args) -> BinPacking:
    return BinPacking(args)


SPEC = PluginSpec(NAME, Args, new)
