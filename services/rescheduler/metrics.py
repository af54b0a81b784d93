"""Figures a plan reports before and after its moves: pure functions over a ClusterView's
in-scope nodes.

GPUs are counted in the guaranteed pool (the pool GPU pods are placed in; best-effort capacity is
reclaimed CPU and memory)."""

from __future__ import annotations

from dataclasses import replace
from math import sqrt

from placement.gpu import node_state, task_shape
from placement.gpufrag import (
    FGD_FILL_COVERAGE_PERCENT,
    GpuNodeState,
    ShapeMix,
    TaskShape,
    weighted_fragmentation,
)
from placement.nodeinfo import GUARANTEED, NodeInfo
from placement.resources import MILLI_PER_CARD
from services.rescheduler.framework import RESOURCE_INDEX, ClusterView, utilisation

_GPU = RESOURCE_INDEX["gpu"]


def gpu_fragmentation(view: ClusterView) -> float:
    """Idle GPUs on nodes where some GPUs are in use ÷ all idle GPUs: the share of idle GPUs a
    whole-machine job cannot use. 0.0 when no GPU is idle."""
    idle = stranded = 0
    for node in view.scoped_nodes():
        capacity, used = node.capacity[GUARANTEED][_GPU], node.requested[GUARANTEED][_GPU]
        free = max(capacity - used, 0)
        idle += free
        if used > 0:
            stranded += free
    return stranded / idle if idle else 0.0


def expected_gpu_fragmentation(view: ClusterView) -> float:
    """The expected GPU fragmentation of the in-scope nodes ÷ all their free GPU: the share of
    free GPU a task drawn from the running pods' GPU shapes could not use, by the measure the
    GpuFragmentation score keeps low (``placement.gpufrag.fragmentation``, Weng et al.'s FGD):
    per node and shape, the free GPU on cards too small for it, or all the node's free GPU when
    it cannot run there (cards, CPU, memory or model). Shapes are weighted by how many running
    pods have them; with no GPU pod running, one whole card is the shape. 0.0 when no GPU is
    free."""
    shapes = [
        task_shape(running.info.req)
        for running in view.pods.values()
        if running.info.req.requests.gpus
    ]
    mix = ShapeMix.of_tasks(shapes or [_ONE_CARD], FGD_FILL_COVERAGE_PERCENT)
    free = weighted = 0
    for node in view.scoped_nodes():
        state = _card_state(node)
        free += state.free_gpu_milli
        if state.free_gpu_milli:
            weighted += weighted_fragmentation(state, mix)
    return weighted / (mix.total * free) if free else 0.0


_ONE_CARD = TaskShape(0, 0, 1, MILLI_PER_CARD)


def _card_state(node: NodeInfo) -> GpuNodeState:
    """The node's cards as the measure reads them. GPU pods holding no card yet (none chosen)
    are taken to hold the freest cards, whole cards first, as the Binder would give them."""
    state = node_state(node, GUARANTEED)
    unplaced = node.requested[GUARANTEED][_GPU] - sum(node.card_used)
    if unplaced <= 0:
        return state
    free = sorted(state.free_milli, reverse=True)
    for index, amount in enumerate(free):
        taken = min(amount, unplaced)
        free[index] -= taken
        unplaced -= taken
    return replace(state, free_milli=tuple(free))


def free_nodes(view: ClusterView) -> int:
    """In-scope nodes running no pod."""
    return sum(1 for node in view.scoped_nodes() if not node.pods)


def whole_free_gpu_nodes(view: ClusterView) -> int:
    """In-scope nodes with GPUs, none of them in use."""
    return sum(
        1
        for node in view.scoped_nodes()
        if node.capacity[GUARANTEED][_GPU] > 0 and node.requested[GUARANTEED][_GPU] == 0
    )


def utilisation_spread(view: ClusterView, weights: dict[str, int]) -> float:
    """The (population) standard deviation of guaranteed-pool utilisation (framework.utilisation
    with ``weights``) over in-scope nodes running pods: 0 when load is even. Empty nodes are left
    out, so freeing nodes by packing does not read as imbalance. 0.0 with no such node."""
    values = [utilisation(node, weights) for node in view.scoped_nodes() if node.pods]
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    return sqrt(sum((v - mean) ** 2 for v in values) / len(values))
