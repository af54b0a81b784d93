"""Big jobs through real processes: a job of more pods than one creation chunk is accepted at
once, its pods created in the background and bound (its unit bigger than a Binder batch: the
shard's decision goes in several), its status counting them throughout; a dispatcher killed
with -9 while creating them loses none. The chunk is made small by config
(``--creation-chunk-pods``), so a job of a few hundred pods is "big" here."""

from __future__ import annotations

from collections.abc import Callable

import psutil
import pytest

from protos.godel.v1 import objects_pb2 as pb
from store import Store
from tests.e2e.conftest import Cluster, wait_until
from tests.e2e.test_pipeline import job_yaml

pytestmark = pytest.mark.e2e

PODS_CREATED_ANNOTATION = "godel.io/pods-created"


def _big_cluster(
    make_cluster: Callable[..., Cluster],
    *dispatcher_args: str,
    shard_args: tuple[str, ...] = (),
    binder_args: tuple[str, ...] = (),
) -> Cluster:
    cluster = make_cluster(
        schedulers=1,
        binders=1,
        hollow_nodes=10,
        service_args=(
            ("dispatcher", dispatcher_args),
            ("scheduler", shard_args),
            ("binder", binder_args),
        ),
    )
    wait_until(lambda: len(cluster.client.list("Node")) == 10, what="10 nodes registered")
    return cluster


def _stored(cluster: Cluster, name: str) -> tuple[pb.Job, list[pb.Pod]]:
    async def read(store: Store) -> tuple[pb.Job, list[pb.Pod]]:
        pods, _ = await store.list_all(pb.Pod)
        return await store.get(pb.Job, name), [p for p in pods if p.spec.job == name]

    job, pods = cluster.run_store(read)
    return job, pods


def test_a_job_bigger_than_a_chunk_is_accepted_at_once_and_counted_as_it_is_created_and_bound(
    make_cluster: Callable[..., Cluster],
) -> None:
    # A unit bigger than the Binder takes in one batch, too: the shard sends its decision in
    # several (a 100,000-pod unit was refused whole, for ever).
    cluster = _big_cluster(
        make_cluster,
        "--creation-chunk-pods",
        "10",
        shard_args=("--max-batch-pods", "50"),
        binder_args=("--max-batch-pods", "100"),
    )
    replicas = 400  # forty commits of pods after the first
    # `godel apply` at the CLI's default deadline: it answers once the first chunk is stored.
    applied = cluster.godel("apply", "-f", "-", stdin=job_yaml("big", replicas, 1, "50m"))
    assert "job/big created" in applied.stdout, applied.stdout

    seen: list[pb.JobStatus] = []

    def all_running() -> bool:
        job = cluster.client.get(pb.Job, "big")
        seen.append(job.status)
        return job.status.running == replicas

    wait_until(all_running, timeout=180, what="every pod of the big job running")
    for status in seen:
        # While its pods are created: how many are stored, and nothing placed yet (its unit
        # goes whole); then the counts, never more than the job has.
        assert 0 <= status.pods_created < replicas
        if status.pods_created:
            assert (status.phase, status.bound, status.running) == (pb.JOB_PENDING, 0, 0)
        assert status.bound + status.running + status.succeeded <= replicas
    job, pods = _stored(cluster, "big")
    assert PODS_CREATED_ANNOTATION not in job.metadata.annotations
    assert sorted(p.spec.index for p in pods) == list(range(replicas))
    assert all(p.spec.node_name for p in pods)
    assert (job.status.phase, job.status.running) == (pb.JOB_RUNNING, replicas)
    table = cluster.godel("get", "jobs").stdout.splitlines()
    header, row = table[0].split(), next(r for r in table if r.startswith("big ")).split()
    assert row[header.index("RUNNING")] == str(replicas)
    assert row[header.index("PHASE")] == "Running"


def test_a_dispatcher_killed_while_creating_a_big_jobs_pods_loses_none(
    make_cluster: Callable[..., Cluster],
) -> None:
    # One pod per commit: the creation takes hundreds of round trips, and the kill lands in it.
    cluster = _big_cluster(
        make_cluster, "--creation-chunk-pods", "1", "--reconcile-interval-seconds", "0.5"
    )
    replicas = 300
    job = pb.Job(metadata=pb.ObjectMeta(name="big"))
    job.spec.replicas = replicas
    job.spec.min_member = 1
    job.spec.template.requests.milli_cpu = 50
    job.spec.template.requests.memory_bytes = 64 << 20
    response = cluster.client.submit([job])  # the client's default deadline
    assert response.results[0].created, response.results[0].violations
    dispatcher = psutil.Process(cluster.component("dispatcher").pid)
    dispatcher.kill()  # kill -9
    dispatcher.wait(10)

    stored, pods = _stored(cluster, "big")
    assert PODS_CREATED_ANNOTATION in stored.metadata.annotations, "killed after creation ended"
    assert 0 < len(pods) < replicas

    cluster.start_again("dispatcher")

    def complete() -> bool:
        stored, pods = _stored(cluster, "big")
        return PODS_CREATED_ANNOTATION not in stored.metadata.annotations and len(pods) == replicas

    wait_until(complete, timeout=120, what="the next dispatcher created the rest")
    _, pods = _stored(cluster, "big")
    # Every replica once: each index one pod, each pod its own uid.
    assert sorted(p.spec.index for p in pods) == list(range(replicas))
    assert len({p.metadata.uid for p in pods}) == replicas
    wait_until(
        lambda: cluster.client.get(pb.Job, "big").status.running == replicas,
        timeout=180,
        what="every pod running",
    )
