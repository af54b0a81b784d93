"""GpuDefrag: lower the cluster's expected GPU fragmentation by moving GPU pods — shares of a
card as well as whole-card pods — and free whole GPU nodes as BinPacking does, never at the
fragmentation's cost.

The measure is the GpuFragmentation score's (``placement.gpufrag.fragmentation``), summed as
``placement.gpu.gpu_figures`` sums it: per in-scope GPU node, the fragmentation of each shape
of the running pods' mix (``metrics.running_mix``) weighted by how many pods have it. A move
keeps its pod's GPU, so the cluster's free GPU (the figure's denominator) stays the same: a
move lowers the expected fragmentation exactly when it lowers that sum, and that is the only
kind of move made.

Detect: in-scope GPU nodes running a GPU pod whose expected fragmentation is above 0 or whose
GPU utilisation is at most ``threshold_percentage``, least used first (their pods are the
easiest to take elsewhere, and emptying them frees whole nodes).

Reschedule, two passes over the detected nodes:

1. **Defragment**: each GPU pod of each detected node (the smallest GPU request first) goes to
   the in-scope node where the sum falls most — its cards there chosen as the shards choose
   them (``ClusterView.move``: the GpuFragmentation score's policy over the running mix) —
   among the nodes it fits (``view.fits``) and whose move no check vetoes; when no node lowers
   the sum, it stays. A node that received a pod is not a source later in the call. Candidate
   nodes are grouped by their GPU state (model, free milli per card in any order, free and
   total CPU and memory), so each distinct state is judged once per pod.
2. **Free whole nodes**: BinPacking's drain (``binpacking.pack`` with ``resources: {gpu: 1}``:
   all or nothing, onto fuller nodes, never an empty one) of the detected nodes at or below
   ``threshold_percentage``; a drain that would raise the sum is undone.

With the cases of ``tests/test_rescheduler_gpudefrag.py`` (2-card nodes, CPU aside):

    ======================================  =================  ========================
    cards' free milli (mix)                 moving pod         verdict
    ======================================  =================  ========================
    a: 700|1000, b: 700|1000 (300 ×2, 2c)   b's 300 share      to a: b whole, a 400|1000
    a: 400|1000, b: 400|1000 (600 ×2)       b's 600 share      stays (no card holds it)
    a: 0|1000, b: 0|1000 (1c ×2, 2c)        b's card           to a: b whole for 2 cards
    a: 1000|1000, b: 700|1000 (300)         b's 300 share      stays (nothing stranded)
    ======================================  =================  ========================
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from placement.framework import PluginSpec
from placement.gpu import GPU_INDEX, card_state, choose_cards, task_shape
from placement.gpufrag import GpuNodeState, ShapeMix, TaskShape, place, weighted_fragmentation
from placement.nodeinfo import GUARANTEED, PodRequest
from services.rescheduler.framework import (
    ClusterView,
    Detection,
    Move,
    MoveVeto,
    RunningPod,
    utilisation,
)
from services.rescheduler.metrics import running_mix
from services.rescheduler.plugins import binpacking
from services.rescheduler.plugins.args import validate_percentage

NAME = "GpuDefrag"

_GPU = {"gpu": 1}


@dataclass(frozen=True)
class Args:
    # GPU utilisation at or below which a detected node is drained whole (pass 2).
    threshold_percentage: int = 50

    def validate(self) -> None:
        validate_percentage("threshold_percentage", self.threshold_percentage)


class GpuDefrag:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: Args) -> None:
        self.args = args

    def detect(self, view: ClusterView) -> list[Detection]:
        mix = running_mix(view)
        limit = self.args.threshold_percentage / 100
        found = []
        for node in view.scoped_nodes():
            if node.requested[GUARANTEED][GPU_INDEX] <= 0:
                continue  # no GPU, or none in use: nothing to move
            expected = weighted_fragmentation(card_state(node), mix) // mix.total
            used = utilisation(node, _GPU)
            if expected > 0 or used <= limit:
                found.append((used, node.name, expected))
        return [
            Detection(name, f"expected fragmentation {expected} milli-GPU, GPU {used:.1%} used")
            for used, name, expected in sorted(found)
        ]

    def reschedule(
        self, view: ClusterView, detections: Sequence[Detection], veto: MoveVeto
    ) -> list[Move]:
        return _Defrag(self.args, view, veto).run(detections)


class _Defrag:
    """One reschedule call: each in-scope GPU node's state and weighted fragmentation, kept in
    step with the moves made, and the nodes that received pods."""

    def __init__(self, args: Args, view: ClusterView, veto: MoveVeto) -> None:
        self.args, self.view, self.veto = args, view, veto
        self.mix: ShapeMix = running_mix(view)
        self._weighted: dict[GpuNodeState, int] = {}
        self.states: dict[str, GpuNodeState] = {}
        self.frag: dict[str, int] = {}
        # The nodes by GPU state, the cards' free amounts sorted (alike for the measure), each
        # group's names sorted.
        self.groups: dict[GpuNodeState, list[str]] = {}
        self._group_of: dict[str, GpuNodeState] = {}
        # (group, task shape) -> the growth there and the GPU left free (``_growth_on``).
        self._growth: dict[tuple[GpuNodeState, TaskShape], tuple[int, int] | None] = {}
        for node in view.scoped_nodes():
            if node.capacity[GUARANTEED][GPU_INDEX] > 0:
                self._refresh(node.name)
        self.received: set[str] = set()

    def weighted(self, state: GpuNodeState) -> int:
        found = self._weighted.get(state)
        if found is None:
            found = self._weighted[state] = weighted_fragmentation(state, self.mix)
        return found

    def _refresh(self, name: str) -> None:
        state = card_state(self.view.nodes[name])
        self.states[name] = state
        self.frag[name] = self.weighted(state)
        key = replace(state, free_milli=tuple(sorted(state.free_milli)))
        old = self._group_of.get(name)
        if old == key:
            return
        if old is not None:
            members = self.groups[old]
            members.remove(name)
            if not members:
                del self.groups[old]
        insort(self.groups.setdefault(key, []), name)
        self._group_of[name] = key

    def run(self, detections: Sequence[Detection]) -> list[Move]:
        moves = self._defragment(detections)
        limit = self.args.threshold_percentage / 100
        light = [
            d
            for d in detections
            if d.node not in self.received
            and d.node in self.view.nodes
            and utilisation(self.view.nodes[d.node], _GPU) <= limit
        ]
        drains = binpacking.Args(resources=dict(_GPU), threshold_percentage=100)
        moves.extend(binpacking.pack(drains, self.view, light, self.veto, self._keep))
        return moves

    # -- pass 1 ------------------------------------------------------------------------------

    def _defragment(self, detections: Sequence[Detection]) -> list[Move]:
        moves: list[Move] = []
        if not any(self.frag.values()):
            return moves  # nothing stranded: no move can lower the sum
        for detection in detections:
            source = detection.node
            if source in self.received or source not in self.states:
                continue
            pods = [p for p in self.view.pods_on(source) if p.info.req.requests.gpus]
            pods.sort(key=lambda p: (p.info.req.requests.gpus, p.name))
            for pod in pods:
                target = self._best_target(pod)
                if target is None:
                    continue
                moves.append(Move(pod.name, pod.job, source, target))
                self.view.move(pod.name, target)
                self._refresh(source)
                self._refresh(target)
                self.received.add(target)
        return moves

    def _best_target(self, pod: RunningPod) -> str | None:
        """The in-scope node where moving ``pod`` lowers the weighted fragmentation most (ties:
        the node left with the least free GPU, then by name), that it fits and no check vetoes;
        None when no move lowers it."""
        view, source = self.view, pod.node
        lifted = view.nodes[source].clone()
        lifted.remove_pod(pod.name)
        gain = self.weighted(card_state(lifted)) - self.frag[source]
        req = pod.info.req
        shape = task_shape(req)
        ranked: list[tuple[int, int, str, list[str]]] = []
        for key, members in self.groups.items():
            first = members[0] if members[0] != source else members[1] if len(members) > 1 else ""
            if not first:
                continue
            if (key, shape) in self._growth:
                growth = self._growth[key, shape]
            else:
                growth = self._growth[key, shape] = self._growth_on(first, req, shape)
            if growth is not None and gain + growth[0] < 0:
                ranked.append((gain + growth[0], growth[1], first, members))
        ranked.sort(key=lambda r: r[:3])
        for _, _, _, members in ranked:
            for name in members:
                if (
                    name != source
                    and view.fits(pod.name, name) is None
                    and self.veto(Move(pod.name, pod.job, source, name)) is None
                ):
                    return name
        return None

    def _growth_on(self, name: str, req: PodRequest, shape: TaskShape) -> tuple[int, int] | None:
        """How much the weighted fragmentation of ``name`` grows when ``req`` comes to it, on
        the cards a shard would give it, and the GPU it leaves free; None: no card holds it.
        Alike for every node of its group (the measure reads the cards' free amounts in any
        order), so remembered per group and shape until the call ends."""
        cards = choose_cards(self.view.nodes[name], req, self.view.share_policy)
        if not isinstance(cards, tuple):
            return None
        state = self.states[name]
        try:
            after = place(state, shape, cards)
        except ValueError:
            return None  # a pod there holds no card yet: its cards are not the ones counted
        return self.weighted(after) - self.frag[name], after.free_gpu_milli

    # -- pass 2 ------------------------------------------------------------------------------

    def _keep(self, moves: list[Move]) -> bool:
        """A complete drain, made in the view: kept unless it raises the weighted fragmentation
        of the nodes it touched (undone then, which restores them exactly)."""
        touched = {m.source for m in moves} | {m.target for m in moves}
        touched &= self.states.keys()
        before = sum(self.frag[name] for name in touched)
        after = {name: self.weighted(card_state(self.view.nodes[name])) for name in touched}
        if sum(after.values()) > before:
            return False
        for name in touched:
            self._refresh(name)
        self.received.update(m.target for m in moves)
        return True


def new(args: Args) -> GpuDefrag:
    return GpuDefrag(args)


SPEC = PluginSpec(NAME, Args, new)
