"""Reserve-first: before a batch evicts anything, each move's room on its target is reserved for
the pod's replacement, so nothing submitted meanwhile takes it.

One ``Reservation`` per move, owned by the moving pod's job and index (its replacement has the
same job, index and tenant, so it may use the room; ``placement.reservations``), named to the
move's target node, with a TTL a little above everything the batch may wait for. The executor
writes the batch's reservations ``Pending`` in one commit; the Binder commits each ``Reserved``
in its committer's turn against its authoritative view (``services/binder/reserve.py``), or
leaves it ``Pending`` with why while its node has not the room. The replacement consumes its
reservation in the commit that binds it there.

Which moves a batch keeps once the executor has waited for the Binder (``kept_moves``):

- a move whose room is reserved (the executor waits, bounded, until the Binder has judged
  every reservation: ``Reserved``, or ``Pending`` with why in its message);
- a move whose target is the source of another kept move of the same batch (a swap, a cycle):
  its room comes free only with the batch's eviction, so its reservation is still ``Pending``
  then; the Binder commits it as soon as the room is free;
- no other: a move whose room could not be reserved is dropped before anything is evicted,
  and so is every move that counted on its source coming free, and a gang's other moves
  (a running gang moves whole or not at all).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from placement.reservations import for_replacement
from protos.godel.v1 import objects_pb2 as pb
from services.rescheduler.framework import ClusterView, Move
from services.rescheduler.gangs import gang_min_member

# Added to what a batch may wait for (reserving, acknowledgements, landing) for its reservations'
# TTL: room kept a little past the landing timeout, never for long once the round has moved on.
TTL_MARGIN_SECONDS = 10


def reservation_name(generation: int, batch: int, part: int, move: int) -> str:
    """``move-<round>-<batch>-<part>-<move>``: a DNS-1123 label, unique per round (a round's
    number is the time it started, in ms, so a restarted rescheduler never reuses one)."""
    return f"move-{generation}-{batch}-{part}-{move}"


def ttl_seconds(*waits: float) -> int:
    """The reservations' TTL: the batch's waits, and the margin."""
    return math.ceil(sum(waits)) + TTL_MARGIN_SECONDS


def build_reservation(
    move: Move, pod: pb.Pod, name: str, ttl: int, labels: dict[str, str]
) -> pb.Reservation:
    """The reservation of ``move``'s room on its target, for ``pod``'s replacement (its job and
    index, its tenant), holding what ``pod`` asks."""
    rsv = for_replacement(pod, name, move.target, ttl)
    rsv.metadata.labels.update(labels)
    rsv.status.phase = pb.RESERVATION_PENDING
    return rsv


def kept_moves(
    view: ClusterView, moves: Sequence[Move], reserved: Collection[str]
) -> tuple[list[Move], list[Move]]:
    """Which of a batch's ``moves`` go ahead, given the pods whose room is ``reserved`` (the
    module's rule). Returns (kept, dropped), each in the batch's order."""
    kept = list(moves)
    while True:
        sources = {m.source for m in kept}
        unsure = [m for m in kept if m.pod not in reserved and m.target not in sources]
        dropped_jobs = {m.job for m in unsure if gang_min_member(view, m.job)}
        gone = {m.pod for m in unsure} | {m.pod for m in kept if m.job in dropped_jobs}
        if not gone:
            break
        kept = [m for m in kept if m.pod not in gone]
    kept_pods = {m.pod for m in kept}
    return kept, [m for m in moves if m.pod not in kept_pods]
