"""Paged List: the sorted snapshot a listing's continue tokens page through.

A page used to filter and sort every object of the kind again, so reading a kind in pages cost
O(N log N) per page and O(N² / page) in all: listing a million pods in pages of 5,000 took the
dispatcher's event loop minutes. As Kubernetes' continue tokens do, the first page now keeps the
sorted, filtered result (references to the informer's objects, which are replaced on change,
never changed in place; pods encoded, ``store.encoded.EncodedList``) and its token names that
snapshot: each next page is a binary search
and a slice, and the whole listing is consistent at the first page's revision.

A snapshot serves only the request it was made for (kind, selectors, job and the caller's
identity: a tenant never pages through another's view). One expired, evicted or made for other
parameters is not an error: the page is computed afresh from the current objects after the
token's last name, as every page was before.
"""

from __future__ import annotations

import base64
import binascii
import time
import uuid
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from google.protobuf.message import Message

from services.dispatcher.objects import metadata_of
from store.encoded import EncodedList

# Kept this long after its last page was read, and at most this many at once (a list of
# references: 8 bytes an object).
SNAPSHOT_TTL_SECONDS = 60.0
MAX_SNAPSHOTS = 16
# ':' is not allowed in object names (DNS-1123), so it separates the snapshot from the name.
_SEPARATOR = ":"


class MalformedTokenError(ValueError):
    """A continue token this server did not make."""


def _name(obj: Message) -> str:
    return metadata_of(obj).name


def encode_token(snapshot: str, last_name: str) -> str:
    raw = f"{snapshot}{_SEPARATOR}{last_name}" if snapshot else last_name
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_token(token: str) -> tuple[str, str]:
    """(snapshot id or "", last name of the previous page). A token of an older server is only
    a name: it pages on without a snapshot."""
    try:
        raw = base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raw = ""
    snapshot, _, after = raw.rpartition(_SEPARATOR)
    if not after:
        raise MalformedTokenError("continue_token: malformed")
    return snapshot, after


@dataclass
class _Snapshot:
    key: Hashable
    objects: Sequence[Message]  # sorted by name
    revision: int
    expires: float


class ListingSnapshots:
    """The snapshots of listings still being paged through (plain state; the clock is given)."""

    def __init__(
        self, ttl_seconds: float = SNAPSHOT_TTL_SECONDS, max_snapshots: int = MAX_SNAPSHOTS
    ) -> None:
        self.ttl = ttl_seconds
        self.max_snapshots = max_snapshots
        self._snapshots: OrderedDict[str, _Snapshot] = OrderedDict()

    def __len__(self) -> int:
        return len(self._snapshots)

    def keep(
        self, key: Hashable, objects: Sequence[Message], revision: int, now: float | None = None
    ) -> str:
        """Keep a sorted listing for its next pages; returns the snapshot's id."""
        now = time.monotonic() if now is None else now
        self._expire(now)
        while len(self._snapshots) >= self.max_snapshots:
            self._snapshots.popitem(last=False)  # the least recently read
        snapshot_id = uuid.uuid4().hex
        self._snapshots[snapshot_id] = _Snapshot(key, objects, revision, now + self.ttl)
        return snapshot_id

    def window(
        self, snapshot_id: str, key: Hashable, after: str, size: int, now: float | None = None
    ) -> tuple[list[Message], int] | None:
        """Up to ``size`` objects after the name ``after`` and the snapshot's revision; None
        when the snapshot is gone or was made for another request. Reading renews it."""
        now = time.monotonic() if now is None else now
        self._expire(now)
        snapshot = self._snapshots.get(snapshot_id)
        if snapshot is None or snapshot.key != key:
            return None
        snapshot.expires = now + self.ttl
        self._snapshots.move_to_end(snapshot_id)
        objects = snapshot.objects
        if isinstance(objects, EncodedList):
            start = objects.position_after(after)
        else:
            start = bisect_right(objects, after, key=_name)
        return list(objects[start : start + size]), snapshot.revision

    def drop(self, snapshot_id: str) -> None:
        """The listing's last page was read."""
        self._snapshots.pop(snapshot_id, None)

    def _expire(self, now: float) -> None:
        for snapshot_id in [i for i, s in self._snapshots.items() if s.expires <= now]:
            del self._snapshots[snapshot_id]
