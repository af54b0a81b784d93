"""The binder's authoritative view: a NodeInfo per node holding every bound, non-terminal pod,
every pod as last written (for victims' re-validation and disruption budgets), jobs and budgets.

Fed by the informer (Nodes, Pods, Jobs, DisruptionBudgets) plus the pods this binder committed
itself that the informer has not delivered yet ("assumed": binds, evictions, replacements), so
back-to-back batches see each other. Pods are held encoded (store.encoded): each read is a fresh
copy, so a change to it is only kept by writing it back. Plain synchronous code: informer handlers and the committer run
on one event loop and never interleave mid-update.
"""

from __future__ import annotations

from google.protobuf.message import Message

from placement.budgets import SelectorMembers
from placement.nodeinfo import NodeInfo, PodRequest
from placement.topology import TopologyIndex
from protos.godel.v1 import objects_pb2 as pb
from store.encoded import EncodedObjects

TERMINAL = frozenset({pb.POD_SUCCEEDED, pb.POD_FAILED})


def holds_claim(pod: pb.Pod) -> bool:
    """Whether the pod occupies room on its node (bound and not finished)."""
    return bool(pod.spec.node_name) and pod.status.phase not in TERMINAL


class ClusterState:
    def __init__(self) -> None:
        self.nodes: dict[str, pb.Node] = {}
        # NodeInfos exist for every known node and for any node a bound pod names (even if the
        # node object is gone: its pods still hold their claims).
        self.infos: dict[str, NodeInfo] = {}
        self.pod_node: dict[str, str] = {}
        self.job_pods: dict[str, set[str]] = {}  # pods holding a claim, by job
        # Every pod, any phase, held encoded (a million decoded pods are 2.5 GiB): reads decode.
        self.pods: EncodedObjects[pb.Pod] = EncodedObjects(pb.Pod)
        self.all_job_pods: dict[str, set[str]] = {}  # every pod, by job (replacement names)
        self.jobs: dict[str, pb.Job] = {}
        self.budgets: dict[str, pb.DisruptionBudget] = {}
        self.budget_members = SelectorMembers()  # pods of each label-selector budget
        # Pods this binder wrote -> revision of the write, until the informer shows that revision.
        self.assumed: dict[str, int] = {}
        # Pods per selector and topology domain, for the cross-node check of inter-pod affinity
        # and spread: built on first use (``pod_counts``), then kept by the placement bookkeeping.
        self.topology = TopologyIndex()
        self.anti_placed = 0  # placed pods with required anti-affinity terms

    # --- informer handlers ------------------------------------------------------------------

    def on_add(self, kind: str, obj: Message) -> None:
        if kind == "Node":
            self._set_node(obj)  # type: ignore[arg-type]
        elif kind == "Pod":
            self._set_pod(obj)  # type: ignore[arg-type]
        elif kind == "Job":
            self.jobs[obj.metadata.name] = obj  # type: ignore[attr-defined,assignment]
        elif kind == "DisruptionBudget":
            self.budgets[obj.metadata.name] = obj  # type: ignore[attr-defined,assignment]
            self.budget_members.set_budget(obj, self.pods.values())  # type: ignore[arg-type]

    def on_update(self, kind: str, _old: Message, new: Message) -> None:
        self.on_add(kind, new)

    def on_delete(self, kind: str, obj: Message) -> None:
        if kind == "Node":
            name = obj.metadata.name  # type: ignore[attr-defined]
            self.nodes.pop(name, None)
            if self.topology.active:
                self.topology.set_node(name, None)
            info = self.infos.get(name)
            if info is not None and not info.pods:
                del self.infos[name]
        elif kind == "Pod":
            name = obj.metadata.name  # type: ignore[attr-defined]
            job = obj.spec.job  # type: ignore[attr-defined]
            self.assumed.pop(name, None)
            self._unplace(name, job)
            self.pods.pop(name, None)
            self.budget_members.remove_pod(name)
            members = self.all_job_pods.get(job)
            if members is not None:
                members.discard(name)
                if not members:
                    del self.all_job_pods[job]
        elif kind == "Job":
            self.jobs.pop(obj.metadata.name, None)  # type: ignore[attr-defined]
        elif kind == "DisruptionBudget":
            self.budgets.pop(obj.metadata.name, None)  # type: ignore[attr-defined]
            self.budget_members.remove_budget(obj.metadata.name)  # type: ignore[attr-defined]

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

    def _set_pod(self, pod: pb.Pod) -> None:
        name = pod.metadata.name
        bound_at = self.assumed.get(name)
        if bound_at is not None:
            if pod.metadata.resource_version < bound_at:
                return  # an older state than our own bind: the bind stands
            del self.assumed[name]
        self._apply(pod)

    def _apply(self, pod: pb.Pod) -> None:
        name = pod.metadata.name
        old = self.pods.get(name)
        if old is None or old.spec.template.labels != pod.spec.template.labels:
            self.budget_members.set_pod(pod)
        self.pods[name] = pod
        self.all_job_pods.setdefault(pod.spec.job, set()).add(name)
        if holds_claim(pod):
            self._place(pod)
        else:
            self._unplace(name, pod.spec.job)

    # --- placement bookkeeping --------------------------------------------------------------

    def info_for(self, node: str) -> NodeInfo:
        info = self.infos.get(node)
        if info is None:
            info = self.infos[node] = NodeInfo(node, ready=False)
        return info

    def _place(self, pod: pb.Pod) -> None:
        name, node = pod.metadata.name, pod.spec.node_name
        current = self.pod_node.get(name)
        if current == node:
            return
        if current is not None:
            self._unplace(name, pod.spec.job)
        req = PodRequest.from_pod(pod)
        self.info_for(node).add_pod(req)
        self.anti_placed += bool(req.anti_terms)
        if self.topology.active:
            self.topology.add(node, req)
        self.pod_node[name] = node
        self.job_pods.setdefault(pod.spec.job, set()).add(name)

    def _unplace(self, name: str, job: str) -> None:
        node = self.pod_node.pop(name, None)
        if node is None:
            return
        info = self.infos.get(node)
        if info is not None:
            req = info.remove_pod(name)
            self.anti_placed -= bool(req is not None and req.anti_terms)
            if not info.pods and node not in self.nodes:
                del self.infos[node]
        if self.topology.active:
            self.topology.remove(name)
        members = self.job_pods.get(job)
        if members is not None:
            members.discard(name)
            if not members:
                del self.job_pods[job]

    def pod_counts(self) -> TopologyIndex:
        """The topology index, built from every placed pod on first use."""
        if not self.topology.active:
            self.topology.activate(self.infos.values(), present=self.nodes)
        return self.topology

    def record_written(self, pod: pb.Pod, seen_revision: int) -> None:
        """Account a pod this binder just wrote (bound, evicted or created). ``seen_revision`` is
        what the informer already shows of it (0 if nothing), so a write the informer delivered
        first is not re-assumed."""
        if seen_revision >= pod.metadata.resource_version:
            return  # the informer got there first and may already know later states
        self._apply(pod)
        self.assumed[pod.metadata.name] = pod.metadata.resource_version

    def pods_of_job(self, job: str) -> list[pb.Pod]:
        """The job's pods, any phase."""
        return [self.pods[n] for n in self.all_job_pods.get(job, ())]

    def placed_pods(self, job: str) -> list[pb.Pod]:
        """The job's pods that hold a claim (bound or running)."""
        return [self.pods[n] for n in self.job_pods.get(job, ()) if n in self.pods]

    def bound_count(self, job: str) -> int:
        return len(self.job_pods.get(job, ()))
