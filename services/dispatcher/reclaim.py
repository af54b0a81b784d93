"""Quota reclaim: which borrowed pods go so a queue below its min gets its guaranteed capacity.

A queue may borrow idle capacity beyond its min up to its max. When a queue below its min has
pending work the cluster has no room for (``UnitQueue.reclaim_needs``), the dispatcher takes
back borrowed capacity: pods of other queues, any priority, but only pods running on what their
queue holds beyond its own min — lowest priority first, the newest first among equals (the
least work lost), within disruption budgets. The victims are evicted through the one eviction
path, ``Binder.Evict`` with reason ``Reclaimed`` (``services/eviction.py``), which re-checks the
budgets against its own view and gives each victim a replacement in its queue.

Pure and synchronous: the dispatcher calls ``choose_victims`` and sends the result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from placement.budgets import BudgetTracker
from placement.nodeinfo import GUARANTEED
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.queueing import Quantities, borrowed, within_borrowed
from services.dispatcher.unitqueue import Claim


@dataclass(frozen=True, slots=True)
class Victim:
    pod: pb.Pod
    # The queue whose min the eviction serves.
    for_queue: str


def _victim_order(claim: Claim) -> tuple[int, int, str]:
    pod = claim.pod
    return (pod.spec.priority, -pod.status.started_ms, pod.metadata.name)


def _helps(requests: Quantities, remaining: Quantities) -> bool:
    have = dict(requests.items())
    return any(amount > 0 and have.get(name, 0) > 0 for name, amount in remaining.items())


def choose_victims(
    needs: Mapping[str, Quantities],
    claims: Iterable[Claim],
    bound_usage: Callable[[str], Quantities],
    mins: Callable[[str], Quantities],
    budgets: BudgetTracker,
    *,
    exclude: frozenset[str] = frozenset(),
    limit: int = 1000,
) -> list[Victim]:
    """Borrowed pods to evict so each queue of ``needs`` gets what it lacks (guaranteed pool).

    A pod is taken only if it fits within what its queue holds beyond its min (so what remains
    of that queue stays at or above its min), it reduces something still needed, and evicting it
    keeps every disruption budget. Queues that need capacity lose nothing. Fewer pods than needed
    when not enough is borrowed; at most ``limit`` pods.
    """
    candidates = sorted(
        (
            c
            for c in claims
            if c.pool == GUARANTEED
            and c.queue not in needs
            and c.pod.metadata.name not in exclude
            and not c.pod.metadata.deletion_timestamp_ms
        ),
        key=_victim_order,
    )
    floors = {q: mins(q) for q in {c.queue for c in candidates}}
    lent = {q: borrowed(bound_usage(q), floor) for q, floor in floors.items()}
    taken: set[str] = set()
    out: list[Victim] = []
    for queue, need in sorted(needs.items()):
        remaining = need.copy()
        for claim in candidates:
            if len(out) >= limit or remaining.beyond(Quantities()).is_zero():
                break
            name = claim.pod.metadata.name
            if name in taken or not _helps(claim.requests, remaining):
                continue
            if not within_borrowed(claim.requests, lent[claim.queue], floors[claim.queue]):
                continue  # it runs (at least partly) on its queue's own min
            if budgets.try_admit([claim.pod]):
                continue  # a disruption budget forbids it
            taken.add(name)
            lent[claim.queue].add(claim.requests, -1)
            remaining.add(claim.requests, -1)
            out.append(Victim(claim.pod, queue))
    return out
