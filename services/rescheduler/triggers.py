"""When policies run by themselves: periods and cron expressions on a clock, and OS signals.

:class:`TriggerScheduler` calls ``fire(policy_name, trigger_kind)`` (kind ``"periodic"``,
``"cron"`` or ``"signal"``) each time a policy is due, as its own task. It only decides *when*:
keeping rounds of different policies apart is the caller's job (the policy manager's lock).

- A period counts from the previous periodic fire, the first one period after :meth:`run` starts
  (as the original's ticker does). Periods that pass while the process is stalled are dropped, not
  made up: the next fire is the next point on the same grid.
- A cron expression is read in UTC (croniter): the next matching time strictly after now.
- A policy with both fires at whichever is earlier; when both fall on the same instant it fires
  once, as ``"periodic"``.
- While a fire of a policy is still running, a trigger of that policy that comes due is skipped
  (and logged), not queued: a queued round would plan against a cluster the running one is about
  to change.

Time comes from a :class:`Clock`: :class:`SystemClock` in the service, :class:`ManualClock` in
tests, so a test of a five-minute period takes no real time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType
from typing import Protocol

import structlog

from services.rescheduler.config import CRON, PERIODIC, SIGNAL, PolicyConfig, TriggerConfig

log = structlog.get_logger(__name__)

# fire(policy_name, trigger_kind): run one round of the named policy.
FireFn = Callable[[str, str], Awaitable[None]]

# What signal.getsignal returns: a Python handler, SIG_DFL/SIG_IGN, or None (set outside Python).
_SignalHandler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


class Clock(Protocol):
    def now(self) -> float:
        """Unix seconds."""
        ...

    async def sleep_until(self, when: float) -> None:
        """Return once ``now() >= when`` (at once if it already is)."""
        ...


class SystemClock:
    """The real clock: wall time, as cron expressions mean it."""

    # asyncio sleeps on the monotonic clock, which does not follow steps of the wall clock (NTP,
    # suspend and resume); waking at least this often to re-read wall time bounds how late a fire
    # can be after one.
    MAX_NAP_SECONDS = 60.0

    def now(self) -> float:
        return time.time()

    async def sleep_until(self, when: float) -> None:
        while (remaining := when - time.time()) > 0:  # noqa: ASYNC110 (see above)
            await asyncio.sleep(min(remaining, self.MAX_NAP_SECONDS))


class ManualClock:
    """A clock for tests: time stands still until :meth:`advance` or :meth:`advance_to` moves it.

    Moving time wakes the sleepers whose time has come, earliest first, with ``now()`` set to each
    one's deadline while it runs, and lets the woken coroutines (and the tasks they start) run
    before going on; no real time passes.
    """

    def __init__(self, start: float = 0.0, settle_steps: int = 20) -> None:
        self._now = start
        # How many loop iterations to yield after a wake-up: enough for a woken coroutine to start
        # a task and for that task to run up to its first real wait.
        self._settle_steps = settle_steps
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()  # ties between equal deadlines: first asleep, first woken

    def now(self) -> float:
        return self._now

    @property
    def sleeping(self) -> int:
        """How many coroutines are waiting on this clock (a cancelled wait counts until its
        deadline passes)."""
        return sum(1 for _, _, future in self._sleepers if not future.done())

    async def sleep_until(self, when: float) -> None:
        if when <= self._now:
            await asyncio.sleep(0)  # still a suspension point, as a real sleep would be
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (when, next(self._order), future))
        await future

    async def advance(self, seconds: float) -> None:
        """Move time ``seconds`` forward, waking every sleeper due on the way."""
        await self.advance_to(self._now + seconds)

    async def advance_to(self, when: float) -> None:
        """Move time forward to ``when``, waking every sleeper due on the way."""
        if when < self._now:
            raise ValueError(f"time only moves forward: {when} is before now ({self._now})")
        # A woken coroutine may go back to sleep before ``when``: the loop picks that up too.
        while self._sleepers and self._sleepers[0][0] <= when:
            deadline, _, future = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            if not future.done():  # done = its sleeper was cancelled
                future.set_result(None)
                await self.settle()
        self._now = when
        await self.settle()

    async def settle(self) -> None:
        """Let ready coroutines run without moving time."""
        for _ in range(self._settle_steps):
            await asyncio.sleep(0)


@dataclass(frozen=True)
class Due:
    """The next time a policy's trigger fires, and which kinds fire then (periodic first)."""

    when: float
    kinds: tuple[str, ...]


def next_fire(trigger: TriggerConfig, *, after: float, last_periodic: float) -> Due | None:
    """When ``trigger`` next fires after ``after`` by its period or its cron expression,
    whichever is earlier; None when it has neither (or its cron expression matches no later
    time). ``last_periodic`` is when the period last fired (or when counting started)."""
    candidates: list[tuple[float, str]] = []
    if trigger.period_seconds is not None:
        periodic = next_periodic(trigger.period_seconds, after=after, last=last_periodic)
        candidates.append((periodic, PERIODIC))
    if trigger.cron is not None:
        cron = next_cron(trigger.cron, after=after)
        if cron is not None:
            candidates.append((cron, CRON))
    if not candidates:
        return None
    earliest = min(when for when, _ in candidates)
    return Due(earliest, tuple(kind for when, kind in candidates if when == earliest))


def next_periodic(period_seconds: float, *, after: float, last: float) -> float:
    """``last + period``; when that is not after ``after`` (the process stalled past it), the
    first later point of the same grid, so missed periods are dropped rather than fired in a
    burst."""
    if period_seconds <= 0:
        raise ValueError(f"period must be longer than zero, got {period_seconds}")
    upcoming = last + period_seconds
    if upcoming <= after:
        missed = math.floor((after - last) / period_seconds)
        upcoming = last + (missed + 1) * period_seconds
    return upcoming


def next_cron(expression: str, *, after: float) -> float | None:
    """The first time strictly after ``after`` that ``expression`` matches, in UTC; None when it
    matches no later time (an expression bound to a year that has passed)."""
    from croniter import CroniterBadDateError, croniter  # a cron trigger's only (config.py)

    start = datetime.fromtimestamp(after, tz=UTC)
    try:
        return float(croniter(expression, start).get_next(float))
    except CroniterBadDateError:
        return None


class _RunningFires:
    """The fire task of each policy while it runs; a policy gets a new one only when its last one
    is over. Failures are logged here, so a failed round never stops the triggers."""

    def __init__(self, fire: FireFn) -> None:
        self._fire = fire
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._kinds: dict[str, str] = {}

    def start(self, policy: str, kind: str) -> bool:
        """Start ``fire(policy, kind)`` as a task; False (and a log line) when the policy's
        previous fire is still running."""
        running = self._tasks.get(policy)
        if running is not None and not running.done():
            log.warning(
                "trigger skipped: the policy's previous run is still going",
                policy=policy,
                trigger=kind,
                running_trigger=self._kinds[policy],
            )
            return False
        log.info("policy triggered", policy=policy, trigger=kind)
        task = asyncio.create_task(self._run(policy, kind), name=f"rescheduler-{policy}-{kind}")
        self._tasks[policy] = task
        self._kinds[policy] = kind
        task.add_done_callback(lambda done: self._forget(policy, done))
        return True

    def is_running(self, policy: str) -> bool:
        task = self._tasks.get(policy)
        return task is not None and not task.done()

    async def cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, policy: str, kind: str) -> None:
        try:
            await self._fire(policy, kind)
        except Exception:
            log.exception("policy run failed", policy=policy, trigger=kind)

    def _forget(self, policy: str, done: asyncio.Task[None]) -> None:
        if self._tasks.get(policy) is done:
            del self._tasks[policy]
            del self._kinds[policy]


class TriggerScheduler:
    """Fires policies on their periods, cron expressions and signals (see the module doc)."""

    def __init__(
        self,
        policies: Sequence[PolicyConfig],
        fire: FireFn,
        clock: Clock | None = None,
    ) -> None:
        self._policies = tuple(policies)
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._fires = _RunningFires(fire)
        self._signal_loop: asyncio.AbstractEventLoop | None = None
        self._previous_handlers: dict[int, _SignalHandler] = {}

    def is_running(self, policy: str) -> bool:
        """Whether a fire of ``policy`` started by this scheduler is still running."""
        return self._fires.is_running(policy)

    async def run(self) -> None:
        """Fire periodic and cron triggers on time until cancelled. Fires still running when it
        is cancelled (signal ones too) are cancelled and awaited."""
        timed = [p for p in self._policies if {PERIODIC, CRON} & set(p.trigger.kinds())]
        try:
            async with asyncio.TaskGroup() as timers:
                for policy in timed:
                    timers.create_task(self._run_timer(policy), name=f"trigger-{policy.name}")
                # Wait to be cancelled even when no policy is timed: signals may still fire.
                await asyncio.Event().wait()
        finally:
            await self._fires.cancel_all()

    async def _run_timer(self, policy: PolicyConfig) -> None:
        last_periodic = self._clock.now()
        while True:
            due = next_fire(policy.trigger, after=self._clock.now(), last_periodic=last_periodic)
            if due is None:  # only when its cron expression matches no later time
                log.info("policy has no further timed fires", policy=policy.name)
                return
            await self._clock.sleep_until(due.when)
            if PERIODIC in due.kinds:
                last_periodic = due.when
            self._fires.start(policy.name, due.kinds[0])

    def install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``, make each configured signal fire every policy naming it. The scheduler
        owns those signals until :meth:`remove_signal_handlers`."""
        if self._signal_loop is not None:
            raise RuntimeError("signal handlers are already installed")
        by_signal: dict[int, list[str]] = {}
        for policy in self._policies:
            if policy.trigger.signal is not None:
                by_signal.setdefault(policy.trigger.signal, []).append(policy.name)
        for signum, names in by_signal.items():
            self._previous_handlers[signum] = signal.getsignal(signum)
            loop.add_signal_handler(signum, self._on_signal, signum, tuple(names))
            log.info("signal trigger installed", signal=signal.Signals(signum).name, policies=names)
        self._signal_loop = loop

    def remove_signal_handlers(self) -> None:
        """Undo :meth:`install_signal_handlers`, restoring the handlers the signals had before
        (asyncio alone would reset them to the default, which for SIGUSR1/2 and SIGHUP is to
        terminate the process)."""
        loop, self._signal_loop = self._signal_loop, None
        if loop is None:
            return
        for signum, previous in self._previous_handlers.items():
            loop.remove_signal_handler(signum)
            if previous is not None:
                signal.signal(signum, previous)
        self._previous_handlers.clear()

    def _on_signal(self, signum: int, policies: tuple[str, ...]) -> None:
        log.info("signal received", signal=signal.Signals(signum).name, policies=list(policies))
        for name in policies:
            self._fires.start(name, SIGNAL)
