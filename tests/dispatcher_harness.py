"""Test harness for the dispatcher: the real service in-process on loopback, a real grpc.aio
client, and a small test-only Scheduler servicer that grants credits and records what it gets.

The test shard exists only to isolate the dispatcher's side of `Scheduler.Dispatch`: it speaks
the real protocol over real gRPC (credits first, outcomes, revokes) and binds pods through the
real store when told to.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from protos.godel.v1 import api_pb2_grpc, internal_pb2_grpc
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.service import DispatcherConfig, DispatcherService
from services.runtime import ServiceHost
from store import Store
from store.client import Bind


def dispatcher_config(
    store_url: str, cluster: str, home: Path, **overrides: Any
) -> DispatcherConfig:
    base = DispatcherConfig(
        name="dispatcher-test",
        port=0,
        store_url=store_url,
        cluster=cluster,
        grace_seconds=0.2,
        home=home,
        shard_grace_seconds=1.0,
        backoff_initial_seconds=0.2,
        backoff_max_seconds=0.4,
        insecure=True,  # in-process tests call it in plaintext; tests/test_tls.py covers TLS
    )
    return replace(base, **overrides)


@dataclass
class Running:
    host: ServiceHost[DispatcherConfig]
    api: api_pb2_grpc.DispatcherAsyncStub

    @property
    def service(self) -> DispatcherService:
        assert isinstance(self.host.service, DispatcherService)
        return self.host.service


@asynccontextmanager
async def run_dispatcher(config: DispatcherConfig) -> AsyncIterator[Running]:
    async with ServiceHost(DispatcherService, config) as host:
        async with grpc.aio.insecure_channel(host.address) as channel:
            yield Running(host, api_pb2_grpc.DispatcherStub(channel))  # type: ignore[arg-type]


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.02)


@dataclass
class TestShard(internal_pb2_grpc.SchedulerServicer):
    """A scheduler shard reduced to the protocol: grants ``capacity`` credits, records units and
    revokes, and answers only when the test says so."""

    __test__ = False

    name: str
    store: Store
    capacity: int
    units: list[ipb.Unit] = field(default_factory=list)
    batches: list[ipb.UnitBatch] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    streams: int = 0
    _out: asyncio.Queue[ipb.ShardMessage] = field(default_factory=asyncio.Queue)
    _server: grpc.aio.Server | None = None
    _beat: asyncio.Task[None] | None = None
    _closing: asyncio.Event = field(default_factory=asyncio.Event)
    _open_streams: int = 0
    _no_streams: asyncio.Event = field(default_factory=asyncio.Event)
    address: str = ""

    async def Dispatch(self, request_iterator: Any, context: Any) -> None:
        self.streams += 1
        self._open_streams += 1
        self._no_streams.clear()
        try:
            await self._serve(request_iterator, context)
        finally:
            self._open_streams -= 1
            if not self._open_streams:
                self._no_streams.set()

    async def _serve(self, request_iterator: Any, context: Any) -> None:
        await context.write(ipb.ShardMessage(credit=ipb.Credit(pods=self.capacity)))

        async def read() -> None:
            async for msg in request_iterator:
                if msg.WhichOneof("body") == "units":
                    self.batches.append(msg.units)
                    self.units.extend(msg.units.units)
                else:
                    self.revoked.extend(msg.revoke.jobs)

        reader = asyncio.create_task(read())
        closing = asyncio.ensure_future(self._closing.wait())
        getter: asyncio.Future[ipb.ShardMessage] | None = None
        try:
            while not reader.done() and not closing.done():
                getter = asyncio.ensure_future(self._out.get())
                await asyncio.wait({getter, reader, closing}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    await context.write(getter.result())
                else:
                    getter.cancel()
        finally:
            reader.cancel()
            closing.cancel()
            if getter is not None:
                getter.cancel()

    def jobs(self) -> list[str]:
        return [u.job.metadata.name for u in self.units]

    def unit(self, job: str) -> ipb.Unit:
        return [u for u in self.units if u.job.metadata.name == job][-1]

    def outcome(self, job: str, code: int, reason: str = "", credit: int = 0) -> None:
        self._out.put_nowait(
            ipb.ShardMessage(outcome=ipb.UnitOutcome(job=job, code=code, reason=reason))  # type: ignore[arg-type]
        )
        if credit:
            self._out.put_nowait(ipb.ShardMessage(credit=ipb.Credit(pods=credit)))

    def outcomes(self, jobs: list[str], code: int, reason: str = "", credit: int = 0) -> None:
        """The same outcome for several units in one message, as a shard sends the units one
        verdict batch settled."""
        outcomes = [ipb.UnitOutcome(job=job, code=code, reason=reason) for job in jobs]  # type: ignore[arg-type]
        self._out.put_nowait(ipb.ShardMessage(outcomes=ipb.UnitOutcomes(outcomes=outcomes)))
        if credit:
            self._out.put_nowait(ipb.ShardMessage(credit=ipb.Credit(pods=credit)))

    async def bind_and_finish(self, job: str, node: str) -> None:
        """Bind every pod of the unit (one store commit), then UNIT_DONE and the credits."""
        unit = self.unit(job)
        pods = await self.store.get_many(pb.Pod, [p.name for p in unit.pods])
        binds = []
        for pod in pods:
            assert pod is not None
            pod.spec.node_name = node
            pod.status.phase = pb.POD_BOUND
            binds.append(Bind(pod))
        await self.store.commit(binds)
        self.outcome(job, ipb.UNIT_DONE, credit=len(unit.pods))

    async def start(self, *, heartbeat: bool = True) -> None:
        server = self._server = grpc.aio.server()
        internal_pb2_grpc.add_SchedulerServicer_to_server(self, server)
        port = server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        await server.start()
        inst = pb.SchedulerInstance(metadata=pb.ObjectMeta(name=self.name))
        inst.spec.address = self.address
        inst.status.heartbeat_ms = int(time.time() * 1000)
        await self.store.update(
            inst, force=True
        ) if await self._exists() else await self.store.create(inst)
        if heartbeat:
            self._beat = asyncio.create_task(self._heartbeat())

    async def _exists(self) -> bool:
        return (await self.store.get_many(pb.SchedulerInstance, [self.name]))[0] is not None

    async def _heartbeat(self) -> None:
        # As a shard's ShardPulse does (store/pulse.py): a stamp outside the record.
        while True:
            await asyncio.sleep(0.2)
            await self.store.record_shard_heartbeat(self.name)

    async def stop_heartbeat(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            # Bounded: a store call that swallows its cancellation must not hang a teardown.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(self._beat, return_exceptions=True), 5)
            self._beat = None

    async def stop(self) -> None:
        await self.stop_heartbeat()
        if self._server is not None:
            # Our streams end from this side first (the RPC returns OK): grpc.aio's stop() of a
            # server with a bidirectional stream still open hung a CI teardown for 300 s.
            self._closing.set()
            if self._open_streams:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._no_streams.wait(), 10)
            await self._server.stop(0)
            self._server = None
        self._closing = asyncio.Event()  # a restarted shard serves streams again
