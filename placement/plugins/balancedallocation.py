"""BalancedAllocation: prefer nodes whose resources end up equally used (kube-scheduler's
standard-deviation form). Fractions are fixed-point integers (parts per million), so the score is
exact integer math: (1 - stddev) * 100."""

from __future__ import annotations

from math import isqrt
from typing import ClassVar

from placement.framework import MAX_NODE_SCORE, PluginSpec, PodInfo, ScorePlugin
from placement.nodeinfo import NodeInfo
from placement.plugins.resourceargs import ResourceWeights, requested_after

NAME = "BalancedAllocation"
_ONE = 1_000_000


class BalancedAllocation:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: ResourceWeights) -> None:
        # Weights select the resources considered; balance is unweighted (as in kube).
        self.resources = tuple(i for i, w in enumerate(args.as_tuple()) if w > 0)

    def score(self, pod: PodInfo, node: NodeInfo) -> int:
        cap, req = requested_after(pod, node)
        fractions = [min(req[i] * _ONE // cap[i], _ONE) for i in self.resources if cap[i] > 0]
        n = len(fractions)
        if n < 2:
            return MAX_NODE_SCORE
        mean = sum(fractions) // n
        std = isqrt(sum((f - mean) ** 2 for f in fractions) // n)
        return (_ONE - std) * MAX_NODE_SCORE // _ONE


def new(args: ResourceWeights) -> BalancedAllocation:
    return BalancedAllocation(args)


_check: type[ScorePlugin] = BalancedAllocation
SPEC = PluginSpec(NAME, ResourceWeights, new)
