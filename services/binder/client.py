"""How other services call the Binder leader's ``Evict`` (the one eviction path): the
rescheduler's batches and the dispatcher's quota reclaim both go through ``BinderEvictor``."""

from __future__ import annotations

import asyncio
import time

import grpc

from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from services.binder.service import LEASE as BINDER_LEASE
from store import Store

_POLL_SECONDS = 0.2


class EvictionUnavailable(Exception):
    """No Binder leader took the request in time, or the Binder refused it as a whole."""


class BinderEvictor:
    """Calls ``Binder.Evict`` on the current leader (found through its lease), again after a
    failover or while no leader is elected, within ``timeout_seconds``."""

    def __init__(self, store: Store, requester: str, timeout_seconds: float = 120.0) -> None:
        self.store = store
        self.requester = requester
        self.timeout = timeout_seconds

    async def evict(self, request: ipb.EvictRequest) -> ipb.EvictResponse:
        request.requester = self.requester
        deadline = time.monotonic() + self.timeout
        last = "no binder leader"
        while time.monotonic() < deadline:
            lease = await self.store.get_lease(BINDER_LEASE)
            if lease is None or not lease.holder_address:
                await asyncio.sleep(_POLL_SECONDS)
                continue
            async with grpc.aio.insecure_channel(lease.holder_address) as channel:
                stub = internal_pb2_grpc.BinderStub(channel)
                try:
                    response: ipb.EvictResponse = await stub.Evict(
                        request, timeout=max(0.1, deadline - time.monotonic())
                    )
                    return response
                except grpc.aio.AioRpcError as exc:
                    last = f"{exc.code().name}: {exc.details()}"
                    if exc.code() not in (
                        grpc.StatusCode.FAILED_PRECONDITION,
                        grpc.StatusCode.UNAVAILABLE,
                    ):
                        raise EvictionUnavailable(
                            f"the Binder refused the eviction: {last}"
                        ) from exc
            await asyncio.sleep(_POLL_SECONDS)
        raise EvictionUnavailable(
            f"no Binder leader took the eviction within {self.timeout:g}s ({last})"
        )
