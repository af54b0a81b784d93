"""The one eviction path (ARCHITECTURE §5, invariant 6): what the store is told when a pod is
taken off its node — by preemption today, later by rescheduling, quota reclaim, tidal pressure
and drain — and by the node lifecycle controller when a node is lost.

An evicted pod is not deleted: it is terminated (``POD_FAILED`` with the reason, a message, who
evicted it and when) through a ``Release``, which returns its node claim in the same commit, and
kept as a record. A pod of a job with ``spec.replace_lost_pods`` gets a replacement in the same
commit (new uid, same index, ``<job>-<index>-r<n>``, pending), which enters its queue through the
dispatcher's informer like any pending pod: a victim is never lost, and a crash between the two
cannot happen because there is no "between".

A pod of a job that asks its room kept (``spec.reservation``) and leaves a live node for a reason
that does not hand its room to someone else (``keeps_room``) also leaves a Reservation of that
room on that node, owned by its replacement's job and index, ``Reserved`` in the same commit: no
other pod can take the room in between, the replacement tries that node first and its bind there
consumes the reservation; unused, the dispatcher releases it after the job's TTL.

Pure and synchronous: callers (the Binder, the node lifecycle controller) own the commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass

from placement.reservations import for_replacement
from protos.godel.v1 import objects_pb2 as pb
from store.client import Create, Op, Release

# Reasons an evicted pod carries in ``status.reason``.
PREEMPTED = "Preempted"
RESCHEDULED = "Rescheduled"
RECLAIMED = "Reclaimed"
DRAINED = "Drained"
NODE_LOST = "NodeLost"
# A failed pod with one of these reasons did not fail by itself: a job that replaces lost pods
# is not failed by it (its replacement carries on).
EVICTION_REASONS = frozenset({PREEMPTED, RESCHEDULED, RECLAIMED, DRAINED, NODE_LOST})

# Reasons whose eviction hands the pod's room to someone else, so it is never kept: the preemptor
# binds into it in the same commit, a reclaim frees it for another queue (or relieves its node),
# a rescheduling moves the pod off its node on purpose; a lost node has no room to keep.
GIVES_ROOM_AWAY = frozenset({PREEMPTED, RECLAIMED, RESCHEDULED, NODE_LOST})

REPLACES_ANNOTATION = "godel.io/replaces"
# On a kept room's Reservation: the pod whose room it is.
KEPT_FROM_ANNOTATION = "godel.io/kept-from"


def replacement_number(pod: pb.Pod) -> int:
    """``n`` for a replacement pod ``<job>-<index>-r<n>``, 0 for an original pod."""
    return replacement_number_of(pod.spec.job, pod.spec.index, pod.metadata.name)


def replacement_number_of(job: str, index: int, name: str) -> int:
    """:func:`replacement_number` of the pod ``name`` of ``job`` at ``index``."""
    rest = name.removeprefix(f"{job}-{index}-r")
    return int(rest) if rest != name and rest.isdigit() else 0


def evicted(pod: pb.Pod, reason: str, message: str, now_ms: int, by: str = "") -> pb.Pod:
    """``pod`` as its eviction writes it (a copy): failed with ``reason``, ``message`` and
    ``finished_ms``; ``by`` (the preemptor) in ``status.preempted_by``."""
    out = pb.Pod()
    out.CopyFrom(pod)
    out.status.phase = pb.POD_FAILED
    out.status.reason = reason
    out.status.message = message
    out.status.finished_ms = now_ms
    if by:
        out.status.preempted_by = by
    return out


def replacement(pod: pb.Pod, siblings: Iterable[pb.Pod], taken: Set[str] = frozenset()) -> pb.Pod:
    """The pod that replaces ``pod``: ``<job>-<index>-r<n>`` with the next n after every sibling
    of its index (``siblings``: the job's pods, any phase) and not in ``taken`` (names used
    earlier in the same commit); same labels, annotations and spec, unbound, pending. No uid:
    the store gives the new pod its own."""
    index = pod.spec.index
    after = max((replacement_number(p) for p in siblings if p.spec.index == index), default=0)
    return _replacement(pod, after, taken)


def _replacement(pod: pb.Pod, after: int, taken: Set[str]) -> pb.Pod:
    """:func:`replacement` numbered after ``after`` (the highest n of its index's siblings)."""
    n = 1 + max(replacement_number(pod), after)
    name = f"{pod.spec.job}-{pod.spec.index}-r{n}"
    while name in taken:
        n += 1
        name = f"{pod.spec.job}-{pod.spec.index}-r{n}"
    new = pb.Pod(metadata=pb.ObjectMeta(name=name))
    new.metadata.labels.update(pod.metadata.labels)
    new.metadata.owner = pod.metadata.owner  # the tenant's pod, as the one it replaces
    new.metadata.annotations.update(pod.metadata.annotations)
    new.metadata.annotations[REPLACES_ANNOTATION] = pod.metadata.name
    new.spec.CopyFrom(pod.spec)
    new.spec.node_name = ""
    del new.spec.numa_nodes[:]
    del new.spec.gpu_cards[:]  # its cards are chosen where it lands
    new.status.phase = pb.POD_PENDING
    return new


def replacement_numbers(job: str, names: Iterable[str]) -> dict[str, int]:
    """The highest replacement number among ``names`` (a job's pods' names, any phase) per
    index as written in them: ``{"3": 2}`` for ``<job>-3`` and ``<job>-3-r2``. What
    :func:`replacement` reads of the siblings, for a holder of their names only (the Binder):
    a name of the form ``<job>-<index>-r<n>`` is a replacement of that index whatever pod
    carries it, so the number chosen after it is never a sibling's name."""
    prefix = f"{job}-"
    highest: dict[str, int] = {}
    for name in names:
        if not name.startswith(prefix):
            continue
        index, marker, n = name[len(prefix) :].rpartition("-r")
        if marker and n.isdigit() and int(n) > highest.get(index, 0):
            highest[index] = int(n)
    return highest


def keeps_room(job: pb.Job | None, reason: str, node_ready: bool) -> bool:
    """Whether a pod of ``job`` evicted for ``reason`` from a node (``node_ready``: it exists and
    is ready) leaves its room as a reservation for its replacement: the job lives and asks it,
    the node is alive, and the eviction does not give the room away."""
    return (
        job is not None
        and not job.metadata.deletion_timestamp_ms
        and job.spec.HasField("reservation")
        and node_ready
        and reason not in GIVES_ROOM_AWAY
    )


def kept_room(pod: pb.Pod, replacement_name: str, ttl_seconds: int) -> pb.Reservation:
    """The Reservation that keeps ``pod``'s room on its node for its replacement (named
    ``replacement_name``, its name too): the pod's requests, pool, NUMA nodes and GPU cards,
    owned by its job's index in its tenant, ``Reserved`` there for ``ttl_seconds``."""
    rsv = for_replacement(pod, replacement_name, pod.spec.node_name, ttl_seconds)
    rsv.metadata.annotations[KEPT_FROM_ANNOTATION] = pod.metadata.name
    rsv.status.phase = pb.RESERVATION_RESERVED
    rsv.status.node = pod.spec.node_name
    rsv.status.numa_nodes.extend(pod.spec.numa_nodes)
    rsv.status.gpu_cards.extend(pod.spec.gpu_cards)
    return rsv


@dataclass(frozen=True, slots=True)
class Eviction:
    """One pod to evict: why (``reason``), the human message, and who (a preemptor's name)."""

    pod: pb.Pod
    reason: str
    message: str
    by: str = ""


class EvictionOps:
    """Builds the store ops of evictions for one commit: each victim's ``Release`` and, for a
    job that replaces lost pods, its replacement's ``Create``. Replacement names are unique
    within the commit.

    ``job_of(name)`` finds a job (None: gone, no replacement); ``names_of(job)`` its pods'
    names (any phase), from the caller's view; ``node_ready(name)`` whether a node exists and
    is ready (None: no room is kept, as for a caller that evicts from lost nodes);
    ``reservation_exists(name)`` whether a reservation of that name is stored already (the name
    is then not free for a kept room, which is skipped rather than failing the commit).
    ``targets`` names, per op, the evicted pod it serves, so a caller can tell which eviction the
    store refused; ``kept`` holds the Reservations created (``keeps_room``).
    """

    def __init__(
        self,
        job_of: Callable[[str], pb.Job | None],
        names_of: Callable[[str], Iterable[str]],
        *,
        always_replace: bool = False,
        node_ready: Callable[[str], bool] | None = None,
        reservation_exists: Callable[[str], bool] = lambda _: False,
    ) -> None:
        """``always_replace``: every evicted pod of a live job gets a replacement, whatever the
        job says about lost pods (a rescheduled pod is moved, never dropped)."""
        self._job_of = job_of
        self._names_of = names_of
        self._always_replace = always_replace
        self._node_ready = node_ready
        self._reservation_exists = reservation_exists
        self._taken: set[str] = set()
        # A job's highest replacement number per index, read from its names once per job (a
        # 1,000-pod job evicted whole would otherwise scan the job per pod).
        self._numbers: dict[str, dict[str, int]] = {}
        self.ops: list[Op] = []
        self.targets: list[str] = []
        self.kept: list[pb.Reservation] = []

    def _after(self, pod: pb.Pod) -> int:
        job = pod.spec.job
        numbers = self._numbers.get(job)
        if numbers is None:
            numbers = self._numbers[job] = replacement_numbers(job, self._names_of(job))
        return numbers.get(str(pod.spec.index), 0)

    def add(self, e: Eviction, now_ms: int) -> None:
        pod = e.pod
        self.ops.append(Release(evicted(pod, e.reason, e.message, now_ms, e.by)))
        self.targets.append(pod.metadata.name)
        job = self._job_of(pod.spec.job) if pod.spec.job else None
        # A job whose deletion has begun (its pods going chunk by chunk) gets no new pods.
        live = job is not None and not job.metadata.deletion_timestamp_ms
        if job is not None and live and (self._always_replace or job.spec.replace_lost_pods):
            new = _replacement(pod, self._after(pod), self._taken)
            self._taken.add(new.metadata.name)
            self.ops.append(Create(new))
            self.targets.append(pod.metadata.name)
            ready = self._node_ready is not None and self._node_ready(pod.spec.node_name)
            if keeps_room(job, e.reason, ready) and not self._reservation_exists(new.metadata.name):
                rsv = kept_room(pod, new.metadata.name, job.spec.reservation.ttl_seconds)
                self.ops.append(Create(rsv))
                self.targets.append(pod.metadata.name)
                self.kept.append(rsv)
