"""Logical queues: how pending units are ordered within a queue, and the per-queue quota check.

A queue's sort policy is a :class:`SortPolicy`: a key over :class:`PendingUnit` (smaller first).
FIFO and Priority exist now; DRF and FairShare plug in by implementing the same protocol (they
read usage through the state they are constructed with). Plain synchronous code: the dispatch
loop sorts the ready units of each queue once per round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from protos.godel.v1 import objects_pb2 as pb

SortKey = tuple[int, ...]


@dataclass(slots=True)
class Quantities:
    """An amount of each resource (milli-CPU, bytes, GPUs, pod slots, extended), mutable so
    usage can be kept incrementally."""

    cpu: int = 0
    mem: int = 0
    gpus: int = 0
    pods: int = 0
    extended: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of_pod_request(cls, requests: pb.Resources, count: int = 1) -> Quantities:
        """``count`` pods' requests; each pod takes one pod slot."""
        return cls(
            requests.milli_cpu * count,
            requests.memory_bytes * count,
            requests.gpus * count,
            count,
            {k: v * count for k, v in requests.extended.items()},
        )

    def add(self, other: Quantities, sign: int = 1) -> None:
        self.cpu += sign * other.cpu
        self.mem += sign * other.mem
        self.gpus += sign * other.gpus
        self.pods += sign * other.pods
        for k, v in other.extended.items():
            total = self.extended.get(k, 0) + sign * v
            if total:
                self.extended[k] = total
            else:
                self.extended.pop(k, None)

    def as_resources(self) -> pb.Resources:
        return pb.Resources(
            milli_cpu=self.cpu,
            memory_bytes=self.mem,
            gpus=self.gpus,
            pods=self.pods,
            extended=self.extended,
        )

    def is_zero(self) -> bool:
        return not (self.cpu or self.mem or self.gpus or self.pods or self.extended)


def quota_excess(quota: pb.Resources | None, used: Quantities, request: Quantities) -> str:
    """The first resource for which ``used + request`` exceeds ``quota`` ("" if it fits).

    A quota field of 0 is unlimited: proto3 cannot tell an unset field from zero, and a queue
    that admits nothing is better expressed by not submitting to it.
    """
    if quota is None:
        return ""
    checks = (
        ("cpu", quota.milli_cpu, used.cpu + request.cpu),
        ("memory", quota.memory_bytes, used.mem + request.mem),
        ("gpus", quota.gpus, used.gpus + request.gpus),
        ("pods", quota.pods, used.pods + request.pods),
    )
    for name, limit, want in checks:
        if limit and want > limit:
            return name
    for name, limit in quota.extended.items():
        if limit and used.extended.get(name, 0) + request.extended.get(name, 0) > limit:
            return name
    return ""


@dataclass(slots=True)
class PendingUnit:
    """What a sort policy sees of a unit waiting in a queue."""

    job: str
    queue: str
    priority: int = 0
    # When the job was created (store time): FIFO order survives a dispatcher restart.
    created_ms: int = 0
    # Arrival order in this dispatcher: the final tie-breaker, so orders are total.
    seq: int = 0
    pods: int = 1
    requests: Quantities = field(default_factory=Quantities)


class SortPolicy(Protocol):
    """Orders the units of one queue: smaller key first."""

    name: str

    def key(self, unit: PendingUnit) -> SortKey: ...


def less(policy: SortPolicy, a: PendingUnit, b: PendingUnit) -> bool:
    return policy.key(a) < policy.key(b)


class FifoPolicy:
    """First come, first served: creation time, then arrival order."""

    name = "FIFO"

    def key(self, unit: PendingUnit) -> SortKey:
        return (unit.created_ms, unit.seq)


class PriorityPolicy:
    """Higher priority first; FIFO among equals."""

    name = "Priority"

    def key(self, unit: PendingUnit) -> SortKey:
        return (-unit.priority, unit.created_ms, unit.seq)


_FIFO = FifoPolicy()
_PRIORITY = PriorityPolicy()


def policy_for(sort_policy: int) -> SortPolicy:
    """The policy of a queue. DRF and FairShare fall back to FIFO until they are implemented."""
    if sort_policy == pb.SORT_PRIORITY:
        return _PRIORITY
    return _FIFO
