"""The invariant audit finds each kind of violation, and passes a consistent state."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from godel.audit import audit
from protos.godel.v1 import objects_pb2 as pb
from services.eviction import evicted
from store import Store
from store.client import Bind, Fence, Release, Update
from tests.factories import gpu_job, gpu_node, job, job_affinity, node, numa_job, pods_of, with_numa


async def _setup(store: Store) -> tuple[Fence, list[pb.Pod]]:
    await store.create(node("n1", cpu=1000, pods=10))
    j = job("g", replicas=3, min_member=3, cpu=300)
    pods = pods_of(j)
    await store.create_unit(j, pods)
    _, lease = await store.acquire_lease("binder", "b", 10_000)
    return Fence("binder", lease.epoch), pods


def _place(pod: pb.Pod, phase: int = pb.POD_BOUND) -> pb.Pod:
    pod.spec.node_name = "n1"
    pod.status.phase = phase  # type: ignore[assignment]
    return pod


async def consistent(store: Store, fence: Fence, pods: list[pb.Pod]) -> None:
    await store.bind([_place(p) for p in pods], fence=fence)


async def bound_without_claim(store: Store, fence: Fence, pods: list[pb.Pod]) -> None:
    await store.bind([_place(p) for p in pods[:2]], fence=fence)
    await store.commit([Update(_place(pods[2], pb.POD_RUNNING))])  # bypasses Bind


async def gang_broken(store: Store, fence: Fence, pods: list[pb.Pod]) -> None:
    await store.bind([_place(pods[0])], fence=fence)


async def over_committed(store: Store, fence: Fence, pods: list[pb.Pod]) -> None:
    for p in pods:
        p.spec.template.requests.milli_cpu = 600
        await store.commit([Update(_place(p))])


async def _preempt(
    store: Store,
    fence: Fence,
    pods: list[pb.Pod],
    *,
    victim_priority: int,
    preemptible: bool,
    policy: pb.PreemptionPolicy.ValueType = pb.PREEMPT_LOWER_PRIORITY,
) -> None:
    """g-0 and g-1 bound; g-2 (priority 10) takes g-0's place, which it evicts."""
    for p, prio in zip(pods, (victim_priority, 1, 10), strict=True):
        p.spec.priority, p.spec.preemptible = prio, preemptible
    pods[2].spec.preemption_policy = policy
    await store.bind([_place(p) for p in pods[:2]], fence=fence)
    victim = evicted(
        (await store.get_many(pb.Pod, ["g-0"]))[0] or pods[0], "Preempted", "", 1, "g-2"
    )
    await store.commit([Release(victim), Bind(_place(pods[2]))], fence=fence)


async def preempted_lower_priority(store: Store, fence: Fence, pods: list[pb.Pod]) -> None:
    await _preempt(store, fence, pods, victim_priority=1, preemptible=True)


async def preempted_equal_priority(store: Store, fence: Fence, pods: list[pb.Pod]) -> None:
    await _preempt(store, fence, pods, victim_priority=10, preemptible=True)


async def preempted_not_preemptible(store: Store, fence: Fence, pods: list[pb.Pod]) -> None:
    await _preempt(store, fence, pods, victim_priority=1, preemptible=False)


async def preempted_by_a_never_preemptor(store: Store, fence: Fence, pods: list[pb.Pod]) -> None:
    await _preempt(store, fence, pods, victim_priority=1, preemptible=True, policy=pb.NEVER)


CASES: list[tuple[str, Callable[..., Awaitable[None]], list[str]]] = [
    ("consistent", consistent, []),
    ("bound without claim", bound_without_claim, ["without claim"]),
    ("gang partially placed", gang_broken, ["fewer than min_member"]),
    ("over-committed", over_committed, ["over-committed", "without claim"]),
    ("preempted a lower-priority preemptible pod", preempted_lower_priority, []),
    ("preempted an equal-priority pod", preempted_equal_priority, ["not a higher-priority"]),
    ("preempted a non-preemptible pod", preempted_not_preemptible, ["not preemptible"]),
    ("preempted by a preemptionPolicy Never pod", preempted_by_a_never_preemptor,
     ["preempted by g-2, whose preemptionPolicy is Never"]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "make", "expected"), CASES, ids=[c[0] for c in CASES])
async def test_audit(
    store: Store, name: str, make: Callable[..., Awaitable[None]], expected: list[str]
) -> None:
    fence, pods = await _setup(store)
    await make(store, fence, pods)
    report = await audit(store)
    for needle in expected:
        assert any(needle in v for v in report.violations), report.violations
    assert report.ok == (not expected)


# Topology rules: pods bound directly (as a faulty binder could), then audited.
Req = pb.LabelSelectorRequirement


def _topology_job(kind: str, replicas: int) -> pb.Job:
    j = job(kind, replicas=replicas, cpu=100)
    j.spec.template.labels["app"] = kind
    if kind == "anti":
        term = j.spec.template.affinity.pod_anti_affinity.required.add(topology_key="zone")
        term.label_selector.add(key="app", operator=Req.IN, values=[kind])
    else:
        c = j.spec.template.topology_spread_constraints.add(max_skew=1, topology_key="zone")
        c.label_selector.add(key="app", operator=Req.IN, values=[kind])
    return j


@pytest.mark.parametrize(
    ("kind", "nodes", "expected"),
    [
        ("anti", ["a1", "b1"], ""),
        ("anti", ["a1", "a2"], "required anti-affinity broken, 1 matching pod(s) in zone=a"),
        ("spread", ["a1", "b1", "a2", "c1"], ""),
        ("spread", ["a1", "a2", "b1", "a1"], "skew 3 > maxSkew 1 (zone=a holds 3, the emptiest 0"),
    ],
    ids=["anti-apart", "anti-together", "spread-balanced", "spread-skewed"],
)
async def test_audit_topology_rules(
    store: Store, kind: str, nodes: list[str], expected: str
) -> None:
    for name in ("a1", "a2", "b1", "c1"):
        n = node(name, cpu=4000, pods=10)
        n.metadata.labels.update({"zone": name[0], "hostname": name})
        await store.create(n)
    j = _topology_job(kind, len(nodes))
    pods = pods_of(j)
    await store.create_unit(j, pods)
    _, lease = await store.acquire_lease("binder", "b", 10_000)
    for p, target in zip(pods, nodes, strict=True):
        p.spec.node_name = target
        p.status.phase = pb.POD_BOUND
    await store.bind(pods, fence=Fence("binder", lease.epoch))
    report = await audit(store)
    if expected:
        assert any(expected in v for v in report.violations), report.violations
    else:
        assert report.ok, report.violations


# NUMA and job-level affinity: pods bound directly (as a faulty binder could), then audited.
EXCL, SINGLE = pb.NUMA_POLICY_EXCLUSIVE, pb.NUMA_POLICY_SINGLE


@pytest.mark.parametrize(
    ("policy", "assigned", "expected"),
    [
        (EXCL, [[0], [1]], ""),
        (EXCL, [[0], [0]], "NUMA node 0 is held exclusively by pod"),
        (SINGLE, [[0], [0]], ""),
        (SINGLE, [[0], []], "no NUMA node assigned"),
        (SINGLE, [[0], [3]], "no NUMA node 3"),
        (pb.NUMA_POLICY_NONE, [[], [1]], "has no NUMA policy"),
    ],
    ids=[
        "exclusive-apart",
        "exclusive-shared",
        "single-together",
        "single-unassigned",
        "single-unknown-id",
        "none-assigned",
    ],
)
async def test_audit_numa(
    store: Store, policy: int, assigned: list[list[int]], expected: str
) -> None:
    await store.create(with_numa(node("n1", cpu=8000, pods=10)))
    j = numa_job(job("x", replicas=2, cpu=1000), policy)
    pods = pods_of(j)
    await store.create_unit(j, pods)
    _, lease = await store.acquire_lease("binder", "b", 10_000)
    for p, ids in zip(pods, assigned, strict=True):
        _place(p).spec.numa_nodes.extend(ids)
    await store.bind(pods, fence=Fence("binder", lease.epoch))
    report = await audit(store)
    if expected:
        assert any(expected in v for v in report.violations), report.violations
    else:
        assert report.ok, report.violations


@pytest.mark.parametrize(
    ("targets", "expected"),
    [
        (["a1", "a2"], ""),
        (["a1", "b1"], "breaks job-level affinity: JobLevelAffinity: node is in rack=b"),
    ],
    ids=["one-rack", "two-racks"],
)
async def test_audit_job_level_affinity(store: Store, targets: list[str], expected: str) -> None:
    for name in ("a1", "a2", "b1"):
        n = node(name, cpu=4000, pods=10)
        n.metadata.labels["rack"] = name[0]
        await store.create(n)
    j = job_affinity(job("g", replicas=2, min_member=2), ["rack"])
    pods = pods_of(j)
    await store.create_unit(j, pods)
    _, lease = await store.acquire_lease("binder", "b", 10_000)
    for p, target, at in zip(pods, targets, (1, 2), strict=True):
        p.spec.node_name = target
        p.status.phase = pb.POD_BOUND
        p.status.bound_ms = at
    await store.bind(pods, fence=Fence("binder", lease.epoch))
    report = await audit(store)
    if expected:
        assert any(expected in v for v in report.violations), report.violations
    else:
        assert report.ok, report.violations


def _queue(name: str, cpu: int, parent: str = "") -> pb.Queue:
    q = pb.Queue(metadata=pb.ObjectMeta(name=name))
    q.spec.quota.milli_cpu = cpu
    q.spec.parent = parent
    return q


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        ([_queue("team", 900)], ""),
        ([_queue("team", 800)], "queue team holds 900m of cpu in bound pods, over its max 800m"),
        (
            [_queue("org", 500), _queue("team", 0, parent="org")],
            "queue org holds 900m of cpu in bound pods, over its max 500m",
        ),
    ],
    ids=["within-max", "over-max", "over-a-parent-max"],
)
async def test_audit_queue_quotas(store: Store, queues: list[pb.Queue], expected: str) -> None:
    """Three pods of 300m of queue ``team`` bound directly (as a Binder that ignored the max
    could): 900m against the maxima."""
    for q in queues:
        await store.create(q)
    await store.create(node("n1", cpu=4000, pods=10))
    j = job("g", replicas=3, cpu=300)
    j.spec.queue = "team"
    pods = pods_of(j)
    for p in pods:
        p.spec.queue = "team"
    await store.create_unit(j, pods)
    _, lease = await store.acquire_lease("binder", "b", 10_000)
    await store.bind([_place(p) for p in pods], fence=Fence("binder", lease.epoch))
    report = await audit(store)
    if expected:
        assert [v for v in report.violations if "queue" in v] == [expected]
    else:
        assert report.ok, report.violations


@pytest.mark.parametrize(
    ("milli", "assigned", "expected"),
    [
        (500, [[0], [0]], ""),
        (600, [[0], [0]], "GPU card 0 of node n1 holds 1200 milli-GPU (pods x-0, x-1)"),
        (0, [[1], [1]], "whole GPU card 1 of node n1 held by pod x-0 is shared with x-1"),
        (500, [[0], [2]], "pod x-1 holds GPU card 2, node n1 has cards 0..1"),
        (500, [[0], []], "pod x-1 holds GPU card(s) [], not 1 card(s)"),
    ],
    ids=["shares-within-a-card", "card-over-1000", "whole-card-shared", "card-outside", "no-card"],
)
async def test_audit_gpu_cards(
    store: Store, milli: int, assigned: list[list[int]], expected: str
) -> None:
    """Pods bound directly with the cards a faulty binder could write, then audited."""
    await store.create(gpu_node("n1", 2, cpu=8000))
    j = gpu_job(job("x", replicas=2), milli=milli)
    pods = pods_of(j)
    await store.create_unit(j, pods)
    _, lease = await store.acquire_lease("binder", "b", 10_000)
    for p, cards in zip(pods, assigned, strict=True):
        _place(p).spec.gpu_cards.extend(cards)
    # The store's totals hold (1200 of 2000 milli-GPU): only the cards are wrong.
    await store.bind(pods, fence=Fence("binder", lease.epoch))
    report = await audit(store)
    if expected:
        assert any(expected in v for v in report.violations), report.violations
    else:
        assert report.ok, report.violations
