"""Label selectors as plain values: requirements, selectors (AND of requirements) and pod terms
(a selector with a topology key), shared by node affinity, inter-pod affinity, topology spread,
the topology index and the Binder. No protobuf once converted; ``matches`` runs per pod."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from protos.godel.v1 import objects_pb2 as pb

# Label selector operators (LabelSelectorRequirement.Operator values).
OP_IN, OP_NOT_IN, OP_EXISTS, OP_DOES_NOT_EXIST, OP_GT, OP_LT = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: int
    values: frozenset[str] = frozenset()
    # For Gt/Lt: the single numeric value; None when it does not parse (matches nothing).
    number: int | None = None


Selector = tuple[Requirement, ...]  # AND of requirements


@dataclass(frozen=True, slots=True)
class PodTerm:
    """Kubernetes' PodAffinityTerm: the pods matching ``selector``, counted per domain (the
    nodes sharing one value of the label ``topology_key``)."""

    selector: Selector
    topology_key: str


def holds(r: Requirement, labels: Mapping[str, str]) -> bool:
    value = labels.get(r.key)
    op = r.op
    if op == OP_IN:
        return value is not None and value in r.values
    if op == OP_NOT_IN:
        return value is None or value not in r.values
    if op == OP_EXISTS:
        return value is not None
    if op == OP_DOES_NOT_EXIST:
        return value is None
    if op in (OP_GT, OP_LT):
        if value is None or r.number is None:
            return False
        try:
            n = int(value)
        except ValueError:
            return False
        return n > r.number if op == OP_GT else n < r.number
    return False  # unspecified operator: invalid, matches nothing


def matches(selector: Selector, labels: Mapping[str, str]) -> bool:
    """Every requirement holds; an empty selector matches every pod (the AND of nothing)."""
    for r in selector:
        if not holds(r, labels):
            return False
    return True


def requirement(r: pb.LabelSelectorRequirement) -> Requirement:
    number = None
    if r.operator in (OP_GT, OP_LT) and len(r.values) == 1:
        try:
            number = int(r.values[0])
        except ValueError:
            number = None
    return Requirement(r.key, int(r.operator), frozenset(r.values), number)


def selector(reqs: object) -> Selector:
    """A selector from a repeated LabelSelectorRequirement, in a canonical order, so equal
    selectors written in another order share one index entry."""
    out = [requirement(r) for r in reqs]  # type: ignore[attr-defined]
    return tuple(sorted(out, key=lambda r: (r.key, r.op, sorted(r.values))))


def pod_term(term: pb.PodAffinityTerm) -> PodTerm:
    return PodTerm(selector(term.label_selector), term.topology_key)
