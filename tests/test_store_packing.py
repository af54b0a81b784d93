"""Commands packed by hiredis (store.packing): byte for byte what redis-py's own packer sends,
the same errors, and a store whose connections use it."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.sentinel import SentinelManagedConnection
from redis.exceptions import DataError

from protos.godel.v1 import objects_pb2 as pb
from store import Store
from store.packing import HiredisPacking, packed_class
from tests.factories import job

# (case, command and arguments) — each packed by both packers.
CASES: list[tuple[str, tuple[Any, ...]]] = [
    ("plain", ("GET", "key")),
    ("bytes command", (b"GET", b"key")),
    ("spaces split", ("SCRIPT LOAD", "return 1")),
    ("bytes spaces split", (b"CLIENT SETNAME", b"godel")),
    ("ints and floats", ("XREAD", "COUNT", 4096, "BLOCK", 1000, "STREAMS", "f", "7-0")),
    ("negative and float", ("ZADD", "z", -3, 2.5, "m")),
    ("empty arguments", ("EVALSHA", "abc", 0, "", b"")),
    ("binary data", ("SET", "k", bytes(range(256)) * 40)),
    ("unicode", ("SET", "k", "pods é ✓")),
    ("memoryview", ("SET", "k", memoryview(b"view"))),
    ("long argument list", ("EVALSHA", "sha", 2, "a", "b", *[f"op {i}" for i in range(5000)])),
]


@pytest.mark.parametrize(("case", "args"), CASES, ids=[c for c, _ in CASES])
def test_hiredis_packs_what_redis_py_packs(case: str, args: tuple[Any, ...]) -> None:
    python = Connection()
    packed = packed_class(Connection)()
    assert b"".join(packed.pack_command(*args)) == b"".join(python.pack_command(*args)), case


@pytest.mark.parametrize("bad", [None, object(), [1, 2]])
def test_an_argument_redis_cannot_take_is_a_data_error(bad: Any) -> None:
    with pytest.raises(DataError):
        packed_class(Connection)().pack_command("SET", "k", bad)


@pytest.mark.parametrize(
    "base", [Connection, SSLConnection, UnixDomainSocketConnection, SentinelManagedConnection]
)
def test_every_connection_class_gets_the_packer_once(base: type[Any]) -> None:
    packed = packed_class(base)
    assert issubclass(packed, HiredisPacking) and issubclass(packed, base)
    assert packed_class(base) is packed  # made once
    assert packed_class(packed) is packed  # not wrapped twice


async def test_store_connections_pack_with_hiredis(store: Store) -> None:
    assert issubclass(store._redis.connection_pool.connection_class, HiredisPacking)
    # A commit of many ops (one script call, thousands of arguments) round-trips intact.
    created = await store.create_many([job(f"packed-{i}", replicas=1) for i in range(300)])
    assert all(isinstance(c, pb.Job) for c in created)
    back = await store.get_many(pb.Job, [f"packed-{i}" for i in range(300)])
    assert [b.metadata.name for b in back if b is not None] == [f"packed-{i}" for i in range(300)]
