"""Typed errors raised by the store. Every failure a caller may handle has its own class."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every store error."""


class StoreUnavailableError(StoreError):
    """The store server cannot be reached (connection refused, timed out or closed)."""


class ReplicationError(StoreUnavailableError):
    """A write reached the primary but not enough replicas within the timeout, so it is not
    acknowledged: like a lost reply, it may or may not survive a failover. Callers treat it as
    the store being unavailable (retry later; a retried commit is checked afresh)."""

    def __init__(self, wanted: int, timeout_ms: int, acknowledged: object) -> None:
        super().__init__(
            f"write not acknowledged: {acknowledged} of {wanted} replica(s) had it after "
            f"{timeout_ms} ms (is a replica down or still syncing?)"
        )
        self.wanted = wanted
        self.acknowledged = acknowledged


class NotFoundError(StoreError):
    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name!r} not found")
        self.kind = kind
        self.name = name


class AlreadyExistsError(StoreError):
    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name!r} already exists")
        self.kind = kind
        self.name = name


class ConflictError(StoreError):
    """A compare-and-set lost: the object is not at the version the writer expected."""

    def __init__(self, kind: str, name: str, expected: int, actual: int) -> None:
        super().__init__(
            f"{kind} {name!r} changed: expected resource_version {expected}, found {actual}"
        )
        self.kind = kind
        self.name = name
        self.expected = expected
        self.actual = actual


class InvalidObjectError(StoreError):
    """The object (or raw bytes) is malformed: wrong kind, undecodable, missing name, negative
    resource, ... ``field`` names the offending field when there is one."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.reason = message


class ObjectTooLargeError(InvalidObjectError):
    def __init__(self, kind: str, name: str, size: int, limit: int) -> None:
        super().__init__(f"{kind} {name!r} is {size} bytes, over the {limit}-byte limit")
        self.size = size
        self.limit = limit


class FencedError(StoreError):
    """A leader-only write carried an epoch that is no longer current: the writer was deposed."""

    def __init__(self, lease: str, epoch: int, current: int) -> None:
        super().__init__(f"lease {lease!r}: epoch {epoch} is not the current epoch {current}")
        self.lease = lease
        self.epoch = epoch
        self.current = current


class InsufficientCapacityError(StoreError):
    """Binding would over-commit a node's pool (the store's last line of defence)."""

    def __init__(self, node: str, pool: str, resource: str, detail: str = "") -> None:
        super().__init__(f"node {node!r} pool {pool}: insufficient {resource}{detail}")
        self.node = node
        self.pool = pool
        self.resource = resource


class AlreadyBoundError(StoreError):
    def __init__(self, pod: str, node: str) -> None:
        super().__init__(f"pod {pod!r} is already bound to {node!r}")
        self.pod = pod
        self.node = node


class ResourceVersionTooOldError(StoreError):
    """The change feed no longer holds the requested revision (Kubernetes' "410 Gone"): relist."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(
            f"revision {requested} is no longer in the change feed (oldest kept: {oldest}); relist"
        )
        self.requested = requested
        self.oldest = oldest


class ResourceVersionTooNewError(ResourceVersionTooOldError):
    """The requested revision is ahead of the store: a client's mistake, or a store that was
    reset under a watcher that remembers the old one. A watcher relists all the same (hence the
    base class), but a caller is told what happened, not that the feed was trimmed."""

    def __init__(self, requested: int, current: int) -> None:
        StoreError.__init__(
            self,
            f"revision {requested} is ahead of the store's current revision {current} "
            "(a revision this store never reached: was it reset?)",
        )
        self.requested = requested
        self.oldest = current
        self.current = current


class CommitError(StoreError):
    """An atomic commit failed one of its checks; nothing was written. ``index`` is the failing
    operation and ``cause`` the typed error for it."""

    def __init__(self, index: int, cause: StoreError) -> None:
        super().__init__(f"commit rejected at operation {index}: {cause}")
        self.index = index
        self.cause = cause
