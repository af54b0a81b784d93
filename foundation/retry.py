"""The one retry policy of every loop that tries again: how long to wait after each failure
(:class:`Backoff`) and one loop's progress through it within a deadline (:class:`Retry`).

A delay starts at ``initial`` and is multiplied by ``factor`` after each failure up to ``cap``
(``cap`` defaults to ``initial``: a constant delay, which is what a poll is); ``jitter`` draws
each delay uniformly from [0, delay] ("full jitter"), so that many clients of a restarted
server do not come back in step. Loops that reset their delay after a success call
:meth:`Retry.reset`. Which errors are worth retrying stays with each loop: it knows them.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Seconds to wait after each failure: ``initial * factor**attempt``, at most ``cap``."""

    initial: float
    cap: float | None = None  # None: ``initial`` every time (a constant poll interval)
    factor: float = 2.0
    jitter: bool = False

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failure ``attempt`` (0-based)."""
        if self.cap is None:
            ceiling = self.initial
        else:
            ceiling = min(self.cap, self.initial * self.factor**attempt)
        return random.uniform(0, ceiling) if self.jitter else ceiling


class Retry:
    """One loop's retries under a :class:`Backoff`, within ``deadline_seconds`` from its creation
    (none: no deadline). Not thread-safe; one per loop."""

    def __init__(
        self,
        policy: Backoff,
        *,
        deadline_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.attempt = 0  # failures since the start or the last reset
        self._clock = clock
        self._deadline = math.inf if deadline_seconds is None else clock() + deadline_seconds

    @property
    def expired(self) -> bool:
        """The deadline has passed."""
        return self._clock() >= self._deadline

    def remaining(self) -> float:
        """Seconds left before the deadline (negative once passed; infinite without one)."""
        return self._deadline - self._clock()

    def reset(self) -> None:
        """A success: the next failure waits the initial delay again."""
        self.attempt = 0

    def next_delay(self) -> float:
        """The delay after this failure, counting it."""
        delay = self.policy.delay(self.attempt)
        self.attempt += 1
        return delay

    async def sleep(self) -> None:
        """Count a failure and wait its delay (asyncio)."""
        await asyncio.sleep(self.next_delay())

    def sleep_sync(self) -> None:
        """Count a failure and wait its delay (blocking: for synchronous callers)."""
        time.sleep(self.next_delay())
