"""A gang's phases as the original Gödel's PodGroup state machine has them (Pending →
PreScheduling → Scheduled, Timeout past ``scheduleTimeoutSeconds``; Scheduled and Timeout
sticky), table-driven; the job status controller finding a due deadline without a scan, writing
Timeout with the last attempt's reason and an Event; the dispatcher's queue holding a timed-out
unit until its restart; RetryJob; and ``scheduleTimeoutSeconds`` validated. Real store, real
dispatcher on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from godel.manifest import ManifestError, parse_document
from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.gangtimeout import (
    SCHEDULE_TIMEOUT,
    ScheduleDeadlines,
    restarted,
    timeout_condition,
)
from services.dispatcher.controllers.jobphase import as_read, job_status
from services.dispatcher.controllers.jobstatus import JobStatusController
from services.dispatcher.dispatching.unitqueue import UnitState
from services.events import EventRecorder
from store import Store
from store.informer import Informer
from tests import factories as f
from tests.dispatcher_harness import dispatcher_config, eventually, run_dispatcher
from tests.test_dispatcher_controllers import KINDS, caught_up
from tests.test_dispatcher_unitqueue import World

P, B, R, S, F = pb.POD_PENDING, pb.POD_BOUND, pb.POD_RUNNING, pb.POD_SUCCEEDED, pb.POD_FAILED
CREATED = 1_000_000  # the job's creation (ms)
PENDING, PRE, SCHED, RUN, TIMEOUT = (
    pb.JOB_PENDING,
    pb.JOB_PRESCHEDULING,
    pb.JOB_SCHEDULED,
    pb.JOB_RUNNING,
    pb.JOB_TIMEOUT,
)

# (case, replicas, min_member, stored phase, ever_scheduled, scheduleTimeoutSeconds (None:
#  unset, 300), restarted at (ms, 0: never), pod phases by index, now (ms; None: not judged),
#  expected phase)
GANG_CASES: list[
    tuple[str, int, int, int, bool, int | None, int, list[int], int | None, int]
] = [
    ("not enough pods yet", 3, 3, PENDING, False, 60, 0, [P, P], CREATED + 1_000, PENDING),
    ("prescheduling: min_member pods exist", 3, 3, PENDING, False, 60, 0, [P, P, P],
     CREATED + 1_000, PRE),
    ("prescheduling: some bound, fewer than min", 3, 3, PRE, False, 60, 0, [B, B, P],
     CREATED + 1_000, PRE),
    ("prescheduling: min below replicas", 4, 2, PENDING, False, 60, 0, [P, P, P, P],
     CREATED + 1_000, PRE),
    ("scheduled by bound count", 3, 2, PRE, False, 60, 0, [B, B, P], CREATED + 1_000, SCHED),
    ("scheduled by one running pod", 3, 3, PRE, False, 60, 0, [R, P, P], CREATED + 1_000, SCHED),
    ("scheduled by one finished pod", 3, 3, PRE, False, 60, 0, [S, P, P], CREATED + 1_000,
     SCHED),
    ("timeout: prescheduling past its deadline", 3, 3, PRE, False, 60, 0, [P, P, P],
     CREATED + 60_000, TIMEOUT),
    ("timeout: not even all pods exist", 3, 3, PENDING, False, 60, 0, [P], CREATED + 60_000,
     TIMEOUT),
    ("not yet: a moment before the deadline", 3, 3, PRE, False, 60, 0, [P, P, P],
     CREATED + 59_999, PRE),
    ("timeout with a running pod is Scheduled", 3, 3, PRE, False, 60, 0, [R, P, P],
     CREATED + 600_000, SCHED),
    ("default timeout: 300 s, not yet", 2, 2, PRE, False, None, 0, [P, P], CREATED + 299_999,
     PRE),
    ("default timeout: 300 s", 2, 2, PRE, False, None, 0, [P, P], CREATED + 300_000, TIMEOUT),
    ("the timer counts from the last restart", 2, 2, PENDING, False, 60, CREATED + 100_000,
     [P, P], CREATED + 159_999, PRE),
    ("restarted, and past the new deadline", 2, 2, PRE, False, 60, CREATED + 100_000, [P, P],
     CREATED + 160_000, TIMEOUT),
    ("sticky Scheduled: its pods pending again", 3, 3, SCHED, False, 60, 0, [P, P, P],
     CREATED + 600_000, SCHED),
    ("sticky Scheduled: from Running, one left bound", 3, 3, RUN, False, 60, 0, [B, P, P],
     CREATED + 600_000, SCHED),
    ("sticky Scheduled: ever_scheduled", 3, 3, PENDING, True, 60, 0, [P, P, P],
     CREATED + 600_000, SCHED),
    ("sticky Timeout: before the deadline, or not judged", 3, 3, TIMEOUT, False, 60, 0,
     [P, P, P], None, TIMEOUT),
    ("sticky Timeout: some bound meanwhile", 3, 3, TIMEOUT, False, 60, 0, [B, P, P],
     CREATED + 1_000, TIMEOUT),
    ("Timeout left when bound after all (a decision under way)", 3, 3, TIMEOUT, False, 60, 0,
     [B, B, B], CREATED + 600_000, SCHED),
    ("minMember 1: unchanged, no PreScheduling or Timeout", 3, 1, PENDING, False, 60, 0,
     [P, P, P], CREATED + 600_000, PENDING),
    ("a deadline needs a stored creation time", 2, 2, PENDING, False, 60, -CREATED, [P, P],
     CREATED + 600_000, PRE),
]  # fmt: skip


def _pods(job: pb.Job, phases: list[int]) -> list[pb.Pod]:
    pods = f.pods_of(job)[: len(phases)]
    for pod, phase in zip(pods, phases, strict=True):
        pod.status.phase = phase  # type: ignore[assignment]
        if phase != P:
            pod.spec.node_name = "n1"
    return pods


@pytest.mark.parametrize(
    ("replicas", "min_member", "stored", "ever", "timeout", "restart", "phases", "now", "want"),
    [c[1:] for c in GANG_CASES],
    ids=[c[0] for c in GANG_CASES],
)
def test_gang_phase(
    replicas: int,
    min_member: int,
    stored: int,
    ever: bool,
    timeout: int | None,
    restart: int,
    phases: list[int],
    now: int | None,
    want: int,
) -> None:
    job = f.job("g", replicas=replicas, min_member=min_member)
    job.metadata.creation_timestamp_ms = CREATED if restart >= 0 else 0
    job.status.schedule_started_ms = max(restart, 0)
    job.status.phase = stored  # type: ignore[assignment]
    job.status.ever_scheduled = ever
    if timeout is not None:
        job.spec.schedule_timeout_seconds = timeout
    phase = job_status(job, _pods(job, phases), now)[0]
    assert phase == want, pb.JobPhase.Name(phase)


def test_a_one_pod_job_derived_when_read_never_times_out() -> None:
    job = f.job("solo", replicas=1)
    job.metadata.creation_timestamp_ms = 1  # long ago
    assert as_read(job, f.pods_of(job)).status.phase == pb.JOB_PENDING


def test_deadlines_come_up_once_and_follow_restarts() -> None:
    deadlines = ScheduleDeadlines()
    gang = f.job("g", replicas=2, min_member=2)
    gang.metadata.creation_timestamp_ms = CREATED
    gang.spec.schedule_timeout_seconds = 10
    other = f.job("h", replicas=2, min_member=2)
    other.metadata.creation_timestamp_ms = CREATED
    deadlines.watch(gang, pb.JOB_PRESCHEDULING)
    deadlines.watch(gang, pb.JOB_PRESCHEDULING)  # computed again: one deadline
    deadlines.watch(other, pb.JOB_PENDING)  # 300 s
    assert deadlines.due(CREATED + 9_999) == []
    assert deadlines.due(CREATED + 10_000) == ["g"]
    assert deadlines.due(CREATED + 10_000) == []
    # Restarted: the old deadline is stale, the new one counts.
    deadlines.watch(gang, pb.JOB_PRESCHEDULING)
    restarted_gang = restarted(gang, CREATED + 50_000)
    deadlines.watch(restarted_gang, pb.JOB_PENDING)
    assert deadlines.due(CREATED + 59_999) == []
    assert deadlines.due(CREATED + 60_000) == ["g"]
    # Scheduled meanwhile: no longer watched.
    deadlines.watch(other, pb.JOB_SCHEDULED)
    assert deadlines.due(CREATED + 10**9) == [] and len(deadlines) == 0
    # Not a gang: never watched.
    solo = f.job("s", replicas=3, min_member=1)
    solo.metadata.creation_timestamp_ms = CREATED
    deadlines.watch(solo, pb.JOB_PENDING)
    assert len(deadlines) == 0


# --------------------------------------------------------------------------------------------
# The job status controller, against a real store
# --------------------------------------------------------------------------------------------


@pytest.fixture
async def informer(store: Store) -> AsyncIterator[Informer]:
    inf = Informer(store, KINDS, block_ms=100)
    inf.start()
    await inf.wait_synced(10)
    try:
        yield inf
    finally:
        await inf.stop()


async def test_a_due_deadline_times_the_gang_out_with_its_reason_and_an_event(
    store: Store, informer: Informer
) -> None:
    job = f.job("gang", replicas=2, min_member=2)
    job.spec.schedule_timeout_seconds = 1
    pods = f.pods_of(job)
    await store.create_unit(job, pods)
    events = EventRecorder(store, "dispatcher-test")
    ctl = JobStatusController(store, informer, events=events)
    await caught_up(store, informer)
    await ctl.tick()
    stored = await store.get(pb.Job, "gang")
    assert stored.status.phase == pb.JOB_PRESCHEDULING
    assert len(ctl.deadlines) == 1
    # The shard's last attempt, as it records it on the pods.
    pod = await store.get(pb.Pod, "gang-0")
    pod.status.conditions.add(
        type="PodScheduled",
        status="False",
        reason="Unschedulable",
        message="0/3 nodes fit: 3 insufficient cpu",
        last_transition_ms=int(time.time() * 1000),
    )
    await store.update(pod)
    await caught_up(store, informer)
    await ctl.tick()  # the pod's change is looked at; not due yet
    assert ctl.changed_jobs == set()
    await asyncio.sleep(1.1)  # past the deadline; nothing changed in the store meanwhile
    await ctl.tick()  # the deadline, not a change, brings the job back
    stored = await store.get(pb.Job, "gang")
    assert stored.status.phase == pb.JOB_TIMEOUT
    cond = timeout_condition(stored)
    assert cond is not None and cond.reason == SCHEDULE_TIMEOUT
    assert "not scheduled within 1s" in cond.message
    assert "0/3 nodes fit: 3 insufficient cpu" in cond.message
    await events.flush()
    [event] = [e for e in (await store.list_all(pb.Event))[0] if e.regarding.name == "gang"]
    assert (event.reason, event.type) == (SCHEDULE_TIMEOUT, "Warning")
    assert "insufficient cpu" in event.message

    # Sticky: computed again, it stays Timeout.
    await caught_up(store, informer)
    ctl.changed_jobs.add("gang")
    await ctl.tick()
    assert (await store.get(pb.Job, "gang")).status.phase == pb.JOB_TIMEOUT

    # Restarted: PreScheduling again, the condition gone, a fresh deadline watched.
    await store.update(restarted(stored, int(time.time() * 1000)))
    await caught_up(store, informer)
    await ctl.tick()
    again = await store.get(pb.Job, "gang")
    assert again.status.phase == pb.JOB_PRESCHEDULING and timeout_condition(again) is None
    assert len(ctl.deadlines) == 1


async def test_a_restarted_controller_times_out_from_the_stored_creation_time(
    store: Store, informer: Informer
) -> None:
    """A dispatcher restart: a new controller's first tick (every job once) finds a gang whose
    deadline passed while no controller ran."""
    job = f.job("gang", replicas=2, min_member=2)
    job.spec.schedule_timeout_seconds = 1
    await store.create_unit(job, f.pods_of(job))
    await asyncio.sleep(1.1)
    ctl = JobStatusController(store, informer)
    await caught_up(store, informer)
    await ctl.tick()
    assert (await store.get(pb.Job, "gang")).status.phase == pb.JOB_TIMEOUT


# --------------------------------------------------------------------------------------------
# The dispatcher's queue
# --------------------------------------------------------------------------------------------


def _state(w: World, job: str) -> UnitState:
    return w.uq.units[job].state


def test_a_timed_out_unit_is_held_until_its_restart() -> None:
    w = World()
    w.submit("a", replicas=2)
    w.submit("b")
    assert w.uq.set_timed_out("a", True) is None
    assert _state(w, "a") == UnitState.TIMED_OUT
    assert w.take() == ["b"]
    # Its pods changing (a shard's diagnosis written) does not queue it again.
    for pod in f.pods_of(w.jobs["a"]):
        w.uq.remove_pod(pod)
        w.uq.add_pod(pod, now_ms=0)
    assert w.take() == []
    w.uq.set_timed_out("a", False)
    assert _state(w, "a") == UnitState.QUEUED
    assert w.take() == ["a"]


def test_a_unit_at_a_shard_is_returned_to_be_taken_back_and_held_after() -> None:
    w = World()
    w.submit("a", replicas=2)
    assert w.take() == ["a"]
    entry = w.uq.units["a"]
    assert w.uq.set_timed_out("a", True) is entry  # the caller takes it back from its shard
    w.uq.release(entry)
    w.uq.enqueue(entry)
    assert entry.state == UnitState.TIMED_OUT
    assert w.take() == []
    # A unit seen after its job timed out (a dispatcher restart) is held from the start.
    w.uq.set_timed_out("c", True)
    w.submit("c", replicas=2)
    assert w.uq.units["c"].state == UnitState.TIMED_OUT
    assert w.take() == []


# --------------------------------------------------------------------------------------------
# Through the API: RetryJob and validation
# --------------------------------------------------------------------------------------------


def _gang_manifest(timeout: object) -> dict[str, object]:
    return {
        "apiVersion": "godel/v1",
        "kind": "Job",
        "metadata": {"name": "g"},
        "spec": {
            "replicas": 2,
            "minMember": 2,
            "scheduleTimeoutSeconds": timeout,
            "template": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        },
    }


@pytest.mark.parametrize("value", ["abc", 1.5, True])
def test_a_manifests_timeout_must_be_an_integer(value: object) -> None:
    with pytest.raises(ManifestError) as raised:
        parse_document(_gang_manifest(value), "m.yaml")
    assert raised.value.field == "spec.scheduleTimeoutSeconds"


def _job(timeout: int | None) -> pb.Job:
    job = f.job("g", replicas=2, min_member=2)
    if timeout is not None:
        job.spec.schedule_timeout_seconds = timeout
    return job


async def test_bad_timeouts_are_refused_naming_the_field_and_nothing_is_harmed(
    store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    async with run_dispatcher(dispatcher_config(store_url, cluster_name, tmp_path)) as d:
        for bad in (0, -5):
            reply = await d.api.Submit(api_pb2.SubmitRequest(jobs=[_job(bad)]))
            [violation] = reply.results[0].violations
            assert violation.field == "jobs[0].spec.schedule_timeout_seconds"
            assert f"must be a positive integer (got {bad})" in violation.description
        listed = await d.api.List(api_pb2.ListRequest(kind="Job"))
        assert not listed.items
        good = await d.api.Submit(api_pb2.SubmitRequest(jobs=[_job(30)]))
        assert not good.results[0].violations
        # Applied over the stored job: refused the same, the stored one unchanged.
        applied = await d.api.Apply(api_pb2.ApplyRequest(objects=[api_pb2.Object(job=_job(-1))]))
        [result] = applied.results
        assert result.action == "invalid"
        assert result.violations[0].field == "objects[0].job.spec.schedule_timeout_seconds"
        got = await d.api.Get(api_pb2.GetRequest(kind="Job", name="g"))
        assert got.job.spec.schedule_timeout_seconds == 30


async def test_retry_restarts_only_a_timed_out_job(
    store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    config = dispatcher_config(store_url, cluster_name, tmp_path, controller_interval_seconds=0.1)
    async with run_dispatcher(config) as d:
        await d.api.Submit(api_pb2.SubmitRequest(jobs=[_job(1)]))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await d.api.RetryJob(api_pb2.RetryJobRequest(name="g"))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "only a job whose scheduling timed out" in str(refused.value.details())
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await d.api.RetryJob(api_pb2.RetryJobRequest(name="nope"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND

        async def phase() -> int:
            got = await d.api.Get(api_pb2.GetRequest(kind="Job", name="g"))
            return int(got.job.status.phase)

        async def timed_out() -> bool:
            return await phase() == pb.JOB_TIMEOUT

        # No shard: it cannot be scheduled, and times out.
        await eventually(timed_out, timeout=30, what="the gang timed out")
        assert d.service.core.units["g"].state == UnitState.TIMED_OUT
        reply = await d.api.RetryJob(api_pb2.RetryJobRequest(name="g"))
        assert reply.job.status.phase == pb.JOB_PENDING
        assert reply.job.status.schedule_started_ms > 0
        assert timeout_condition(reply.job) is None
        await eventually(
            lambda: d.service.core.units["g"].state != UnitState.TIMED_OUT,
            what="the unit queued again",
        )
        # ... and, still without room, times out again.
        await eventually(timed_out, timeout=30, what="timed out again")
