"""The cluster-state store: typed objects in Redis/Valkey with versioned compare-and-set, atomic
multi-object commits, a change feed with list+watch, informers and fenced leases.

This package is the only code in the project that speaks Redis.

``Store`` and ``redact_url`` are imported on first use: a CLI that only needs ``store.kinds`` (the
list of kinds) or the errors must not pay for the Redis client and its metrics.
"""

from typing import TYPE_CHECKING, Any

from store.errors import (
    AlreadyBoundError,
    AlreadyExistsError,
    CommitError,
    ConflictError,
    FencedError,
    InsufficientCapacityError,
    InvalidObjectError,
    NotFoundError,
    ObjectTooLargeError,
    ReplicationError,
    ResourceVersionTooNewError,
    ResourceVersionTooOldError,
    StoreError,
    StoreUnavailableError,
)

if TYPE_CHECKING:
    from store.client import Store, redact_url


def __getattr__(name: str) -> Any:
    if name in ("Store", "redact_url"):
        from store import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AlreadyBoundError",
    "AlreadyExistsError",
    "CommitError",
    "ConflictError",
    "FencedError",
    "InsufficientCapacityError",
    "InvalidObjectError",
    "NotFoundError",
    "ObjectTooLargeError",
    "ReplicationError",
    "ResourceVersionTooNewError",
    "ResourceVersionTooOldError",
    "Store",
    "StoreError",
    "StoreUnavailableError",
    "redact_url",
]
