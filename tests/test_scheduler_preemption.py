"""The PostFilter step of the unit search (placement/postfilter.py) against a snapshot fed by the
shard's cache: who is evicted, on which node, gangs as a unit, budgets, the switches, and the
early stop. Table-driven over both search modes."""

from __future__ import annotations

import time
from collections.abc import Sequence, Set
from dataclasses import dataclass, field

import pytest

from placement.budgets import BudgetTracker
from placement.framework import Framework, PodInfo, Profile, UnitInfo
from placement.nodeinfo import NUMA_EXCLUSIVE, NUMA_SINGLE
from placement.plugins import new_in_tree_registry
from placement.postfilter import Preemption
from placement.preemption import VictimCandidate
from placement.preemption_blockers import explain_preemption
from placement.search import SearchConfig, UnitScheduler
from placement.snapshot import Snapshot
from protos.godel.v1 import objects_pb2 as pb
from services.scheduler.cache import SchedulerCache
from tests.factories import GiB, job, node, numa_job, pods_of, with_numa

REGISTRY = new_in_tree_registry()
LOW, MID, HIGH = 1, 5, 10


def running(
    name: str,
    on: str,
    *,
    cpu: int = 2000,
    priority: int = LOW,
    preemptible: bool = True,
    job_name: str = "low",
    started_ms: int = 1000,
) -> pb.Pod:
    p = pb.Pod(metadata=pb.ObjectMeta(name=name, resource_version=1))
    p.spec.job = job_name
    p.spec.priority = priority
    p.spec.preemptible = preemptible
    p.spec.node_name = on
    p.spec.template.requests.milli_cpu = cpu
    p.spec.template.requests.memory_bytes = GiB
    p.status.phase = pb.POD_RUNNING
    p.status.started_ms = started_ms
    return p


class CacheVictims:
    """The VictimSource the shard builds (services/scheduler/victims.py), over a bare cache and
    budgets given as objects (the shard reads them from its informer)."""

    def __init__(self, cache: SchedulerCache, pods: dict[str, pb.Pod]) -> None:
        self.cache = cache
        self.pods = pods
        self.budgets: list[pb.DisruptionBudget] = []

    def running(self, pod: str) -> VictimCandidate | None:
        return self.cache.running(pod)

    def bound_on(self, node: str) -> int:
        return self.cache.bound_on(node)

    def lowest_bound_priority(self) -> int | None:
        return self.cache.lowest_bound_priority()

    @property
    def claimed(self) -> Set[str]:
        return self.cache.claimed.keys()

    def budget_violations(self, victims: Sequence[str]) -> list[str]:
        return BudgetTracker(self.budgets).broken([self.pods[v] for v in victims])


def preemptor_unit(
    name: str, replicas: int, cpu: int, *, priority: int = HIGH, never: bool = False
) -> UnitInfo:
    j = job(name, replicas=replicas, min_member=replicas, cpu=cpu, mem=GiB)
    pods = pods_of(j)
    for p in pods:
        p.spec.priority = priority
        if never:
            p.spec.preemption_policy = pb.NEVER
    return UnitInfo(name, replicas, 0, priority, [PodInfo.from_pod(p) for p in pods])


@dataclass
class Case:
    id: str
    nodes: list[pb.Node]
    pods: list[pb.Pod]
    unit: UnitInfo
    # pod -> (node, victims); {} = nothing placed
    expect: dict[str, tuple[str, list[str]]]
    reason: str = ""  # substring of the failure reason when nothing is placed
    budgets: list[pb.DisruptionBudget] = field(default_factory=list)
    profile: Profile = field(default_factory=Profile)


def n(name: str, cpu: int = 4000) -> pb.Node:
    return node(name, cpu=cpu, mem=64 * GiB)


def tainted(nd: pb.Node) -> pb.Node:
    nd.spec.taints.add(key="dedicated", effect=pb.NO_SCHEDULE)
    return nd


def never_disrupt(job_name: str) -> pb.DisruptionBudget:
    b = pb.DisruptionBudget(metadata=pb.ObjectMeta(name=f"keep-{job_name}"))
    b.spec.job = job_name
    b.spec.max_unavailable = 0
    b.status.disruptions_allowed = 0
    return b


CASES = [
    Case("fits: no victims",
         [n("a")], [running("l0", "a")], preemptor_unit("p", 1, 2000),
         {"p-0": ("a", [])}),
    Case("one lower-priority pod is enough: exactly it",
         [n("a")], [running("l0", "a", started_ms=1), running("l1", "a", started_ms=2)],
         preemptor_unit("p", 1, 2000),
         {"p-0": ("a", ["l1"])}),  # the later-started pod of equal priority goes
    Case("the lower of two victims' priorities is evicted",
         [n("a")], [running("m0", "a", priority=MID), running("l0", "a")],
         preemptor_unit("p", 1, 2000),
         {"p-0": ("a", ["l0"])}),
    Case("the node with the cheapest victims is chosen",
         [n("a"), n("b")],
         [running("m0", "a", cpu=4000, priority=MID), running("l0", "b", cpu=4000)],
         preemptor_unit("p", 1, 2000),
         {"p-0": ("b", ["l0"])}),
    Case("equal priority is never a victim",
         [n("a")], [running("h0", "a", cpu=4000, priority=HIGH)], preemptor_unit("p", 1, 2000),
         {}, "preemption cannot help: on 1 node they have equal or higher priority (10 or more)"),
    Case("non-preemptible is never a victim",
         [n("a")], [running("l0", "a", cpu=4000, preemptible=False)],
         preemptor_unit("p", 1, 2000), {},
         "on 1 node the pods that would have to go are not preemptible"),
    Case("preemptionPolicy Never waits",
         [n("a")], [running("l0", "a", cpu=4000)], preemptor_unit("p", 1, 2000, never=True),
         {}, "insufficient cpu; preemption cannot help: this pod's `preemptionPolicy` is Never"),
    Case("preemption off in the profile",
         [n("a")], [running("l0", "a", cpu=4000)], preemptor_unit("p", 1, 2000),
         {}, "insufficient cpu", profile=Profile(preemption=False)),
    Case("unresolvable nodes are not preempted on",
         [tainted(n("a"))], [running("l0", "a", cpu=4000)], preemptor_unit("p", 1, 2000),
         {}, "untolerated taint"),
    Case("a budget that forbids every victim blocks",
         [n("a")], [running("l0", "a", cpu=4000)], preemptor_unit("p", 1, 2000),
         {}, "on 1 node budget keep-low allows no more evictions",
         budgets=[never_disrupt("low")]),
    Case("a budget steers to the victims it does not protect",
         [n("a"), n("b")],
         [running("l0", "a", cpu=4000), running("o0", "b", cpu=4000, job_name="other")],
         preemptor_unit("p", 1, 2000),
         {"p-0": ("b", ["o0"])}, budgets=[never_disrupt("low")]),
    Case("a gang preempts as a unit: both members with their victims",
         [n("a"), n("b")], [running("l0", "a", cpu=4000), running("l1", "b", cpu=4000)],
         preemptor_unit("g", 2, 3000),
         {"g-0": ("a", ["l0"]), "g-1": ("b", ["l1"])}),
    Case("a gang whose second member finds no victims places nothing",
         [n("a"), n("b")],
         [running("l0", "a", cpu=4000), running("l1", "b", cpu=4000, preemptible=False)],
         preemptor_unit("g", 2, 3000),
         {}, "min_member needs 2"),
    Case("later pods of the unit see the room a preemption freed",
         [n("a")], [running("l0", "a", cpu=4000)], preemptor_unit("g", 2, 2000),
         {"g-0": ("a", ["l0"]), "g-1": ("a", [])}),
]  # fmt: skip


def build(
    nodes: list[pb.Node], pods: list[pb.Pod], profile: Profile, mode: str, candidates: int = 5
) -> tuple[SchedulerCache, Snapshot, UnitScheduler, CacheVictims]:
    cache = SchedulerCache()
    for nd in nodes:
        cache.set_node(nd)
    for p in pods:
        cache.set_pod(p)
    snap = Snapshot()
    snap.update(cache)
    framework = Framework(profile, REGISTRY)
    source = CacheVictims(cache, {p.metadata.name: p for p in pods})
    sched = UnitScheduler(
        framework,
        SearchConfig(mode=mode),
        Preemption(framework, source, candidates),  # type: ignore[arg-type]
    )
    return cache, snap, sched, source


def held(snap: Snapshot) -> dict[str, set[str]]:
    return {info.name: set(info.pods) for info in snap.nodes}


@pytest.mark.parametrize("mode", ["godel", "kube"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_preemption(case: Case, mode: str) -> None:
    _, snap, sched, source = build(case.nodes, case.pods, case.profile, mode)
    source.budgets = case.budgets
    before = held(snap)
    result = sched.schedule(case.unit, snap)
    got = {p.pod: (p.node, p.victims) for p in result.placements}
    assert got == case.expect
    assert result.success == bool(case.expect)
    if not case.expect:
        assert case.reason in result.reason, result.reason
        assert held(snap) == before  # every assume undone, every victim back
        return
    after = held(snap)
    for pod, (node_name, victims) in case.expect.items():
        assert pod in after[node_name]
        assert not set(victims) & after[node_name]
    for info in snap.nodes:
        assert all(u <= c for u, c in zip(info.requested["g"], info.capacity["g"], strict=True))


def test_a_full_cluster_is_not_scanned_pod_by_pod() -> None:
    """5,000 full nodes of low-priority pods: one preemptor examines a handful of nodes (the
    search stops at ``candidates``), not the cluster."""
    nodes = [n(f"n{i:05d}") for i in range(5000)]
    pods = [running(f"l{i}", nd.metadata.name, cpu=4000) for i, nd in enumerate(nodes)]
    _, snap, sched, _ = build(nodes, pods, Profile(), "godel", candidates=3)
    assert sched.preemption is not None
    result = sched.schedule(preemptor_unit("p", 1, 4000), snap)
    assert result.success and len(result.placements[0].victims) == 1
    assert sched.preemption.examined == 3
    # The next preemptor starts where this one stopped: it does not re-examine the same nodes.
    result = sched.schedule(preemptor_unit("q", 1, 4000), snap)
    assert result.success and sched.preemption.examined == 6
    assert result.placements[0].node != "n00000"


def test_claimed_victims_are_not_taken_twice_and_come_back_on_forget() -> None:
    """The shard's cache takes an assumed preemptor's victims off their node and claims them; a
    Binder rejection (forget) puts them back."""
    cache, snap, sched, _ = build([n("a")], [running("l0", "a", cpu=4000)], Profile(), "godel")
    result = sched.schedule(preemptor_unit("p", 1, 4000), snap)
    [placement] = result.placements
    assert placement.victims == ["l0"]
    req = PodInfo.from_pod(pods_of(job("p", cpu=4000, mem=GiB))[0]).req
    assert cache.assume(req, "a", placement.victims)
    assert set(cache.nodes["a"].pods) == {"p-0"} and dict(cache.claimed) == {"l0": "p-0"}
    snap.update(cache)
    # Another preemptor finds l0 claimed: nothing to take.
    again = sched.schedule(preemptor_unit("q", 1, 4000), snap)
    assert not again.success
    cache.forget("p-0")
    assert set(cache.nodes["a"].pods) == {"l0"} and not cache.claimed


def test_an_exclusive_numa_pod_preempts_the_pod_on_a_numa_node_and_takes_it() -> None:
    """Two NUMA nodes, each held by a low-priority single-NUMA pod: a high-priority exclusive
    pod fits only once one of them goes. The victim search judges it with every filter
    (NumaTopology's failure is resolvable), and the preemptor is assumed holding the NUMA node
    its victim leaves."""
    cache = SchedulerCache()
    cache.set_node(with_numa(node("n1", cpu=8000, mem=32 * GiB)))
    pods = {}
    for i in range(2):
        p = running(f"low-{i}", "n1", cpu=1000)
        p.spec.template.numa_policy = NUMA_SINGLE  # type: ignore[assignment]
        p.spec.numa_nodes.append(i)
        pods[p.metadata.name] = p
        cache.set_pod(p)
    snapshot = Snapshot()
    snapshot.update(cache)
    framework = Framework(Profile(), REGISTRY)
    preemption = Preemption(framework, CacheVictims(cache, pods))
    [pod] = pods_of(numa_job(job("x", cpu=2000, mem=GiB), NUMA_EXCLUSIVE))
    pod.spec.priority = HIGH
    unit = UnitInfo("x", 1, 0, HIGH, [PodInfo.from_pod(pod)])
    result = UnitScheduler(framework, SearchConfig(), preemption).schedule(unit, snapshot)
    assert result.success, result.reason
    [placed] = result.placements
    assert len(placed.victims) == 1
    victim = int(placed.victims[0].split("-")[1])
    assert placed.numa_nodes == (victim,)
    assert snapshot.infos["n1"].numa_owner == {victim: "x-0"}


def test_a_whole_card_preemptor_evicts_the_share_whose_card_comes_free_and_takes_it() -> None:
    """Two cards: card 0 holds low-a (500 milli); card 1 holds low-b (300) beside high-c (300,
    of a priority above the preemptor's). Counting milli alone, the least valuable victim, b,
    would do (1000 free), yet no card comes wholly free: the search frees card 0 by evicting a,
    and the preemptor is assumed and proposed holding card 0."""
    cache = SchedulerCache()
    n1 = node("n1", cpu=8000, mem=32 * GiB, gpus=2)
    n1.status.gpu_model = "V100M32"
    cache.set_node(n1)
    pods = {}
    for name, milli, card, priority, started in (
        ("low-a", 500, 0, LOW, 1000),
        ("low-b", 300, 1, LOW, 2000),
        ("high-c", 300, 1, HIGH + 1, 1000),
    ):
        p = running(name, "n1", cpu=100, priority=priority, started_ms=started)
        p.spec.template.requests.gpus = 1
        p.spec.template.gpu_milli = milli
        p.spec.gpu_cards.append(card)
        pods[name] = p
        cache.set_pod(p)
    snapshot = Snapshot()
    snapshot.update(cache)
    framework = Framework(Profile(), REGISTRY)
    preemption = Preemption(framework, CacheVictims(cache, pods))
    [pod] = pods_of(job("w", cpu=100, mem=GiB))
    pod.spec.template.requests.gpus = 1
    pod.spec.priority = HIGH
    unit = UnitInfo("w", 1, 0, HIGH, [PodInfo.from_pod(pod)])
    result = UnitScheduler(framework, SearchConfig(), preemption).schedule(unit, snapshot)
    assert result.success, result.reason
    [placed] = result.placements
    assert (placed.victims, placed.gpu_cards) == (["low-a"], (0,))
    assert list(snapshot.infos["n1"].card_used) == [1000, 600]


def test_a_pod_that_starts_on_its_node_keeps_the_request_the_node_accounts() -> None:
    """Bound, then running on the same node: the record takes what changed (start, who claims
    it) and shares the request the node holds, instead of a second one per pod."""
    cache = SchedulerCache()
    cache.set_node(n("a"))
    bound = running("p", "a", started_ms=0)
    bound.status.phase = pb.POD_BOUND
    cache.set_pod(bound)
    first = cache.running("p")
    cache.set_pod(running("p", "a", started_ms=5000))
    record = cache.running("p")
    assert first is not None and record is not None
    assert record.started_ms == 5000 and first.started_ms == 0
    assert record.req is first.req is cache.nodes["a"].pods["p"]
    cache.set_pod(running("p", "b", started_ms=5000))  # moved: a request of its own there
    moved = cache.running("p")
    assert moved is not None and moved.req is not first.req and "p" not in cache.nodes["a"].pods


@pytest.mark.parametrize("mode", ["godel", "kube"])
def test_no_node_helps_the_diagnosis_counts_nodes_per_blocking_reason(mode: str) -> None:
    """Six full nodes, each blocked another way: what the pod's stored diagnosis says (nodes
    per reason, the soonest protection end, the pod's priority), and that the shard's own
    message is the same sentence."""
    started = int(time.time() * 1000)
    protected = [running(f"g{i}", f"c{i}", cpu=4000, job_name="guarded") for i in range(2)]
    for i, p in enumerate(protected):
        p.status.started_ms = started + i * 1000
        p.spec.protection_seconds = 3600
    nodes = [n("a"), n("b"), n("c0"), n("c1"), n("d"), n("e")]
    pods = [
        running("f0", "a", cpu=4000, preemptible=False, job_name="fixed"),
        running("f1", "b", cpu=4000, preemptible=False, job_name="fixed"),
        *protected,
        running("h0", "d", cpu=4000, priority=HIGH, job_name="high"),
        running("l0", "e", cpu=4000),
    ]
    _, snap, sched, source = build(nodes, pods, Profile(), mode)
    source.budgets = [never_disrupt("low")]

    result = sched.schedule(preemptor_unit("p", 1, 2000), snap)

    assert not result.success
    diagnosis = result.diagnoses["p-0"].to_proto()
    assert [(r.reason, r.nodes) for r in diagnosis.preemption_reasons] == [
        ("not preemptible", 2),
        ("protected", 2),
        ("budget keep-low", 1),
        ("priority", 1),
    ]
    assert diagnosis.protection_ends_ms == started + 3600 * 1000  # the sooner of the two
    assert diagnosis.priority == HIGH
    assert diagnosis.note == ""  # the data says it; no free text beside it
    sentence = explain_preemption(diagnosis, started)
    assert sentence == (
        "preemption cannot help: on 2 nodes the pods that would have to go are not preemptible "
        "(mark their job `preemptible: true` or set their queue's `preemptibleDefault`); on 2 "
        "nodes they are protected for 3600 more seconds (`protectionSeconds`); on 1 node budget "
        "keep-low allows no more evictions; on 1 node they have equal or higher priority (10 or "
        "more)"
    )
    assert (
        "0/6 nodes fit: 6 insufficient cpu; preemption cannot help: on 2 nodes"
        in (result.unplaced["p-0"])
    )


def test_a_pod_that_never_preempts_says_so_in_its_diagnosis() -> None:
    _, snap, sched, _ = build([n("a")], [running("l0", "a", cpu=4000)], Profile(), "godel")
    result = sched.schedule(preemptor_unit("p", 1, 2000, never=True), snap)
    assert not result.success
    diagnosis = result.diagnoses["p-0"].to_proto()
    assert diagnosis.preemption_never and not diagnosis.preemption_reasons
    assert [(r.reason, r.nodes) for r in diagnosis.reasons] == [("insufficient cpu", 1)]


def test_a_gang_held_up_by_its_own_members_is_not_told_of_priority() -> None:
    """A gang of three on two empty nodes: its own members, assumed and not bound, hold the
    room, so preemption cannot help for want of room, not because of anyone's priority."""
    _, snap, sched, _ = build([n("a"), n("b")], [], Profile(), "godel")
    result = sched.schedule(preemptor_unit("g", 3, 4000, priority=LOW), snap)
    assert not result.success
    diagnosis = result.diagnoses["g-2"].to_proto()
    assert [(r.reason, r.nodes) for r in diagnosis.preemption_reasons] == [("no room", 2)]
    assert diagnosis.gang_needed == 3 and diagnosis.gang_placed == 2


def test_the_cache_counts_bound_pods_per_node_as_they_bind_move_and_go() -> None:
    """``bound_on`` (what the preemption tally judges a node's pods by, instead of walking
    them) and ``lowest_bound_priority`` (whether a victim can exist at all) follow binds, moves
    and deletions; an assumed pod is not bound."""
    cache = SchedulerCache()
    for name in ("a", "b"):
        cache.set_node(n(name))
    assert cache.lowest_bound_priority() is None
    cache.set_pod(running("x", "a", priority=HIGH))
    cache.set_pod(running("y", "a", priority=LOW))
    req = PodInfo.from_pod(pods_of(job("p", cpu=100, mem=GiB))[0]).req
    assert cache.assume(req, "b")
    assert (cache.bound_on("a"), cache.bound_on("b")) == (2, 0)
    assert cache.lowest_bound_priority() == LOW
    cache.set_pod(running("x", "b", priority=HIGH))  # moved
    assert (cache.bound_on("a"), cache.bound_on("b")) == (1, 1)
    cache.set_pod(running("x", "b", priority=HIGH))  # the same binding again
    assert cache.bound_on("b") == 1
    cache.remove_pod("y")
    assert cache.lowest_bound_priority() == HIGH
    cache.remove_pod("x")
    assert (cache.bound_on("a"), cache.bound_on("b")) == (0, 0)
    assert cache.lowest_bound_priority() is None


FAST_PATH = [
    # id, nodes, bound pods, preemptor priority, expected placement (node, victims) or None,
    # expected preemption reasons when none, whether the search read any pod's record
    ("equal priority everywhere: no victim search, priority per node, no room where too small",
     [n("a"), n("b"), n("small", cpu=1000)],
     [running("x", "a", cpu=4000, priority=HIGH), running("y", "b", cpu=4000, priority=HIGH),
      running("z", "small", cpu=1000, priority=HIGH)],
     HIGH, None, (("priority", 2), ("no room", 1)), False),
    ("higher priority everywhere: the same",
     [n("a")], [running("x", "a", cpu=4000, priority=HIGH + 1)], HIGH, None,
     (("priority", 1),), False),
    ("a node with room as it is that a taint turns away is not tallied",
     [n("a"), tainted(n("t"))], [running("x", "a", cpu=4000, priority=HIGH)], HIGH, None,
     (("priority", 1),), False),
    ("one bound pod below the preemptor: the search runs and evicts it",
     [n("a"), n("b")],
     [running("x", "a", cpu=4000, priority=HIGH), running("l", "b", cpu=4000, priority=LOW)],
     HIGH, ("b", ["l"]), (), True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("nodes", "pods", "priority", "placed", "reasons", "reads"),
    [c[1:] for c in FAST_PATH],
    ids=[c[0] for c in FAST_PATH],
)
def test_preemption_skips_the_victim_search_when_no_bound_pod_is_below_the_preemptor(
    nodes: list[pb.Node],
    pods: list[pb.Pod],
    priority: int,
    placed: tuple[str, list[str]] | None,
    reasons: tuple[tuple[str, int], ...],
    reads: bool,
) -> None:
    """No bound pod below the preemptor: no node can hold a victim, so the search is skipped
    and each node tallied from its totals and bound count (a storm of unplaceable pods at equal
    priority no longer walks every node's pods per pod); the tally is the one the search made."""
    cache, snap, sched, _ = build(nodes, pods, Profile(), "godel")
    assert sched.preemption is not None
    source = RecordsRead(cache, {p.metadata.name: p for p in pods})
    sched.preemption.source = source
    result = sched.schedule(preemptor_unit("q", 1, 2000, priority=priority), snap)
    if placed is None:
        assert not result.success
        assert result.diagnoses["q-0"].preemption_reasons == reasons
    else:
        assert [(p.node, p.victims) for p in result.placements] == [placed]
    assert bool(source.read) == reads


class RecordsRead(CacheVictims):
    """CacheVictims noting every pod record it is asked for."""

    def __init__(self, cache: SchedulerCache, pods: dict[str, pb.Pod]) -> None:
        super().__init__(cache, pods)
        self.read: list[str] = []

    def running(self, pod: str) -> VictimCandidate | None:
        self.read.append(pod)
        return super().running(pod)
