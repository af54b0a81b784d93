"""The cluster-state store: typed objects in Redis/Valkey with versioned compare-and-set, atomic
multi-object commits, a change feed with list+watch, informers and fenced leases.

This package is the only code in the project that speaks Redis.
"""

from store.client import Store, redact_url
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
