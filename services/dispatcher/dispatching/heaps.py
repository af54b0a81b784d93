"""The QUEUED units of each logical queue in its sort policy's order (``QueueHeaps``), and the view
of a unit (``PendingUnit``) the policies key on and quotas read: a heap of (policy key, seq,
job) per queue, so a round costs what it dispatches, not every pending unit.
A unit's item goes stale when it leaves the queue by another way (dispatched, backed off,
forgotten): stale items are skipped when popped, not searched for."""

from __future__ import annotations

import heapq
from collections.abc import Callable

from placement.nodeinfo import pool_of
from placement.resources import Quantities
from services.dispatcher.dispatching.entries import (
    EncodedJobLookup,
    JobLookup,
    QueueLookup,
    UnitEntry,
    UnitState,
)
from services.dispatcher.dispatching.queueing import PendingUnit, SortKey, SortPolicy, policy_for
from services.dispatcher.objects import being_deleted, pods_complete


class QueueHeaps:
    """Per-queue heaps of QUEUED units over the unit queue's ``units`` (shared, not copied);
    ``set_state`` is the queue's (``QueueFigures.set_state``)."""

    def __init__(
        self,
        jobs: JobLookup,
        queues: QueueLookup,
        units: dict[str, UnitEntry],
        set_state: Callable[[UnitEntry, UnitState], None],
        encoded_jobs: EncodedJobLookup | None = None,
    ) -> None:
        self._jobs = jobs
        # A job's stored bytes by name, when the jobs are held encoded (the informer's): a
        # unit's cached view is good while its job's bytes are the same, told without
        # decoding the job (asked when a unit is queued and again when it is offered).
        self._encoded_jobs = encoded_jobs
        self._queues = queues
        self._units = units
        self._set_state = set_state
        self._heaps: dict[str, list[tuple[SortKey, int, str]]] = {}
        self._policies: dict[str, SortPolicy] = {}

    def policy(self, queue: str) -> SortPolicy:
        policy = self._policies.get(queue)
        if policy is None:
            obj = self._queues(queue)
            policy = policy_for(obj.spec.sort_policy if obj is not None else 0)
            self._policies[queue] = policy
        return policy

    def view(self, entry: UnitEntry) -> PendingUnit | None:
        """The unit as queue policies and quotas see it; None while its Job is unknown or its
        pods are still being created (a unit goes whole: a gang judged on part of its pods
        could be bound below its min_member, or a job sent in pieces)."""
        cached = entry.view
        version: int | bytes
        if self._encoded_jobs is not None:
            data = self._encoded_jobs(entry.job)
            if data is None:
                return None  # orphaned pods: nothing to schedule them as
            if cached is not None and cached[0] == data and cached[1].pods == len(entry.pods):
                return cached[1]  # the same job, so it was whole and not being deleted
            job = self._jobs(entry.job)
            if job is None:
                return None
            version = data
        else:
            job = self._jobs(entry.job)
            if job is None:
                return None  # orphaned pods: nothing to schedule them as
            version = job.metadata.resource_version
            if (
                cached is not None
                and version  # a job never stored has no version to tell its changes by
                and cached[0] == version
                and cached[1].pods == len(entry.pods)
            ):
                return cached[1]  # the same version of the job: whole, not being deleted
        if not pods_complete(job):
            return None  # its pods are still being created (chunked): dispatch it whole
        if being_deleted(job):
            return None  # going, in chunks: nothing more of it is scheduled
        spec, count = job.spec, len(entry.pods)
        requests = Quantities.of_pod_request(spec.template, count)
        least = min(max(1, spec.min_member), count)
        unit = PendingUnit(
            entry.job,
            entry.queue,
            spec.priority,
            job.metadata.creation_timestamp_ms,
            entry.seq,
            count,
            requests,
            pool_of(spec.qos),
            # Never mutated: one instance serves both when the unit's min is all of it.
            requests if least == count else Quantities.of_pod_request(spec.template, least),
        )
        entry.view = (version, unit)
        return unit

    def enqueue(self, entry: UnitEntry) -> None:
        """Mark the unit QUEUED and put it in its queue's heap (once)."""
        self._set_state(entry, UnitState.QUEUED)
        if entry.in_heap:
            return
        entry.in_heap = True
        unit = self.view(entry) or PendingUnit(
            entry.job, entry.queue, 0, entry.enqueued_ms, entry.seq, len(entry.pods), Quantities()
        )
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

    def policy_changed(self, queue: str) -> bool:
        """Whether the queue's stored sort policy is another than its units are keyed by (a
        Queue changed: most changes are its status, written every second while it has work,
        and leave the order as it is)."""
        kept = self._policies.get(queue)
        if kept is None:
            return True
        obj = self._queues(queue)
        return policy_for(obj.spec.sort_policy if obj is not None else 0) is not kept

    def clear(self, queue: str) -> list[UnitEntry]:
        """Empty the queue's heap and forget its policy (the queue changed): its QUEUED units,
        in their old order and marked out of the heap, for the caller to push again."""
        self._policies.pop(queue, None)
        members = self.queued(queue)
        self._heaps[queue] = []
        for entry in members:
            entry.in_heap = False
        return members
