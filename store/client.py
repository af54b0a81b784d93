"""Store: the async client every service uses to read and write the cluster state.

``Store`` is one class composed of one part per concern, each in its own module:

| part | module | what it does |
|---|---|---|
| ``StoreConnection`` | ``store/connection.py`` | connecting (directly, or through Sentinel to a replicated store's primary), the error translation and read retry, the wait for replicas |
| ``ObjectReads`` | ``store/reads.py`` | ``get``, ``get_many``, ``list_all``/``list_kinds``/``list_stored``, ``dump_keys`` |
| ``ObjectWrites`` | ``store/writes.py`` | ``create``/``update``/``delete``, ``commit``/``commit_many`` (the ops are in ``store/ops.py``), ``create_many``/``update_many``/``create_unit``/``bind``, ``replication_barrier`` |
| ``ChangeFeed`` | ``store/feed.py`` | ``revision``, ``oldest_revision``, ``watch`` |
| ``Leases`` | ``store/lease.py`` | ``acquire_lease``/``renew_lease``/``release_lease``/``get_lease`` (the ``Fence`` they prove) |
| ``NodeHeartbeats``, ``NodeAccounting`` | ``store/nodes.py`` | ``record_heartbeats``/``heartbeats``/``stale_heartbeats``/``forget_heartbeats``; ``node_usage``/``claims``/``claim_count`` |
| ``ShardHeartbeats`` | ``store/pulse.py`` | ``record_shard_heartbeat``/``shard_heartbeats``/``forget_shard_heartbeat`` (scheduler shards' liveness stamps; ``ShardPulse`` writes them from a thread) |

The parts are mixins of one class rather than objects ``Store`` holds: a call such as
``store.commit`` or ``store.watch`` is one method lookup on the store, as it was before the split,
with nothing forwarded on the way. Every name callers import from here stays importable here.
"""

from __future__ import annotations

from store.connection import DEFAULT_FEED_MAX_LEN, SENTINEL_SCHEME, SentinelTarget, redact_url
from store.feed import ChangeFeed, EventType, WatchBatch, WatchEvent
from store.lease import Fence, Leases
from store.nodes import Heartbeats, NodeAccounting, NodeHeartbeats, NodeUsage, StaleBeats
from store.ops import (
    MAX_OPS_PER_CALL,
    POD_STARTED,
    Bind,
    Create,
    Delete,
    Op,
    Release,
    Update,
    hinted_start,
    new_uid,
    pod_started_hint,
)
from store.pulse import ShardHeartbeats
from store.reads import ListResult, ObjectReads, StoredListing
from store.writes import ObjectWrites


class Store(
    ObjectReads,
    ObjectWrites,
    ChangeFeed,
    Leases,
    NodeHeartbeats,
    NodeAccounting,
    ShardHeartbeats,
):
    """Async client of one cluster's state. Cheap to share between tasks of one process.

    ``Store.connect(url)`` connects; every method comes from one of the parts listed in this
    module's docstring, all sharing the one connection that ``StoreConnection`` holds."""


__all__ = [
    "DEFAULT_FEED_MAX_LEN",
    "MAX_OPS_PER_CALL",
    "POD_STARTED",
    "SENTINEL_SCHEME",
    "Bind",
    "Create",
    "Delete",
    "EventType",
    "Fence",
    "Heartbeats",
    "ListResult",
    "NodeUsage",
    "Op",
    "Release",
    "SentinelTarget",
    "StaleBeats",
    "Store",
    "StoredListing",
    "Update",
    "WatchBatch",
    "WatchEvent",
    "hinted_start",
    "new_uid",
    "pod_started_hint",
    "redact_url",
]
