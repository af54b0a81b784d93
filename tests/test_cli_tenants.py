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
from store import Store
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
