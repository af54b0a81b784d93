"""The dispatcher's queue of pending units: ordering within each logical queue, fairness between
queues, the quota check (max), min and borrowed capacity, backoff and the infeasible wait — kept
apart from the shard streams as kube-scheduler keeps its scheduling queue apart from its cache.

Synchronous and free of I/O: time comes in as arguments (``now`` on the monotonic clock,
``now_ms`` on the wall clock), jobs and queues through the two lookups it is built with, and
the round hands each unit it picks to a ``place`` callback (the dispatcher's shard choice). Its
table tests need no store, no gRPC and no event loop.
"""

from __future__ import annotations

import enum
import heapq
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import NamedTuple

from foundation.retry import Backoff
from placement.claims import holds_claim
from placement.nodeinfo import GUARANTEED, pool_of
from placement.resources import Quantities
from placement.room import PoolRoom
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.queueing import (
    Fairness,
    PendingUnit,
    QueueLoad,
    RoundRobin,
    SortKey,
    SortPolicy,
    borrowed,
    dominant_share,
    next_queue,
    permille,
    policy_for,
    quota_excess,
    turn_key,
)
from services.dispatcher.objects import DEFAULT_QUEUE, being_deleted, pods_complete

# A queue stops for the round after this many of its units found no room (quota or shard
# credits), so a long queue of units too large for the shards left costs a bounded round.
MAX_HELD_PER_ROUND = 64

# What offering a unit came to: sent, held (quota, no shard, unknown job), or held because the
# cluster has no room for it while other queues wait behind it.
_SENT, _HELD, _NO_ROOM = 0, 1, 2


class UnitState(enum.Enum):
    QUEUED = "queued"
    BACKOFF = "backoff"
    DISPATCHED = "dispatched"
    # The attempt ended; waiting for the informer to catch up before queueing again.
    SETTLING = "settling"
    # Can never fit as specified: out of the queue until the cluster changes.
    INFEASIBLE = "infeasible"


@dataclass(frozen=True, slots=True)
class BackoffSettings:
    initial_seconds: float = 1.0
    max_seconds: float = 60.0
    infeasible_recheck_seconds: float = 300.0


class PendingRef(NamedTuple):
    """What a unit sends of each pending pod (its name is the key): held for every pending pod
    of the cluster, so not the pod itself (2.6 KiB decoded; the informer has it)."""

    uid: str
    resource_version: int
    pod_index: int  # its index in the job ("index" is a tuple's method)


@dataclass(slots=True, eq=False)
class UnitEntry:
    """A job with pending pods, as the dispatcher tracks it."""

    job: str
    queue: str
    seq: int
    enqueued_ms: int
    pods: dict[str, PendingRef] = field(default_factory=dict)
    state: UnitState = UnitState.QUEUED
    shard: str = ""
    not_before: float = 0.0
    attempts: int = 0
    reason: str = ""
    # Quota held while dispatched, so one round cannot overrun a queue's quota.
    reserved: Quantities | None = None
    reserved_pool: str = GUARANTEED
    # The quota resource that held it back in the last round ("" if none).
    blocked: str = ""
    # Held in the last round because the cluster had no free room for it while other queues
    # had work too (fair sharing: it goes first once room frees).
    waiting_for_room: bool = False
    # In its queue's heap (QUEUED entries only; the heap drops stale items lazily).
    in_heap: bool = False
    # The last ``UnitQueue.view`` of it and the version of the Job it was made from: good while
    # the job is at that version and the pod count is the same. A unit is viewed when queued
    # and again when offered; building one is most of the round's cost per unit.
    view: tuple[int, PendingUnit] | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """A bound or running pod as its queue's usage counts it: what quota and reclaim's order
    need, not the pod (held per bound pod, a decoded pod was 2.6 KiB of it; reclaim reads the
    few it weighs from the informer). ``requests`` is shared by pods asking the same and never
    mutated."""

    name: str
    queue: str
    pool: str
    requests: Quantities
    priority: int = 0
    started_ms: int = 0
    deleting: bool = False

    @classmethod
    def of(cls, pod: pb.Pod) -> Claim:
        return cls(
            pod.metadata.name,
            sys.intern(queue_of(pod)),
            pool_of(pod.spec.qos),
            Quantities.shared_request(pod.spec.template.requests),
            pod.spec.priority,
            pod.status.started_ms,
            bool(pod.metadata.deletion_timestamp_ms),
        )


def is_pending(pod: pb.Pod) -> bool:
    return pod.status.phase == pb.POD_PENDING and not pod.spec.node_name


def queue_of(pod: pb.Pod) -> str:
    return pod.spec.queue or DEFAULT_QUEUE


JobLookup = Callable[[str], pb.Job | None]
QueueLookup = Callable[[str], pb.Queue | None]
# Offered each unit the round picks, with its requests: True if it was sent (the callback then
# calls ``UnitQueue.dispatched``), False to hold it for the next round.
Place = Callable[[UnitEntry, PendingUnit], bool]


def _adjust(counts: Counter[str], queue: str, change: int) -> None:
    """Add ``change`` to a queue's count, keeping no entry at zero (an absent queue has none)."""
    if change:
        left = counts[queue] + change
        if left:
            counts[queue] = left
        else:
            del counts[queue]


class _Turns:
    """Whose turn it is within one round under a fairness policy: the queue with the smallest
    key (ties by name). Every queue's key is computed once, and then only the key of the queue
    that just had its turn: within a round nothing else changes what the others hold. (Every
    queue's key per unit sent cost 0.4 ms a unit with 100 queues, 4.5 ms with 1,000.)"""

    def __init__(self, key: Callable[[str], tuple[Fraction, str]], queues: Iterable[str]) -> None:
        self._key = key
        self._heap = [key(q) for q in queues]
        heapq.heapify(self._heap)

    def next(self, budget: dict[str, int]) -> str | None:
        """The queue whose turn it is (taken off: ``again`` puts it back), None when none of
        ``budget`` is left."""
        while self._heap:
            _, queue = heapq.heappop(self._heap)
            if queue in budget:
                return queue
        return None

    def again(self, queue: str) -> None:
        """``queue`` had its turn and has more to offer: back, at its new key."""
        heapq.heappush(self._heap, self._key(queue))


class UnitQueue:
    """Pending units per logical queue, in policy order, with per-queue usage for the quota.

    ``units`` holds every tracked unit whatever its state; only QUEUED units sit in a heap.
    """

    def __init__(
        self,
        jobs: JobLookup,
        queues: QueueLookup,
        backoff: BackoffSettings,
        fairness: Fairness | None = None,
    ) -> None:
        self.jobs = jobs
        self.queues = queues
        self.backoff = backoff
        self.fairness: Fairness = fairness or RoundRobin()
        self.units: dict[str, UnitEntry] = {}
        # The same units per queue, so questions about one queue cost its units, not all.
        self._by_queue: dict[str, dict[str, UnitEntry]] = {}
        self._seq = 0
        # Pending pods per queue, kept as pods come and go: every Submit checks admission
        # limits against them, and counting every unit per request cost one-pod jobs dearly.
        self._pending: Counter[str] = Counter()
        # Units with pending pods per queue, kept the same way: the queue statuses (and their
        # metrics, sampled every few seconds) read both, and a pass over every pending unit
        # held the event loop 37 ms per 100,000 one-pod jobs.
        self._pending_units: Counter[str] = Counter()
        # Units with pending pods and not at a shard, per queue: whether another queue waits
        # is asked for every unit a round offers, and a pass over a queue whose units were all
        # dispatched cost 0.4 ms per unit offered with 5,000 of them.
        self._not_at_shard: Counter[str] = Counter()
        # Per queue: requests of bound pods holding a claim, and of dispatched units.
        self._usage: dict[str, Quantities] = {}
        self._inflight: dict[str, Quantities] = {}
        # The cluster's room per pool (placement.room): what the nodes (ready, schedulable)
        # offer, minus the claims (its ``Claim`` per pod holding one, also what quota and
        # reclaim read: one record per bound pod, and removals are exact) and the dispatched
        # units' requests (held until their attempt ends). Totals only: the queue judges the
        # cluster as a whole (the shards judge the nodes), so no sum per node.
        self._room: PoolRoom[Claim] = PoolRoom()
        # What queues below their min are owed, as the current round started (``owed``).
        self._round_owed: dict[str, Quantities] = {}
        # A claim was released since the last round (room freed), and whether the last round
        # held a unit for room (only then is freed room worth waking backed-off units for).
        self._room_freed = False
        self._held_for_room = False
        # QUEUED units per queue as heaps of (policy key, seq, job), so a round costs what it
        # dispatches, not every pending unit; stale items are skipped when popped.
        self._heaps: dict[str, list[tuple[SortKey, int, str]]] = {}
        self._policies: dict[str, SortPolicy] = {}
        self._waiting: list[tuple[float, int, str]] = []  # BACKOFF/INFEASIBLE: (not_before, ...)
        # Per queue, the units that backed off, as heaps of (seq, job) in arrival order: freed
        # room wakes the first of one queue's (``_wake_for_freed_room``). An item whose unit
        # has left BACKOFF since is dropped when it comes up, so waking costs what it wakes,
        # not a pass over every pending unit (with 100,000 backed off: 20 ms a wake, per round).
        self._backed_off: dict[str, list[tuple[int, str]]] = {}

    # -----------------------------------------------------------------------------------------
    # Pods coming and going
    # -----------------------------------------------------------------------------------------

    def add_pod(self, pod: pb.Pod, now_ms: int) -> bool:
        """Count a pod: its claim towards its queue's usage, and if pending, into its job's
        unit. True when a unit joined its queue's heap (a round may send it)."""
        name = pod.metadata.name
        if holds_claim(pod):
            claim = Claim.of(pod)
            self._room.claim(claim.name, claim)
            self._usage.setdefault(claim.queue, Quantities()).add(claim.requests)
        if not is_pending(pod):
            return False
        entry = self.units.get(pod.spec.job)
        if entry is None:
            self._seq += 1
            entry = UnitEntry(pod.spec.job, queue_of(pod), self._seq, now_ms)
            self.units[pod.spec.job] = entry
            self._by_queue.setdefault(entry.queue, {})[entry.job] = entry
        if name not in entry.pods:
            if not entry.pods:
                self._pending_units[entry.queue] += 1
                if entry.state != UnitState.DISPATCHED:
                    self._not_at_shard[entry.queue] += 1
            self._pending[entry.queue] += 1
        entry.pods[name] = PendingRef(
            pod.metadata.uid, pod.metadata.resource_version, pod.spec.index
        )
        if entry.state == UnitState.QUEUED and not entry.in_heap:
            self.enqueue(entry)
            return True
        return False

    def remove_pod(self, pod: pb.Pod) -> bool:
        """Undo ``add_pod`` (the unit itself stays until ``drop_if_empty``, so an update —
        remove then add — keeps its state). True if the pod held a claim."""
        name = pod.metadata.name
        claim = self._room.release(name)
        if claim is not None:
            self._usage[claim.queue].add(claim.requests, -1)
            self._room_freed = True
        entry = self.units.get(pod.spec.job)
        if entry is not None and entry.pods.pop(name, None) is not None:
            emptied = not entry.pods
            self._uncount(entry.queue, 1, units=1 if emptied else 0)
            if emptied and entry.state != UnitState.DISPATCHED:
                self._count_not_at_shard(entry.queue, -1)
        return claim is not None

    def holds_claim(self, pod: str) -> bool:
        return self._room.holds(pod)

    def drop_if_empty(self, job: str) -> None:
        # A dispatched unit stays tracked until its shard reports on it (it counts as load).
        entry = self.units.get(job)
        if entry is not None and not entry.pods and entry.state != UnitState.DISPATCHED:
            self._untrack(entry)

    def forget(self, job: str) -> UnitEntry | None:
        """Stop tracking a unit (its job was deleted); its reserved quota is returned."""
        entry = self.units.get(job)
        if entry is None:
            return None
        self._untrack(entry)
        if entry.state == UnitState.DISPATCHED:
            self.release(entry)
        return entry

    def _uncount(self, queue: str, pods: int, units: int) -> None:
        _adjust(self._pending, queue, -pods)
        _adjust(self._pending_units, queue, -units)

    def _count_not_at_shard(self, queue: str, change: int) -> None:
        _adjust(self._not_at_shard, queue, change)

    def _set_state(self, entry: UnitEntry, state: UnitState) -> None:
        """Every change of a unit's state goes here: to or from DISPATCHED, a unit with pods
        leaves or joins its queue's count of units not at a shard."""
        leaving = entry.state == UnitState.DISPATCHED
        if entry.pods and leaving != (state == UnitState.DISPATCHED):
            self._count_not_at_shard(entry.queue, 1 if leaving else -1)
        entry.state = state

    def _untrack(self, entry: UnitEntry) -> None:
        if entry.pods:
            self._uncount(entry.queue, len(entry.pods), units=1)
            if entry.state != UnitState.DISPATCHED:
                self._count_not_at_shard(entry.queue, -1)
        del self.units[entry.job]
        members = self._by_queue[entry.queue]
        del members[entry.job]
        if not members:
            del self._by_queue[entry.queue]

    # -----------------------------------------------------------------------------------------
    # Ordering
    # -----------------------------------------------------------------------------------------

    def view(self, entry: UnitEntry) -> PendingUnit | None:
        """The unit as queue policies and quotas see it; None while its Job is unknown or its
        pods are still being created (a unit goes whole: a gang judged on part of its pods
        could be bound below its min_member, or a job sent in pieces)."""
        job = self.jobs(entry.job)
        if job is None:
            return None  # orphaned pods: nothing to schedule them as
        cached = entry.view
        version = job.metadata.resource_version
        if (
            cached is not None
            and version  # a job never stored has no version to tell its changes by
            and cached[0] == version
            and cached[1].pods == len(entry.pods)
        ):
            return cached[1]  # the same version of the job, so it was whole and not being deleted
        if not pods_complete(job):
            return None  # its pods are still being created (chunked): dispatch it whole
        if being_deleted(job):
            return None  # going, in chunks: nothing more of it is scheduled
        spec, count = job.spec, len(entry.pods)
        requests = Quantities.of_pod_request(spec.template.requests, count)
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
            requests
            if least == count
            else Quantities.of_pod_request(spec.template.requests, least),
        )
        entry.view = (version, unit)
        return unit

    def policy(self, queue: str) -> SortPolicy:
        policy = self._policies.get(queue)
        if policy is None:
            obj = self.queues(queue)
            policy = policy_for(obj.spec.sort_policy if obj is not None else 0)
            self._policies[queue] = policy
        return policy

    def enqueue(self, entry: UnitEntry) -> None:
        """Mark the unit QUEUED and put it in its queue's heap (once)."""
        self._set_state(entry, UnitState.QUEUED)
        if entry.in_heap:
            return
        entry.in_heap = True
        unit = self.view(entry) or PendingUnit(
            entry.job, entry.queue, 0, entry.enqueued_ms, entry.seq, len(entry.pods), Quantities()
        )
        key = self.policy(entry.queue).key(unit)
        heapq.heappush(self._heaps.setdefault(entry.queue, []), (key, entry.seq, entry.job))

    def pop(self, queue: str) -> UnitEntry | None:
        """The queue's first unit that is still QUEUED with pods (stale items are dropped)."""
        heap = self._heaps.get(queue)
        while heap:
            job = heapq.heappop(heap)[2]
            entry = self.units.get(job)
            if entry is None or not entry.in_heap or entry.queue != queue:
                continue
            entry.in_heap = False
            if entry.state == UnitState.QUEUED and entry.pods:
                return entry
        return None

    def queued(self, queue: str) -> list[UnitEntry]:
        """The queue's QUEUED units in dispatch order (for Explain; not on the hot path)."""
        seen: set[str] = set()
        out = []
        for _, _, job in sorted(self._heaps.get(queue, [])):
            entry = self.units.get(job)
            if entry is not None and entry.in_heap and job not in seen:
                seen.add(job)
                out.append(entry)
        return out

    def position(self, entry: UnitEntry) -> int:
        """1-based place of a QUEUED unit in its queue (0 if it is not there)."""
        units = self.queued(entry.queue)
        return next((i + 1 for i, u in enumerate(units) if u is entry), 0)

    def queue_changed(self, queue: str) -> None:
        """A queue was created or changed (its sort policy may differ): re-key its heap."""
        self._policies.pop(queue, None)
        members = self.queued(queue)
        self._heaps[queue] = []
        for entry in members:
            entry.in_heap = False
            self.enqueue(entry)

    # -----------------------------------------------------------------------------------------
    # Attempts that ended
    # -----------------------------------------------------------------------------------------

    def back_off(self, entry: UnitEntry, now: float) -> float:
        """The unit did not fit: wait, doubling from ``initial_seconds`` per attempt, capped.
        Returns the delay."""
        entry.attempts += 1
        delay = Backoff(self.backoff.initial_seconds, cap=self.backoff.max_seconds).delay(
            entry.attempts - 1
        )
        self._set_state(entry, UnitState.BACKOFF)
        entry.not_before = now + delay
        heapq.heappush(self._waiting, (entry.not_before, entry.seq, entry.job))
        self._push_backed_off(entry)
        return delay

    def _push_backed_off(self, entry: UnitEntry) -> None:
        heap = self._backed_off.setdefault(entry.queue, [])
        heapq.heappush(heap, (entry.seq, entry.job))
        members = self._by_queue.get(entry.queue, {})
        if len(heap) > 2 * len(members) + 64:
            # Mostly items of units that left BACKOFF by their timer: keep it bounded.
            heap[:] = [(e.seq, e.job) for e in members.values() if e.state == UnitState.BACKOFF]
            heapq.heapify(heap)

    def _backed_off_now(self, seq: int, job: str, queue: str) -> UnitEntry | None:
        """The unit of a backed-off heap item, if it is still that unit, backing off, with
        pods."""
        entry = self.units.get(job)
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
        heap = self._backed_off.get(queue)
        while heap and self._backed_off_now(*heap[0], queue) is None:
            heapq.heappop(heap)
        if not heap:
            self._backed_off.pop(queue, None)
            return False
        return True

    def park_infeasible(self, entry: UnitEntry, now: float) -> None:
        """The unit can never fit as specified: out of the queue until the cluster changes
        (``wake_infeasible``), and rechecked after a while anyway (as kube-scheduler flushes its
        unschedulable pods): the change may have reached us before the shard that judged it."""
        self._set_state(entry, UnitState.INFEASIBLE)
        entry.not_before = now + self.backoff.infeasible_recheck_seconds
        heapq.heappush(self._waiting, (entry.not_before, entry.seq, entry.job))

    def succeeded(self, entry: UnitEntry) -> None:
        """The attempt ended well (whatever is still pending waits to settle)."""
        entry.attempts = 0
        self.settle(entry)

    def settle(self, entry: UnitEntry) -> None:
        self._set_state(entry, UnitState.SETTLING)

    def settled(self, job: str) -> bool:
        """The view has caught up after the unit's attempt: queue what is still pending. True
        when it was queued again."""
        entry = self.units.get(job)
        if entry is None or entry.state != UnitState.SETTLING:
            return False
        if entry.pods:
            self.enqueue(entry)
            return True
        self.drop_if_empty(job)
        return False

    def wake_queue(self, queue: str) -> None:
        """Room was freed for ``queue`` (reclaim): its backed-off units may try again now."""
        for entry in list(self._by_queue.get(queue, {}).values()):
            if entry.state == UnitState.BACKOFF:
                self.enqueue(entry)

    def wake_infeasible(self) -> int:
        """The cluster changed: units that could never fit may fit now. Returns how many."""
        woke = [e for e in self.units.values() if e.state == UnitState.INFEASIBLE]
        for entry in woke:
            self.enqueue(entry)
        return len(woke)

    def wake(self, now: float) -> None:
        """Queue the units whose backoff or infeasible recheck is due."""
        while self._waiting and self._waiting[0][0] <= now:
            job = heapq.heappop(self._waiting)[2]
            entry = self.units.get(job)
            waiting = (UnitState.BACKOFF, UnitState.INFEASIBLE)
            if entry is not None and entry.state in waiting and entry.not_before <= now:
                self.enqueue(entry)

    def next_wake(self, now: float) -> float | None:
        """Seconds until the earliest wait ends (None if nothing waits)."""
        if not self._waiting:
            return None
        return self._waiting[0][0] - now

    # -----------------------------------------------------------------------------------------
    # Quota and the round
    # -----------------------------------------------------------------------------------------

    def quota(self, queue: str) -> pb.Resources | None:
        """The queue's max (``spec.quota``), None when it has none."""
        obj = self.queues(queue)
        if obj is not None and obj.spec.HasField("quota"):
            return obj.spec.quota
        return None

    def ancestors(self, queue: str) -> list[str]:
        """The queue's parents, nearest first (a cycle, which Apply refuses, ends the walk)."""
        out: list[str] = []
        seen = {queue}
        obj = self.queues(queue)
        while obj is not None and obj.spec.parent and obj.spec.parent not in seen:
            out.append(obj.spec.parent)
            seen.add(obj.spec.parent)
            obj = self.queues(obj.spec.parent)
        return out

    def quota_excess(self, queue: str, request: Quantities) -> str:
        """The resource a unit of ``request`` would take past the queue's max, or past the max
        of a parent queue (counting every queue below that parent); "" if it fits."""
        quota = self.quota(queue)
        blocked = quota_excess(quota, self.used(queue), request) if quota is not None else ""
        if blocked:
            return blocked
        for parent in self.ancestors(queue):
            limit = self.quota(parent)
            if limit is None:
                continue
            below = Quantities()
            for other in self._usage.keys() | self._inflight.keys():
                if other == parent or parent in self.ancestors(other):
                    below.add(self.used(other))
            blocked = quota_excess(limit, below, request)
            if blocked:
                return f"{blocked} of parent queue {parent}"
        return ""

    def min(self, queue: str) -> Quantities:
        """The queue's min: capacity always available to it (nothing when unset)."""
        obj = self.queues(queue)
        if obj is not None and obj.spec.HasField("min"):
            return Quantities.of(obj.spec.min)
        return Quantities()

    def weight(self, queue: str) -> int:
        obj = self.queues(queue)
        return max(1, obj.spec.weight) if obj is not None else 1

    def bound_usage(self, queue: str) -> Quantities:
        """What the queue's bound and running pods hold (not its dispatched units)."""
        return self._usage.get(queue, Quantities())

    def used(self, queue: str) -> Quantities:
        """What the queue holds: its bound pods' requests plus its dispatched units'."""
        used = Quantities()
        used.add(self._usage.get(queue, Quantities()))
        used.add(self._inflight.get(queue, Quantities()))
        return used

    def set_node(self, name: str, offered: dict[str, Quantities] | None) -> None:
        """A node's capacity per pool (None: the node is gone, not ready or unschedulable)."""
        self._room.set_node(name, offered)

    def capacity(self, pool: str = GUARANTEED) -> Quantities:
        return self._room.capacity(pool)

    def free(self, pool: str) -> Quantities:
        """The pool's room left in the cluster as a whole: capacity minus every queue's bound
        and dispatched requests (fragmentation aside: the shards judge the nodes)."""
        return self._room.free(pool)

    def dispatched(self, entry: UnitEntry, shard: str, unit: PendingUnit) -> None:
        """The unit went to ``shard``: its requests count against the quota until it ends."""
        self._set_state(entry, UnitState.DISPATCHED)
        entry.shard = shard
        entry.reserved = unit.requests
        entry.reserved_pool = unit.pool
        self._inflight.setdefault(entry.queue, Quantities()).add(unit.requests)
        self._room.hold(unit.pool, unit.requests)

    def release(self, entry: UnitEntry) -> None:
        """The dispatched attempt ended (or its shard is gone): return the reserved quota."""
        if entry.reserved is not None:
            self._inflight[entry.queue].add(entry.reserved, -1)
            self._room.hold(entry.reserved_pool, entry.reserved, -1)
            entry.reserved = None
        entry.shard = ""

    def round(self, now: float, place: Place, has_room: Callable[[], bool]) -> None:
        """Offer ready units to ``place`` while ``has_room()``: within a queue in its policy's
        order; between queues by the fairness policy — round-robin, or the queue with the
        smallest (weighted) dominant share next. Under DRF/FairShare, when the cluster has no
        free room for the min_member pods of that queue's next unit while other queues have
        work too (ready or backing off), the unit is held and every queue waits behind it: none
        may take the room it waits for. A queue alone with work sends as before fairness (its
        unit may preempt at the shard). Room owed to a queue below its min is kept for it. A
        unit over its queue's quota, or that ``place`` refuses, is held for the next round; a
        queue stops after ``MAX_HELD_PER_ROUND`` such units."""
        self.wake(now)
        fair = not self.fairness.work_conserving
        if fair and self._room_freed and self._held_for_room:
            self._wake_for_freed_room()
        self._room_freed = self._held_for_room = False
        self._round_owed = self.owed()
        held: list[UnitEntry] = []  # popped but not sent: back in their queues after the round
        budget = {q: MAX_HELD_PER_ROUND for q, heap in sorted(self._heaps.items()) if heap}
        if fair:
            turns = _Turns(self._turn_key, budget) if len(budget) > 1 else None
            while budget and has_room():
                if len(budget) == 1 or turns is None:
                    # No choice to make (most rounds: one queue has work), and none to come:
                    # a round's queues only go.
                    if not self._turn(next(iter(budget)), budget, held, place, fair):
                        break
                    continue
                queue = turns.next(budget)
                if queue is None or not self._turn(queue, budget, held, place, fair):
                    break
                if len(budget) > 1 and queue in budget:
                    turns.again(queue)
        else:
            while budget and has_room():
                for queue in list(budget):
                    if not self._turn(queue, budget, held, place, fair):
                        break
        for entry in held:
            self.enqueue(entry)

    def _turn(
        self,
        queue: str,
        budget: dict[str, int],
        held: list[UnitEntry],
        place: Place,
        fair: bool,
    ) -> bool:
        """Offer ``queue``'s next unit. False when everyone must wait behind it (no room for
        the queue with the smallest share: ``budget`` is cleared)."""
        entry = self.pop(queue)
        if entry is None:
            del budget[queue]
            return True
        contended = fair and (len(budget) > 1 or self._others_wait(queue))
        outcome = self._offer(entry, place, contended=contended)
        if outcome == _SENT:
            return True
        held.append(entry)
        self._held_for_room |= entry.waiting_for_room
        if outcome == _NO_ROOM:
            budget.clear()  # everyone waits behind the queue with the smallest share
            return False
        budget[queue] -= 1
        if budget[queue] <= 0:
            del budget[queue]
        return True

    def _turn_key(self, queue: str) -> tuple[Fraction, str]:
        """Where ``queue`` stands for its next turn (``queueing.turn_key``)."""
        load = QueueLoad(queue, self.used(queue), self.weight(queue))
        return turn_key(load, self._room.capacity(GUARANTEED), self.fairness)

    def _wake_for_freed_room(self) -> None:
        """Room freed: the backed-off units of the queue with the smallest share try again now
        rather than when their backoff ends (as kube-scheduler moves unschedulable pods back on a
        pod's deletion), so the room goes by fairness, not to whoever happens to be ready. At
        most ``MAX_HELD_PER_ROUND`` of them; one that fails again backs off longer."""
        waiting = [q for q in sorted(self._backed_off) if self._has_backed_off(q)]
        if not waiting:
            return
        loads = [QueueLoad(q, self.used(q), self.weight(q)) for q in waiting]
        queue = next_queue(loads, self._room.capacity(GUARANTEED), self.fairness)
        heap = self._backed_off[queue]
        woken = 0
        while heap and woken < MAX_HELD_PER_ROUND:
            entry = self._backed_off_now(*heapq.heappop(heap), queue)
            if entry is not None:  # a unit backed off twice has a second, stale item
                self.enqueue(entry)
                woken += 1
        if not heap:
            del self._backed_off[queue]

    def _others_wait(self, queue: str) -> bool:
        """Whether a queue other than ``queue`` has pending units not at a shard (ready,
        settling, backing off or parked), from the counts kept per queue."""
        return len(self._not_at_shard) > (1 if queue in self._not_at_shard else 0)

    def _offer(self, entry: UnitEntry, place: Place, *, contended: bool) -> int:
        entry.waiting_for_room = False
        unit = self.view(entry)
        if unit is None:
            return _HELD
        entry.blocked = self.quota_excess(entry.queue, unit.requests)
        if entry.blocked:
            return _HELD
        if not unit.least.fits_in(self._room_for(entry.queue, unit.pool)):
            entry.waiting_for_room = True
            if entry.queue in self._round_owed:
                # Below its min: it waits for the room reclaim frees, rather than failing at a
                # shard and backing off while others take that room.
                return _HELD
            if contended:
                return _NO_ROOM
            if any(other != entry.queue for other in self._round_owed):
                return _HELD  # the room is kept for a queue below its min
            entry.waiting_for_room = False  # alone: it goes, and may preempt at the shard
        return _SENT if place(entry, unit) else _HELD

    def _room_for(self, queue: str, pool: str) -> Quantities:
        """The free room of ``pool`` a unit of ``queue`` may take: all of it but what the mins
        of other queues with pending work keep for them."""
        free = self.free(pool)
        if pool != GUARANTEED:
            return free
        for other, owed in self._round_owed.items():
            if other != queue:
                free = free.beyond(owed)
        return free

    # -----------------------------------------------------------------------------------------
    # Reclaim: queues below their min take back what others borrowed
    # -----------------------------------------------------------------------------------------

    def owed(self) -> dict[str, Quantities]:
        """Per queue below its min with pending work (guaranteed pool): what its min still owes
        it, up to what its pending units ask for. Idle room up to this is kept for it, and
        reclaim frees what the room lacks. Asked every round: it reads a queue's units only
        until they ask for all its min still owes (a queue of 100,000 one-pod units and a min
        took 0.13 s a round to add them all)."""
        out: dict[str, Quantities] = {}
        for queue, members in sorted(self._by_queue.items()):
            floor = self.min(queue)
            if floor.is_zero():
                continue
            left = floor.beyond(self.used(queue))
            if left.is_zero():
                continue  # its min is met
            wanted = Quantities()
            for entry in members.values():
                if not entry.pods or entry.state == UnitState.DISPATCHED:
                    continue
                unit = self.view(entry)
                if unit is not None and unit.pool == GUARANTEED:
                    wanted.add(unit.requests)
                    if left.fits_in(wanted):
                        break  # more units would not change what it is owed
            owed = wanted.capped_by(left)
            if not owed.is_zero():
                out[queue] = owed
        return out

    def reclaim_needs(self) -> dict[str, Quantities]:
        """Per queue below its min with pending work the cluster has no room for: how much
        (guaranteed pool) must be freed for it — what its min owes it (``owed``) beyond the
        free room (which goes to the first such queue)."""
        free = self.free(GUARANTEED)
        out: dict[str, Quantities] = {}
        for queue, owed in self.owed().items():
            need = owed.beyond(free)
            if not need.is_zero():
                out[queue] = need
            free = free.beyond(owed)
        return out

    def claims(self) -> list[Claim]:
        """Every bound or running pod with the queue it counts for."""
        return list(self._room.claims())

    def pending_pods(self) -> dict[str, int]:
        """Per queue, its pending pods (what admission limits count)."""
        return dict(self._pending)

    # -----------------------------------------------------------------------------------------
    # Status
    # -----------------------------------------------------------------------------------------

    def statuses(self) -> dict[str, pb.QueueStatus]:
        """Per queue, what its bound pods hold and what waits in it (the source of
        ``Queue.status``), from the counts kept as pods come and go. A queue with nothing in it
        is absent."""
        out: dict[str, pb.QueueStatus] = {
            queue: pb.QueueStatus(pending_units=units, pending_pods=self._pending[queue])
            for queue, units in self._pending_units.items()
        }
        capacity = self._room.capacity(GUARANTEED)
        for queue, used in self._usage.items():
            if used.is_zero():  # left unset, it equals the stored status of an idle queue
                continue
            status = out.setdefault(queue, pb.QueueStatus())
            status.used.CopyFrom(used.as_resources())
            lent = borrowed(used, self.min(queue))
            if not lent.is_zero():
                status.borrowed.CopyFrom(lent.as_resources())
            status.dominant_share_permille = permille(dominant_share(used, capacity))
        return out
