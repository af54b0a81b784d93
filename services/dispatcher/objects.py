"""What the dispatcher's three roles (api, dispatching, controllers) read alike off stored
objects: their metadata, typed (``metadata_of``), a node's shape, and a job's
two marks — its pods not all stored yet (``godel.io/pods-created``) and its deletion begun."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from protos.godel.v1 import objects_pb2 as pb

# Every stored kind (store.kinds.KINDS), each with its ``metadata``; the most numerous first
# (isinstance tries them in order).
STORED_MESSAGES = (
    pb.Pod,
    pb.Job,
    pb.Node,
    pb.Queue,
    pb.DisruptionBudget,
    pb.Movement,
    pb.SchedulerInstance,
    pb.Event,
    pb.PriorityClass,
    pb.Reservation,
)


def metadata_of(obj: Message) -> pb.ObjectMeta:
    """A stored object's metadata, typed: the informer and the store hand objects over as the
    bare ``Message``, whose fields the type checker cannot see."""
    if not isinstance(obj, STORED_MESSAGES):
        raise TypeError(f"{obj.DESCRIPTOR.full_name} is not a stored kind")
    return obj.metadata


@dataclass(frozen=True, slots=True)
class NodeShape:
    """One distinct node capacity in a pool: (milli-CPU, memory bytes, GPUs)."""

    cpu: int
    mem: int
    gpus: int


# Present on a job whose pods are not all stored yet: how many are (indexes 0..n-1). A job too big
# for one store script is created a chunk at a time (services/dispatcher/controllers/creation.py); until the
# last chunk clears this mark, its unit is not dispatched (a gang must never be judged on part of
# its pods). Absent on every job created whole, and on every job stored before it existed.
PODS_CREATED_ANNOTATION = "godel.io/pods-created"


def pods_complete(job: pb.Job) -> bool:
    """Whether every pod of the job is stored (its unit may be dispatched)."""
    return PODS_CREATED_ANNOTATION not in job.metadata.annotations


def being_deleted(job: pb.Job) -> bool:
    """Whether the job's deletion has begun (``deletion.JobDeleter``, in chunks): its pods are
    going, and nothing new is made for it (no dispatch, no bind, no replacement, no status)."""
    return job.metadata.deletion_timestamp_ms != 0


def pods_created(job: pb.Job) -> int:
    """How many of the job's pods (from index 0) are stored: all of them without the mark; an
    unreadable mark counts as none (creation resumes from the start, AlreadyExists-safe)."""
    mark = job.metadata.annotations.get(PODS_CREATED_ANNOTATION)
    if mark is None:
        return job.spec.replicas
    return int(mark) if mark.isdigit() else 0
