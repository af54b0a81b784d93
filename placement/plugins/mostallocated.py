"""MostAllocated: prefer the fullest nodes that still fit (bin packing).
Score = weighted mean over resources of requested * 100 // capacity."""

from __future__ import annotations

from typing import ClassVar

from placement.framework import MAX_NODE_SCORE, PluginSpec, ScorePlugin
from placement.plugins.resourceargs import ResourceAllocationScorer, ResourceWeights

NAME = "MostAllocated"


def most_allocated(requested: int, capacity: int) -> int:
    """The share of ``capacity`` requested, at most all of it."""
    return min(requested, capacity) * MAX_NODE_SCORE // capacity


class MostAllocated(ResourceAllocationScorer):
    NAME: ClassVar[str] = NAME

    def __init__(self, args: ResourceWeights) -> None:
        super().__init__(args, most_allocated)


def new(args: ResourceWeights) -> MostAllocated:
    return MostAllocated(args)


_check: type[ScorePlugin] = MostAllocated
SPEC = PluginSpec(NAME, ResourceWeights, new)
