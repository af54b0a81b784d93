"""ShardQueue — a scheduler shard's ready and backoff heaps: pure and synchronous, table-driven,
with an injected clock (no store, no gRPC, no event loop)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from services.scheduler.queue import ShardQueue


@dataclass(eq=False)
class Item:
    name: str
    priority: int = 0
    seq: int = 0
    revoked: bool = False
    pending: dict[str, int] = field(default_factory=lambda: {"pod": 0})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def queue(clock: Clock | None = None, initial: float = 0.1, cap: float = 10.0) -> ShardQueue[Item]:
    return ShardQueue(initial, cap, clock or Clock())


def drain(q: ShardQueue[Item]) -> list[str]:
    out = []
    while (item := q.pop()) is not None:
        out.append(item.name)
    return out


@pytest.mark.parametrize(
    ("items", "order"),
    [
        pytest.param([("a", 0, 1), ("b", 0, 2), ("c", 0, 3)], "abc", id="arrival order"),
        pytest.param([("a", 0, 1), ("b", 5, 2), ("c", 1, 3)], "bca", id="priority first"),
        pytest.param([("a", 1, 3), ("b", 1, 1), ("c", 1, 2)], "bca", id="seq breaks ties"),
        pytest.param([("a", -1, 1), ("b", 0, 2)], "ba", id="negative priority last"),
        pytest.param([], "", id="empty"),
    ],
)
def test_ready_order(items: list[tuple[str, int, int]], order: str) -> None:
    q = queue()
    for name, priority, seq in items:
        q.add(Item(name, priority, seq))
    assert "".join(drain(q)) == order


@pytest.mark.parametrize(
    ("revoked", "no_pending", "order"),
    [
        pytest.param("", "", "abcd", id="none dropped"),
        pytest.param("b", "", "acd", id="revoked skipped"),
        pytest.param("", "c", "abd", id="nothing pending skipped"),
        pytest.param("ad", "bc", "", id="all dropped"),
    ],
)
def test_removal_of_revoked_and_finished_units(revoked: str, no_pending: str, order: str) -> None:
    q = queue()
    items = {name: Item(name, seq=i) for i, name in enumerate("abcd")}
    for item in items.values():
        q.add(item)
    for name in revoked:
        items[name].revoked = True
    for name in no_pending:
        items[name].pending.clear()
    assert "".join(drain(q)) == order
    assert q.sizes() == (0, 0)
    assert not q.has_ready()


def test_peek_leaves_the_head_and_drops_what_it_passes() -> None:
    q = queue()
    a, b = Item("a", seq=1, revoked=True), Item("b", seq=2)
    q.add(a)
    q.add(b)
    assert q.sizes() == (2, 0)
    assert q.peek() is b
    assert q.sizes() == (1, 0)  # the revoked head is gone, b stays
    assert q.peek() is b
    assert q.pop() is b
    assert q.peek() is None and q.pop() is None


@pytest.mark.parametrize(
    ("initial", "cap", "delays"),
    [
        pytest.param(0.1, 10.0, [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0], id="doubling"),
        pytest.param(1.0, 3.0, [1.0, 2.0, 3.0, 3.0], id="capped"),
        pytest.param(0.5, 0.5, [0.5, 0.5, 0.5], id="cap equals initial"),
        pytest.param(0.0, 10.0, [0.0, 0.0], id="no backoff"),
    ],
)
def test_retry_delay_doubles_up_to_the_cap(initial: float, cap: float, delays: list[float]) -> None:
    q = queue(initial=initial, cap=cap)
    assert [q.retry_delay(attempts) for attempts in range(1, len(delays) + 1)] == pytest.approx(
        delays
    )


@pytest.mark.parametrize(
    ("deferred", "steps"),
    [
        pytest.param(
            [("a", 1.0), ("b", 0.5)],
            [(0.4, "", 0.1), (0.5, "b", 0.5), (1.0, "a", None)],
            id="due in order of time",
        ),
        pytest.param(
            [("a", 0.0)],
            [(0.0, "a", None)],
            id="zero delay due at once",
        ),
        pytest.param(
            [("a", 2.0), ("b", 2.0)],
            [(1.9, "", 0.1), (5.0, "ab", None)],
            id="late promotion takes all due",
        ),
    ],
)
def test_readiness_over_time(
    deferred: list[tuple[str, float]], steps: list[tuple[float, str, float | None]]
) -> None:
    """Each step: advance the clock to ``at`` (seconds after the start), promote, and find
    ``ready`` taken and ``wait`` seconds until the next deferred unit (None: none left)."""
    clock = Clock()
    start = clock.now
    q = queue(clock)
    for seq, (name, delay) in enumerate(deferred):
        q.defer(Item(name, seq=seq), delay)
    assert not q.has_ready()
    for at, ready, wait in steps:
        clock.now = start + at
        q.promote()
        assert "".join(drain(q)) == ready
        got = q.wait_seconds()
        assert got == (None if wait is None else pytest.approx(wait))


def test_wait_is_never_negative_and_revoked_units_are_not_promoted() -> None:
    clock = Clock()
    q = queue(clock)
    a, b = Item("a", seq=1), Item("b", seq=2)
    q.defer(a, 1.0)
    q.defer(b, 1.0)
    clock.now += 3.0
    assert q.wait_seconds() == 0.0
    a.revoked = True
    q.promote()
    assert q.sizes() == (1, 0)
    assert drain(q) == ["b"]


def test_retry_defers_by_the_attempts_backoff_and_keeps_priority_order() -> None:
    clock = Clock()
    q = queue(clock, initial=1.0, cap=4.0)
    low, high = Item("low", priority=0, seq=1), Item("high", priority=9, seq=2)
    q.retry(low, 1)  # 1 s
    q.retry(high, 3)  # 4 s
    clock.now += 1.0
    q.promote()
    assert drain(q) == ["low"]
    clock.now += 2.9
    q.promote()
    assert drain(q) == []
    q.add(low)
    clock.now += 0.1
    q.promote()
    assert drain(q) == ["high", "low"]
