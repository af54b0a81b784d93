"""Reservations at Apply: their checks (pure, the node looked up by the caller) and what is
stored of an applied one. A reservation is refused whole, naming the field, when it is larger
than its node, its TTL is not positive, its owner does not parse or its node does not exist;
nothing is stored then. Its spec is fixed once stored, but for its TTL (apply a longer one to
keep it longer); what it holds and for whom are ``placement.reservations``'. A new one must
also fit beside what its node holds now (``validate_room``, on the dispatcher's view: an early,
clear refusal; the Binder's commit of it is the authoritative check)."""

from __future__ import annotations

from collections.abc import Iterable

from placement.claims import holds_claim
from placement.nodeinfo import (
    POOL_NAMES,
    PORTS_IN_USE,
    NodeInfo,
    PodRequest,
    pool_capacity,
    pool_of,
    port_conflict,
    resource_fit_failures,
)
from placement.reservations import OwnerError, hold_request, parse_owner
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.api import validation as v

_QOS_VALUES = frozenset(pb.QoS.values())
# What an applied reservation may change of a stored one.
MUTABLE_SPEC = frozenset({"ttl_seconds"})
# The requests compared with the node's pool, and how each is named to the user.
_SIZED = (("milli_cpu", "cpu", "m"), ("memory_bytes", "memory", " bytes"), ("gpus", "gpus", ""))


def validate(r: pb.Reservation, prefix: str) -> v.Violations:
    """What needs no lookup: its name, labels, TTL, owner, requests and template."""
    out = v.validate_label_name(r.metadata.name, f"{prefix}.metadata.name")
    out += v.validate_labels(r.metadata.labels, f"{prefix}.metadata.labels")
    s = r.spec
    if s.ttl_seconds < 1:
        out.append(
            v.violation(f"{prefix}.spec.ttl_seconds", f"must be at least 1 (got {s.ttl_seconds})")
        )
    try:
        parse_owner(s.owner)
    except OwnerError as exc:
        out.append(v.violation(f"{prefix}.spec.owner.{exc.field}", exc.reason))
    if s.qos not in _QOS_VALUES:
        out.append(v.violation(f"{prefix}.spec.qos", f"unknown QoS {s.qos}"))
    out += v.validate_template(s.template, f"{prefix}.spec.template")
    if s.node:
        out += v.validate_label_name(s.node, f"{prefix}.spec.node", max_length=253)
    return out


def validate_node(r: pb.Reservation, prefix: str, node: pb.Node | None) -> v.Violations:
    """Against its node (``None``: not stored): the node exists and its pool could hold the
    reservation at all."""
    if not r.spec.node:
        return []
    if node is None:
        return [v.violation(f"{prefix}.spec.node", f"node {r.spec.node!r} does not exist")]
    if not node.status.ready:
        return [
            v.violation(
                f"{prefix}.spec.node",
                f"node {r.spec.node!r} is not ready: a lost node keeps no reservation",
            )
        ]
    pool = pool_of(r.spec.qos)
    offer = pool_capacity(node, pool)
    asked = r.spec.template.requests
    out: v.Violations = []
    for field, word, unit in _SIZED:
        want, have = getattr(asked, field), getattr(offer, field)
        if want > have:
            out.append(
                v.violation(
                    f"{prefix}.spec.template.requests.{field}",
                    f"larger than node {r.spec.node!r}: {want}{unit} {word} asked, its "
                    f"{POOL_NAMES[pool]} pool has {have}{unit}",
                )
            )
    return out


def validate_room(
    r: pb.Reservation,
    prefix: str,
    node: pb.Node,
    pods: Iterable[pb.Pod],
    reservations: Iterable[pb.Reservation],
) -> v.Violations:
    """A new reservation against what its node holds now (as the dispatcher's view has it): its
    bound and running ``pods`` and the other live ``reservations`` there. One that does not fit
    beside them would over-commit the node counting reserved room."""
    info = NodeInfo.from_node(node)
    for pod in pods:
        if holds_claim(pod):
            info.add_pod(PodRequest.from_pod(pod))
    for other in reservations:
        # Reserved there, or named to it and about to be: both take its room.
        if other.metadata.name != r.metadata.name and not other.metadata.deletion_timestamp_ms:
            held = pb.Reservation()
            held.CopyFrom(other)
            held.status.phase, held.status.node = pb.RESERVATION_RESERVED, node.metadata.name
            info.add_pod(hold_request(held))
    stored = pb.Reservation()
    stored.CopyFrom(r)
    stored.status.phase, stored.status.node = pb.RESERVATION_RESERVED, node.metadata.name
    hold = hold_request(stored)
    failures = resource_fit_failures(info, hold)
    if port_conflict(info, hold):
        failures.append(PORTS_IN_USE)
    if not failures:
        return []
    return [
        v.violation(
            f"{prefix}.spec.node",
            f"node {r.spec.node!r} has not the room for it now ({', '.join(failures)}): its pods "
            "and reservations hold the rest",
        )
    ]


def to_store(applied: pb.Reservation, tenant: str) -> pb.Reservation:
    """A new reservation as stored: its tenant as owner (never what the request said),
    ``Pending`` — the Binder commits it Reserved on its node, as it commits a binding
    (``services/binder/reserve.py``), and shards will place one that names none."""
    new = pb.Reservation()
    new.CopyFrom(applied)
    meta = new.metadata
    meta.resource_version = 0
    meta.uid = ""
    meta.creation_timestamp_ms = 0
    meta.deletion_timestamp_ms = 0
    meta.owner = tenant
    new.ClearField("status")
    new.status.phase = pb.RESERVATION_PENDING
    return new


def update(stored: pb.Reservation, applied: pb.Reservation) -> tuple[pb.Reservation, list[str]]:
    """The stored reservation with what an Apply may change (labels, annotations, the TTL), and
    the spec fields it would change that may not."""
    new = pb.Reservation()
    new.CopyFrom(stored)
    new.metadata.labels.clear()
    new.metadata.labels.update(applied.metadata.labels)
    new.metadata.annotations.clear()
    new.metadata.annotations.update(applied.metadata.annotations)
    immutable = [
        fd.name
        for fd in pb.ReservationSpec.DESCRIPTOR.fields
        if fd.name not in MUTABLE_SPEC
        and getattr(stored.spec, fd.name) != getattr(applied.spec, fd.name)
    ]
    new.spec.ttl_seconds = applied.spec.ttl_seconds
    return new, immutable
