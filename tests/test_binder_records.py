"""The Binder keeps no bytes of a pod that holds a claim (issue 34: its memory per bound pod),
leader and standby alike, only its records — its node, its request on the node, its job's
queue and template labels — yet judges as before: a preemption's victim is read whole and its
eviction written whole, an Evict target likewise, a selector budget counts its members from
the records (a budget that appears after its pods were bound too), job-level affinity finds
the job's domain from the bound pods' nodes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.binder.config import BinderConfig
from services.binder.service import BinderService
from services.runtime.service import ServiceHost
from store import Store
from store.client import Bind
from tests import factories as f
from tests.test_binder import (
    HIGH,
    LOW,
    Shard,
    audit,
    config,
    eventually,
    evict,
    leading,
    numa_node,
    preempting,
    prio,
    submit_prio,
    unit,
)

V = ipb.VerdictCode
__all__ = ["audit"]  # the store audit after every test, as tests/test_binder.py runs it


async def _bound_before(store: Store, job: pb.Job, nodes: list[str]) -> list[str]:
    """The job stored and its pods bound as a Binder's commit writes them, one per node of
    ``nodes``, before any Binder of this test runs: they reach it by its listing."""
    pods = await submit_prio(store, job)
    for name, node in zip(pods, nodes, strict=True):
        pod = await store.get(pb.Pod, name)
        pod.spec.node_name, pod.status.phase = node, pb.POD_BOUND
        await store.commit([Bind(pod)])
    return list(pods)


def _service(host: ServiceHost[BinderConfig]) -> BinderService:
    service = host.service
    assert isinstance(service, BinderService)
    return service


def _keeps_no_bytes_of(service: BinderService, bound: list[str], pending: list[str]) -> None:
    informer = service.informer
    for name in bound:
        assert informer.get("Pod", name) is None, f"{name}: the informer keeps its bytes"
        assert informer.knows("Pod", name) and name in service.state.pod_node
    for name in pending:
        assert informer.get("Pod", name) is not None  # what it binds next: kept
    assert informer.count("Pod") == len(pending)


@pytest.fixture
async def binders(
    store: Store, store_url: str, cluster_name: str
) -> AsyncIterator[tuple[ServiceHost[BinderConfig], ServiceHost[BinderConfig]]]:
    """Nodes in two racks, pods bound before the Binders start, then a leader and a standby."""
    for name, rack in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        await store.create(numa_node(name, rack=rack))  # 8 cpu each
    web = prio(f.job("web", replicas=2, cpu=3000), LOW, replace=True)
    web.spec.template.labels["app"] = "web"
    await _bound_before(store, web, ["a1", "a2"])
    low = prio(f.job("low", replicas=1, cpu=3000), LOW, replace=True)
    low.spec.template.labels["app"] = "low"
    low.spec.template.tolerations.add(key="kept-whole", operator=pb.Toleration.EXISTS)
    await _bound_before(store, low, ["b1"])
    racked = f.job_affinity(prio(f.job("racked", replicas=3, cpu=1000), LOW), ["rack"])
    pods = await submit_prio(store, racked)
    racked_0 = await store.get(pb.Pod, "racked-0")
    racked_0.spec.node_name, racked_0.status.phase = "a1", pb.POD_BOUND
    await store.commit([Bind(racked_0)])
    assert len(pods) == 3
    leader = ServiceHost(BinderService, config(store_url, cluster_name, "b1"))
    standby = ServiceHost(BinderService, config(store_url, cluster_name, "b2"))
    async with leader:
        await eventually(lambda: leading(leader), what="leadership")
        async with standby:  # started once b1 leads: b2 stands by
            yield leader, standby


async def test_the_binder_keeps_no_bytes_of_bound_pods_yet_judges_as_before(
    store: Store, binders: tuple[ServiceHost[BinderConfig], ServiceHost[BinderConfig]]
) -> None:
    leader, _ = binders
    bound = ["web-0", "web-1", "low-0", "racked-0"]
    pending = ["racked-1", "racked-2"]
    for host in binders:  # listed at their start: records only, the standby's too
        _keeps_no_bytes_of(_service(host), bound, pending)

    shard = Shard(leader.address)
    try:
        # Job-level affinity: the job's bound pod (listed) fixes its rack from its record.
        racked = f.job_affinity(prio(f.job("racked", replicas=3, cpu=1000), LOW), ["rack"])
        pods = {p: await store.get(pb.Pod, p) for p in pending}
        verdicts = await shard.decide(unit(racked, pods, [("racked-1", "b1"), ("racked-2", "a2")]))
        assert verdicts["racked-1"].code == V.CONFLICT and "rack=b" in verdicts["racked-1"].reason
        assert verdicts["racked-2"].code == V.BOUND
        bound.append("racked-2")
        pending.remove("racked-2")
        for host in binders:  # bound through the leader: its bytes are dropped at once
            await eventually(
                lambda h=host: _no_bytes(_service(h), "racked-2"), what="the bind delivered"
            )

        # A selector budget that appears after its pods were bound: its members from the
        # records' template labels. It allows no disruption of app=web.
        web_budget = pb.DisruptionBudget(metadata=pb.ObjectMeta(name="web-pdb"))
        web_budget.spec.selector.add(
            key="app", operator=pb.LabelSelectorRequirement.IN, values=["web"]
        )
        web_budget.spec.max_unavailable = 0
        await store.create(web_budget)
        for host in binders:
            members = _service(host).state.budget_members
            await eventually(
                lambda m=members: _async(set(m.members("web-pdb")) == {"web-0", "web-1"}),
                what="the budget's members",
            )
        high = prio(f.job("high", replicas=2, cpu=6000), HIGH)
        high_pods = await submit_prio(store, high)
        verdicts = await shard.decide(
            preempting(high, {"high-0": high_pods["high-0"]}, [("high-0", "a1", ["web-0"])])
        )
        assert verdicts["high-0"].code == V.CONFLICT
        assert "disruption budget web-pdb" in verdicts["high-0"].reason
        assert (await store.get(pb.Pod, "web-0")).status.phase == pb.POD_BOUND

        # A preemption's victim, read whole for the batch: its eviction keeps every field, its
        # job's replacement is named after the job's pods' names.
        verdicts = await shard.decide(
            preempting(high, {"high-1": high_pods["high-1"]}, [("high-1", "b1", ["low-0"])])
        )
        assert verdicts["high-1"].code == V.BOUND, verdicts["high-1"].reason
        victim = await store.get(pb.Pod, "low-0")
        assert (victim.status.phase, victim.status.reason) == (pb.POD_FAILED, "Preempted")
        assert [t.key for t in victim.spec.template.tolerations] == ["kept-whole"]
        assert victim.spec.template.labels["app"] == "low" and victim.spec.node_name == "b1"
        replacement = await store.get(pb.Pod, "low-0-r1")
        assert replacement.status.phase == pb.POD_PENDING
        assert [t.key for t in replacement.spec.template.tolerations] == ["kept-whole"]

        # An Evict target, read whole: refused by the budget, then allowed once it allows one.
        web = [await store.get(pb.Pod, n) for n in ("web-0", "web-1")]
        results = await evict(leader.address, web[:1])
        assert results["web-0"].outcome == ipb.EvictResult.REFUSED
        assert "disruption budget web-pdb" in results["web-0"].reason
        web_budget = await store.get(pb.DisruptionBudget, "web-pdb")
        web_budget.spec.max_unavailable = 1
        await store.update(web_budget)
        await eventually(
            lambda: _async(_service(leader).state.budgets["web-pdb"].spec.max_unavailable == 1),
            what="the budget changed",
        )
        results = await evict(leader.address, web)
        assert {r.outcome for r in results.values()} == {ipb.EvictResult.REFUSED}  # one at most
        results = await evict(leader.address, web[1:])
        assert results["web-1"].outcome == ipb.EvictResult.EVICTED
        evicted = await store.get(pb.Pod, "web-1")
        assert (evicted.status.phase, evicted.status.reason) == (pb.POD_FAILED, "Rescheduled")
        assert evicted.spec.template.labels["app"] == "web"
        assert (await store.get(pb.Pod, results["web-1"].replacement)).metadata.name == "web-1-r1"

        for host in binders:  # still no bytes of a bound pod anywhere
            state = _service(host).state
            await eventually(
                lambda s=state: _async("high-1" in s.pod_node and "low-0" not in s.pod_node),
                what="the preemption delivered",
            )
            placed = list(_service(host).state.pod_node)
            assert all(_service(host).informer.get("Pod", n) is None for n in placed)
    finally:
        await shard.close()


async def _async(value: bool) -> bool:
    return value


async def _no_bytes(service: BinderService, name: str) -> bool:
    return name in service.state.pod_node and service.informer.get("Pod", name) is None
