"""InterPodAffinity: required pod affinity and anti-affinity filter, preferred terms score, as
Kubernetes defines them (label selector + topology key; a domain is one value of the key).

Filter, for the node's domain of each term's key:
- an existing pod's required anti-affinity term whose selector matches this pod holds the domain
  (symmetry: an anti-affine pod keeps matching pods out, whatever they declare);
- a required affinity term: the node must carry the key and the domain hold a matching pod; the
  first pod of a group affine to itself passes anywhere when no pod matches yet (as upstream);
- a required anti-affinity term: the domain must hold no matching pod.

Score: for each preferred term, weight × matching pods in the node's domain (anti-affinity terms
count negatively), normalized min..max to 0..100 as kube-scheduler does.

``prepare`` reads the counts once per pod attempt (placement.topology); the filter and score are
then a dict lookup per term and node. Differences from upstream: a failure is unresolvable here
(this codebase's preemption does not evict pods to satisfy a topology rule); each affinity term is
satisfied by pods matching that term (upstream: pods matching all terms); existing pods'
preferred terms are not scored back (symmetry holds for required anti-affinity only).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, cast

from placement.framework import (
    MAX_NODE_SCORE,
    FilterPlugin,
    NoArgs,
    NormalizeScore,
    PluginSpec,
    PodInfo,
    ScorePlugin,
    Status,
    TopologyPlugin,
)
from placement.labelselector import matches
from placement.nodeinfo import NodeInfo
from placement.topology import PodCounts

NAME = "InterPodAffinity"
EXISTING_ANTI = "node(s) didn't satisfy existing pods anti-affinity rules"
AFFINITY = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
_EXISTING_ANTI = Status.unresolvable(EXISTING_ANTI, plugin=NAME)
_AFFINITY = Status.unresolvable(AFFINITY, plugin=NAME)
_ANTI_AFFINITY = Status.unresolvable(ANTI_AFFINITY, plugin=NAME)

Domains = Mapping[str, int]  # domain value -> matching pods (the index's live counter)


@dataclass(slots=True)
class State:
    # (topology key, domains holding a pod whose required anti-affinity term matches this pod)
    existing_anti: list[tuple[str, Domains]] = field(default_factory=list)
    affinity: list[tuple[str, Domains]] = field(default_factory=list)
    # No pod matches any required affinity term yet, and this pod matches them all.
    first_of_group: bool = False
    anti: list[tuple[str, Domains]] = field(default_factory=list)
    preferred: list[tuple[int, str, Domains]] = field(default_factory=list)


class InterPodAffinity:
    NAME: ClassVar[str] = NAME

    def prepare(self, pod: PodInfo, counts: PodCounts) -> State | None:
        labels = pod.labels
        state = State(
            existing_anti=[
                (term.topology_key, domains)
                for term, domains in counts.existing_anti()
                if domains and matches(term.selector, labels)
            ],
            affinity=[
                (t.topology_key, counts.domain_counts(t.selector, t.topology_key))
                for t in pod.pod_affinity
            ],
            anti=[
                (t.topology_key, counts.domain_counts(t.selector, t.topology_key))
                for t in pod.req.anti_terms
            ],
            preferred=[
                (w, t.topology_key, counts.domain_counts(t.selector, t.topology_key))
                for w, t in pod.preferred_pod_terms
            ],
        )
        if state.affinity:
            state.first_of_group = not any(d for _, d in state.affinity) and all(
                matches(t.selector, labels) for t in pod.pod_affinity
            )
        if not (state.existing_anti or state.affinity or state.anti or state.preferred):
            return None
        return state

    def shape(self, state: object) -> tuple[frozenset[str], Hashable]:
        """Every term reads the domain of its key on the node; only the first-of-group exception
        holds for every node at once."""
        s = cast(State, state)
        keys = {k for k, _ in s.existing_anti}
        keys.update(k for k, _ in s.affinity)
        keys.update(k for k, _ in s.anti)
        keys.update(k for _, k, _ in s.preferred)
        return frozenset(keys), s.first_of_group

    def filter(self, pod: PodInfo, node: NodeInfo) -> Status | None:
        if pod.topology is None or (raw := pod.topology.get(NAME)) is None:
            return None
        state = cast(State, raw)
        labels = node.labels
        for key, domains in state.existing_anti:
            domain = labels.get(key)
            if domain is not None and domain in domains:
                return _EXISTING_ANTI
        for key, domains in state.affinity:
            domain = labels.get(key)
            if domain is None:
                return _AFFINITY  # every topology key must be on the node
            if domain not in domains and not state.first_of_group:
                return _AFFINITY
        for key, domains in state.anti:
            domain = labels.get(key)
            if domain is not None and domain in domains:
                return _ANTI_AFFINITY
        return None

    def score(self, pod: PodInfo, node: NodeInfo) -> int:
        if pod.topology is None or (raw := pod.topology.get(NAME)) is None:
            return 0
        labels = node.labels
        total = 0
        for weight, key, domains in cast(State, raw).preferred:
            domain = labels.get(key)
            if domain is not None:
                total += weight * domains.get(domain, 0)
        return total

    def normalize_scores(self, pod: PodInfo, scores: list[int]) -> None:
        """(s - min) * 100 // (max - min); all 0 when every node scored the same."""
        if not scores:
            return
        low, high = min(scores), max(scores)
        span = high - low
        for i, s in enumerate(scores):
            scores[i] = (s - low) * MAX_NODE_SCORE // span if span > 0 else 0


def new(args: NoArgs) -> InterPodAffinity:
    return InterPodAffinity()


_check_filter: type[FilterPlugin] = InterPodAffinity
_check_score: type[ScorePlugin] = InterPodAffinity
_check_norm: type[NormalizeScore] = InterPodAffinity
_check_topology: type[TopologyPlugin] = InterPodAffinity
SPEC = PluginSpec(NAME, NoArgs, new)
