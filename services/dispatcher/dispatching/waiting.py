"""Units out of the queue for a while (``Waits``): backing off after an attempt that did not fit
(doubling per attempt, capped), or parked as infeasible until the cluster changes (rechecked
after a while anyway), on one heap of timers; and per queue the units that backed off in
arrival order, for freed room to wake."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from foundation.retry import Backoff
from services.dispatcher.dispatching.entries import BackoffSettings, UnitEntry, UnitState

_WAITING = (UnitState.BACKOFF, UnitState.INFEASIBLE)


class Waits:
    """The timers of BACKOFF and INFEASIBLE units, over the unit queue's ``units`` and its units
    per queue (shared, not copied). The caller sets the units' states."""

    def __init__(
        self,
        settings: BackoffSettings,
        units: dict[str, UnitEntry],
        by_queue: dict[str, dict[str, UnitEntry]],
    ) -> None:
        self.settings = settings
        self._backoff = Backoff(settings.initial_seconds, cap=settings.max_seconds)
        self._units = units
        self._by_queue = by_queue
        self._timers: list[tuple[float, int, str]] = []  # (not_before, seq, job)
        # Per queue, the units that backed off, as heaps of (seq, job) in arrival order: freed
        # room wakes the first of one queue's (``wake_backed_off``). An item whose unit has left
        # BACKOFF since is dropped when it comes up, so waking costs what it wakes, not a pass
        # over every pending unit (with 100,000 backed off: 20 ms a wake, per round).
        self.backed_off: dict[str, list[tuple[int, str]]] = {}

    def back_off(self, entry: UnitEntry, now: float) -> float:
        """Time the unit's backoff: doubling from ``initial_seconds`` per attempt, capped.
        Returns the delay."""
        entry.attempts += 1
        delay = self._backoff.delay(entry.attempts - 1)
        entry.not_before = now + delay
        heapq.heappush(self._timers, (entry.not_before, entry.seq, entry.job))
        heap = self.backed_off.setdefault(entry.queue, [])
        heapq.heappush(heap, (entry.seq, entry.job))
        members = self._by_queue.get(entry.queue, {})
        if len(heap) > 2 * len(members) + 64:
            # Mostly items of units that left BACKOFF by their timer: keep it bounded.
            heap[:] = [(e.seq, e.job) for e in members.values() if e.state == UnitState.BACKOFF]
            heapq.heapify(heap)
        return delay

    def park(self, entry: UnitEntry, now: float) -> None:
        """Time the infeasible unit's recheck."""
        entry.not_before = now + self.settings.infeasible_recheck_seconds
        heapq.heappush(self._timers, (entry.not_before, entry.seq, entry.job))

    def due(self, now: float) -> Iterator[UnitEntry]:
        """The units whose backoff or infeasible recheck is due, each checked as it comes up
        (so one the caller queued is not given twice)."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            job = heapq.heappop(timers)[2]
            entry = self._units.get(job)
            if entry is not None and entry.state in _WAITING and entry.not_before <= now:
                yield entry

    def next_wake(self, now: float) -> float | None:
        """Seconds until the earliest wait ends (None if nothing waits)."""
        if not self._timers:
            return None
        return self._timers[0][0] - now

    def queues_backed_off(self) -> list[str]:
        """The queues with a unit backing off with pods, by name."""
        return [q for q in sorted(self.backed_off) if self._has_backed_off(q)]

    def wake_backed_off(self, queue: str, limit: int) -> Iterator[UnitEntry]:
        """``queue``'s backed-off units in arrival order, up to ``limit``, each checked as it
        comes up (a unit backed off twice has a second, stale item)."""
        heap = self.backed_off[queue]
        woken = 0
        while heap and woken < limit:
            entry = self._backed_off_now(*heapq.heappop(heap), queue)
            if entry is not None:
                yield entry
                woken += 1
        if not heap:
            del self.backed_off[queue]

    def _backed_off_now(self, seq: int, job: str, queue: str) -> UnitEntry | None:
        """The unit of a backed-off heap item, if it is still that unit, backing off, with
        pods."""
        entry = self._units.get(job)
        if (
            entry is None
            or entry.seq != seq
            or entry.queue != queue
            or entry.state != UnitState.BACKOFF
            or not entry.pods
        ):
            return None
        return entry

    def _has_backed_off(self, queue: str) -> bool:
        """Whether ``queue`` has a unit backing off with pods (stale items on top dropped)."""
        heap = self.backed_off.get(queue)
        while heap and self._backed_off_now(*heap[0], queue) is None:
            heapq.heappop(heap)
        if not heap:
            self.backed_off.pop(queue, None)
            return False
        return True
