"""Unit-level scheduling against a snapshot: min-member decisions, no over-commit within a
cycle, the feasible-node cache and the scan limit (counted in nodes examined), kube mode, and the
cache/snapshot generation bookkeeping."""

from __future__ import annotations

import pytest

from placement.framework import Framework, PodInfo, Profile, UnitInfo, load_profile
from placement.nodeinfo import PodRequest, resource_fit_failures
from placement.plugins import new_in_tree_registry
from placement.search import (
    Diagnosis,
    SearchConfig,
    UnitScheduler,
    num_feasible_nodes_to_find,
)
from placement.snapshot import Snapshot
from protos.godel.v1 import objects_pb2 as pb
from services.scheduler.cache import SchedulerCache
from tests.factories import GiB, job, node, pods_of

REGISTRY = new_in_tree_registry()


def cluster(n: int, *, cpu: int = 4000, taint_every: int = 0) -> tuple[SchedulerCache, Snapshot]:
    cache = SchedulerCache()
    for i in range(n):
        nd = node(f"n{i:05d}", cpu=cpu, mem=64 * GiB)
        nd.metadata.labels["hostname"] = nd.metadata.name
        if taint_every and i % taint_every == 0:
            nd.spec.taints.add(key="dedicated", effect=pb.NO_SCHEDULE)
        cache.set_node(nd)
    snap = Snapshot()
    snap.update(cache)
    return cache, snap


def unit_of(
    name: str, replicas: int, min_member: int, cpu: int, already_bound: int = 0
) -> UnitInfo:
    j = job(name, replicas=replicas, min_member=min_member, cpu=cpu, mem=GiB)
    pods = [PodInfo.from_pod(p) for p in pods_of(j)]
    return UnitInfo(name, min_member, already_bound, 0, pods)


def scheduler(**kw: object) -> UnitScheduler:
    return UnitScheduler(Framework(Profile(), REGISTRY), SearchConfig(**kw))  # type: ignore[arg-type]


def assert_not_overcommitted(snap: Snapshot) -> None:
    for info in snap.nodes:
        for pool in ("g", "be"):
            cap, used = info.capacity[pool], info.requested[pool]
            assert all(u <= c for u, c in zip(used, cap, strict=True)), info.name
        assert len(info.pods) <= info.max_pods


@pytest.mark.parametrize(
    ("case", "replicas", "min_member", "already_bound", "want_placed"),
    [
        ("gang-5-fits-4-nothing", 5, 5, 0, 0),
        ("gang-4-fits-4", 4, 4, 0, 4),
        ("min-3-of-5-places-4", 5, 3, 0, 4),
        ("gang-5-with-1-bound-needs-4", 4, 5, 1, 4),
        ("gang-6-with-1-bound-needs-5-fails", 5, 6, 1, 0),
        ("ever-scheduled-places-what-fits", 6, 2, 2, 4),
    ],
)
def test_min_member_decision_on_nodes_fitting_four(
    case: str, replicas: int, min_member: int, already_bound: int, want_placed: int
) -> None:
    # 2 nodes x 2 pods of 2000m each: room for exactly 4 pods.
    _, snap = cluster(2, cpu=4000)
    sched = scheduler()
    result = sched.schedule(unit_of("g", replicas, min_member, 2000, already_bound), snap)
    assert len(result.placements) == want_placed
    assert result.success == (want_placed > 0)
    assert_not_overcommitted(snap)
    used = sum(info.requested["g"][0] for info in snap.nodes)
    assert used == want_placed * 2000  # a failed unit leaves nothing assumed in the snapshot
    if not result.success:
        assert "insufficient cpu" in result.reason
        assert set(result.unplaced) == {p.name for p in unit_of("g", replicas, 1, 1).pods}


def test_gang_of_five_fits_five_without_overcommit() -> None:
    _, snap = cluster(5, cpu=2500)  # one 2000m pod per node
    result = scheduler().schedule(unit_of("g", 5, 5, 2000), snap)
    assert result.success
    assert sorted(p.node for p in result.placements) == [f"n{i:05d}" for i in range(5)]
    assert_not_overcommitted(snap)
    for info in snap.nodes:
        req = PodRequest("x", "g", 2000, GiB, 0)
        assert resource_fit_failures(info, req) == ["insufficient cpu"]


def test_unschedulable_message_counts_reasons() -> None:
    _, snap = cluster(10, cpu=1000, taint_every=5)
    result = scheduler().schedule(unit_of("big", 1, 1, 2000), snap)
    assert not result.success
    assert result.reason == "0/10 nodes fit: 8 insufficient cpu, 2 untolerated taint"
    assert result.unplaced == {"big-0": result.reason}
    # The same as data, for the pod's status (what `godel explain` renders).
    assert result.diagnoses == {
        "big-0": Diagnosis(10, (("insufficient cpu", 8), ("untolerated taint", 2)))
    }


def test_a_gang_short_of_min_member_is_diagnosed_as_data() -> None:
    # Room for 4 pods of a gang of 5: the placed count is the gang's, never a node reason
    # (the sentence "...; min_member needs 5 pod(s) placed, 4 fit" is not data to parse).
    _, snap = cluster(2, cpu=4000)
    result = scheduler().schedule(unit_of("g", 5, 5, 2000), snap)
    assert not result.success
    expected = Diagnosis(2, (("insufficient cpu", 2),), gang_needed=5, gang_placed=4)
    assert result.diagnoses == {f"g-{i}": expected for i in range(5)}
    proto = expected.to_proto()
    assert [(r.reason, r.nodes) for r in proto.reasons] == [("insufficient cpu", 2)]
    assert (proto.total_nodes, proto.gang_needed, proto.gang_placed) == (2, 5, 4)


def test_infeasible_when_every_node_fails_unresolvably() -> None:
    _, snap = cluster(4, taint_every=1)
    result = scheduler().schedule(unit_of("j", 2, 1, 100), snap)
    assert not result.success and result.infeasible
    assert result.reason == "0/4 nodes fit: 4 untolerated taint"


def test_feasible_node_cache_scans_once_per_template() -> None:
    _, snap = cluster(1000, cpu=64_000)
    unit = unit_of("web", 20, 1, 100)
    result = scheduler().schedule(unit, snap)
    assert result.success and len(result.placements) == 20
    # One scan, stopped at len(unit pods) + 50 feasible nodes; later pods reuse the cache.
    assert result.scans == 1
    assert result.examined == 20 + 50
    # LeastAllocated spreads: each placement re-scored its node lower.
    assert len({p.node for p in result.placements}) == 20


@pytest.mark.parametrize(
    ("min_member", "per_pod"),
    [
        (1, 1 + 50),  # independent pods: each scans for itself + scan_extra (Gödel's AllMember=1)
        (20, 20 + 50),  # a gang: each pod scans for the whole gang + scan_extra
    ],
)
def test_cache_off_scans_per_pod(min_member: int, per_pod: int) -> None:
    _, snap = cluster(1000, cpu=64_000)
    unit = unit_of("web", 20, min_member, 100)
    result = scheduler(feasible_cache=False).schedule(unit, snap)
    assert result.success
    assert result.scans == 20
    assert result.examined == 20 * per_pod


def test_scan_limit_is_configurable_and_capped_by_node_count() -> None:
    _, snap = cluster(1000, cpu=64_000)
    result = scheduler(scan_extra=5).schedule(unit_of("a", 3, 1, 100), snap)
    assert result.examined == 8
    _, small = cluster(30, cpu=64_000)
    result = scheduler().schedule(unit_of("b", 3, 1, 100), small)
    assert result.examined == 30


def test_scan_skips_infeasible_nodes_and_counts_them() -> None:
    _, snap = cluster(200, cpu=4000, taint_every=2)  # every other node tainted
    result = scheduler(scan_extra=10).schedule(unit_of("a", 2, 1, 100), snap)
    assert result.success
    assert result.examined in (23, 24)  # 12 feasible among alternating nodes
    assert all(int(p.node[1:]) % 2 == 1 for p in result.placements)


def test_cache_recheck_drops_a_node_that_filled_up() -> None:
    # Each node fits exactly one pod: the chosen node fails its re-check and leaves the cache.
    _, snap = cluster(100, cpu=2000)
    result = scheduler(scan_extra=0).schedule(unit_of("g", 10, 10, 2000), snap)
    assert result.success
    assert len({p.node for p in result.placements}) == 10
    assert result.scans == 1 and result.examined == 10
    assert_not_overcommitted(snap)


def test_cache_exhausted_rescans_from_where_it_stopped() -> None:
    _, snap = cluster(100, cpu=2000)
    sched = scheduler(scan_extra=0)
    unit = unit_of("g", 10, 10, 2000)
    unit.pods = unit.pods[:5] + unit_of("g", 10, 10, 2000).pods[5:]
    r1 = sched.schedule(unit, snap)
    assert r1.success
    r2 = sched.schedule(unit_of("h", 10, 10, 2000), snap)
    assert r2.success
    assert not {p.node for p in r1.placements} & {p.node for p in r2.placements}
    # The rotating offset moved past the first unit's nodes, so nothing was rescanned.
    assert r2.examined == 10


def test_own_partition_first() -> None:
    _, snap = cluster(100, cpu=64_000)
    sched = scheduler(scan_extra=0)
    sched.partition = frozenset(f"n{i:05d}" for i in range(90, 100))
    result = sched.schedule(unit_of("a", 5, 1, 100), snap)
    assert {int(p.node[1:]) for p in result.placements} <= set(range(90, 100))
    # Partition full (needs more than it holds): spills to the rest.
    result = sched.schedule(unit_of("b", 15, 1, 100), snap)
    assert len(result.placements) == 15


def test_partition_scan_order_follows_the_snapshot_across_units() -> None:
    """The own-partition-first order is kept between units, with only the nodes re-cloned since
    replaced: every unit scans the snapshot's current NodeInfos (what the last cycle assumed is
    seen), and nodes added or removed re-sort it."""
    cache, snap = cluster(10, cpu=2000)
    sched = scheduler(scan_extra=0)
    sched.partition = frozenset(f"n{i:05d}" for i in range(5))

    def current() -> bool:
        segments = sched.segments(snap)
        names = [[n.name for n in seg] for seg in segments]
        fresh = all(n is snap.infos[n.name] for seg in segments for n in seg)
        return fresh and names == [
            sorted(n for n in snap.infos if n in sched.partition),
            sorted(n for n in snap.infos if n not in sched.partition),
        ]

    def place(name: str, pods: int) -> list[str]:
        """One unit of ``pods`` 1000m pods, assumed in the cache as the shard does; the next
        cycle's update re-clones the nodes it took."""
        unit = unit_of(name, pods, pods, 1000)
        result = sched.schedule(unit, snap)
        assert result.success
        reqs = {p.name: p.req for p in unit.pods}
        for p in result.placements:
            cache.assume(reqs[p.pod], p.node)
        snap.update(cache)
        return [p.node for p in result.placements]

    assert current()
    # Five units of two 1000m pods fill the partition's ten rooms, never spilling outside:
    # each unit sees what the earlier ones took.
    for k in range(5):
        assert all(n in sched.partition for n in place(f"u{k}", 2))
        assert current()
    assert_not_overcommitted(snap)
    assert all(snap.infos[f"n{i:05d}"].requested["g"][0] == 2000 for i in range(5))
    assert all(snap.infos[f"n{i:05d}"].requested["g"][0] == 0 for i in range(5, 10))

    # A node joins (the partition's) and another leaves: the order is rebuilt.
    extra = node("n00003a", cpu=2000, mem=64 * GiB)
    cache.set_node(extra)
    cache.on_delete("Node", node("n00007"))
    sched.partition = sched.partition | {"n00003a"}
    snap.update(cache)
    assert current()
    assert place("after", 1) == ["n00003a"]


# (case, partition nodes (of n00000..n00019), of which full (no room), pods of 1000m, expected
#  nodes used: "inside" only, or "both")
PARTITION_SCAN_CASES: list[tuple[str, range, range, int, str]] = [
    ("room inside: the rest is not scanned, though emptier", range(0, 5), range(0, 3), 1, "inside"),
    ("fewer feasible inside than the scan limit: still inside", range(0, 5), range(0, 4), 3,
     "inside"),
    ("inside full: the others' nodes", range(0, 5), range(0, 5), 1, "outside"),
    ("inside runs out mid-unit: the rest goes outside", range(0, 5), range(0, 4), 8, "both"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("partition", "full", "pods", "expected"),
    [c[1:] for c in PARTITION_SCAN_CASES],
    ids=[c[0] for c in PARTITION_SCAN_CASES],
)
def test_partition_scanned_alone_unless_nothing_fits(
    partition: range, full: range, pods: int, expected: str
) -> None:
    _, snap = cluster(20, cpu=4000)
    inside = frozenset(f"n{i:05d}" for i in partition)
    for name in sorted(inside):
        # A full node keeps 500m (no room for 1000m); the others keep room for three pods.
        cpu = 3500 if int(name[1:]) in full else 1000
        snap.assume(PodRequest(f"fill-{name}", "g", cpu, GiB, 0), name)
    sched = scheduler()
    sched.partition = inside
    result = sched.schedule(unit_of("u", pods, 1, 1000), snap)
    assert len(result.placements) == pods
    used = {p.node for p in result.placements}
    where = {"inside" if n in inside else "outside" for n in used}
    assert where == ({"inside", "outside"} if expected == "both" else {expected})
    assert_not_overcommitted(snap)


def pinned_unit(name: str, hostname: str) -> UnitInfo:
    """A DaemonSet-like unit: one pod required on the node labelled ``hostname``."""
    j = job(name, replicas=1, min_member=1, cpu=100, mem=GiB)
    term = j.spec.template.affinity.node_affinity.required.add()
    term.match_expressions.add(
        key="hostname", operator=pb.LabelSelectorRequirement.IN
    ).values.append(hostname)
    return UnitInfo(name, 1, 0, 0, [PodInfo.from_pod(p) for p in pods_of(j)])


@pytest.mark.parametrize("mode", ["godel", "kube"])
def test_pre_filter_narrows_a_pinned_pod_to_its_node(mode: str) -> None:
    cache, snap = cluster(2000)
    sched = scheduler(mode=mode)
    result = sched.schedule(pinned_unit("ds-1", "n01234"), snap)
    assert result.success and [p.node for p in result.placements] == ["n01234"]
    assert result.examined == 1
    # A node that does not exist: explained for every node, infeasible, nothing examined.
    result = sched.schedule(pinned_unit("ds-2", "nope"), snap)
    assert not result.success and result.infeasible and result.examined == 0
    assert result.reason == "0/2000 nodes fit: 2000 node(s) didn't match node selector"
    # The index follows label changes and node removals.
    relabelled = node("n00007", cpu=4000, mem=64 * GiB)
    relabelled.metadata.labels["hostname"] = "moved"
    cache.set_node(relabelled)
    cache.remove_node("n01234")
    snap.update(cache)
    assert sched.schedule(pinned_unit("ds-3", "n01234"), snap).reason.startswith("0/1999 nodes")
    placed = sched.schedule(pinned_unit("ds-4", "moved"), snap)
    assert [p.node for p in placed.placements] == ["n00007"]
    assert not sched.schedule(pinned_unit("ds-5", "n00007"), snap).success


def test_pre_filter_leaves_broad_selectors_to_the_scan() -> None:
    # zone In [a] matches half the nodes: narrowing would cost more than the scan saves.
    cache = SchedulerCache()
    for i in range(400):
        nd = node(f"n{i:05d}", cpu=4000, mem=64 * GiB)
        nd.metadata.labels["zone"] = "a" if i % 2 else "b"
        cache.set_node(nd)
    snap = Snapshot()
    snap.update(cache)
    j = job("z", replicas=1, min_member=1, cpu=100, mem=GiB)
    j.spec.template.node_selector["zone"] = "a"
    unit = UnitInfo("z", 1, 0, 0, [PodInfo.from_pod(p) for p in pods_of(j)])
    result = scheduler(scan_extra=0).schedule(unit, snap)
    assert result.success and result.examined > 1


@pytest.mark.parametrize(
    ("nodes", "pct", "want"),
    [
        (10, 0, 10),
        (99, 0, 99),
        (1000, 0, 420),
        (5000, 0, 500),
        (6000, 0, 300),
        (50_000, 0, 2500),
        (1000, 10, 100),
        (1000, 40, 400),
        (1000, 100, 1000),
        (300, 0, 144),
    ],
)
def test_num_feasible_nodes_to_find(nodes: int, pct: int, want: int) -> None:
    assert num_feasible_nodes_to_find(nodes, pct) == want


def test_kube_mode_scans_adaptive_percentage_per_pod() -> None:
    _, snap = cluster(1000, cpu=64_000)
    result = scheduler(mode="kube").schedule(unit_of("a", 3, 1, 100), snap)
    assert result.success
    assert result.scans == 3
    assert result.examined == 3 * 420


def test_snapshot_copies_only_changed_nodes() -> None:
    cache, snap = cluster(50)
    assert snap.clones == 50
    assert snap.update(cache) == 0
    cache.assume(PodRequest("p1", "g", 100, 0, 0), "n00003")
    cache.set_node(node("n00007", cpu=8000))
    assert snap.update(cache) == 2
    assert snap.get("n00003") is not cache.nodes["n00003"]
    assert snap.get("n00003").requested["g"][0] == 100  # type: ignore[union-attr]
    # A cycle's own assumes are undone on the next update.
    snap.assume(PodRequest("p2", "g", 100, 0, 0), "n00010")
    assert snap.update(cache) == 1
    assert snap.get("n00010").requested["g"][0] == 0  # type: ignore[union-attr]
    assert snap.update(cache) == 0


def test_cache_expires_each_confirmed_placement_at_its_own_deadline() -> None:
    """expire() looks at the placements only once the earliest deadline has passed, and then
    drops exactly the expired ones; the later ones keep counting until theirs."""
    cache = SchedulerCache()
    cache.set_node(node("n1", cpu=4000))
    for name in ("a", "b", "c"):
        assert cache.assume(PodRequest(name, "g", 500, 0, 0), "n1")
    assert cache.expire(now=1e12) == 0  # nothing confirmed: nothing expires, however late
    cache.confirm("a", ttl_seconds=10)
    cache.confirm("b", ttl_seconds=100)
    soon = cache.assumed["a"].expires
    assert soon is not None
    assert cache.expire(now=soon - 1) == 0
    assert cache.expire(now=soon) == 1 and set(cache.assumed) == {"b", "c"}
    assert cache.nodes["n1"].requested["g"][0] == 1000
    late = cache.assumed["b"].expires
    assert late is not None
    assert cache.expire(now=late - 1) == 0 and set(cache.assumed) == {"b", "c"}
    assert cache.expire(now=late) == 1 and set(cache.assumed) == {"c"}
    cache.confirm("c", ttl_seconds=0)
    assert cache.expire() == 1 and not cache.assumed
    assert cache.nodes["n1"].requested["g"][0] == 0


def test_cache_assume_confirm_forget() -> None:
    cache, snap = cluster(3)
    req = PodRequest("p", "g", 1000, 0, 0)
    assert cache.assume(req, "n00001")
    assert not cache.assume(req, "n00002")  # already assumed
    # The informer shows it bound: the claim changes hands without double counting.
    pod = pods_of(job("j", cpu=1000, mem=0))[0]
    pod.metadata.name = "p"
    pod.spec.node_name = "n00001"
    pod.status.phase = pb.POD_BOUND
    cache.set_pod(pod)
    assert "p" not in cache.assumed
    assert cache.nodes["n00001"].requested["g"][0] == 1000
    # Terminal pods return their claim.
    pod.status.phase = pb.POD_SUCCEEDED
    cache.set_pod(pod)
    assert cache.nodes["n00001"].requested["g"][0] == 0
    # A rejected placement is forgotten; a confirmed one expires if never seen bound.
    assert cache.assume(PodRequest("q", "g", 500, 0, 0), "n00002")
    cache.forget("q")
    assert cache.nodes["n00002"].requested["g"][0] == 0
    assert cache.assume(PodRequest("r", "g", 500, 0, 0), "n00002")
    cache.confirm("r", ttl_seconds=0)
    assert cache.expire() == 1 and cache.nodes["n00002"].requested["g"][0] == 0
    # Pods seen before their node keep their claim on a placeholder.
    early = pods_of(job("k", cpu=300, mem=0))[0]
    early.spec.node_name = "later"
    early.status.phase = pb.POD_BOUND
    cache.set_pod(early)
    cache.set_node(node("later", cpu=1000))
    snap.update(cache)
    assert snap.get("later").requested["g"][0] == 300  # type: ignore[union-attr]
    assert "later" in [n.name for n in snap.nodes]


def test_steps_yield_after_each_pod_and_return_the_result() -> None:
    _, snap = cluster(100, cpu=64_000)
    steps = scheduler().steps(unit_of("web", 20, 1, 100), snap)
    yields = 0
    while True:
        try:
            next(steps)
            yields += 1
        except StopIteration as done:
            result = done.value
            break
    assert yields == 20
    assert result.success and len(result.placements) == 20


@pytest.mark.parametrize("mode", ["godel", "kube"])
def test_a_template_that_found_no_node_rescans_only_changed_nodes(mode: str) -> None:
    """Gödel mode remembers that no node fit a template: the next unit of the same template
    examines only the nodes changed since (here none, then the one a pod left), and says the
    first search's reason. Kube mode scans everything every time."""
    cache, snap = cluster(1000, cpu=1000)
    for i in range(1000):
        filler = pods_of(job(f"f{i}", cpu=1000, mem=GiB))[0]
        filler.spec.node_name = f"n{i:05d}"
        filler.status.phase = pb.POD_RUNNING
        cache.set_pod(filler)
    snap.update(cache)
    sched = scheduler(mode=mode)
    first = sched.schedule(unit_of("a", 1, 1, 1000), snap)
    assert not first.success and first.examined == 1000
    again = sched.schedule(unit_of("b", 1, 1, 1000), snap)
    assert not again.success and again.reason == first.reason
    assert again.examined == (0 if mode == "godel" else 1000)
    cache.remove_pod("f0-0")  # node n00000 has room again
    snap.update(cache)
    third = sched.schedule(unit_of("c", 1, 1, 1000), snap)
    assert [p.node for p in third.placements] == ["n00000"]
    assert third.examined == (1 if mode == "godel" else 1000)


# Gödel's feasible-node cache is keyed by template, not by unit: one-pod jobs of one template
# share it, kept correct as nodes change between them.


def filled(cache: SchedulerCache, name: str, node_name: str, cpu: int) -> None:
    pod = pods_of(job(name, cpu=cpu, mem=GiB))[0]
    pod.spec.node_name = node_name
    pod.status.phase = pb.POD_RUNNING
    cache.set_pod(pod)


def test_one_pod_units_of_a_template_share_one_cache() -> None:
    _, snap = cluster(200, cpu=4000)
    sched = scheduler(scan_extra=10)
    results = [sched.schedule(unit_of(f"u{i}", 1, 1, 100), snap) for i in range(30)]
    assert all(r.success for r in results)
    # A scan finds 11 nodes (1 + scan_extra) and serves the next 11 pods, whatever their unit;
    # then the template scans afresh from where the last scan stopped, so the stream spreads.
    assert [r.scans for r in results] == ([1] + [0] * 10) * 2 + [1] + [0] * 7
    assert sum(r.examined for r in results) == 33
    assert len({r.placements[0].node for r in results}) == 30
    assert_not_overcommitted(snap)
    # Another template gets its own cache.
    assert sched.schedule(unit_of("big", 1, 1, 2000), snap).scans == 1


def _loose_pod(name: str, cpu: int, *, selector: str = "") -> PodInfo:
    """The one pod of a one-pod job; ``selector``: a node label value no node has."""
    j = job(name, replicas=1, min_member=1, cpu=cpu, mem=GiB)
    if selector:
        j.spec.template.node_selector["zone"] = selector
    return PodInfo.from_pod(pods_of(j)[0])


# Nodes: 4 of 2000m (taint_every=0). Each case: the pods of one-pod jobs searched together,
# and per pod: placed, or its own reason; and which are infeasible (no node could ever fit).
INDEPENDENT_CASES = [
    ("all-fit", [("a", 500, ""), ("b", 500, ""), ("c", 500, "")], {"a", "b", "c"}, {}, set()),
    (
        # The middle pod fits nowhere now (only preemption or room could help): the others are
        # placed anyway, and nothing is undone for it.
        "one-too-big",
        [("a", 500, ""), ("big", 3000, ""), ("c", 500, "")],
        {"a", "c"},
        {"big": "0/4 nodes fit: 4 insufficient cpu"},
        set(),
    ),
    (
        "one-never-fits",
        [("a", 500, ""), ("moon", 100, "moon"), ("c", 500, "")],
        {"a", "c"},
        {"moon": "0/4 nodes fit: 4 node(s) didn't match node selector"},
        {"moon"},
    ),
    (
        # Each failing pod keeps its own reason (a gang's pods would all get the first's).
        "none-fit-each-its-own-reason",
        [("big", 3000, ""), ("moon", 100, "moon")],
        set(),
        {
            "big": "0/4 nodes fit: 4 insufficient cpu",
            "moon": "0/4 nodes fit: 4 node(s) didn't match node selector",
        },
        {"moon"},
    ),
    (
        # Room for 8 pods of 1000m: the ninth and tenth of the stream do not fit.
        "the-stream-fills-the-cluster",
        [(f"s{i}", 1000, "") for i in range(10)],
        {f"s{i}" for i in range(8)},
        {"s8": "0/4 nodes fit: 4 insufficient cpu", "s9": "0/4 nodes fit: 4 insufficient cpu"},
        set(),
    ),
]


@pytest.mark.parametrize(
    ("case", "pods", "placed", "unplaced", "infeasible"),
    INDEPENDENT_CASES,
    ids=[c[0] for c in INDEPENDENT_CASES],
)
def test_an_independent_unit_places_each_pod_on_its_own(
    case: str,
    pods: list[tuple[str, int, str]],
    placed: set[str],
    unplaced: dict[str, str],
    infeasible: set[str],
) -> None:
    _, snap = cluster(4, cpu=2000)
    infos = [_loose_pod(name, cpu, selector=sel) for name, cpu, sel in pods]
    unit = UnitInfo("", 1, 0, 0, infos, independent=True)
    result = scheduler().schedule(unit, snap)
    assert result.success, case
    assert {p.pod.rsplit("-", 1)[0] for p in result.placements} == placed
    assert {k.rsplit("-", 1)[0]: v for k, v in result.unplaced.items()} == unplaced
    assert {k.rsplit("-", 1)[0] for k in result.diagnoses} == set(unplaced)
    assert {k.rsplit("-", 1)[0] for k in result.infeasible_pods} == infeasible
    assert not result.infeasible  # the unit as a whole is never judged
    # What was placed stays assumed (nothing rolled back), never over the nodes' room.
    assert sum(len(info.pods) for info in snap.nodes) == len(placed)
    assert_not_overcommitted(snap)


def test_a_kept_cache_skips_a_node_filled_by_others_since() -> None:
    cache, snap = cluster(100, cpu=1000)  # each node fits one pod
    sched = scheduler(scan_extra=5)
    first = sched.schedule(unit_of("a", 1, 1, 1000), snap)
    assert [p.node for p in first.placements] == ["n00000"]
    filled(cache, "other", "n00001", 1000)  # another shard's bind reaches the view
    snap.update(cache)
    second = sched.schedule(unit_of("b", 1, 1, 1000), snap)
    assert [p.node for p in second.placements] == ["n00002"]
    assert second.scans == 0


def test_a_kept_cache_rescores_a_node_changed_since() -> None:
    cache, snap = cluster(100, cpu=4000)
    sched = scheduler(scan_extra=5)
    first = sched.schedule(unit_of("a", 1, 1, 1000), snap)
    assert [p.node for p in first.placements] == ["n00000"]
    filled(cache, "other", "n00001", 2000)  # still fits, but fuller than the empty nodes
    snap.update(cache)
    second = sched.schedule(unit_of("b", 1, 1, 1000), snap)
    # Least allocated: an empty cached node, not n00001's stale score nor n00000.
    assert [p.node for p in second.placements] == ["n00002"]
    assert second.scans == 0


def test_a_cache_is_not_kept_across_snapshots() -> None:
    _, snap = cluster(50, cpu=4000)
    sched = scheduler(scan_extra=5)
    assert sched.schedule(unit_of("a", 1, 1, 100), snap).scans == 1
    _, other = cluster(50, cpu=4000)
    assert sched.schedule(unit_of("b", 1, 1, 100), other).scans == 1


def test_a_kept_cache_holds_only_own_partition_nodes() -> None:
    _, snap = cluster(100, cpu=4000)
    sched = scheduler(scan_extra=5)
    sched.partition = frozenset(f"n{i:05d}" for i in range(50, 100))
    first = sched.schedule(unit_of("a", 1, 1, 100), snap)
    assert first.placements[0].node >= "n00050"
    second = sched.schedule(unit_of("b", 1, 1, 100), snap)
    assert second.scans == 0 and second.placements[0].node >= "n00050"
    sched.partition = frozenset(f"n{i:05d}" for i in range(50))  # the partition moved
    third = sched.schedule(unit_of("c", 1, 1, 100), snap)
    assert third.scans == 1 and third.placements[0].node < "n00050"


def test_cache_keeps_one_record_per_bound_pod_naming_its_node() -> None:
    """A bound pod is one record (not a (node, record) pair: ~60 bytes a pod), whose node is
    one string per node, and which its node's accounting shares the request of."""
    cache, _ = cluster(2)
    pods = pods_of(job("a", replicas=3, cpu=100, mem=0))
    for pod in pods:
        pod.spec.node_name = "n00001"
        pod.status.phase = pb.POD_BOUND
        cache.set_pod(pod)
    records = [cache.bound[p.metadata.name] for p in pods]
    assert all(r.node == "n00001" and r.node is records[0].node for r in records)
    assert all(cache.nodes["n00001"].pods[r.name] is r.req for r in records)
    pods[0].status.phase = pb.POD_RUNNING  # same node: the record keeps its node and request
    pods[0].status.started_ms = 5
    cache.set_pod(pods[0])
    again = cache.bound[pods[0].metadata.name]
    assert (again.node, again.started_ms, again.req) == ("n00001", 5, records[0].req)
    assert cache.running(pods[0].metadata.name) is again


def test_cache_bound_nodes_of_a_job_follow_its_pods() -> None:
    """The first question about a job scans the bound pods; then binds, moves and removals keep
    its index right, and a job left with none bound holds no entry."""
    cache, _ = cluster(4)
    a_pods = pods_of(job("a", replicas=3, cpu=100, mem=0))
    b_pod = pods_of(job("b", cpu=100, mem=0))[0]

    def bind(pod: pb.Pod, node_name: str) -> None:
        pod.spec.node_name = node_name
        pod.status.phase = pb.POD_BOUND
        cache.set_pod(pod)

    assert cache.bound_nodes_of("a") == []
    bind(a_pods[0], "n00000")
    bind(b_pod, "n00001")
    assert cache.bound_nodes_of("a") == ["n00000"]  # scanned: b's pod is not a's
    bind(a_pods[1], "n00002")  # indexed as it binds
    assert sorted(cache.bound_nodes_of("a")) == ["n00000", "n00002"]
    bind(a_pods[1], "n00003")  # rebound elsewhere (a stale record replaced)
    assert sorted(cache.bound_nodes_of("a")) == ["n00000", "n00003"]
    a_pods[0].status.phase = pb.POD_SUCCEEDED  # terminal: no longer holds its node
    cache.set_pod(a_pods[0])
    cache.remove_pod(a_pods[1].metadata.name)
    assert cache.bound_nodes_of("a") == []
    bind(a_pods[2], "n00001")  # the emptied index was dropped: a fresh scan finds it
    assert cache.bound_nodes_of("a") == ["n00001"]
    assert cache.bound_nodes_of("b") == ["n00001"]


def profiled(text: str, **kw: object) -> UnitScheduler:
    framework = Framework(load_profile(text, REGISTRY), REGISTRY)
    return UnitScheduler(framework, SearchConfig(**kw))  # type: ignore[arg-type]


def one_pod_stream(sched: UnitScheduler, snap: Snapshot, pods: int, cpu: int) -> list[str]:
    """``pods`` one-pod jobs in turn (each its own unit, as the trace benchmark submits them):
    the node each was placed on."""
    chosen = []
    for i in range(pods):
        result = sched.schedule(unit_of(f"j{i}", 1, 1, cpu), snap)
        assert result.success
        chosen.append(result.placements[0].node)
    return chosen


NO_SCORES = "scores: []\npreemption: false\n"
RANDOM_NO_SCORES = NO_SCORES + "tieBreak: random\n"


@pytest.mark.parametrize(
    ("case", "profile", "same_as_scan_order"),
    [
        # Every node ties without scores: the scan order from the rotating offset decides.
        ("first-is-scan-order", NO_SCORES, True),
        ("random-seed-1", RANDOM_NO_SCORES + "tieBreakSeed: 1\n", False),
        ("random-seed-2", RANDOM_NO_SCORES + "tieBreakSeed: 2\n", False),
    ],
)
def test_tie_break_selects_among_equal_scores(
    case: str, profile: str, same_as_scan_order: bool
) -> None:
    def run(text: str) -> list[str]:
        _, snap = cluster(40, cpu=64_000)
        return one_pod_stream(profiled(text, scan_extra=100), snap, 30, 100)

    chosen = run(profile)
    assert chosen == run(profile)  # the same profile (and seed) makes the same choices
    assert (chosen == run(NO_SCORES)) is same_as_scan_order
    if not same_as_scan_order:
        assert chosen != run(RANDOM_NO_SCORES + "tieBreakSeed: 99\n")  # the seed draws
        assert len(set(chosen)) > 10  # spread at random, not piled up


def test_random_tie_break_picks_only_among_the_top_score_and_each_of_them() -> None:
    # Big nodes score higher for LeastAllocated than small ones: only they may be drawn, and
    # over many draws every one of them is.
    picked: set[str] = set()
    for seed in range(60):
        cache = SchedulerCache()
        for i in range(10):
            nd = node(f"n{i}", cpu=64_000 if i % 2 else 8000, mem=64 * GiB)
            cache.set_node(nd)
        snap = Snapshot()
        snap.update(cache)
        text = (
            "scores: [{name: LeastAllocated, weight: 1}]\nargs: {LeastAllocated: {cpu: 1}}\n"
            f"tieBreak: random\ntieBreakSeed: {seed}\n"
        )
        picked.update(one_pod_stream(profiled(text), snap, 1, 4000))
    assert picked == {"n1", "n3", "n5", "n7", "n9"}
