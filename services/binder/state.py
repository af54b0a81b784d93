"""The binder's authoritative view: a NodeInfo per node holding every bound, non-terminal pod
and every live reservation's hold, a record of each such pod (its node, queue, job and
template labels: what budgets, quotas and job-level affinity read), jobs, budgets, queues and
what each queue's bound pods hold (for its max).

Fed by the informer (Nodes, Pods, Jobs, DisruptionBudgets, Queues, Reservations) plus the pods
this binder committed itself that the informer has not delivered yet ("written": binds,
evictions, replacements), so back-to-back batches see each other. The informer keeps no bytes
of a pod that holds a claim (``keeps``): at a million bound pods that was ~280 bytes a pod in
the leader and again in its standby. What a decision reads of such a pod beyond its records
(a victim, an Evict target) the committer reads from the store per batch. Plain synchronous
code: informer handlers and the committer run on one event loop and never interleave
mid-update.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from placement.budgets import SelectorMembers
from placement.claims import CLAIM_PHASES, holds_claim
from placement.nodeinfo import NodeInfo, PodRequest
from placement.preemption import TemplateParts, shared_labels
from placement.quotas import DEFAULT_QUEUE
from placement.reservations import Reservations
from placement.resources import Quantities
from placement.topology import TopologyIndex
from protos.godel.v1 import objects_pb2 as pb
from services.grouped import GroupedNames
from store.client import POD_STARTED, Store
from store.encoded import EncodedObjects
from store.informer import Handlers, Informer
from store.kinds import S, StoredObject


class Informed(Protocol):
    """The informer's cache of a kind, typed by its message class (``Informer.objects``)."""

    def __call__(self, cls: type[S], /) -> Mapping[str, S]: ...


@dataclass(frozen=True, slots=True)
class PodOrigin:
    """What a placed pod has from its job, one record shared by the job's placed pods: the
    queue it counts in, its job, and its template's labels (what budgets select by)."""

    queue: str
    job: str
    labels: Mapping[str, str]


def keeps(kind: str, obj: StoredObject) -> bool:
    """What the Binder's informer keeps (its ``hold``): every object but a pod that holds a
    claim, which is its state's records alone."""
    return type(obj) is not pb.Pod or not holds_claim(obj)


def watched(store: Store) -> tuple[Informer, ClusterState]:
    """The Binder's informer and the state it feeds. A pod holding a claim is the state's
    records alone (``keeps``); the informer asks the state which such pods exist and what they
    were (``held_elsewhere``, ``recall``), so their changes and deletions are still delivered."""
    informer: Informer | None = None

    def informed(cls: type[S]) -> Mapping[str, S]:
        assert informer is not None
        return informer.objects(cls)

    state = ClusterState(informed)
    informer = Informer(
        store,
        ["Node", "Pod", "Job", "DisruptionBudget", "Queue", "Reservation"],
        hold=keeps,
        held_elsewhere=state.held_elsewhere,
        recall=state.recall,
        hinted=state.reads_hinted,
        take_listed={"Pod": state.take_listed},
    )
    informer.add_handlers(Handlers(state.on_add, state.on_update, state.on_delete))
    return informer, state


class ClusterState:
    def __init__(self, informed: Informed | None = None) -> None:
        """``informed(pb.Pod)``: the informer's cache of Pods (those ``keeps`` keeps) or Jobs,
        read through (None: fed by hand only, the state keeps its own)."""
        self.nodes: dict[str, pb.Node] = {}
        # NodeInfos exist for every known node and for any node a bound pod names (even if the
        # node object is gone: its pods still hold their claims).
        self.infos: dict[str, NodeInfo] = {}
        # The records of each placed pod (bound or running): its node (the node's own string),
        # its job's origin (shared), its request in its node's NodeInfo; those being deleted.
        self.pod_node: dict[str, str] = {}
        self.pod_origin: dict[str, PodOrigin] = {}
        self.deleting: set[str] = set()
        self._origins: dict[str, PodOrigin] = {}  # each job's last, by job
        self.job_pods = GroupedNames()  # pods holding a claim, by job
        # Every other pod (pending, finished), by job: with ``job_pods``, a job's pods' names,
        # which a replacement's name is chosen after (``names_of_job``).
        self.unplaced_job_pods = GroupedNames()
        # The resource version of each pod this binder wrote (bound, evicted, created) that the
        # informer has not delivered yet: an older state it delivers meanwhile is not applied.
        self.written: dict[str, int] = {}
        # The highest resource version of a pod the informer delivered: every change of the
        # feed up to it has been delivered (the feed is in revision order).
        self.seen_revision = 0
        self._informed = informed
        # A state fed by hand keeps the pods an informer would keep (``keeps``), and the jobs.
        self._own_pods: EncodedObjects[pb.Pod] | None = None
        self._own_jobs: dict[str, pb.Job] | None = None
        if informed is None:
            self._own_pods = EncodedObjects(pb.Pod)
            self._own_jobs = {}
        self.budgets: dict[str, pb.DisruptionBudget] = {}
        self.budget_members = SelectorMembers()  # pods of each label-selector budget
        # Pods per selector and topology domain, for the cross-node check of inter-pod affinity
        # and spread: built on first use (``pod_counts``), then kept by the placement bookkeeping.
        self.topology = TopologyIndex()
        self.anti_placed = 0  # placed pods with required anti-affinity terms
        # Each distinct pod template's part of a placed pod's records (its request's and its
        # labels), read once per template (placement.preemption): a job's pods share one.
        self.template_parts = TemplateParts()
        self.queues: dict[str, pb.Queue] = {}
        # What each queue's placed pods hold (their requests), kept as pods are placed and
        # unplaced: the Binder judges a binding against its queue's max without a scan.
        self.queue_usage: dict[str, Quantities] = {}
        # Live reservations: each holds its room on its node's NodeInfo (a hold), which only
        # its owner's pods may take (placement.reservations).
        self.reservations = Reservations()
        # Reservations named to a node and not yet committed there (``reserve.py`` does), and
        # whom to tell when one appears.
        self.pending_reservations: dict[str, pb.Reservation] = {}
        self.on_pending: Callable[[], None] | None = None

    @property
    def jobs(self) -> Mapping[str, pb.Job]:
        """Every job, by name; reads are fresh copies when read through the informer."""
        if self._own_jobs is not None:
            return self._own_jobs
        assert self._informed is not None
        return self._informed(pb.Job)

    def unplaced_pods(self) -> Mapping[str, pb.Pod]:
        """The pods whose bytes are kept (``keeps``: pending, finished), by name; reads are
        fresh copies."""
        if self._own_pods is not None:
            return self._own_pods
        assert self._informed is not None
        return self._informed(pb.Pod)

    # --- what the informer asks of the records of pods it does not keep ---------------------

    def held_elsewhere(self, kind: str) -> Collection[str]:
        """The pods the informer does not keep that exist (``Informer(held_elsewhere=)``)."""
        return self.pod_node if kind == "Pod" else ()

    def recall(self, kind: str, name: str) -> StoredObject:
        """A placed pod as its records outline it (``Informer(recall=)``): what the handlers
        read of a pod before (its name, job, node and phase; its template labels)."""
        pod = pb.Pod()
        pod.metadata.name = name
        origin = self.pod_origin.get(name)
        if origin is not None:
            pod.spec.job = origin.job
            pod.spec.template.labels.update(origin.labels)
        node = self.pod_node.get(name)
        if node is not None:
            pod.spec.node_name = node
            pod.status.phase = pb.POD_BOUND
        return pod

    def reads_hinted(self, kind: str, name: str, hint: bytes) -> bool:
        """Whether the informer reads a change its writer hinted (``Informer(hinted=)``): not
        a placed pod's start (``POD_STARTED``, from BOUND to RUNNING and its start time, node
        and claim kept), which changes nothing its records say — ``recall`` outlines it
        BOUND either way, and what a decision reads of a victim beyond them is read from the
        store. Anything else, and a pod the records do not place, is read."""
        return kind != "Pod" or hint[:1] != POD_STARTED or name not in self.pod_node

    # --- informer handlers ------------------------------------------------------------------

    # The handlers tell kinds apart by the object's class (the kind's message), which also
    # types it; ``kind`` says the same. ``type(obj) is``, not isinstance: an isinstance that
    # fails costs ~0.2 µs (the message classes' metaclass answers it), on every event.

    def on_add(self, kind: str, obj: StoredObject) -> None:
        if type(obj) is pb.Pod:
            self._set_pod(obj, None)
        elif type(obj) is pb.Node:
            self._set_node(obj)
        elif type(obj) is pb.Job:
            if self._own_jobs is not None:
                self._own_jobs[obj.metadata.name] = obj
        elif type(obj) is pb.DisruptionBudget:
            self.budgets[obj.metadata.name] = obj
            self.budget_members.set_budget(obj, self._every_pod())
        elif type(obj) is pb.Queue:
            self.queues[obj.metadata.name] = obj
        elif type(obj) is pb.Reservation:
            self.reservations.track(obj, self.infos, self.info_for)
            self._note_pending(obj)

    def on_update(self, kind: str, old: StoredObject, new: StoredObject) -> None:
        if type(new) is pb.Pod and type(old) is pb.Pod:
            self._set_pod(new, old)
        else:
            self.on_add(kind, new)

    def on_delete(self, kind: str, obj: StoredObject) -> None:
        if type(obj) is pb.Pod:
            name = obj.metadata.name
            job = obj.spec.job
            self._seen(obj)
            self._unplace(name, job)
            self.written.pop(name, None)
            if self._own_pods is not None:
                self._own_pods.pop(name, None)
            self.budget_members.remove_pod(name)
            self.unplaced_job_pods.discard(job, name)
        elif type(obj) is pb.Node:
            name = obj.metadata.name
            self.nodes.pop(name, None)
            if self.topology.active:
                self.topology.set_node(name, None)
            info = self.infos.get(name)
            if info is not None and not info.pods:
                del self.infos[name]
        elif type(obj) is pb.Job:
            if self._own_jobs is not None:
                self._own_jobs.pop(obj.metadata.name, None)
        elif type(obj) is pb.DisruptionBudget:
            self.budgets.pop(obj.metadata.name, None)
            self.budget_members.remove_budget(obj.metadata.name)
        elif type(obj) is pb.Queue:
            self.queues.pop(obj.metadata.name, None)
        elif type(obj) is pb.Reservation:
            self.consumed([obj.metadata.name])
            self.pending_reservations.pop(obj.metadata.name, None)

    def _note_pending(self, rsv: pb.Reservation) -> None:
        name = rsv.metadata.name
        waiting = (
            rsv.status.phase in (pb.RESERVATION_PHASE_UNSPECIFIED, pb.RESERVATION_PENDING)
            and bool(rsv.spec.node)
            and not rsv.metadata.deletion_timestamp_ms
        )
        if not waiting:
            self.pending_reservations.pop(name, None)
            return
        self.pending_reservations[name] = rsv
        if self.on_pending is not None:
            self.on_pending()

    def consumed(self, reservations: Iterable[str]) -> None:
        """Reservations gone (consumed by a commit of this binder, or deleted): their holds
        leave their nodes."""
        for name in reservations:
            for node in self.reservations.untrack(name, self.infos):
                info = self.infos[node]
                if not info.pods and node not in self.nodes:
                    del self.infos[node]

    def _set_node(self, node: pb.Node) -> None:
        name = node.metadata.name
        self.nodes[name] = node
        info = self.infos.get(name)
        if info is None:
            info = self.infos[name] = NodeInfo.from_node(node)
        else:
            info.set_node(node)
        if self.topology.active:
            self.topology.set_node(name, info.labels)

    def _every_pod(self) -> Iterator[tuple[str, str, Mapping[str, str]]]:
        """Every pod known, as (name, job, the template's labels): the placed from their
        records, the others read from the informer's cache (a budget appears: each tested
        once). A pod written by this binder and not yet delivered is tested when it is."""
        for name, origin in self.pod_origin.items():
            yield name, origin.job, origin.labels
        placed = self.pod_origin
        for name, pod in self.unplaced_pods().items():
            if name not in placed:
                yield name, pod.spec.job, pod.spec.template.labels

    def _seen(self, pod: pb.Pod) -> None:
        rv = pod.metadata.resource_version
        if rv > self.seen_revision:
            self.seen_revision = rv

    def _set_pod(self, pod: pb.Pod, previous: pb.Pod | None) -> None:
        """An informer event; ``previous``: the informer's state before it (its records'
        outline for a pod it does not keep)."""
        meta = pod.metadata
        rv = meta.resource_version
        if rv > self.seen_revision:
            self.seen_revision = rv
        name = meta.name
        ours = self.written.get(name)
        if ours is not None:
            if rv < ours:
                return  # an older state than our own write: the write stands
            del self.written[name]
        if self._own_pods is not None:
            if keeps("Pod", pod):
                self._own_pods[name] = pod
            else:
                self._own_pods.pop(name, None)
        self._apply(pod, previous)

    def take_listed(self, pod: pb.Pod) -> bool:
        """A pod of the Binder's (re)start listing (``Informer(take_listed=)``): one holding a
        claim (which ``keeps`` refuses) recorded as ``on_add`` would, and True; any other,
        False, and the informer hands it on as usual. Every bound pod of the cluster comes
        through here when the Binder or its standby starts: read once (not by ``keeps`` and
        again by the handler), its template's part shared with the other pods of its template
        (``template_parts``), and its resource version not set nor read: the informer's
        revision once listed covers every listed pod's, which is all ``record_written`` asks
        of it."""
        meta, spec = pod.metadata, pod.spec
        # Offered a first listing's pods only (no pod known before): none placed yet. A write
        # of this binder's not yet delivered is judged against its version: not taken.
        if not spec.node_name or pod.status.phase not in CLAIM_PHASES or self.written:
            return False
        name = meta.name
        self.budget_members.set_pod(pod)
        self._place(meta, spec, name, spec.job, listed=True)
        if meta.deletion_timestamp_ms:
            self.deleting.add(name)
        return True

    def _apply(self, pod: pb.Pod, previous: pb.Pod | None) -> None:
        # The name and the job read once and handed on (a protobuf field read is ~0.3 µs).
        meta, spec = pod.metadata, pod.spec
        name = meta.name
        job = spec.job
        # Labels compared only while a selector budget is kept (a map comparison is ~2 µs;
        # with none kept ``set_pod`` tests nothing, and a budget added later tests every pod).
        if self.budget_members and (
            previous is None or previous.spec.template.labels != spec.template.labels
        ):
            self.budget_members.set_pod(pod)
        if spec.node_name and pod.status.phase in CLAIM_PHASES:  # holds_claim, fields read
            self._place(meta, spec, name, job)
            self.unplaced_job_pods.discard(job, name)
            if meta.deletion_timestamp_ms:
                self.deleting.add(name)
            elif self.deleting:
                self.deleting.discard(name)
        else:
            self._unplace(name, job)
            self.unplaced_job_pods.add(job, name)

    # --- placement bookkeeping --------------------------------------------------------------

    def info_for(self, node: str) -> NodeInfo:
        info = self.infos.get(node)
        if info is None:
            info = self.infos[node] = NodeInfo(node, ready=False)
        return info

    def _place(
        self, meta: pb.ObjectMeta, spec: pb.PodSpec, name: str, job: str, *, listed: bool = False
    ) -> None:
        """Account the pod with this metadata and spec (read once by the caller) on its node.
        ``name``: the pod's, one string shared by every index of it (the placed pods' maps,
        the node's request, the job's names). ``listed``: of a first listing, so not placed
        yet (a look-up in a million records less per pod of a start)."""
        node = spec.node_name
        if not listed:
            current = self.pod_node.get(name)
            if current == node:
                return
            if current is not None:
                self._unplace(name, job)
        # A job's pods share one template: its part (requests, ports, anti-affinity, NUMA
        # policy, GPU models, labels) read once, not once a pod.
        part = self.template_parts.of(spec)
        req = PodRequest.from_parts(meta, spec, name, part.request)
        info = self.infos.get(node)
        if info is None:
            info = self.info_for(node)
        info.add_pod(req)
        if req.anti_terms:
            self.anti_placed += 1
        if self.topology.active:
            self.topology.add(node, req)
        self.pod_node[name] = info.name  # the node's own string, not a copy per pod
        self.job_pods.add(job, name)
        # The job's shared record, unless the pod's queue or labels are not the job's last.
        queue = spec.queue or DEFAULT_QUEUE
        labels = part.labels
        origin = self._origins.get(job)
        if (
            origin is None
            or origin.queue != queue
            or (origin.labels is not labels and origin.labels != labels)
        ):
            origin = self._origins[job] = PodOrigin(sys.intern(queue), job, labels)
        self.pod_origin[name] = origin
        usage = self.queue_usage.get(origin.queue)
        if usage is None:
            usage = self.queue_usage[origin.queue] = Quantities()
        usage.add(req.requests)

    def _unplace(self, name: str, job: str) -> None:
        node = self.pod_node.pop(name, None)
        if node is None:
            return
        info = self.infos.get(node)
        origin = self.pod_origin.pop(name, None)
        self.deleting.discard(name)
        if info is not None:
            req = info.remove_pod(name)
            self.anti_placed -= bool(req is not None and req.anti_terms)
            if req is not None and origin is not None:
                self.queue_usage[origin.queue].add(req.requests, -1)
            if not info.pods and node not in self.nodes:
                del self.infos[node]
        if self.topology.active:
            self.topology.remove(name)
        self.job_pods.discard(job, name)
        if origin is not None and not self.job_pods.count(origin.job):
            self._origins.pop(origin.job, None)

    def held_by(self, name: str) -> tuple[str, Quantities] | None:
        """The queue a placed pod counts in and what it holds there (None: not placed)."""
        node, origin = self.pod_node.get(name), self.pod_origin.get(name)
        info = self.infos.get(node) if node is not None else None
        req = info.pods.get(name) if info is not None else None
        return (origin.queue, req.requests) if origin is not None and req is not None else None

    def pod_counts(self) -> TopologyIndex:
        """The topology index, built from every placed pod on first use."""
        if not self.topology.active:
            self.topology.activate(self.infos.values(), present=self.nodes)
        return self.topology

    def record_written(self, pod: pb.Pod, delivered_through: int) -> None:
        """Account a pod this binder just wrote (bound, evicted or created), unless the
        informer delivered that write already: it has delivered every change up to
        ``delivered_through`` (its revision) and to the newest pod it handed over."""
        rv = pod.metadata.resource_version
        if rv <= delivered_through or rv <= self.seen_revision:
            return  # the informer got there first and may already know later states
        self._apply(pod, None)
        self.written[pod.metadata.name] = rv
        if self._own_pods is not None:
            if keeps("Pod", pod):
                self._own_pods[pod.metadata.name] = pod
            else:
                self._own_pods.pop(pod.metadata.name, None)

    def names_of_job(self, job: str) -> Iterator[str]:
        """The names of the job's pods, any phase."""
        yield from self.job_pods.get(job)
        yield from self.unplaced_job_pods.get(job)

    def bound_count(self, job: str) -> int:
        return self.job_pods.count(job)


_NO_LABELS: Mapping[str, str] = shared_labels({})
