"""Figures a plan reports before and after its moves: pure functions over a ClusterView's
in-scope nodes.

GPUs are counted in the guaranteed pool (the pool GPU pods are placed in; best-effort capacity is
reclaimed CPU and memory)."""

from __future__ import annotations

from math import sqrt

from placement.gpu import GpuFigures, gpu_shapes, shape_mix
from placement.gpu import gpu_figures as figures_of
from placement.gpufrag import ShapeMix
from services.rescheduler.framework import ClusterView, utilisation


def running_mix(view: ClusterView) -> ShapeMix:
    """The GPU shape mix of the view's running pods (``placement.gpu.shape_mix``): what the
    expected fragmentation is measured against, GpuDefrag lowers, and the simulation's share
    policy learns (the shards' score learns it from the pods it places)."""
    return shape_mix(gpu_shapes(running.info.req for running in view.pods.values()))


def gpu_figures(view: ClusterView) -> GpuFigures:
    """The in-scope nodes' GPU figures (``placement.gpu.gpu_figures``) over the running mix."""
    return figures_of(view.scoped_nodes(), running_mix(view))


def gpu_fragmentation(view: ClusterView) -> float:
    """Idle GPUs on nodes where some GPUs are in use ÷ all idle GPUs: the share of idle GPUs a
    whole-machine job cannot use. 0.0 when no GPU is idle."""
    return gpu_figures(view).fragmentation


def expected_gpu_fragmentation(view: ClusterView) -> float:
    """The expected GPU fragmentation of the in-scope nodes ÷ all their free GPU: the share of
    free GPU a task drawn from the running pods' GPU shapes could not use, by the measure the
    GpuFragmentation score keeps low (``placement.gpufrag.fragmentation``, Weng et al.'s FGD):
    per node and shape, the free GPU on cards too small for it, or all the node's free GPU when
    it cannot run there (cards, CPU, memory or model). Shapes are weighted by how many running
    pods have them; with no GPU pod running, one whole card is the shape. 0.0 when no GPU is
    free."""
    return gpu_figures(view).expected_fragmentation


def free_nodes(view: ClusterView) -> int:
    """In-scope nodes running no pod."""
    return sum(1 for node in view.scoped_nodes() if not node.pods)


def whole_free_gpu_nodes(view: ClusterView) -> int:
    """In-scope nodes with GPUs, none of them in use."""
    return gpu_figures(view).whole_free_nodes


def utilisation_spread(view: ClusterView, weights: dict[str, int]) -> float:
    """The (population) standard deviation of guaranteed-pool utilisation (framework.utilisation
    with ``weights``) over in-scope nodes running pods: 0 when load is even. Empty nodes are left
    out, so freeing nodes by packing does not read as imbalance. 0.0 with no such node."""
    values = [utilisation(node, weights) for node in view.scoped_nodes() if node.pods]
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    return sqrt(sum((v - mean) ** 2 for v in values) / len(values))
