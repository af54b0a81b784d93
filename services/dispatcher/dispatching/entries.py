"""What the dispatcher's unit queue tracks: a unit (``UnitEntry``, one per job with pending pods,
and its ``UnitState``), what it sends of each pending pod (``PendingRef``), a bound pod's claim
as its queue's usage counts it (``Claim``), and the backoff settings. Plain records; the queue
(``unitqueue.UnitQueue``) and its parts change them."""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from placement.nodeinfo import GUARANTEED, pool_of
from placement.quotas import queue_of
from placement.resources import Quantities
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.queueing import PendingUnit


class UnitState(enum.Enum):
    QUEUED = "queued"
    BACKOFF = "backoff"
    DISPATCHED = "dispatched"
    # The attempt ended; waiting for the informer to catch up before queueing again.
    SETTLING = "settling"
    # Can never fit as specified: out of the queue until the cluster changes.
    INFEASIBLE = "infeasible"
    # A gang whose schedule timeout passed (its job is Timeout): out of the queue until the
    # job is restarted.
    TIMED_OUT = "timed_out"


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
    # What its job's pods share, read off the first of them bound (``ViewFeed``): its other
    # pods' claims take it, not a read of each.
    share: JobShare | None = None
    # The last ``UnitQueue.view`` of it and the version of the Job it was made from (its
    # stored bytes, when the queue reads jobs encoded: ``EncodedJobLookup``): good while the
    # job is the same and so is the pod count. A unit is viewed when queued and again when
    # offered; building one is most of the round's cost per unit.
    view: tuple[int | bytes, PendingUnit] | None = None


_new_tuple = tuple.__new__

# One int object per value among those records keep by the hundred thousand and few values
# cover (pods' indexes and priorities): an int past 256 is an object of its own (28 bytes)
# each time protobuf reads it.
_shared_ints: dict[int, int] = {}
_share = _shared_ints.setdefault  # _share(n, n) is n, the one kept


def shared_int(n: int) -> int:
    """``n``, the one object kept for its value (see ``_shared_ints``)."""
    return _share(n, n)


class JobShare(NamedTuple):
    """What a claim takes from its pod that every pod of its job has alike (its job's
    template made them: ``controllers.pods.pods_for``; a replacement copies its pod's spec,
    and a stored job's template never changes): its queue, pool, requests and owner, each
    interned or shared."""

    job: str
    queue: str
    pool: str
    requests: Quantities
    owner: str

    @classmethod
    def of(cls, pod: pb.Pod) -> JobShare:
        spec = pod.spec
        return cls(
            sys.intern(spec.job),
            sys.intern(queue_of(pod)),
            pool_of(spec.qos),
            Quantities.shared_request(spec.template),
            sys.intern(pod.metadata.owner),
        )


class Claim(NamedTuple):
    """A bound or running pod as the dispatcher keeps it: what quota and reclaim's order need,
    and what the job status, node lifecycle and admission read of it (its job, index, phase,
    owner) — not the pod: the dispatcher's informer keeps no bytes of a pod holding a claim
    (``services.dispatcher.controllers.podindex``), this record is all that is held of it
    (a decoded pod was 2.6 KiB, its bytes ~0.3; readers of its full body read the store).
    ``requests`` is shared by pods asking the same and never mutated. A tuple: one is made per
    bind and per start, and a frozen dataclass cost twice as much to make (as
    ``placement.room.RoomClaim``)."""

    name: str
    queue: str
    pool: str
    requests: Quantities
    priority: int = 0
    started_ms: int = 0
    deleting: bool = False
    # The node it is bound to (interned): the node partitions' room is built from these claims
    # when partitions first come into being (``partitions.PartitionRoom``).
    node: str = ""
    job: str = ""
    pod_index: int = 0  # its index in the job ("index" is a tuple's method)
    phase: pb.PodPhase.ValueType = pb.POD_BOUND
    owner: str = ""  # the tenant (``metadata.owner``; "" for the admin's)

    @classmethod
    def of(cls, pod: pb.Pod, per_job: dict[str, JobShare] | None = None) -> Claim:
        """The claim of ``pod`` (holding one). ``per_job``: what the pods of a job share, by
        job, filled as they come (a listing's: ``ViewFeed``), so each job's is read once."""
        spec, status = pod.spec, pod.status
        return cls.from_parts(
            pod, pod.metadata, spec, status, spec.node_name, status.phase, per_job
        )

    @classmethod
    def from_parts(
        cls,
        pod: pb.Pod,
        meta: pb.ObjectMeta,
        spec: pb.PodSpec,
        status: pb.PodStatus,
        node: str,
        phase: pb.PodPhase.ValueType,
        per_job: dict[str, JobShare] | None = None,
    ) -> Claim:
        """``of``, from the pod's metadata, spec and status, its node and its phase, which its
        caller has read already (a submessage read is ~0.2 µs, a field ~0.1: a listing's every
        bound pod comes through here)."""
        shared = per_job.get(spec.job) if per_job is not None else None
        if shared is None:
            shared = JobShare.of(pod)
            if per_job is not None:
                per_job[shared.job] = shared
        return cls.of_share(meta, spec, status, node, phase, shared)

    @classmethod
    def of_share(
        cls,
        meta: pb.ObjectMeta,
        spec: pb.PodSpec,
        status: pb.PodStatus,
        node: str,
        phase: pb.PodPhase.ValueType,
        shared: JobShare,
    ) -> Claim:
        """``from_parts`` with what its job's pods share read already (``shared``)."""
        priority, index = spec.priority, spec.index
        # tuple.__new__ straight: the NamedTuple's own __new__ is a Python function binding
        # its arguments (a third of making one).
        return _new_tuple(
            cls,
            (
                # Its name is shared with the pod index (``PodIndex`` takes it from here), not
                # interned (the interpreter's table of interned strings took ~40 bytes a
                # pod); its job's, queue's, node's and owner's are interned: one string each
                # for all their pods; so are its priority and index (``shared_int``).
                meta.name,
                shared.queue,
                shared.pool,
                shared.requests,
                _share(priority, priority),
                status.started_ms,
                bool(meta.deletion_timestamp_ms),
                sys.intern(node),
                shared.job,
                _share(index, index),
                phase,
                shared.owner,
            ),
        )

    def outline(self) -> pb.Pod:
        """The pod as far as this record knows it: name, owner, job, index, node, priority,
        phase and start (what the dispatcher's handlers read of a pod before its change). Never
        to be written: its other fields are empty. Made per update of a bound pod (~3 µs, where
        decoding its bytes was ~1): what is unset is not set."""
        pod = pb.Pod()
        meta = pod.metadata
        meta.name = self.name
        if self.owner:
            meta.owner = self.owner
        spec = pod.spec
        spec.job = self.job
        if self.pod_index:
            spec.index = self.pod_index
        spec.node_name = self.node
        if self.priority:
            spec.priority = self.priority
        status = pod.status
        status.phase = self.phase
        if self.started_ms:
            status.started_ms = self.started_ms
        return pod


def is_pending(pod: pb.Pod) -> bool:
    return pod.status.phase == pb.POD_PENDING and not pod.spec.node_name


JobLookup = Callable[[str], pb.Job | None]
# A job's bytes as its holder keeps them encoded (the informer's ``encoded``); None: unknown.
EncodedJobLookup = Callable[[str], bytes | None]
QueueLookup = Callable[[str], pb.Queue | None]
