"""Admission limits by caller (issue 33, item 6), through the public API of a real dispatcher
in-process serving mutual TLS on a real store, called with real certificates of the cluster:
a tenant's job past ``max_replicas`` is refused naming the limit, a tenant past
``max_pods_per_tenant`` live pods likewise (its finished pods do not count, other tenants are
not held to its count), the admin may submit jobs larger than a tenant's up to its own
``admin_max_replicas``; nothing of a refused job is stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from foundation import pki, tls
from protos.godel.v1 import api_pb2, api_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.service import DispatcherConfig
from services.runtime.config import load_config
from store import Store
from tests import factories as f
from tests.dispatcher_harness import dispatcher_config, eventually, run_dispatcher

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "dispatcher-config.yaml"
MAX_REPLICAS = 5
ADMIN_MAX_REPLICAS = 30
MAX_PODS_PER_TENANT = 8


@dataclass
class Callers:
    """A stub of the dispatcher's API per identity: the admin and two tenants."""

    admin: api_pb2_grpc.DispatcherAsyncStub
    alice: api_pb2_grpc.DispatcherAsyncStub
    bob: api_pb2_grpc.DispatcherAsyncStub


@pytest.fixture
async def callers(store_url: str, cluster_name: str, tmp_path: Path) -> AsyncIterator[Callers]:
    tls_dir = tmp_path / "tls"
    pki.init_cluster(tls_dir)
    pki.issue(tls_dir, "alice", "tenant", queues=["default"])
    pki.issue(tls_dir, "bob", "tenant", queues=["default"])
    config = dispatcher_config(
        store_url,
        cluster_name,
        tmp_path,
        insecure=False,
        tls_dir=str(tls_dir),
        max_replicas=MAX_REPLICAS,
        admin_max_replicas=ADMIN_MAX_REPLICAS,
        max_pods_per_tenant=MAX_PODS_PER_TENANT,
    )
    async with run_dispatcher(config) as running:
        address = running.host.address
        channels = [
            tls.aio_channel(address, tls.load(tls_dir, who)) for who in ("admin", "alice", "bob")
        ]
        try:
            # An asyncio channel's stub is the async one (grpc types the class for both).
            stubs = [
                cast("api_pb2_grpc.DispatcherAsyncStub", api_pb2_grpc.DispatcherStub(c))
                for c in channels
            ]
            yield Callers(*stubs)
        finally:
            for channel in channels:
                await channel.close()


async def submit(
    api: api_pb2_grpc.DispatcherAsyncStub, *jobs: pb.Job
) -> list[api_pb2.SubmitResult]:
    return list((await api.Submit(api_pb2.SubmitRequest(jobs=jobs))).results)


async def test_a_tenants_job_over_max_replicas_is_refused_naming_the_limit_and_nothing_stored(
    callers: Callers, store: Store
) -> None:
    before = await store.revision()
    [result] = await submit(callers.alice, f.job("wide", replicas=MAX_REPLICAS + 1))
    assert not result.created
    assert [(v.field, v.description) for v in result.violations] == [
        (
            "jobs[0].spec.replicas",
            f"must be at most {MAX_REPLICAS} (got {MAX_REPLICAS + 1}): the dispatcher's "
            "max_replicas",
        )
    ]
    assert await store.revision() == before, "a refused job stores nothing"
    [fits] = await submit(callers.alice, f.job("narrow", replicas=MAX_REPLICAS))
    assert fits.created, fits.violations


async def test_the_admin_may_submit_jobs_larger_than_a_tenants_up_to_its_own_limit(
    callers: Callers, store: Store
) -> None:
    [large] = await submit(callers.admin, f.job("large", replicas=ADMIN_MAX_REPLICAS))
    assert large.created, large.violations
    before = await store.revision()
    [too_large] = await submit(callers.admin, f.job("larger", replicas=ADMIN_MAX_REPLICAS + 1))
    assert [v.description for v in too_large.violations] == [
        f"must be at most {ADMIN_MAX_REPLICAS} (got {ADMIN_MAX_REPLICAS + 1}): the "
        "dispatcher's admin_max_replicas"
    ]
    assert await store.revision() == before
    # The admin holds more live pods than a tenant may, and is not refused for it.
    [more] = await submit(callers.admin, f.job("more", replicas=ADMIN_MAX_REPLICAS))
    assert more.created, more.violations


async def test_a_tenant_past_its_live_pods_is_refused_until_its_pods_finish(
    callers: Callers, store: Store
) -> None:
    # Back to back: each Submit of a tenant is judged on a view that holds its previous one.
    [first] = await submit(callers.alice, f.job("a", replicas=5))
    [second] = await submit(callers.alice, f.job("b", replicas=3))
    assert first.created and second.created
    before = await store.revision()
    [refused] = await submit(callers.alice, f.job("c", replicas=1))
    assert [(v.field, v.description) for v in refused.violations] == [
        (
            "jobs[0].spec.replicas",
            f"tenant 'alice' may hold at most {MAX_PODS_PER_TENANT} live pods "
            "(max_pods_per_tenant): it holds 8 and this job adds 1",
        )
    ]
    assert await store.revision() == before, "a refused job stores nothing"
    # Another tenant is held to its own count, not to alice's.
    [bobs] = await submit(callers.bob, f.job("bobs", replicas=5))
    assert bobs.created, bobs.violations
    # Within one request the earlier jobs count too: the second one does not fit beside them.
    [fits, over] = await submit(callers.bob, f.job("bob-2", replicas=3), f.job("bob-3", replicas=1))
    assert fits.created and not over.created
    assert "it holds 8 and this job adds 1" in over.violations[0].description
    # Finished pods are not live: once job a's pods succeed, alice has room again.
    pods = await store.get_many(pb.Pod, [f"a-{i}" for i in range(5)])
    for pod in pods:
        assert pod is not None
        pod.status.phase = pb.POD_SUCCEEDED
    await store.update_many([p for p in pods if p is not None])

    async def admitted() -> bool:
        [result] = await submit(callers.alice, f.job("c", replicas=1))
        return result.created

    await eventually(admitted, what="alice's job admitted once her pods succeeded")


def test_the_limits_are_on_by_default_and_the_example_config_states_them() -> None:
    """Production defaults without any setting; the example file loads and says the same."""
    limits = ("max_replicas", "admin_max_replicas", "max_pods_per_tenant", "max_pending_pods")
    default = DispatcherConfig()
    assert [getattr(default, n) for n in limits] == [10_000, 100_000, 50_000, 200_000]
    example = load_config(DispatcherConfig, ["--config", str(EXAMPLE)], environ={})
    assert [getattr(example, n) for n in limits] == [getattr(default, n) for n in limits]
