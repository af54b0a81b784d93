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
    """(capacity, requested including this pod) of the pod's pool: [cpu, memory, gpus]."""
    req = pod.req
    used = node.requested[req.pool]
    return node.capacity[req.pool], [used[0] + req.cpu, used[1] + req.mem, used[2] + req.gpu]
