"""The CLI's one age formatter (godel.cli.output.age): kubectl's largest whole unit."""

from __future__ import annotations

import time

import pytest

from godel.cli.output import age, age_of_ms


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5.0, "0s"),  # a clock ahead of ours
        (-0.5, "0s"),
        (0.0, "0s"),
        (0.9, "0s"),
        (3.7, "3s"),
        (59.99, "59s"),
        (60.0, "1m"),
        (299.0, "4m"),
        (300.0, "5m"),
        (3599.0, "59m"),
        (3600.0, "1h"),
        (7199.0, "1h"),
        (7200.0, "2h"),
        (86399.0, "23h"),
        (86400.0, "1d"),
        (4 * 86400 + 3600.0, "4d"),
        (400 * 86400.0, "400d"),
    ],
)
def test_age(seconds: float, text: str) -> None:
    assert age(seconds) == text


@pytest.mark.parametrize(
    ("ago_seconds", "text"), [(10, "10s"), (5 * 60 + 10, "5m"), (2 * 3600 + 10, "2h")]
)
def test_age_of_ms(ago_seconds: int, text: str) -> None:
    assert age_of_ms(int((time.time() - ago_seconds) * 1000)) == text


def test_age_of_ms_unset_is_unknown() -> None:
    assert age_of_ms(0) == "<unknown>"
