"""The messages that carry units to a shard, encoded a slice of pods at a time.

A unit travels whole, in one ``DispatchMessage`` (a shard judges a gang on all its pods). Built
as one protobuf message and serialized by gRPC, a 100,000-pod unit held the dispatcher's event
loop for most of a second in one piece (each ``PodRef`` added to the message, then the 6 MB
serialization): the shard streams, heartbeats and every RPC waited. So the shard's writer
(``UnitDispatcher._write``) encodes each message here, to wire bytes: a unit's fields and then
its pods ``ENCODE_SLICE_PODS`` at a time, each slice a small ``Unit`` message of pods serialized
on its own, handing the loop to others between slices. Protobuf's wire format makes the pieces
one message: serialized messages of one type concatenated parse as their merge (a repeated
field's entries append), and a nested message is its field's tag, its length and its bytes.
The shard receives exactly the ``DispatchMessage`` it always did.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from typing import NamedTuple

from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.entries import PendingRef

# Pods encoded between two turns of the event loop: some milliseconds on a busy machine (a
# PodRef added and serialized costs ~6 us with two cores shared by many processes).
ENCODE_SLICE_PODS = 2_000

_MESSAGE_UNITS = ipb.DispatchMessage.DESCRIPTOR.fields_by_name["units"].number
_BATCH_UNITS = ipb.UnitBatch.DESCRIPTOR.fields_by_name["units"].number
_UNIT_JOB = ipb.Unit.DESCRIPTOR.fields_by_name["job"].number
_LENGTH_DELIMITED = 2


class OutgoingUnit(NamedTuple):
    """A unit taken by a shard in a round, before it is encoded into the shard's message."""

    # The job, or its stored bytes (the informer's, resource version included): laid into
    # the message as they are, not decoded, copied and encoded again.
    job: pb.Job | bytes
    pods: list[tuple[str, PendingRef]]  # in any order: encoded by index
    already_bound: int
    enqueued_ms: int


def encoded_messages(
    units: Sequence[OutgoingUnit], max_batch_pods: int, slice_pods: int = ENCODE_SLICE_PODS
) -> Iterator[bytes | None]:
    """The wire bytes of the ``DispatchMessage`` s that carry ``units``, in order: many units
    per message, split so no message carries more than ``max_batch_pods`` pods (a larger unit
    travels alone: units never split); each unit's pods by index. Yields None after every
    ``slice_pods`` pods encoded: the caller's moment to let the loop run others."""
    batch: list[bytes] = []  # the encoded units of the message being filled
    pods = encoded = 0
    for out in units:
        if batch and pods and pods + len(out.pods) > max_batch_pods:
            yield _dispatch_message(batch)
            batch, pods = [], 0
        head = ipb.Unit(already_bound=out.already_bound, enqueued_ms=out.enqueued_ms)
        if len(out.pods) == 1:
            # A one-pod unit (most units of online traffic): its pod in the head, one message
            # serialized, no slices to lay out or to turn the loop between.
            name, ref = out.pods[0]
            head.pods.add(
                name=name, uid=ref.uid, resource_version=ref.resource_version, index=ref.pod_index
            )
            if isinstance(out.job, bytes):
                batch.append(_field(_UNIT_JOB, out.job) + head.SerializeToString())
            else:
                head.job.CopyFrom(out.job)
                batch.append(head.SerializeToString())
            pods += 1
            encoded += 1
            if encoded >= slice_pods:
                encoded = 0
                yield None
            continue
        if isinstance(out.job, bytes):
            parts = [_field(_UNIT_JOB, out.job), head.SerializeToString()]
        else:
            head.job.CopyFrom(out.job)
            parts = [head.SerializeToString()]
        ordered = yield from _in_index_order(out.pods, slice_pods)
        for first in range(0, len(ordered), slice_pods):
            piece = ipb.Unit()
            for name, ref in ordered[first : first + slice_pods]:
                piece.pods.add(
                    name=name,
                    uid=ref.uid,
                    resource_version=ref.resource_version,
                    index=ref.pod_index,
                )
            parts.append(piece.SerializeToString())
            encoded += len(piece.pods)
            if encoded >= slice_pods:
                encoded = 0
                yield None
        batch.append(b"".join(parts))
        pods += len(out.pods)
    if batch:
        yield _dispatch_message(batch)


def unit_messages(units: Sequence[OutgoingUnit], max_batch_pods: int) -> list[ipb.DispatchMessage]:
    """:func:`encoded_messages` decoded, all at once (for a reader of the messages)."""
    return [
        ipb.DispatchMessage.FromString(wire)
        for wire in encoded_messages(units, max_batch_pods)
        if wire is not None
    ]


def to_wire(message: ipb.DispatchMessage | bytes) -> bytes:
    """The Dispatch stream's request serializer: a message, or bytes encoded here already."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def _index(item: tuple[str, PendingRef]) -> int:
    return item[1].pod_index


# An index range this many times a unit's pod count is too sparse to lay out slot by slot.
_SPARSE_INDEXES = 4


def _in_index_order(
    pods: list[tuple[str, PendingRef]], slice_pods: int
) -> Generator[None, None, list[tuple[str, PendingRef]]]:
    """``pods`` by index. Sorted in one piece, 100,000 pods in no order held the loop ~46 ms;
    so a big unit's pods are laid into slots by index ``slice_pods`` at a time, yielding None
    between slices (the caller's moment to let the loop run others). Indexes that repeat, are
    negative or spread far beyond the pod count (none happens to a job's pending pods) are
    sorted."""
    if len(pods) <= slice_pods:
        return sorted(pods, key=_index)
    top = max(ref.pod_index for _, ref in pods)
    if top >= _SPARSE_INDEXES * len(pods) or min(ref.pod_index for _, ref in pods) < 0:
        return sorted(pods, key=_index)
    slots: list[tuple[str, PendingRef] | None] = [None] * (top + 1)
    for first in range(0, len(pods), slice_pods):
        for item in pods[first : first + slice_pods]:
            index = item[1].pod_index
            if slots[index] is not None:
                return sorted(pods, key=_index)
            slots[index] = item
        yield None
    return [item for item in slots if item is not None]


def _dispatch_message(units: list[bytes]) -> bytes:
    batch = b"".join(_field(_BATCH_UNITS, unit) for unit in units)
    return _field(_MESSAGE_UNITS, batch)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a nested message) on the wire: tag, length, bytes."""
    return _varint(number << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
