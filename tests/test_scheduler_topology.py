"""Table-driven tests of the topology plugins (InterPodAffinity, PodTopologySpread) over the
topology index, in kube-scheduler's manner: (pod, cluster of labelled nodes and placed pods, node)
-> expected status or score; then the index's incremental upkeep and the search's use of it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from placement.framework import Framework, PodInfo, Profile, Status, UnitInfo
from placement.nodeinfo import NodeInfo, PodRequest
from placement.plugins import interpodaffinity, new_in_tree_registry, podtopologyspread
from placement.plugins.interpodaffinity import AFFINITY, ANTI_AFFINITY, EXISTING_ANTI
from placement.plugins.podtopologyspread import MISSING_LABEL, SKEW
from placement.search import UnitScheduler
from placement.snapshot import Snapshot
from placement.topology import TopologyIndex
from protos.godel.v1 import objects_pb2 as pb
from tests.factories import node as pb_node

Req = pb.LabelSelectorRequirement
TSC = pb.TopologySpreadConstraint

# Zones a (two nodes), b (one), c (one); "x" has no zone label.
NODES: dict[str, dict[str, str]] = {
    "a1": {"zone": "a", "hostname": "a1"},
    "a2": {"zone": "a", "hostname": "a2"},
    "b1": {"zone": "b", "hostname": "b1"},
    "c1": {"zone": "c", "hostname": "c1"},
    "x1": {"hostname": "x1"},
}


def sel(**labels: str) -> list[Req]:
    return [Req(key=k, operator=Req.IN, values=[v]) for k, v in labels.items()]


def term(selector: list[Req], key: str) -> pb.PodAffinityTerm:
    t = pb.PodAffinityTerm(topology_key=key)
    t.label_selector.extend(selector)
    return t


def spread(skew: int, key: str, selector: list[Req], anyway: bool = False) -> TSC:
    c = TSC(max_skew=skew, topology_key=key)
    c.when_unsatisfiable = TSC.SCHEDULE_ANYWAY if anyway else TSC.DO_NOT_SCHEDULE
    c.label_selector.extend(selector)
    return c


def pod_pb(
    name: str = "p",
    labels: dict[str, str] | None = None,
    *,
    affinity: Sequence[pb.PodAffinityTerm] = (),
    anti: Sequence[pb.PodAffinityTerm] = (),
    preferred: Sequence[tuple[int, pb.PodAffinityTerm]] = (),
    preferred_anti: Sequence[tuple[int, pb.PodAffinityTerm]] = (),
    constraints: Sequence[TSC] = (),
    node_selector: dict[str, str] | None = None,
) -> pb.Pod:
    p = pb.Pod(metadata=pb.ObjectMeta(name=name, resource_version=1))
    p.metadata.labels.update(labels or {})
    p.spec.job = name
    t = p.spec.template
    t.labels.update(labels or {})
    t.requests.milli_cpu, t.requests.memory_bytes = 100, 1 << 20
    t.affinity.pod_affinity.required.extend(affinity)
    t.affinity.pod_anti_affinity.required.extend(anti)
    for w, pt in preferred:
        t.affinity.pod_affinity.preferred.add(weight=w).term.CopyFrom(pt)
    for w, pt in preferred_anti:
        t.affinity.pod_anti_affinity.preferred.add(weight=w).term.CopyFrom(pt)
    t.topology_spread_constraints.extend(constraints)
    t.node_selector.update(node_selector or {})
    return p


def pod(name: str = "p", labels: dict[str, str] | None = None, **kw: object) -> PodInfo:
    return PodInfo.from_pod(pod_pb(name, labels, **kw))  # type: ignore[arg-type]


def placed(name: str, labels: dict[str, str], **kw: object) -> PodRequest:
    return PodInfo.from_pod(pod_pb(name, labels, **kw)).req  # type: ignore[arg-type]


def cluster(existing: dict[str, list[PodRequest]]) -> dict[str, NodeInfo]:
    infos = {}
    for name, labels in NODES.items():
        n = pb_node(name)
        n.metadata.labels.update(labels)
        info = NodeInfo.from_node(n)
        for r in existing.get(name, []):
            info.add_pod(r)
        infos[name] = info
    return infos


WEB = {"app": "web"}
DB = {"app": "db"}


@dataclass
class Case:
    id: str
    pod: PodInfo
    existing: dict[str, list[PodRequest]]
    # node -> expected reason (None: passes)
    want: dict[str, str | None]
    plugin: object = field(default=None)


def run_filter(
    plugin: object, case_pod: PodInfo, infos: dict[str, NodeInfo]
) -> dict[str, str | None]:
    index = TopologyIndex()
    index.activate(infos.values())
    state = plugin.prepare(case_pod, index)  # type: ignore[attr-defined]
    case_pod.topology = {plugin.NAME: state} if state is not None else None  # type: ignore[attr-defined]
    out: dict[str, str | None] = {}
    for name, info in infos.items():
        status: Status | None = plugin.filter(case_pod, info)  # type: ignore[attr-defined]
        out[name] = status.reasons[0] if status is not None else None
    return out


ALL_PASS = dict.fromkeys(NODES)


def _want(**by_node: str | None) -> dict[str, str | None]:
    out = dict(ALL_PASS)
    out.update(by_node)
    return out


AFFINITY_CASES = [
    Case("no-constraints-nothing-prepared", pod(labels=WEB), {"a1": [placed("w", WEB)]}, ALL_PASS),
    Case(
        "required-affinity-zone-of-a-matching-pod",
        pod(affinity=[term(sel(app="db"), "zone")]),
        {"a1": [placed("d", DB)]},
        _want(b1=AFFINITY, c1=AFFINITY, x1=AFFINITY),
    ),
    Case(
        "required-affinity-hostname",
        pod(affinity=[term(sel(app="db"), "hostname")]),
        {"b1": [placed("d", DB)]},
        _want(a1=AFFINITY, a2=AFFINITY, c1=AFFINITY, x1=AFFINITY),
    ),
    Case(
        "required-affinity-no-match-anywhere",
        pod(affinity=[term(sel(app="db"), "zone")]),
        {"a1": [placed("w", WEB)]},
        {n: AFFINITY for n in NODES},
    ),
    Case(
        "first-of-a-self-affine-group-goes-anywhere-with-the-key",
        pod(labels=WEB, affinity=[term(sel(app="web"), "zone")]),
        {"a1": [placed("d", DB)]},
        _want(x1=AFFINITY),
    ),
    Case(
        "self-affine-group-follows-its-first-pod",
        pod(labels=WEB, affinity=[term(sel(app="web"), "zone")]),
        {"c1": [placed("w", WEB)]},
        _want(a1=AFFINITY, a2=AFFINITY, b1=AFFINITY, x1=AFFINITY),
    ),
    Case(
        "two-terms-both-needed",
        pod(affinity=[term(sel(app="db"), "zone"), term(sel(app="web"), "hostname")]),
        {"a1": [placed("d", DB)], "a2": [placed("w", WEB)]},
        _want(a1=AFFINITY, b1=AFFINITY, c1=AFFINITY, x1=AFFINITY),
    ),
    Case(
        "required-anti-affinity-zone",
        pod(labels=WEB, anti=[term(sel(app="web"), "zone")]),
        {"a2": [placed("w", WEB)]},
        _want(a1=ANTI_AFFINITY, a2=ANTI_AFFINITY),
    ),
    Case(
        "required-anti-affinity-hostname",
        pod(labels=WEB, anti=[term(sel(app="web"), "hostname")]),
        {"a2": [placed("w", WEB)], "c1": [placed("w2", WEB)]},
        _want(a2=ANTI_AFFINITY, c1=ANTI_AFFINITY),
    ),
    Case(
        "anti-affinity-ignores-non-matching-pods",
        pod(labels=WEB, anti=[term(sel(app="web"), "zone")]),
        {"a1": [placed("d", DB)]},
        ALL_PASS,
    ),
    Case(
        "anti-affinity-node-without-key-passes",
        pod(labels=WEB, anti=[term(sel(app="web"), "zone")]),
        {"x1": [placed("w", WEB)]},
        ALL_PASS,
    ),
    Case(
        "existing-pods-anti-affinity-is-symmetric",
        pod(labels=WEB),
        {"b1": [placed("d", DB, anti=[term(sel(app="web"), "zone")])]},
        _want(b1=EXISTING_ANTI),
    ),
    Case(
        "existing-anti-affinity-not-matching-this-pod",
        pod(labels=DB),
        {"b1": [placed("d", DB, anti=[term(sel(app="web"), "zone")])]},
        ALL_PASS,
    ),
]


@pytest.mark.parametrize("case", AFFINITY_CASES, ids=[c.id for c in AFFINITY_CASES])
def test_inter_pod_affinity_filter(case: Case) -> None:
    got = run_filter(interpodaffinity.InterPodAffinity(), case.pod, cluster(case.existing))
    assert got == case.want


def _by_zone(**counts: int) -> dict[str, list[PodRequest]]:
    """``counts`` web pods in each zone, on its first node."""
    first = {"a": "a1", "b": "b1", "c": "c1"}
    return {first[z]: [placed(f"w{z}{i}", WEB) for i in range(n)] for z, n in counts.items()}


ZONE1 = spread(1, "zone", sel(app="web"))
SPREAD_CASES = [
    Case(
        "empty-cluster-every-zone",
        pod(labels=WEB, constraints=[ZONE1]),
        {},
        _want(x1=MISSING_LABEL),
    ),
    Case(
        "skew-1-fills-the-emptiest-zones",
        pod(labels=WEB, constraints=[ZONE1]),
        _by_zone(a=1),
        _want(a1=SKEW, a2=SKEW, x1=MISSING_LABEL),
    ),
    Case(
        "skew-1-balanced-every-zone",
        pod(labels=WEB, constraints=[ZONE1]),
        _by_zone(a=1, b=1, c=1),
        _want(x1=MISSING_LABEL),
    ),
    Case(
        "skew-1-only-the-minimum",
        pod(labels=WEB, constraints=[ZONE1]),
        _by_zone(a=2, b=1, c=2),
        _want(a1=SKEW, a2=SKEW, c1=SKEW, x1=MISSING_LABEL),
    ),
    Case(
        "skew-2-allows-one-more",
        pod(labels=WEB, constraints=[spread(2, "zone", sel(app="web"))]),
        _by_zone(a=2, b=1, c=1),
        _want(x1=MISSING_LABEL),
    ),
    Case(
        "skew-2-refuses-two-more",
        pod(labels=WEB, constraints=[spread(2, "zone", sel(app="web"))]),
        _by_zone(a=3, b=1, c=1),
        _want(a1=SKEW, a2=SKEW, x1=MISSING_LABEL),
    ),
    Case(
        "pod-not-matching-its-selector-does-not-count-itself",
        pod(labels=DB, constraints=[ZONE1]),
        _by_zone(a=1),
        _want(x1=MISSING_LABEL),
    ),
    Case(
        "hostname-domains",
        pod(labels=WEB, constraints=[spread(1, "hostname", sel(app="web"))]),
        {"a1": [placed("w1", WEB)], "a2": [placed("w2", WEB)], "b1": [placed("w3", WEB)]},
        _want(a1=SKEW, a2=SKEW, b1=SKEW),
    ),
    Case(
        "schedule-anyway-never-filters",
        pod(labels=WEB, constraints=[spread(1, "zone", sel(app="web"), anyway=True)]),
        _by_zone(a=5),
        ALL_PASS,
    ),
    Case(
        "two-constraints-both-hold",
        pod(labels=WEB, constraints=[ZONE1, spread(1, "hostname", sel(app="web"))]),
        {"a1": [placed("w1", WEB)], "b1": [placed("w2", WEB)]},
        _want(a1=SKEW, a2=SKEW, b1=SKEW, x1=MISSING_LABEL),
    ),
]


@pytest.mark.parametrize("case", SPREAD_CASES, ids=[c.id for c in SPREAD_CASES])
def test_pod_topology_spread_filter(case: Case) -> None:
    got = run_filter(podtopologyspread.PodTopologySpread(), case.pod, cluster(case.existing))
    assert got == case.want


def test_spread_eligible_domains_follow_node_affinity() -> None:
    p = pod(labels=WEB, constraints=[ZONE1])
    p.required_terms = ((interpodaffinity_req("zone", "a", "b"),),)
    got = run_filter(podtopologyspread.PodTopologySpread(), p, cluster(_by_zone(a=1, b=1)))
    # Zone c is not eligible, so the minimum is 1 and zones a and b both take one more.
    assert got["a1"] is None and got["b1"] is None


def interpodaffinity_req(key: str, *values: str):  # type: ignore[no-untyped-def]
    from placement.labelselector import requirement

    return requirement(Req(key=key, operator=Req.IN, values=list(values)))


def scores(plugin: object, p: PodInfo, infos: dict[str, NodeInfo]) -> dict[str, int]:
    index = TopologyIndex()
    index.activate(infos.values())
    state = plugin.prepare(p, index)  # type: ignore[attr-defined]
    p.topology = {plugin.NAME: state} if state is not None else None  # type: ignore[attr-defined]
    names = list(infos)
    raw = [plugin.score(p, infos[n]) for n in names]  # type: ignore[attr-defined]
    plugin.normalize_scores(p, raw)  # type: ignore[attr-defined]
    return dict(zip(names, raw, strict=True))


@pytest.mark.parametrize(
    ("case", "p", "existing", "want"),
    [
        (
            "preferred-affinity-towards-the-zone-with-most-matches",
            pod(preferred=[(10, term(sel(app="db"), "zone"))]),
            {"a1": [placed("d1", DB)], "b1": [placed("d2", DB), placed("d3", DB)]},
            {"a1": 50, "a2": 50, "b1": 100, "c1": 0, "x1": 0},
        ),
        (
            "preferred-anti-affinity-away-from-matches",
            pod(preferred_anti=[(5, term(sel(app="web"), "zone"))]),
            {"a1": [placed("w1", WEB)]},
            {"a1": 0, "a2": 0, "b1": 100, "c1": 100, "x1": 100},
        ),
        (
            "weights-combine",
            pod(
                preferred=[(10, term(sel(app="db"), "hostname"))],
                preferred_anti=[(5, term(sel(app="web"), "zone"))],
            ),
            {"a1": [placed("d1", DB), placed("w1", WEB)], "c1": [placed("w2", WEB)]},
            # raw: a1 10-5=5, a2 -5, b1 0, c1 -5, x1 0 -> (s+5)*100//10
            {"a1": 100, "a2": 0, "b1": 50, "c1": 0, "x1": 50},
        ),
    ],
)
def test_inter_pod_affinity_score(
    case: str, p: PodInfo, existing: dict[str, list[PodRequest]], want: dict[str, int]
) -> None:
    assert scores(interpodaffinity.InterPodAffinity(), p, cluster(existing)) == want


@pytest.mark.parametrize(
    ("case", "existing", "want"),
    [
        # raw = count + maxSkew - 1: a1/a2 2, b1 1, c1 0; max 2, min 0 -> 100*(2+0-s)//2
        (
            "fewer-matches-score-higher",
            _by_zone(a=2, b=1),
            {"a1": 0, "a2": 0, "b1": 50, "c1": 100, "x1": 0},
        ),
        ("all-empty-all-equal", {}, {"a1": 100, "a2": 100, "b1": 100, "c1": 100, "x1": 0}),
    ],
)
def test_pod_topology_spread_schedule_anyway_score(
    case: str, existing: dict[str, list[PodRequest]], want: dict[str, int]
) -> None:
    p = pod(labels=WEB, constraints=[spread(1, "zone", sel(app="web"), anyway=True)])
    assert scores(podtopologyspread.PodTopologySpread(), p, cluster(existing)) == want


# ---------------------------------------------------------------------------------------------
# The index: incremental upkeep equals a rebuild
# ---------------------------------------------------------------------------------------------


def test_index_counts_follow_adds_removes_and_relabels() -> None:
    infos = cluster(_by_zone(a=2, b=1))
    index = TopologyIndex()
    index.activate(infos.values())
    web = PodInfo.from_pod(pod_pb(labels=WEB)).req  # noqa: F841 - the selector below
    selector = PodInfo.from_pod(pod_pb(constraints=[ZONE1])).spread[0].selector
    counts = index.domain_counts(selector, "zone")
    assert dict(counts) == {"a": 2, "b": 1}
    index.add("c1", placed("n1", WEB))
    index.add("c1", placed("n2", DB))
    assert dict(counts) == {"a": 2, "b": 1, "c": 1}
    index.remove("wa0")
    index.add("b1", placed("n1", WEB))  # moved from c1
    assert dict(counts) == {"a": 1, "b": 2}
    index.set_node("b1", {"zone": "c", "hostname": "b1"})  # b1 moves to zone c with its pods
    assert dict(counts) == {"a": 1, "c": 2}
    assert dict(index.domains("zone")) == {"a": 2, "c": 2}
    rebuilt = TopologyIndex()
    infos["b1"].labels = {"zone": "c", "hostname": "b1"}
    infos["a1"].remove_pod("wa0")
    infos["b1"].add_pod(placed("n1", WEB))
    rebuilt.activate(infos.values())
    assert dict(rebuilt.domain_counts(selector, "zone")) == dict(counts)


def test_index_tracks_existing_anti_terms() -> None:
    index = TopologyIndex()
    index.activate(cluster({}).values())
    assert not index.has_anti
    index.add("a1", placed("d", DB, anti=[term(sel(app="web"), "zone")]))
    assert [dict(d) for _, d in index.existing_anti()] == [{"a": 1}]
    index.remove("d")
    assert not index.has_anti


# ---------------------------------------------------------------------------------------------
# The search: topology pods bypass the feasible-node cache, plain pods keep it
# ---------------------------------------------------------------------------------------------


def _search(nodes: int, zones: int) -> tuple[UnitScheduler, Snapshot]:
    infos = []
    for i in range(nodes):
        n = pb_node(f"n{i:03d}", cpu=64000, pods=500)
        n.metadata.labels.update({"zone": f"z{i % zones}", "hostname": f"n{i:03d}"})
        infos.append(NodeInfo.from_node(n))
    fw = Framework(Profile(), new_in_tree_registry())
    return UnitScheduler(fw), Snapshot.of(infos)


def _unit(name: str, replicas: int, **kw: object) -> UnitInfo:
    pods = [PodInfo.from_pod(pod_pb(f"{name}-{i}", WEB, **kw)) for i in range(replicas)]  # type: ignore[arg-type]
    for p in pods:
        p.job = name
    return UnitInfo(name, 1, 0, 0, pods)


def test_search_anti_affine_pods_one_per_zone_within_a_unit() -> None:
    scheduler, snapshot = _search(30, 5)
    anti = [term(sel(app="web"), "zone")]
    result = scheduler.schedule(_unit("w", 7, anti=anti), snapshot)
    zones = [snapshot.infos[p.node].labels["zone"] for p in result.placements]
    assert len(result.placements) == 5 and len(set(zones)) == 5
    assert len(result.unplaced) == 2
    assert all(ANTI_AFFINITY in r or EXISTING_ANTI in r for r in result.unplaced.values())


def test_search_spread_holds_across_units_and_cycles() -> None:
    scheduler, snapshot = _search(20, 4)
    for k in range(6):
        result = scheduler.schedule(_unit(f"s{k}", 3, constraints=[ZONE1]), snapshot)
        assert result.success
    per_zone: dict[str, int] = {}
    for info in snapshot.nodes:
        per_zone[info.labels["zone"]] = per_zone.get(info.labels["zone"], 0) + len(info.pods)
    assert max(per_zone.values()) - min(per_zone.values()) <= 1
    assert sum(per_zone.values()) == 18


def test_search_plain_pods_keep_the_cache_and_never_activate_the_index() -> None:
    scheduler, snapshot = _search(50, 5)
    result = scheduler.schedule(_unit("plain", 20), snapshot)
    assert result.success and result.scans == 1
    assert not snapshot.topology.active


def test_search_a_unit_blocked_by_a_topology_rule_is_not_infeasible() -> None:
    """Its pods wait for other pods to move, not for a node change: unschedulable, retried."""
    scheduler, snapshot = _search(8, 4)
    anti = [term(sel(app="web"), "zone")]
    assert len(scheduler.schedule(_unit("a", 4, anti=anti), snapshot).placements) == 4
    blocked = scheduler.schedule(_unit("b", 1, anti=anti), snapshot)
    assert not blocked.success and not blocked.infeasible
    assert "anti-affinity" in blocked.reason


# ---------------------------------------------------------------------------------------------
# The topology feasible-node cache: every placement it makes is one a fresh scan would allow
# ---------------------------------------------------------------------------------------------

Outside = tuple[str, PodRequest]  # a pod another shard placed on a node, between units


@dataclass
class CacheCase:
    id: str
    nodes: int
    zones: int
    units: list[tuple[int, dict[str, object]]]  # (pods, pod_pb keywords) per unit
    # Before unit i: pods placed from outside (other shards' binds reach the snapshot).
    outside: dict[int, list[Outside]] = field(default_factory=dict)
    gone: dict[int, list[Outside]] = field(default_factory=dict)  # ... and removed
    placed: int | None = None  # how many pods in all get a node (None: all)
    labels: dict[str, str] = field(default_factory=lambda: dict(WEB))


DB_IN_Z2: list[Outside] = [("n002", placed("db-0", DB))]
CACHE_CASES = [
    CacheCase("anti-hostname", 60, 4, [(20, {"anti": [term(sel(app="web"), "hostname")]})] * 3),
    CacheCase("anti-zone", 30, 5, [(4, {"anti": [term(sel(app="web"), "zone")]})] * 2, placed=5),
    CacheCase(
        "spread-zone-with-others-binding-between-units",
        40,
        4,
        [(7, {"constraints": [ZONE1]})] * 5,
        outside={2: [("n000", placed("o-0", WEB)), ("n004", placed("o-1", WEB))]},
    ),
    CacheCase(
        # A pod leaving zone z3 lowers the minimum: the other zones' cached nodes (their own
        # counts unchanged) must be judged against it too.
        "a-pod-gone-lowers-the-spread-minimum",
        40,
        4,
        [(1, {"constraints": [ZONE1]}), (1, {"constraints": [ZONE1]})],
        outside={
            0: [(f"n00{i}", placed(f"o-{i}", WEB)) for i in range(4)]
            # Plain pods make z3's nodes score lowest: its cached nodes are taken last.
            + [(f"n{i:03d}", placed(f"plain-{i}", {})) for i in range(3, 40, 4)]
        },
        gone={1: [("n003", placed("o-3", WEB))]},
    ),
    CacheCase(
        "required-affinity-to-a-zone",
        40,
        4,
        [(5, {"affinity": [term(sel(app="db"), "zone")]})] * 3,
        outside={0: DB_IN_Z2},
    ),
    CacheCase(
        "an-anti-affine-pod-placed-between-units-keeps-the-rest-out-of-its-zone",
        40,
        4,
        [(6, {"constraints": [spread(3, "zone", sel(app="web"))]})] * 4,
        outside={2: [("n001", placed("x-0", DB, anti=[term(sel(app="web"), "zone")]))]},
        placed=21,  # z1 keeps its 3; the others reach 3 + maxSkew
    ),
    CacheCase(
        "preferred-affinity-piles-onto-the-matching-node",
        50,
        5,
        [(10, {"preferred": [(1, term(sel(app="web"), "hostname"))]})] * 3,
        outside={0: [("n017", placed("w-0", WEB))]},
    ),
]


@pytest.mark.parametrize("case", CACHE_CASES, ids=[c.id for c in CACHE_CASES])
def test_search_topology_cache_places_only_what_a_fresh_scan_allows(case: CacheCase) -> None:
    """Units of one topology template through Gödel mode's cache (candidates re-checked as the
    counts move, kept across units), with other shards' pods arriving between units; a replay
    on a fresh snapshot checks each placement, in order, with every filter freshly prepared."""
    scheduler, snapshot = _search(case.nodes, case.zones)
    _, replay = _search(case.nodes, case.zones)
    log: list[tuple[str, PodInfo | PodRequest]] = []
    total = 0
    for k, (size, kw) in enumerate(case.units):
        for node, req in case.outside.get(k, []):
            snapshot.assume(req, node)
            log.append((node, req))
        for node, req in case.gone.get(k, []):
            snapshot.forget(req.name, node)
            log.append(("-" + node, req))
        unit = _unit(f"u{k}", size, **kw)
        by_name = {p.name: p for p in unit.pods}
        result = scheduler.schedule(unit, snapshot)
        total += len(result.placements)
        log += [(pl.node, by_name[pl.pod]) for pl in result.placements]
    assert total == (case.placed if case.placed is not None else sum(n for n, _ in case.units))
    judge = scheduler.framework
    for node, item in log:
        if node.startswith("-"):
            assert isinstance(item, PodRequest)
            replay.forget(item.name, node[1:])
        elif isinstance(item, PodInfo):
            judge.prepare(item, replay.pod_counts())
            assert judge.run_filters(item, replay.infos[node]) is None, (item.name, node)
            replay.assume(item.req, node)
        else:
            replay.assume(item, node)
    if case.id.startswith("required-affinity"):
        assert {replay.infos[n].labels["zone"] for n, i in log} == {"z2"}
    if case.id.startswith("preferred"):
        assert all(n == "n017" for n, _ in log)  # 64 CPUs hold them all there


def test_search_topology_pods_of_a_unit_share_one_scan() -> None:
    """Anti-affine pods on ``hostname``: one scan finds 1 + scan_extra candidates and serves
    the unit; after each placement only the chosen node is checked again (its own domain)."""
    scheduler, snapshot = _search(200, 4)
    anti = [term(sel(app="web"), "hostname")]
    result = scheduler.schedule(_unit("w", 30, anti=anti), snapshot)
    assert result.success and len(result.placements) == 30
    assert len({p.node for p in result.placements}) == 30
    assert result.scans == 1 and result.examined == 51


def test_search_spread_candidates_at_their_skew_wait_for_the_minimum_to_rise() -> None:
    """A spread over zones turns a zone's candidates away while it is maxSkew ahead; they are
    parked, not dropped, and taken again once the other zones catch up: one scan serves a unit
    of 40 pods, and the zones end even."""
    scheduler, snapshot = _search(200, 4)
    result = scheduler.schedule(_unit("s", 40, constraints=[ZONE1]), snapshot)
    assert result.success and len(result.placements) == 40
    assert result.scans == 1
    zones = Counter(snapshot.infos[p.node].labels["zone"] for p in result.placements)
    assert sorted(zones.values()) == [10, 10, 10, 10]
