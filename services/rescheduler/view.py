"""Building a round's ClusterView from the stored objects.

Every bound, non-terminal pod is accounted on its node (as the shards and the Binder account
them); pending pods are kept for PendingChecker; the scope is the nodes whose labels carry every
pair of the policy's selector.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from placement.framework import Framework, PodInfo
from placement.nodeinfo import NodeInfo
from protos.godel.v1 import objects_pb2 as pb
from services.rescheduler.framework import ClusterView, RunningPod

_TERMINAL = (pb.POD_SUCCEEDED, pb.POD_FAILED)


def build_view(
    nodes: Iterable[pb.Node],
    pods: Iterable[pb.Pod],
    jobs: Iterable[pb.Job],
    budgets: Iterable[pb.DisruptionBudget],
    framework: Framework,
    *,
    scope_labels: Mapping[str, str] | None = None,
    revision: int = 0,
) -> ClusterView:
    infos = {n.metadata.name: NodeInfo.from_node(n) for n in nodes}
    running: dict[str, RunningPod] = {}
    pending: list[pb.Pod] = []
    for pod in pods:
        if pod.status.phase in _TERMINAL or pod.metadata.deletion_timestamp_ms:
            continue
        node = pod.spec.node_name
        if not node:
            if pod.status.phase == pb.POD_PENDING:
                pending.append(pod)
            continue
        info = infos.get(node)
        if info is None:
            continue  # its node is gone: nothing to move it from
        pod_info = PodInfo.from_pod(pod, keyed=False)
        info.add_pod(pod_info.req)
        running[pod.metadata.name] = RunningPod(pod, pod_info)
    selector = dict(scope_labels or {})
    scope = frozenset(
        name
        for name, info in infos.items()
        if all(info.labels.get(k) == v for k, v in selector.items())
    )
    return ClusterView(
        nodes=infos,
        pods=running,
        jobs={j.metadata.name: j for j in jobs},
        framework=framework,
        pending=pending,
        budgets=list(budgets),
        scope=scope,
        scope_labels=selector,
        revision=revision,
    )
