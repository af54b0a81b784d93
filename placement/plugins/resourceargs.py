"""What the resource score plugins share: their args (which resources count, and how much),
the pod's pool read as they read it (``requested_after``), and the one scoring loop of
LeastAllocated and MostAllocated (``ResourceAllocationScorer``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from placement.framework import PodInfo
from placement.nodeinfo import NodeInfo


@dataclass(frozen=True)
class ResourceWeights:
    cpu: int = 1
    memory: int = 1
    gpu: int = 0

    def validate(self) -> None:
        for name in ("cpu", "memory", "gpu"):
            if getattr(self, name) < 0:
                raise ValueError(f"weight of {name} must be >= 0")
        if self.cpu + self.memory + self.gpu <= 0:
            raise ValueError("at least one resource weight must be > 0")

    def as_tuple(self) -> tuple[int, int, int]:
        return self.cpu, self.memory, self.gpu


def requested_after(pod: PodInfo, node: NodeInfo) -> tuple[list[int], list[int]]:
    """(capacity, requested including this pod) of the pod's pool: [cpu, memory, gpus], as the
    three resource scorers read it.

    A pod that requests no GPU gets a GPU capacity of 0, which every scorer skips: kube-scheduler
    skips an extended (scalar) resource the pod does not request
    (``calculateResourceAllocatableRequest`` returns (0, 0)), so a CPU-only pod is neither drawn
    onto nor pushed off GPU machines by a gpu weight. CPU and memory always count, as upstream.
    """
    req = pod.req
    q = req.requests
    used = node.requested[req.pool]
    cap = node.capacity[req.pool]
    if not q.gpus:
        return [cap[0], cap[1], 0], [used[0] + q.cpu, used[1] + q.mem, used[2]]
    return cap, [used[0] + q.cpu, used[1] + q.mem, used[2] + q.gpus]


# One resource's score from (requested including the pod, capacity > 0): 0 .. MAX_NODE_SCORE.
ResourceScore = Callable[[int, int], int]


class ResourceAllocationScorer:
    """kube-scheduler's ``resourceAllocationScorer``: the weighted mean over the weighted
    resources the node has (capacity > 0) of ``resource_score(requested, capacity)``; 0 when it
    has none. LeastAllocated and MostAllocated are this loop with their own resource score."""

    def __init__(self, args: ResourceWeights, resource_score: ResourceScore) -> None:
        # Only resources of weight > 0 take part: skipped once here, not per node.
        self.weighted = tuple((i, w) for i, w in enumerate(args.as_tuple()) if w)
        self.resource_score = resource_score

    def score(self, pod: PodInfo, node: NodeInfo) -> int:
        cap, req = requested_after(pod, node)
        resource_score = self.resource_score
        total = weight_sum = 0
        for i, w in self.weighted:
            capacity = cap[i]
            if capacity > 0:
                total += w * resource_score(req[i], capacity)
                weight_sum += w
        return total // weight_sum if weight_sum else 0
