"""Label selectors as plain values: requirements, selectors (AND of requirements) and pod terms
(a selector with a topology key), shared by node affinity, inter-pod affinity, topology spread,
the topology index and the Binder. No protobuf once converted; ``matches`` runs per pod."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from placement import labels
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


def selector(reqs: Iterable[pb.LabelSelectorRequirement]) -> Selector:
    """A selector from a repeated LabelSelectorRequirement, in a canonical order, so equal
    selectors written in another order share one index entry."""
    out = [requirement(r) for r in reqs]
    return tuple(sorted(out, key=lambda r: (r.key, r.op, sorted(r.values))))


def pod_term(term: pb.PodAffinityTerm) -> PodTerm:
    return PodTerm(selector(term.label_selector), term.topology_key)


# ---------------------------------------------------------------------------------------------
# kubectl's selector text: `godel get pods -l 'app=web,tier!=db,zone in (a,b),!canary'`
# ---------------------------------------------------------------------------------------------

# Tokens: words (keys, values, `in`, `notin`), operators, parentheses, commas; spaces between.
_TOKEN_RE = re.compile(r"\s*(==|!=|=|!|>|<|\(|\)|,|[^\s=!<>(),]+)")
_OPERATORS = {"=": OP_IN, "==": OP_IN, "!=": OP_NOT_IN, ">": OP_GT, "<": OP_LT}
_SET_OPERATORS = {"in": OP_IN, "notin": OP_NOT_IN}
_OPERATOR_TEXT = {OP_IN: "in", OP_NOT_IN: "notin"}


class SelectorSyntaxError(ValueError):
    """A selector text that does not parse; the message names the problem and where."""

    def __init__(self, text: str, problem: str) -> None:
        super().__init__(f"invalid label selector {text!r}: {problem}")
        self.text = text
        self.problem = problem


def parse(text: str) -> Selector:
    """A selector from kubectl's grammar: requirements separated by commas, all of which must
    hold — ``k=v`` / ``k==v`` (In), ``k!=v`` (NotIn: also true without the label), ``k in (a,b)``,
    ``k notin (a,b)``, ``k`` (Exists), ``!k`` (DoesNotExist), ``k>3`` / ``k<3`` (numeric). An
    empty text selects everything. Anything else raises SelectorSyntaxError."""
    tokens = _tokens(text)
    out: list[Requirement] = []
    i = 0

    def take() -> str:
        nonlocal i
        if i >= len(tokens):
            raise SelectorSyntaxError(text, "ends too early")
        i += 1
        return tokens[i - 1]

    def peek() -> str | None:
        return tokens[i] if i < len(tokens) else None

    while i < len(tokens):
        if peek() == "!":
            take()
            key = _key(text, take())
            out.append(Requirement(key, OP_DOES_NOT_EXIST))
        else:
            key = _key(text, take())
            following = peek()
            if following is None or following == ",":
                out.append(Requirement(key, OP_EXISTS))
            elif following in _OPERATORS:
                op = _OPERATORS[take()]
                value = take() if peek() not in (None, ",") else ""
                if op in (OP_GT, OP_LT):
                    if not re.fullmatch(r"-?[0-9]+", value):
                        raise SelectorSyntaxError(text, f"{key}{following}: expects an integer")
                    out.append(Requirement(key, op, frozenset({value}), int(value)))
                else:
                    out.append(Requirement(key, op, frozenset({_value(text, value)})))
            elif following in _SET_OPERATORS:
                op = _SET_OPERATORS[take()]
                if take() != "(":
                    raise SelectorSyntaxError(
                        text, f"'{following}' needs a list: {key} {following} (a,b)"
                    )
                values: list[str] = []
                while True:
                    word = take()
                    if word == ")" and not values:
                        raise SelectorSyntaxError(text, f"{key} {following} (): the list is empty")
                    values.append(_value(text, word))
                    closing = take()
                    if closing == ")":
                        break
                    if closing != ",":
                        raise SelectorSyntaxError(text, f"expected ',' or ')' after {word!r}")
                out.append(Requirement(key, op, frozenset(values)))
            else:
                raise SelectorSyntaxError(
                    text, f"unexpected {following!r} after {key!r} (=, ==, !=, in, notin)"
                )
        if i < len(tokens) and take() != ",":
            raise SelectorSyntaxError(text, f"expected ',' before {tokens[i - 1]!r}")
        if i == len(tokens) and tokens[-1] == ",":
            raise SelectorSyntaxError(text, "ends with ','")
    return tuple(out)


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN_RE.match(text, pos)
        if m is None:  # pragma: no cover - the last alternative matches any other character
            raise SelectorSyntaxError(text, f"unexpected character at {pos}")
        tokens.append(m.group(1))
        pos = m.end()
    return tokens


def _key(text: str, word: str) -> str:
    if (problem := labels.key_problem(word)) is not None:
        raise SelectorSyntaxError(text, problem)
    return word


def _value(text: str, word: str) -> str:
    if (problem := labels.value_problem(word)) is not None:
        raise SelectorSyntaxError(text, problem)
    return word


def to_text(sel: Selector) -> str:
    """A selector in kubectl's grammar (``parse`` reads it back): ``app=web,!canary``."""
    parts: list[str] = []
    for r in sel:
        values = sorted(r.values)
        if r.op == OP_EXISTS:
            parts.append(r.key)
        elif r.op == OP_DOES_NOT_EXIST:
            parts.append(f"!{r.key}")
        elif r.op in (OP_GT, OP_LT):
            parts.append(f"{r.key}{'>' if r.op == OP_GT else '<'}{values[0] if values else ''}")
        elif len(values) == 1:
            parts.append(f"{r.key}{'=' if r.op == OP_IN else '!='}{values[0]}")
        else:
            parts.append(f"{r.key} {_OPERATOR_TEXT.get(r.op, '?')} ({','.join(values)})")
    return ",".join(parts)
