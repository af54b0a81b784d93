"""The rescheduler's plugin API: the cluster view a round plans against, moves, and the three
kinds of plugin a policy names.

A **detector** finds what is wrong (nodes to drain, pods to move); an **algorithm** proposes moves
(pod, from, to) that repair it; a **check** vetoes single moves (protection, budgets, throttles).
One class may be all three, as in the original (BinPacking detects and reschedules). Plugins are
plain synchronous code over :class:`ClusterView`: a round gives each plugin its own copy.

"Would this pod fit there" is always :meth:`ClusterView.fits`, which runs the placement library's
filters (``placement.framework``) — the same code the shards and the Binder run — so a new filter
constrains the rescheduler too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

from placement.framework import Framework, JobAffinity, PodInfo, Status
from placement.gpu import pin_cards, verify_cards
from placement.gpufrag import Policy as GpuPolicy
from placement.nodeinfo import GUARANTEED, NodeInfo
from placement.plugins import joblevelaffinity
from placement.plugins.numatopology import pin_numa
from placement.topology import TopologyIndex
from protos.godel.v1 import objects_pb2 as pb

# A pod (or its job) labelled or annotated with this, "true", is never moved (the Protection check).
EXCLUDE_FROM_RESCHEDULING = "godel.io/exclude-from-rescheduling"

# Resource names plugins' args use, and their index in NodeInfo's [cpu, memory, gpu] lists.
RESOURCE_INDEX = {"cpu": 0, "memory": 1, "gpu": 2}


@dataclass(frozen=True, slots=True)
class Move:
    """Evict ``pod`` from ``source``; its replacement should land on ``target``."""

    pod: str
    job: str
    source: str
    target: str


@dataclass(frozen=True, slots=True)
class Detection:
    """A node a detector wants relieved: its ``pods`` (empty = any of them), and why."""

    node: str
    reason: str
    pods: tuple[str, ...] = ()


@dataclass(slots=True)
class RunningPod:
    """A bound or running pod as plans see it. ``node`` is where the plan has it now (moves
    change it). The stored pod is kept encoded (a round over a million pods held each decoded:
    2.6 GiB; see store.encoded): ``pod`` reads a copy, which changes nothing here."""

    encoded: bytes
    info: PodInfo
    node: str
    job: str
    # The node the pod runs on in the cluster (``info.req`` holds its cards there); "" = ``node``.
    home: str = ""

    def __post_init__(self) -> None:
        if not self.home:
            self.home = self.node

    @classmethod
    def of(cls, pod: pb.Pod, info: PodInfo) -> RunningPod:
        return cls(pod.SerializeToString(), info, pod.spec.node_name, sys.intern(pod.spec.job))

    @property
    def pod(self) -> pb.Pod:
        return pb.Pod.FromString(self.encoded)

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def pool(self) -> str:
        return self.info.req.pool


@dataclass
class ClusterView:
    """Nodes (NodeInfos with every bound, non-terminal pod accounted), those pods, their jobs,
    the pending pods, and the disruption budgets: one consistent copy per round.

    ``scope`` is the policy's node scope (by labels): detectors look only there and algorithms
    target only there. ``move`` updates the view as if a move had happened, so later decisions
    of the same round see the earlier ones, and tells ``move_listener`` (pod, from, to) if one is
    set: the round counts the moves an algorithm makes that way (see round.py).
    """

    nodes: dict[str, NodeInfo]
    pods: dict[str, RunningPod]
    jobs: dict[str, pb.Job]
    framework: Framework
    pending: list[pb.Pod] = field(default_factory=list)
    budgets: list[pb.DisruptionBudget] = field(default_factory=list)
    scope: frozenset[str] = frozenset()
    # The label selector that chose ``scope`` (empty: every node).
    scope_labels: dict[str, str] = field(default_factory=dict)
    revision: int = 0
    # Nodes' measured load as their agents last reported it (fresh ones only; a node without
    # one has no measurement): read-only, LoadBalance's basis.
    loads: dict[str, pb.NodeLoad] = field(default_factory=dict)
    # Hears of every move made with ``move`` (pod, from, to), undoing ones included; a copy of
    # the view starts without one.
    move_listener: Callable[[str, str, str], None] | None = field(default=None, repr=False)
    # How a GPU share's card is chosen on a pod's new node (``placement.gpu.choose_cards``):
    # the round sets the shards' score's policy over the running pods' shapes; None: best fit.
    share_policy: GpuPolicy | None = field(default=None, repr=False)
    _by_node: dict[str, set[str]] = field(default_factory=dict, repr=False)
    # Pods counted by topology domain, for inter-pod affinity and spread (the rules that look
    # beyond the target node); built on first need, kept in step by ``move`` and ``remove``.
    _topology: TopologyIndex | None = field(default=None, repr=False)
    # Whether some placed pod has required anti-affinity (None: not looked yet): without one, a
    # pod with no topology rule of its own needs no counts, and the index is never built.
    _anti_placed: bool | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.scope and not self.scope_labels:
            self.scope = frozenset(self.nodes)
        self._by_node = {name: set() for name in self.nodes}
        for running in self.pods.values():
            self._by_node.setdefault(running.node, set()).add(running.name)

    # -- reading -----------------------------------------------------------------------------

    def scoped_nodes(self) -> list[NodeInfo]:
        """The in-scope nodes, by name."""
        return [self.nodes[n] for n in sorted(self.scope) if n in self.nodes]

    def pods_on(self, node: str) -> list[RunningPod]:
        """The pods on ``node``, by name."""
        return [self.pods[p] for p in sorted(self._by_node.get(node, ()))]

    def job_pods(self, job: str) -> list[RunningPod]:
        return sorted((p for p in self.pods.values() if p.job == job), key=lambda p: p.name)

    def fits(self, pod: str, node: str) -> Status | None:
        """None if ``pod`` may run on ``node`` as the view stands (every filter of the placement
        library passes), else the first failing filter's status. A pod already on ``node``
        is judged as if it were not there."""
        running = self.pods[pod]
        info = self.nodes.get(node)
        if info is None:
            return Status.unresolvable(f"node {node!r} not found")
        if running.node == node:
            info = info.clone()
            info.remove_pod(pod)
        status = self.framework.run_filters(running.info, info)
        if status is None:
            status = self.topology_status(running, info)
        return status if status is not None else self.job_affinity_status(running, info)

    def topology_status(self, running: RunningPod, target: NodeInfo) -> Status | None:
        """Inter-pod affinity and topology spread, the rules that count pods beyond the target
        node: judged as a shard and the Binder judge them (the placement library's topology
        filters), against every other placed pod of the view. The pod itself is taken out of
        the counts while it is judged: it is the one moving."""
        framework = self.framework
        info = running.info
        if not framework.topology_filters or not (info.has_topology or self._anti_is_placed()):
            return None
        counts = self._topology_index()
        counts.remove(running.name)
        try:
            if not framework.prepare(info, counts):
                return None
            for check in framework.topology_filters:
                status = check(info, target)
                if status is not None:
                    return status
            return None
        finally:
            info.topology = None
            counts.add(running.node, info.req)

    def _anti_is_placed(self) -> bool:
        if self._anti_placed is None:
            self._anti_placed = any(
                req.anti_terms for node in self.nodes.values() for req in node.pods.values()
            )
        return self._anti_placed

    def _topology_index(self) -> TopologyIndex:
        if self._topology is None:
            self._topology = TopologyIndex()
            self._topology.activate(self.nodes.values())
        return self._topology

    def job_affinity_status(self, running: RunningPod, target: NodeInfo) -> Status | None:
        """Job-level affinity, the unit rule the node filters cannot see: a pod of a job with
        required topology keys moves only within its current domain (where the job's other
        pods are), as the Binder would refuse anything else."""
        job = self.jobs.get(running.job)
        affinity = JobAffinity.from_job(job) if job is not None else None
        current = self.nodes.get(running.node)
        if affinity is None or not affinity.required or current is None:
            return None
        broken = joblevelaffinity.domain_violations(
            affinity, [("", current.labels), (running.name, target.labels)]
        )
        why = broken.get(running.name)
        return None if why is None else Status.unresolvable(why, plugin=joblevelaffinity.NAME)

    # -- changing ----------------------------------------------------------------------------

    def move(self, pod: str, target: str) -> None:
        """Account ``pod`` on ``target`` instead of its current node."""
        running = self.pods[pod]
        source = running.node
        if source == target:
            return
        self.nodes[source].remove_pod(pod)
        self._by_node[source].discard(pod)
        # A NUMA-bound pod holds NUMA nodes of its new node, a pod asking GPUs cards of it,
        # chosen as a shard would; one put back on its own node holds its own cards again.
        req = running.info.req
        node = self.nodes[target]
        if target == running.home and verify_cards(node, req, req.gpu_cards) is None:
            placed = pin_numa(node, req)
        else:
            placed = pin_cards(node, pin_numa(node, req), self.share_policy)
        self.nodes[target].add_pod(placed)
        self._by_node.setdefault(target, set()).add(pod)
        running.node = target
        if self._topology is not None:
            self._topology.add(target, placed)
        if self.move_listener is not None:
            self.move_listener(pod, source, target)

    def remove(self, pod: str) -> RunningPod:
        """Take ``pod`` off its node (evicted, not yet placed again)."""
        running = self.pods.pop(pod)
        self.nodes[running.node].remove_pod(pod)
        self._by_node[running.node].discard(pod)
        if self._topology is not None:
            self._topology.remove(pod)
        return running

    def copy(self) -> ClusterView:
        """An independent copy: moves on it leave this view as it is."""
        pods = {
            n: RunningPod(r.encoded, r.info, r.node, r.job, r.home) for n, r in self.pods.items()
        }
        return ClusterView(
            nodes={n: info.clone() for n, info in self.nodes.items()},
            pods=pods,
            jobs=self.jobs,
            framework=self.framework,
            pending=self.pending,
            budgets=self.budgets,
            scope=self.scope,
            scope_labels=self.scope_labels,
            revision=self.revision,
            loads=self.loads,
            share_policy=self.share_policy,
        )


def utilisation(node: NodeInfo, weights: dict[str, int], pool: str = GUARANTEED) -> float:
    """The original's formula: Σ wᵢ·requestedᵢ/allocatableᵢ ÷ Σ wᵢ over resources with capacity
    (a resource the node lacks counts as 0 used of 0, not a division by zero)."""
    return weighted_fraction(node.requested[pool], node.capacity[pool], weights)


def weighted_fraction(
    amounts: Sequence[int], capacity: Sequence[int], weights: dict[str, int]
) -> float:
    """Σ wᵢ·amountᵢ/capacityᵢ ÷ Σ wᵢ, over [cpu, memory, gpu]; a resource without capacity
    adds nothing (its weight still counts)."""
    total = weight_sum = 0.0
    for name, weight in weights.items():
        i = RESOURCE_INDEX[name]
        weight_sum += weight
        if capacity[i] > 0:
            total += weight * amounts[i] / capacity[i]
    return total / weight_sum if weight_sum else 0.0


# A check's veto of one move while the algorithm plans: None = allowed, else why not.
MoveVeto = Callable[[Move], str | None]


def allow_all(_move: Move) -> str | None:
    return None


@runtime_checkable
class Detector(Protocol):
    NAME: ClassVar[str]

    def detect(self, view: ClusterView) -> list[Detection]:
        """The in-scope nodes (and pods) that should be relieved, most urgent first. Reads the
        view only (it is the round's own, shared with the later steps)."""
        ...


@runtime_checkable
class Algorithm(Protocol):
    NAME: ClassVar[str]

    def reschedule(
        self, view: ClusterView, detections: Sequence[Detection], veto: MoveVeto
    ) -> list[Move]:
        """Moves that repair ``detections``. Call ``veto`` on a candidate move before choosing it
        (skip it when vetoed) and ``view.move`` after, so later choices see earlier ones: the
        round's checks count every move made on the view (budgets and throttles are used up by
        it), and a pod moved back to its node is uncounted. Every target must be in scope and
        pass ``view.fits``."""
        ...


@runtime_checkable
class Check(Protocol):
    """A veto on single moves, and the memory of moves already admitted in this round. One
    instance lives as long as the rescheduler (throttles remember past rounds); ``start_round``
    resets what belongs to one round."""

    NAME: ClassVar[str]

    def start_round(self, view: ClusterView, now: float) -> None:
        """A round (or a re-check of its plan) begins against ``view`` at ``now`` (unix s)."""
        ...

    def check(self, view: ClusterView, move: Move) -> str | None:
        """None if ``move`` may happen (given the moves admitted so far), else why not."""
        ...

    def admit(self, view: ClusterView, move: Move) -> None:
        """Record ``move`` as part of the round (budgets and throttles count it)."""
        ...

    def retract(self, view: ClusterView, move: Move) -> None:
        """``move``, admitted earlier in this round, was taken back before the plan was final
        (an all-or-nothing drain that could not finish): stop counting it."""
        ...

    def record(self, moves: Sequence[Move], view: ClusterView, generation: int, now: float) -> None:
        """``moves`` were carried out by round ``generation``: remember them (throttles)."""
        ...
