"""The binder's authoritative view: a NodeInfo per node holding every bound, non-terminal pod
and every live reservation's hold, every pod as last written (for victims' re-validation and
disruption budgets), jobs, budgets, queues and what each queue's bound pods hold (for its max).

Fed by the informer (Nodes, Pods, Jobs, DisruptionBudgets, Queues, Reservations) plus the pods
this binder committed itself that the informer has not delivered yet ("assumed": binds,
evictions, replacements), so back-to-back batches see each other (``PodBook``). Pod reads are
fresh copies: a change to one is kept only by writing it. Plain synchronous code: informer
handlers and the committer run on one event loop and never interleave mid-update.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

from placement.budgets import SelectorMembers
from placement.claims import holds_claim
from placement.nodeinfo import NodeInfo, PodRequest
from placement.quotas import queue_of
from placement.reservations import Reservations
from placement.resources import Quantities
from placement.topology import TopologyIndex
from protos.godel.v1 import objects_pb2 as pb
from services.grouped import GroupedNames
from store.encoded import EncodedObjects
from store.kinds import S, StoredObject


class Informed(Protocol):
    """The informer's cache of a kind, typed by its message class (``Informer.objects``)."""

    def __call__(self, cls: type[S], /) -> Mapping[str, S]: ...


class PodBook(Mapping[str, pb.Pod]):
    """Every pod as the Binder knows it, any phase: the informer's copy, or this binder's own
    write (``written``: bound, evicted or created) until the informer shows that revision, so
    back-to-back batches see each other. Each pod is held once in the process: the informer
    keeps pods encoded (store.encoded) and the book reads them there; a state fed by hand (no
    informer: ``informed`` None) keeps its own encoded copies. Reads are fresh copies."""

    def __init__(self, informed: Callable[[], Mapping[str, pb.Pod]] | None) -> None:
        self._own: EncodedObjects[pb.Pod] | None = None
        if informed is None:
            own = self._own = EncodedObjects(pb.Pod)
            informed = lambda: own  # noqa: E731
        # A function, not the mapping: the informer swaps in a new one when it relists.
        self._informed = informed
        self.written: dict[str, pb.Pod] = {}

    def seen(self, pod: pb.Pod) -> None:
        """The informer delivered ``pod`` (already in its cache; kept here if fed by hand)."""
        if self._own is not None:
            self._own[pod.metadata.name] = pod

    def forget(self, name: str) -> None:
        self.written.pop(name, None)
        if self._own is not None:
            self._own.pop(name, None)

    def __getitem__(self, name: str) -> pb.Pod:
        written = self.written.get(name)
        if written is not None:
            return written
        return self._informed()[name]

    def __contains__(self, name: object) -> bool:
        return name in self.written or name in self._informed()

    def __iter__(self) -> Iterator[str]:
        informed = self._informed()
        yield from informed
        yield from (n for n in self.written if n not in informed)

    def __len__(self) -> int:
        informed = self._informed()
        return len(informed) + sum(1 for n in self.written if n not in informed)


class ClusterState:
    def __init__(self, informed: Informed | None = None) -> None:
        """``informed(pb.Pod)``: the informer's cache of Pods or Jobs, read through (None: fed
        by hand only, the state keeps its own)."""
        self.nodes: dict[str, pb.Node] = {}
        # NodeInfos exist for every known node and for any node a bound pod names (even if the
        # node object is gone: its pods still hold their claims).
        self.infos: dict[str, NodeInfo] = {}
        self.pod_node: dict[str, str] = {}
        self.job_pods = GroupedNames()  # pods holding a claim, by job
        self.pods = PodBook(None if informed is None else lambda: informed(pb.Pod))
        self.all_job_pods = GroupedNames()  # every pod, by job (replacement names)
        # Jobs are read through the informer's cache (held encoded: as many as pods with
        # one-pod jobs); a state fed by hand keeps them here.
        self._informed = informed
        self._own_jobs: dict[str, pb.Job] | None = {} if informed is None else None
        self.budgets: dict[str, pb.DisruptionBudget] = {}
        self.budget_members = SelectorMembers()  # pods of each label-selector budget
        # Pods per selector and topology domain, for the cross-node check of inter-pod affinity
        # and spread: built on first use (``pod_counts``), then kept by the placement bookkeeping.
        self.topology = TopologyIndex()
        self.anti_placed = 0  # placed pods with required anti-affinity terms
        self.queues: dict[str, pb.Queue] = {}
        # What each queue's placed pods hold (their requests), kept as pods are placed and
        # unplaced, and the queue each placed pod counts in: the Binder judges a binding against
        # its queue's max without a scan.
        self.queue_usage: dict[str, Quantities] = {}
        self.pod_queue: dict[str, str] = {}
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
            self.budget_members.set_budget(obj, self.pods.values())
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
            self._unplace(name, job)
            self.pods.forget(name)
            self.budget_members.remove_pod(name)
            self.all_job_pods.discard(job, name)
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

    def _set_pod(self, pod: pb.Pod, previous: pb.Pod | None) -> None:
        """An informer event; ``previous``: the informer's state before it."""
        name = pod.metadata.name
        ours = self.pods.written.get(name)
        if ours is not None:
            if pod.metadata.resource_version < ours.metadata.resource_version:
                return  # an older state than our own write: the write stands
            del self.pods.written[name]
            previous = ours
        self.pods.seen(pod)
        self._apply(pod, previous)

    def _apply(self, pod: pb.Pod, previous: pb.Pod | None) -> None:
        # The name and the job read once and handed on (every bound pod comes through here
        # when the Binder (re)starts, and a protobuf field read is ~0.3 µs).
        name = pod.metadata.name
        job = pod.spec.job
        if previous is None or previous.spec.template.labels != pod.spec.template.labels:
            self.budget_members.set_pod(pod)
        self.all_job_pods.add(job, name)
        if holds_claim(pod):
            self._place(pod, name, job)
        else:
            self._unplace(name, job)

    # --- placement bookkeeping --------------------------------------------------------------

    def info_for(self, node: str) -> NodeInfo:
        info = self.infos.get(node)
        if info is None:
            info = self.infos[node] = NodeInfo(node, ready=False)
        return info

    def _place(self, pod: pb.Pod, name: str, job: str) -> None:
        """``name``: the pod's, one string shared by every index of it (the placed pods' maps,
        the node's request, the job's names)."""
        spec = pod.spec
        node = spec.node_name
        current = self.pod_node.get(name)
        if current == node:
            return
        if current is not None:
            self._unplace(name, job)
        req = PodRequest.from_parts(pod.metadata, spec, name)
        info = self.info_for(node)
        info.add_pod(req)
        self.anti_placed += bool(req.anti_terms)
        if self.topology.active:
            self.topology.add(node, req)
        self.pod_node[name] = info.name  # the node's own string, not a copy per pod
        self.job_pods.add(job, name)
        queue = self.pod_queue[name] = sys.intern(queue_of(pod))
        usage = self.queue_usage.get(queue)
        if usage is None:
            usage = self.queue_usage[queue] = Quantities()
        usage.add(req.requests)

    def _unplace(self, name: str, job: str) -> None:
        node = self.pod_node.pop(name, None)
        if node is None:
            return
        info = self.infos.get(node)
        queue = self.pod_queue.pop(name, None)
        if info is not None:
            req = info.remove_pod(name)
            self.anti_placed -= bool(req is not None and req.anti_terms)
            if req is not None and queue is not None:
                self.queue_usage[queue].add(req.requests, -1)
            if not info.pods and node not in self.nodes:
                del self.infos[node]
        if self.topology.active:
            self.topology.remove(name)
        self.job_pods.discard(job, name)

    def held_by(self, name: str) -> tuple[str, Quantities] | None:
        """The queue a placed pod counts in and what it holds there (None: not placed)."""
        node, queue = self.pod_node.get(name), self.pod_queue.get(name)
        info = self.infos.get(node) if node is not None else None
        req = info.pods.get(name) if info is not None else None
        return (queue, req.requests) if queue is not None and req is not None else None

    def pod_counts(self) -> TopologyIndex:
        """The topology index, built from every placed pod on first use."""
        if not self.topology.active:
            self.topology.activate(self.infos.values(), present=self.nodes)
        return self.topology

    def record_written(self, pod: pb.Pod, seen: pb.Pod | None) -> None:
        """Account a pod this binder just wrote (bound, evicted or created). ``seen`` is what
        the informer already shows of it (None if nothing), so a write the informer delivered
        first is not re-assumed; it is also the pod as it was, unless a write of ours not yet
        seen is newer (handed in: the book would decode the informer's copy a second time)."""
        if seen is not None and seen.metadata.resource_version >= pod.metadata.resource_version:
            return  # the informer got there first and may already know later states
        name = pod.metadata.name
        self._apply(pod, self.pods.written.get(name, seen))
        self.pods.written[name] = pod

    def pods_of_job(self, job: str) -> list[pb.Pod]:
        """The job's pods, any phase."""
        return [self.pods[n] for n in self.all_job_pods.get(job)]

    def placed_pods(self, job: str) -> list[pb.Pod]:
        """The job's pods that hold a claim (bound or running)."""
        return [self.pods[n] for n in self.job_pods.get(job) if n in self.pods]

    def bound_count(self, job: str) -> int:
        return self.job_pods.count(job)
