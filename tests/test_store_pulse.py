"""Shard liveness stamps (store/pulse.py) against a real store: ``ShardPulse`` stamps from a
thread of its own while its owner's event loop is blocked, stops once that loop has been silent
too long (a wedged shard is dead), stops for good at ``stop()``, writes no stamp for a shard
without a record and tells its owner so."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from protos.godel.v1 import objects_pb2 as pb
from store import Store
from store.pulse import OwnerCallback, ShardPulse


def shard_record(name: str) -> pb.SchedulerInstance:
    inst = pb.SchedulerInstance(metadata=pb.ObjectMeta(name=name))
    inst.spec.address = "127.0.0.1:1"
    return inst


async def eventually_true(check: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.fixture
async def pulses() -> AsyncIterator[list[ShardPulse]]:
    started: list[ShardPulse] = []
    yield started
    for pulse in started:
        await pulse.stop()


def start(
    pulses: list[ShardPulse],
    store_url: str,
    cluster_name: str,
    shard: str,
    *,
    max_owner_silence_seconds: float = 60.0,
    on_missing: OwnerCallback | None = None,
) -> tuple[ShardPulse, asyncio.Task[None]]:
    pulse = ShardPulse(
        lambda: Store.connect(store_url, cluster=cluster_name, max_connections=2),
        shard,
        every_seconds=0.05,
        max_owner_silence_seconds=max_owner_silence_seconds,
        on_missing=on_missing,
    )
    pulses.append(pulse)
    return pulse, asyncio.create_task(pulse.run())


async def test_stamps_go_on_while_the_owner_loop_is_blocked(
    store: Store, store_url: str, cluster_name: str, pulses: list[ShardPulse]
) -> None:
    await store.create(shard_record("busy"))
    pulse, task = start(pulses, store_url, cluster_name, "busy")
    await eventually_true(lambda: pulse.stamps > 0)
    before = pulse.stamps
    time.sleep(1.0)  # noqa: ASYNC251 (the owner's loop blocked, as by a long computation)
    during = pulse.stamps - before
    assert during > 0, "no stamp was written while the owner's loop was blocked"
    beats = await store.shard_heartbeats()
    assert beats.now_ms - beats.last_ms["busy"] < 1000  # stamped during the block
    gap = REGISTRY.get_sample_value("godel_shard_heartbeat_gap_max_seconds", {"shard": "busy"})
    assert gap is not None and 0 < gap < 1.0  # the block did not stretch the stamps' gaps
    await pulse.stop()
    await task


async def test_stamps_stop_when_the_owner_loop_stays_silent_too_long(
    store: Store, store_url: str, cluster_name: str, pulses: list[ShardPulse]
) -> None:
    await store.create(shard_record("wedged"))
    pulse, task = start(pulses, store_url, cluster_name, "wedged", max_owner_silence_seconds=0.3)
    await eventually_true(lambda: pulse.stamps > 0)
    time.sleep(1.5)  # noqa: ASYNC251 (wedged far beyond the allowed silence)
    beats = await store.shard_heartbeats()
    # The stamps stopped about 0.3 s into the block: the last one is much older than the block.
    assert beats.now_ms - beats.last_ms["wedged"] >= 500
    # The loop runs again: so do the stamps.
    stopped_at = beats.last_ms["wedged"]

    async def resumed() -> bool:
        return (await store.shard_heartbeats()).last_ms["wedged"] > stopped_at

    await eventually_true(resumed)
    await pulse.stop()
    await task


async def test_stop_ends_the_stamps_and_a_missing_record_gets_none_and_tells_the_owner(
    store: Store, store_url: str, cluster_name: str, pulses: list[ShardPulse]
) -> None:
    told: list[str] = []

    async def on_missing() -> None:
        told.append("missing")

    pulse, task = start(pulses, store_url, cluster_name, "ghost", on_missing=on_missing)
    # No record: no stamp, and the owner hears of it (it would register again).
    await eventually_true(lambda: told)
    assert "ghost" not in (await store.shard_heartbeats()).last_ms
    await store.create(shard_record("ghost"))
    await eventually_true(lambda: pulse.stamps > 0)
    await pulse.stop()
    await task
    await store.forget_shard_heartbeat("ghost")
    await asyncio.sleep(0.3)  # six periods: a thread still stamping would have stamped again
    assert "ghost" not in (await store.shard_heartbeats()).last_ms
