"""Tenants on the public API: what a caller's identity may do with which objects (the
Dispatcher's API, and the node agents' Logs).

The caller is the identity of its client certificate (``services.runtime.auth.caller``); which
methods a role may call at all is decided before (``auth.RULES``). Here are the per-object rules:

| rule | who | what |
|---|---|---|
| ``tenant-queues`` | tenant | submits and applies jobs only to the queues its certificate lists |
| ``own-jobs-only`` | tenant | reads, explains, watches, applies over and deletes only Jobs, Pods and Reservations it owns (``metadata.owner``), and reads only the Events about them (an event's owner is its pod's or job's, ``services.events``) |
| ``admin-only`` | tenant | applies and deletes no cluster objects (nodes, queues, budgets, priority classes, ...: of Apply's kinds only Jobs and Reservations), drains no node (a drain cordons it and evicts every tenant's pods on it) |

Everything else a tenant may read (nodes, queues, priority classes, schedulers: how the cluster
looks); the cluster's own events (about nodes, movements, shards) are the admin's. The admin
identity — and everyone in a cluster started with --insecure (no identity) — may do everything.
Each function returns None when allowed, else the refusal naming its rule. How much a tenant may
submit (pods per job, live pods) is the dispatcher's: its admission limits
(``services/dispatcher/api/admission.py``).
"""

from __future__ import annotations

from google.protobuf.message import Message

from foundation.tls import Identity
from placement.quotas import DEFAULT_QUEUE
from protos.godel.v1 import objects_pb2 as pb

OWNED_KINDS = frozenset({"Job", "Pod", "Event", "Reservation"})
# What a tenant may delete of what it owns: its events are records, not its to remove.
DELETED_BY_OWNER = frozenset({"Job", "Pod", "Reservation"})
# What a tenant may apply: its jobs (into its queues) and reservations for its own pods (a
# reservation's room is taken only by pods of its owner: ``placement.reservations``).
TENANT_APPLIED_KINDS = frozenset({"Job", "Reservation"})
# The stored kinds a tenant owns, for the type checker (OWNED_KINDS by message).
Owned = pb.Pod | pb.Job | pb.Event | pb.Reservation


def unrestricted(identity: Identity | None) -> bool:
    return identity is None or identity.role != "tenant"


def submit_refusal(identity: Identity | None, job: pb.Job) -> str | None:
    if unrestricted(identity):
        return None
    assert identity is not None
    queue = job.spec.queue or DEFAULT_QUEUE
    if queue in identity.queues:
        return None
    allowed = ", ".join(identity.queues) or "none"
    return (
        f"rule tenant-queues: tenant {identity.name!r} may submit only to its queues "
        f"({allowed}); job {job.metadata.name!r} names queue {queue!r}"
    )


def owns(identity: Identity | None, kind: str, obj: Message) -> bool:
    """Whether ``identity`` may see ``obj`` (List and Watch leave out what it may not)."""
    if unrestricted(identity) or kind not in OWNED_KINDS:
        return True
    assert identity is not None and isinstance(obj, Owned)  # OWNED_KINDS
    return obj.metadata.owner == identity.name


def read_refusal(identity: Identity | None, kind: str, obj: Message) -> str | None:
    if owns(identity, kind, obj):
        return None
    assert identity is not None and isinstance(obj, Owned)  # as owns()
    return _not_owned(identity, kind, obj, "read")


def delete_refusal(identity: Identity | None, kind: str, obj: Message | None) -> str | None:
    """``obj``: the stored object, when there is one (a missing one is NOT_FOUND for all)."""
    if unrestricted(identity):
        return None
    assert identity is not None
    if kind not in DELETED_BY_OWNER:
        return admin_only(identity, f"delete {kind}{'es' if kind.endswith('s') else 's'}")
    if obj is None or owns(identity, kind, obj):
        return None
    assert isinstance(obj, Owned)  # as owns() found
    return _not_owned(identity, kind, obj, "delete")


def apply_refusal(identity: Identity | None, kind: str, obj: Message) -> str | None:
    """An object of an Apply, judged before anything is read: a tenant applies Jobs, into its
    queues, as it submits them, and Reservations (its own, whatever they say); every other kind
    is the admin's. Over a stored job, see
    ``apply_over_refusal``."""
    if unrestricted(identity):
        return None
    assert identity is not None
    if kind not in TENANT_APPLIED_KINDS:
        return admin_only(
            identity, f"apply {kind} objects (a tenant applies only Jobs and Reservations)"
        )
    if not isinstance(obj, pb.Job):
        return None  # a Reservation: stamped with the tenant as its owner
    return submit_refusal(identity, obj)


def apply_over_refusal(identity: Identity | None, kind: str, stored: Message) -> str | None:
    """An applied object that is stored already: a tenant changes only its own jobs (its
    ``apply_refusal`` let no other kind through)."""
    if owns(identity, kind, stored):
        return None
    assert identity is not None and isinstance(stored, Owned)  # as owns()
    return _not_owned(identity, kind, stored, "apply")


def drain_refusal(identity: Identity | None) -> str | None:
    """Draining is the operator's: it cordons a node and evicts whatever runs there, other
    tenants' pods included, and even its dry run lists those pods by name."""
    if unrestricted(identity):
        return None
    assert identity is not None
    return admin_only(identity, "drain nodes")


def admin_only(identity: Identity, what: str) -> str:
    return f"rule admin-only: only the admin identity may {what}; {identity.name!r} is a tenant"


def _not_owned(identity: Identity, kind: str, obj: Owned, verb: str) -> str:
    name = obj.metadata.name
    return (
        f"rule own-jobs-only: tenant {identity.name!r} may {verb} only its own jobs and their "
        f"pods; {kind} {name!r} is not its own"
    )
