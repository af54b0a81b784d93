"""Dispatch over real gRPC: the dispatcher in-process, test-only Scheduler servicers as shards
(see tests/dispatcher_harness.py), a real store. Whole units, least-loaded choice, credit flow
control, huge units, backoff, infeasible units, dead shards, revokes, restarts, quotas."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from protos.godel.v1 import api_pb2
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.dispatch import DispatchSettings, ShardLink, UnitDispatcher
from services.dispatcher.dispatching.encoding import (
    OutgoingUnit,
    encoded_messages,
    unit_messages,
)
from services.dispatcher.dispatching.unitqueue import PendingRef, UnitState
from store import Store
from store.client import Bind
from store.informer import Informer
from store.kinds import with_resource_version
from tests import factories as f
from tests.dispatcher_harness import (
    Running,
    TestShard,
    dispatcher_config,
    eventually,
    run_dispatcher,
)


@pytest.fixture
def config(store_url: str, cluster_name: str, tmp_path: Path) -> Any:
    return dispatcher_config(store_url, cluster_name, tmp_path)


@pytest.fixture
async def dispatcher(config: Any) -> AsyncIterator[Running]:
    async with run_dispatcher(config) as running:
        yield running


@pytest.fixture
async def shards(store: Store) -> AsyncIterator[list[TestShard]]:
    started: list[TestShard] = []
    yield started
    for shard in started:
        await shard.stop()


async def start_shard(
    shards: list[TestShard], store: Store, d: Running, name: str, capacity: int
) -> TestShard:
    shard = TestShard(name, store, capacity)
    shards.append(shard)  # before start: a start that fails halfway is still stopped at teardown
    await shard.start()
    core = d.service.core
    await eventually(lambda: name in core.links and core.links[name].ready, what=f"{name} ready")
    return shard


async def submit(d: Running, *jobs: pb.Job) -> None:
    response = await d.api.Submit(api_pb2.SubmitRequest(jobs=list(jobs)))
    assert all(r.created for r in response.results), response


async def test_whole_units_least_loaded_and_credit_flow_control(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    await store.create(f.node("n1", cpu=64_000))
    a = await start_shard(shards, store, dispatcher, "shard-a", capacity=4)
    await submit(dispatcher, f.job("j1", replicas=3, min_member=3))
    await eventually(lambda: a.jobs() == ["j1"], what="j1 on a")
    unit = a.unit("j1")
    assert [p.name for p in unit.pods] == ["j1-0", "j1-1", "j1-2"]
    assert [p.index for p in unit.pods] == [0, 1, 2] and all(p.uid for p in unit.pods)
    assert unit.job.spec.min_member == 3 and unit.already_bound == 0

    b = await start_shard(shards, store, dispatcher, "shard-b", capacity=100)
    # a holds 1 credit: a 2-pod unit must go to b.
    await submit(dispatcher, f.job("j2", replicas=2))
    await eventually(lambda: b.jobs() == ["j2"], what="j2 on b")
    # Both fit a 1-pod unit; b is less loaded (2 undecided pods against 3).
    await submit(dispatcher, f.job("j3"))
    await eventually(lambda: b.jobs() == ["j2", "j3"], what="j3 on b")
    assert a.jobs() == ["j1"]

    # a finishes j1 (binds it, returns its credits): now a is the least loaded.
    await a.bind_and_finish("j1", "n1")
    await eventually(lambda: dispatcher.service.core.links["shard-a"].load == 0, what="a idle")
    await submit(dispatcher, f.job("j4", replicas=2))
    await eventually(lambda: a.jobs() == ["j1", "j4"], what="j4 on a")
    # j1's pods were bound: nothing of it comes back.
    assert b.jobs() == ["j2", "j3"]
    # Never more pods in flight on a than it granted.
    assert all(sum(len(u.pods) for u in batch.units) <= 4 for batch in a.batches)


async def test_many_units_batched_and_capacity_respected(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    await submit(dispatcher, *[f.job(f"j{i}", replicas=2) for i in range(20)])
    await eventually(lambda: len(dispatcher.service.core.units) == 20, what="queued")
    shard = await start_shard(shards, store, dispatcher, "shard-a", capacity=30)
    await eventually(lambda: len(shard.units) == 15, what="15 units")
    await _settle_briefly()
    assert len(shard.units) == 15  # 30 credits = 15 two-pod units, no more
    assert len(shard.batches) == 1  # one message for the whole round
    assert shard.jobs() == [f"j{i}" for i in range(15)]  # FIFO
    for i in range(15):
        shard.outcome(f"j{i}", ipb.UNIT_UNSCHEDULABLE, "0/0 nodes fit", credit=2)
    # The other five go out as credits return; the unschedulable ones after their backoff.
    await eventually(lambda: {f"j{i}" for i in range(15, 20)} <= set(shard.jobs()), what="rest")


async def test_outcomes_of_many_units_in_one_message_each_take_effect(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    """A shard reports the units one verdict batch settled in one message: every outcome in it
    counts (each unit backs off and is sent again), not only the first."""
    names = [f"s{i}" for i in range(6)]
    await submit(dispatcher, *[f.job(name) for name in names])
    core = dispatcher.service.core
    shard = await start_shard(shards, store, dispatcher, "shard-a", capacity=100)
    await eventually(lambda: sorted(shard.jobs()) == names, what="6 units sent")
    shard.outcomes(names, ipb.UNIT_UNSCHEDULABLE, "0/0 nodes fit", credit=6)
    # Each unit went again after its backoff: its outcome released it from the shard.
    await eventually(lambda: sorted(shard.jobs()) == sorted(names * 2), what="all six again")
    assert all(core.units[name].attempts == 1 for name in names)


async def test_units_without_room_are_held_and_smaller_ones_behind_them_go(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    big = [f.job(f"big{i}", replicas=5, min_member=5) for i in range(10)]
    await submit(dispatcher, *big, f.job("small", replicas=1))
    core = dispatcher.service.core
    await eventually(lambda: len(core.units) == 11, what="queued")
    shard = await start_shard(shards, store, dispatcher, "shard-a", capacity=12)
    # Two big units take 10 credits; the other eight do not fit the 2 left, the small one does.
    await eventually(lambda: "small" in shard.jobs(), what="small unit sent")
    await _settle_briefly()
    assert shard.jobs() == ["big0", "big1", "small"]
    # The held ones stay queued, in order, and go as credits come back.
    assert core.describe("big2") == "waiting in queue default (position 1)"
    assert core.describe("big9") == "waiting in queue default (position 8)"
    shard.outcome("big0", ipb.UNIT_UNSCHEDULABLE, "0/0 nodes fit", credit=5)
    await eventually(lambda: "big2" in shard.jobs(), what="big2 after credits returned")


async def _settle_briefly() -> None:
    """Give the dispatcher time to (wrongly) send something."""
    await asyncio.sleep(0.3)


async def test_a_unit_larger_than_capacity_goes_to_an_empty_shard(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    await store.create(f.node("n1", cpu=64_000))
    shard = await start_shard(shards, store, dispatcher, "shard-a", capacity=2)
    await submit(dispatcher, f.job("small", replicas=1))
    await eventually(lambda: shard.jobs() == ["small"], what="small")
    await submit(dispatcher, f.job("huge", replicas=5))
    await _settle_briefly()
    assert shard.jobs() == ["small"]  # not while the shard is busy
    await shard.bind_and_finish("small", "n1")
    await eventually(lambda: shard.jobs() == ["small", "huge"], what="huge once empty")
    assert len(shard.unit("huge").pods) == 5  # whole, never split
    await submit(dispatcher, f.job("after"))
    await _settle_briefly()
    assert "after" not in shard.jobs()  # no credits until huge is done
    await shard.bind_and_finish("huge", "n1")
    await eventually(lambda: "after" in shard.jobs(), what="after")


async def test_unschedulable_backs_off_and_infeasible_waits_for_a_node(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    shard = await start_shard(shards, store, dispatcher, "shard-a", capacity=10)
    await submit(dispatcher, f.job("u"), f.job("inf", replicas=2))
    await eventually(lambda: sorted(shard.jobs()) == ["inf", "u"], what="both sent")

    shard.outcome("u", ipb.UNIT_UNSCHEDULABLE, "0/1 nodes fit: 1 insufficient cpu", credit=1)
    sent = time.monotonic()
    await eventually(lambda: shard.jobs().count("u") == 2, what="u again")
    assert time.monotonic() - sent >= 0.15  # backoff_initial_seconds = 0.2

    reason = "0/1 nodes fit: 1 insufficient memory"
    shard.outcome("inf", ipb.UNIT_INFEASIBLE, reason, credit=2)

    async def marked() -> bool:
        pods = await store.get_many(pb.Pod, ["inf-0", "inf-1"])
        return all(p is not None and p.status.conditions for p in pods)

    await eventually(marked, what="pods marked unschedulable")
    pod = await store.get(pb.Pod, "inf-0")
    [cond] = pod.status.conditions
    assert (cond.type, cond.status, cond.reason, cond.message) == (
        "PodScheduled", "False", "Unschedulable", reason,
    )  # fmt: skip
    why = await dispatcher.api.Explain(api_pb2.ExplainRequest(pod="inf-1"))
    assert why.summary == reason and not why.reasons  # the message is shown, not parsed
    await _settle_briefly()
    await _settle_briefly()
    assert shard.jobs().count("inf") == 1  # kept out of the queue

    # A heartbeat-only node update is not a change; a new node is.
    await store.create(f.node("n1"))
    await eventually(lambda: shard.jobs().count("inf") == 2, what="inf after node added")


async def test_a_pod_update_keeps_the_state_of_its_one_pod_unit(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    shard = await start_shard(shards, store, dispatcher, "shard-a", capacity=10)
    await submit(dispatcher, f.job("solo"))
    await eventually(lambda: shard.jobs() == ["solo"], what="sent")
    shard.outcome("solo", ipb.UNIT_INFEASIBLE, "0/1 nodes fit: 1 untolerated taint", credit=1)
    core = dispatcher.service.core
    await eventually(lambda: core.describe("solo").startswith("can never fit"), what="held")
    pod = await store.get(pb.Pod, "solo-0")
    pod.metadata.labels["touched"] = "yes"
    await store.update(pod)
    await core.informer.wait_for_revision(await store.revision(), 5)
    # Its only pod changed: the unit is still held (it used to be dropped and queued afresh).
    assert core.describe("solo").startswith("can never fit")
    await _settle_briefly()
    assert shard.jobs() == ["solo"]


async def test_an_infeasible_unit_is_rechecked_after_a_while_without_a_node_change(
    config: Any, store: Store, shards: list[TestShard]
) -> None:
    async with run_dispatcher(replace(config, infeasible_recheck_seconds=0.5)) as d:
        shard = await start_shard(shards, store, d, "shard-a", capacity=10)
        await submit(d, f.job("inf"))
        await eventually(lambda: shard.jobs() == ["inf"], what="sent")
        shard.outcome("inf", ipb.UNIT_INFEASIBLE, "0/0 nodes fit", credit=1)
        await eventually(
            lambda: "waiting for the cluster to change" in d.service.core.describe("inf"),
            what="held as infeasible",
        )
        await eventually(lambda: shard.jobs().count("inf") == 2, what="rechecked")


async def test_dead_shard_units_go_to_the_live_one(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    a = await start_shard(shards, store, dispatcher, "shard-a", capacity=10)
    await submit(dispatcher, f.job("j1", replicas=3), f.job("j2"))
    await eventually(lambda: sorted(a.jobs()) == ["j1", "j2"], what="on a")
    b = await start_shard(shards, store, dispatcher, "shard-b", capacity=10)
    await a.stop()  # the stream breaks
    await eventually(lambda: sorted(b.jobs()) == ["j1", "j2"], what="re-dispatched to b")
    assert len(b.unit("j1").pods) == 3

    # Heartbeat lapse (stream still open): b's units move to a new shard c.
    c = await start_shard(shards, store, dispatcher, "shard-c", capacity=10)
    await b.stop_heartbeat()
    await eventually(lambda: sorted(c.jobs()) == ["j1", "j2"], timeout=10, what="moved to c")
    assert "shard-b" not in dispatcher.service.core.links

    # Each loss is an event on the shard's SchedulerInstance, with the units it moved.
    async def lost() -> dict[str, pb.Event]:
        events, _ = await store.list_all(pb.Event)
        return {e.regarding.name: e for e in events if e.reason == "ShardLost"}

    async def both_lost() -> bool:
        return set(await lost()) == {"shard-a", "shard-b"}

    await eventually(both_lost, timeout=10, what="ShardLost events written")
    event = (await lost())["shard-b"]
    assert event.regarding.kind == "SchedulerInstance" and event.type == "Warning"
    assert "2 undecided unit(s) dispatched again" in event.message


async def test_a_shard_that_stamps_keeps_its_units_though_its_record_is_never_rewritten(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    """Liveness is the shard's stamps (store/pulse.py), not its record: a record left as
    registered for three times the grace (a shard writes its counters rarely, and not at all
    while its event loop is busy) loses the shard nothing while its stamps go on."""
    a = await start_shard(shards, store, dispatcher, "shard-a", capacity=10)
    await submit(dispatcher, f.job("j1", replicas=3))
    await eventually(lambda: a.jobs() == ["j1"], what="on a")
    record = await store.get(pb.SchedulerInstance, "shard-a")
    grace = dispatcher.service.config.shard_grace_seconds
    await asyncio.sleep(3 * grace)
    assert (await store.get(pb.SchedulerInstance, "shard-a")).metadata.resource_version == (
        record.metadata.resource_version
    )
    core = dispatcher.service.core
    assert "shard-a" in core.links and core.links["shard-a"].undecided == {"j1": 3}
    assert a.jobs() == ["j1"]  # never taken back and sent again
    events, _ = await store.list_all(pb.Event)
    assert [e for e in events if e.reason == "ShardLost"] == []


async def test_delete_revokes_from_the_shard(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    shard = await start_shard(shards, store, dispatcher, "shard-a", capacity=10)
    await submit(dispatcher, f.job("gone", replicas=2))
    await eventually(lambda: shard.jobs() == ["gone"], what="sent")
    response = await dispatcher.api.Delete(api_pb2.DeleteRequest(kind="Job", name="gone"))
    assert response.deleted == 3
    await eventually(lambda: shard.revoked == ["gone"], what="revoked")
    assert "gone" not in dispatcher.service.core.units


async def test_restart_loses_no_pending_unit(
    config: Any, store: Store, shards: list[TestShard]
) -> None:
    async with run_dispatcher(config) as first:
        await submit(first, *[f.job(f"j{i}", replicas=2) for i in range(5)])
        await store.create(f.node("n1"))
    async with run_dispatcher(config) as second:
        assert len(second.service.core.units) == 5  # rebuilt before serving
        shard = await start_shard(shards, store, second, "shard-a", capacity=100)
        await eventually(lambda: len(shard.units) == 5, what="all dispatched")
        assert sorted(shard.jobs()) == [f"j{i}" for i in range(5)]


async def test_queue_quota_holds_units_back(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    await store.create(f.node("n1", cpu=64_000))
    queue = pb.Queue(metadata=pb.ObjectMeta(name="team"))
    queue.spec.quota.milli_cpu = 1000
    await store.create(queue)
    jobs = [f.job(name, cpu=600) for name in ("first", "second")]
    for j in jobs:
        j.spec.queue = "team"
    shard = await start_shard(shards, store, dispatcher, "shard-a", capacity=10)
    await submit(dispatcher, *jobs)
    await eventually(lambda: shard.jobs() == ["first"], what="first")
    await _settle_briefly()
    assert shard.jobs() == ["first"]
    why = await dispatcher.api.Explain(api_pb2.ExplainRequest(pod="second-0"))
    assert why.summary == "waiting in queue team (position 1): queue quota exceeded (cpu)"
    # first finishes and its pod is deleted (its claim returned): second fits now.
    await shard.bind_and_finish("first", "n1")
    await dispatcher.api.Delete(api_pb2.DeleteRequest(kind="Job", name="first"))
    await eventually(lambda: shard.jobs() == ["first", "second"], what="second")


# ---------------------------------------------------------------------------------------------
# The real pipeline: dispatcher + two real scheduler shards + the real Binder
# ---------------------------------------------------------------------------------------------


async def test_with_real_shards_and_binder(
    dispatcher: Running, store: Store, store_url: str, cluster_name: str
) -> None:
    from services.binder.service import BinderConfig, BinderService
    from services.runtime import ServiceHost
    from services.scheduler.service import SchedulerConfig, SchedulerService

    for i in range(4):
        await store.create(f.node(f"n{i}", cpu=4000))
    binder = BinderConfig(
        name="binder-0", store_url=store_url, cluster=cluster_name, port=0, log_level="warning",
        insecure=True,
    )  # fmt: skip

    def shard(name: str) -> SchedulerConfig:
        return SchedulerConfig(
            name=name, store_url=store_url, cluster=cluster_name, port=0,
            heartbeat_seconds=0.1, backoff_initial_seconds=0.01, grace_seconds=0.5,
            log_level="warning", insecure=True,
        )  # fmt: skip

    jobs = [f.job(f"g{k}", replicas=3, min_member=3, cpu=1000) for k in range(4)]
    # Fits no free room once the others are bound: 4 x 3000m on 4000m nodes (12 cores used).
    too_big = f.job("late", replicas=2, min_member=2, cpu=3000)
    async with (
        ServiceHost(BinderService, binder),
        ServiceHost(SchedulerService, shard("shard-a")),
        ServiceHost(SchedulerService, shard("shard-b")),
    ):
        core = dispatcher.service.core
        await eventually(lambda: sum(lk.ready for lk in core.links.values()) == 2, what="shards")
        await submit(dispatcher, *jobs)

        async def all_bound() -> bool:
            pods = await store.list_all(pb.Pod)
            return len(pods[0]) == 12 and all(p.spec.node_name for p in pods[0])

        await eventually(all_bound, timeout=20, what="12 pods bound")
        await submit(dispatcher, too_big)

        async def explained() -> bool:
            why = await dispatcher.api.Explain(api_pb2.ExplainRequest(pod="late-0"))
            return why.total_nodes == 4 and bool(why.reasons)

        await eventually(explained, timeout=20, what="late explained")
        usage = [await store.node_usage(f"n{i}") for i in range(4)]
        assert all(u is not None and u.used["g.cpu"] <= 4000 for u in usage)


async def test_with_partitions_a_unit_goes_to_the_shard_whose_partition_has_room(
    store: Store, shards: list[TestShard], store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    """Partitioning on: once shard a's partition is full, units go to b although a is as idle;
    a unit no partition can hold goes by load balance alone."""
    config = dispatcher_config(
        store_url, cluster_name, tmp_path, partitioning="on", controller_interval_seconds=0.1
    )
    for i in range(4):
        await store.create(f.node(f"n{i}", cpu=1000))
    async with run_dispatcher(config) as d:
        a = await start_shard(shards, store, d, "shard-a", capacity=100)
        b = await start_shard(shards, store, d, "shard-b", capacity=100)
        shuffler = d.service.shuffler
        await eventually(
            lambda: (
                shuffler.room.of("shard-a", "g") is not None
                and shuffler.room.of("shard-b", "g") is not None
            ),
            what="partitions",
        )
        assert shuffler.partitions is not None
        own = shuffler.partitions.of("shard-a")
        assert len(own) == 2

        # Both partitions have room and both shards are idle: the first.
        await submit(d, f.job("fill", replicas=2, cpu=1000))
        await eventually(lambda: a.jobs() == ["fill"], what="fill on a")
        pods = await store.get_many(pb.Pod, ["fill-0", "fill-1"])
        for pod, node in zip(pods, own, strict=True):
            assert pod is not None
            pod.spec.node_name = node
            pod.status.phase = pb.POD_BOUND
        await store.commit([Bind(pod) for pod in pods if pod is not None])
        a.outcome("fill", ipb.UNIT_DONE, credit=2)
        await eventually(
            lambda: (
                shuffler.room.of("shard-a", "g").cpu == 0  # type: ignore[union-attr]
                and d.service.core.links["shard-a"].load == 0
            ),
            what="a's partition full, a idle",
        )

        # a is as idle as b, but its partition is full: b.
        await submit(d, f.job("next", cpu=500))
        await eventually(lambda: b.jobs() == ["next"], what="next on b")
        # No partition holds 3 x 1000m (b has 1500m left beside its undecided unit): the least
        # loaded, a.
        await submit(d, f.job("wide", replicas=3, cpu=1000))
        await eventually(lambda: a.jobs() == ["fill", "wide"], what="wide on a")
        assert b.jobs() == ["next"]


async def test_a_restart_builds_the_partitions_room_only_once_partitions_exist(
    store: Store, shards: list[TestShard], store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    """Pods bound before the dispatcher starts: with partitioning off its node shuffler keeps
    no claim per node (the ledger keeps them anyway); once partitions exist, the room of each
    is built from those claims, the pods bound before the start included."""
    for i in range(4):
        await store.create(f.node(f"n{i}", cpu=1000))
    for pod in f.pods_of(f.job("old", replicas=2, cpu=500)):
        pod.spec.node_name = "n0"
        pod.status.phase = pb.POD_RUNNING
        await store.create(pod)
    off = dispatcher_config(store_url, cluster_name, tmp_path, partitioning="off")
    async with run_dispatcher(off) as d:
        room = d.service.shuffler.room
        assert d.service.core.queue.holds_claim("old-0")
        assert not room.following_pods and room.room.node_claimed("n0", "g") is None
        assert d.service.shuffler.allocation.percent() == 25.0  # 1000m of 4000m, all the same

    on = replace(off, partitioning="on", controller_interval_seconds=0.1)
    async with run_dispatcher(on) as d:
        await start_shard(shards, store, d, "shard-a", capacity=100)
        await start_shard(shards, store, d, "shard-b", capacity=100)
        shuffler = d.service.shuffler

        def room_of(shard: str) -> int | None:
            left = shuffler.room.of(shard, "g")
            return None if left is None else left.cpu

        await eventually(
            lambda: room_of("shard-a") is not None and room_of("shard-b") is not None,
            what="partitions",
        )
        assert shuffler.partitions is not None
        holder = shuffler.partitions.owner["n0"]
        assert room_of(holder) == 1000  # two nodes of 1000m, n0 full
        assert room_of("shard-b" if holder == "shard-a" else "shard-a") == 2000


def _outgoing(job: str, pods: int) -> OutgoingUnit:
    refs = [(f"{job}-{i}", PendingRef(f"uid-{job}-{i}", 10 + i, i)) for i in range(pods)]
    return OutgoingUnit(f.job(job, replicas=pods, min_member=pods), refs, 0, 1)


@pytest.mark.parametrize(
    ("sizes", "max_batch_pods", "expected"),
    [
        ([1, 1, 1], 5000, [[1, 1, 1]]),
        ([2, 2, 2], 4, [[2, 2], [2]]),
        ([3, 3], 3, [[3], [3]]),
        ([10, 1], 4, [[10], [1]]),  # a bigger unit travels alone, never split
        ([1, 10, 1], 4, [[1], [10], [1]]),
        ([], 4, []),
    ],
)
def test_units_are_packed_into_messages_up_to_the_pod_limit(
    sizes: list[int], max_batch_pods: int, expected: list[list[int]]
) -> None:
    units = [_outgoing(f"j{i}", n) for i, n in enumerate(sizes)]
    messages = unit_messages(units, max_batch_pods)
    assert [[len(u.pods) for u in m.units.units] for m in messages] == expected
    sent = [u for m in messages for u in m.units.units]
    assert [u.job.metadata.name for u in sent] == [f"j{i}" for i in range(len(sizes))]
    first = sent[0] if sent else None
    if first is not None:
        assert [(p.name, p.uid, p.resource_version, p.index) for p in first.pods] == [
            (f"j0-{i}", f"uid-j0-{i}", 10 + i, i) for i in range(sizes[0])
        ]


def test_a_big_unit_is_encoded_a_slice_at_a_time_into_the_one_message_it_always_was() -> None:
    # Pods in any order: the message carries them by index, whole, in one message.
    big = _outgoing("big", 10)
    shuffled = OutgoingUnit(big.job, list(reversed(big.pods)), 4, 7)
    parts = list(encoded_messages([shuffled, _outgoing("small", 2)], 5000, slice_pods=3))
    # A turn for the loop after every 3 pods laid out by index (4 for the big unit's 10) and
    # every 3 encoded (3, 6, 9, then 1 + 2 = 3 more).
    assert parts[:-1] == [None] * (4 + 4)
    wire = parts[-1]
    assert isinstance(wire, bytes)
    (unit, small) = ipb.DispatchMessage.FromString(wire).units.units
    assert (unit.job.metadata.name, unit.already_bound, unit.enqueued_ms) == ("big", 4, 7)
    assert [(p.name, p.uid, p.resource_version, p.index) for p in unit.pods] == [
        (f"big-{i}", f"uid-big-{i}", 10 + i, i) for i in range(10)
    ]
    assert [p.name for p in small.pods] == ["small-0", "small-1"]


@pytest.mark.parametrize(
    ("indexes", "turns_before_the_message"),
    [
        # Laid out by index, a turn after every 3 pods; then encoded, a turn after every 3.
        ([9, 3, 0, 7, 1, 8, 2, 6, 4, 5], 4 + 3),
        ([9, 3, 3, 7, 1], 0 + 1),  # an index twice: sorted in one piece
        ([40, 3, 7, 1, 0], 0 + 1),  # indexes far sparser than the pods: sorted
        ([2, -1, 0, 1, 5], 0 + 1),  # a negative index: sorted
        ([1, 0], 0 + 0),  # no more than a slice: sorted
    ],
)
def test_a_units_pods_go_by_index_whatever_order_they_came_in(
    indexes: list[int], turns_before_the_message: int
) -> None:
    base = _outgoing("u", len(indexes))
    refs = [ref._replace(pod_index=i) for (_, ref), i in zip(base.pods, indexes, strict=True)]
    pods = [(f"u-{i}", ref) for ref, i in zip(refs, indexes, strict=True)]
    parts = list(encoded_messages([OutgoingUnit(base.job, pods, 0, 0)], 5000, slice_pods=3))
    assert parts[:-1] == [None] * turns_before_the_message
    wire = parts[-1]
    assert isinstance(wire, bytes)
    (unit,) = ipb.DispatchMessage.FromString(wire).units.units
    assert [p.index for p in unit.pods] == sorted(indexes)
    assert [p.name for p in unit.pods] == [f"u-{i}" for i in sorted(indexes)]


@pytest.mark.parametrize("listed", [False, True])
def test_a_unit_encoded_from_its_jobs_stored_bytes_is_the_message_it_always_was(
    listed: bool,
) -> None:
    """The dispatch round hands the writer the job's bytes as the informer keeps them (its
    resource version set as an event's object has it, or appended as a listing's has it):
    the shard gets the same message as from the job decoded."""
    unit = _outgoing("j", 3)
    job = unit.job
    assert isinstance(job, pb.Job)
    job.metadata.resource_version = 41
    if listed:
        stored = pb.Job()
        stored.CopyFrom(job)
        stored.metadata.resource_version = 0
        data = with_resource_version(stored.SerializeToString(), 41)
    else:
        data = job.SerializeToString()
    small = _outgoing("k", 1)
    decoded = unit_messages([unit, small], 5000)
    from_bytes = unit_messages([unit._replace(job=data), small], 5000)
    assert from_bytes == decoded
    assert from_bytes[0].units.units[0].job.metadata.resource_version == 41


@pytest.mark.parametrize("bind_seen_first", [True, False])
async def test_a_done_unit_waits_for_the_view_only_while_its_pods_are_pending_in_it(
    store: Store, bind_seen_first: bool
) -> None:
    """``UNIT_DONE``: a unit whose pods the view shows bound already (the feed was quicker than
    the shard's outcome) is dropped at once, with no wait for the view (a store read); one
    whose pods are still pending in the view settles first, then is dropped."""
    informer = Informer(store, UnitDispatcher.KINDS)
    core = UnitDispatcher(store, informer, DispatchSettings(), dial=None)  # type: ignore[arg-type]
    job = f.job("a", cpu=100)
    job.metadata.resource_version = 3
    informer.cache["Job"]["a"] = job
    (pod,) = f.pods_of(job)
    core.feed.on_add("Pod", pod)
    link = ShardLink("s0", "x", credits=10, capacity=10, ready=True)
    core.links["s0"] = link
    core.dispatch_round()
    assert core.units["a"].state == UnitState.DISPATCHED
    placed = pb.Pod()
    placed.CopyFrom(pod)
    placed.spec.node_name, placed.status.phase = "n1", pb.POD_BOUND
    if bind_seen_first:
        core.feed.on_update("Pod", pod, placed)
    core._on_outcome(link, ipb.UnitOutcome(job="a", code=ipb.UNIT_DONE))
    assert ("a" in core.settler._jobs) is not bind_seen_first
    assert ("a" in core.units) is not bind_seen_first
    if not bind_seen_first:
        assert core.units["a"].state == UnitState.SETTLING  # until the view caught up
        core.feed.on_update("Pod", pod, placed)  # its bind: nothing pending, dropped
        assert "a" not in core.units
        assert core.queue.settled("a") is False


@pytest.mark.parametrize("slice_pods", [1, 2, 5000])
def test_one_pod_units_are_encoded_as_the_message_they_always_were(slice_pods: int) -> None:
    """A one-pod unit is encoded in one piece (its pod in the unit's head): the same message,
    and a turn for the loop after every ``slice_pods`` pods as before."""
    units = [_outgoing(f"j{i}", 1) for i in range(4)]
    units[1] = units[1]._replace(job=units[1].job.SerializeToString())  # type: ignore[union-attr]
    parts = list(encoded_messages(units, 5000, slice_pods=slice_pods))
    assert parts[:-1] == [None] * (4 // slice_pods if slice_pods <= 4 else 0)
    wire = parts[-1]
    assert isinstance(wire, bytes)
    sent = ipb.DispatchMessage.FromString(wire).units.units
    expected = ipb.UnitBatch()
    for unit in units:
        one = expected.units.add(already_bound=unit.already_bound, enqueued_ms=unit.enqueued_ms)
        one.job.CopyFrom(unit.job if isinstance(unit.job, pb.Job) else pb.Job.FromString(unit.job))
        for name, ref in unit.pods:
            one.pods.add(
                name=name, uid=ref.uid, resource_version=ref.resource_version, index=ref.pod_index
            )
    assert list(sent) == list(expected.units)
