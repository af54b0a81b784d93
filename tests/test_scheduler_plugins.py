"""Table-driven tests of the in-tree scheduler plugins: (pod, node) -> expected status or score."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from placement.framework import Code, PodInfo, Status
from placement.nodeinfo import NodeInfo, PodRequest
from placement.plugins import (
    balancedallocation,
    leastallocated,
    mostallocated,
    nodeaffinity,
    nodeports,
    noderesourcesfit,
    nodeunschedulable,
    tainttoleration,
)
from placement.plugins.resourceargs import ResourceWeights
from placement.snapshot import LabelIndex
from protos.godel.v1 import objects_pb2 as pb
from tests.factories import GiB, node

Req = pb.LabelSelectorRequirement


def make_pod(
    *,
    cpu: int = 0,
    mem: int = 0,
    gpus: int = 0,
    qos: int = pb.QOS_GUARANTEED,
    selector: dict[str, str] | None = None,
    required: list[list[Req]] | None = None,
    preferred: list[tuple[int, list[Req]]] | None = None,
    tolerations: list[pb.Toleration] | None = None,
    host_ports: list[int] | None = None,
) -> PodInfo:
    p = pb.Pod(metadata=pb.ObjectMeta(name="p", resource_version=1))
    p.spec.job = "j"
    p.spec.qos = qos  # type: ignore[assignment]
    t = p.spec.template
    t.requests.milli_cpu, t.requests.memory_bytes, t.requests.gpus = cpu, mem, gpus
    t.node_selector.update(selector or {})
    for term in required or []:
        t.affinity.node_affinity.required.add().match_expressions.extend(term)
    for weight, term in preferred or []:
        pref = t.affinity.node_affinity.preferred.add(weight=weight)
        pref.preference.match_expressions.extend(term)
    t.tolerations.extend(tolerations or [])
    for port in host_ports or []:
        t.ports.add(container_port=port, host_port=port)
    return PodInfo.from_pod(p)


def make_node(
    *,
    cpu: int = 4000,
    mem: int = 32 * GiB,
    pods: int = 110,
    be_cpu: int = 0,
    be_mem: int = 0,
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    taints: list[pb.Taint] | None = None,
    unschedulable: bool = False,
    ready: bool = True,
    used: list[PodRequest] | None = None,
) -> NodeInfo:
    n = node("n1", cpu=cpu, mem=mem, pods=pods, be_cpu=be_cpu, be_mem=be_mem, gpus=gpus)
    n.metadata.labels.update(labels or {})
    n.spec.taints.extend(taints or [])
    n.spec.unschedulable = unschedulable
    n.status.ready = ready
    info = NodeInfo.from_node(n)
    for r in used or []:
        info.add_pod(r)
    return info


def used(name: str, cpu: int = 0, mem: int = 0, pool: str = "g", ports: int = 0) -> PodRequest:
    return PodRequest(name, pool, cpu, mem, 0, (("TCP", ports),) if ports else ())


@dataclass
class FilterCase:
    id: str
    pod: PodInfo
    node: NodeInfo
    want: Status | None
    plugin: object = field(default=None)


def _ids(cases: list[FilterCase]) -> list[str]:
    return [c.id for c in cases]


# ---------------------------------------------------------------------------------------------
# NodeResourcesFit
# ---------------------------------------------------------------------------------------------

FIT = noderesourcesfit.NAME
FIT_CASES = [
    FilterCase("fits", make_pod(cpu=1000, mem=GiB), make_node(), None),
    FilterCase("zero-request-fits", make_pod(), make_node(cpu=0, mem=0), None),
    FilterCase(
        "insufficient-cpu",
        make_pod(cpu=1000),
        make_node(cpu=4000, used=[used("a", cpu=3500)]),
        Status.unschedulable("insufficient cpu", plugin=FIT),
    ),
    FilterCase(
        "exactly-full-fits",
        make_pod(cpu=500),
        make_node(cpu=4000, used=[used("a", cpu=3500)]),
        None,
    ),
    FilterCase(
        "cpu-and-memory",
        make_pod(cpu=5000, mem=64 * GiB),
        make_node(),
        Status.unschedulable("insufficient cpu", "insufficient memory", plugin=FIT),
    ),
    FilterCase(
        "gpus",
        make_pod(gpus=1),
        make_node(gpus=0),
        Status.unschedulable("insufficient gpus", plugin=FIT),
    ),
    FilterCase(
        "too-many-pods",
        make_pod(cpu=1),
        make_node(pods=1, used=[used("a")]),
        Status.unschedulable("too many pods", plugin=FIT),
    ),
    FilterCase(
        "best-effort-uses-reclaimable-pool",
        make_pod(cpu=1000, qos=pb.QOS_BEST_EFFORT),
        make_node(cpu=4000, be_cpu=500, be_mem=GiB),
        Status.unschedulable("insufficient cpu", plugin=FIT),
    ),
    FilterCase(
        "best-effort-ignores-full-guaranteed-pool",
        make_pod(cpu=1000, qos=pb.QOS_BEST_EFFORT),
        make_node(cpu=1000, be_cpu=2000, be_mem=GiB, used=[used("a", cpu=1000)]),
        None,
    ),
    FilterCase(
        "guaranteed-ignores-reclaimable-usage",
        make_pod(cpu=1000),
        make_node(cpu=1000, be_cpu=2000, used=[used("a", cpu=2000, pool="be")]),
        None,
    ),
]


@pytest.mark.parametrize("case", FIT_CASES, ids=_ids(FIT_CASES))
def test_node_resources_fit(case: FilterCase) -> None:
    assert (
        noderesourcesfit.new(noderesourcesfit.SPEC.parse_args(None)).filter(case.pod, case.node)
        == case.want
    )


# ---------------------------------------------------------------------------------------------
# NodeUnschedulable, NodePorts
# ---------------------------------------------------------------------------------------------

UNSCHED_CASES = [
    FilterCase("schedulable", make_pod(), make_node(), None),
    FilterCase(
        "cordoned",
        make_pod(),
        make_node(unschedulable=True),
        Status.unresolvable("node unschedulable", plugin=nodeunschedulable.NAME),
    ),
    FilterCase(
        "not-ready",
        make_pod(),
        make_node(ready=False),
        Status.unresolvable("node not ready", plugin=nodeunschedulable.NAME),
    ),
]


@pytest.mark.parametrize("case", UNSCHED_CASES, ids=_ids(UNSCHED_CASES))
def test_node_unschedulable(case: FilterCase) -> None:
    plugin = nodeunschedulable.SPEC.build(None)
    assert isinstance(plugin, nodeunschedulable.NodeUnschedulable)
    assert plugin.filter(case.pod, case.node) == case.want


PORT_CASES = [
    FilterCase("no-ports", make_pod(), make_node(used=[used("a", ports=80)]), None),
    FilterCase(
        "free-port", make_pod(host_ports=[8080]), make_node(used=[used("a", ports=80)]), None
    ),
    FilterCase(
        "port-taken",
        make_pod(host_ports=[80]),
        make_node(used=[used("a", ports=80)]),
        Status.unschedulable("host port in use", plugin=nodeports.NAME),
    ),
]


@pytest.mark.parametrize("case", PORT_CASES, ids=_ids(PORT_CASES))
def test_node_ports(case: FilterCase) -> None:
    assert nodeports.NodePorts().filter(case.pod, case.node) == case.want


# ---------------------------------------------------------------------------------------------
# NodeAffinity (+ node selector)
# ---------------------------------------------------------------------------------------------

NOT_MATCHED = Status.unresolvable("node(s) didn't match node selector", plugin=nodeaffinity.NAME)


def req(key: str, op: int, *values: str) -> Req:
    return Req(key=key, operator=op, values=list(values))  # type: ignore[arg-type]


ZONE_A = {"zone": "a", "gen": "5"}
AFFINITY_CASES = [
    FilterCase("no-constraint", make_pod(), make_node(labels=ZONE_A), None),
    FilterCase("selector-match", make_pod(selector={"zone": "a"}), make_node(labels=ZONE_A), None),
    FilterCase(
        "selector-mismatch", make_pod(selector={"zone": "b"}), make_node(labels=ZONE_A), NOT_MATCHED
    ),
    FilterCase("selector-missing-label", make_pod(selector={"x": "y"}), make_node(), NOT_MATCHED),
    FilterCase(
        "in", make_pod(required=[[req("zone", Req.IN, "a", "b")]]), make_node(labels=ZONE_A), None
    ),
    FilterCase(
        "in-miss",
        make_pod(required=[[req("zone", Req.IN, "b")]]),
        make_node(labels=ZONE_A),
        NOT_MATCHED,
    ),
    FilterCase(
        "not-in",
        make_pod(required=[[req("zone", Req.NOT_IN, "b")]]),
        make_node(labels=ZONE_A),
        None,
    ),
    FilterCase(
        "not-in-absent-label", make_pod(required=[[req("x", Req.NOT_IN, "b")]]), make_node(), None
    ),
    FilterCase(
        "not-in-miss",
        make_pod(required=[[req("zone", Req.NOT_IN, "a")]]),
        make_node(labels=ZONE_A),
        NOT_MATCHED,
    ),
    FilterCase(
        "exists", make_pod(required=[[req("zone", Req.EXISTS)]]), make_node(labels=ZONE_A), None
    ),
    FilterCase(
        "exists-miss",
        make_pod(required=[[req("x", Req.EXISTS)]]),
        make_node(labels=ZONE_A),
        NOT_MATCHED,
    ),
    FilterCase(
        "does-not-exist",
        make_pod(required=[[req("x", Req.DOES_NOT_EXIST)]]),
        make_node(labels=ZONE_A),
        None,
    ),
    FilterCase(
        "does-not-exist-miss",
        make_pod(required=[[req("zone", Req.DOES_NOT_EXIST)]]),
        make_node(labels=ZONE_A),
        NOT_MATCHED,
    ),
    FilterCase(
        "gt", make_pod(required=[[req("gen", Req.GT, "4")]]), make_node(labels=ZONE_A), None
    ),
    FilterCase(
        "gt-equal-misses",
        make_pod(required=[[req("gen", Req.GT, "5")]]),
        make_node(labels=ZONE_A),
        NOT_MATCHED,
    ),
    FilterCase(
        "lt", make_pod(required=[[req("gen", Req.LT, "6")]]), make_node(labels=ZONE_A), None
    ),
    FilterCase(
        "lt-non-numeric-label",
        make_pod(required=[[req("zone", Req.LT, "6")]]),
        make_node(labels=ZONE_A),
        NOT_MATCHED,
    ),
    FilterCase(
        "gt-bad-value",
        make_pod(required=[[req("gen", Req.GT, "x")]]),
        make_node(labels=ZONE_A),
        NOT_MATCHED,
    ),
    FilterCase(
        "terms-are-ored",
        make_pod(required=[[req("zone", Req.IN, "b")], [req("gen", Req.IN, "5")]]),
        make_node(labels=ZONE_A),
        None,
    ),
    FilterCase(
        "expressions-are-anded",
        make_pod(required=[[req("zone", Req.IN, "a"), req("gen", Req.IN, "4")]]),
        make_node(labels=ZONE_A),
        NOT_MATCHED,
    ),
    FilterCase(
        "selector-and-affinity-both-needed",
        make_pod(selector={"zone": "b"}, required=[[req("gen", Req.IN, "5")]]),
        make_node(labels=ZONE_A),
        NOT_MATCHED,
    ),
]


@pytest.mark.parametrize("case", AFFINITY_CASES, ids=_ids(AFFINITY_CASES))
def test_node_affinity_filter(case: FilterCase) -> None:
    assert nodeaffinity.NodeAffinity().filter(case.pod, case.node) == case.want


def test_node_affinity_preferred_scores_normalized() -> None:
    plugin = nodeaffinity.NodeAffinity()
    pod = make_pod(preferred=[(10, [req("zone", Req.IN, "a")]), (30, [req("gen", Req.GT, "4")])])
    nodes = [
        make_node(labels={"zone": "a", "gen": "5"}),
        make_node(labels={"zone": "a"}),
        make_node(labels={"gen": "9"}),
        make_node(),
    ]
    raw = [plugin.score(pod, n) for n in nodes]
    assert raw == [40, 10, 30, 0]
    plugin.normalize_scores(pod, raw)
    assert raw == [100, 25, 75, 0]
    zeros = [0, 0]
    plugin.normalize_scores(pod, zeros)
    assert zeros == [0, 0]


# ---------------------------------------------------------------------------------------------
# TaintToleration
# ---------------------------------------------------------------------------------------------

UNTOLERATED = Status.unresolvable("untolerated taint", plugin=tainttoleration.NAME)
T = pb.Toleration


def taint(key: str, value: str = "", effect: int = pb.NO_SCHEDULE) -> pb.Taint:
    return pb.Taint(key=key, value=value, effect=effect)  # type: ignore[arg-type]


def tol(key: str = "", value: str = "", op: int = T.EQUAL, effect: int = 0) -> pb.Toleration:
    return T(key=key, value=value, operator=op, effect=effect)  # type: ignore[arg-type]


TAINT_CASES = [
    FilterCase("no-taints", make_pod(), make_node(), None),
    FilterCase(
        "untolerated-noschedule", make_pod(), make_node(taints=[taint("gpu", "yes")]), UNTOLERATED
    ),
    FilterCase(
        "untolerated-noexecute",
        make_pod(),
        make_node(taints=[taint("gpu", effect=pb.NO_EXECUTE)]),
        UNTOLERATED,
    ),
    FilterCase(
        "prefer-noschedule-does-not-filter",
        make_pod(),
        make_node(taints=[taint("gpu", effect=pb.PREFER_NO_SCHEDULE)]),
        None,
    ),
    FilterCase(
        "equal-toleration",
        make_pod(tolerations=[tol("gpu", "yes")]),
        make_node(taints=[taint("gpu", "yes")]),
        None,
    ),
    FilterCase(
        "equal-value-mismatch",
        make_pod(tolerations=[tol("gpu", "no")]),
        make_node(taints=[taint("gpu", "yes")]),
        UNTOLERATED,
    ),
    FilterCase(
        "exists-toleration",
        make_pod(tolerations=[tol("gpu", op=T.EXISTS)]),
        make_node(taints=[taint("gpu", "yes")]),
        None,
    ),
    FilterCase(
        "empty-key-exists-tolerates-all",
        make_pod(tolerations=[tol(op=T.EXISTS)]),
        make_node(taints=[taint("a"), taint("b", effect=pb.NO_EXECUTE)]),
        None,
    ),
    FilterCase(
        "effect-mismatch",
        make_pod(tolerations=[tol("gpu", "yes", effect=pb.NO_EXECUTE)]),
        make_node(taints=[taint("gpu", "yes", pb.NO_SCHEDULE)]),
        UNTOLERATED,
    ),
    FilterCase(
        "one-of-two-untolerated",
        make_pod(tolerations=[tol("a", op=T.EXISTS)]),
        make_node(taints=[taint("a"), taint("b")]),
        UNTOLERATED,
    ),
]


@pytest.mark.parametrize("case", TAINT_CASES, ids=_ids(TAINT_CASES))
def test_taint_toleration_filter(case: FilterCase) -> None:
    assert tainttoleration.TaintToleration().filter(case.pod, case.node) == case.want


def test_taint_toleration_prefer_no_schedule_score() -> None:
    plugin = tainttoleration.TaintToleration()
    soft = pb.PREFER_NO_SCHEDULE
    pod = make_pod(tolerations=[tol("a", op=T.EXISTS, effect=soft)])
    nodes = [
        make_node(),
        make_node(taints=[taint("a", effect=soft)]),  # tolerated
        make_node(taints=[taint("b", effect=soft)]),
        make_node(taints=[taint("b", effect=soft), taint("c", effect=soft)]),
    ]
    raw = [plugin.score(pod, n) for n in nodes]
    assert raw == [0, 0, 1, 2]
    plugin.normalize_scores(pod, raw)
    assert raw == [100, 100, 50, 0]


# ---------------------------------------------------------------------------------------------
# Resource scores: integer math, 0..100
# ---------------------------------------------------------------------------------------------


@dataclass
class ScoreCase:
    id: str
    pod: PodInfo
    node: NodeInfo
    least: int
    most: int
    balanced: int


GB = GiB
SCORE_CASES = [
    ScoreCase("empty-node-zero-pod", make_pod(), make_node(cpu=4000, mem=4 * GB), 100, 0, 100),
    ScoreCase(
        "half-cpu-quarter-mem",
        make_pod(cpu=2000, mem=GB),
        make_node(cpu=4000, mem=4 * GB),
        62,
        37,
        87,
    ),
    ScoreCase(
        "counts-existing-usage",
        make_pod(cpu=1000, mem=GB),
        make_node(cpu=4000, mem=4 * GB, used=[used("a", cpu=1000, mem=GB)]),
        50,
        50,
        100,
    ),
    ScoreCase(
        "full-node", make_pod(cpu=4000, mem=4 * GB), make_node(cpu=4000, mem=4 * GB), 0, 100, 100
    ),
    ScoreCase(
        "best-effort-pool",
        make_pod(cpu=1000, mem=GB, qos=pb.QOS_BEST_EFFORT),
        make_node(cpu=4000, mem=4 * GB, be_cpu=2000, be_mem=2 * GB),
        50,
        50,
        100,
    ),
    ScoreCase("zero-capacity-node", make_pod(cpu=100), make_node(cpu=0, mem=0), 0, 0, 100),
]


@pytest.mark.parametrize("case", SCORE_CASES, ids=[c.id for c in SCORE_CASES])
def test_resource_scores(case: ScoreCase) -> None:
    weights = ResourceWeights()
    least = leastallocated.LeastAllocated(weights).score(case.pod, case.node)
    most = mostallocated.MostAllocated(weights).score(case.pod, case.node)
    balanced = balancedallocation.BalancedAllocation(weights).score(case.pod, case.node)
    assert (least, most, balanced) == (case.least, case.most, case.balanced)
    for s in (least, most, balanced):
        assert isinstance(s, int) and 0 <= s <= 100


# With a gpu weight, a pod that requests no GPU is scored on cpu and memory only (kube-scheduler
# skips a scalar resource the pod does not request); a GPU pod counts the node's GPUs.
GPU_WEIGHTED = ResourceWeights(cpu=1, memory=1, gpu=1)
GPU_SCORE_CASES = [
    ScoreCase(
        "cpu-pod-on-idle-gpu-node-ignores-gpus",
        make_pod(cpu=2000, mem=GB),
        make_node(cpu=4000, mem=4 * GB, gpus=8),
        62,
        37,
        87,
    ),
    ScoreCase(
        "cpu-pod-same-score-with-or-without-gpus",
        make_pod(cpu=2000, mem=GB),
        make_node(cpu=4000, mem=4 * GB, gpus=0),
        62,
        37,
        87,
    ),
    ScoreCase(
        "cpu-pod-ignores-gpus-in-use",
        make_pod(cpu=1000, mem=GB),
        make_node(
            cpu=4000,
            mem=4 * GB,
            gpus=8,
            used=[PodRequest("g", "g", 1000, GB, 8)],
        ),
        50,
        50,
        100,
    ),
    ScoreCase(
        "gpu-pod-counts-gpus",
        make_pod(cpu=2000, mem=GB, gpus=2),
        make_node(cpu=4000, mem=4 * GB, gpus=8),
        # least: (50 + 75 + 75) / 3; most: (50 + 25 + 25) / 3; balanced over 3 fractions.
        66,
        33,
        88,
    ),
]


@pytest.mark.parametrize("case", GPU_SCORE_CASES, ids=[c.id for c in GPU_SCORE_CASES])
def test_resource_scores_skip_resources_the_pod_does_not_request(case: ScoreCase) -> None:
    least = leastallocated.LeastAllocated(GPU_WEIGHTED).score(case.pod, case.node)
    most = mostallocated.MostAllocated(GPU_WEIGHTED).score(case.pod, case.node)
    balanced = balancedallocation.BalancedAllocation(GPU_WEIGHTED).score(case.pod, case.node)
    assert (least, most, balanced) == (case.least, case.most, case.balanced)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"cpu": -1}, "weight of cpu must be >= 0"),
        ({"cpu": 0, "memory": 0}, "at least one resource weight must be > 0"),
        ({"cpus": 1}, "unknown arg 'cpus'"),
        ({"cpu": "1"}, "arg 'cpu': '1' has the wrong type"),
        ({"cpu": True}, "wrong type"),
    ],
)
def test_resource_score_args_are_validated(raw: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        leastallocated.SPEC.parse_args(raw)


def test_weighted_resources() -> None:
    pod = make_pod(cpu=2000, mem=GB)
    n = make_node(cpu=4000, mem=4 * GB)
    cpu_only = ResourceWeights(cpu=1, memory=0)
    assert leastallocated.LeastAllocated(cpu_only).score(pod, n) == 50
    assert mostallocated.MostAllocated(cpu_only).score(pod, n) == 50
    assert Code.UNSCHEDULABLE > Code.SUCCESS


# NodeAffinity's PreFilter: the label index narrows the candidates; the filter still decides.
_INDEXED_NODES = {
    "a1": {"zone": "a", "hostname": "a1"},
    "a2": {"zone": "a", "hostname": "a2", "disk": "ssd"},
    "b1": {"zone": "b", "hostname": "b1", "disk": "ssd"},
}


@pytest.mark.parametrize(
    ("case", "pod", "want"),
    [
        ("no-constraint", make_pod(), None),
        ("selector", make_pod(selector={"zone": "a"}), {"a1", "a2"}),
        ("selectors-intersect", make_pod(selector={"zone": "a", "disk": "ssd"}), {"a2"}),
        ("selector-unknown-value", make_pod(selector={"zone": "z"}), set()),
        ("in-by-hostname", make_pod(required=[[req("hostname", Req.IN, "b1")]]), {"b1"}),
        (
            "in-values-union",
            make_pod(required=[[req("hostname", Req.IN, "a1", "b1")]]),
            {"a1", "b1"},
        ),
        (
            "terms-union",
            make_pod(required=[[req("zone", Req.IN, "b")], [req("hostname", Req.IN, "a1")]]),
            {"a1", "b1"},
        ),
        (
            "term-without-in-does-not-narrow",
            make_pod(required=[[req("zone", Req.IN, "b")], [req("disk", Req.EXISTS)]]),
            None,
        ),
        (
            "first-in-of-a-term-narrows",
            make_pod(required=[[req("disk", Req.EXISTS), req("zone", Req.IN, "a")]]),
            {"a1", "a2"},
        ),
        (
            "selector-and-terms-intersect",
            make_pod(selector={"disk": "ssd"}, required=[[req("zone", Req.IN, "a")]]),
            {"a2"},
        ),
    ],
)
def test_node_affinity_pre_filter(case: str, pod: PodInfo, want: set[str] | None) -> None:
    index = LabelIndex()
    for name, labels in _INDEXED_NODES.items():
        index.add(name, labels)
    got = nodeaffinity.NodeAffinity().pre_filter(pod, index)
    if want is None:
        assert got is None
    else:
        assert got is not None and set(got.nodes) == want
        assert got.reason == nodeaffinity.NOT_MATCHED
        # Never narrower than the filter: every node the filter passes is a candidate.
        plugin = nodeaffinity.NodeAffinity()
        for name, labels in _INDEXED_NODES.items():
            if plugin.filter(pod, make_node(labels=labels)) is None:
                assert name in got.nodes
