"""LeastAllocated: prefer nodes with the most free capacity left after placing the pod (spread).
Score = weighted mean over resources of (capacity - requested) * 100 // capacity."""

from __future__ import annotations

from typing import ClassVar

from placement.framework import MAX_NODE_SCORE, PluginSpec, PodInfo, ScorePlugin
from placement.nodeinfo import NodeInfo
from placement.plugins.resourceargs import ResourceWeights, requested_after

NAME = "LeastAllocated"


class LeastAllocated:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: ResourceWeights) -> None:
        self.weights = args.as_tuple()

    def score(self, pod: PodInfo, node: NodeInfo) -> int:
        cap, req = requested_after(pod, node)
        total = weight_sum = 0
        for i, w in enumerate(self.weights):
            if w and cap[i] > 0:
                free = cap[i] - req[i]
                total += w * (max(free, 0) * MAX_NODE_SCORE // cap[i])
                weight_sum += w
        return total // weight_sum if weight_sum else 0


def new(args: ResourceWeights) -> LeastAllocated:
    return LeastAllocated(args)


_check: type[ScorePlugin] = LeastAllocated
SPEC = PluginSpec(NAME, ResourceWeights, new)
