"""The dispatcher's reconciler: what falls between the cracks is repaired within one reconcile
interval, and every repair is counted. The dispatcher in-process over real gRPC with test-only
shards (tests/dispatcher_harness.py), a real store. (The shard's own reconciler, for decisions
left without a verdict, is tested in tests/test_scheduler_service.py.)"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.creation import CHUNK_OPS, first_commit
from services.dispatcher.controllers.jobphase import JobCounts
from services.dispatcher.controllers.jobstatus import JobStatusController
from services.dispatcher.controllers.podindex import LoopTurns, PodIndex
from services.dispatcher.controllers.pods import normalise_job
from services.dispatcher.controllers.reconciler import Reconciler
from services.dispatcher.dispatching.dispatch import DispatchSettings, UnitDispatcher, UnitState
from services.dispatcher.objects import PODS_CREATED_ANNOTATION
from store import Store
from store.client import Delete
from store.informer import Informer
from tests import factories as f
from tests.dispatcher_harness import (
    Running,
    TestShard,
    dispatcher_config,
    eventually,
    run_dispatcher,
)

INTERVAL = 0.3


@pytest.fixture
async def dispatcher(store_url: str, cluster_name: str, tmp_path: Path) -> AsyncIterator[Running]:
    config = dispatcher_config(
        store_url,
        cluster_name,
        tmp_path,
        reconcile_interval_seconds=INTERVAL,
        # Far above the test shards' 0.2 s beat, even on a loaded CI machine.
        dead_shard_seconds=10.0,
        partitioning="off",
    )
    async with run_dispatcher(config) as running:
        yield running


@pytest.fixture
async def shards() -> AsyncIterator[list[TestShard]]:
    started: list[TestShard] = []
    yield started
    for shard in started:
        await shard.stop()


async def test_orphaned_unit_is_taken_back_and_dispatched_again(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    shard = TestShard("shard-a", store, 100)
    shards.append(shard)
    await shard.start()
    core = dispatcher.service.core
    await eventually(lambda: "shard-a" in core.links and core.links["shard-a"].ready)
    response = await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[f.job("j1", replicas=2)]))
    assert response.results[0].created
    await eventually(lambda: shard.jobs() == ["j1"], what="j1 dispatched")
    # The dispatcher's record of what the shard holds loses the unit (as a stray outcome for
    # it would): its real outcome can never be matched, and the unit would wait forever.
    core.links["shard-a"].settle("j1")
    assert core.units["j1"].state == UnitState.DISPATCHED
    reconciler = dispatcher.service.reconciler
    await eventually(
        lambda: reconciler.repairs["orphaned_unit"] == 1, timeout=INTERVAL + 10, what="repair"
    )
    # Revoked from the shard (so it cannot be placed twice) and dispatched again, whole.
    await eventually(lambda: shard.jobs() == ["j1", "j1"], what="j1 dispatched again")
    assert shard.revoked == ["j1"]
    assert [p.name for p in shard.unit("j1").pods] == ["j1-0", "j1-1"]
    assert core.links["shard-a"].undecided == {"j1": 2}


async def test_dead_shard_record_is_deleted_and_live_ones_kept(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    live = TestShard("shard-live", store, 10)
    shards.append(live)
    await live.start()
    # What a shard killed with -9 leaves behind: its record, its partition, no heartbeat.
    dead = pb.SchedulerInstance(metadata=pb.ObjectMeta(name="shard-dead"))
    dead.spec.address = "127.0.0.1:1"
    dead.spec.partition.extend(["n1", "n2"])
    dead.status.heartbeat_ms = int(time.time() * 1000) - 120_000
    await store.create(dead)
    reconciler = dispatcher.service.reconciler

    async def gone() -> bool:
        # The repair is counted once the delete's reply is back: after the store shows it.
        deleted = (await store.get_many(pb.SchedulerInstance, ["shard-dead"]))[0] is None
        return deleted and reconciler.repairs["dead_shard"] > 0

    await eventually(gone, timeout=INTERVAL + 10, what="dead record deleted")
    assert reconciler.repairs["dead_shard"] == 1
    await store.get(pb.SchedulerInstance, "shard-live")  # still there


@pytest.fixture
async def informer(store: Store) -> AsyncIterator[Informer]:
    inf = Informer(store, [*UnitDispatcher.KINDS], block_ms=100)
    inf.start()
    await inf.wait_synced(10)
    try:
        yield inf
    finally:
        await inf.stop()


async def test_job_status_disagreeing_with_its_pods_is_rewritten(
    store: Store, informer: Informer
) -> None:
    """The job status controller gave up on a job (a write that failed for good) and its stored
    status disagrees with its pods: found on two passes in a row with no change in between, it
    is written and the repair counted; a job the controller still has pending is left to it."""
    controller = JobStatusController(store, informer)
    core = UnitDispatcher(store, informer, DispatchSettings(), dial=grpc.aio.insecure_channel)
    reconciler = Reconciler(store, informer, core, controller)
    job = f.job("web", replicas=2)
    await store.create_unit(job, f.pods_of(job))
    other = f.job("other", replicas=2)
    await store.create_unit(other, f.pods_of(other))
    solo = f.job("solo", replicas=1)  # stores no status: derived from its pod when read
    await store.create_unit(solo, f.pods_of(solo))
    await informer.wait_for_revision(await store.revision(), timeout=10)
    await controller.tick()
    await informer.wait_for_revision(await store.revision(), timeout=10)
    assert (await store.get(pb.Job, "web")).status.phase == pb.JOB_PENDING

    async def corrupt(name: str) -> None:
        stored = await store.get(pb.Job, name)
        stored.status.phase, stored.status.running = pb.JOB_RUNNING, 2
        await store.update(stored)

    await corrupt("web")
    await corrupt("other")
    await corrupt("solo")
    await informer.wait_for_revision(await store.revision(), timeout=10)
    controller.changed_jobs.discard("web")  # the controller dropped it: fell through
    controller.changed_jobs.discard("solo")  # not judged: nothing stored of it is read
    assert "other" in controller.changed_jobs  # the controller will see to this one

    # One pass only suspects it (a controller write may be on its way to our view); the next
    # pass, the job unchanged meanwhile, repairs it.
    assert await reconciler.tick() == {}
    assert await store.get(pb.Job, "web") == informer.get("Job", "web")
    made = await reconciler.tick()
    assert made == {"job_status": 1}
    assert reconciler.repairs["job_status"] == 1
    web = await store.get(pb.Job, "web")
    assert (web.status.phase, web.status.running) == (pb.JOB_PENDING, 0)
    assert (await store.get(pb.Job, "solo")).status.phase == pb.JOB_RUNNING  # left as stored
    # A second pass finds nothing left to repair.
    await informer.wait_for_revision(await store.revision(), timeout=10)
    assert await reconciler.tick() == {}


async def test_a_job_whose_status_agreed_is_counted_again_only_once_it_or_its_pods_change(
    store: Store, informer: Informer
) -> None:
    """A big job waiting to be scheduled was recounted, all its pods, every pass (most of the
    dispatcher's CPU): a job whose status agreed with its pods is left alone until it or one of
    its pods changes, and a status that goes wrong then is still found and repaired."""
    counted: list[str] = []

    class CountingIndex(PodIndex):
        async def status_of(
            self, job: pb.Job, now_ms: int | None = None, turns: LoopTurns | None = None
        ) -> JobCounts:
            counted.append(job.metadata.name)
            return await super().status_of(job, now_ms, turns)

    controller = JobStatusController(store, informer, pods=CountingIndex(informer))
    core = UnitDispatcher(store, informer, DispatchSettings(), dial=grpc.aio.insecure_channel)
    reconciler = Reconciler(store, informer, core, controller)
    job = f.job("waiting", replicas=3)
    await store.create_unit(job, f.pods_of(job))
    await informer.wait_for_revision(await store.revision(), timeout=10)
    await controller.tick()
    await informer.wait_for_revision(await store.revision(), timeout=10)
    counted.clear()
    assert await reconciler.tick() == {}
    assert counted == ["waiting"]  # counted once: it agrees
    assert await reconciler.tick() == {}
    assert counted == ["waiting"]  # unchanged since: not counted again

    stored = await store.get(pb.Job, "waiting")  # its status goes wrong (a write gone astray)
    stored.status.phase, stored.status.running = pb.JOB_RUNNING, 3
    await store.update(stored)
    await informer.wait_for_revision(await store.revision(), timeout=10)
    controller.changed_jobs.discard("waiting")  # the controller dropped it
    assert await reconciler.tick() == {}  # suspected
    assert await reconciler.tick() == {"job_status": 1}  # and repaired


async def test_job_status_is_not_judged_while_its_write_is_in_flight_or_the_view_is_behind(
    store: Store, informer: Informer
) -> None:
    """On a busy store a controller write can take longer than a pass, and a view behind the
    store shows statuses already rewritten: neither is a stuck status. (A 1,000,000-pod run
    "repaired" hundreds of healthy jobs this way.)"""
    controller = JobStatusController(store, informer)
    core = UnitDispatcher(store, informer, DispatchSettings(), dial=grpc.aio.insecure_channel)
    reconciler = Reconciler(store, informer, core, controller)
    job = f.job("web", replicas=2)
    await store.create_unit(job, f.pods_of(job))
    stored = await store.get(pb.Job, "web")
    stored.status.phase = pb.JOB_RUNNING  # disagrees with its pending pods
    await store.update(stored)
    await informer.wait_for_revision(await store.revision(), timeout=10)
    controller.changed_jobs.discard("web")

    controller.writing = {"web"}  # the controller's tick is writing it
    assert await reconciler.tick() == {}
    assert await reconciler.tick() == {}

    behind = Informer(store, [*UnitDispatcher.KINDS], block_ms=100)  # never synced: behind
    lagging = Reconciler(store, behind, core, controller)
    controller.writing = set()
    assert await lagging.tick() == {}
    assert await lagging.tick() == {}

    # Neither any more: two passes repair it.
    assert await reconciler.tick() == {}
    assert await reconciler.tick() == {"job_status": 1}


async def test_a_job_left_unfinished_is_completed_and_dispatched_whole(
    dispatcher: Running, store: Store, shards: list[TestShard]
) -> None:
    """What a dispatcher that stopped midway through storing a big job leaves behind: the job,
    marked with how many of its pods are stored, and those pods. Its unit is not dispatched
    while so; the reconciler creates the rest (from the mark on) and the unit goes whole."""
    shard = TestShard("shard-a", store, 10_000)
    shards.append(shard)
    await shard.start()
    core = dispatcher.service.core
    await eventually(lambda: "shard-a" in core.links and core.links["shard-a"].ready)
    replicas = CHUNK_OPS + 200
    job = normalise_job(f.job("half", replicas=replicas))
    await store.commit(first_commit(job, False))  # the first commit of a Submit, and no more
    assert job.metadata.annotations[PODS_CREATED_ANNOTATION] == str(CHUNK_OPS - 1)
    reconciler = dispatcher.service.reconciler
    await eventually(
        lambda: reconciler.repairs["unfinished_job"] == 1, timeout=INTERVAL + 30, what="repair"
    )
    await eventually(lambda: shard.jobs() == ["half"], what="the unit dispatched")
    # Sent once, with every pod: never a part of it.
    assert sorted(p.index for p in shard.unit("half").pods) == list(range(replicas))
    stored = await store.get(pb.Job, "half")
    assert PODS_CREATED_ANNOTATION not in stored.metadata.annotations
    pods, _ = await store.list_all(pb.Pod)
    assert len(pods) == replicas


async def test_a_deletion_left_midway_is_finished(dispatcher: Running, store: Store) -> None:
    """What a dispatcher that stopped midway through deleting a big job leaves behind: the job
    marked for deletion and some of its pods. The reconciler deletes the rest, then the job."""
    job = normalise_job(f.job("leaving", replicas=6))
    job.metadata.deletion_timestamp_ms = int(time.time() * 1000)
    pods = f.pods_of(job)
    await store.create_unit(job, pods)
    await store.commit([Delete("Pod", p.metadata.name) for p in pods[:2]])  # the chunks done
    reconciler = dispatcher.service.reconciler
    await eventually(
        lambda: reconciler.repairs["unfinished_deletion"] == 1,
        timeout=INTERVAL + 30,
        what="repair",
    )

    async def gone() -> bool:  # in the deleter's background, as a Delete's
        return await store.get_many(pb.Job, ["leaving"]) == [None]

    await eventually(gone, timeout=30, what="the job deleted")
    assert (await store.list_all(pb.Pod))[0] == []
