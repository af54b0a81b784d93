"""The binder's authoritative view: a NodeInfo per node holding every bound, non-terminal pod.

Fed by the informer (Nodes and Pods) plus the pods this binder committed itself that the informer
has not delivered yet ("assumed"), so back-to-back batches see each other. Plain synchronous code:
informer handlers and the committer run on one event loop and never interleave mid-update.
"""

from __future__ import annotations

from google.protobuf.message import Message

from placement.nodeinfo import NodeInfo, PodRequest
from protos.godel.v1 import objects_pb2 as pb

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
        self.job_pods: dict[str, set[str]] = {}
        # Pods this binder bound -> revision of the bind, until the informer shows that revision.
        self.assumed: dict[str, int] = {}

    # --- informer handlers ------------------------------------------------------------------

    def on_add(self, kind: str, obj: Message) -> None:
        if kind == "Node":
            self._set_node(obj)  # type: ignore[arg-type]
        elif kind == "Pod":
            self._set_pod(obj)  # type: ignore[arg-type]

    def on_update(self, kind: str, _old: Message, new: Message) -> None:
        self.on_add(kind, new)

    def on_delete(self, kind: str, obj: Message) -> None:
        if kind == "Node":
            name = obj.metadata.name  # type: ignore[attr-defined]
            self.nodes.pop(name, None)
            info = self.infos.get(name)
            if info is not None and not info.pods:
                del self.infos[name]
        elif kind == "Pod":
            name = obj.metadata.name  # type: ignore[attr-defined]
            self.assumed.pop(name, None)
            self._unplace(name, obj.spec.job)  # type: ignore[attr-defined]

    def _set_node(self, node: pb.Node) -> None:
        name = node.metadata.name
        self.nodes[name] = node
        info = self.infos.get(name)
        if info is None:
            self.infos[name] = NodeInfo.from_node(node)
        else:
            info.set_node(node)

    def _set_pod(self, pod: pb.Pod) -> None:
        name = pod.metadata.name
        bound_at = self.assumed.get(name)
        if bound_at is not None:
            if pod.metadata.resource_version < bound_at:
                return  # an older state than our own bind: the bind stands
            del self.assumed[name]
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
        self.info_for(node).add_pod(PodRequest.from_pod(pod))
        self.pod_node[name] = node
        self.job_pods.setdefault(pod.spec.job, set()).add(name)

    def _unplace(self, name: str, job: str) -> None:
        node = self.pod_node.pop(name, None)
        if node is None:
            return
        info = self.infos.get(node)
        if info is not None:
            info.remove_pod(name)
            if not info.pods and node not in self.nodes:
                del self.infos[node]
        members = self.job_pods.get(job)
        if members is not None:
            members.discard(name)
            if not members:
                del self.job_pods[job]

    def record_bound(self, pod: pb.Pod, seen_revision: int) -> None:
        """Account a pod this binder just bound. ``seen_revision`` is what the informer already
        shows of it (0 if nothing), so a bind the informer delivered first is not re-assumed."""
        if seen_revision >= pod.metadata.resource_version:
            return  # the informer got there first and may already know later states
        self._place(pod)
        self.assumed[pod.metadata.name] = pod.metadata.resource_version

    def bound_count(self, job: str) -> int:
        return len(self.job_pods.get(job, ()))
