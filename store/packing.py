"""Commands packed into the Redis protocol by hiredis, in C.

redis-py's asyncio connections pack every command in Python, one argument at a time (its
blocking client already uses hiredis). A commit of a thousand one-pod jobs is five thousand
arguments, and packing them was a few microseconds per job in the dispatcher, spent again for
every bind and status write. :func:`pack_with_hiredis` gives a client's connections hiredis's
packer, keeping redis-py's rules: a command name holding spaces is split into words, and an
argument of a type Redis cannot take raises ``DataError``.
"""

from __future__ import annotations

from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.exceptions import DataError


class HiredisPacking:
    """Mixed in before a redis-py asyncio connection class: its ``pack_command`` in C."""

    def pack_command(self, *args: Any) -> list[bytes]:
        command = args[0]
        if isinstance(command, str):
            args = (*command.encode().split(), *args[1:])
        elif b" " in command:
            args = (*command.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError as exc:  # e.g. None: what redis-py's own encoder raises for it
            raise DataError(str(exc)) from None


_PACKED_CLASSES: dict[type[Any], type[Any]] = {}


def packed_class(connection_class: type[Any]) -> type[Any]:
    """``connection_class`` with hiredis packing (one subclass per class, made once)."""
    if issubclass(connection_class, HiredisPacking):
        return connection_class
    packed = _PACKED_CLASSES.get(connection_class)
    if packed is None:
        packed = type(
            f"HiredisPacking{connection_class.__name__}", (HiredisPacking, connection_class), {}
        )
        _PACKED_CLASSES[connection_class] = packed
    return packed


def pack_with_hiredis(client: aioredis.Redis) -> aioredis.Redis:
    """Make ``client``'s new connections pack commands with hiredis (before any is opened:
    the pool's class is what it builds connections from, whatever the URL chose — TCP, TLS,
    a Unix socket, or Sentinel's managed connection)."""
    pool = client.connection_pool
    pool.connection_class = packed_class(pool.connection_class)
    return client
