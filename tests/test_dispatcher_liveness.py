"""The dispatcher's judge of shard liveness (services/dispatcher/dispatching/liveness.py) against
a real store: a shard is alive by its liveness stamp (or, before its first, its registration
time), aged by the store server's clock; and no shard is judged while contact with the store
was not continuous (two reads further apart than half the grace, or a read grown old)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.liveness import ShardLiveness
from store import Store
from store.informer import Informer
from store.server import StoreServer


@pytest.fixture
async def informer(store: Store) -> AsyncIterator[Informer]:
    inf = Informer(store, ["SchedulerInstance"], block_ms=100)
    inf.start()
    await inf.wait_synced(10)
    try:
        yield inf
    finally:
        await inf.stop()


async def register(store: Store, name: str, registered_ms: int) -> None:
    inst = pb.SchedulerInstance(metadata=pb.ObjectMeta(name=name))
    inst.spec.address = f"127.0.0.1:{1000 + len(name)}"
    inst.status.heartbeat_ms = registered_ms
    await store.create(inst)


async def test_a_shard_lives_by_its_stamp_not_by_its_record(
    store: Store, informer: Informer
) -> None:
    now_ms = int(time.time() * 1000)
    await register(store, "stamping", now_ms - 60_000)  # registered a minute ago
    await register(store, "new", now_ms)  # registered now, not stamped yet
    await register(store, "stopped", now_ms - 60_000)  # registered long ago, never stamped
    assert await store.record_shard_heartbeat("stamping")
    await informer.wait_for_revision(await store.revision(), 10)
    liveness = ShardLiveness(store, informer, grace_seconds=5)
    assert liveness.live() == {}  # nothing read yet: nobody is known alive
    await liveness.read()
    assert sorted(liveness.live()) == ["new", "stamping"]
    stopped = informer.get(pb.SchedulerInstance, "stopped")
    assert stopped is not None and liveness.silent_ms(stopped) >= 60_000


async def test_no_shard_is_judged_without_continuous_contact_with_the_store(
    informer: Informer, private_server: StoreServer, cluster_name: str
) -> None:
    store = await Store.connect(private_server.url, cluster=cluster_name)
    liveness = ShardLiveness(store, informer, grace_seconds=2)
    assert not liveness.judging  # never read
    assert await liveness.read()  # the first read: nothing to follow, nothing linked yet
    await asyncio.sleep(1.2)  # longer than half the grace: as if the store had been busy
    assert not liveness.judging  # the read has grown old
    assert not await liveness.read()  # and this one does not follow the last closely
    assert await liveness.read()  # the next one does: contact is continuous again
    private_server.kill()  # the store gone: a failed read judges nobody
    assert not await liveness.read()
    assert not liveness.judging
    await store.close()
