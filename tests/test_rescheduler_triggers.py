"""Rescheduler triggers: when periods and cron expressions next fire, the manual clock, and the
scheduler firing policies on time (a ManualClock: no real sleeping), skipping a trigger while the
policy's previous fire runs, firing on signals, and stopping when cancelled."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest
from structlog.testing import capture_logs

from services.rescheduler.config import (
    CRON,
    PERIODIC,
    SIGNAL,
    PluginRef,
    PolicyConfig,
    TriggerConfig,
)
from services.rescheduler.triggers import (
    Due,
    ManualClock,
    SystemClock,
    TriggerScheduler,
    next_fire,
)


def utc(text: str) -> float:
    """Unix seconds of an ISO time in UTC, e.g. ``2026-01-01T10:07:20``."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def policy(name: str, trigger: TriggerConfig) -> PolicyConfig:
    return PolicyConfig(name, trigger, PluginRef("BinPacking"), PluginRef("BinPacking"))


Fired = tuple[str, str, float]  # (policy, trigger kind, clock time when fired)


class Recorder:
    """A ``fire`` that records each call with the clock's time."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.fired: list[Fired] = []
        self._changed = asyncio.Condition()

    async def __call__(self, name: str, kind: str) -> None:
        self.fired.append((name, kind, self.clock.now()))
        async with self._changed:
            self._changed.notify_all()

    async def wait_for_count(self, count: int) -> None:
        """Until ``count`` fires are recorded (a signal arrives through the loop's wake-up pipe,
        so this waits on the loop, not on the manual clock)."""
        async with asyncio.timeout(5), self._changed:
            await self._changed.wait_for(lambda: len(self.fired) >= count)


async def cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- next_fire ------------------------------------------------------------------------------------

START = utc("2026-01-01T10:07:20")


@pytest.mark.parametrize(
    ("trigger", "after", "last_periodic", "expected"),
    [
        (TriggerConfig(), START, START, None),
        (TriggerConfig(signal=int(signal.SIGUSR2)), START, START, None),
        (TriggerConfig(period_seconds=300), START, START, Due(START + 300, (PERIODIC,))),
        # Stalled past three periods: the next point of the grid, the missed ones dropped.
        (TriggerConfig(period_seconds=300), START + 950, START, Due(START + 1200, (PERIODIC,))),
        (
            TriggerConfig(cron="*/15 * * * *"),
            START,
            START,
            Due(utc("2026-01-01T10:15:00"), (CRON,)),
        ),
        # On a matching minute: strictly after, so the next one.
        (
            TriggerConfig(cron="0 3 * * *"),
            utc("2026-01-01T03:00:00"),
            0.0,
            Due(utc("2026-01-02T03:00:00"), (CRON,)),
        ),
        (
            TriggerConfig(period_seconds=60, cron="*/15 * * * *"),
            START,
            START,
            Due(START + 60, (PERIODIC,)),
        ),
        (
            TriggerConfig(period_seconds=3600, cron="*/15 * * * *"),
            START,
            START,
            Due(utc("2026-01-01T10:15:00"), (CRON,)),
        ),
        (
            TriggerConfig(period_seconds=460, cron="*/15 * * * *"),
            START,
            START,
            Due(utc("2026-01-01T10:15:00"), (PERIODIC, CRON)),
        ),
        (TriggerConfig(cron="0 3 * * * 0 2020"), START, START, None),
        (
            TriggerConfig(period_seconds=300, cron="0 3 * * * 0 2020"),
            START,
            START,
            Due(START + 300, (PERIODIC,)),
        ),
    ],
    ids=[
        "no-trigger",
        "signal-only",
        "period",
        "period-after-stall",
        "cron-next-quarter-hour",
        "cron-on-match-is-next-day",
        "period-earlier-than-cron",
        "cron-earlier-than-period",
        "period-and-cron-together",
        "cron-of-a-past-year-never",
        "period-with-cron-of-a-past-year",
    ],
)
def test_next_fire_is_the_earliest_of_period_and_cron(
    trigger: TriggerConfig, after: float, last_periodic: float, expected: Due | None
) -> None:
    assert next_fire(trigger, after=after, last_periodic=last_periodic) == expected


# -- ManualClock ----------------------------------------------------------------------------------


async def test_manual_clock_wakes_sleepers_in_order_at_their_deadlines() -> None:
    clock = ManualClock(start=100.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, when: float) -> None:
        await clock.sleep_until(when)
        woke.append((name, clock.now()))

    tasks = [
        asyncio.create_task(sleeper(name, when))
        for name, when in [("late", 160.0), ("early", 110.0), ("never", 500.0), ("past", 50.0)]
    ]
    await clock.settle()
    assert woke == [("past", 100.0)]
    await clock.advance(60)
    assert woke == [("past", 100.0), ("early", 110.0), ("late", 160.0)]
    assert clock.now() == 160.0
    assert clock.sleeping == 1
    await cancel(tasks[2])


async def test_manual_clock_refuses_to_go_back() -> None:
    clock = ManualClock(start=100.0)
    with pytest.raises(ValueError, match="time only moves forward"):
        await clock.advance_to(99.0)


@pytest.mark.parametrize("offset", [-5.0, 0.0, 0.02], ids=["past", "now", "20ms-ahead"])
async def test_system_clock_sleeps_until_wall_time_reaches_the_deadline(offset: float) -> None:
    clock = SystemClock()
    deadline = clock.now() + offset
    await clock.sleep_until(deadline)
    assert time.time() >= deadline


# -- timed triggers -------------------------------------------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=START)


@pytest.fixture
def recorder(clock: ManualClock) -> Recorder:
    return Recorder(clock)


@pytest.fixture
async def start_scheduler(
    clock: ManualClock, recorder: Recorder
) -> AsyncIterator[Callable[..., asyncio.Task[None]]]:
    """Start ``TriggerScheduler(policies, recorder, clock).run()`` as a task; cancelled after."""
    tasks: list[asyncio.Task[None]] = []

    def start(*policies: PolicyConfig) -> asyncio.Task[None]:
        scheduler = TriggerScheduler(policies, recorder, clock)
        task = asyncio.create_task(scheduler.run())
        tasks.append(task)
        return task

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize(
    ("policies", "until", "expected"),
    [
        (
            [policy("p", TriggerConfig(period_seconds=300))],
            START + 650,
            [("p", PERIODIC, START + 300), ("p", PERIODIC, START + 600)],
        ),
        (
            [policy("c", TriggerConfig(cron="*/15 * * * *"))],
            utc("2026-01-01T10:31:00"),
            [("c", CRON, utc("2026-01-01T10:15:00")), ("c", CRON, utc("2026-01-01T10:30:00"))],
        ),
        (
            [policy("both", TriggerConfig(period_seconds=600, cron="*/15 * * * *"))],
            utc("2026-01-01T10:31:00"),
            [
                ("both", CRON, utc("2026-01-01T10:15:00")),
                ("both", PERIODIC, START + 600),  # 10:17:20
                ("both", PERIODIC, START + 1200),  # 10:27:20
                ("both", CRON, utc("2026-01-01T10:30:00")),
            ],
        ),
        (
            [policy("both", TriggerConfig(period_seconds=460, cron="*/15 * * * *"))],
            utc("2026-01-01T10:16:00"),
            [("both", PERIODIC, utc("2026-01-01T10:15:00"))],  # once, not twice
        ),
        (
            [
                policy("fast", TriggerConfig(period_seconds=100)),
                policy("slow", TriggerConfig(period_seconds=250)),
            ],
            START + 300,
            [
                ("fast", PERIODIC, START + 100),
                ("fast", PERIODIC, START + 200),
                ("slow", PERIODIC, START + 250),
                ("fast", PERIODIC, START + 300),
            ],
        ),
        (
            [
                policy("rpc-only", TriggerConfig()),
                policy("on-signal", TriggerConfig(signal=int(signal.SIGUSR2))),
            ],
            START + 86400,
            [],
        ),
    ],
    ids=[
        "period-fires-each-period",
        "cron-fires-at-matching-minutes",
        "period-and-cron-fire-at-the-earliest",
        "period-and-cron-on-one-instant-fire-once",
        "policies-fire-independently",
        "untimed-policies-never-fire-by-time",
    ],
)
async def test_timed_triggers_fire_on_time(
    clock: ManualClock,
    recorder: Recorder,
    start_scheduler: Callable[..., asyncio.Task[None]],
    policies: list[PolicyConfig],
    until: float,
    expected: list[Fired],
) -> None:
    start_scheduler(*policies)
    await clock.settle()
    await clock.advance_to(until)
    assert recorder.fired == expected


async def test_period_does_not_fire_before_it_is_due(
    clock: ManualClock, recorder: Recorder, start_scheduler: Callable[..., asyncio.Task[None]]
) -> None:
    start_scheduler(policy("p", TriggerConfig(period_seconds=300)))
    await clock.settle()
    await clock.advance(299.9)
    assert recorder.fired == []
    await clock.advance(0.1)
    assert recorder.fired == [("p", PERIODIC, START + 300)]


async def test_a_due_trigger_is_skipped_while_the_policys_fire_runs(clock: ManualClock) -> None:
    # Each fire of "slow" takes 250 s against a 100 s period: the ones due at 200 and 300 find it
    # still running and are skipped, not queued; the one at 400 runs. "other" is not held up.
    started: list[Fired] = []

    async def fire(name: str, kind: str) -> None:
        started.append((name, kind, clock.now()))
        if name == "slow":
            await clock.sleep_until(clock.now() + 250)

    scheduler = TriggerScheduler(
        [
            policy("slow", TriggerConfig(period_seconds=100)),
            policy("other", TriggerConfig(period_seconds=150)),
        ],
        fire,
        clock,
    )
    task = asyncio.create_task(scheduler.run())
    await clock.settle()
    with capture_logs() as logs:
        await clock.advance(450)
    await cancel(task)

    assert started == [
        ("slow", PERIODIC, START + 100),
        ("other", PERIODIC, START + 150),
        ("other", PERIODIC, START + 300),
        ("slow", PERIODIC, START + 400),
        ("other", PERIODIC, START + 450),
    ]
    skipped = [e for e in logs if e["event"].startswith("trigger skipped")]
    assert [(e["policy"], e["trigger"]) for e in skipped] == [
        ("slow", PERIODIC),
        ("slow", PERIODIC),
    ]


async def test_a_failing_fire_does_not_stop_the_triggers(clock: ManualClock) -> None:
    fired: list[float] = []

    async def fire(name: str, kind: str) -> None:
        fired.append(clock.now())
        raise RuntimeError("round failed")

    task = asyncio.create_task(
        TriggerScheduler([policy("p", TriggerConfig(period_seconds=60))], fire, clock).run()
    )
    await clock.settle()
    with capture_logs() as logs:
        await clock.advance(120)
    await cancel(task)

    assert fired == [START + 60, START + 120]
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["policy run failed"] * 2


# -- signals --------------------------------------------------------------------------------------

SIGNAL_POLICIES = [
    policy("usr2-a", TriggerConfig(signal=int(signal.SIGUSR2))),
    policy("usr2-b", TriggerConfig(period_seconds=3600, signal=int(signal.SIGUSR2))),
    policy("usr1", TriggerConfig(signal=int(signal.SIGUSR1))),
    policy("timed", TriggerConfig(period_seconds=3600)),
]


@pytest.mark.parametrize(
    ("signum", "expected"),
    [
        (signal.SIGUSR2, {("usr2-a", SIGNAL), ("usr2-b", SIGNAL)}),
        (signal.SIGUSR1, {("usr1", SIGNAL)}),
    ],
    ids=["sigusr2", "sigusr1"],
)
async def test_a_signal_fires_exactly_the_policies_naming_it(
    clock: ManualClock,
    recorder: Recorder,
    signum: signal.Signals,
    expected: set[tuple[str, str]],
) -> None:
    scheduler = TriggerScheduler(SIGNAL_POLICIES, recorder, clock)
    scheduler.install_signal_handlers(asyncio.get_running_loop())
    try:
        os.kill(os.getpid(), signum)
        await recorder.wait_for_count(len(expected))
        await clock.settle()  # one handler fires all its policies: any extra would show by now
    finally:
        scheduler.remove_signal_handlers()
    assert {(name, kind) for name, kind, _ in recorder.fired} == expected
    assert len(recorder.fired) == len(expected)


async def test_removing_signal_handlers_restores_the_previous_ones(
    clock: ManualClock, recorder: Recorder
) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    scheduler = TriggerScheduler(SIGNAL_POLICIES, recorder, clock)
    scheduler.install_signal_handlers(asyncio.get_running_loop())
    installed = {s: signal.getsignal(s) for s in before}
    scheduler.remove_signal_handlers()
    assert installed != before
    assert {s: signal.getsignal(s) for s in before} == before


# -- stopping -------------------------------------------------------------------------------------


async def test_cancelling_run_stops_timers_and_running_fires(clock: ManualClock) -> None:
    fire_cancelled = asyncio.Event()

    async def fire(name: str, kind: str) -> None:
        try:
            await asyncio.Event().wait()  # a round that is still going
        except asyncio.CancelledError:
            fire_cancelled.set()
            raise

    scheduler = TriggerScheduler([policy("p", TriggerConfig(period_seconds=60))], fire, clock)
    task = asyncio.create_task(scheduler.run())
    await clock.settle()
    await clock.advance(60)
    assert scheduler.is_running("p")

    await cancel(task)

    assert fire_cancelled.is_set()
    assert not scheduler.is_running("p")
    assert clock.sleeping == 0
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_run_without_timed_policies_waits_until_cancelled(
    clock: ManualClock, recorder: Recorder
) -> None:
    scheduler = TriggerScheduler([policy("rpc-only", TriggerConfig())], recorder, clock)
    task = asyncio.create_task(scheduler.run())
    await clock.advance(86400)
    assert not task.done()
    await cancel(task)
    assert task.cancelled()
