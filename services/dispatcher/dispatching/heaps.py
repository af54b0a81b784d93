"""The QUEUED units of each logical queue in its sort policy's order (``QueueHeaps``): a heap of
(policy key, seq, job) per queue, so a round costs what it dispatches, not every pending unit.
A unit's item goes stale when it leaves the queue by another way (dispatched, backed off,
forgotten): stale items are skipped when popped, not searched for."""

from __future__ import annotations

import heapq

from services.dispatcher.dispatching.entries import QueueLookup, UnitEntry, UnitState
from services.dispatcher.dispatching.queueing import PendingUnit, SortKey, SortPolicy, policy_for


class QueueHeaps:
    """Per-queue heaps of QUEUED units over the unit queue's ``units`` (shared, not copied)."""

    def __init__(self, queues: QueueLookup, units: dict[str, UnitEntry]) -> None:
        self._queues = queues
        self._units = units
        self._heaps: dict[str, list[tuple[SortKey, int, str]]] = {}
        self._policies: dict[str, SortPolicy] = {}

    def policy(self, queue: str) -> SortPolicy:
        policy = self._policies.get(queue)
        if policy is None:
            obj = self._queues(queue)
            policy = policy_for(obj.spec.sort_policy if obj is not None else 0)
            self._policies[queue] = policy
        return policy

    def push(self, entry: UnitEntry, unit: PendingUnit) -> None:
        """Put ``entry`` (seen as ``unit``) in its queue's heap at its policy's key."""
        queue = entry.queue
        policy = self._policies.get(queue) or self.policy(queue)
        key = policy.key(unit)
        heapq.heappush(self._heaps.setdefault(queue, []), (key, entry.seq, entry.job))

    def pop(self, queue: str) -> UnitEntry | None:
        """The queue's first unit that is still QUEUED with pods (stale items are dropped)."""
        heap = self._heaps.get(queue)
        while heap:
            job = heapq.heappop(heap)[2]
            entry = self._units.get(job)
            if entry is None or not entry.in_heap or entry.queue != queue:
                continue
            entry.in_heap = False
            if entry.state == UnitState.QUEUED and entry.pods:
                return entry
        return None

    def budget(self, limit: int) -> dict[str, int]:
        """``limit`` for each queue with items in its heap (some may be stale), by name."""
        return {queue: limit for queue, heap in sorted(self._heaps.items()) if heap}

    def queued(self, queue: str) -> list[UnitEntry]:
        """The queue's QUEUED units in dispatch order (for Explain; not on the hot path)."""
        seen: set[str] = set()
        out = []
        for _, _, job in sorted(self._heaps.get(queue, [])):
            entry = self._units.get(job)
            if entry is not None and entry.in_heap and job not in seen:
                seen.add(job)
                out.append(entry)
        return out

    def position(self, entry: UnitEntry) -> int:
        """1-based place of a QUEUED unit in its queue (0 if it is not there)."""
        units = self.queued(entry.queue)
        return next((i + 1 for i, u in enumerate(units) if u is entry), 0)

    def clear(self, queue: str) -> list[UnitEntry]:
        """Empty the queue's heap and forget its policy (the queue changed): its QUEUED units,
        in their old order and marked out of the heap, for the caller to push again."""
        self._policies.pop(queue, None)
        members = self.queued(queue)
        self._heaps[queue] = []
        for entry in members:
            entry.in_heap = False
        return members
