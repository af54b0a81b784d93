"""Logical queues: how pending units are ordered within a queue (a queue's :class:`SortPolicy`:
FIFO, Priority), which queue dispatches next (the dispatcher's :class:`Fairness`: round-robin,
DRF, FairShare), and the min and borrowed arithmetic over ``placement.resources.Quantities``
(a queue's max is judged by ``placement.quotas``, shared with the Binder and audit).

Plain synchronous functions over integers; the ``UnitQueue`` applies them in its round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

from placement.nodeinfo import GUARANTEED
from placement.resources import Quantities
from protos.godel.v1 import objects_pb2 as pb

SortKey = tuple[int, ...]


def borrowed(used: Quantities, floor: Quantities) -> Quantities:
    """What a queue holding ``used`` has borrowed beyond its min ``floor``: per resource the min
    names, the excess; a queue without a min has borrowed all it holds. A resource the min does
    not name is not counted (a min of cpu only guarantees cpu)."""
    if floor.is_zero():
        return used.copy()
    named = {name for name, amount in floor.items() if amount > 0}
    excess = used.beyond(floor)
    out = Quantities(
        excess.cpu if "cpu" in named else 0,
        excess.mem if "memory" in named else 0,
        excess.gpus if "gpus" in named else 0,
        excess.pods if "pods" in named else 0,
    )
    out.extended = {k: v for k, v in excess.extended.items() if k in named}
    return out


def within_borrowed(requests: Quantities, lent: Quantities, floor: Quantities) -> bool:
    """Whether a pod of ``requests`` runs wholly on borrowed capacity ``lent`` (what
    ``borrowed`` gives), judged on the resources its queue's min names (all, without a min)."""
    if floor.is_zero():
        return requests.fits_in(lent)
    have = dict(lent.items())
    named = {name for name, amount in floor.items() if amount > 0}
    return all(amount <= have.get(name, 0) for name, amount in requests.items() if name in named)


def dominant_share(used: Quantities, capacity: Quantities) -> Fraction:
    """The largest share of ``capacity`` that ``used`` holds over cpu, memory and gpus (DRF's
    dominant share), exact. A resource the cluster has none of does not count."""
    best = Fraction(0)
    for amount, total in ((used.cpu, capacity.cpu), (used.mem, capacity.mem),
                          (used.gpus, capacity.gpus)):  # fmt: skip
        if total > 0:
            best = max(best, Fraction(amount, total))
    return best


def permille(share: Fraction) -> int:
    """A share in thousandths, rounded down (as ``QueueStatus.dominant_share_permille``)."""
    return int(share * 1000)


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
    # The pool the unit's pods draw from (placement.nodeinfo.pool_of).
    pool: str = GUARANTEED
    # The requests of the pods it needs placed at least (its min_member, or all its pods if
    # fewer are pending): what must fit for the unit to make progress.
    least: Quantities = field(default_factory=Quantities)


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
    """The policy of a queue: Priority, else FIFO (also for the retired values 3 and 4, once
    DRF and FairShare, which queues stored before their move to the dispatcher may hold)."""
    if sort_policy == pb.SORT_PRIORITY:
        return _PRIORITY
    return _FIFO


# ---------------------------------------------------------------------------------------------
# Fairness: which queue dispatches next
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueLoad:
    """What a fairness policy sees of one queue: what it holds (bound and dispatched) and its
    weight (at least 1)."""

    name: str
    used: Quantities
    weight: int = 1


class Fairness(Protocol):
    """Orders queues against each other: the queue with the smallest key dispatches next."""

    name: str
    # Whether a queue may go ahead of a queue with a smaller key when the cluster has no room
    # for the smaller one's next unit (round-robin: yes, it ignores shares altogether).
    work_conserving: bool

    def key(self, load: QueueLoad, capacity: Quantities) -> Fraction: ...


class RoundRobin:
    """Queues take turns, whatever they hold (the order before DRF and FairShare)."""

    name = "round-robin"
    work_conserving = True

    def key(self, load: QueueLoad, capacity: Quantities) -> Fraction:
        return Fraction(0)


class Drf:
    """Dominant Resource Fairness: the queue holding the smallest dominant share of the cluster
    goes next; weights are ignored."""

    name = "drf"
    work_conserving = False

    def key(self, load: QueueLoad, capacity: Quantities) -> Fraction:
        return dominant_share(load.used, capacity)


class FairShare:
    """Weighted DRF: the smallest dominant share per unit of weight goes next, so queues of
    weights 3 and 1 converge to shares of 3:1."""

    name = "fair-share"
    work_conserving = False

    def key(self, load: QueueLoad, capacity: Quantities) -> Fraction:
        return dominant_share(load.used, capacity) / max(1, load.weight)


FAIRNESS: dict[str, Fairness] = {f.name: f for f in (RoundRobin(), Drf(), FairShare())}


def turn_key(load: QueueLoad, capacity: Quantities, fairness: Fairness) -> tuple[Fraction, str]:
    """Where a queue stands for the next turn: the policy's key, ties by name."""
    return fairness.key(load, capacity), load.name


def next_queue(loads: list[QueueLoad], capacity: Quantities, fairness: Fairness) -> str:
    """The queue of ``loads`` that dispatches next: the smallest ``turn_key``."""
    return min(loads, key=lambda load: turn_key(load, capacity, fairness)).name
