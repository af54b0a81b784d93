"""PodTopologySpread: Kubernetes' topology spread constraints.

Filter (``DoNotSchedule`` constraints): the node must carry the constraint's key, and placing the
pod in the node's domain must keep ``count(domain) + self - min(count over eligible domains) <=
maxSkew``, where ``count`` is the pods matching the constraint's selector, ``self`` is 1 when the
pod matches it itself, and the eligible domains are those of the nodes the pod's node selector
and required node affinity admit (upstream's nodeAffinityPolicy: Honor).

Score (``ScheduleAnyway`` constraints): raw = Σ (count(domain) + maxSkew - 1) over the soft
constraints; normalized as upstream, ``100 * (max + min - raw) // max`` (fewer matching pods, higher
score), and 0 for a node missing a key. Upstream weights each constraint by log(domains + 2); with
integer math every constraint weighs 1 here (the same ranking for one constraint).

Counts come from the topology index (``prepare``, once per pod attempt); the filter and score
read a dict per constraint. Differences from upstream: pods are counted per domain wherever they
run (upstream counts only pods on nodes that pass the pod's node affinity); no minDomains; a
failure is unresolvable (preemption does not evict to even out domains).
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
    SpreadConstraint,
    Status,
    TopologyPlugin,
)
from placement.labelselector import matches
from placement.nodeinfo import NodeInfo
from placement.plugins.nodeaffinity import term_matches
from placement.topology import PodCounts

NAME = "PodTopologySpread"
MISSING_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"
SKEW = "node(s) didn't match pod topology spread constraints"
_MISSING_LABEL = Status.unresolvable(MISSING_LABEL, plugin=NAME)
_SKEW = Status.unresolvable(SKEW, plugin=NAME)
_MISSING = -1  # raw score of a node without a soft constraint's key


@dataclass(frozen=True, slots=True)
class Prepared:
    key: str
    max_skew: int
    self_match: int
    counts: Mapping[str, int]
    min_count: int


@dataclass(slots=True)
class State:
    hard: list[Prepared] = field(default_factory=list)
    soft: list[Prepared] = field(default_factory=list)


def eligible_domains(pod: PodInfo, key: str, counts: PodCounts) -> Mapping[str, int] | set[str]:
    """The domains of ``key`` among the nodes the pod's node selector and required node affinity
    admit (all domains when it has neither, from the index without a scan)."""
    if not pod.node_selector and not pod.required_terms:
        return counts.domains(key)
    found: set[str] = set()
    for labels in counts.node_labels().values():
        domain = labels.get(key)
        if domain is None or domain in found:
            continue
        if any(labels.get(k) != v for k, v in pod.node_selector):
            continue
        if pod.required_terms and not any(term_matches(t, labels) for t in pod.required_terms):
            continue
        found.add(domain)
    return found


def _prepare(pod: PodInfo, c: SpreadConstraint, counts: PodCounts) -> Prepared:
    matching = counts.domain_counts(c.selector, c.topology_key)
    eligible = eligible_domains(pod, c.topology_key, counts)
    # ``matching`` holds only non-zero domains: if an eligible domain is missing from it, the
    # minimum is 0 without looking at every domain (the common case on a large cluster).
    if sum(1 for d in matching if d in eligible) < len(eligible):
        low = 0
    else:
        low = min((matching.get(d, 0) for d in eligible), default=0)
    self_match = 1 if matches(c.selector, pod.labels) else 0
    return Prepared(c.topology_key, c.max_skew, self_match, matching, low)


class PodTopologySpread:
    NAME: ClassVar[str] = NAME

    def prepare(self, pod: PodInfo, counts: PodCounts) -> State | None:
        if not pod.spread:
            return None
        state = State()
        for c in pod.spread:
            (state.hard if c.hard else state.soft).append(_prepare(pod, c, counts))
        return state

    def shape(self, state: object) -> tuple[frozenset[str], Hashable]:
        """A constraint reads its key's domain on the node, and the minimum over all domains."""
        s = cast(State, state)
        keys = frozenset(p.key for p in s.hard) | frozenset(p.key for p in s.soft)
        return keys, tuple((p.key, p.min_count) for p in s.hard)

    def filter(self, pod: PodInfo, node: NodeInfo) -> Status | None:
        if pod.topology is None or (raw := pod.topology.get(NAME)) is None:
            return None
        labels = node.labels
        for p in cast(State, raw).hard:
            domain = labels.get(p.key)
            if domain is None:
                return _MISSING_LABEL
            if p.counts.get(domain, 0) + p.self_match - p.min_count > p.max_skew:
                return _SKEW
        return None

    def score(self, pod: PodInfo, node: NodeInfo) -> int:
        if pod.topology is None or (raw := pod.topology.get(NAME)) is None:
            return 0
        labels = node.labels
        total = 0
        for p in cast(State, raw).soft:
            domain = labels.get(p.key)
            if domain is None:
                return _MISSING
            total += p.counts.get(domain, 0) + p.max_skew - 1
        return total

    def normalize_scores(self, pod: PodInfo, scores: list[int]) -> None:
        if pod.topology is None or not cast(State, pod.topology.get(NAME, State())).soft:
            for i in range(len(scores)):
                scores[i] = 0
            return
        kept = [s for s in scores if s != _MISSING]
        low, high = min(kept, default=0), max(kept, default=0)
        for i, s in enumerate(scores):
            if s == _MISSING:
                scores[i] = 0
            elif high == 0:
                scores[i] = MAX_NODE_SCORE
            else:
                scores[i] = MAX_NODE_SCORE * (high + low - s) // high


def new(args: NoArgs) -> PodTopologySpread:
    return PodTopologySpread()


_check_filter: type[FilterPlugin] = PodTopologySpread
_check_score: type[ScorePlugin] = PodTopologySpread
_check_norm: type[NormalizeScore] = PodTopologySpread
_check_topology: type[TopologyPlugin] = PodTopologySpread
SPEC = PluginSpec(NAME, NoArgs, new)
