"""LeastAllocated: prefer nodes with the most free capacity left after placing the pod (spread).
Score = weighted mean over resources of (capacity - requested) * 100 // capacity."""

from __future__ import annotations

from typing import ClassVar

from placement.framework import MAX_NODE_SCORE, PluginSpec, ScorePlugin
from placement.plugins.resourceargs import ResourceAllocationScorer, ResourceWeights

NAME = "LeastAllocated"


def least_allocated(requested: int, capacity: int) -> int:
    """The share of ``capacity`` left free, 0 when overcommitted."""
    return max(capacity - requested, 0) * MAX_NODE_SCORE // capacity


class LeastAllocated(ResourceAllocationScorer):
    NAME: ClassVar[str] = NAME

    def __init__(self, args: ResourceWeights) -> None:
        super().__init__(args, least_allocated)


def new(args: ResourceWeights) -> LeastAllocated:
    return LeastAllocated(args)


_check: type[ScorePlugin] = LeastAllocated
SPEC = PluginSpec(NAME, ResourceWeights, new)
