"""How long the event loop was kept from running anything else: the loop-lag probe.

Every service does all its work on one asyncio loop; a step that runs long without an ``await``
(encoding a 100,000-pod unit, tallying a big job's pods) stops every other task meanwhile —
shard streams, heartbeats, the informer, every RPC. Such a stall shows nowhere else: CPU use
looks the same whether the work came in slices or in one piece.

:func:`watch_loop_lag` is a task that sleeps again and again and records how late it woke: the
longest any other step held the loop, to within the period. Its lateness goes into
``godel_event_loop_lag_seconds`` (a histogram: how often the loop stalled how long) and its
greatest since the process started into ``godel_event_loop_lag_max_seconds``.

It sleeps ``PERIOD_SECONDS`` (10 ms) while the loop has work and ``IDLE_PERIOD_SECONDS`` (100 ms)
once it has none — the loop's thread used under ``BUSY_SHARE`` of the last interval's time. A
wake-up of an idle process is what the probe costs (~50 µs of kernel and loop each: 100 a second
were most of an idle service's CPU, 8–10 millicores of its ~10); an idle loop has nothing to
stall it. A stall shows as CPU used, so the first interval after it is a short one again: only
the first stall after a quiet spell is seen to within 100 ms rather than 10 ms (it is seen; its
length is at most 100 ms more than recorded).

On a machine with more runnable processes than cores, lateness also counts the time the process
waited for a core. ``godel_event_loop_held_max_seconds`` counts only what the loop's own thread
spent: the greatest lateness no longer than the thread's CPU time over the same interval
(``time.thread_time``) — the part of a stall the service's own steps made. The runtime runs it
in every service once the service is serving (``ServiceHost.start``): start-up's own long steps —
listing the whole store into the informer — are not what it watches for.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import Gauge, Histogram

# The probe's period while the loop has work: one timer and one histogram observation each.
PERIOD_SECONDS = 0.01
# Its period once the loop is idle (10 wake-ups a second rather than 100).
IDLE_PERIOD_SECONDS = 0.1
# The loop counts as busy while its thread's CPU time is at least this share of an interval.
BUSY_SHARE = 0.05

LOOP_LAG = Histogram(
    "godel_event_loop_lag_seconds",
    "How late the event loop ran a task due now (a probe sleeping 10 ms each time, 100 ms "
    "while the loop is idle): how long some other step held the loop",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
LOOP_LAG_MAX = Gauge(
    "godel_event_loop_lag_max_seconds",
    "The longest the event loop was held by one step since the process started (the loop-lag "
    "probe's greatest lateness)",
)
LOOP_HELD_MAX = Gauge(
    "godel_event_loop_held_max_seconds",
    "The longest stall of the event loop since the process started, counting only the CPU time "
    "of the loop's thread (not the time the process waited for a core on a busy machine)",
)


class LoopLag:
    """What the probe has seen in this process: its greatest lateness (also in the gauge)."""

    def __init__(self) -> None:
        self.max_seconds = 0.0
        self.held_max_seconds = 0.0

    def record(self, late: float, cpu: float) -> None:
        """One wake-up ``late`` seconds after it was due, the loop's thread having used
        ``cpu`` seconds of CPU since the probe went to sleep."""
        late = max(0.0, late)
        LOOP_LAG.observe(late)
        if late > self.max_seconds:
            self.max_seconds = late
            LOOP_LAG_MAX.set(late)
        held = min(late, cpu)
        if held > self.held_max_seconds:
            self.held_max_seconds = held
            LOOP_HELD_MAX.set(held)


async def watch_loop_lag(
    lag: LoopLag,
    period: float = PERIOD_SECONDS,
    idle_period: float = IDLE_PERIOD_SECONDS,
) -> None:
    """Sleep again and again, recording how late each wake-up was, until cancelled: ``period``
    after an interval in which the loop's thread was busy, ``idle_period`` after one in which
    it was idle."""
    loop = asyncio.get_running_loop()
    sleep = period
    while True:
        started = loop.time()
        due = started + sleep
        cpu = time.thread_time()
        await asyncio.sleep(sleep)
        woke = loop.time()
        used = time.thread_time() - cpu
        lag.record(woke - due, used)
        sleep = period if used >= BUSY_SHARE * (woke - started) else idle_period
