"""What each queue holds and may hold (``QuotaLedger``): per queue the requests of its bound pods
holding a claim and of its dispatched units, its max (``spec.quota``, also its parents'), its
min and weight, and the cluster's free room per pool (a ``placement.room.PoolRoom``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, KeysView, Mapping
from operator import itemgetter

from placement.nodeinfo import GUARANTEED, POOLS
from placement.quotas import ancestors, excess_under, held_below, lineage, maxima, quota_of
from placement.resources import Quantities
from placement.room import PoolRoom, RoomClaim
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.entries import Claim, QueueLookup, UnitEntry, shared_int
from services.dispatcher.dispatching.queueing import PendingUnit

_new_tuple = tuple.__new__

# A claim's node and job, read by C (``QuotaLedger.sum_listed``).
_CLAIM_NODE = itemgetter(Claim._fields.index("node"))
_CLAIM_JOB = itemgetter(Claim._fields.index("job"))


class QuotaLedger:
    """Per-queue usage against the queues' quotas, and the room left in the cluster."""

    def __init__(self, queues: QueueLookup) -> None:
        self.queues = queues
        # Per queue: requests of bound pods holding a claim (``usage``), and of dispatched
        # units (held until their attempt ends).
        self.usage: dict[str, Quantities] = {}
        self._inflight: dict[str, Quantities] = {}
        # The cluster's room per pool (placement.room): what the nodes (ready, schedulable)
        # offer, minus the claims (its ``Claim`` per pod holding one, also what quota and
        # reclaim read: one record per bound pod, and removals are exact) and the dispatched
        # units' requests. Totals only: the queue judges the cluster as a whole (the shards
        # judge the nodes), so no sum per node.
        self._room: PoolRoom[Claim] = PoolRoom()
        # Per pool, what the dispatched units hold in the room's claimed sum (not a pod's).
        self._held = {pool: Quantities() for pool in POOLS}
        # A listing's claims not counted per node nor summed yet (``claim_listed``).
        self._listed: list[Claim] = []
        # Per node, how many pods hold a claim on it (node lifecycle: the nodes to look at).
        self._on_node: dict[str, int] = {}
        # Per queue, the maxima over its lineage (``placement.quotas.maxima``), until a Queue
        # changes.
        self._limits: dict[str, list[tuple[str, pb.Resources]]] = {}
        # A claim was released since the last round (room freed).
        self.room_freed = False

    # -----------------------------------------------------------------------------------------
    # Claims and dispatched units
    # -----------------------------------------------------------------------------------------

    def claim(self, claim: Claim) -> None:
        """A pod holds a claim: it takes room and counts towards its queue's usage."""
        self._room.claim(claim.name, claim)
        node = claim.node
        self._on_node[node] = self._on_node.get(node, 0) + 1
        usage = self.usage.get(claim.queue)
        if usage is None:  # not setdefault: a Quantities made per claim, kept for none
            usage = self.usage[claim.queue] = Quantities()
        usage.add(claim.requests)

    def claim_listed(self, claim: Claim) -> None:
        """``claim`` of a pod a listing hands over (a job's pods' claims sharing its queue,
        pool and requests: ``JobShare``), counted per node and its requests summed per job
        once the listing is (``sum_listed``): two vector sums and two counts a pod less at a
        restart."""
        self._room.claim_summed_later(claim.name, claim)
        self._listed.append(claim)

    def sum_listed(self) -> Counter[str]:
        """Count the listed claims (``claim_listed``) per node and add their requests to the
        sums, a job's at once, by passes in C over them; returns how many each job has."""
        listed, self._listed = self._listed, []
        on_node = self._on_node
        for node, count in Counter(map(_CLAIM_NODE, listed)).items():
            on_node[node] = on_node.get(node, 0) + count
        per_job = Counter(map(_CLAIM_JOB, listed))
        one_of = dict(zip(map(_CLAIM_JOB, listed), listed, strict=True))  # a claim per job
        for job, count in per_job.items():
            claim = one_of[job]
            self._room.add_claimed(claim.pool, claim.requests, count)
            usage = self.usage.get(claim.queue)
            if usage is None:
                usage = self.usage[claim.queue] = Quantities()
            usage.add(claim.requests, count)
        return per_job

    def release(self, pod: str) -> Claim | None:
        """The pod's claim (if it held one) is gone: its room is free again."""
        claim = self._room.release(pod)
        if claim is not None:
            self.usage[claim.queue].add(claim.requests, -1)
            left = self._on_node[claim.node] - 1
            if left:
                self._on_node[claim.node] = left
            else:
                del self._on_node[claim.node]
            self.room_freed = True
        return claim

    def restate(self, pod: pb.Pod) -> bool:
        """A pod holding a claim changed its status and still holds it on the same node (bound
        -> running, a deletion mark): its claim takes what ``Claim.of`` reads that may change
        (start, priority, deleting, phase) and keeps its queue, pool and requests, which a bound pod
        never changes (as ``NodeRoom.on_pod`` counts it). False if it held none (nothing done).
        ``room_freed`` is set as the release and claim it replaces set it."""
        old = self._room.claim_of(pod.metadata.name)
        if old is None:
            return False
        status = pod.status
        name, queue, pool, requests, _, _, _, node, job, pod_index, _, owner = old
        # tuple.__new__ straight, as ``Claim.from_parts`` makes them: ``_replace`` is a Python
        # function taking keywords (a third of a bound pod's start as the dispatcher sees it).
        new = _new_tuple(
            Claim,
            (
                name,
                queue,
                pool,
                requests,
                shared_int(pod.spec.priority),
                status.started_ms,
                bool(pod.metadata.deletion_timestamp_ms),
                node,
                job,
                pod_index,
                status.phase,
                owner,
            ),
        )
        # Its pool, requests and node are the old claim's: the room's sums stay as they are.
        self._room.restate(name, new)
        self.room_freed = True
        return True

    def bound_claimed(self, pool: str) -> Quantities:
        """What the pods holding a claim take of ``pool`` in all (dispatched units' holds
        left out; a new instance)."""
        claimed = self._room.claimed(pool).copy()
        claimed.add(self._held[pool], -1)
        return claimed

    def bound_claims(self) -> Iterator[tuple[str, RoomClaim]]:
        """Every pod holding a claim, with its claim as a node's room counts it."""
        for claim in self._room.claims():
            yield claim.name, RoomClaim(claim.node, claim.pool, claim.requests)

    def holds_claim(self, pod: str) -> bool:
        return self._room.holds(pod)

    def claim_of(self, pod: str) -> Claim | None:
        """The pod's claim, if it holds one."""
        return self._room.claim_of(pod)

    def claims_by_pod(self) -> Mapping[str, Claim]:
        """Each claim by its pod's name (a live view, never to change)."""
        return self._room.by_pod()

    def claimed_pods(self) -> KeysView[str]:
        """The names of the pods holding a claim (a live view)."""
        return self._room.pods()

    def claims_on(self, nodes: Collection[str]) -> list[Claim]:
        """The claims on ``nodes``: a scan of every claim (no index of names per node is
        kept: at 1,000,000 bound pods it was 37 bytes a pod, for a node's loss or drain)."""
        return [claim for claim in self._room.claims() if claim.node in nodes]

    def nodes_with_claims(self) -> KeysView[str]:
        """The nodes some pod holds a claim on."""
        return self._on_node.keys()

    def claims(self) -> list[Claim]:
        """Every bound or running pod with the queue it counts for."""
        return list(self._room.claims())

    def reserve(self, entry: UnitEntry, unit: PendingUnit) -> None:
        """The unit was dispatched: its requests count against quota and room until it ends."""
        entry.reserved = unit.requests
        entry.reserved_pool = unit.pool
        inflight = self._inflight.get(entry.queue)
        if inflight is None:  # not setdefault: a Quantities made per unit, kept for none
            inflight = self._inflight[entry.queue] = Quantities()
        inflight.add(unit.requests)
        self._room.hold(unit.pool, unit.requests)
        self._held[unit.pool].add(unit.requests)

    def unreserve(self, entry: UnitEntry) -> None:
        """The dispatched attempt ended: return what ``reserve`` held."""
        if entry.reserved is not None:
            self._inflight[entry.queue].add(entry.reserved, -1)
            self._room.hold(entry.reserved_pool, entry.reserved, -1)
            self._held[entry.reserved_pool].add(entry.reserved, -1)
            entry.reserved = None

    # -----------------------------------------------------------------------------------------
    # The queues' limits
    # -----------------------------------------------------------------------------------------

    def quota(self, queue: str) -> pb.Resources | None:
        """The queue's max (``spec.quota``), None when it has none."""
        return quota_of(self.queues(queue))

    def limits_changed(self) -> None:
        """A Queue changed (its max, its parent, or it came or went): the maxima kept per queue
        (``quota_excess``) are read again."""
        self._limits.clear()

    def ancestors(self, queue: str) -> list[str]:
        """The queue's parents, nearest first."""
        return ancestors(queue, self.queues)

    def quota_excess(self, queue: str, request: Quantities) -> str:
        """The resource a unit of ``request`` would take past the queue's max, or past the max
        of a parent queue (each counting every queue below it; ``placement.quotas``); "" if it
        fits."""
        # ``placement.quotas.hierarchy_excess``, the maxima over the queue's lineage kept per
        # queue until a Queue changes (``limits_changed``): asked per unit offered, and most
        # queues and their parents have none. The holders are gathered only for a max to
        # judge against.
        limits = self._limits.get(queue)
        if limits is None:
            limits = self._limits[queue] = maxima(lineage(queue, self.queues), self.queues)
        if not limits:
            return ""
        found = excess_under(
            limits,
            request,
            lambda judged: held_below(
                judged, self.queues, self.used, self.usage.keys() | self._inflight.keys()
            ),
        )
        if found is None:
            return ""
        resource = found.excess.resource
        return resource if found.queue == queue else f"{resource} of parent queue {found.queue}"

    def min(self, queue: str) -> Quantities:
        """The queue's min: capacity always available to it (nothing when unset)."""
        obj = self.queues(queue)
        if obj is not None and obj.spec.HasField("min"):
            return Quantities.of(obj.spec.min)
        return Quantities()

    def weight(self, queue: str) -> int:
        obj = self.queues(queue)
        return max(1, obj.spec.weight) if obj is not None else 1

    # -----------------------------------------------------------------------------------------
    # What queues hold, and the room left
    # -----------------------------------------------------------------------------------------

    def bound_usage(self, queue: str) -> Quantities:
        """What the queue's bound and running pods hold (not its dispatched units)."""
        return self.usage.get(queue, Quantities())

    def used(self, queue: str) -> Quantities:
        """What the queue holds: its bound pods' requests plus its dispatched units'."""
        used = Quantities()
        used.add(self.usage.get(queue, Quantities()))
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
