"""Reservations: room on a node held for an owner's pods — the one home of what a reservation
holds, whom it is for, and how its owner's pod takes it.

A live reservation (``RESERVATION_RESERVED`` on ``status.node``) sits in its node's
``NodeInfo`` as a *hold*: a ``PodRequest`` named ``reservation:<name>`` (pod names are DNS-1123
and hold no ``:``), so every judge of room — the shards' snapshot, the Binder's re-check,
preemption, the rescheduler's simulation, ``godel audit`` — counts its cpu, memory, GPUs, pod
slot, host ports and NUMA nodes as it counts a bound pod's. A hold is never a preemption victim:
it has no pod behind it, and its priority is above every pod's, so the quick check never counts
its room as freeable.

Only its owner's pods may use the room: ``lent`` gives such a pod the node as if one of its
holds there were gone (``hold_for`` picks which, the same choice for the shard and the Binder,
whose commit consumes that reservation). An owner is a job (optionally one pod index of it) or
a label selector, and only pods of the reservation's own tenant (``metadata.owner``) qualify.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from placement import labelselector
from placement.nodeinfo import NodeInfo, PodRequest, pool_of
from placement.resources import Quantities
from protos.godel.v1 import objects_pb2 as pb


class Owning(Protocol):
    """What ``Reservations.own`` sets on a pod's scheduling view (``PodInfo``; the framework
    imports this module, so it is named by its fields)."""

    reservations: Mapping[str, str]
    template_key: bytes


PodView = TypeVar("PodView", bound=Owning)

HOLD_PREFIX = "reservation:"
# Above every pod's priority (user priorities are within ±1e9): the preemption quick check sums
# the room of pods below the preemptor's priority, and a hold must never be in that sum.
HOLD_PRIORITY = 2**62
MAX_NAME_LENGTH = 63
# A job's name: a DNS-1123 label (its pods' names `<job>-<index>` are labels too).
_JOB_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def hold_name(reservation: str) -> str:
    """The name a reservation's hold has in its node's ``NodeInfo.pods``."""
    return HOLD_PREFIX + reservation


def is_hold(name: str) -> bool:
    return name.startswith(HOLD_PREFIX)


def reservation_of(hold: str) -> str:
    """The reservation a hold name stands for."""
    return hold[len(HOLD_PREFIX) :]


def holds_room(rsv: pb.Reservation) -> bool:
    """Whether the reservation holds room now: reserved on a node and not being deleted."""
    return (
        rsv.status.phase == pb.RESERVATION_RESERVED
        and bool(rsv.status.node)
        and not rsv.metadata.deletion_timestamp_ms
    )


def expires_ms(rsv: pb.Reservation) -> int:
    """When it is released if unused: its stored creation time plus its TTL (a restart derives
    the same deadline)."""
    return rsv.metadata.creation_timestamp_ms + rsv.spec.ttl_seconds * 1000


def hold_request(rsv: pb.Reservation) -> PodRequest:
    """The room a reservation holds, as a pod's request (one pod slot, its host ports, its NUMA
    nodes once held)."""
    tpl = rsv.spec.template
    ports = tuple((p.protocol or "TCP", p.host_port) for p in tpl.ports if p.host_port)
    policy = tpl.numa_policy if rsv.spec.qos != pb.QOS_BEST_EFFORT else 0
    return PodRequest(
        hold_name(rsv.metadata.name),
        pool_of(rsv.spec.qos),
        host_ports=ports,
        priority=HOLD_PRIORITY,
        numa_policy=int(policy)
        if policy in (pb.NUMA_POLICY_SINGLE, pb.NUMA_POLICY_EXCLUSIVE)
        else 0,
        numa_nodes=tuple(rsv.status.numa_nodes),
        requests=Quantities.shared_request(tpl),
        gpu_models=tuple(tpl.gpu_models),
        gpu_cards=tuple(rsv.status.gpu_cards),
    )


def awaits_placement(rsv: pb.Reservation) -> bool:
    """Whether the shards are to place it: Pending, naming no node, not being deleted."""
    return (
        rsv.status.phase in (pb.RESERVATION_PHASE_UNSPECIFIED, pb.RESERVATION_PENDING)
        and not rsv.spec.node
        and not rsv.metadata.deletion_timestamp_ms
    )


def as_pod(rsv: pb.Reservation) -> pb.Pod:
    """The pod a reservation without a node is placed as — by the shards' search and the
    Binder's re-check alike, so it meets the same filters and scores a pod of its template
    would: its hold name (a pod slot no pod can have), its tenant, its template (requests,
    ports, NUMA policy, GPU share and models, node selector, affinity, tolerations), its pool.
    It never preempts (room is reserved from what is free) and belongs to no job, so it takes
    no other reservation's room."""
    pod = pb.Pod(
        metadata=pb.ObjectMeta(name=hold_name(rsv.metadata.name), owner=rsv.metadata.owner)
    )
    pod.metadata.resource_version = rsv.metadata.resource_version
    pod.metadata.labels.update(rsv.spec.template.labels)
    spec = pod.spec
    spec.template.CopyFrom(rsv.spec.template)
    spec.qos = rsv.spec.qos
    spec.preemption_policy = pb.NEVER
    pod.status.phase = pb.POD_PENDING
    return pod


def for_replacement(pod: pb.Pod, name: str, node: str, ttl_seconds: int) -> pb.Reservation:
    """A reservation ``name`` of ``pod``'s room (its requests and pool) on ``node`` for its
    replacement: owned by its job and index in its tenant (the replacement has the same), for
    ``ttl_seconds``. The one builder of "room for a leaving pod's replacement" — the
    rescheduler's reserve-first move (on its target) and a job's kept room (on the node the pod
    leaves, ``services.eviction``) — each setting its status."""
    rsv = pb.Reservation(metadata=pb.ObjectMeta(name=name, owner=pod.metadata.owner))
    spec = rsv.spec
    spec.template.CopyFrom(pod.spec.template)
    spec.qos = pod.spec.qos
    spec.owner.job = pod.spec.job
    spec.owner.index = pod.spec.index
    spec.node = node
    spec.ttl_seconds = ttl_seconds
    return rsv


# ---------------------------------------------------------------------------------------------
# Owners
# ---------------------------------------------------------------------------------------------


class OwnerError(ValueError):
    """An owner that does not parse; ``field`` is its path under ``spec.owner``."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Owner:
    """Whose pods may take a reservation's room, as plain values."""

    tenant: str
    job: str = ""
    index: int | None = None
    selector: labelselector.Selector | None = None

    def admits(self, tenant: str, job: str, index: int, pod_labels: Mapping[str, str]) -> bool:
        if tenant != self.tenant:
            return False
        if self.selector is not None:
            return labelselector.matches(self.selector, pod_labels)
        return job == self.job and (self.index is None or index == self.index)

    def admits_pod(self, pod: pb.Pod) -> bool:
        return self.admits(pod.metadata.owner, pod.spec.job, pod.spec.index, pod.metadata.labels)


def parse_owner(owner: pb.ReservationOwner, tenant: str = "") -> Owner:
    """The owner as values; OwnerError naming the field when it does not parse: exactly one of
    a job and a selector, a job a DNS-1123 label, an index not negative and only with a job, a
    selector in kubectl's grammar."""
    if owner.job and owner.selector:
        raise OwnerError("selector", "set a job or a selector, not both")
    if owner.selector:
        if owner.HasField("index"):
            raise OwnerError("index", "an index goes with a job, not a selector")
        try:
            parsed = labelselector.parse(owner.selector)
        except labelselector.SelectorSyntaxError as exc:
            raise OwnerError("selector", str(exc)) from None
        if not parsed:
            raise OwnerError("selector", "selects every pod: name what the room is for")
        return Owner(tenant, selector=parsed)
    if not owner.job:
        raise OwnerError("job", "is required: set a job (optionally an index) or a selector")
    if len(owner.job) > MAX_NAME_LENGTH or not _JOB_NAME.fullmatch(owner.job):
        raise OwnerError("job", f"{owner.job!r} is not a job name (a DNS-1123 label)")
    if owner.HasField("index") and owner.index < 0:
        raise OwnerError("index", f"must not be negative (got {owner.index})")
    return Owner(tenant, sys.intern(owner.job), owner.index if owner.HasField("index") else None)


def owner_of(rsv: pb.Reservation) -> Owner | None:
    """The stored reservation's owner; None if it does not parse (stored before a rule it
    breaks: it admits no pod and its TTL releases it)."""
    try:
        return parse_owner(rsv.spec.owner, rsv.metadata.owner)
    except OwnerError:
        return None


# ---------------------------------------------------------------------------------------------
# The owner's pod takes the room
# ---------------------------------------------------------------------------------------------


class Reservations:
    """The live reservations holding room, by name, with their owners: what a judge of room
    asks "which holds may this pod take" (``owned``). Kept from the informer's events."""

    def __init__(self) -> None:
        self.by_name: dict[str, pb.Reservation] = {}
        self._owners: dict[str, Owner] = {}
        # The candidates for a pod, so ``owned`` (asked for every pod a shard or the Binder
        # judges) reads a job's few reservations, not all of them: job owners by job name,
        # and the selector owners (few; each asked).
        self._by_job: dict[str, set[str]] = {}
        self._selected: set[str] = set()

    def __len__(self) -> int:
        return len(self._owners)

    def set(self, rsv: pb.Reservation) -> None:
        """Know ``rsv`` as it is now (one that holds no room, or whose owner does not parse,
        is forgotten)."""
        name = rsv.metadata.name
        owner = owner_of(rsv)
        self.remove(name)
        if holds_room(rsv) and owner is not None:
            self.by_name[name] = rsv
            self._owners[name] = owner
            if owner.selector is not None:
                self._selected.add(name)
            else:
                self._by_job.setdefault(owner.job, set()).add(name)

    def remove(self, name: str) -> None:
        self.by_name.pop(name, None)
        owner = self._owners.pop(name, None)
        if owner is None:
            return
        self._selected.discard(name)
        of_job = self._by_job.get(owner.job)
        if of_job is not None:
            of_job.discard(name)
            if not of_job:
                del self._by_job[owner.job]

    def node_of(self, name: str) -> str | None:
        rsv = self.by_name.get(name)
        return rsv.status.node if rsv is not None else None

    def track(
        self,
        rsv: pb.Reservation,
        infos: Mapping[str, NodeInfo],
        info_for: Callable[[str], NodeInfo],
    ) -> list[str]:
        """Know ``rsv`` as it is now and move its hold on the nodes (``infos``; ``info_for``
        makes one that is missing, as a bound pod's claim on a node not seen yet needs): off
        the node it held, onto the node it holds. Returns the nodes changed."""
        changed = self.untrack(rsv.metadata.name, infos)
        self.set(rsv)
        if rsv.metadata.name in self.by_name:
            info = info_for(rsv.status.node)
            info.add_pod(hold_request(rsv))
            changed.append(info.name)
        return changed

    def untrack(self, name: str, infos: Mapping[str, NodeInfo]) -> list[str]:
        """Forget reservation ``name`` and take its hold off its node. Returns the nodes
        changed."""
        node = self.node_of(name)
        self.remove(name)
        info = infos.get(node) if node is not None else None
        if info is None or info.remove_pod(hold_name(name)) is None:
            return []
        return [info.name]

    def owned(self, pod: pb.Pod) -> dict[str, str]:
        """The holds ``pod`` may take, hold name -> node: empty for nearly every pod."""
        if not self._owners:
            return {}
        candidates: Collection[str] = self._by_job.get(pod.spec.job, ())
        if self._selected:
            candidates = [*candidates, *self._selected]
        if not candidates:
            return {}
        by_name, owners = self.by_name, self._owners
        return {
            hold_name(name): by_name[name].status.node
            for name in sorted(candidates)
            if owners[name].admits_pod(pod)
        }

    def own(self, info: PodView, pod: pb.Pod) -> PodView:
        """``info`` (of ``pod``) with the holds it may take; its template key is its own then,
        so the feasible-node cache never lends a hold's room to a pod of the same template that
        does not own it."""
        holds = self.owned(pod)
        if holds:
            info.reservations = holds
            info.template_key += b"\x00reservations:" + ",".join(sorted(holds)).encode()
        return info


def hold_for(holds: Iterable[str], node: NodeInfo) -> str | None:
    """Which of a pod's holds on ``node`` it takes: the first by name. The one choice, made the
    same way by the shard and by the Binder, whose commit consumes that reservation."""
    here = [h for h in holds if h in node.pods]
    return min(here) if here else None


def lent(holds: Collection[str], node: NodeInfo) -> NodeInfo:
    """``node`` as the owner of ``holds`` sees it: without the one hold it would take there
    (``hold_for``), or ``node`` itself when it has none of them."""
    if not holds:
        return node
    hold = hold_for(holds, node)
    if hold is None:
        return node
    view = node.clone()
    view.remove_pod(hold)
    return view
