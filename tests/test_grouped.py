"""GroupedNames: names by key, a group of one held without a set."""

from __future__ import annotations

import pytest

from services.grouped import GroupedNames

# Each step: (op, key, name), then what every key holds after it.
CASES = [
    ("first name of a key", [("add", "j", "a")], {"j": {"a"}}),
    ("the same name twice is one", [("add", "j", "a"), ("add", "j", "a")], {"j": {"a"}}),
    ("a second name", [("add", "j", "a"), ("add", "j", "b")], {"j": {"a", "b"}}),
    ("the lone name leaves: the key goes", [("add", "j", "a"), ("discard", "j", "a")], {}),
    ("another name than the lone one stays", [("add", "j", "a"), ("discard", "j", "b")],
     {"j": {"a"}}),
    ("back to one from two", [("add", "j", "a"), ("add", "j", "b"), ("discard", "j", "a")],
     {"j": {"b"}}),
    ("back to none from two",
     [("add", "j", "a"), ("add", "j", "b"), ("discard", "j", "a"), ("discard", "j", "b")], {}),
    ("a third after shrinking to one",
     [("add", "j", "a"), ("add", "j", "b"), ("discard", "j", "a"), ("add", "j", "c")],
     {"j": {"b", "c"}}),
    ("keys apart", [("add", "j", "a"), ("add", "k", "a"), ("discard", "k", "a")],
     {"j": {"a"}}),
    ("an unknown key", [("discard", "nope", "a")], {}),
]  # fmt: skip


@pytest.mark.parametrize(("steps", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_grouped_names(steps: list[tuple[str, str, str]], want: dict[str, set[str]]) -> None:
    groups = GroupedNames()
    for op, key, name in steps:
        getattr(groups, op)(key, name)
    assert {k: set(groups.get(k)) for k in groups} == want
    assert set(groups.keys()) == set(want) and len(groups) == len(want)
    for key, names in want.items():
        assert key in groups and groups.count(key) == len(names)
    assert "absent" not in groups and groups.get("absent") == () and groups.count("absent") == 0


def test_a_lone_name_is_held_without_a_set() -> None:
    groups = GroupedNames()
    groups.add("j", "a")
    assert groups.get("j") == ("a",)
    groups.add("j", "b")
    groups.discard("j", "b")
    assert groups.get("j") == ("a",)


def test_add_all_groups_as_adding_one_at_a_time() -> None:
    """``add_all`` (a listing's groups at once) leaves what ``add`` of each name would: a lone
    name without a set, names joining a group already there."""
    groups = GroupedNames()
    groups.add_all("one", ["a"])
    groups.add_all("many", ["a", "b", "c"])
    groups.add("joined", "x")
    groups.add_all("joined", ["y"])
    groups.add_all("none", [])
    assert groups.get("one") == ("a",)
    assert set(groups.get("many")) == {"a", "b", "c"} and groups.count("many") == 3
    assert set(groups.get("joined")) == {"x", "y"}
    assert "none" not in groups
    groups.discard("many", "b")
    groups.discard("many", "c")
    assert groups.get("many") == ("a",)
