"""LoadBalance: move pods off nodes above a high watermark onto nodes below a low one, by what
the nodes measurably carry: CPU load and network bandwidth load, as their agents report them.

Two dimensions per node:

- **compute**: framework.weighted_fraction of ``resources`` over [cpu, memory, gpu]. A node with
  a measured load (``view.loads``) counts its measured CPU and memory (the whole node's, every
  pool) over its allocatable, and its requested GPUs (a GPU is held, not measured). A node
  without one (no report, or too old) falls back to its requests of ``pool`` over that pool's
  capacity: utilisation by requests, as before measurement.
- **network**: measured bytes/s over the node's bandwidth; 0 for a node without a measurement
  (no pod requests bandwidth, so there is nothing to fall back to).

The watermarks: ``high_percentage`` / ``low_percentage`` for compute,
``network_high_percentage`` / ``network_low_percentage`` for network.

What a pod is estimated to use: on a measured node, its requests scaled by what that node's
pods use per unit requested (the pods' measured use ÷ their requests, per resource: a process
node's agent measures its pods apart from the rest of the machine; the network by the pods'
share of the node's CPU and the pod's share of the requested CPU); on an unmeasured node, its
requests. Moving it takes that off its node and
adds it to the target counted the target's way (its estimate on a measured target, its requests
on an unmeasured one).

Detect: in-scope nodes above high in either dimension, the most loaded (the higher of the two
fractions) first.

Reschedule: for each detected node (the detection's pods, or all its pods; only pods of
``pool`` move) pods leave one at a time while the node is above high in either dimension. Which
pod goes next: the smallest pod whose leaving alone brings the node to ≤ high in both (one move,
and no more load shifted than needed); if none does, the one relieving the exceeded dimensions
most (fewest moves); ties by name. Its target is the least loaded in-scope node below low in
both dimensions that fits (the placement filters, ``view.fits``), is not vetoed, and stays ≤ high
in both with the pod; a target that reaches low in either stops being one. A node whose moves
cannot bring it to ≤ high in both dimensions keeps its pods: its moves are undone (moving load
around without cooling the hot node is churn).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from placement.framework import PluginSpec
from placement.nodeinfo import BEST_EFFORT, GUARANTEED, NodeInfo
from services.rescheduler.framework import (
    ClusterView,
    Detection,
    Move,
    MoveVeto,
    RunningPod,
    weighted_fraction,
)
from services.rescheduler.plugins.args import (
    default_weights,
    validate_percentage,
    validate_pool,
    validate_weights,
)
from services.rescheduler.plugins.targets import RankedNodes, RoomCache, first_target, undo

NAME = "LoadBalance"

# A load vector: [milli-CPU, memory bytes, GPUs, network bytes/s].
Amounts = tuple[int, int, int, int]


@dataclass(frozen=True)
class Args:
    resources: dict[str, int] = field(default_factory=default_weights)
    high_percentage: int = 80
    low_percentage: int = 30
    network_high_percentage: int = 80
    network_low_percentage: int = 30
    pool: str = GUARANTEED

    def validate(self) -> None:
        validate_weights("resources", self.resources)
        for prefix in ("", "network_"):
            high, low = f"{prefix}high_percentage", f"{prefix}low_percentage"
            validate_percentage(high, getattr(self, high))
            validate_percentage(low, getattr(self, low))
            if getattr(self, low) >= getattr(self, high):
                raise ValueError(
                    f"{low} ({getattr(self, low)}) must be below {high} ({getattr(self, high)})"
                )
        validate_pool("pool", self.pool)


class NodeLoads:
    """Every node's load in its own basis (measured, or requests where no measurement), kept
    in step with the moves of one reschedule call."""

    def __init__(self, view: ClusterView, weights: dict[str, int], pool: str) -> None:
        self.view, self.weights, self.pool = view, weights, pool
        self.amounts: dict[str, list[int]] = {}
        self.capacity: dict[str, Amounts] = {}
        # Per measured node: measured ÷ requested for cpu and memory, and network per milli-CPU
        # requested, as it was when the round began (where its pods' estimates come from).
        self._ratios: dict[str, tuple[float, float, float]] = {}
        for name, node in view.nodes.items():
            load = view.loads.get(name)
            if load is None:
                cap, used = node.capacity[pool], node.requested[pool]
                self.amounts[name] = [used[0], used[1], used[2], 0]
                self.capacity[name] = (cap[0], cap[1], cap[2], 0)
                continue
            cap = node.capacity[GUARANTEED]
            gpus = node.requested[GUARANTEED][2]
            self.amounts[name] = [
                load.milli_cpu,
                load.memory_bytes,
                gpus,
                load.network_bytes_per_second,
            ]
            self.capacity[name] = (cap[0], cap[1], cap[2], load.network_capacity_bytes_per_second)
            cpu = node.requested[GUARANTEED][0] + node.requested[BEST_EFFORT][0]
            mem = node.requested[GUARANTEED][1] + node.requested[BEST_EFFORT][1]
            pods_cpu = load.pods_milli_cpu if load.HasField("pods_milli_cpu") else load.milli_cpu
            pods_mem = (
                load.pods_memory_bytes if load.HasField("pods_memory_bytes") else load.memory_bytes
            )
            # The node's network, in the share its pods' CPU has of its CPU.
            pods_net = (
                load.network_bytes_per_second * min(pods_cpu, load.milli_cpu) / load.milli_cpu
                if load.milli_cpu
                else 0.0
            )
            self._ratios[name] = (
                pods_cpu / cpu if cpu else 0.0,
                pods_mem / mem if mem else 0.0,
                pods_net / cpu if cpu else 0.0,
            )
        self._estimates: dict[str, Amounts] = {}

    def measured(self, node: str) -> bool:
        return node in self._ratios

    def compute(self, node: str) -> float:
        a, c = self.amounts[node], self.capacity[node]
        return weighted_fraction(a[:3], c[:3], self.weights)

    def network(self, node: str) -> float:
        cap = self.capacity[node][3]
        return self.amounts[node][3] / cap if cap > 0 else 0.0

    def level(self, node: str) -> float:
        """The higher of the two fractions: how loaded the node is."""
        return max(self.compute(node), self.network(node))

    def counted(self, pod: RunningPod, node: str) -> Amounts:
        """What ``pod`` adds to ``node``'s load, counted the node's way (module docstring)."""
        q = pod.info.req.requests
        if not self.measured(node):
            return (q.cpu, q.mem, q.gpus, 0) if pod.pool == self.pool else (0, 0, 0, 0)
        estimate = self._estimates.get(pod.name)
        if estimate is None:
            ratios = self._ratios.get(pod.node)
            if ratios is None:  # from an unmeasured node: what it requested, no network known
                estimate = (q.cpu, q.mem, q.gpus, 0)
            else:
                cpu, mem, net = ratios
                estimate = (int(q.cpu * cpu), int(q.mem * mem), q.gpus, int(q.cpu * net))
            self._estimates[pod.name] = estimate
        return estimate

    def shares(self, pod: RunningPod, node: str) -> tuple[float, float]:
        """(compute, network) fractions of ``node`` that ``pod`` accounts for there."""
        a, c = self.counted(pod, node), self.capacity[node]
        return weighted_fraction(a[:3], c[:3], self.weights), (a[3] / c[3] if c[3] > 0 else 0.0)

    def move(self, pod: RunningPod, source: str, target: str) -> None:
        """Account a move (call before the view moves the pod: estimates read its node)."""
        for node, sign in ((source, -1), (target, 1)):
            amounts = self.amounts[node]
            for i, value in enumerate(self.counted(pod, node)):
                amounts[i] += sign * value


class LoadBalance:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: Args) -> None:
        self.args = args

    def detect(self, view: ClusterView) -> list[Detection]:
        a = self.args
        high, net_high = a.high_percentage / 100, a.network_high_percentage / 100
        loads = NodeLoads(view, a.resources, a.pool)
        found = []
        for node in view.scoped_nodes():
            name = node.name
            compute, network = loads.compute(name), loads.network(name)
            if compute > high or network > net_high:
                basis = "measured" if loads.measured(name) else "requests"
                reasons = []
                if compute > high:
                    reasons.append(f"load {compute:.1%} > {a.high_percentage}%")
                if network > net_high:
                    reasons.append(f"network {network:.1%} > {a.network_high_percentage}%")
                found.append((-max(compute, network), name, f"{', '.join(reasons)} ({basis})"))
        return [Detection(name, reason) for _, name, reason in sorted(found)]

    def reschedule(
        self, view: ClusterView, detections: Sequence[Detection], veto: MoveVeto
    ) -> list[Move]:
        return _Balancing(self.args, view, veto).run(detections)


class _Balancing:
    """The state of one reschedule call: the loads, the cool targets ranked least loaded first
    and the room memo."""

    def __init__(self, args: Args, view: ClusterView, veto: MoveVeto) -> None:
        self.pool = args.pool
        self.high, self.low = args.high_percentage / 100, args.low_percentage / 100
        self.net_high = args.network_high_percentage / 100
        self.net_low = args.network_low_percentage / 100
        self.view, self.veto = view, veto
        self.loads = NodeLoads(view, args.resources, args.pool)
        self.room = RoomCache()
        cool = (n.name for n in view.scoped_nodes() if self._cool(n.name))
        self.targets = RankedNodes(self.loads.level, cool, descending=False)

    def _cool(self, name: str) -> bool:
        return self.loads.compute(name) < self.low and self.loads.network(name) < self.net_low

    def _hot(self, name: str) -> bool:
        return self.loads.compute(name) > self.high or self.loads.network(name) > self.net_high

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
            if (not wanted or p.name in wanted) and p.pool == self.pool and self._frees(p, source)
        ]
        moves: list[Move] = []
        while movable and self._hot(source):
            move = self._move_one(node, movable)
            if move is None:
                break
            moves.append(move)
        if moves and self._hot(source):
            undo(self.view, moves, self._moved_back)
            return []
        return moves

    def _frees(self, pod: RunningPod, node: str) -> bool:
        compute, network = self.loads.shares(pod, node)
        return compute > 0 or network > 0

    def _move_one(self, node: NodeInfo, movable: list[RunningPod]) -> Move | None:
        """Move the first pod (in :meth:`_next_pods` order) that has a target. Every pod tried
        leaves ``movable``: one without a target now has none later either, as targets only
        fill up or drop out."""
        for pod in self._next_pods(node.name, movable):
            movable.remove(pod)
            target = first_target(self.view, pod, self._candidates(pod), self.room, self.veto)
            if target is not None:
                move = Move(pod.name, pod.job, node.name, target)
                self.loads.move(pod, node.name, target)
                self.view.move(pod.name, target)
                self.room.freed(node.name)
                self._rerank(target)
                return move
        return None

    def _moved_back(self, move: Move) -> None:
        """An undone move (``targets.undo``, already applied to the view): the pod is back on
        ``move.target``, its source."""
        pod = self.view.pods[move.pod]
        self.loads.move(pod, move.source, move.target)
        self.room.freed(move.source)
        self._rerank(move.source)

    def _next_pods(self, source: str, pods: list[RunningPod]) -> list[RunningPod]:
        """The smallest pods whose leaving alone brings ``source`` to ≤ high in both dimensions,
        then the rest relieving the exceeded dimensions most first; ties by name."""
        excess = (
            self.loads.compute(source) - self.high,
            self.loads.network(source) - self.net_high,
        )
        shares = {p.name: self.loads.shares(p, source) for p in pods}

        def enough(pod: RunningPod) -> bool:
            return all(e <= 0 or s >= e for s, e in zip(shares[pod.name], excess, strict=True))

        def relief(pod: RunningPod) -> float:
            return sum(s / e for s, e in zip(shares[pod.name], excess, strict=True) if e > 0)

        suffices = sorted(
            (p for p in pods if enough(p)), key=lambda p: (sum(shares[p.name]), p.name)
        )
        short = sorted((p for p in pods if not enough(p)), key=lambda p: (-relief(p), p.name))
        return suffices + short

    def _candidates(self, pod: RunningPod) -> Iterator[str]:
        """Cool nodes, least loaded first, that the pod would not push above high in either
        dimension (lazy: the search usually stops at the first)."""
        loads = self.loads
        for _, name in self.targets.items():
            compute, network = loads.shares(pod, name)
            if (
                loads.compute(name) + compute <= self.high
                and loads.network(name) + network <= self.net_high
            ):
                yield name

    def _rerank(self, name: str) -> None:
        if name in self.view.scope and self._cool(name):
            self.targets.rank(name)
        else:
            self.targets.discard(name)


def new(args: Args) -> LoadBalance:
    return LoadBalance(args)


SPEC = PluginSpec(NAME, Args, new)
