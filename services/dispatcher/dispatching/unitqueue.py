"""The dispatcher's queue of pending units: ordering within each logical queue, fairness between
queues, the quota check (max), min and borrowed capacity, backoff and the infeasible wait — kept
apart from the shard streams as kube-scheduler keeps its scheduling queue apart from its cache.

Synchronous and free of I/O: time comes in as arguments (``now`` on the monotonic clock,
``now_ms`` on the wall clock), jobs and queues through the two lookups it is built with, and
the round hands each unit it picks to a ``place`` callback (the dispatcher's shard choice). Its
table tests need no store, no gRPC and no event loop.

``UnitQueue`` tracks the units and composes the parts that each do one job: ``QueueHeaps``
(heaps.py: a unit's view, per-queue policy order), ``QuotaLedger`` (ledger.py: usage, quotas,
the room),
``Waits`` (waiting.py: backoff and the infeasible wait), ``QueueFigures`` (figures.py: the
per-queue counts and ``Queue.status``) and ``Rounds`` (here: which queue and unit next).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from fractions import Fraction

from placement.claims import CLAIM_PHASES
from placement.nodeinfo import GUARANTEED
from placement.quotas import DEFAULT_QUEUE
from placement.resources import Quantities
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.entries import (
    BackoffSettings,
    Claim,
    EncodedJobLookup,
    JobLookup,
    PendingRef,
    QueueLookup,
    UnitEntry,
    UnitState,
    is_pending,
)
from services.dispatcher.dispatching.figures import QueueFigures
from services.dispatcher.dispatching.heaps import QueueHeaps
from services.dispatcher.dispatching.ledger import QuotaLedger
from services.dispatcher.dispatching.queueing import (
    Fairness,
    PendingUnit,
    QueueLoad,
    RoundRobin,
    next_queue,
    turn_key,
)
from services.dispatcher.dispatching.waiting import Waits

# The records the queue tracks live in entries.py; its callers import them from here with it.
__all__ = [
    "MAX_HELD_PER_ROUND",
    "BackoffSettings",
    "Claim",
    "JobLookup",
    "PendingRef",
    "Place",
    "QueueLookup",
    "Rounds",
    "UnitEntry",
    "UnitQueue",
    "UnitState",
    "is_pending",
]

_new_tuple = tuple.__new__

# A queue stops for the round after this many of its units found no room (quota or shard
# credits), so a long queue of units too large for the shards left costs a bounded round.
MAX_HELD_PER_ROUND = 64

# What offering a unit came to: sent, held (quota, no shard, unknown job), or held because the
# cluster has no room for it while other queues wait behind it.
_SENT, _HELD, _NO_ROOM = 0, 1, 2

# Offered each unit the round picks, with its requests: True if it was sent (the callback then
# calls ``UnitQueue.dispatched``), False to hold it for the next round.
Place = Callable[[UnitEntry, PendingUnit], bool]


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


class Rounds:
    """The round: which queue's turn it is under the fairness policy, which of its units go and
    which are held (quota, room, a queue below its min owed the room), and what the mins of
    queues below them are owed. Works over the queue's parts."""

    def __init__(
        self,
        heaps: QueueHeaps,
        ledger: QuotaLedger,
        waits: Waits,
        figures: QueueFigures,
        by_queue: dict[str, dict[str, UnitEntry]],
        fairness: Fairness,
    ) -> None:
        self.fairness = fairness
        self._heaps = heaps
        self._ledger = ledger
        self._waits = waits
        self._figures = figures
        self._by_queue = by_queue
        self._view = heaps.view
        self._enqueue = heaps.enqueue
        # What queues below their min are owed, as the current round started (``owed``).
        self._round_owed: dict[str, Quantities] = {}
        # Whether the last round held a unit for room (only then is room freed since worth
        # waking backed-off units for).
        self._held_for_room = False

    def run(self, place: Place, has_room: Callable[[], bool]) -> None:
        """``UnitQueue.round`` once the due waits are queued."""
        fair = not self.fairness.work_conserving
        ledger = self._ledger
        if fair and ledger.room_freed and self._held_for_room:
            self.wake_for_freed_room()
        ledger.room_freed = self._held_for_room = False
        self._round_owed = self.owed()
        held: list[UnitEntry] = []  # popped but not sent: back in their queues after the round
        budget = self._heaps.budget(MAX_HELD_PER_ROUND)
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
            self._enqueue(entry)

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
        entry = self._heaps.pop(queue)
        if entry is None:
            del budget[queue]
            return True
        contended = fair and (len(budget) > 1 or self._figures.others_wait(queue))
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
        ledger = self._ledger
        load = QueueLoad(queue, ledger.used(queue), ledger.weight(queue))
        return turn_key(load, ledger.capacity(GUARANTEED), self.fairness)

    def wake_for_freed_room(self) -> None:
        """Room freed: the backed-off units of the queue with the smallest share try again now
        rather than when their backoff ends (as kube-scheduler moves unschedulable pods back on a
        pod's deletion), so the room goes by fairness, not to whoever happens to be ready. At
        most ``MAX_HELD_PER_ROUND`` of them; one that fails again backs off longer."""
        waiting = self._waits.queues_backed_off()
        if not waiting:
            return
        ledger = self._ledger
        loads = [QueueLoad(q, ledger.used(q), ledger.weight(q)) for q in waiting]
        queue = next_queue(loads, ledger.capacity(GUARANTEED), self.fairness)
        for entry in self._waits.wake_backed_off(queue, MAX_HELD_PER_ROUND):
            self._enqueue(entry)

    def _offer(self, entry: UnitEntry, place: Place, *, contended: bool) -> int:
        entry.waiting_for_room = False
        unit = self._view(entry)
        if unit is None:
            return _HELD
        entry.blocked = self._ledger.quota_excess(entry.queue, unit.requests)
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
        free = self._ledger.free(pool)
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
        ledger = self._ledger
        out: dict[str, Quantities] = {}
        for queue, members in sorted(self._by_queue.items()):
            floor = ledger.min(queue)
            if floor.is_zero():
                continue
            left = floor.beyond(ledger.used(queue))
            if left.is_zero():
                continue  # its min is met
            wanted = Quantities()
            for entry in members.values():
                if not entry.pods or entry.state == UnitState.DISPATCHED:
                    continue
                unit = self._view(entry)
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
        free = self._ledger.free(GUARANTEED)
        out: dict[str, Quantities] = {}
        for queue, owed in self.owed().items():
            need = owed.beyond(free)
            if not need.is_zero():
                out[queue] = need
            free = free.beyond(owed)
        return out


class UnitQueue:
    """Pending units per logical queue, in policy order, with per-queue usage for the quota.

    ``units`` holds every tracked unit whatever its state; only QUEUED units sit in a heap.
    The queue keeps the units and their states; what it answers about order, quota and room,
    waits and counts its parts answer, bound here under the names its callers use.
    """

    def __init__(
        self,
        jobs: JobLookup,
        queues: QueueLookup,
        backoff: BackoffSettings,
        fairness: Fairness | None = None,
        encoded_jobs: EncodedJobLookup | None = None,
    ) -> None:
        """``encoded_jobs``: the jobs' stored bytes, when ``jobs`` decodes them (the
        dispatcher's informer): a unit's view is then kept while its job's bytes are the
        same, without decoding it (``QueueHeaps.view``)."""
        self.jobs = jobs
        self.queues = queues
        self.backoff = backoff
        self.units: dict[str, UnitEntry] = {}
        # Jobs whose gang timed out (phase Timeout, from the feed): their units are held out of
        # the queue (TIMED_OUT) until the job is restarted.
        self.timed_out: set[str] = set()
        # The same units per queue, so questions about one queue cost its units, not all.
        self._by_queue: dict[str, dict[str, UnitEntry]] = {}
        self._seq = 0
        ledger = self._ledger = QuotaLedger(queues)
        figures = self._figures = QueueFigures(ledger)
        heaps = self._heaps = QueueHeaps(jobs, queues, self.units, figures.set_state, encoded_jobs)
        waits = self._waits = Waits(backoff, self.units, self._by_queue)
        rounds = self._rounds = Rounds(
            heaps,
            ledger,
            waits,
            figures,
            self._by_queue,
            fairness or RoundRobin(),
        )
        self._backed_off = waits.backed_off
        # The parts' answers under the queue's names: bound methods, not wrappers, so the hot
        # paths (a round per unit, an informer event per pod) pay no extra call.
        self._set_state = figures.set_state
        self._others_wait = figures.others_wait
        self.pending_pods = figures.pending_pods
        self.statuses = figures.statuses
        self.view = heaps.view
        self._enqueue = heaps.enqueue
        self.policy = heaps.policy
        self.pop = heaps.pop
        self.queued = heaps.queued
        self.position = heaps.position
        self.holds_claim = ledger.holds_claim
        self.claim_of = ledger.claim_of
        self.claim = ledger.claim  # a pod holding a claim (``add_pod`` does it too)
        self.claim_listed = ledger.claim_listed
        self.sum_listed = ledger.sum_listed
        self.claimed_pods = ledger.claimed_pods
        self.claims_by_pod = ledger.claims_by_pod
        self.claims_on = ledger.claims_on
        self.nodes_with_claims = ledger.nodes_with_claims
        self.restate_claim = ledger.restate
        self.claims = ledger.claims
        self.bound_claimed = ledger.bound_claimed
        self.bound_claims = ledger.bound_claims
        self.quota = ledger.quota
        self.ancestors = ledger.ancestors
        self.quota_excess = ledger.quota_excess
        self.min = ledger.min
        self.weight = ledger.weight
        self.bound_usage = ledger.bound_usage
        self.used = ledger.used
        self.set_node = ledger.set_node
        self.capacity = ledger.capacity
        self.free = ledger.free
        self.next_wake = waits.next_wake
        self.owed = rounds.owed
        self.reclaim_needs = rounds.reclaim_needs
        self._wake_for_freed_room = rounds.wake_for_freed_room

    def enqueue(self, entry: UnitEntry) -> None:
        """Mark the unit QUEUED and put it in its queue's heap (once); a timed-out gang's unit
        is held instead (TIMED_OUT). Every way back into the queue comes here."""
        if entry.job in self.timed_out:
            self._set_state(entry, UnitState.TIMED_OUT)
            return
        self._enqueue(entry)

    def set_timed_out(self, job: str, timed_out: bool) -> UnitEntry | None:
        """The job's gang timed out (or was restarted): hold its unit out of the queue (or
        queue it again, its attempts counted afresh). Returns the unit when it is at a shard
        (timing out): the caller takes it back from there."""
        if timed_out == (job in self.timed_out):
            return None
        entry = self.units.get(job)
        if not timed_out:
            self.timed_out.discard(job)
            if entry is not None and entry.state == UnitState.TIMED_OUT:
                entry.attempts = 0
                self.enqueue(entry)
            return None
        self.timed_out.add(job)
        if entry is None:
            return None
        if entry.state == UnitState.DISPATCHED:
            return entry
        if entry.state != UnitState.SETTLING:  # a settling unit is held when it queues again
            self._set_state(entry, UnitState.TIMED_OUT)
        return None

    @property
    def fairness(self) -> Fairness:
        """The policy between queues (round-robin unless set)."""
        return self._rounds.fairness

    @fairness.setter
    def fairness(self, fairness: Fairness) -> None:
        self._rounds.fairness = fairness

    # -----------------------------------------------------------------------------------------
    # Pods coming and going
    # -----------------------------------------------------------------------------------------

    def add_pod(self, pod: pb.Pod, now_ms: int) -> bool:
        """Count a pod: its claim towards its queue's usage, and if pending, into its job's
        unit. True when a unit joined its queue's heap (a round may send it)."""
        # Each field read once (``holds_claim``, ``is_pending``): every pod created comes here.
        spec, status = pod.spec, pod.status
        phase = status.phase
        if spec.node_name:
            if phase in CLAIM_PHASES:
                self._ledger.claim(Claim.of(pod))
            return False  # not pending: a pod on a node is bound, or was
        if phase != pb.POD_PENDING:
            return False
        meta = pod.metadata
        name, job = meta.name, spec.job
        entry = self.units.get(job)
        if entry is None:
            self._seq += 1
            entry = UnitEntry(job, spec.queue or DEFAULT_QUEUE, self._seq, now_ms)
            self.units[job] = entry
            self._by_queue.setdefault(entry.queue, {})[job] = entry
        if name not in entry.pods:
            self._figures.pod_joined(entry)
        # tuple.__new__ straight: the NamedTuple's __new__ binds its arguments in Python.
        entry.pods[name] = _new_tuple(PendingRef, (meta.uid, meta.resource_version, spec.index))
        if entry.state == UnitState.QUEUED and not entry.in_heap:
            self.enqueue(entry)
            return True
        return False

    def remove_pod(self, pod: pb.Pod) -> bool:
        """Undo ``add_pod`` (the unit itself stays until ``drop_if_empty``, so an update —
        remove then add — keeps its state). True if the pod held a claim."""
        name = pod.metadata.name
        claim = self._ledger.release(name)
        entry = self.units.get(pod.spec.job)
        if entry is not None and entry.pods.pop(name, None) is not None:
            self._figures.pod_left(entry)
        return claim is not None

    def take_pending(self, pod: str, job: str) -> UnitEntry | None:
        """A pending pod of ``job``'s unit left it (bound: ``remove_pod`` of a pod known to
        hold no claim). Returns the unit, which stays until ``drop_if_empty``."""
        entry = self.units.get(job)
        if entry is not None and entry.pods.pop(pod, None) is not None:
            self._figures.pod_left(entry)
        return entry

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

    def _untrack(self, entry: UnitEntry) -> None:
        self._figures.untracked(entry)
        del self.units[entry.job]
        members = self._by_queue[entry.queue]
        del members[entry.job]
        if not members:
            del self._by_queue[entry.queue]

    # -----------------------------------------------------------------------------------------
    # Ordering
    # -----------------------------------------------------------------------------------------

    def queue_changed(self, queue: str) -> None:
        """A queue was created or changed: re-key its heap if its sort policy differs (a pass
        over its queued units; its status written, every second while it has work, changes
        nothing of their order)."""
        self._ledger.limits_changed()
        if not self._heaps.policy_changed(queue):
            return
        for entry in self._heaps.clear(queue):
            self.enqueue(entry)

    # -----------------------------------------------------------------------------------------
    # Attempts: sent, ended, waiting
    # -----------------------------------------------------------------------------------------

    def dispatched(self, entry: UnitEntry, shard: str, unit: PendingUnit) -> None:
        """The unit went to ``shard``: its requests count against the quota until it ends."""
        self._set_state(entry, UnitState.DISPATCHED)
        entry.shard = shard
        self._ledger.reserve(entry, unit)

    def release(self, entry: UnitEntry) -> None:
        """The dispatched attempt ended (or its shard is gone): return the reserved quota."""
        self._ledger.unreserve(entry)
        entry.shard = ""

    def back_off(self, entry: UnitEntry, now: float) -> float:
        """The unit did not fit: wait, doubling from ``initial_seconds`` per attempt, capped.
        Returns the delay."""
        self._set_state(entry, UnitState.BACKOFF)
        return self._waits.back_off(entry, now)

    def park_infeasible(self, entry: UnitEntry, now: float) -> None:
        """The unit can never fit as specified: out of the queue until the cluster changes
        (``wake_infeasible``), and rechecked after a while anyway (as kube-scheduler flushes its
        unschedulable pods): the change may have reached us before the shard that judged it."""
        self._set_state(entry, UnitState.INFEASIBLE)
        self._waits.park(entry, now)

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
        for entry in self._waits.due(now):
            self.enqueue(entry)

    # -----------------------------------------------------------------------------------------
    # The round
    # -----------------------------------------------------------------------------------------

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
        self._rounds.run(place, has_room)
