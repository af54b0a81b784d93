"""The dispatcher's controllers: node lifecycle (lapsed heartbeats → NotReady, pods NodeLost,
replacements), job status (counts and phase, table-driven), queue status and disruption budget
status. Real store, real node agent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers import podindex
from services.dispatcher.controllers.budgetstatus import BudgetStatusController
from services.dispatcher.controllers.deletion import JobDeleter
from services.dispatcher.controllers.jobphase import FailurePolicy, JobCounts, as_read, job_status
from services.dispatcher.controllers.jobretry import JobRetryController
from services.dispatcher.controllers.jobstatus import JobStatusController
from services.dispatcher.controllers.nodelifecycle import NodeLifecycleController
from services.dispatcher.controllers.podindex import PodIndex
from services.dispatcher.controllers.queuestatus import QueueStatusController
from services.dispatcher.controllers.ttl import FinishedJobCollector
from services.dispatcher.dispatching.dispatch import DispatchSettings, UnitDispatcher
from services.nodeagent.service import NodeAgentService
from services.runtime import ServiceHost
from store import CommitError, Store
from store.client import Fence, Release, Update
from store.informer import Handlers, Informer
from tests import factories as f
from tests.test_nodeagent import agent_config, eventually, phases

KINDS = ["Job", "Pod", "Node", "Queue", "DisruptionBudget"]

B, R, S, F, P = pb.POD_BOUND, pb.POD_RUNNING, pb.POD_SUCCEEDED, pb.POD_FAILED, pb.POD_PENDING
LOST = (F, "NodeLost")

# (case, replicas, min_member, replace_lost_pods, current phase,
#  pods as (index, phase or (phase, reason), replacement number),
#  expected (phase, bound, running, succeeded, failed))
JOB_CASES: list[tuple[str, int, int, bool, int, list[tuple[int, object, int]], tuple[int, ...]]] = [
    ("no pods yet", 3, 3, False, pb.JOB_PHASE_UNSPECIFIED, [], (pb.JOB_PENDING, 0, 0, 0, 0)),
    ("all pending: a gang's pods exist", 2, 2, False, pb.JOB_PENDING, [(0, P, 0), (1, P, 0)],
     (pb.JOB_PRESCHEDULING, 0, 0, 0, 0)),
    ("gang below min", 3, 3, False, pb.JOB_PENDING, [(0, B, 0), (1, B, 0), (2, P, 0)],
     (pb.JOB_PRESCHEDULING, 2, 0, 0, 0)),
    ("gang bound", 3, 3, False, pb.JOB_PENDING, [(0, B, 0), (1, B, 0), (2, B, 0)],
     (pb.JOB_SCHEDULED, 3, 0, 0, 0)),
    ("scheduled, partly running", 3, 3, False, pb.JOB_SCHEDULED, [(0, R, 0), (1, B, 0), (2, R, 0)],
     (pb.JOB_SCHEDULED, 1, 2, 0, 0)),
    ("all running", 3, 3, False, pb.JOB_SCHEDULED, [(0, R, 0), (1, R, 0), (2, R, 0)],
     (pb.JOB_RUNNING, 0, 3, 0, 0)),
    ("deployment-like: one running is enough", 4, 1, False, pb.JOB_PENDING,
     [(0, R, 0), (1, P, 0), (2, P, 0), (3, P, 0)], (pb.JOB_RUNNING, 0, 1, 0, 0)),
    ("succeeded count towards scheduled", 2, 2, False, pb.JOB_RUNNING, [(0, S, 0), (1, R, 0)],
     (pb.JOB_SCHEDULED, 0, 1, 1, 0)),
    ("all succeeded", 2, 2, False, pb.JOB_RUNNING, [(0, S, 0), (1, S, 0)],
     (pb.JOB_SUCCEEDED, 0, 0, 2, 0)),
    ("one failed breaks a gang", 3, 3, False, pb.JOB_RUNNING, [(0, R, 0), (1, F, 0), (2, R, 0)],
     (pb.JOB_FAILED, 0, 2, 0, 1)),
    ("one failed, min_member still reachable", 3, 2, False, pb.JOB_RUNNING,
     [(0, R, 0), (1, F, 0), (2, R, 0)], (pb.JOB_RUNNING, 0, 2, 0, 1)),
    ("ended with enough successes", 3, 2, False, pb.JOB_RUNNING, [(0, S, 0), (1, F, 0), (2, S, 0)],
     (pb.JOB_SUCCEEDED, 0, 0, 2, 1)),
    ("lost but replaceable is not failed", 2, 2, True, pb.JOB_RUNNING, [(0, LOST, 0), (1, R, 0)],
     (pb.JOB_SCHEDULED, 0, 1, 0, 1)),
    ("lost without replacement fails", 2, 2, False, pb.JOB_RUNNING, [(0, LOST, 0), (1, R, 0)],
     (pb.JOB_FAILED, 0, 1, 0, 1)),
    ("replacement supersedes the lost pod", 2, 2, True, pb.JOB_RUNNING,
     [(0, LOST, 0), (0, R, 1), (1, R, 0)], (pb.JOB_RUNNING, 0, 2, 0, 0)),
    ("newest replacement wins", 1, 1, True, pb.JOB_RUNNING,
     [(0, LOST, 0), (0, LOST, 1), (0, B, 2)], (pb.JOB_SCHEDULED, 1, 0, 0, 0)),
    ("unschedulable kept while nothing placed", 2, 2, False, pb.JOB_UNSCHEDULABLE,
     [(0, P, 0), (1, P, 0)], (pb.JOB_UNSCHEDULABLE, 0, 0, 0, 0)),
    ("unschedulable left once placed", 2, 1, False, pb.JOB_UNSCHEDULABLE, [(0, B, 0), (1, P, 0)],
     (pb.JOB_SCHEDULED, 1, 0, 0, 0)),
]  # fmt: skip


def make_pod(job: str, index: int, state: object, rnum: int) -> pb.Pod:
    name = f"{job}-{index}" + (f"-r{rnum}" if rnum else "")
    pod = pb.Pod(metadata=pb.ObjectMeta(name=name))
    pod.spec.job, pod.spec.index = job, index
    phase, reason = state if isinstance(state, tuple) else (state, "")
    pod.status.phase, pod.status.reason = phase, reason
    return pod


@pytest.mark.parametrize(
    ("replicas", "min_member", "replace", "current", "pods", "expected"),
    [c[1:] for c in JOB_CASES],
    ids=[c[0] for c in JOB_CASES],
)
def test_job_status(
    replicas: int,
    min_member: int,
    replace: bool,
    current: int,
    pods: list[tuple[int, object, int]],
    expected: tuple[int, ...],
) -> None:
    job = f.job("j", replicas=replicas, min_member=min_member)
    job.spec.replace_lost_pods = replace
    job.status.phase = current  # type: ignore[assignment]
    assert job_status(job, [make_pod("j", *p) for p in pods]) == expected


ERR = (F, "Error")

# A one-pod job's status is derived from its pods when read. (case, backoff_limit (None: unset),
# pods as (index, phase or (phase, reason), replacement number, finished_ms),
# expected (phase, bound, running, succeeded, failed, finished_ms)); the job was created at 1234.
DERIVED_CASES: list[tuple[str, int | None, list[tuple[int, object, int, int]], tuple[int, ...]]] = [
    ("no pod yet", None, [], (pb.JOB_PENDING, 0, 0, 0, 0, 0)),
    ("pending", None, [(0, P, 0, 0)], (pb.JOB_PENDING, 0, 0, 0, 0, 0)),
    ("bound", None, [(0, B, 0, 0)], (pb.JOB_SCHEDULED, 1, 0, 0, 0, 0)),
    ("running", None, [(0, R, 0, 0)], (pb.JOB_RUNNING, 0, 1, 0, 0, 0)),
    ("succeeded: finished when the pod did", None, [(0, S, 0, 5000)],
     (pb.JOB_SUCCEEDED, 0, 0, 1, 0, 5000)),
    ("failed", None, [(0, ERR, 0, 7000)], (pb.JOB_FAILED, 0, 0, 0, 1, 7000)),
    ("failed, retried: pending again", 2, [(0, ERR, 0, 7000), (0, P, 1, 0)],
     (pb.JOB_PENDING, 0, 0, 0, 0, 0)),
    ("retries exhausted", 0, [(0, ERR, 0, 7000)], (pb.JOB_FAILED, 0, 0, 0, 1, 7000)),
    ("finished, no time on the pod: the job's creation", None, [(0, S, 0, 0)],
     (pb.JOB_SUCCEEDED, 0, 0, 1, 0, 1234)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("limit", "pods", "expected"), [c[1:] for c in DERIVED_CASES], ids=[c[0] for c in DERIVED_CASES]
)
def test_a_one_pod_jobs_status_is_derived_from_its_pods(
    limit: int | None, pods: list[tuple[int, object, int, int]], expected: tuple[int, ...]
) -> None:
    job = f.job("j", replicas=1)
    job.metadata.creation_timestamp_ms = 1234
    if limit is not None:
        job.spec.backoff_limit = limit
    # Whatever was stored (a status written before statuses were derived) does not count.
    job.status.phase, job.status.running, job.status.finished_ms = pb.JOB_RUNNING, 1, 99
    made = []
    for index, state, rnum, finished in pods:
        pod = make_pod("j", index, state, rnum)
        pod.status.finished_ms = finished
        made.append(pod)
    read = as_read(job, made)
    s = read.status
    assert (s.phase, s.bound, s.running, s.succeeded, s.failed, s.finished_ms) == expected
    assert job.status.running == 1  # a copy: the job given is untouched


def test_a_bigger_jobs_status_is_read_as_stored() -> None:
    job = f.job("j", replicas=2)
    job.status.phase = pb.JOB_RUNNING
    assert as_read(job, [make_pod("j", 0, P, 0)]) is job


PREEMPTED = (F, "Preempted")
# (case, backoff_limit (None: unset), replace_lost_pods, pods, expected phase, within the limit)
PodRows = list[tuple[int, object, int]]
FAILURE_POLICY_CASES: list[tuple[str, int | None, bool, PodRows, int, bool]] = [
    ("unset: a failed gang member fails the job", None, False,
     [(0, ERR, 0), (1, R, 0)], pb.JOB_FAILED, False),
    ("within the limit: retrying, not failed", 2, False,
     [(0, ERR, 0), (1, R, 0)], pb.JOB_SCHEDULED, True),
    ("a retry running again", 2, False,
     [(0, ERR, 0), (0, R, 1), (1, R, 0)], pb.JOB_RUNNING, True),
    ("limit reached exactly: still retrying", 1, False,
     [(0, ERR, 0), (0, P, 1), (1, R, 0)], pb.JOB_SCHEDULED, True),
    ("limit exceeded: failed", 1, False,
     [(0, ERR, 0), (0, ERR, 1), (1, R, 0)], pb.JOB_FAILED, False),
    ("limit 0: the first failure fails the job", 0, False,
     [(0, ERR, 0), (1, R, 0)], pb.JOB_FAILED, False),
    ("evictions replaced by a service do not count", 0, True,
     [(0, PREEMPTED, 0), (0, R, 1), (1, R, 0)], pb.JOB_RUNNING, True),
    ("evictions of a batch job count", 0, False,
     [(0, PREEMPTED, 0), (1, R, 0)], pb.JOB_FAILED, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("limit", "replace", "pods", "phase", "retrying"),
    [c[1:] for c in FAILURE_POLICY_CASES],
    ids=[c[0] for c in FAILURE_POLICY_CASES],
)
def test_failure_policy(
    limit: int | None,
    replace: bool,
    pods: list[tuple[int, object, int]],
    phase: int,
    retrying: bool,
) -> None:
    job = f.job("j", replicas=2, min_member=2)
    job.spec.replace_lost_pods = replace
    if limit is not None:
        job.spec.backoff_limit = limit
    made = [make_pod("j", *p) for p in pods]
    assert job_status(job, made)[0] == phase
    assert FailurePolicy.of(job, made).retrying == retrying


@pytest.mark.parametrize(
    ("failures", "delay_ms"), [(1, 10_000), (2, 20_000), (3, 40_000), (6, 320_000), (7, 360_000)]
)
def test_retry_backoff_doubles_up_to_the_cap(failures: int, delay_ms: int) -> None:
    assert FailurePolicy(6, failures).delay_ms(10_000, 360_000) == delay_ms


async def test_job_retry_controller(store: Store, informer: Informer) -> None:
    """A batch job with backoffLimit 1: its failed pod is retried once its backoff has passed,
    as a new pending pod of the same index; the retry failing too fails the job with the
    reason; a job without the field is left alone."""
    job = f.job("batch", replicas=1)
    job.spec.backoff_limit = 1
    plain = f.job("plain", replicas=1)
    await store.create_unit(job, f.pods_of(job))
    await store.create_unit(plain, f.pods_of(plain))
    ctl = JobRetryController(store, informer, initial_backoff_seconds=10)

    async def fail(name: str, at_ms: int) -> None:
        pod = await store.get(pb.Pod, name)
        pod.status.phase, pod.status.reason, pod.status.finished_ms = F, "Error", at_ms
        await store.update(pod)
        await caught_up(store, informer)

    await fail("batch-0", 1_000)
    await fail("plain-0", 1_000)
    await ctl.tick(now_ms=10_999)  # within the backoff: nothing yet
    names = {p.metadata.name for p in (await store.list_all(pb.Pod))[0]}
    assert names == {"batch-0", "plain-0"}
    await ctl.tick(now_ms=11_000)
    retry = await store.get(pb.Pod, "batch-0-r1")
    assert (retry.status.phase, retry.spec.index, retry.spec.node_name) == (P, 0, "")
    assert retry.metadata.annotations["godel.io/replaces"] == "batch-0"
    await caught_up(store, informer)
    await fail("batch-0-r1", 20_000)
    await ctl.tick(now_ms=1_000_000)
    assert {p.metadata.name for p in (await store.list_all(pb.Pod))[0]} == names | {"batch-0-r1"}
    failed = await store.get(pb.Job, "batch")
    [cond] = failed.status.conditions
    assert (cond.type, cond.reason) == ("Failed", "BackoffLimitExceeded")
    assert "2 pods failed; backoffLimit is 1" in cond.message
    await caught_up(store, informer)
    await ctl.tick(now_ms=1_000_001)  # marked once
    assert len((await store.get(pb.Job, "batch")).status.conditions) == 1
    pods = [p for p in (await store.list_all(pb.Pod))[0] if p.spec.job == "batch"]
    assert job_status(failed, pods)[0] == pb.JOB_FAILED


# --------------------------------------------------------------------------------------------
# Against a real store
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


async def caught_up(store: Store, informer: Informer) -> None:
    await informer.wait_for_revision(await store.revision(), timeout=10)


async def binder_fence(store: Store) -> Fence:
    ok, lease = await store.acquire_lease("binder", "test-binder", 60_000)
    assert ok
    return Fence("binder", lease.epoch)


async def bind(store: Store, pods: list[pb.Pod], node: str, fence: Fence) -> None:
    for p in pods:
        p.spec.node_name = node
        p.spec.numa_nodes.append(0)
        p.status.phase = pb.POD_BOUND
    await store.bind(pods, fence=fence)


async def test_lapsed_node_lost_and_replaced(store: Store, informer: Informer) -> None:
    now = int(time.time() * 1000)
    stale, fresh = f.node("stale"), f.node("fresh")
    # Both registered long ago; only "fresh" has heartbeated since (in the heartbeat hash).
    stale.status.heartbeat_ms = now - 60_000
    fresh.status.heartbeat_ms = now - 60_000
    static = f.node("static")  # no agent, never heartbeated: not under heartbeat management
    for n in (stale, fresh, static):
        await store.create(n)
    assert await store.record_heartbeats(["fresh", "nosuch"]) == ["nosuch"]
    web = f.job("web", replicas=2)
    web.spec.replace_lost_pods = True
    batch = f.job("batch", replicas=1)
    web_pods, batch_pods = f.pods_of(web), f.pods_of(batch)
    await store.create_unit(web, web_pods)
    await store.create_unit(batch, batch_pods)
    fence = await binder_fence(store)
    await bind(store, [*web_pods, *batch_pods], "stale", fence)
    other = f.job("other", replicas=1)
    other_pods = f.pods_of(other)
    await store.create_unit(other, other_pods)
    await bind(store, other_pods, "fresh", fence)

    ctl = NodeLifecycleController(store, informer, grace_seconds=10)
    await caught_up(store, informer)
    await ctl.tick()

    node = await store.get(pb.Node, "stale")
    assert not node.status.ready
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert [(c.status, c.reason) for c in ready] == [("False", "NodeHeartbeatLapsed")]
    assert (await store.get(pb.Node, "fresh")).status.ready
    assert (await store.get(pb.Node, "static")).status.ready
    for name in ("web-0", "web-1", "batch-0"):
        pod = await store.get(pb.Pod, name)
        assert (pod.status.phase, pod.status.reason) == (pb.POD_FAILED, "NodeLost")
        assert pod.status.finished_ms > 0
    assert (await store.get(pb.Pod, "other-0")).status.phase == pb.POD_BOUND
    usage = await store.node_usage("stale")
    assert usage is not None and usage.used["pods"] == 0
    # Replacements for the job that asked for them, pending and unbound; none for the batch job.
    for i in (0, 1):
        r = await store.get(pb.Pod, f"web-{i}-r1")
        assert r.status.phase == pb.POD_PENDING
        assert r.spec.node_name == "" and not r.spec.numa_nodes
        assert (r.spec.job, r.spec.index) == ("web", i)
        assert r.metadata.annotations["godel.io/replaces"] == f"web-{i}"
    assert (await store.get_many(pb.Pod, ["batch-0-r1"])) == [None]

    # A replacement lost in turn gets the next number.
    await caught_up(store, informer)
    r1 = await store.get(pb.Pod, "web-0-r1")
    await bind(store, [r1], "fresh", fence)
    await store.forget_heartbeats(["fresh"])
    await caught_up(store, informer)
    await ctl.tick()
    assert (await store.get(pb.Pod, "web-0-r2")).status.phase == pb.POD_PENDING
    assert (await store.get(pb.Pod, "other-0")).status.reason == "NodeLost"

    # The stale node heartbeats again: ready again.
    await caught_up(store, informer)
    await store.record_heartbeats(["stale"])
    await ctl.tick()
    node = await store.get(pb.Node, "stale")
    assert node.status.ready
    assert [c.status for c in node.status.conditions if c.type == "Ready"] == ["True"]
    # A quiet tick writes nothing.
    await caught_up(store, informer)
    calls = ctl.commit_calls
    await ctl.tick()
    assert ctl.commit_calls == calls


async def test_lifecycle_ticks_read_only_stale_stamps_while_every_node_heartbeats(
    store: Store, informer: Informer
) -> None:
    for name in ("a", "b"):
        await store.create(f.node(name))
    await store.record_heartbeats(["a", "b"])
    job = f.job("j", replicas=1)
    pods = f.pods_of(job)
    await store.create_unit(job, pods)
    await bind(store, pods, "b", await binder_fence(store))
    ctl = NodeLifecycleController(store, informer, grace_seconds=1)
    await caught_up(store, informer)
    await ctl.tick()
    assert ctl.commit_calls == 0

    await asyncio.sleep(1.2)  # b's stamp lapses; a keeps heartbeating
    await store.record_heartbeats(["a"])
    await caught_up(store, informer)
    await ctl.tick()
    assert not (await store.get(pb.Node, "b")).status.ready
    assert (await store.get(pb.Pod, "j-0")).status.reason == "NodeLost"
    assert (await store.get(pb.Node, "a")).status.ready

    await store.record_heartbeats(["a", "b"])  # b is back
    await caught_up(store, informer)
    await ctl.tick()
    assert (await store.get(pb.Node, "b")).status.ready
    assert ctl.full_ticks == 0  # every node had a stamp: only stale and lapsed ones were read

    # A node registered without a stamp yet: that tick reads every stamp (its grace counts
    # from its registration).
    await store.create(f.node("c"))
    await store.record_heartbeats(["a", "b"])
    await caught_up(store, informer)
    await ctl.tick()
    assert ctl.full_ticks == 1 and (await store.get(pb.Node, "c")).status.ready


async def test_heartbeats_of_deleted_nodes_forgotten_once_lapsed(
    store: Store, informer: Informer
) -> None:
    for name in ("kept", "deleted"):
        await store.create(f.node(name))
    await store.record_heartbeats(["kept", "deleted"])
    await store.delete(pb.Node, "deleted")
    ctl = NodeLifecycleController(store, informer, grace_seconds=0.3)
    await caught_up(store, informer)
    await ctl.tick()  # within the grace: a node registering now may not be in the view yet
    assert set((await store.heartbeats()).last_ms) == {"kept", "deleted"}
    await asyncio.sleep(0.4)
    await ctl.tick()
    assert set((await store.heartbeats()).last_ms) == {"kept"}


async def test_stopped_agent_node_lost(
    store: Store, store_url: str, tmp_path: Path, informer: Informer
) -> None:
    """End to end: a real agent runs a pod, stops; the controller's loop notices the lapse."""
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=1, node_prefix="gone")
    job = f.job("svc", replicas=1)
    job.spec.replace_lost_pods = True
    async with ServiceHost(NodeAgentService, cfg):
        pods = f.pods_of(job)
        await store.create_unit(job, pods)
        await bind(store, pods, "gone-0", await binder_fence(store))

        async def running() -> bool:
            return await phases(store, ["svc-0"]) == [pb.POD_RUNNING]

        await eventually(running, what="pod running")
    ctl = NodeLifecycleController(store, informer, grace_seconds=0.6, interval_seconds=0.1)
    tasks = [asyncio.create_task(ctl.run())]
    try:

        async def lost() -> bool:
            pods = await store.get_many(pb.Pod, ["svc-0", "svc-0-r1"])
            node = await store.get(pb.Node, "gone-0")
            return (
                not node.status.ready
                and pods[0] is not None
                and pods[0].status.reason == "NodeLost"
                and pods[1] is not None
            )

        await eventually(lost, what="node lost, pod failed and replaced")

        async def job_pending() -> bool:
            # A one-pod job: its status is derived from its pods (the lost one, replaced).
            pods = [p for p in await store.get_many(pb.Pod, ["svc-0", "svc-0-r1"]) if p]
            j = as_read(await store.get(pb.Job, "svc"), pods)
            return (j.status.phase, j.status.failed) == (pb.JOB_PENDING, 0)

        await eventually(job_pending, what="job status back to pending")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    # The agent comes back: its heartbeat makes the node ready again.
    async with ServiceHost(NodeAgentService, cfg):
        assert (await store.get(pb.Node, "gone-0")).status.ready


async def test_queue_status_controller(store: Store, informer: Informer) -> None:
    await store.create(f.node("n1"))
    await store.create(pb.Queue(metadata=pb.ObjectMeta(name="batch")))
    await store.create(pb.Queue(metadata=pb.ObjectMeta(name="idle")))
    # Its accounting, not its loops: it never dials a shard.
    core = UnitDispatcher(store, informer, DispatchSettings(), dial=grpc.aio.insecure_channel)
    ctl = QueueStatusController(store, informer, core.queue_statuses)
    job = f.job("work", replicas=3, cpu=500)
    job.spec.queue = "batch"
    pods = f.pods_of(job)
    for pod in pods:
        pod.spec.queue = "batch"  # as the Dispatcher's Submit stores them
    await store.create_unit(job, pods)
    await caught_up(store, informer)
    await ctl.tick()
    batch = await store.get(pb.Queue, "batch")
    assert (batch.status.pending_units, batch.status.pending_pods) == (1, 3)
    assert batch.status.used.milli_cpu == 0
    # Two pods bind: they count as used, one stays pending.
    await bind(store, pods[:2], "n1", await binder_fence(store))
    await caught_up(store, informer)
    await ctl.tick()
    batch = await store.get(pb.Queue, "batch")
    assert (batch.status.pending_units, batch.status.pending_pods) == (1, 1)
    assert (batch.status.used.milli_cpu, batch.status.used.pods) == (1000, 2)
    # An empty queue keeps an empty status; a quiet tick writes nothing.
    assert (await store.get(pb.Queue, "idle")).status == pb.QueueStatus()
    await caught_up(store, informer)
    writes = ctl.writes
    await ctl.tick()
    assert ctl.writes == writes


async def _job_on_a_node(
    store: Store, informer: Informer, name: str, replicas: int
) -> tuple[list[pb.Pod], JobStatusController]:
    """A node, a job of ``replicas`` pods (all pending) and a job status controller over them."""
    await store.create(f.node("n1"))
    job = f.job(name, replicas=replicas, min_member=replicas)
    pods = f.pods_of(job)
    await store.create_unit(job, pods)
    ctl = JobStatusController(store, informer)
    await caught_up(store, informer)
    return pods, ctl


async def test_job_status_controller(store: Store, informer: Informer) -> None:
    pods, ctl = await _job_on_a_node(store, informer, "gang", 3)
    await ctl.tick()
    j = await store.get(pb.Job, "gang")
    assert j.status.phase == pb.JOB_PRESCHEDULING  # its pods exist, none bound

    # The Binder binds the gang and sets ever_scheduled; our cached copy is then stale.
    await bind(store, pods, "n1", await binder_fence(store))
    j.status.ever_scheduled = True
    await store.update(j)
    await caught_up(store, informer)
    await ctl.tick()
    j = await store.get(pb.Job, "gang")
    assert (j.status.phase, j.status.bound) == (pb.JOB_SCHEDULED, 3)
    assert j.status.ever_scheduled

    # A conflicting write between the informer's view and ours: re-read, ever_scheduled kept.
    for p in pods[:2]:
        p.status.phase = pb.POD_RUNNING
    await store.update_many(pods[:2])
    await caught_up(store, informer)
    stale = await store.get(pb.Job, "gang")
    stale.metadata.annotations["touched"] = "yes"
    await store.update(stale)  # the informer has not seen this yet when the tick computes
    writes = ctl.writes
    await ctl.tick()
    j = await store.get(pb.Job, "gang")
    assert (j.status.phase, j.status.bound, j.status.running) == (pb.JOB_SCHEDULED, 1, 2)
    assert j.status.ever_scheduled and j.metadata.annotations["touched"] == "yes"
    assert ctl.writes - writes <= 2

    # Nothing changed: no write.
    await caught_up(store, informer)
    await ctl.tick()
    writes = ctl.writes
    await ctl.tick()
    assert ctl.writes == writes


class CountingPodIndex(PodIndex):
    """The pod index, counting the jobs whose status it has counted."""

    counted = 0

    async def status_of(self, job: pb.Job, *args: Any) -> JobCounts:
        counts = await super().status_of(job, *args)
        self.counted += 1
        return counts


async def test_a_tick_over_many_jobs_hands_the_loop_over_between_them(
    store: Store, informer: Informer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job status controller's tick counts its jobs with the event loop handed to others
    whenever a slice of time is spent, across jobs, not only within one big job: a restart's
    first tick over 1,000 jobs of 1,000 pods held the loop (health checks included) for 0.8 s.
    With no time to a slice, others run between every two jobs; the statuses are written as
    before."""
    monkeypatch.setattr(podindex, "STATUS_SLICE_SECONDS", 0.0)
    await store.create(f.node("n1"))
    jobs = [f.job(f"gang-{i}", replicas=2, min_member=2) for i in range(12)]
    for job in jobs:
        await store.create_unit(job, f.pods_of(job))
    pods = CountingPodIndex(informer)
    ctl = JobStatusController(store, informer, pods=pods)
    await caught_up(store, informer)
    seen: list[int] = []  # jobs counted whenever another task had a turn during the tick
    ticking = asyncio.create_task(ctl.tick())
    while not ticking.done():
        seen.append(pods.counted)
        await asyncio.sleep(0)
    await ticking
    assert any(0 < counted < len(jobs) for counted in seen), seen
    for job in jobs:
        stored = await store.get(pb.Job, job.metadata.name)
        assert stored.status.phase == pb.JOB_PRESCHEDULING


async def test_a_one_pod_jobs_status_is_not_written_but_read_from_its_pod(
    store: Store, informer: Informer
) -> None:
    """The job status controller writes the status of a job of two pods and leaves a one-pod
    job's as it was created; the PodIndex reads it from the pod."""
    await store.create(f.node("n1"))
    solo, pair = f.job("solo", replicas=1), f.job("pair", replicas=2, min_member=2)
    for job in (solo, pair):
        await store.create_unit(job, f.pods_of(job))
    ctl = JobStatusController(store, informer)
    await caught_up(store, informer)
    stored_solo = await store.get(pb.Job, "solo")
    await bind(store, (await store.list_all(pb.Pod))[0], "n1", await binder_fence(store))
    await caught_up(store, informer)
    await ctl.tick()
    assert (await store.get(pb.Job, "pair")).status.phase == pb.JOB_SCHEDULED
    now_solo = await store.get(pb.Job, "solo")
    assert now_solo.metadata.resource_version == stored_solo.metadata.resource_version
    assert now_solo.status == stored_solo.status  # as created: never written
    read = ctl.pods.job_as_read(now_solo)
    assert (read.status.phase, read.status.bound) == (pb.JOB_SCHEDULED, 1)


async def test_job_status_write_coming_back_is_not_another_look(
    store: Store, informer: Informer
) -> None:
    """The controller's own status write, seen back through the watch, does not put the job
    back in its feed; anyone else's update of the job does."""
    pods, ctl = await _job_on_a_node(store, informer, "duo", 2)
    await bind(store, pods, "n1", await binder_fence(store))
    await caught_up(store, informer)
    assert "duo" in ctl.changed_jobs  # its pods changed
    await ctl.tick()
    assert (await store.get(pb.Job, "duo")).status.phase == pb.JOB_SCHEDULED
    await caught_up(store, informer)
    assert "duo" not in ctl.changed_jobs  # our own write came back: nothing to look at

    other = await store.get(pb.Job, "duo")
    other.metadata.annotations["touched"] = "yes"
    await store.update(other)
    await caught_up(store, informer)
    assert "duo" in ctl.changed_jobs  # someone else's write: looked at again


async def test_a_one_pod_jobs_pod_changes_do_not_bring_it_to_the_job_status_controller(
    store: Store, informer: Informer
) -> None:
    """The job status controller takes only jobs whose status is stored: a one-pod job's pod
    binding (its status derived when read) leaves its feed empty, a two-pod job's brings it,
    and a subscriber of every job (the budget status controller's kind) still hears of both."""
    await store.create(f.node("n1"))
    solo, pair = f.job("solo", replicas=1), f.job("pair", replicas=2, min_member=2)
    for job in (solo, pair):
        await store.create_unit(job, f.pods_of(job))
    ctl = JobStatusController(store, informer)
    every_job = ctl.pods.subscribe()
    await caught_up(store, informer)
    ctl.changed_jobs.clear()
    every_job.clear()
    await bind(store, (await store.list_all(pb.Pod))[0], "n1", await binder_fence(store))
    await caught_up(store, informer)
    assert ctl.changed_jobs == {"pair"}
    assert every_job == {"solo", "pair"}


async def test_a_pod_seen_before_its_job_still_brings_the_job_to_its_status(
    store: Store,
) -> None:
    """A pod whose job the index has not seen yet is no loss to a subscriber of stored
    statuses: the job's own arrival brings it. Here an informer of Pods before Jobs lists the
    pods first, as a relist may deliver them."""
    pair = f.job("pair", replicas=2, min_member=2)
    await store.create_unit(pair, f.pods_of(pair))
    pods_first = Informer(store, ["Pod", "Job"], block_ms=100)
    pods = PodIndex(pods_first)
    feed = pods.subscribe(stored_status_only=True)
    order: list[str] = []
    pods_first.add_handlers(Handlers(on_add=lambda kind, _obj: order.append(kind)))
    pods_first.start()
    try:
        await pods_first.wait_synced(10)
        assert order == ["Pod", "Pod", "Job"]
        assert feed == {"pair"}
        assert len(pods.outlines_of("pair")) == 2
    finally:
        await pods_first.stop()


def _budget(
    name: str,
    *,
    job: str = "",
    app: str = "",
    min_available: int | None = None,
    max_unavailable: int | None = None,
) -> pb.DisruptionBudget:
    b = pb.DisruptionBudget(metadata=pb.ObjectMeta(name=name))
    b.spec.job = job
    if app:
        b.spec.selector.add(key="app", operator=pb.LabelSelectorRequirement.IN, values=[app])
    if min_available is not None:
        b.spec.min_available = min_available
    if max_unavailable is not None:
        b.spec.max_unavailable = max_unavailable
    return b


async def _budget_counts(store: Store, name: str) -> tuple[int, int, int, int]:
    s = (await store.get(pb.DisruptionBudget, name)).status
    return s.current_healthy, s.desired_healthy, s.disruptions_allowed, s.expected_pods


async def test_budget_status_controller(store: Store, informer: Informer) -> None:
    await store.create(f.node("n1"))
    web = f.job("web", replicas=3)
    web.spec.template.labels["app"] = "web"
    web_pods = f.pods_of(web)
    await store.create_unit(web, web_pods)
    other = f.job("other", replicas=2)
    await store.create_unit(other, f.pods_of(other))
    await store.create(_budget("web-min2", job="web", min_available=2))
    await store.create(_budget("web-never", app="web", max_unavailable=0))
    await store.create(_budget("other-any", job="other", min_available=0))
    ctl = BudgetStatusController(store, informer)
    await caught_up(store, informer)
    await ctl.tick()
    # Nothing placed yet: nothing healthy, nothing to disrupt.
    assert await _budget_counts(store, "web-min2") == (0, 2, 0, 3)
    assert await _budget_counts(store, "web-never") == (0, 3, 0, 3)

    # The web pods bind: min 2 of 3 allows one disruption; max-unavailable 0 allows none.
    await bind(store, web_pods, "n1", await binder_fence(store))
    await caught_up(store, informer)
    writes = ctl.writes
    await ctl.tick()
    assert ctl.writes == writes + 1  # both changed budgets in one update_many
    assert await _budget_counts(store, "web-min2") == (3, 2, 1, 3)
    assert await _budget_counts(store, "web-never") == (3, 3, 0, 3)

    # One web pod fails: no disruption left under either budget.
    web_pods[0].status.phase = pb.POD_FAILED
    await store.update(web_pods[0])
    await caught_up(store, informer)
    await ctl.tick()
    assert await _budget_counts(store, "web-min2") == (2, 2, 0, 3)
    assert await _budget_counts(store, "web-never") == (2, 3, 0, 3)

    # A new spec is applied (the status is kept until the next tick recomputes it).
    relaxed = await store.get(pb.DisruptionBudget, "web-min2")
    relaxed.spec.min_available = 0
    await store.update(relaxed)
    await caught_up(store, informer)
    await ctl.tick()
    assert await _budget_counts(store, "web-min2") == (2, 0, 2, 3)

    # A spec written after this view was taken: the status write conflicts and is dropped (the
    # user's spec survives), and the next tick computes from the new spec.
    web_pods[1].status.phase = pb.POD_FAILED
    await store.update(web_pods[1])
    await caught_up(store, informer)
    tightened = await store.get(pb.DisruptionBudget, "web-min2")
    tightened.spec.min_available = 1
    await store.update(tightened)  # not yet in the informer when the tick computes
    await ctl.tick()
    assert (await store.get(pb.DisruptionBudget, "web-min2")).spec.min_available == 1
    await caught_up(store, informer)
    await ctl.tick()
    assert await _budget_counts(store, "web-min2") == (1, 1, 0, 3)

    # Quiet: the ticks after the last write recompute nothing and write nothing.
    await caught_up(store, informer)
    await ctl.tick()
    writes = ctl.writes
    await ctl.tick()
    assert ctl.writes == writes
    assert (await store.get(pb.DisruptionBudget, "other-any")).status == pb.DisruptionBudgetStatus(
        expected_pods=2
    )


# --------------------------------------------------------------------------------------------
# Finished jobs: deleted with their pods once their TTL passed
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "finished_ms", "ttl", "default", "expected"),
    [
        (pb.JOB_SUCCEEDED, 1000, 60, None, 61_000),  # the job's own TTL
        (pb.JOB_FAILED, 1000, None, 10, 11_000),  # the cluster default
        (pb.JOB_SUCCEEDED, 1000, 0, 10, 1000),  # 0: at once, over the default
        (pb.JOB_SUCCEEDED, 1000, None, None, None),  # no TTL anywhere: kept
        (pb.JOB_RUNNING, 1000, 60, 10, None),  # not finished
        (pb.JOB_SUCCEEDED, 0, 60, 10, None),  # finished time not stamped yet
    ],
)
def test_finished_job_expiry(
    phase: int, finished_ms: int, ttl: int | None, default: int | None, expected: int | None
) -> None:
    job = f.job("j")
    job.status.phase = phase  # type: ignore[assignment]
    job.status.finished_ms = finished_ms
    if ttl is not None:
        job.spec.ttl_seconds_after_finished = ttl
    collector = FinishedJobCollector.__new__(FinishedJobCollector)
    collector.default_ttl_seconds = default
    assert collector.expiry_ms(job) == expected


async def test_finished_jobs_are_deleted_with_their_pods_after_their_ttl(
    store: Store, informer: Informer
) -> None:
    await store.create(f.node("n1"))
    status = JobStatusController(store, informer)
    collector = FinishedJobCollector(store, informer, status.pods, default_ttl_seconds=60)
    jobs = {"quick": 0, "default": None, "kept": -1, "running": 0}
    for name, ttl in jobs.items():
        job = f.job(name, replicas=2)
        if ttl is not None:
            job.spec.ttl_seconds_after_finished = ttl
        pods = f.pods_of(job)
        await store.create_unit(job, pods)
        await bind(store, pods, "n1", await binder_fence(store))
        for p in pods:
            p.status.phase = pb.POD_RUNNING if name == "running" else pb.POD_SUCCEEDED
        await store.commit_many([[Release(p)] if name != "running" else [Update(p)] for p in pods])
    await caught_up(store, informer)
    await status.tick()  # phases computed; finished jobs stamped with finished_ms
    await caught_up(store, informer)
    finished = {n: (await store.get(pb.Job, n)).status.finished_ms for n in jobs}
    assert finished["quick"] and finished["default"] and finished["kept"]
    assert finished["running"] == 0

    await collector.tick()  # now: only the job with TTL 0 is due
    assert await names(store, pb.Job) == {"default", "kept", "running"}
    assert {p.split("-")[0] for p in await names(store, pb.Pod)} == {"default", "kept", "running"}

    await caught_up(store, informer)
    await collector.tick(now_ms=finished["default"] + 61_000)  # past the default's minute
    assert await names(store, pb.Job) == {"kept", "running"}
    assert (collector.deleted_jobs, collector.deleted_pods) == (2, 4)


async def test_a_one_pod_job_goes_its_ttl_after_its_pod_finished(
    store: Store, informer: Informer
) -> None:
    """A one-pod job's status is never written: the collector learns it finished from its pod,
    and counts the TTL from the pod's finish."""
    await store.create(f.node("n1"))
    collector = FinishedJobCollector(store, informer, PodIndex(informer), default_ttl_seconds=60)
    for name in ("done", "busy"):
        job = f.job(name, replicas=1)
        pods = f.pods_of(job)
        await store.create_unit(job, pods)
        await bind(store, pods, "n1", await binder_fence(store))
        pod = pods[0]
        if name == "done":
            pod.status.phase, pod.status.finished_ms = pb.POD_SUCCEEDED, 10_000
            await store.commit([Release(pod)])
        else:
            pod.status.phase = pb.POD_RUNNING
            await store.update(pod)
    await caught_up(store, informer)
    await collector.tick(now_ms=69_000)  # 59 s after the pod finished: not yet
    assert await names(store, pb.Job) == {"done", "busy"}
    await collector.tick(now_ms=70_000)
    assert await names(store, pb.Job) == {"busy"}
    assert await names(store, pb.Pod) == {"busy-0"}


@pytest.mark.parametrize(
    "kinds", [["Job", "Pod"], ["Pod", "Job"]], ids=["jobs first", "pods first"]
)
async def test_a_one_pod_job_finished_before_a_restart_still_goes(
    store: Store, kinds: list[str]
) -> None:
    """A dispatcher started after a one-pod job finished learns it from its listing, whichever
    kind the listing hands over first."""
    await store.create(f.node("n1"))
    job = f.job("done", replicas=1)
    pods = f.pods_of(job)
    await store.create_unit(job, pods)
    await bind(store, pods, "n1", await binder_fence(store))
    pods[0].status.phase, pods[0].status.finished_ms = pb.POD_SUCCEEDED, 10_000
    await store.commit([Release(pods[0])])
    fresh = Informer(store, kinds, block_ms=100)
    collector = FinishedJobCollector(store, fresh, PodIndex(fresh), default_ttl_seconds=60)
    fresh.start()
    try:
        await fresh.wait_synced(10)
        await collector.tick(now_ms=70_000)
    finally:
        await fresh.stop()
    assert await names(store, pb.Job) == set()


async def names(store: Store, kind: type[pb.Job] | type[pb.Pod]) -> set[str]:
    return {o.metadata.name for o in (await store.list_all(kind))[0]}


async def test_a_finished_job_too_big_for_one_script_is_deleted_in_chunks(
    store: Store, informer: Informer
) -> None:
    """The finished-job collector hands a job whose deletion would not fit one store script to
    the Delete RPC's JobDeleter: marked first, then its pods chunk by chunk, the job last; small
    jobs still go in the one pipelined commit."""
    await store.create(f.node("n1"))
    status = JobStatusController(store, informer)
    deleter = JobDeleter(store, status.pods.by_job.get, chunk_ops=4)
    collector = FinishedJobCollector(
        store, informer, status.pods, deleter=deleter, default_ttl_seconds=0
    )
    for name, replicas in (("big", 10), ("small", 2)):
        job = f.job(name, replicas=replicas)
        pods = f.pods_of(job)
        await store.create_unit(job, pods)
        await bind(store, pods, "n1", await binder_fence(store))
        for p in pods:
            p.status.phase = pb.POD_SUCCEEDED
        await store.commit_many([[Release(p)] for p in pods])
    await caught_up(store, informer)
    await status.tick()
    await caught_up(store, informer)
    start = await store.revision()
    await collector.tick()
    assert await names(store, pb.Job) == set()
    assert await names(store, pb.Pod) == set()
    assert (collector.deleted_jobs, collector.deleted_pods) == (2, 12)
    # The big job's history: marked, its pods in chunks, then itself; never all at once.
    history: list[tuple[str, str, bool]] = []
    async for batch in store.watch(start, ["Job", "Pod"]):
        for e in batch.events:
            if isinstance(e.obj, pb.Job) and e.name == "big":
                history.append((e.kind, e.type, bool(e.obj.metadata.deletion_timestamp_ms)))
            elif isinstance(e.obj, pb.Pod) and e.obj.spec.job == "big":
                history.append((e.kind, e.type, False))
        if batch.caught_up:
            break
    assert history[0] == ("Job", "MODIFIED", True), history[:3]
    assert history[-1][0:2] == ("Job", "DELETED")
    assert sum(1 for k, t, _ in history if k == "Pod" and t == "DELETED") == 10


async def test_a_big_job_changed_since_it_was_read_is_still_deleted(store: Store) -> None:
    """The job status controller may write a job between Delete's read and the deletion mark:
    the mark's compare-and-set fails, the job is read again and marked, and all of it goes.
    With the version the caller insists on, the change is a conflict instead."""
    deleter = JobDeleter(store, lambda _job: (), chunk_ops=4)
    job = f.job("busy", replicas=10)
    await store.create_unit(job, f.pods_of(job))
    read = await store.get(pb.Job, "busy")
    changed = await store.get(pb.Job, "busy")
    changed.status.phase = pb.JOB_RUNNING
    await store.update(changed)
    with pytest.raises(CommitError):  # the Delete RPC answers ABORTED
        await deleter.delete(read, expected=read.metadata.resource_version)
    assert await deleter.delete(read) == 11
    assert await names(store, pb.Job) == set()
    assert await names(store, pb.Pod) == set()


def _moved(pod: pb.Pod, node: str, phase: int, *, deleting: bool = False) -> pb.Pod:
    new = pb.Pod()
    new.CopyFrom(pod)
    new.spec.node_name = node
    new.status.phase = phase  # type: ignore[assignment]
    if phase == pb.POD_RUNNING:
        new.status.started_ms = 1_000
    if deleting:
        new.metadata.deletion_timestamp_ms = 2_000
    return new


# (case, the pod's states after pending: (node, phase, deletion mark))
POD_RECORD_CASES: list[tuple[str, list[tuple[str, int, bool]]]] = [
    ("bound, running, succeeded", [("n1", pb.POD_BOUND, False), ("n1", pb.POD_RUNNING, False),
                                   ("n1", pb.POD_SUCCEEDED, False)]),
    ("bound, then failed", [("n1", pb.POD_BOUND, False), ("n1", pb.POD_FAILED, False)]),
    ("running, marked for deletion", [("n1", pb.POD_BOUND, False), ("n1", pb.POD_RUNNING, False),
                                      ("n1", pb.POD_RUNNING, True)]),
    ("bound, running on another node", [("n1", pb.POD_BOUND, False),
                                        ("n2", pb.POD_RUNNING, False)]),
    ("succeeded, then running again", [("n1", pb.POD_BOUND, False),
                                       ("n1", pb.POD_SUCCEEDED, False),
                                       ("n1", pb.POD_RUNNING, False)]),
]  # fmt: skip


@pytest.mark.parametrize("states", [c[1] for c in POD_RECORD_CASES])
async def test_the_pod_index_with_the_ledgers_claims_reads_as_one_keeping_every_record(
    store: Store, states: list[tuple[str, int, bool]]
) -> None:
    """The pod index over the quota ledger's claims (the dispatcher's: a pod holding a claim
    has no record of its own, and an update that leaves it holding one on the same node
    touches no record) answers as an index keeping a record of every pod on a node, after
    every update, handed to both as the informer hands it (the feed's handler first)."""
    informer = Informer(store, UnitDispatcher.KINDS)
    core = UnitDispatcher(store, informer, DispatchSettings(), dial=None)  # type: ignore[arg-type]
    with_claims = PodIndex(informer, claims=core.queue)
    alone = PodIndex(Informer(store, ["Pod", "Job"]))
    job = f.job("a", replicas=2, cpu=100)
    informer.cache["Job"]["a"] = job
    pods = f.pods_of(job)
    for pod in pods:
        core.feed.on_add("Pod", pod)
        with_claims._on_add("Pod", pod)
        alone._on_add("Pod", pod)
    old = pods[0]
    for node, phase, deleting in states:
        new = _moved(old, node, phase, deleting=deleting)
        core.feed.on_update("Pod", old, new)
        with_claims._on_update("Pod", old, new)
        alone._on_update("Pod", old, new)
        old = new
        informer.cache["Pod"].pop(new.metadata.name, None)  # held as a record, not bytes
        for index in (with_claims, alone):
            assert sorted(index.by_job.get("a")) == sorted(p.metadata.name for p in pods)
        assert sorted(with_claims.names_on({"n1", "n2"})) == sorted(alone.names_on({"n1", "n2"}))
        assert set(with_claims.nodes_with_claims()) == set(alone.nodes_with_claims())
        assert with_claims.live_on_nodes_by_owner() == alone.live_on_nodes_by_owner()
        assert with_claims.jobs_failed_on_nodes() == alone.jobs_failed_on_nodes()
        assert name_of(with_claims.recall("Pod", new.metadata.name)) == new.metadata.name
        assert (new.metadata.name in with_claims.placed_names("Pod")) == bool(node)
        placed = with_claims.recall("Pod", new.metadata.name)
        assert isinstance(placed, pb.Pod)
        assert (placed.spec.node_name, placed.status.phase) == (node, phase)


def name_of(pod: Any) -> str:
    return str(pod.metadata.name)
