"""MostAllocated: prefer the fullest nodes that still fit (bin packing).
Score = weighted mean over resources of requested * 100 // capacity."""

from __future__ import annotations

from typing import ClassVar

from placement.framework import MAX_NODE_SCORE, PluginSpec, PodInfo, ScorePlugin
from placement.nodeinfo import NodeInfo
from placement.plugins.resourceargs import ResourceWeights, requested_after

NAME = "MostAllocated"


class MostAllocated:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: ResourceWeights) -> None:
        self.weights = args.as_tuple()

    def score(self, pod: PodInfo, node: NodeInfo) -> int:
        cap, req = requested_after(pod, node)
        total = weight_sum = 0
        for i, w in enumerate(self.weights):
            if w and cap[i] > 0:
                total += w * (min(req[i], cap[i]) * MAX_NODE_SCORE // cap[i])
                weight_sum += w
        return total // weight_sum if weight_sum else 0


def new(args: ResourceWeights) -> MostAllocated:
    return MostAllocated(args)


_check: type[ScorePlugin] = MostAllocated
SPEC = PluginSpec(NAME, ResourceWeights, new)
