"""Reading a gRPC stream written with ``read()``/``write()`` (reads and writes run at once):
the messages of one type until the peer closes its side. The dispatcher reads its shard links
this way and a shard its dispatcher's stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

M = TypeVar("M", bound=Message)


async def messages(read: Callable[[], Awaitable[Any]], kind: type[M]) -> AsyncIterator[M]:
    """Each message ``read`` returns, until EOF. A message of another type is a broken
    contract between our own services, not bad input: it fails loudly (TypeError)."""
    while True:
        msg = await read()
        if msg is grpc.aio.EOF:
            return
        if not isinstance(msg, kind):
            raise TypeError(f"expected {kind.__name__} on the stream, got {type(msg).__name__}")
        yield msg
