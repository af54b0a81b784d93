"""What the Binder publishes: the name of its leader lease (whose holder address is where the
leader serves), the trailer a standby names the leader in, and the client side of
``Binder.Evict`` for the services that evict without scheduling (the rescheduler's movements,
the dispatcher's quota reclaim and drain, a node agent's tidal pressure). The Binder commits
every eviction through the one eviction path (``services.eviction``)."""

from __future__ import annotations

import grpc

from foundation.retry import Backoff, Retry
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from services.runtime import Dial
from store import Store

# The Binder's leader lease: its holder is the leader, its holder_address where the leader serves.
LEASE = "binder"
# Trailing metadata on FAILED_PRECONDITION: where the leader is, for shards to reconnect.
LEADER_METADATA_KEY = "godel-leader-address"

POLL_SECONDS = 0.2
_POLL = Backoff(POLL_SECONDS)  # a constant poll: a failover takes what it takes
# Codes worth asking again: no leader yet, the leader stepping down, or it being unreachable.
_RETRY = frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE})


class EvictError(Exception):
    """The Binder refused the request, or no leader answered in time; the message says which."""


class BinderEvictor:
    """Calls ``Binder.Evict`` on the current leader (found through its lease), again after a
    failover or while no leader is elected, within ``timeout_seconds``."""

    def __init__(
        self, store: Store, requester: str, dial: Dial, timeout_seconds: float = 120.0
    ) -> None:
        self.store = store
        # The caller's Service.dial: the Binder accepts Evict from service identities only.
        self.dial = dial
        self.requester = requester
        self.timeout = timeout_seconds

    async def evict(self, request: ipb.EvictRequest) -> ipb.EvictResponse:
        request.requester = self.requester
        retry = Retry(_POLL, deadline_seconds=self.timeout)
        last = "no binder leader"
        while not retry.expired:
            lease = await self.store.get_lease(LEASE)
            if lease is None or not lease.holder_address:
                await retry.sleep()
                continue
            async with self.dial(lease.holder_address, ()) as channel:
                stub = internal_pb2_grpc.BinderStub(channel)
                try:
                    response: ipb.EvictResponse = await stub.Evict(
                        request, timeout=max(0.1, retry.remaining())
                    )
                    return response
                except grpc.aio.AioRpcError as exc:
                    last = f"{exc.code().name}: {exc.details()}"
                    if exc.code() not in _RETRY:
                        raise EvictError(f"the Binder refused the eviction: {last}") from exc
            await retry.sleep()
        raise EvictError(f"no Binder leader took the eviction within {self.timeout:g}s ({last})")
