"""Label syntax (placement.labels), table by table: Kubernetes' rules for label keys and
values, the one home the manifest reader, the dispatcher's validation, the selector parser and
the node agent ask. Each invalid case names its problem."""

from __future__ import annotations

import pytest

from placement.labels import key_problem, value_problem

NAME_63 = "a" * 63
PREFIX_253 = ".".join(["b" * 63] * 3) + "." + "c" * 61  # 253 characters, every part a label

KEYS: list[tuple[str, str, str | None]] = [
    # (case, key, problem contains; None: valid)
    ("plain name", "app", None),
    ("name of every allowed character", "A-b_c.9", None),
    ("single character", "a", None),
    ("name of 63 characters", NAME_63, None),
    ("prefixed", "godel.io/mode", None),
    ("prefix of 253 characters", f"{PREFIX_253}/x", None),
    ("kubernetes.io style", "topology.kubernetes.io/zone", None),
    ("empty", "", "must not be empty"),
    ("spaces", "has spaces!", "'has spaces!' is not a valid label key"),
    ("starts with a dash", "-app", "is not a valid label key"),
    ("ends with a dot", "app.", "is not a valid label key"),
    ("name of 64 characters", "a" * 64, "the name must be at most 63 characters (got 64)"),
    ("prefixed name of 64 characters", "x.io/" + "a" * 64, "at most 63 characters (got 64)"),
    ("two slashes", "a/b/c", "prefix 'a/b' is not a DNS-1123 subdomain"),
    ("empty prefix", "/app", "the prefix before '/' must not be empty"),
    ("empty name after the prefix", "godel.io/", "is not a valid label key"),
    ("capitals in the prefix", "Godel.io/mode", "prefix 'Godel.io' is not a DNS-1123 subdomain"),
    ("underscore in the prefix", "my_org.io/x", "is not a DNS-1123 subdomain"),
    ("prefix of 254 characters", f"{PREFIX_253}d/x", "at most 253 characters (got 254)"),
    ("trailing newline", "app\n", "is not a valid label key"),
    ("unicode letter", "zoné", "is not a valid label key"),
]

VALUES: list[tuple[str, str, str | None]] = [
    ("empty", "", None),
    ("plain", "web", None),
    ("every allowed character", "v1.2_rc-3", None),
    ("63 characters", NAME_63, None),
    ("64 characters", "v" * 64, "a label value must be at most 63 characters (got 64)"),
    ("70 characters", "v" * 70, "at most 63 characters (got 70)"),
    ("spaces", "x y", "'x y' is not a valid label value"),
    ("starts with a dash", "-web", "is not a valid label value"),
    ("a slash", "a/b", "is not a valid label value"),
    ("trailing newline", "web\n", "is not a valid label value"),
]


@pytest.mark.parametrize(("key", "problem"), [c[1:] for c in KEYS], ids=[c[0] for c in KEYS])
def test_label_keys(key: str, problem: str | None) -> None:
    found = key_problem(key)
    if problem is None:
        assert found is None, found
    else:
        assert found is not None and problem in found, found


@pytest.mark.parametrize(("value", "problem"), [c[1:] for c in VALUES], ids=[c[0] for c in VALUES])
def test_label_values(value: str, problem: str | None) -> None:
    found = value_problem(value)
    if problem is None:
        assert found is None, found
    else:
        assert found is not None and problem in found, found
