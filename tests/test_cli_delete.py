"""`godel delete job` of a job too big for one store commit (issue 33, item 6): the dispatcher
answers at once and deletes the pods in the background; the CLI (a real process, against a
real dispatcher in-process on a real store) says the deletion is in progress with the pods
left, follows it until the job is gone and exits 0 — never a deadline error for work that is
going on. `--no-wait` returns once it has begun."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.creation import CHUNK_OPS
from store import Store
from tests import factories as f
from tests.dispatcher_harness import Running, dispatcher_config, eventually, run_dispatcher
from tests.test_cli_roundtrip import godel

REPLICAS = 3 * CHUNK_OPS


@pytest.fixture
async def dispatcher(store_url: str, cluster_name: str, tmp_path: Path) -> AsyncIterator[Running]:
    async with run_dispatcher(dispatcher_config(store_url, cluster_name, tmp_path)) as running:
        yield running


async def big_job(dispatcher: Running, name: str) -> None:
    created = await dispatcher.api.Submit(
        api_pb2.SubmitRequest(jobs=[f.job(name, replicas=REPLICAS)])
    )
    assert created.results[0].created, created.results[0].violations
    pods = dispatcher.service.pods
    await eventually(lambda: pods.by_job.count(name) == REPLICAS, what="the view has its pods")


async def test_delete_of_a_big_job_says_it_is_in_progress_and_follows_it_until_done(
    dispatcher: Running, store: Store
) -> None:
    await big_job(dispatcher, "big")
    result = await godel(dispatcher, "delete", "job", "big")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"job/big deletion in progress: {REPLICAS} pods remaining"
    assert lines[-1] == "job/big deleted"
    assert all(line.startswith("job/big deleting: ") for line in lines[1:-1]), lines
    assert await store.get_many(pb.Job, ["big"]) == [None]
    assert (await store.list_all(pb.Pod))[0] == []


async def test_delete_no_wait_returns_once_the_deletion_has_begun(
    dispatcher: Running, store: Store
) -> None:
    await big_job(dispatcher, "big")
    result = await godel(dispatcher, "delete", "job/big", "--no-wait")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"job/big deletion in progress: {REPLICAS} pods remaining",
        "job/big: the dispatcher goes on; `godel get job big` follows it",
    ]

    async def gone() -> bool:
        return await store.get_many(pb.Job, ["big"]) == [None]

    await eventually(gone, timeout=60, what="the deletion finished in the background")
