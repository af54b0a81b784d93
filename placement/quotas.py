"""A queue's max (``spec.quota``): which queue a pod counts for, what a queue and the queues
below it hold together, and whether a request fits under the maxima — the one judgement of
quota, asked by the dispatcher's admission (bound + dispatched), the Binder's authoritative
check of every binding (bound) and ``godel audit`` (bound).

A quota field of 0 is unlimited: proto3 cannot tell an unset field from zero, and a queue that
admits nothing is better expressed by not submitting to it. A parent's max bounds what all the
queues below it, and the parent itself, hold together (``spec.parent``); a queue's own max
likewise counts the queues below it.

Plain functions over ``placement.resources.Quantities``; the caller keeps what each queue holds
(incrementally) and passes it in, or charges it to a ``SubtreeUsage``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from placement.resources import MILLI_PER_CARD, Quantities, resources_milli
from protos.godel.v1 import objects_pb2 as pb

# The queue of a job (and its pods) that names none.
DEFAULT_QUEUE = "default"

QueueLookup = Callable[[str], pb.Queue | None]
# What one queue holds (never None: a queue holding nothing holds zero).
UsageOf = Callable[[str], Quantities]


def queue_of(pod: pb.Pod) -> str:
    """The queue whose usage ``pod`` counts in."""
    return pod.spec.queue or DEFAULT_QUEUE


def quota_of(queue: pb.Queue | None) -> pb.Resources | None:
    """The queue's max (``spec.quota``), None when it has none."""
    if queue is not None and queue.spec.HasField("quota"):
        return queue.spec.quota
    return None


def ancestors(queue: str, lookup: QueueLookup) -> list[str]:
    """The queue's parents, nearest first (a cycle, which Apply refuses, ends the walk)."""
    out: list[str] = []
    seen = {queue}
    obj = lookup(queue)
    while obj is not None and obj.spec.parent and obj.spec.parent not in seen:
        out.append(obj.spec.parent)
        seen.add(obj.spec.parent)
        obj = lookup(obj.spec.parent)
    return out


def lineage(queue: str, lookup: QueueLookup) -> tuple[str, ...]:
    """The queue and its parents, nearest first: every queue whose holdings a pod of ``queue``
    counts in."""
    return (queue, *ancestors(queue, lookup))


def maxima(line: Sequence[str], lookup: QueueLookup) -> list[tuple[str, pb.Resources]]:
    """The maxima over a ``lineage``, nearest first: (queue, its max) for each queue that has
    one. Empty: nothing a pod of that queue takes is judged."""
    out: list[tuple[str, pb.Resources]] = []
    for queue in line:
        limit = quota_of(lookup(queue))
        if limit is not None:
            out.append((queue, limit))
    return out


@dataclass(frozen=True, slots=True)
class Excess:
    """One resource past a max: what the queue would hold, and the limit."""

    resource: str  # as ``Quantities.items`` names it: cpu, memory, gpus, pods, or extended
    want: int
    limit: int


def first_excess(
    quota: pb.Resources | None, used: Quantities, request: Quantities
) -> Excess | None:
    """The first resource for which ``used + request`` exceeds ``quota`` (None if it fits)."""
    if quota is None:
        return None
    checks = (
        ("cpu", quota.milli_cpu, used.cpu + request.cpu),
        ("memory", quota.memory_bytes, used.mem + request.mem),
        ("gpus", resources_milli(quota), used.gpus + request.gpus),
        ("pods", quota.pods, used.pods + request.pods),
    )
    for name, limit, want in checks:
        if limit and want > limit:
            return Excess(name, want, limit)
    for name, limit in quota.extended.items():
        want = used.extended.get(name, 0) + request.extended.get(name, 0)
        if limit and want > limit:
            return Excess(name, want, limit)
    return None


def quota_excess(quota: pb.Resources | None, used: Quantities, request: Quantities) -> str:
    """The name of the first resource for which ``used + request`` exceeds ``quota`` ("" if it
    fits)."""
    found = first_excess(quota, used, request)
    return found.resource if found is not None else ""


@dataclass(frozen=True, slots=True)
class QueueExcess:
    """A request past the max of ``queue`` (the request's own queue or one above it)."""

    queue: str
    excess: Excess

    def describe(self, own: str) -> str:
        """One line naming the rule, the queue and the amounts; ``own``: the request's queue."""
        e = self.excess
        which = f"queue {own!r}" if self.queue == own else f"parent queue {self.queue!r} of {own!r}"
        return (
            f"QueueQuota: {which} would hold {format_amount(e.resource, e.want)} of "
            f"{e.resource}, over its max {format_amount(e.resource, e.limit)}"
        )


def excess_under(
    limits: Iterable[tuple[str, pb.Resources]], request: Quantities, held: UsageOf
) -> QueueExcess | None:
    """The first of ``limits`` (a queue's ``maxima``, nearest first) that ``request`` would
    exceed, ``held(q)`` being what queue q and every queue below it hold; None if all hold it."""
    for queue, limit in limits:
        found = first_excess(limit, held(queue), request)
        if found is not None:
            return QueueExcess(queue, found)
    return None


def hierarchy_excess(
    queue: str, request: Quantities, lookup: QueueLookup, held: UsageOf
) -> QueueExcess | None:
    """Where ``request``, taken by ``queue``, would go past a max: the queue's own, then each
    parent's, nearest first; ``held(q)``: what q and every queue below it hold. None if every
    max holds it."""
    return excess_under(maxima(lineage(queue, lookup), lookup), request, held)


def held_below(
    queue: str, lookup: QueueLookup, used: UsageOf, holders: Iterable[str]
) -> Quantities:
    """What ``queue`` and every queue below it hold together, summed from what each queue holds
    itself (``used``; ``holders``: every queue holding anything, the others add nothing)."""
    total = Quantities()
    for other in holders:
        if other != queue:
            obj = lookup(other)
            # Most queues have no parent: no walk (this runs per unit the dispatcher offers).
            if obj is None or not obj.spec.parent or queue not in ancestors(other, lookup):
                continue
        total.add(used(other))
    return total


class SubtreeUsage:
    """Per queue, what it and every queue below it hold, kept as amounts are charged to a queue
    (each charge reaches its lineage), so judging a request against every max above it costs
    the depth of the tree, not a sum over the queues. The Binder's batch and ``godel audit``
    build one from what each queue's bound pods hold."""

    def __init__(self, lookup: QueueLookup, own: Mapping[str, Quantities] | None = None) -> None:
        self.lookup = lookup
        self.totals: dict[str, Quantities] = {}
        self._lineages: dict[str, tuple[str, ...]] = {}
        self._maxima: dict[str, list[tuple[str, pb.Resources]]] = {}
        for queue, amount in (own or {}).items():
            self.charge(queue, amount)

    def lineage(self, queue: str) -> tuple[str, ...]:
        line = self._lineages.get(queue)
        if line is None:
            line = self._lineages[queue] = lineage(queue, self.lookup)
        return line

    def maxima(self, queue: str) -> list[tuple[str, pb.Resources]]:
        """The maxima a pod of ``queue`` is judged by (``maxima``, cached)."""
        found = self._maxima.get(queue)
        if found is None:
            found = self._maxima[queue] = maxima(self.lineage(queue), self.lookup)
        return found

    def charge(self, queue: str, amount: Quantities, sign: int = 1) -> None:
        """``queue`` holds ``amount`` more (``sign`` -1: less)."""
        totals = self.totals
        for judged in self.lineage(queue):
            total = totals.get(judged)
            if total is None:
                total = totals[judged] = Quantities()
            total.add(amount, sign)

    def held(self, queue: str) -> Quantities:
        """What ``queue`` and every queue below it hold."""
        total = self.totals.get(queue)
        return total if total is not None else _NOTHING

    def excess(self, queue: str, request: Quantities) -> QueueExcess | None:
        """Where ``request`` taken by ``queue`` would go past a max (``excess_under``)."""
        limits = self.maxima(queue)
        return excess_under(limits, request, self.held) if limits else None

    def over_max(self, queues: Iterable[str]) -> list[QueueExcess]:
        """Each of ``queues`` that already holds more than its max (``godel audit``)."""
        out: list[QueueExcess] = []
        for queue in queues:
            found = first_excess(quota_of(self.lookup(queue)), self.held(queue), _NOTHING)
            if found is not None:
                out.append(QueueExcess(queue, found))
        return out


_NOTHING = Quantities()  # never mutated


def format_amount(resource: str, amount: int) -> str:
    """An amount as a user reads it: milli-CPU with ``m``, bytes with ``B``, milli-GPU in cards
    (``1.5``: shares count), others bare."""
    if resource == "cpu":
        return f"{amount}m"
    if resource == "memory":
        return f"{amount}B"
    if resource == "gpus":
        cards, milli = divmod(amount, MILLI_PER_CARD)
        return f"{cards}.{milli:03d}".rstrip("0") if milli else str(cards)
    return str(amount)
