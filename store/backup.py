"""Backups of one cluster's state: a consistent snapshot in a file, and restoring it.

``take`` reads every key of the cluster in one server-side script (``Store.dump_keys``), so a
backup of a running cluster is a state the store really was in: no commit half in it. The file
holds each key's DUMP payload (the server's own serialisation, with a checksum per key), so a
restore brings back the objects, their versions, the change feed, node accounting and leases
exactly. ``restore`` needs the server's admin (``RESTORE`` is refused to the services' user) and
replaces the cluster's keys: run it with the cluster's services stopped.

File layout: the line ``GODEL-STORE-BACKUP 1``, a JSON header line (cluster, revision, keys,
created, server version), then per key: key length (u32), key, ms to live (i64, -1 for none),
payload length (u32), payload.
"""

from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from store.client import Store
from store.errors import StoreError, StoreUnavailableError
from store.keys import Keys

MAGIC = b"GODEL-STORE-BACKUP 1\n"
_LENGTH = struct.Struct(">I")
_TTL = struct.Struct(">q")


class BackupError(StoreError):
    """A backup file cannot be written, read or restored; the message says why."""


@dataclass(frozen=True)
class Snapshot:
    cluster: str
    revision: int
    entries: list[tuple[bytes, int, bytes]]
    """(key, ms to live or -1, DUMP payload)."""
    created: str = ""
    server: str = ""


async def take(store: Store) -> Snapshot:
    """A consistent snapshot of ``store``'s cluster, taken while it runs."""
    revision, entries = await store.dump_keys()
    info: Any = await store.server_info()
    return Snapshot(
        cluster=store.cluster,
        revision=revision,
        entries=entries,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        server=f"{info.get('server_name', 'redis')} {info.get('valkey_version') or info.get('redis_version', '')}",
    )


def write(snapshot: Snapshot, path: Path) -> None:
    """Write ``snapshot`` to ``path`` (0600: it holds the whole cluster), atomically: a crash
    mid-write leaves no truncated backup under that name."""
    partial = path.with_name(path.name + ".partial")
    header = {
        "cluster": snapshot.cluster,
        "revision": snapshot.revision,
        "keys": len(snapshot.entries),
        "created": snapshot.created,
        "server": snapshot.server,
    }
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(MAGIC)
            out.write(json.dumps(header).encode() + b"\n")
            for key, ttl, payload in snapshot.entries:
                out.write(_LENGTH.pack(len(key)) + key + _TTL.pack(ttl))
                out.write(_LENGTH.pack(len(payload)) + payload)
            out.flush()
            os.fsync(out.fileno())
        partial.replace(path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise BackupError(f"cannot write backup {path}: {exc.strerror or exc}") from exc


def read(path: Path) -> Snapshot:
    """Read a backup file; BackupError if it is not one, or is truncated."""
    try:
        with path.open("rb") as src:
            if src.read(len(MAGIC)) != MAGIC:
                raise BackupError(f"{path} is not a godel store backup")
            try:
                header = json.loads(src.readline())
                cluster, revision, count = header["cluster"], header["revision"], header["keys"]
            except (ValueError, KeyError, TypeError) as exc:
                raise BackupError(f"{path}: malformed header: {exc}") from exc
            entries = [_read_entry(src, path) for _ in range(int(count))]
            if src.read(1):
                raise BackupError(f"{path}: data after the last of its {count} keys")
    except OSError as exc:
        raise BackupError(f"cannot read backup {path}: {exc.strerror or exc}") from exc
    return Snapshot(
        cluster=str(cluster),
        revision=int(revision),
        entries=entries,
        created=str(header.get("created", "")),
        server=str(header.get("server", "")),
    )


def _read_exactly(src: BinaryIO, size: int, path: Path) -> bytes:
    data = src.read(size)
    if len(data) != size:
        raise BackupError(f"{path} is truncated")
    return data


def _read_entry(src: BinaryIO, path: Path) -> tuple[bytes, int, bytes]:
    (key_length,) = _LENGTH.unpack(_read_exactly(src, _LENGTH.size, path))
    key = _read_exactly(src, key_length, path)
    (ttl,) = _TTL.unpack(_read_exactly(src, _TTL.size, path))
    (payload_length,) = _LENGTH.unpack(_read_exactly(src, _LENGTH.size, path))
    return key, ttl, _read_exactly(src, payload_length, path)


async def restore(admin_url: str, snapshot: Snapshot) -> int:
    """Replace the keys of the snapshot's cluster on the server at ``admin_url`` (a user allowed
    ``RESTORE``: the server's admin) with the snapshot's, in one transaction. Returns the number
    of keys restored. Keys of other clusters on the server are untouched."""
    keys = Keys(snapshot.cluster)
    prefix = keys.pattern.removesuffix("*").encode()
    if any(not key.startswith(prefix) for key, _, _ in snapshot.entries):
        raise BackupError(f"the backup holds keys outside cluster {snapshot.cluster!r}")
    client = aioredis.Redis.from_url(admin_url, decode_responses=False)
    try:
        stale = [key async for key in client.scan_iter(match=keys.pattern, count=1000)]
        async with client.pipeline(transaction=True) as pipe:
            if stale:
                pipe.unlink(*stale)
            for key, ttl, payload in snapshot.entries:
                pipe.restore(key, max(ttl, 0), payload, replace=True)
            await pipe.execute()
    except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
        raise StoreUnavailableError(f"store unreachable: {exc}") from exc
    except redis_errors.ResponseError as exc:
        raise BackupError(f"the server refused the restore: {exc}") from exc
    finally:
        await client.aclose()
    return len(snapshot.entries)
