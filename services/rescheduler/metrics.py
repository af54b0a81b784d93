"""Figures a plan reports before and after its moves: pure functions over a ClusterView's
in-scope nodes.

GPUs are counted in the guaranteed pool (the pool GPU pods are placed in; best-effort capacity is
reclaimed CPU and memory)."""

from __future__ import annotations

from math import sqrt

from placement.nodeinfo import GUARANTEED
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
