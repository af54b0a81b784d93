"""The shard's live view of the cluster, from which each cycle's snapshot is updated.

:class:`SchedulerCache` is fed by the store informer (Nodes, Pods and Reservations): bound,
non-terminal pods and live reservations' holds count on their nodes through
``NodeInfo.add_pod``, and each pod keeps the compact record preemption reads
(``VictimCandidate``: priority, pool, preemptibility, protection, start, claim). Pods this
shard has *assumed* (decided, sent to the Binder, not yet seen bound) count too, so the next units
do not reuse the room; a rejection forgets them, and the informer's bound pod replaces them. A
preemptor's victims leave their node's accounting while it is assumed (the Binder evicts them in
the commit that binds it) and are *claimed*, so no other preemptor of this shard takes them; a
rejection puts them back.

:class:`placement.snapshot.Snapshot` is what a scheduling cycle reads and mutates; it clones
only the NodeInfos this cache marked ``dirty``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import structlog
from google.protobuf.message import Message

from placement.claims import TERMINAL_PHASES
from placement.nodeinfo import NodeInfo, PodRequest
from placement.preemption import TemplateParts, VictimCandidate
from placement.reservations import Reservations, hold_name, holds_room, reservation_of
from placement.snapshot import LabelIndex
from protos.godel.v1 import objects_pb2 as pb

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Assumed:
    node: str
    req: PodRequest
    # Set once the Binder answered BOUND: forgotten when the informer shows the pod bound, or
    # at this deadline if it never does (e.g. the pod was deleted right away).
    expires: float | None = None
    victims: tuple[str, ...] = ()
    # The reservation's hold the pod takes on its node, off the node while it is assumed (the
    # Binder's bind consumes it; a refusal gives it back).
    hold: PodRequest | None = None


K = TypeVar("K", str, int)


class SchedulerCache:
    def __init__(self) -> None:
        self.labels = LabelIndex()
        self.nodes: dict[str, NodeInfo] = {}
        self.present: set[str] = set()  # nodes that exist (others only hold pods' claims)
        # pod -> its record, which names its node (one string per node, interned)
        self.bound: dict[str, VictimCandidate] = {}
        # The bound pods counted per node and per priority, kept with ``bound``: preemption
        # skips its victim search when no bound pod is below the preemptor, and judges a node it
        # rules out by its totals, needing its pods one by one only when some are not bound.
        # (Plain dicts: a Counter's item reads and writes are not specialised, and every bound
        # pod of a restart counts here.)
        self._bound_on: dict[str, int] = {}
        self._bound_priorities: dict[int, int] = {}
        self.assumed: dict[str, Assumed] = {}
        self.claimed: dict[str, str] = {}  # victim -> the assumed preemptor that claimed it
        self.dirty: set[str] = set()
        self.node_set_version = 0
        # Bound pods by job (pod -> node), kept only for the jobs asked about through
        # ``bound_nodes_of``: a job-level affinity confines a job to where its pods are, and a
        # scan of every bound pod (a million at the paper's scale) per attempt cost 0.1 s.
        self._by_job: dict[str, dict[str, str]] = {}
        # The earliest deadline a confirmed placement may have (none sooner): each cycle asks
        # to expire, and thousands of placements are assumed at once with one-pod jobs.
        self._next_expiry = math.inf
        # Live reservations, each holding its room on its node as a hold only its owner's pods
        # may take (placement.reservations).
        self.reservations = Reservations()
        # Each distinct pod template's part of a bound pod's record (placement.preemption).
        self.template_parts = TemplateParts()

    # -- informer handlers -------------------------------------------------------------------

    def on_add(self, kind: str, obj: Message) -> None:
        if isinstance(obj, pb.Node):
            self.set_node(obj)
        elif isinstance(obj, pb.Pod):
            self.set_pod(obj)
        elif isinstance(obj, pb.Reservation):
            if holds_room(obj):
                # Placed by this shard: its assumed placement becomes the hold (same name).
                self._drop_assumed(hold_name(obj.metadata.name))
            self.dirty.update(self.reservations.track(obj, self.nodes, self._node))

    def _drop_assumed(self, name: str) -> None:
        assumed = self.assumed.pop(name, None)
        if assumed is not None:
            self._unaccount(name, assumed.node)

    def on_update(self, kind: str, old: Message, new: Message) -> None:
        self.on_add(kind, new)

    def on_delete(self, kind: str, obj: Message) -> None:
        if isinstance(obj, pb.Node):
            self.remove_node(obj.metadata.name)
        elif isinstance(obj, pb.Pod):
            self.remove_pod(obj.metadata.name)
        elif isinstance(obj, pb.Reservation):
            for node in self.reservations.untrack(obj.metadata.name, self.nodes):
                self.dirty.add(node)
                if not self.nodes[node].pods and node not in self.present:
                    del self.nodes[node]

    # -- nodes -------------------------------------------------------------------------------

    def set_node(self, node: pb.Node) -> None:
        name = node.metadata.name
        info = self.nodes.get(name)
        if info is None:
            info = self.nodes[name] = NodeInfo(name)
        if name in self.present:
            self.labels.remove(name, info.labels)
        info.set_node(node)
        self.labels.add(name, info.labels)
        if name not in self.present:
            self.present.add(name)
            self.node_set_version += 1
        self.dirty.add(name)

    def remove_node(self, name: str) -> None:
        if name in self.present:
            self.labels.remove(name, self.nodes[name].labels)
            self.present.discard(name)
            self.node_set_version += 1
            self.dirty.add(name)
        info = self.nodes.get(name)
        if info is not None and not info.pods:
            del self.nodes[name]

    def _node(self, name: str) -> NodeInfo:
        info = self.nodes.get(name)
        if info is None:  # a pod seen before its node: keep its claim on a placeholder
            info = self.nodes[name] = NodeInfo(name)
        return info

    # -- pods --------------------------------------------------------------------------------

    def set_pod(self, pod: pb.Pod) -> None:
        # The pod's parts read once and handed on: every bound pod comes through here when the
        # shard (re)starts, and a protobuf field read is ~0.3 µs.
        meta, spec, status = pod.metadata, pod.spec, pod.status
        node_name = spec.node_name
        if not node_name or status.phase in TERMINAL_PHASES:
            self.remove_pod(meta.name, keep_assumed=not node_name)
            return
        self._set_bound(pod, meta, spec, status, node_name)

    def take_listed(self, pod: pb.Pod) -> bool:
        """A pod of the shard's (re)start listing (``store.informer``'s ``take_listed``): if it
        is one the informer keeps nothing of (``keeps_whole``), recorded as ``set_pod`` would
        and True; else False, and the informer hands it on as any other. Every bound pod of the
        cluster comes through here when a shard starts: read once, not once by the informer's
        ``hold`` and again by the handler."""
        meta, spec, status = pod.metadata, pod.spec, pod.status
        if _kept_whole(meta, spec, status):
            return False
        # Offered a first listing only (nothing of the kind held before): no record of it yet.
        self._set_bound(pod, meta, spec, status, spec.node_name, listed=True)
        return True

    def _set_bound(
        self,
        pod: pb.Pod,
        meta: pb.ObjectMeta,
        spec: pb.PodSpec,
        status: pb.PodStatus,
        node_name: str,
        *,
        listed: bool = False,
    ) -> None:
        """Record ``pod``, bound and unfinished, on ``node_name``; its parts and node as the
        caller read them. ``listed``: of a first listing, so not recorded yet (a look-up in a
        million records less per pod of a restart)."""
        name = meta.name
        current = None if listed else self.bound.get(name)
        if current is not None and current.node == node_name:
            # Same node: only what preemption reads may have changed (started, claimed). The
            # request the node accounts stays, shared with the new record (a second request per
            # pod, once running, was a fifth of the shard's memory).
            record = VictimCandidate.from_pod(pod, current)
            _count(self._bound_priorities, current.priority, -1)
            _count(self._bound_priorities, record.priority, 1)
            self.bound[name] = record
            return
        assumed = self.assumed.pop(name, None) if self.assumed else None
        # Assumed on this node with the NUMA nodes and GPU cards it was bound with: already
        # counted, it just changes hands, and the record shares the request the node holds (a
        # second one per pod this shard placed was memory and an object for the collector to
        # walk). Elsewhere, or holding other NUMA nodes or cards: counted again.
        accounted = (
            assumed.req
            if assumed is not None
            and assumed.node == node_name
            and _same_ids(assumed.req.numa_nodes, spec.numa_nodes)
            and _same_ids(assumed.req.gpu_cards, spec.gpu_cards)
            else None
        )
        # The record names its node by the node's own string (one per node, not one per pod).
        # Looked up again below unless nothing was unaccounted (which may drop a placeholder).
        known = self.nodes.get(node_name)
        record = VictimCandidate.from_parts(
            meta,
            spec,
            status,
            accounted,
            known.name if known is not None else sys.intern(node_name),
            # A job's pods share one template: its part read once, not once a pod (most of a
            # restart's work per pod was reading it again).
            None if accounted is not None else self.template_parts.of(spec),
        )
        if current is not None:
            self._unaccount(name, current.node)
            self._count_bound(current.node, current.priority, -1)
        if assumed is not None:
            self._unclaim(assumed)
            if assumed.node != node_name:
                self._give_back_hold(assumed)
            if accounted is None:
                self._unaccount(name, assumed.node)
        node = record.node
        info = known if current is None and assumed is None else self.nodes.get(node)
        if info is None:
            info = self._node(node)
        info.add_pod(record.req)
        # Keyed by the record's own name: no string copied per pod.
        self.bound[record.name] = record
        # Counted up in place (``_count``'s dropping at zero is for counting down).
        bound_on, priorities, priority = self._bound_on, self._bound_priorities, record.priority
        bound_on[node] = bound_on.get(node, 0) + 1
        priorities[priority] = priorities.get(priority, 0) + 1
        self.dirty.add(node)
        if self._by_job:
            job_pods = self._by_job.get(record.job)
            if job_pods is not None:
                job_pods[record.name] = record.node

    def started(self, name: str, started_ms: int) -> bool:
        """A bound pod started at ``started_ms``, nothing else changed (the change feed's
        ``POD_STARTED`` hint): True once its record took the start (what its victim order and
        protection read); False where it cannot — no record, or a protection window that runs
        from the start — and the pod is to be read whole."""
        record = self.bound.get(name)
        started = record.started_at(started_ms) if record is not None else None
        if started is None:
            return False
        self.bound[name] = started  # priority, node and request the same: counts unchanged
        return True

    @staticmethod
    def keeps_whole(pod: pb.Pod) -> bool:
        """Whether the shard's informer keeps ``pod`` whole: every pod but those the cache keeps
        as records (``bound``: bound and not finished; a ``VictimCandidate`` is all that
        placement accounting, the victim search and the budgets' check read of one), of which
        it keeps nothing — not their bytes, not their names (~290 bytes a pod less). A bound
        pod being deleted is kept whole too: a budget does not count it, which its record does
        not say. ``take_listed`` takes exactly the others."""
        return _kept_whole(pod.metadata, pod.spec, pod.status)

    def remove_pod(self, name: str, *, keep_assumed: bool = False) -> None:
        current = self.bound.pop(name, None)
        if current is not None:
            self._unaccount(name, current.node)
            self._count_bound(current.node, current.priority, -1)
            self.claimed.pop(name, None)
            if self._by_job:
                self._unindex(current.job, name)
        if not keep_assumed:
            self.forget(name)

    def bound_nodes_of(self, job: str) -> list[str]:
        """The nodes of the job's bound pods. The first question about a job scans every bound
        pod once; from then on the job's pods are indexed as they come and go, until none is
        left bound."""
        job_pods = self._by_job.get(job)
        if job_pods is None:
            job_pods = {pod: rec.node for pod, rec in self.bound.items() if rec.job == job}
            if not job_pods:
                return []  # nothing to keep: a job with none bound costs no entry
            self._by_job[job] = job_pods
        return list(job_pods.values())

    def _unindex(self, job: str, pod: str) -> None:
        job_pods = self._by_job.get(job)
        if job_pods is not None:
            job_pods.pop(pod, None)
            if not job_pods:
                del self._by_job[job]

    def _count_bound(self, node_name: str, priority: int, sign: int) -> None:
        _count(self._bound_on, node_name, sign)
        _count(self._bound_priorities, priority, sign)

    def lowest_bound_priority(self) -> int | None:
        """The lowest priority among the bound pods (None: none is bound)."""
        return min(self._bound_priorities) if self._bound_priorities else None

    def bound_on(self, node_name: str) -> int:
        """How many bound pods ``node_name`` holds."""
        return self._bound_on.get(node_name, 0)

    def _unaccount(self, pod: str, node_name: str) -> None:
        info = self.nodes.get(node_name)
        if info is None:
            return
        info.remove_pod(pod)
        self.dirty.add(node_name)
        if not info.pods and node_name not in self.present:
            del self.nodes[node_name]

    # -- assume / forget (this shard's undecided placements) ---------------------------------

    def assume(
        self, req: PodRequest, node_name: str, victims: Sequence[str] = (), hold: str = ""
    ) -> bool:
        """Count a placement sent to the Binder, its victims taken off the node and claimed,
        the reservation's ``hold`` it takes off the node (else the node would count the pod and
        its room twice until the Binder's commit arrives). False if the pod is already bound or
        assumed."""
        if req.name in self.bound or req.name in self.assumed:
            return False
        info = self.nodes.get(node_name)
        if info is None or node_name not in self.present:
            return False
        for victim in victims:
            info.remove_pod(victim)
            self.claimed[victim] = req.name
        taken = info.remove_pod(hold) if hold else None
        info.add_pod(req)
        self.assumed[req.name] = Assumed(node_name, req, victims=tuple(victims), hold=taken)
        self.dirty.add(node_name)
        return True

    def forget(self, pod: str) -> None:
        """Drop an assumed placement (rejected by the Binder, or revoked); its victims that
        are still bound count on their node again."""
        assumed = self.assumed.pop(pod, None)
        if assumed is not None:
            self._unaccount(pod, assumed.node)
            self._unclaim(assumed)
            info = self.nodes.get(assumed.node)
            self._give_back_hold(assumed)
            for victim in assumed.victims:
                held = self.bound.get(victim)
                if info is not None and held is not None and held.node == assumed.node:
                    info.add_pod(held.req)
                    self.dirty.add(assumed.node)

    def _give_back_hold(self, assumed: Assumed) -> None:
        """The hold an assumed pod took, back on its node if its reservation still holds room
        there (the pod was refused, or bound elsewhere): its owner's next pod may take it."""
        hold, info = assumed.hold, self.nodes.get(assumed.node)
        if info is None or hold is None:
            return
        if self.reservations.node_of(reservation_of(hold.name)) == assumed.node:
            info.add_pod(hold)
            self.dirty.add(assumed.node)

    def _unclaim(self, assumed: Assumed) -> None:
        for victim in assumed.victims:
            if self.claimed.get(victim) == assumed.req.name:
                del self.claimed[victim]

    def running(self, pod: str) -> VictimCandidate | None:
        """A bound pod's record, for the victim search (None: not bound here)."""
        return self.bound.get(pod)

    def confirm(self, pod: str, ttl_seconds: float) -> None:
        """The Binder bound it: keep counting it until the informer shows it (or ``ttl``)."""
        assumed = self.assumed.get(pod)
        if assumed is not None and assumed.expires is None:
            assumed.expires = time.monotonic() + ttl_seconds
            self._next_expiry = min(self._next_expiry, assumed.expires)

    def expire(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        if now < self._next_expiry:
            return 0
        stale = [n for n, a in self.assumed.items() if a.expires is not None and a.expires <= now]
        for name in stale:
            self.forget(name)
        self._next_expiry = min(
            (a.expires for a in self.assumed.values() if a.expires is not None), default=math.inf
        )
        return len(stale)


def _kept_whole(meta: pb.ObjectMeta, spec: pb.PodSpec, status: pb.PodStatus) -> bool:
    """``SchedulerCache.keeps_whole`` from the pod's parts, for a caller that read them."""
    return not spec.node_name or status.phase in TERMINAL_PHASES or bool(meta.deletion_timestamp_ms)


def _same_ids(held: tuple[int, ...], stored: Sequence[int]) -> bool:
    """Whether the NUMA nodes or cards an assumed request holds are those the pod was bound
    with; most hold none, which is told without a tuple made of the stored field."""
    if not held:
        return not stored
    return held == tuple(stored)


def _count(counts: dict[K, int], key: K, sign: int) -> None:
    """Add ``sign`` to ``key``'s count, dropping it at zero (so the keys are those counted)."""
    left = counts.get(key, 0) + sign
    if left:
        counts[key] = left
    else:
        del counts[key]
