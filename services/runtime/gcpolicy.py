"""Garbage collection for a process that holds a large cache for its whole life.

CPython's cyclic collector walks, in a full (generation 2) collection, every container object the
process holds. A service holds hundreds of thousands that live as long as it does — its informer
cache's indexes, 5,000 nodes' records, its queues — and the collector cannot know they are not
garbage. Measured with ``gc.callbacks`` in a run of 1,000 one-pod jobs a second: every service
ran a full collection every 3–5 s, each 35–175 ms long, and found 0–66 objects to free. Those
stalls were most of the p99 submit→bound latency, and their CPU was taken from scheduling.

So a service process:

- **freezes** (``gc.freeze``) what survives each full collection: the survivors move to the
  permanent generation, which no collection walks, so the next full collection walks only the
  objects that became long-lived since the last one (the records of pods that arrived
  meanwhile), not the whole cache again. Right after a full collection every object left is
  alive, so nothing collectable is frozen;
- freezes what its informer's listing builds, as it is built (``store.informer.
  freeze_what_listings_build``): a restart's records, a million pods' worth, are never walked
  by the collector (two walks of them, 0.6 s, came before the first health check was answered);
- runs one full collection, and so a freeze, when it starts serving (its caches loaded).

With that, a one-pod-jobs run spent about 0.25 s of each service's CPU in the collector, most of
it at start-up, and no young collection took over 5 ms. CPython's thresholds stay as they are:
young collections every 10,000 allocations instead of 700 saved a few percent of the CPU in
interleaved runs, but made middle-generation collections of up to 100,000 objects that stopped
the process for up to 65 ms.

The price is that a reference cycle that holds a frozen object is never collected, and its memory
is never freed. The services hold few cycles (the full collections above freed 0–66 objects);
``godel_gc_frozen_objects`` shows the frozen set, and it should track the caches' size — a set
that grows while the cluster does not is such a leak. Tests that run services in-process leave
the test runner's collector as it is: only ``serve`` (a process of its own) applies this.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import Gauge, Histogram

from store.informer import freeze_what_listings_build

OLDEST = 2

GC_PAUSE = Histogram(
    "godel_gc_pause_seconds",
    "How long each cyclic garbage collection stopped the process, by generation collected",
    ("generation",),
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
GC_PAUSE_CPU_MAX = Gauge(
    "godel_gc_pause_cpu_max_seconds",
    "The longest cyclic garbage collection since the process started, by generation, counting "
    "only its thread's CPU time (a busy machine's wait for a core left out)",
    ("generation",),
)
GC_FROZEN_OBJECTS = Gauge(
    "godel_gc_frozen_objects",
    "Objects moved out of the collector's sight (gc.freeze): the long-lived caches",
)
GC_FROZEN_OBJECTS.set_function(gc.get_freeze_count)


class CollectorHooks:
    """A ``gc.callbacks`` entry: times every collection into ``godel_gc_pause_seconds`` (and
    the longest in CPU time into ``godel_gc_pause_cpu_max_seconds``) and, with ``freeze``,
    freezes the survivors of every full collection."""

    def __init__(self, *, freeze: bool) -> None:
        self.freeze = freeze
        self._started = self._started_cpu = 0.0
        self._pauses = {str(g): GC_PAUSE.labels(str(g)) for g in range(OLDEST + 1)}
        # Per generation: the longest collection in CPU time, so a stall of the event loop can
        # be told the collector's (its own CPU) from waiting for a core (wall time only).
        self._cpu_max = {str(g): GC_PAUSE_CPU_MAX.labels(str(g)) for g in range(OLDEST + 1)}
        self.longest_cpu = [0.0] * (OLDEST + 1)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started, self._started_cpu = time.perf_counter(), time.thread_time()
            return
        generation = info["generation"]
        self._pauses[str(generation)].observe(time.perf_counter() - self._started)
        cpu = time.thread_time() - self._started_cpu
        if cpu > self.longest_cpu[generation]:
            self.longest_cpu[generation] = cpu
            self._cpu_max[str(generation)].set(cpu)
        if self.freeze and generation == OLDEST:
            # The collection is over and found everything it could: all that is left is alive.
            gc.freeze()

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


def tune_for_service() -> CollectorHooks:
    """The hooks, for the rest of the process's life. Called once, before the service starts."""
    hooks = CollectorHooks(freeze=True)
    hooks.install()
    freeze_what_listings_build()
    return hooks


def settle() -> int:
    """A full collection now (with the hooks installed, its survivors are frozen): once the
    service is serving, its caches loaded. Returns the number of objects frozen in all."""
    gc.collect()
    return gc.get_freeze_count()
