"""The store's Prometheus metrics: round-trip time per kind of call, and informer lag.

Defined here rather than with the services' metrics (``services/metrics.py``) because the store
is the layer below the services and the only code that talks to Redis: every service that uses a
``Store`` or an ``Informer`` reports these without doing anything.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Protocol

from prometheus_client import REGISTRY, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# From a loopback round trip (~100 µs) to a store stalled by a long script or an fsync.
_ROUND_TRIP_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip

STORE_ROUND_TRIP = Histogram(
    "godel_store_round_trip_seconds",
    "Time from sending a request to the store to its reply, by operation: read (get, list, "
    "revision), commit (one pipelined call of many commits), lease, heartbeat. Blocking watch "
    "reads are not counted.",
    ["operation"],
    buckets=_ROUND_TRIP_BUCKETS,
)
# Children bound once: labels() per call would cost a dict lookup and a lock on the hot path.
READ_ROUND_TRIP = STORE_ROUND_TRIP.labels("read")
COMMIT_ROUND_TRIP = STORE_ROUND_TRIP.labels("commit")
LEASE_ROUND_TRIP = STORE_ROUND_TRIP.labels("lease")
HEARTBEAT_ROUND_TRIP = STORE_ROUND_TRIP.labels("heartbeat")

LEASE_RENEWAL_LATENESS = Histogram(
    "godel_lease_renewal_lateness_seconds",
    "How late a held lease's renewal was confirmed: from when it was due (the renewal period "
    "after the last one was sent) to the store's reply. A lease is lost when this reaches the "
    "lease's duration minus the period.",
    ["lease"],
    buckets=_ROUND_TRIP_BUCKETS,
)
LEASE_RENEWAL_LATENESS_MAX = Gauge(
    "godel_lease_renewal_lateness_max_seconds",
    "The greatest lateness of a held lease's renewal since the process started.",
    ["lease"],
)

SHARD_HEARTBEAT_GAP_MAX = Gauge(
    "godel_shard_heartbeat_gap_max_seconds",
    "The longest time between two liveness stamps a scheduler shard wrote (store.pulse), since "
    "the process started. A shard is judged dead when this passes the dispatcher's "
    "shard_grace_seconds; a busy event loop does not lengthen it (the stamps have a thread of "
    "their own).",
    ["shard"],
)


class _Lagging(Protocol):
    kinds: list[str]
    # The changes of the feed it read (decoded), passed over as hinted, refused by ``reads``.
    changes_read: int
    passed_over: int
    unread: int

    def staleness(self) -> float: ...


class _InformerLag(Collector):
    """``godel_store_informer_lag_seconds``: per running informer (labelled by the kinds it
    watches), how far its cache is behind the store — 0 while it keeps up, else the seconds since
    it last held everything the store had (``Informer.staleness``). Read at scrape time, so it
    costs the informer nothing. With it, ``godel_store_informer_changes_total{kinds,outcome}``:
    the changes of the feed the informers of those kinds read (decoded: ``read``), passed over
    as their writers hinted (``passed_over``), or refused by name (``unread``)."""

    NAME = "godel_store_informer_lag_seconds"
    HELP = "How far an informer's cache is behind the store, in seconds (0 while it keeps up)"

    def __init__(self) -> None:
        self._informers: weakref.WeakSet[_Lagging] = weakref.WeakSet()
        self._lock = threading.Lock()  # scrapes run on another thread

    def track(self, informer: _Lagging) -> None:
        with self._lock:
            self._informers.add(informer)

    def forget(self, informer: _Lagging) -> None:
        with self._lock:
            self._informers.discard(informer)

    CHANGES = "godel_store_informer_changes"
    CHANGES_HELP = (
        "Changes of the store's feed the informers read (decoded), passed over as their "
        "writers hinted, or refused by name before decoding, by the kinds they watch"
    )

    def describe(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        return [
            GaugeMetricFamily(self.NAME, self.HELP, labels=["kinds"]),
            CounterMetricFamily(self.CHANGES, self.CHANGES_HELP, labels=["kinds", "outcome"]),
        ]

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        with self._lock:
            informers = list(self._informers)
        worst: dict[str, float] = {}
        counts: dict[tuple[str, str], int] = {}
        for informer in informers:
            kinds = ",".join(informer.kinds)
            worst[kinds] = max(worst.get(kinds, 0.0), informer.staleness())
            for outcome, n in (
                ("read", informer.changes_read),
                ("passed_over", informer.passed_over),
                ("unread", informer.unread),
            ):
                counts[kinds, outcome] = counts.get((kinds, outcome), 0) + n
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=["kinds"])
        for kinds, lag in sorted(worst.items()):
            family.add_metric([kinds], lag)
        changes = CounterMetricFamily(self.CHANGES, self.CHANGES_HELP, labels=["kinds", "outcome"])
        for (kinds, outcome), n in sorted(counts.items()):
            changes.add_metric([kinds, outcome], n)
        return [family, changes]


INFORMER_LAG = _InformerLag()
REGISTRY.register(INFORMER_LAG)
