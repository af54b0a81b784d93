"""kubectl's label selector grammar (placement.labelselector.parse): a table of texts and the
requirements they parse to, what each selects, and invalid selectors with their message."""

from __future__ import annotations

import pytest

from placement.labelselector import (
    OP_DOES_NOT_EXIST,
    OP_EXISTS,
    OP_GT,
    OP_IN,
    OP_LT,
    OP_NOT_IN,
    Requirement,
    SelectorSyntaxError,
    matches,
    parse,
    to_text,
)

R = Requirement
PARSED = [
    ("", ()),
    ("   ", ()),
    ("app=web", (R("app", OP_IN, frozenset({"web"})),)),
    ("app==web", (R("app", OP_IN, frozenset({"web"})),)),
    ("app!=web", (R("app", OP_NOT_IN, frozenset({"web"})),)),
    ("app=", (R("app", OP_IN, frozenset({""})),)),
    ("app in (web,api)", (R("app", OP_IN, frozenset({"web", "api"})),)),
    ("app  in(web , api )", (R("app", OP_IN, frozenset({"web", "api"})),)),
    ("app notin (web)", (R("app", OP_NOT_IN, frozenset({"web"})),)),
    ("canary", (R("canary", OP_EXISTS),)),
    ("!canary", (R("canary", OP_DOES_NOT_EXIST),)),
    ("! canary", (R("canary", OP_DOES_NOT_EXIST),)),
    ("gpu>2", (R("gpu", OP_GT, frozenset({"2"}), 2),)),
    ("gpu<-1", (R("gpu", OP_LT, frozenset({"-1"}), -1),)),
    ("godel.io/mode=process", (R("godel.io/mode", OP_IN, frozenset({"process"})),)),
    (
        "app=web,tier!=db, zone in (a,b),!canary,team",
        (
            R("app", OP_IN, frozenset({"web"})),
            R("tier", OP_NOT_IN, frozenset({"db"})),
            R("zone", OP_IN, frozenset({"a", "b"})),
            R("canary", OP_DOES_NOT_EXIST),
            R("team", OP_EXISTS),
        ),
    ),
]


@pytest.mark.parametrize(("text", "expected"), PARSED, ids=[p[0] or "empty" for p in PARSED])
def test_selectors_parse(text: str, expected: tuple[Requirement, ...]) -> None:
    assert parse(text) == expected
    assert parse(to_text(expected)) == expected  # printed back in the same grammar


SELECTS = [
    # (selector, labels, selected)
    ("app=web", {"app": "web"}, True),
    ("app=web", {"app": "api"}, False),
    ("app=web", {}, False),
    ("app!=web", {}, True),  # as Kubernetes: != also selects objects without the label
    ("app!=web", {"app": "web"}, False),
    ("app in (web,api)", {"app": "api"}, True),
    ("app notin (web,api)", {"app": "db"}, True),
    ("app notin (web,api)", {"app": "web"}, False),
    ("canary", {"canary": ""}, True),
    ("canary", {}, False),
    ("!canary", {}, True),
    ("!canary", {"canary": "yes"}, False),
    ("gpu>2", {"gpu": "4"}, True),
    ("gpu>2", {"gpu": "2"}, False),
    ("gpu>2", {"gpu": "many"}, False),
    ("app=web,!canary", {"app": "web", "canary": "1"}, False),
    ("", {"anything": "x"}, True),
]


@pytest.mark.parametrize(("text", "labels", "selected"), SELECTS)
def test_selectors_select(text: str, labels: dict[str, str], selected: bool) -> None:
    assert matches(parse(text), labels) is selected


INVALID = [
    ("app=web,", "ends with ','"),
    (",app=web", "',' is not a valid label key"),
    ("app=web,,tier=db", "',' is not a valid label key"),
    ("app in web", "'in' needs a list"),
    ("app in ()", "the list is empty"),
    ("app in (a", "ends too early"),
    ("app in (a b)", "expected ',' or ')'"),
    ("app notin", "ends too early"),
    ("app=web tier=db", "expected ',' before 'tier'"),
    ("app ~ web", "unexpected '~'"),
    ("app=we b", "expected ',' before 'b'"),
    ("-app=web", "'-app' is not a valid label key"),
    ("app=-web", "'-web' is not a valid label value"),
    ("gpu>two", "gpu>: expects an integer"),
    ("!", "ends too early"),
    ("!app=web", "expected ',' before '='"),
    ("a" * 64 + "=x", "the name must be at most 63 characters (got 64)"),
    ("app=" + "v" * 64, "a label value must be at most 63 characters (got 64)"),
    ("a/b/c=x", "prefix 'a/b' is not a DNS-1123 subdomain"),
]


@pytest.mark.parametrize(("text", "problem"), INVALID, ids=[i[0][:20] for i in INVALID])
def test_invalid_selectors_are_errors_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(SelectorSyntaxError) as caught:
        parse(text)
    assert problem in str(caught.value)
    assert repr(text) in str(caught.value)
