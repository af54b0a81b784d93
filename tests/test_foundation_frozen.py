"""``foundation.frozen.positional_maker``: instances of a frozen dataclass with slots made from
their fields in order are ordinary instances — equal to the constructor's, frozen, hashable —
and a class it cannot make so is refused by name."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from foundation.frozen import positional_maker


@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = field(default=(), compare=False)


def test_made_instances_are_the_constructors() -> None:
    make = positional_maker(Point)
    made = make(1, 2, ("a",))
    assert type(made) is Point and isinstance(made, Point)
    assert made == Point(1, 2, ("a",)) and hash(made) == hash(Point(1, 2))
    assert (made.x, made.y, made.tags) == (1, 2, ("a",))
    assert repr(made) == "Point(x=1, y=2, tags=('a',))"
    for name in ("x", "y"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, name, 3)
    assert dataclasses.replace(made, x=5) == Point(5, 2)


@dataclass(slots=True)
class Unfrozen:
    x: int


@dataclass(frozen=True)
class NoSlots:
    x: int


@dataclass(frozen=True, slots=True)
class Checked:
    x: int

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("x")


@pytest.mark.parametrize(
    ("cls", "error"),
    [
        (Unfrozen, "Unfrozen: not a frozen dataclass with slots"),
        (NoSlots, "NoSlots: not a frozen dataclass with slots"),
        (Checked, "Checked: its __post_init__ would not run"),
    ],
)
def test_a_class_it_cannot_make_is_refused(cls: type, error: str) -> None:
    with pytest.raises(TypeError, match=error):
        positional_maker(cls)
