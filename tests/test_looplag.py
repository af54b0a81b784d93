"""The loop-lag probe (services/runtime/looplag.py) on a real event loop: few wake-ups while
the loop is idle, its short period while the loop has work, and a stall seen either way."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from prometheus_client import REGISTRY

from services.runtime.looplag import IDLE_PERIOD_SECONDS, LoopLag, watch_loop_lag


def _wakeups() -> float:
    """The probe's wake-ups so far in this process, as its histogram counts them."""
    return REGISTRY.get_sample_value("godel_event_loop_lag_seconds_count") or 0.0


def _hold_the_loop(cpu_seconds: float) -> None:
    """A step that computes for ``cpu_seconds`` of its thread's CPU time without an await."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


@contextlib.asynccontextmanager
async def _probing(lag: LoopLag) -> AsyncIterator[None]:
    task = asyncio.create_task(watch_loop_lag(lag))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _busy(seconds: float) -> None:
    """Work in small steps for ``seconds``: a loop with work that never stalls long."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _hold_the_loop(0.001)
        await asyncio.sleep(0)


async def test_an_idle_loop_is_probed_ten_times_a_second_not_a_hundred() -> None:
    """Nothing to do for a second: the probe wakes at most every 50 ms (10 times a second at
    its idle period; it woke 100 times a second before), and a stall that follows is still
    seen, to within the idle period."""
    lag = LoopLag()
    async with _probing(lag):
        await asyncio.sleep(0.3)  # past the first (short) interval
        before, started = _wakeups(), time.monotonic()
        await asyncio.sleep(1.0)
        woke, elapsed = _wakeups() - before, time.monotonic() - started
        assert 0 < woke <= elapsed / 0.05
        assert lag.max_seconds < 0.3

        _hold_the_loop(0.3)
        await asyncio.sleep(0.25)  # the probe wakes (late) and records it
    assert lag.max_seconds >= 0.3 - IDLE_PERIOD_SECONDS
    assert lag.held_max_seconds >= 0.3 - IDLE_PERIOD_SECONDS


async def test_a_loop_with_work_is_probed_every_10_ms() -> None:
    """While the loop works in small steps the probe keeps its 10 ms period (many more
    wake-ups than the idle period gives), so a stall amid work is seen to within 10 ms."""
    lag = LoopLag()
    async with _probing(lag):
        await _busy(0.2)
        before, started = _wakeups(), time.monotonic()
        await _busy(0.5)
        woke, elapsed = _wakeups() - before, time.monotonic() - started
        # More than the idle period could give over the same time, by a wide margin: measured
        # against the time that really passed, as on a loaded machine every sleep runs long.
        assert woke >= 2 * elapsed / IDLE_PERIOD_SECONDS + 2
        _hold_the_loop(0.15)
        await _busy(0.1)
    assert lag.max_seconds >= 0.14
