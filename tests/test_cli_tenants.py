"""`godel apply -f` with a tenant's certificate: jobs into the tenant's own queues are created
(owned by it) and configured; a job into another tenant's queue, over another tenant's job, and
any other kind (a Queue) are refused PERMISSION_DENIED naming the rule, and nothing of the
request is stored. The CLI runs as a real process with the identity in $GODEL_IDENTITY, against
a real dispatcher serving mutual TLS in-process on a real store."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from foundation import pki
from protos.godel.v1 import objects_pb2 as pb
from store import ConflictError, Store
from tests.dispatcher_harness import Running, dispatcher_config, run_dispatcher

ROOT = Path(__file__).resolve().parent.parent


def job_manifest(name: str, queue: str, labels: str = "{}") -> str:
    return (
        f"apiVersion: godel/v1\nkind: Job\nmetadata: {{name: {name}, labels: {labels}}}\n"
        f"spec: {{replicas: 1, queue: {queue}, template: {{requests: {{cpu: 100m, memory: 64Mi}}}}}}\n"
    )


QUEUE = "apiVersion: godel/v1\nkind: Queue\nmetadata: {name: mine}\n"


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "tls"
    pki.init_cluster(directory)
    pki.issue(directory, "alice", "tenant", queues=["research"])
    pki.issue(directory, "bob", "tenant", queues=["batch"])
    return directory


@pytest.fixture
async def dispatcher(
    store_url: str, cluster_name: str, tmp_path: Path, tls_dir: Path, store: Store
) -> AsyncIterator[Running]:
    for queue in ("research", "batch"):
        await store.create(pb.Queue(metadata=pb.ObjectMeta(name=queue)))
    config = dispatcher_config(
        store_url, cluster_name, tmp_path, insecure=False, tls_dir=str(tls_dir)
    )
    async with run_dispatcher(config) as running:
        yield running


async def apply_as(
    identity: str, dispatcher: Running, tls_dir: Path, manifest: str
) -> subprocess.CompletedProcess[str]:
    """`godel apply -f -` in a process of its own, presenting ``identity``'s certificate."""
    env = {k: v for k, v in os.environ.items() if k != "GODEL_INSECURE"}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "godel", "apply", "-f", "-", "--server", dispatcher.host.address],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**env, "GODEL_TLS_DIR": str(tls_dir), "GODEL_IDENTITY": identity},
    )


async def test_a_tenant_applies_jobs_into_its_own_queues_and_nothing_else(
    dispatcher: Running, tls_dir: Path, store: Store
) -> None:
    created = await apply_as("alice", dispatcher, tls_dir, job_manifest("alice-work", "research"))
    assert (created.returncode, created.stdout) == (0, "job/alice-work created\n"), created.stderr
    stored = await store.get(pb.Job, "alice-work")
    assert stored.metadata.owner == "alice"
    relabelled = await apply_as(
        "alice", dispatcher, tls_dir, job_manifest("alice-work", "research", "{team: ml}")
    )
    assert relabelled.stdout == "job/alice-work configured\n", relabelled.stderr
    assert (await store.get(pb.Job, "alice-work")).metadata.labels["team"] == "ml"

    refusals = [
        ("bob", job_manifest("bob-sneaks", "research"),
         "rule tenant-queues: tenant 'bob' may submit only to its queues (batch); "
         "job 'bob-sneaks' names queue 'research'"),
        ("bob", job_manifest("alice-work", "batch", "{team: bob}"),
         "rule own-jobs-only: tenant 'bob' may apply only its own jobs and their pods; "
         "Job 'alice-work' is not its own"),
        ("alice", QUEUE,
         "rule admin-only: only the admin identity may apply Queue objects (a tenant applies "
         "only Jobs and Reservations); 'alice' is a tenant"),
        # One object it may not apply refuses the request: its own job is not stored either.
        ("alice", job_manifest("alice-more", "research") + "---\n" + QUEUE, "rule admin-only"),
    ]  # fmt: skip
    for identity, manifest, rule in refusals:
        refused = await apply_as(identity, dispatcher, tls_dir, manifest)
        assert refused.returncode != 0 and refused.stdout == "", refused.stdout
        assert rule in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    # Nothing of any refused request is stored (the revision is no witness: the job status
    # controller writes alice-work's status meanwhile).
    assert await store.get_many(pb.Job, ["bob-sneaks", "alice-more"]) == [None, None]
    assert await store.get_many(pb.Queue, ["mine"]) == [None]
    kept = await store.get(pb.Job, "alice-work")
    assert (kept.metadata.owner, dict(kept.metadata.labels)) == ("alice", {"team": "ml"})

    admin = await apply_as("admin", dispatcher, tls_dir, QUEUE)  # the admin applies any kind
    assert admin.stdout == "queue/mine created\n", admin.stderr


PRIORITY_CLASS = (
    "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: urgent}\n"
    "value: 1000\ndescription: on call\n"
)


async def godel_as(
    identity: str, dispatcher: Running, tls_dir: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """The `godel` CLI in a process of its own, presenting ``identity``'s certificate."""
    env = {k: v for k, v in os.environ.items() if k != "GODEL_INSECURE"}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "godel", *args, "--server", dispatcher.host.address],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**env, "GODEL_TLS_DIR": str(tls_dir), "GODEL_IDENTITY": identity},
    )


async def test_a_tenant_retries_only_its_own_timed_out_job(
    dispatcher: Running, tls_dir: Path, store: Store
) -> None:
    """RetryJob is a write of the job: another tenant's `godel retry` is refused naming the
    rule and changes nothing; the owner's restarts it."""
    gang = job_manifest("alice-gang", "research").replace("replicas: 1,", "replicas: 2,")
    created = await apply_as("alice", dispatcher, tls_dir, gang)
    assert created.returncode == 0, created.stderr
    for _ in range(10):  # its job status controller may write it meanwhile
        stored = await store.get(pb.Job, "alice-gang")
        stored.status.phase = pb.JOB_TIMEOUT  # as that controller writes it once due
        try:
            stored = await store.update(stored)
            break
        except ConflictError:
            continue
    refused = await godel_as("bob", dispatcher, tls_dir, "retry", "job/alice-gang")
    assert refused.returncode != 0
    assert "rule own-jobs-only" in refused.stderr and "'bob'" in refused.stderr
    unchanged = await store.get(pb.Job, "alice-gang")
    assert unchanged.metadata.resource_version == stored.metadata.resource_version
    retried = await godel_as("alice", dispatcher, tls_dir, "retry", "job/alice-gang")
    assert (retried.returncode, retried.stdout) == (0, "job/alice-gang retried (Pending)\n")
    assert (await store.get(pb.Job, "alice-gang")).status.schedule_started_ms > 0


async def test_priority_classes_are_the_admins_to_write_and_every_tenants_to_read(
    dispatcher: Running, tls_dir: Path, store: Store
) -> None:
    refused = await apply_as("alice", dispatcher, tls_dir, PRIORITY_CLASS)
    assert refused.returncode != 0 and refused.stdout == ""
    assert refused.stderr.strip() == (
        "error: rule admin-only: only the admin identity may apply PriorityClass objects "
        "(a tenant applies only Jobs and Reservations); 'alice' is a tenant"
    )
    assert await store.get_many(pb.PriorityClass, ["urgent"]) == [None]

    created = await apply_as("admin", dispatcher, tls_dir, PRIORITY_CLASS)
    assert created.stdout == "priorityclass/urgent created\n", created.stderr

    listed = await godel_as("alice", dispatcher, tls_dir, "get", "pc")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:5] == [
        "NAME",
        "VALUE",
        "GLOBAL-DEFAULT",
        "PREEMPTION-POLICY",
        "PREEMPTIBLE",
    ]
    assert row.split()[:5] == ["urgent", "1000", "false", "PreemptLowerPriority", "<queue>"]

    not_hers = await godel_as("alice", dispatcher, tls_dir, "delete", "priorityclass", "urgent")
    assert not_hers.returncode != 0
    assert "rule admin-only: only the admin identity may delete PriorityClasses" in not_hers.stderr
    assert await store.get(pb.PriorityClass, "urgent")

    # A tenant's job names the class and is admitted with its value.
    job = job_manifest("alice-urgent", "research").replace(
        "replicas: 1,", "replicas: 1, priorityClassName: urgent,"
    )
    submitted = await apply_as("alice", dispatcher, tls_dir, job)
    assert submitted.stdout == "job/alice-urgent created\n", submitted.stderr
    stored = await store.get(pb.Job, "alice-urgent")
    assert (stored.spec.priority_class_name, stored.spec.priority) == ("urgent", 1000)
    described = await godel_as("alice", dispatcher, tls_dir, "describe", "pc", "urgent")
    assert (
        "value: 1000" in described.stdout and "alice-urgent" in described.stdout.split("jobs:")[1]
    )
