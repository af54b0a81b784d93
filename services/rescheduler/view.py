"""Building a round's ClusterView from the stored objects.

Every bound, non-terminal pod and every live reservation's hold is accounted on its node (as
the shards and the Binder account them: a move never lands in room kept for another's pods); pending pods are kept for PendingChecker; the scope is the nodes whose labels carry every
pair of the policy's selector.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from placement.claims import TERMINAL_PHASES
from placement.framework import Framework, PodInfo
from placement.nodeinfo import NodeInfo
from placement.reservations import hold_request, holds_room
from protos.godel.v1 import objects_pb2 as pb
from services.rescheduler.framework import ClusterView, RunningPod


class PodInfoCache:
    """Pods' PodInfo by name and resource_version (PodInfos are never mutated by a round)."""

    def __init__(self) -> None:
        self._infos: dict[str, tuple[int, PodInfo]] = {}

    def get(self, pod: pb.Pod) -> PodInfo:
        name, version = pod.metadata.name, pod.metadata.resource_version
        hit = self._infos.get(name)
        if hit is not None and hit[0] == version:
            return hit[1]
        info = PodInfo.from_pod(pod, keyed=False)
        self._infos[name] = (version, info)
        return info

    def keep_only(self, names: set[str]) -> None:
        for gone in self._infos.keys() - names:
            del self._infos[gone]


def build_view(
    nodes: Iterable[pb.Node],
    pods: Iterable[pb.Pod],
    jobs: Iterable[pb.Job],
    budgets: Iterable[pb.DisruptionBudget],
    framework: Framework,
    *,
    scope_labels: Mapping[str, str] | None = None,
    revision: int = 0,
    pod_infos: PodInfoCache | None = None,
    loads: Mapping[str, pb.NodeLoad] | None = None,
    reservations: Iterable[pb.Reservation] = (),
) -> ClusterView:
    """``pod_infos`` carries pods' converted form from one round to the next (a pod that has not
    changed is not converted again). ``loads``: nodes' measured load (fresh reports only)."""
    infos = {n.metadata.name: NodeInfo.from_node(n) for n in nodes}
    cache = pod_infos if pod_infos is not None else PodInfoCache()
    seen: set[str] = set()
    running: dict[str, RunningPod] = {}
    pending: list[pb.Pod] = []
    for pod in pods:
        if pod.status.phase in TERMINAL_PHASES or pod.metadata.deletion_timestamp_ms:
            continue
        node = pod.spec.node_name
        if not node:
            if pod.status.phase == pb.POD_PENDING:
                pending.append(pod)
            continue
        info = infos.get(node)
        if info is None:
            continue  # its node is gone: nothing to move it from
        pod_info = cache.get(pod)
        seen.add(pod.metadata.name)
        info.add_pod(pod_info.req)
        running[pod.metadata.name] = RunningPod.of(pod, pod_info)
    cache.keep_only(seen)
    for rsv in reservations:
        info = infos.get(rsv.status.node)
        if info is not None and holds_room(rsv):
            info.add_pod(hold_request(rsv))
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
        loads={name: load for name, load in (loads or {}).items() if name in infos},
    )


def fresh_loads(
    loads: Mapping[str, pb.NodeLoad], now_ms: int, max_age_ms: int
) -> dict[str, pb.NodeLoad]:
    """The loads measured at most ``max_age_ms`` ago: an agent that stopped reporting (dead, or
    cut off) leaves its nodes with no measurement, so they are judged by their requests."""
    return {name: load for name, load in loads.items() if now_ms - load.measured_ms <= max_age_ms}
