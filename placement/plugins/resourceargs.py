"""Args shared by the resource score plugins: which resources count, and how much."""

from __future__ import annotations

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
    used = node.requested[req.pool]
    cap = node.capacity[req.pool]
    if not req.gpu:
        return [cap[0], cap[1], 0], [used[0] + req.cpu, used[1] + req.mem, used[2]]
    return cap, [used[0] + req.cpu, used[1] + req.mem, used[2] + req.gpu]
