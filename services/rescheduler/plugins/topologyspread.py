"""TopologySpread: bring each job's pods back within ``max_skew`` across the domains of a node
label (``topology_key``: zone, rack) after nodes came and went.

Domains are the distinct values of the key among in-scope nodes (a node without the key is in no
domain, and its pods are not counted). A job's skew is the most minus the fewest of its pods in
one domain, counting domains holding none; jobs with fewer than ``min_pods`` counted pods are
ignored.

Detect: for each job whose skew exceeds ``max_skew``, its pods in its most loaded domain (ties: the
first domain by name), one detection per node.

Reschedule: for each job named by the detections' pods, repeatedly move one pod from a most loaded
domain to a least loaded one (domains, pods and ties by name), onto the least utilised node there
(framework.utilisation of the guaranteed pool, cpu and memory equally weighted) that fits and is
not vetoed, until the skew is within ``max_skew`` or no such move exists. Each move lowers the sum
of squared counts, so this ends.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from placement.framework import PluginSpec
from placement.nodeinfo import GUARANTEED
from services.rescheduler.framework import ClusterView, Detection, Move, MoveVeto, utilisation
from services.rescheduler.plugins.args import default_weights
from services.rescheduler.plugins.targets import RankedNodes, RoomCache, first_target

NAME = "TopologySpread"

# A job's pod names per domain, each list sorted.
PodsByDomain = dict[str, list[str]]


@dataclass(frozen=True)
class Args:
    topology_key: str = ""
    max_skew: int = 1
    min_pods: int = 2

    def validate(self) -> None:
        if not self.topology_key:
            raise ValueError("topology_key is required (a node label such as zone)")
        if self.max_skew < 1:
            raise ValueError(f"max_skew must be >= 1, got {self.max_skew}")
        if self.min_pods < 1:
            raise ValueError(f"min_pods must be >= 1, got {self.min_pods}")


@dataclass
class Topology:
    """The in-scope nodes' domains for one label key, and every job's pods per domain."""

    domain_of: dict[str, str]
    nodes_in: dict[str, list[str]]
    jobs: dict[str, PodsByDomain]

    @property
    def domains(self) -> list[str]:
        """By name."""
        return list(self.nodes_in)

    @classmethod
    def of(cls, view: ClusterView, key: str) -> Topology:
        domain_of = {n.name: n.labels[key] for n in view.scoped_nodes() if key in n.labels}
        nodes_in: dict[str, list[str]] = {d: [] for d in sorted(set(domain_of.values()))}
        for node, domain in domain_of.items():
            nodes_in[domain].append(node)
        jobs: dict[str, PodsByDomain] = {}
        for running in view.pods.values():
            where = domain_of.get(running.node)
            if where is not None:
                jobs.setdefault(running.job, {}).setdefault(where, []).append(running.name)
        for by_domain in jobs.values():
            for pods in by_domain.values():
                pods.sort()
        return cls(domain_of, nodes_in, jobs)

    def counts(self, by_domain: PodsByDomain) -> dict[str, int]:
        return {d: len(by_domain.get(d, ())) for d in self.domains}

    def skew(self, by_domain: PodsByDomain) -> int:
        counts = self.counts(by_domain).values()
        return max(counts) - min(counts) if counts else 0

    def considered(self, min_pods: int) -> list[str]:
        """The jobs with at least ``min_pods`` counted pods, by name."""
        return sorted(
            job
            for job, by_domain in self.jobs.items()
            if sum(len(p) for p in by_domain.values()) >= min_pods
        )


def spread_share(view: ClusterView, topology_key: str, max_skew: int, min_pods: int) -> float:
    """The share of considered jobs (≥ ``min_pods`` pods in the key's domains) whose skew is within
    ``max_skew`` — the figure the original reports; 1.0 when no job is considered."""
    topology = Topology.of(view, topology_key)
    jobs = topology.considered(min_pods)
    if not jobs:
        return 1.0
    within = sum(topology.skew(topology.jobs[job]) <= max_skew for job in jobs)
    return within / len(jobs)


class TopologySpread:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: Args) -> None:
        self.args = args

    def detect(self, view: ClusterView) -> list[Detection]:
        key, max_skew = self.args.topology_key, self.args.max_skew
        topology = Topology.of(view, key)
        found: list[Detection] = []
        for job in topology.considered(self.args.min_pods):
            by_domain = topology.jobs[job]
            skew = topology.skew(by_domain)
            if skew <= max_skew:
                continue
            counts = topology.counts(by_domain)
            crowded = min(topology.domains, key=lambda d: (-counts[d], d))
            reason = f"job {job}: skew {skew} > {max_skew} across {key}; {key}={crowded} is fullest"
            by_node: dict[str, list[str]] = {}
            for pod in by_domain[crowded]:
                by_node.setdefault(view.pods[pod].node, []).append(pod)
            found.extend(Detection(n, reason, tuple(by_node[n])) for n in sorted(by_node))
        return found

    def reschedule(
        self, view: ClusterView, detections: Sequence[Detection], veto: MoveVeto
    ) -> list[Move]:
        jobs: dict[str, None] = {}  # ordered, without repeats
        for detection in detections:
            pods = detection.pods or tuple(p.name for p in view.pods_on(detection.node))
            for pod in pods:
                if pod in view.pods:
                    jobs.setdefault(view.pods[pod].job)
        return _Spreading(self.args, view, veto).run(list(jobs))


class _Spreading:
    """The state of one reschedule call: the topology, each domain's nodes ranked least utilised
    first (built when first needed), and the room memo."""

    def __init__(self, args: Args, view: ClusterView, veto: MoveVeto) -> None:
        self.args, self.view, self.veto = args, view, veto
        self.topology = Topology.of(view, args.topology_key)
        self.room = RoomCache()
        self.weights = default_weights()
        self._rankings: dict[str, RankedNodes] = {}

    def _utilisation(self, name: str) -> float:
        return utilisation(self.view.nodes[name], self.weights, GUARANTEED)

    def _ranking(self, domain: str) -> RankedNodes:
        ranking = self._rankings.get(domain)
        if ranking is None:
            ranking = self._rankings[domain] = RankedNodes(
                self._utilisation, self.topology.nodes_in[domain], descending=False
            )
        return ranking

    def run(self, jobs: list[str]) -> list[Move]:
        considered = set(self.topology.considered(self.args.min_pods))
        moves: list[Move] = []
        for job in jobs:
            if job in considered:
                moves.extend(self._spread(self.topology.jobs[job]))
        return moves

    def _spread(self, by_domain: PodsByDomain) -> list[Move]:
        moves: list[Move] = []
        while self.topology.skew(by_domain) > self.args.max_skew:
            move = self._one_move(by_domain)
            if move is None:
                break
            self._apply(move, by_domain)
            moves.append(move)
        return moves

    def _one_move(self, by_domain: PodsByDomain) -> Move | None:
        counts = self.topology.counts(by_domain)
        most, fewest = max(counts.values()), min(counts.values())
        crowded = [d for d in self.topology.domains if counts[d] == most]
        sparse = [d for d in self.topology.domains if counts[d] == fewest]
        for source_domain in crowded:
            for name in by_domain[source_domain]:
                pod = self.view.pods[name]
                for target_domain in sparse:
                    nodes = (n for _, n in self._ranking(target_domain).items())
                    target = first_target(self.view, pod, nodes, self.room, self.veto)
                    if target is not None:
                        return Move(pod.name, pod.job, pod.node, target)
        return None

    def _apply(self, move: Move, by_domain: PodsByDomain) -> None:
        self.view.move(move.pod, move.target)
        self.room.freed(move.source)
        domain_of = self.topology.domain_of
        by_domain[domain_of[move.source]].remove(move.pod)
        bisect.insort(by_domain.setdefault(domain_of[move.target], []), move.pod)
        for node in (move.source, move.target):
            self._ranking(domain_of[node]).rank(node)


def new(args: Args) -> TopologySpread:
    return TopologySpread(args)


SPEC = PluginSpec(NAME, Args, new)
