"""The shard's queue of units: what to schedule next, and what waits out a backoff.

Pure and synchronous (no store, no gRPC, no event loop; the clock is injected), as the
dispatcher's ``unitqueue`` is, so its ordering and timing are table-tested on their own
(tests/test_scheduler_queue.py). The scheduling loop owns the one instance; it wakes the loop
itself when it adds or defers a unit.

- **Ready**: highest priority first, then arrival (``seq``). A unit revoked, or with nothing
  left to place, is dropped when met at the head (it is not searched for in the heap).
- **Backoff**: units not to try before a time (a Binder rejection's exponential retry delay, a
  view not caught up yet, a swap's wait); moved to ready once due (a revoked one is dropped).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sized
from typing import Generic, Protocol, TypeVar

from foundation.retry import Backoff


class Queued(Protocol):
    """What the queue reads of a unit."""

    @property
    def priority(self) -> int: ...

    @property
    def seq(self) -> int:
        """Arrival order (unique per shard): the tie-break among equal priorities."""
        ...

    @property
    def revoked(self) -> bool: ...

    @property
    def pending(self) -> Sized:
        """Pods still to place (empty: nothing to schedule)."""
        ...


U = TypeVar("U", bound=Queued)


class ShardQueue(Generic[U]):
    def __init__(
        self,
        backoff_initial_seconds: float,
        backoff_max_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._retry_policy = Backoff(backoff_initial_seconds, cap=backoff_max_seconds)
        self._clock = clock
        self._ready: list[tuple[int, int, U]] = []  # (-priority, arrival, unit)
        self._backoff: list[tuple[float, int, U]] = []  # (not before, arrival, unit)

    # -- adding ------------------------------------------------------------------------------

    def add(self, unit: U) -> None:
        """``unit`` is ready now."""
        heapq.heappush(self._ready, (-unit.priority, unit.seq, unit))

    def defer(self, unit: U, delay: float) -> None:
        """``unit`` is ready ``delay`` seconds from now."""
        heapq.heappush(self._backoff, (self._clock() + delay, unit.seq, unit))

    def retry_delay(self, attempts: int) -> float:
        """The backoff after the ``attempts``-th rejection: the initial delay doubled per
        attempt after the first, capped."""
        return self._retry_policy.delay(attempts - 1)

    def retry(self, unit: U, attempts: int) -> None:
        """Defer ``unit`` by the backoff of its ``attempts``-th rejection."""
        self.defer(unit, self.retry_delay(attempts))

    # -- time --------------------------------------------------------------------------------

    def wait_seconds(self) -> float | None:
        """How long until the first deferred unit is due (0 when it is); None: none waits."""
        if not self._backoff:
            return None
        return max(0.0, self._backoff[0][0] - self._clock())

    def promote(self) -> None:
        """Move every deferred unit now due to ready (a revoked one is dropped)."""
        backoff, ready = self._backoff, self._ready
        now = self._clock()
        while backoff and backoff[0][0] <= now:
            _, seq, unit = heapq.heappop(backoff)
            if not unit.revoked:
                heapq.heappush(ready, (-unit.priority, seq, unit))

    # -- taking ------------------------------------------------------------------------------

    def has_ready(self) -> bool:
        """Whether the ready heap holds anything (dropped units included: they are few)."""
        return bool(self._ready)

    def peek(self) -> U | None:
        """The next unit to schedule, left in place; the dropped ones met first are removed."""
        ready = self._ready
        while ready:
            unit = ready[0][2]
            if not unit.revoked and unit.pending:
                return unit
            heapq.heappop(ready)
        return None

    def pop(self) -> U | None:
        """The next unit to schedule, taken; None when none is ready."""
        unit = self.peek()
        if unit is not None:
            heapq.heappop(self._ready)
        return unit

    def sizes(self) -> tuple[int, int]:
        """(ready, backoff) entries, dropped units not yet met included."""
        return len(self._ready), len(self._backoff)
