"""Object reads: one object, many by name, atomic listings of whole kinds (decoded, or as stored
and decoded one at a time), and the snapshot of every key a backup takes. Each is one round trip,
retried once on a broken connection."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast, overload

from google.protobuf.message import Message

from store import kinds as kinds_mod
from store.connection import StoreConnection, read_with_retry, translate_errors
from store.errors import InvalidObjectError, NotFoundError
from store.kinds import StoredObject

# A stored kind's message: reads return the type of the class asked for.
M = TypeVar("M", bound=StoredObject)


@dataclass(slots=True)
class ListResult:
    items: dict[str, list[StoredObject]]
    revision: int
    # Stored objects that could not be decoded (kind, name, error): reported, never fatal.
    errors: list[tuple[str, str, InvalidObjectError]] = field(default_factory=list)
    # Every bound pod's node claim at the same revision (only when asked for; see claims()).
    claims: dict[str, str] = field(default_factory=dict)

    def items_of(self, cls: type[M]) -> list[M]:
        """The listed objects of the kind whose message is ``cls``, typed by it."""
        # A kind's list holds its messages only (store.kinds decodes them).
        return cast("list[M]", self.items[kinds_mod.kind_for_class(cls).name])


@dataclass(slots=True)
class StoredListing:
    """An atomic listing as stored (``Store.list_stored``): per kind, each object's bytes and
    revision by name, decoded by ``objects``."""

    revision: int
    stored: dict[str, tuple[dict[bytes, bytes], dict[bytes, bytes]]] = field(default_factory=dict)
    errors: list[tuple[str, str, InvalidObjectError]] = field(default_factory=list)
    claims: dict[str, str] = field(default_factory=dict)

    def kinds(self) -> list[str]:
        return list(self.stored)

    def objects(self, kind_name: str) -> Iterator[StoredObject]:
        """The kind's objects, decoded one at a time; the listing lets go of the kind's bytes
        (a second call yields nothing). Undecodable ones are added to ``errors``."""
        datas, rvs = self.stored.pop(kind_name, ({}, {}))
        kind = kinds_mod.kind_named(kind_name)
        for raw_name, data in datas.items():
            rv = rvs.get(raw_name)
            if rv is None:
                continue
            try:
                yield kinds_mod.decode(kind, data, int(rv))
            except InvalidObjectError as exc:
                self.errors.append((kind.name, raw_name.decode(errors="replace"), exc))

    def encoded(self, kind_name: str) -> Iterator[tuple[str, bytes]]:
        """The kind's objects as (name, bytes with the resource version set), not decoded:
        what a cache holding them encoded keeps (``kinds.with_resource_version``). Their bytes
        are not checked here: the reader decodes each and handles the undecodable. Lets go of
        the kind's bytes like ``objects``."""
        datas, rvs = self.stored.pop(kind_name, ({}, {}))
        with_rv = kinds_mod.with_resource_version
        for raw_name, data in datas.items():
            rv = rvs.get(raw_name)
            if rv is not None:
                yield raw_name.decode(), with_rv(data, int(rv))

    def stored_of(self, kind_name: str) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
        """The kind's objects as stored: bytes and resource versions, each by name (an object
        without a version is not there). For a reader that reads the version only of what it
        keeps, sets it on what it decodes or appends it only to the bytes it keeps
        (``store.informer``'s ``take_listed``): no tuple made per object. Lets go of the kind's
        bytes like ``objects``."""
        return self.stored.pop(kind_name, ({}, {}))


class ObjectReads(StoreConnection):
    """Reads of stored objects: by name, many by name, whole kinds at one revision, and every
    key of the cluster at once (a backup)."""

    async def get(self, cls: type[M], name: str) -> M:
        kind = kinds_mod.kind_for_class(cls)

        async def fetch() -> list[Any]:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hget(self.keys.data(kind.name), name)
                pipe.hget(self.keys.versions(kind.name), name)
                replies: list[Any] = await pipe.execute()
                return replies

        data, rv = await read_with_retry(fetch)
        if data is None or rv is None:
            raise NotFoundError(kind.name, name)
        return kinds_mod.decode(kind, data, int(rv))

    async def get_many(self, cls: type[M], names: Sequence[str]) -> list[M | None]:
        """Objects by name in one round trip; None where absent."""
        if not names:
            return []
        kind = kinds_mod.kind_for_class(cls)

        async def fetch() -> list[Any]:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hmget(self.keys.data(kind.name), list(names))
                pipe.hmget(self.keys.versions(kind.name), list(names))
                replies: list[Any] = await pipe.execute()
                return replies

        datas, rvs = await read_with_retry(fetch)
        return [
            kinds_mod.decode(kind, d, int(v)) if d is not None and v is not None else None
            for d, v in zip(datas, rvs, strict=True)
        ]

    @overload
    async def list_all(self, cls: type[M]) -> tuple[list[M], int]: ...

    @overload
    async def list_all(self, cls: type[Message]) -> tuple[list[StoredObject], int]: ...

    async def list_all(self, cls: type[Message]) -> tuple[list[Any], int]:
        """Every object of a kind and the revision they are consistent with (typed by ``cls``
        when the class is known where it is called)."""
        result = await self.list_kinds([kinds_mod.kind_for_class(cls).name])
        items = next(iter(result.items.values()))
        return items, result.revision

    async def list_kinds(self, kind_names: Sequence[str], *, claims: bool = False) -> ListResult:
        """An atomic snapshot of several kinds and its revision: watching from that revision
        misses nothing and repeats nothing. ``claims`` adds the node claims of the same moment
        (what an audit compares the pods with)."""
        listing = await self.list_stored(kind_names, claims=claims)
        items = {kind: list(listing.objects(kind)) for kind in listing.kinds()}
        return ListResult(items, listing.revision, listing.errors, listing.claims)

    async def list_stored(
        self, kind_names: Sequence[str], *, claims: bool = False
    ) -> StoredListing:
        """``list_kinds`` before decoding: the stored bytes, decoded one object at a time by
        ``StoredListing.objects``. An informer listing a million pods decodes each into its
        cache as it goes instead of holding all of them decoded at once (2.6 GiB)."""
        kinds = [kinds_mod.kind_named(k) for k in kind_names]

        async def fetch() -> list[Any]:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.get(self.keys.revision)
                for kind in kinds:
                    pipe.hgetall(self.keys.data(kind.name))
                    pipe.hgetall(self.keys.versions(kind.name))
                if claims:
                    pipe.hgetall(self.keys.claims)
                replies: list[Any] = await pipe.execute()
                return replies

        replies = await read_with_retry(fetch)
        listing = StoredListing(int(replies[0] or 0))
        if claims:
            listing.claims = {k.decode(): v.decode() for k, v in replies[-1].items()}
        for i, kind in enumerate(kinds):
            listing.stored[kind.name] = (replies[1 + 2 * i], replies[2 + 2 * i])
        return listing

    # A backup's read (store/backup.py writes and restores the file).
    async def dump_keys(self) -> tuple[int, list[tuple[bytes, int, bytes]]]:
        """The revision and every key of this cluster as (key, ms to live or -1, DUMP payload),
        all read in one server-side script: a consistent snapshot, however busy the cluster.
        The script holds the server while it runs (tens of ms per 100,000 objects)."""
        with translate_errors():
            flat: Any = await self._snapshot_script(
                keys=[], args=[self.keys.pattern, self.keys.revision]
            )
        keys: dict[bytes, tuple[bytes, int, bytes]] = {}
        for i in range(1, len(flat), 3):
            keys[flat[i]] = (flat[i], int(flat[i + 1]), flat[i + 2])
        return int(flat[0]), list(keys.values())
