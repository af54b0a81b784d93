"""A restarted dispatcher answers SERVING once what dispatch reads is listed (the quota ledger,
the pending units, the tenants' counts) and counts every job's status after (issue 34 item 2:
the first job status tick, every job at a million pods, out of the restart). A Job read
through its API meanwhile waits for that count, so no reader sees the status the previous
dispatcher left."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from store import Store
from store.client import Bind
from tests import factories as f
from tests.dispatcher_harness import dispatcher_config, run_dispatcher


async def _running(store: Store, job: pb.Job, node: str) -> None:
    """The job stored with its pods bound to ``node`` and running, and no dispatcher to count
    its status: it is stored as created."""
    pods = f.pods_of(job)
    for p in pods:
        p.spec.queue = job.spec.queue
        p.metadata.owner = "alice"
    await store.create_unit(job, pods)
    for p in pods:
        pod = await store.get(pb.Pod, p.metadata.name)
        pod.spec.node_name, pod.status.phase = node, pb.POD_BOUND
        await store.commit([Bind(pod)])
        pod = await store.get(pb.Pod, p.metadata.name)
        pod.status.phase, pod.status.started_ms = pb.POD_RUNNING, int(time.time() * 1000)
        await store.update(pod)


async def test_a_restarted_dispatcher_serves_before_counting_job_statuses_and_reads_them_counted(
    store: Store, store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    await store.create(f.node("n1"))
    team = pb.Queue(metadata=pb.ObjectMeta(name="team"))
    team.spec.quota.milli_cpu = 2000
    await store.create(team)
    web = f.job("web", replicas=2, cpu=400)
    web.spec.queue = "team"
    await _running(store, web, "n1")
    left = (await store.get(pb.Job, "web")).status
    assert (left.phase, left.running) != (pb.JOB_RUNNING, 2)  # what a restart finds

    # A long interval: the first tick comes one interval after SERVING.
    config = dispatcher_config(store_url, cluster_name, tmp_path, controller_interval_seconds=2.0)
    async with run_dispatcher(config) as running:
        service, api = running.service, running.api
        # Serving: what dispatch and admission read is complete (the queue's usage from the
        # ledger's claims, the tenant's live pods), the job statuses not counted yet.
        assert service.core.queue_statuses()["team"].used.milli_cpu == 800
        assert service.api.submitting.tenant_pods.of("alice") == 2
        assert not service.job_statuses_counted.is_set()
        assert service.job_status.writes == 0
        assert (await store.get(pb.Job, "web")).status.running == left.running

        # A Get of the job waits for the count and reads the job's status as its pods say it.
        got = (await api.Get(api_pb2.GetRequest(kind="Job", name="web"))).job.status
        assert (got.phase, got.running) == (pb.JOB_RUNNING, 2)
        assert service.job_statuses_counted.is_set()
        stored = (await store.get(pb.Job, "web")).status
        assert (stored.phase, stored.running) == (pb.JOB_RUNNING, 2)
        listed = await api.List(api_pb2.ListRequest(kind="Job"))
        assert [(o.job.metadata.name, o.job.status.running) for o in listed.items] == [("web", 2)]


async def test_a_list_of_jobs_waits_for_the_first_count_and_other_kinds_do_not(
    store: Store, store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    await store.create(f.node("n1"))
    gang = f.job("gang", replicas=2, cpu=100)
    await _running(store, gang, "n1")
    config = dispatcher_config(store_url, cluster_name, tmp_path, controller_interval_seconds=2.0)
    async with run_dispatcher(config) as running:
        service, api = running.service, running.api
        # Nodes are read at once, before the count.
        nodes = await api.List(api_pb2.ListRequest(kind="Node"))
        assert [o.node.metadata.name for o in nodes.items] == ["n1"]
        assert not service.job_statuses_counted.is_set()
        jobs = await api.List(api_pb2.ListRequest(kind="Job"))
        assert service.job_statuses_counted.is_set()
        assert [(o.job.metadata.name, o.job.status.phase) for o in jobs.items] == [
            ("gang", pb.JOB_RUNNING)
        ]


async def test_a_long_controller_interval_does_not_hold_a_jobs_readers_for_it(
    store: Store, store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    """The first ticks come ``FIRST_TICKS_AFTER_SECONDS`` after SERVING at most: a Get of a Job
    after a restart with a minute's interval answers, counted, well before the minute."""
    await store.create(f.node("n1"))
    gang = f.job("gang", replicas=2, cpu=100)
    await _running(store, gang, "n1")
    config = dispatcher_config(store_url, cluster_name, tmp_path, controller_interval_seconds=60.0)
    async with run_dispatcher(config) as running:
        got = await asyncio.wait_for(
            running.api.Get(api_pb2.GetRequest(kind="Job", name="gang")), timeout=30
        )
        assert (got.job.status.phase, got.job.status.running) == (pb.JOB_RUNNING, 2)
