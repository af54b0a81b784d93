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
    # The last ``UnitQueue.view`` of it and the version of the Job it was made from: good while
    # the job is at that version and the pod count is the same. A unit is viewed when queued
    # and again when offered; building one is most of the round's cost per unit.
    view: tuple[int, PendingUnit] | None = None


_new_tuple = tuple.__new__


class Claim(NamedTuple):
    """A bound or running pod as its queue's usage counts it: what quota and reclaim's order
    need, not the pod (held per bound pod, a decoded pod was 2.6 KiB of it; reclaim reads the
    few it weighs from the informer). ``requests`` is shared by pods asking the same and never
    mutated. A tuple: one is made per bind and per start, and a frozen dataclass cost twice as
    much to make (as ``placement.room.RoomClaim``)."""

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

    @classmethod
    def of(cls, pod: pb.Pod) -> Claim:
        # Each submessage read once: every bound pod comes through here when the dispatcher
        # (re)starts.
        meta = pod.metadata
        spec = pod.spec
        # tuple.__new__ straight: the NamedTuple's own __new__ is a Python function binding
        # eight arguments (a third of making one).
        return _new_tuple(
            cls,
            (
                # Interned: the pod's name is kept by three of the dispatcher's indexes (the claims,
                # the dispatch feed's bound pods, the pod index), one string for all of them.
                sys.intern(meta.name),
                sys.intern(queue_of(pod)),
                pool_of(spec.qos),
                Quantities.shared_request(spec.template),
                spec.priority,
                pod.status.started_ms,
                bool(meta.deletion_timestamp_ms),
                sys.intern(spec.node_name),
            ),
        )


def is_pending(pod: pb.Pod) -> bool:
    return pod.status.phase == pb.POD_PENDING and not pod.spec.node_name


JobLookup = Callable[[str], pb.Job | None]
QueueLookup = Callable[[str], pb.Queue | None]
