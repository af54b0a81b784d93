"""The one resource vector: ``Quantities`` (milli-CPU, bytes, milli-GPU, pod slots, extended),
and the one reading of a pod template's requests into it.

GPUs count in milli-GPU inside, as CPU does in milli-CPU, so a share of one card
(``template.gpu_milli``) is counted as what it is by quotas, DRF, partitions and room alike: a
pod's request is its share, or 1000 per whole card; a node's offer, a quota or a min
(``pb.Resources.gpus``, whole cards) is 1000 per card (``Quantities.of``). Figures written back
(``as_resources``: a queue's usage) carry the exact amount in ``milli_gpus`` beside whole cards
rounded up in ``gpus``.

Every figure of room and usage is one: a node's offer per pool and the room left per pool
(``placement.room``), a queue's usage, quota, min and borrowed amounts (the dispatcher), a
unit's requests, and what a pod asks of one node (``PodRequest.requests`` in
``placement.nodeinfo``: the instance shared by every pod asking the same, which
``shared_request`` makes, from a dict keyed by the amounts for the usual request without
extended resources: ``shared_amounts``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from protos.godel.v1 import objects_pb2 as pb

MILLI_PER_CARD = 1000


def request_milli(cards: int, gpu_milli: int) -> int:
    """A pod's GPU request in milli-GPU: its share of one card (``gpu_milli`` with one card
    asked), else 1000 per whole card."""
    if gpu_milli and cards == 1:
        return gpu_milli
    return cards * MILLI_PER_CARD


def resources_milli(resources: pb.Resources) -> int:
    """An offer's, a quota's or a figure's GPUs in milli-GPU: the exact ``milli_gpus`` a figure
    carries, else 1000 per whole card."""
    return resources.milli_gpus or resources.gpus * MILLI_PER_CARD


@dataclass(slots=True)
class Quantities:
    """An amount of each resource (milli-CPU, bytes, milli-GPU, pod slots, extended), mutable
    so usage can be kept incrementally."""

    cpu: int = 0
    mem: int = 0
    gpus: int = 0
    pods: int = 0
    extended: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of_pod_request(cls, template: pb.PodTemplate, count: int = 1) -> Quantities:
        """``count`` pods' requests; each pod takes one pod slot."""
        requests = template.requests
        return cls(
            requests.milli_cpu * count,
            requests.memory_bytes * count,
            request_milli(requests.gpus, template.gpu_milli) * count,
            count,
            # Iterating a protobuf map costs even when empty; most pods ask for no extended
            # resource, and this runs a few times per unit.
            {k: v * count for k, v in requests.extended.items()} if requests.extended else {},
        )

    @staticmethod
    def shared_request(template: pb.PodTemplate) -> Quantities:
        """One pod's requests as an instance shared by every pod asking the same (a job's
        pods): for what is held per bound pod. Never mutate it; ``copy()`` it first."""
        requests = template.requests
        cards = requests.gpus
        gpus = request_milli(cards, template.gpu_milli) if cards else 0
        if not requests.extended:  # the usual pod: one dict look-up (every bound pod's claim)
            return shared_amounts(requests.milli_cpu, requests.memory_bytes, gpus)
        extended = tuple(sorted(requests.extended.items()))
        return _shared_request(requests.milli_cpu, requests.memory_bytes, gpus, extended)

    def add(self, other: Quantities, sign: int = 1) -> None:
        self.cpu += sign * other.cpu
        self.mem += sign * other.mem
        self.gpus += sign * other.gpus
        self.pods += sign * other.pods
        # Most pods ask no extended resource: no iterator made (a dispatcher's start adds
        # each bound pod's claim twice).
        if not other.extended:
            return
        for k, v in other.extended.items():
            total = self.extended.get(k, 0) + sign * v
            if total:
                self.extended[k] = total
            else:
                self.extended.pop(k, None)

    def as_resources(self) -> pb.Resources:
        """As a figure to show (a queue's usage): GPUs exact in ``milli_gpus``, and in whole
        cards, rounded up, in ``gpus``."""
        return pb.Resources(
            milli_cpu=self.cpu,
            memory_bytes=self.mem,
            gpus=-(-self.gpus // MILLI_PER_CARD),
            milli_gpus=self.gpus,
            pods=self.pods,
            extended=self.extended,
        )

    def is_zero(self) -> bool:
        return not (self.cpu or self.mem or self.gpus or self.pods or self.extended)

    def copy(self) -> Quantities:
        return Quantities(self.cpu, self.mem, self.gpus, self.pods, dict(self.extended))

    @classmethod
    def of(cls, resources: pb.Resources) -> Quantities:
        """An offer, a quota, a min or a figure ``as_resources`` wrote: whole cards are 1000
        milli-GPU each, unless the exact ``milli_gpus`` is there."""
        return cls(
            resources.milli_cpu,
            resources.memory_bytes,
            resources_milli(resources),
            resources.pods,
            dict(resources.extended),
        )

    def items(self) -> list[tuple[str, int]]:
        """(resource name, amount) for every resource, as ``quota_excess`` names them (gpus in
        milli-GPU)."""
        return [
            ("cpu", self.cpu),
            ("memory", self.mem),
            ("gpus", self.gpus),
            ("pods", self.pods),
            *sorted(self.extended.items()),
        ]

    def fits_in(self, room: Quantities) -> bool:
        """Whether every resource of this amount is within ``room``."""
        if not self.extended:  # the common case, compared directly (a few times per unit)
            return (
                (self.cpu <= 0 or self.cpu <= room.cpu)
                and (self.mem <= 0 or self.mem <= room.mem)
                and (self.gpus <= 0 or self.gpus <= room.gpus)
                and (self.pods <= 0 or self.pods <= room.pods)
            )
        have = dict(room.items())
        return all(amount <= have.get(name, 0) for name, amount in self.items() if amount > 0)

    def beyond(self, floor: Quantities) -> Quantities:
        """Per resource, what exceeds ``floor`` (never negative): usage beyond a queue's min is
        borrowed."""
        out = Quantities(
            max(0, self.cpu - floor.cpu),
            max(0, self.mem - floor.mem),
            max(0, self.gpus - floor.gpus),
            max(0, self.pods - floor.pods),
        )
        for name, amount in self.extended.items():
            extra = amount - floor.extended.get(name, 0)
            if extra > 0:
                out.extended[name] = extra
        return out

    def capped_by(self, cap: Quantities) -> Quantities:
        """Per resource, the smaller of the two (extended resources of this amount only)."""
        return Quantities(
            min(self.cpu, cap.cpu),
            min(self.mem, cap.mem),
            min(self.gpus, cap.gpus),
            min(self.pods, cap.pods),
            {k: min(v, cap.extended.get(k, 0)) for k, v in self.extended.items()},
        )


# One pod's amounts as the shared vector of every pod asking the same, keyed by (milli-CPU,
# bytes, milli-GPU) for the usual pod without extended resources: a dict look-up per pod event,
# where ``_shared_request``'s sorting, tuple and lru_cache cost ``PodRequest.from_pod`` 5 %.
# Bounded like that cache: the distinct shapes of a cluster are few.
_SHARED_AMOUNTS: dict[tuple[int, int, int], Quantities] = {}
_SHARED_AMOUNTS_MAX = 4096


def shared_amounts(cpu: int, mem: int, gpus: int) -> Quantities:
    """``shared_request`` of a pod asking these amounts and no extended resource, for a caller
    that read them already. Never mutate it."""
    key = (cpu, mem, gpus)
    shared = _SHARED_AMOUNTS.get(key)
    if shared is None:
        if len(_SHARED_AMOUNTS) >= _SHARED_AMOUNTS_MAX:
            _SHARED_AMOUNTS.clear()
        shared = _SHARED_AMOUNTS[key] = Quantities(cpu, mem, gpus, 1)
    return shared


@functools.lru_cache(maxsize=4096)
def _shared_request(
    cpu: int, mem: int, gpus: int, extended: tuple[tuple[str, int], ...]
) -> Quantities:
    return Quantities(cpu, mem, gpus, 1, dict(extended))
