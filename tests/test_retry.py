"""foundation.retry: the one backoff policy of the loops that retry, and a loop's deadline."""

from __future__ import annotations

import asyncio
import random

import pytest

from foundation.retry import Backoff, Retry


@pytest.mark.parametrize(
    ("policy", "delays"),
    [
        # A constant poll (the Binder's leader lookup, the store connect at startup).
        (Backoff(0.5), [0.5, 0.5, 0.5, 0.5]),
        # Doubling to a cap (the informer's relist, the node agent's status writes).
        (Backoff(0.05, cap=0.2), [0.05, 0.1, 0.2, 0.2, 0.2]),
        (Backoff(0.05, cap=2.0), [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]),
        (Backoff(1.0, cap=60.0), [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]),
        # Another factor.
        (Backoff(1.0, cap=100.0, factor=3.0), [1.0, 3.0, 9.0, 27.0, 81.0, 100.0]),
        # A cap at the initial delay is a constant delay.
        (Backoff(0.2, cap=0.2), [0.2, 0.2, 0.2]),
    ],
)
def test_delays(policy: Backoff, delays: list[float]) -> None:
    assert [policy.delay(attempt) for attempt in range(len(delays))] == delays
    retry = Retry(policy)
    assert [retry.next_delay() for _ in delays] == delays
    assert retry.attempt == len(delays)
    retry.reset()
    assert retry.next_delay() == delays[0]


@pytest.mark.parametrize(
    ("attempt", "ceiling"), [(0, 0.2), (1, 0.4), (2, 0.8), (4, 3.2), (5, 5.0), (30, 5.0)]
)
def test_jitter_draws_within_zero_and_the_delay(attempt: int, ceiling: float) -> None:
    policy = Backoff(0.2, cap=5.0, jitter=True)
    draws = [policy.delay(attempt) for _ in range(200)]
    assert all(0 <= d <= ceiling for d in draws)
    assert len(set(draws)) > 1  # jittered, not constant
    random.seed(7)
    first = policy.delay(attempt)
    random.seed(7)
    assert random.uniform(0, ceiling) == first  # full jitter: uniform in [0, delay]


@pytest.mark.parametrize(
    ("deadline", "elapsed", "expired", "remaining"),
    [
        (None, 1e9, False, float("inf")),
        (10.0, 0.0, False, 10.0),
        (10.0, 9.5, False, 0.5),
        (10.0, 10.0, True, 0.0),
        (10.0, 12.0, True, -2.0),
        (0.0, 0.0, True, 0.0),
    ],
)
def test_deadline(deadline: float | None, elapsed: float, expired: bool, remaining: float) -> None:
    now = [100.0]
    retry = Retry(Backoff(1.0), deadline_seconds=deadline, clock=lambda: now[0])
    now[0] += elapsed
    assert retry.expired is expired
    assert retry.remaining() == remaining


async def test_sleep_waits_the_delay_and_counts_the_failure() -> None:
    retry = Retry(Backoff(0.01, cap=0.04))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await retry.sleep()
    await retry.sleep()
    assert loop.time() - started >= 0.03
    assert retry.attempt == 2
    retry.sleep_sync()
    assert retry.attempt == 3
    assert retry.next_delay() == 0.04
