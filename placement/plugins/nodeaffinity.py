"""NodeAffinity: spec.template.node_selector (every key = value) and required node affinity
(terms OR'd, expressions within a term AND'd) filter; preferred terms score (sum of the weights
of matching terms, normalized to 0..100). Its PreFilter narrows a pod to the nodes carrying the
exact label values it requires (a DaemonSet-like pod pinned by hostname examines one node)."""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import ClassVar

from placement.framework import (
    MAX_NODE_SCORE,
    Candidates,
    FilterPlugin,
    NoArgs,
    NodeLabels,
    NormalizeScore,
    PluginSpec,
    PodInfo,
    PreFilter,
    ScorePlugin,
    Status,
)
from placement.framework.interface import Term
from placement.labelselector import (
    OP_DOES_NOT_EXIST,
    OP_EXISTS,
    OP_GT,
    OP_IN,
    OP_LT,
    OP_NOT_IN,
)
from placement.nodeinfo import NodeInfo

NAME = "NodeAffinity"
NOT_MATCHED = "node(s) didn't match node selector"
_NOT_MATCHED = Status.unresolvable(NOT_MATCHED, plugin=NAME)


def term_matches(term: Term, labels: Mapping[str, str]) -> bool:
    """All requirements hold. An empty term matches nothing (as in Kubernetes)."""
    if not term:
        return False
    for r in term:
        value = labels.get(r.key)
        op = r.op
        if op == OP_IN:
            ok = value is not None and value in r.values
        elif op == OP_NOT_IN:
            ok = value is None or value not in r.values
        elif op == OP_EXISTS:
            ok = value is not None
        elif op == OP_DOES_NOT_EXIST:
            ok = value is None
        elif op in (OP_GT, OP_LT):
            ok = False
            if value is not None and r.number is not None:
                try:
                    n = int(value)
                except ValueError:
                    n = None
                if n is not None:
                    ok = n > r.number if op == OP_GT else n < r.number
        else:  # unspecified operator: invalid, matches nothing
            ok = False
        if not ok:
            return False
    return True


def _nodes_matching_terms(terms: tuple[Term, ...], labels: NodeLabels) -> set[str] | None:
    """Nodes that may match one of ``terms`` by each term's first ``In``; None if unknown."""
    if not terms:
        return None
    union: set[str] = set()
    for term in terms:
        first_in = next((r for r in term if r.op == OP_IN), None)
        if first_in is None:
            if term:
                return None  # a term without In can match any node
            continue  # an empty term matches nothing
        for value in first_in.values:
            union |= labels.nodes_with(first_in.key, value)
    return union


class NodeAffinity:
    NAME: ClassVar[str] = NAME

    def filter(self, pod: PodInfo, node: NodeInfo) -> Status | None:
        labels = node.labels
        for key, value in pod.node_selector:
            if labels.get(key) != value:
                return _NOT_MATCHED
        terms = pod.required_terms
        if terms and not any(term_matches(t, labels) for t in terms):
            return _NOT_MATCHED
        return None

    def pre_filter(self, pod: PodInfo, labels: NodeLabels) -> Candidates | None:
        """The nodes with every node_selector pair and, for the required terms, the union over
        terms of the nodes matching each term's first ``In`` requirement. A non-empty term with no
        ``In`` can match any node, so then the terms do not narrow."""
        found: Set[str] | None = None
        for key, value in pod.node_selector:
            nodes = labels.nodes_with(key, value)
            found = nodes if found is None else found & nodes
        by_terms = _nodes_matching_terms(pod.required_terms, labels)
        if by_terms is not None:
            found = by_terms if found is None else found & by_terms
        return None if found is None else Candidates(found, NOT_MATCHED)

    def score(self, pod: PodInfo, node: NodeInfo) -> int:
        total = 0
        for weight, term in pod.preferred_terms:
            if term_matches(term, node.labels):
                total += weight
        return total

    def normalize_scores(self, pod: PodInfo, scores: list[int]) -> None:
        top = max(scores, default=0)
        if top <= 0:
            return
        for i, s in enumerate(scores):
            scores[i] = s * MAX_NODE_SCORE // top


def new(args: NoArgs) -> NodeAffinity:
    return NodeAffinity()


_check_filter: type[FilterPlugin] = NodeAffinity
_check_pre_filter: type[PreFilter] = NodeAffinity
_check_score: type[ScorePlugin] = NodeAffinity
_check_norm: type[NormalizeScore] = NodeAffinity
SPEC = PluginSpec(NAME, NoArgs, new)
