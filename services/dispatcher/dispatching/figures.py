"""Per-queue counts the unit queue keeps as pods come and go and units change state, and the
``Queue.status`` numbers made from them (``QueueFigures``): every Submit checks admission limits
against the pending pods, the queue statuses (and their metrics) read the counts every few
seconds, and the round asks for every unit it offers whether another queue waits — each a
lookup here rather than a pass over every pending unit."""

from __future__ import annotations

from collections import Counter

from placement.nodeinfo import GUARANTEED
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.entries import UnitEntry, UnitState
from services.dispatcher.dispatching.ledger import QuotaLedger
from services.dispatcher.dispatching.queueing import borrowed, dominant_share, permille

_DISPATCHED, _TIMED_OUT = UnitState.DISPATCHED, UnitState.TIMED_OUT


def _away(state: UnitState) -> bool:
    """Whether a unit in ``state`` waits for nothing of its queue's: at a shard, or a timed-out
    gang held until its job is retried (other queues need not wait behind it). Told by
    identity, not by membership of a set: an Enum's hash is a Python function, and this is
    asked on every pod event."""
    return state is _DISPATCHED or state is _TIMED_OUT


def _adjust(counts: Counter[str], queue: str, change: int) -> None:
    """Add ``change`` to a queue's count, keeping no entry at zero (an absent queue has none)."""
    if change:
        left = counts[queue] + change
        if left:
            counts[queue] = left
        else:
            del counts[queue]


class QueueFigures:
    """Per queue: pending pods, units with pending pods, and of those the units not at a shard;
    every change of a unit's state goes through ``set_state`` so the last stays true."""

    def __init__(self, ledger: QuotaLedger) -> None:
        self._ledger = ledger
        # Pending pods per queue: every Submit checks admission limits against them, and
        # counting every unit per request cost one-pod jobs dearly.
        self._pending: Counter[str] = Counter()
        # Units with pending pods per queue: the queue statuses (and their metrics, sampled
        # every few seconds) read both, and a pass over every pending unit held the event loop
        # 37 ms per 100,000 one-pod jobs.
        self._pending_units: Counter[str] = Counter()
        # Units with pending pods and not at a shard, per queue: whether another queue waits
        # is asked for every unit a round offers, and a pass over a queue whose units were all
        # dispatched cost 0.4 ms per unit offered with 5,000 of them.
        self._not_at_shard: Counter[str] = Counter()

    def pod_joined(self, entry: UnitEntry) -> None:
        """A pending pod is about to join ``entry`` (it has not yet)."""
        queue = entry.queue
        if not entry.pods:
            self._pending_units[queue] += 1
            if not _away(entry.state):
                self._not_at_shard[queue] += 1
        self._pending[queue] += 1

    def pod_left(self, entry: UnitEntry) -> None:
        """A pending pod has left ``entry``."""
        queue, emptied = entry.queue, not entry.pods
        _adjust(self._pending, queue, -1)
        if emptied:
            _adjust(self._pending_units, queue, -1)
            if not _away(entry.state):
                _adjust(self._not_at_shard, queue, -1)

    def untracked(self, entry: UnitEntry) -> None:
        """``entry`` is no longer tracked, with whatever pods it still has."""
        if entry.pods:
            _adjust(self._pending, entry.queue, -len(entry.pods))
            _adjust(self._pending_units, entry.queue, -1)
            if not _away(entry.state):
                _adjust(self._not_at_shard, entry.queue, -1)

    def set_state(self, entry: UnitEntry, state: UnitState) -> None:
        """Every change of a unit's state goes here: to or from DISPATCHED (or TIMED_OUT), a
        unit with pods leaves or joins its queue's count of units not at a shard."""
        leaving = _away(entry.state)
        if entry.pods and leaving != _away(state):
            _adjust(self._not_at_shard, entry.queue, 1 if leaving else -1)
        entry.state = state

    def others_wait(self, queue: str) -> bool:
        """Whether a queue other than ``queue`` has pending units not at a shard (ready,
        settling, backing off or parked), from the counts kept per queue."""
        return len(self._not_at_shard) > (1 if queue in self._not_at_shard else 0)

    def pending_pods(self) -> dict[str, int]:
        """Per queue, its pending pods (what admission limits count)."""
        return dict(self._pending)

    def statuses(self) -> dict[str, pb.QueueStatus]:
        """Per queue, what its bound pods hold and what waits in it (the source of
        ``Queue.status``), from the counts kept as pods come and go. A queue with nothing in it
        is absent."""
        out: dict[str, pb.QueueStatus] = {
            queue: pb.QueueStatus(pending_units=units, pending_pods=self._pending[queue])
            for queue, units in self._pending_units.items()
        }
        ledger = self._ledger
        capacity = ledger.capacity(GUARANTEED)
        for queue, used in ledger.usage.items():
            if used.is_zero():  # left unset, it equals the stored status of an idle queue
                continue
            status = out.setdefault(queue, pb.QueueStatus())
            status.used.CopyFrom(used.as_resources())
            lent = borrowed(used, ledger.min(queue))
            if not lent.is_zero():
                status.borrowed.CopyFrom(lent.as_resources())
            status.dominant_share_permille = permille(dominant_share(used, capacity))
        return out
