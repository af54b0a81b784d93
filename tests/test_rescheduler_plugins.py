"""Table tests of the rescheduler's detector/algorithm plugins and plan metrics, over ClusterViews
built directly (nodes and bound pods), judged by the real placement filters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from placement.framework import Framework, PluginConfigError, PodInfo, Profile
from placement.nodeinfo import NodeInfo, PodRequest
from placement.plugins import new_in_tree_registry
from protos.godel.v1 import objects_pb2 as pb
from services.rescheduler.framework import (
    Algorithm,
    ClusterView,
    Detector,
    Move,
    MoveVeto,
    RunningPod,
    allow_all,
    utilisation,
)
from services.rescheduler.metrics import (
    expected_gpu_fragmentation,
    free_nodes,
    gpu_fragmentation,
    utilisation_spread,
    whole_free_gpu_nodes,
)
from services.rescheduler.plugins import (
    binpacking,
    colocation,
    loadbalance,
    new_plugin_registry,
    topologyspread,
)
from services.rescheduler.plugins.targets import RankedNodes, RoomCache, utilisation_ceiling
from services.rescheduler.view import build_view as build_cluster_view
from services.rescheduler.view import fresh_loads
from tests.factories import GiB, job, job_affinity, node

FRAMEWORK = Framework(Profile(), new_in_tree_registry())
CPU = 10_000  # every node below has 10 CPUs unless told, so 1,000 milli-CPU is 10 %
BE = pb.QOS_BEST_EFFORT


# -- builders ---------------------------------------------------------------------------------


def mknode(
    name: str,
    *,
    gpus: int = 0,
    be_cpu: int = 0,
    labels: dict[str, str] | None = None,
    taint: str = "",
) -> pb.Node:
    n = node(name, cpu=CPU, mem=10 * GiB, gpus=gpus, be_cpu=be_cpu, be_mem=10 * GiB * bool(be_cpu))
    n.metadata.labels.update(labels or {})
    if taint:
        n.spec.taints.add(key=taint, value="x", effect=pb.NO_SCHEDULE)
    return n


def mkpod(
    name: str,
    on: str,
    *,
    cpu: int = 0,
    mem: int = 0,
    gpus: int = 0,
    job: str = "j",
    qos: int = pb.QOS_GUARANTEED,
    selector: dict[str, str] | None = None,
) -> pb.Pod:
    p = pb.Pod(metadata=pb.ObjectMeta(name=name))
    p.spec.job = job
    p.spec.node_name = on
    p.spec.qos = qos  # type: ignore[assignment]
    p.spec.template.requests.milli_cpu = cpu
    p.spec.template.requests.memory_bytes = mem
    p.spec.template.requests.gpus = gpus
    p.spec.template.node_selector.update(selector or {})
    return p


def build_view(
    nodes: list[pb.Node],
    pods: list[pb.Pod],
    scope: frozenset[str] = frozenset(),
    loads: dict[str, pb.NodeLoad] | None = None,
) -> ClusterView:
    """A view of copies: moves in it change neither ``nodes`` nor ``pods`` (cases share them)."""
    infos = {n.metadata.name: NodeInfo.from_node(n) for n in nodes}
    running = {}
    for original in pods:
        p = pb.Pod()
        p.CopyFrom(original)
        infos[p.spec.node_name].add_pod(PodRequest.from_pod(p))
        running[p.metadata.name] = RunningPod.of(p, PodInfo.from_pod(p))
    return ClusterView(
        nodes=infos, pods=running, jobs={}, framework=FRAMEWORK, scope=scope, loads=loads or {}
    )


def triples(moves: list[Move]) -> list[tuple[str, str, str]]:
    return [(m.pod, m.source, m.target) for m in moves]


def veto_pod(pod: str) -> MoveVeto:
    def veto(move: Move) -> str | None:
        return "protected" if move.pod == pod else None

    return veto


def placement(view: ClusterView) -> dict[str, list[str]]:
    return {name: [p.name for p in view.pods_on(name)] for name in sorted(view.nodes)}


@dataclass(frozen=True)
class Case:
    """A cluster, a plugin, and what its detect and reschedule should return."""

    nodes: list[pb.Node]
    pods: list[pb.Pod]
    plugin: Any
    detected: list[str]
    moves: list[tuple[str, str, str]]
    veto: MoveVeto = field(default=allow_all)
    scope: frozenset[str] = frozenset()  # empty: every node
    loads: dict[str, pb.NodeLoad] = field(default_factory=dict)  # measured, by node


# -- the utilisation formula ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        pytest.param({"cpu": 1, "memory": 2}, 0.6333333, id="original-cpu1-memory2"),
        pytest.param({"cpu": 1}, 0.3, id="cpu-only"),
        pytest.param({"cpu": 1, "gpu": 1}, 0.15, id="gpu-without-capacity-counts-as-0"),
    ],
)
def test_utilisation_formula(weights: dict[str, int], expected: float) -> None:
    n = node("n", cpu=10_000, mem=10)
    view = build_view(
        [n],
        [mkpod("a", "n", cpu=1_000, mem=6), mkpod("b", "n", cpu=2_000, mem=2)],
    )
    assert utilisation(view.nodes["n"], weights) == pytest.approx(expected, abs=1e-6)


# -- BinPacking -------------------------------------------------------------------------------

CPU_PACKING = binpacking.new(binpacking.Args(resources={"cpu": 1}))
GPU_PACKING = binpacking.new(binpacking.Args(resources={"gpu": 1}))

GPU_FRAGMENTED = Case(
    [mknode("g1", gpus=8), mknode("g2", gpus=8), mknode("g3", gpus=8)],
    [
        mkpod("four", "g1", gpus=4),
        mkpod("two", "g1", gpus=2),
        mkpod("one", "g1", gpus=1),
        mkpod("lone", "g2", gpus=1),
    ],
    GPU_PACKING,
    detected=["g2"],
    moves=[("lone", "g2", "g1")],
)
ONE_POD_VETOED = Case(
    [mknode("n1"), mknode("n2"), mknode("n3")],
    [
        mkpod("a", "n1", cpu=1_000),
        mkpod("b", "n1", cpu=1_000),
        mkpod("c", "n2", cpu=1_000),
        mkpod("d", "n3", cpu=4_000),
    ],
    CPU_PACKING,
    detected=["n2", "n1", "n3"],
    moves=[("c", "n2", "n3")],
    veto=veto_pod("b"),
)

BINPACKING_CASES = [
    pytest.param(
        Case(
            [mknode("n1"), mknode("n2"), mknode("n3")],
            [
                mkpod("a", "n1", cpu=1_000),
                mkpod("b", "n2", cpu=2_000),
                mkpod("c", "n3", cpu=4_000),
            ],
            CPU_PACKING,
            detected=["n1", "n2", "n3"],
            # n3 received pods, so it is not drained in turn.
            moves=[("a", "n1", "n3"), ("b", "n2", "n3")],
        ),
        id="three-partly-used-nodes-consolidate-onto-the-fullest",
    ),
    pytest.param(
        Case(
            [mknode("n1"), mknode("n2")],
            [mkpod("a", "n1", cpu=6_000), mkpod("b", "n2", cpu=7_000)],
            CPU_PACKING,
            detected=[],
            moves=[],
        ),
        id="no-op-when-every-node-is-above-threshold",
    ),
    pytest.param(
        Case(
            [mknode("n1"), mknode("empty"), mknode("full")],
            [mkpod("a", "n1", cpu=1_000), mkpod("f", "full", cpu=9_500)],
            CPU_PACKING,
            detected=["n1"],
            moves=[],
        ),
        id="never-targets-an-empty-node",
    ),
    pytest.param(
        Case(
            [mknode("n1"), mknode("n2")],
            [mkpod("a", "n1", cpu=4_000), mkpod("b", "n2", cpu=3_000)],
            CPU_PACKING,
            detected=["n2", "n1"],
            moves=[("b", "n2", "n1")],
        ),
        id="moves-only-toward-a-fuller-node",
    ),
    pytest.param(
        Case(
            [mknode("n1"), mknode("n2"), mknode("out")],
            [
                mkpod("a", "n1", cpu=1_000),
                mkpod("b", "n2", cpu=2_000),
                mkpod("o", "out", cpu=4_000),
            ],
            CPU_PACKING,
            detected=["n1", "n2"],
            # "out" is the fullest, and within the threshold, but out of scope.
            moves=[("a", "n1", "n2")],
            scope=frozenset({"n1", "n2"}),
        ),
        id="only-in-scope-nodes-are-detected-and-targeted",
    ),
    pytest.param(GPU_FRAGMENTED, id="gpu-one-pod-moves-and-a-whole-node-comes-free"),
    pytest.param(ONE_POD_VETOED, id="a-vetoed-pod-keeps-its-whole-node-in-place"),
    pytest.param(
        Case(
            [mknode("a-small", gpus=8), mknode("b-big", gpus=16), mknode("src", gpus=8)],
            [
                mkpod("s", "a-small", gpus=7),
                mkpod("b", "b-big", gpus=14),
                mkpod("pair", "src", gpus=2),
            ],
            GPU_PACKING,
            detected=["src"],
            # Both targets are 87.5 % used; only the 16-GPU node has 2 GPUs left.
            moves=[("pair", "src", "b-big")],
        ),
        id="gpu-mixed-node-sizes-the-fullest-node-with-room-is-found",
    ),
    pytest.param(
        Case(
            [mknode("n1"), mknode("tainted", taint="gpu-only"), mknode("n2")],
            [
                mkpod("a", "n1", cpu=1_000),
                mkpod("t", "tainted", cpu=6_000),
                mkpod("b", "n2", cpu=4_000),
            ],
            CPU_PACKING,
            detected=["n1", "n2"],
            moves=[("a", "n1", "n2")],
        ),
        id="never-targets-a-node-with-an-untolerated-taint",
    ),
    pytest.param(
        Case(
            [mknode("n1"), mknode("hdd"), mknode("ssd", labels={"disk": "ssd"})],
            [
                mkpod("a", "n1", cpu=1_000, selector={"disk": "ssd"}),
                mkpod("h", "hdd", cpu=6_000),
                mkpod("s", "ssd", cpu=3_000),
            ],
            CPU_PACKING,
            detected=["n1", "ssd"],
            moves=[("a", "n1", "ssd")],
        ),
        id="never-targets-a-node-the-pod-selector-excludes",
    ),
]


@pytest.mark.parametrize("case", BINPACKING_CASES)
def test_binpacking_detects_nodes_at_or_below_threshold(case: Case) -> None:
    view = build_view(case.nodes, case.pods, case.scope)
    assert [d.node for d in case.plugin.detect(view)] == case.detected


@pytest.mark.parametrize("case", BINPACKING_CASES)
def test_binpacking_moves(case: Case) -> None:
    view = build_view(case.nodes, case.pods, case.scope)
    moves = case.plugin.reschedule(view, case.plugin.detect(view), case.veto)
    assert triples(moves) == case.moves


# The original's case (its BinPacking check's table): 10-CPU nodes, cpu weighted; p3 moves
# from n2 to n1. (id, pods, allowed)
ORIGINAL_TARGET_RULE = [
    ("the source after the pod left is as full as the target: allowed",
     [mkpod("p1", "n1", cpu=2_000), mkpod("p2", "n2", cpu=2_000), mkpod("p3", "n2", cpu=2_000)],
     True),
    ("the source after the pod left is fuller than the target: refused",
     [mkpod("p1", "n1", cpu=2_000), mkpod("p2", "n2", cpu=3_000), mkpod("p3", "n2", cpu=2_000)],
     False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pods", "allowed"),
    [c[1:] for c in ORIGINAL_TARGET_RULE],
    ids=[c[0] for c in ORIGINAL_TARGET_RULE],
)
def test_binpacking_target_rule_is_the_originals(pods: list[pb.Pod], allowed: bool) -> None:
    view = build_view([mknode("n1"), mknode("n2")], pods)
    args = binpacking.Args(resources={"cpu": 1})
    assert binpacking.target_allowed(view, "p3", "n1", args) is allowed


def test_binpacking_drains_a_node_onto_one_less_full_than_it_was() -> None:
    """The original's first case through the algorithm: n1's pod is protected, so n1 stays; n2
    (40 %) drains onto n1 (20 %), which is at least as full as n2 once each pod has left it."""
    view = build_view(
        [mknode("n1"), mknode("n2")],
        [mkpod("p1", "n1", cpu=2_000), mkpod("p2", "n2", cpu=2_000), mkpod("p3", "n2", cpu=2_000)],
    )
    moves = CPU_PACKING.reschedule(view, CPU_PACKING.detect(view), veto_pod("p1"))
    assert triples(moves) == [("p2", "n2", "n1"), ("p3", "n2", "n1")]


def test_binpacking_undoes_a_node_it_cannot_drain_whole() -> None:
    case = ONE_POD_VETOED
    view = build_view(case.nodes, case.pods)
    case.plugin.reschedule(view, case.plugin.detect(view), case.veto)
    assert placement(view) == {"n1": ["a", "b"], "n2": [], "n3": ["c", "d"]}


def test_gpu_defragmentation_frees_a_whole_node() -> None:
    view = build_view(GPU_FRAGMENTED.nodes, GPU_FRAGMENTED.pods)
    before = (gpu_fragmentation(view), whole_free_gpu_nodes(view))
    GPU_PACKING.reschedule(view, GPU_PACKING.detect(view), allow_all)
    after = (gpu_fragmentation(view), whole_free_gpu_nodes(view))
    # Idle before: 1 on g1 and 7 on g2 (stranded), 8 on g3; after: 8 on g2 and 8 on g3.
    assert (before, after) == ((0.5, 1), (0.0, 2))


def test_expected_gpu_fragmentation_counts_slivers_the_running_shapes_cannot_use() -> None:
    """Shapes of the running pods: 1 card ×2, 2 cards, 4 cards. Free: 1 card on g1 (no 2- or
    4-card task fits: 1000 stranded for each), 7 on g2, 8 on g3: 2000 / (4 × 16000). Packing
    the lone pod onto g1 leaves nothing stranded."""
    view = build_view(GPU_FRAGMENTED.nodes, GPU_FRAGMENTED.pods)
    before = expected_gpu_fragmentation(view)
    GPU_PACKING.reschedule(view, GPU_PACKING.detect(view), allow_all)
    assert (before, expected_gpu_fragmentation(view)) == (0.03125, 0.0)


def test_expected_gpu_fragmentation_reads_the_cards_shares_hold() -> None:
    """Two 600 shares on cards 0 and 1 of a 2-card node: 400 free on each, and a 600 share (the
    only shape) fits neither: all 800 free milli stranded."""
    shares = [mkpod(f"s{i}", "g", gpus=1) for i in range(2)]
    for i, pod in enumerate(shares):
        pod.spec.template.gpu_milli = 600
        pod.spec.gpu_cards.append(i)
    view = build_view([mknode("g", gpus=2)], shares)
    assert expected_gpu_fragmentation(view) == 1.0


# -- LoadBalance ------------------------------------------------------------------------------

BALANCE = loadbalance.new(loadbalance.Args(resources={"cpu": 1}))
TEN_SMALL = [mkpod(f"p{i}", "hot", cpu=900) for i in range(10)]

LOADBALANCE_CASES = [
    pytest.param(
        Case(
            [mknode("hot"), mknode("warm"), mknode("cool")],
            [
                mkpod("x", "hot", cpu=5_000),
                mkpod("y", "hot", cpu=2_000),
                mkpod("z", "hot", cpu=2_000),
                mkpod("w", "warm", cpu=5_000),
            ],
            BALANCE,
            detected=["hot"],
            moves=[("y", "hot", "cool")],
        ),
        id="smallest-pod-that-suffices-goes-to-a-node-below-low",
    ),
    pytest.param(
        Case(
            [mknode("hot"), mknode("c1"), mknode("c2")],
            TEN_SMALL,
            BALANCE,
            detected=["hot"],
            # 90 % - 9 % is still above 80 %; c1 then holds 9 %, so c2 is the least utilised.
            moves=[("p0", "hot", "c1"), ("p1", "hot", "c2")],
        ),
        id="biggest-first-until-at-or-below-high-least-utilised-target-first",
    ),
    pytest.param(
        Case(
            [mknode("hot"), mknode("c1")],
            [mkpod(f"p{i}", "hot", cpu=1_000) for i in range(10)] + [mkpod("c", "c1", cpu=2_000)],
            BALANCE,
            detected=["hot"],
            # c1 reaches 30 % with p0, so it is no target for p1: hot would stay at 90 %, so
            # p0 stays too (moving load without cooling the hot node is churn).
            moves=[],
        ),
        id="a-target-that-reaches-low-stops-being-one-and-a-node-left-hot-keeps-its-pods",
    ),
    pytest.param(
        Case(
            [mknode("hot"), mknode("cool")],
            [mkpod("big", "hot", cpu=9_000), mkpod("c", "cool", cpu=2_000)],
            BALANCE,
            detected=["hot"],
            moves=[],
        ),
        id="never-pushes-a-target-above-high",
    ),
    pytest.param(
        Case(
            [mknode("hot"), mknode("mid")],
            [
                mkpod("x", "hot", cpu=5_000),
                mkpod("y", "hot", cpu=4_000),
                mkpod("m", "mid", cpu=5_000),
            ],
            BALANCE,
            detected=["hot"],
            moves=[],
        ),
        id="no-node-below-low-no-move",
    ),
    pytest.param(
        Case(
            [mknode("a"), mknode("b")],
            [mkpod("x", "a", cpu=8_000), mkpod("y", "b", cpu=1_000)],
            BALANCE,
            detected=[],
            moves=[],
        ),
        id="no-node-above-high-no-detection",
    ),
    pytest.param(
        Case(
            [mknode("hot"), mknode("cool", taint="reserved"), mknode("ok")],
            [
                mkpod("x", "hot", cpu=5_000),
                mkpod("y", "hot", cpu=4_000),
                mkpod("o", "ok", cpu=2_000),
            ],
            BALANCE,
            detected=["hot"],
            moves=[("y", "hot", "ok")],
        ),
        id="skips-a-tainted-cooler-node",
    ),
]


NET = 1_000_000_000  # every measured node's bandwidth below, bytes/s


def measured(
    cpu_percent: int, network_percent: int = 0, pods_cpu_percent: int | None = None
) -> pb.NodeLoad:
    """A node's measured load: percents of the 10-CPU nodes' CPU and of NET; what its pods use
    of the CPU when the agent measures them apart (a process node)."""
    load = pb.NodeLoad(
        milli_cpu=CPU * cpu_percent // 100,
        network_bytes_per_second=NET * network_percent // 100,
        network_capacity_bytes_per_second=NET,
    )
    if pods_cpu_percent is not None:
        load.pods_milli_cpu = CPU * pods_cpu_percent // 100
    return load


MEASURED_CASES = [
    pytest.param(
        Case(
            [mknode("hot"), mknode("cool")],
            [
                mkpod("a", "hot", cpu=2_000),
                mkpod("b", "hot", cpu=2_000),
                mkpod("c", "cool", cpu=2_000),
            ],
            BALANCE,
            detected=["hot"],
            # Requests say 40 %; it carries 90 %: each pod is estimated at 45 %, and the cool
            # node (10 % measured) takes one and stays at 55 %.
            moves=[("a", "hot", "cool")],
            loads={"hot": measured(90), "cool": measured(10)},
        ),
        id="hot-by-measured-load-though-its-requests-are-low",
    ),
    pytest.param(
        Case(
            [mknode("busy"), mknode("idle")],
            [mkpod("x", "busy", cpu=9_000)],
            BALANCE,
            detected=[],
            moves=[],
            loads={"busy": measured(20), "idle": measured(0)},
        ),
        id="requests-above-high-but-measured-load-low-is-not-hot",
    ),
    pytest.param(
        Case(
            [mknode("a"), mknode("b")],
            [mkpod("x", "a", cpu=5_000), mkpod("y", "a", cpu=4_000), mkpod("z", "b", cpu=1_000)],
            BALANCE,
            detected=["a"],
            # a reports nothing: judged by its requests (90 %); y (40 %) suffices.
            moves=[("y", "a", "b")],
            loads={"b": measured(10)},
        ),
        id="fallback-to-requests-where-no-load-is-known",
    ),
    pytest.param(
        Case(
            [mknode("hot"), mknode("t"), mknode("u")],
            [
                mkpod("p", "hot", cpu=3_000),
                mkpod("q", "hot", cpu=3_000),
                mkpod("tp", "t", cpu=1_000),
                mkpod("up", "u", cpu=5_000),
            ],
            BALANCE,
            detected=["hot"],
            # By requests t (10 %) would be the target; it carries 50 %, u only 10 %.
            moves=[("p", "hot", "u")],
            loads={"hot": measured(90), "t": measured(50), "u": measured(10)},
        ),
        id="targets-are-cool-by-measured-load-not-by-requests",
    ),
    pytest.param(
        Case(
            [mknode("n"), mknode("m")],
            [mkpod("a", "n", cpu=2_000), mkpod("b", "n", cpu=2_000)],
            BALANCE,
            detected=["n"],
            # CPU 40 % is fine; the network (90 %) is not: each pod carries half of it.
            moves=[("a", "n", "m")],
            loads={"n": measured(40, 90), "m": measured(10, 10)},
        ),
        id="hot-by-network",
    ),
    pytest.param(
        Case(
            [mknode("n"), mknode("m")],
            [mkpod("a", "n", cpu=2_000)],
            BALANCE,
            detected=["n"],
            # m (20 % network) would carry 115 % with a: no target.
            moves=[],
            loads={"n": measured(20, 95), "m": measured(10, 20)},
        ),
        id="a-target-never-goes-above-the-network-high-watermark",
    ),
    pytest.param(
        Case(
            [mknode("n"), mknode("m"), mknode("k")],
            [mkpod("a", "n", cpu=2_000), mkpod("b", "n", cpu=2_000)],
            BALANCE,
            detected=["n"],
            # m is cool by CPU but not by network (40 % >= 30 %): k takes a.
            moves=[("a", "n", "k")],
            loads={"n": measured(40, 90), "m": measured(5, 40), "k": measured(10, 10)},
        ),
        id="a-target-must-be-below-low-in-both-dimensions",
    ),
    pytest.param(
        Case(
            [mknode("hot"), mknode("cool")],
            [mkpod(f"p{i}", "hot", cpu=1_000) for i in range(4)],
            loadbalance.new(loadbalance.Args(resources={"cpu": 1}, network_high_percentage=50)),
            detected=["hot"],
            # 95 % network over four pods: 23.75 % each. Two must leave to reach <= 50 %; cool
            # is still below low (23.75 % < 30 %) after the first, and takes both (47.5 %).
            moves=[("p0", "hot", "cool"), ("p1", "hot", "cool")],
            loads={"hot": measured(40, 95), "cool": measured(0, 0)},
        ),
        id="network-watermarks-are-the-args",
    ),
    pytest.param(
        Case(
            [mknode("proc"), mknode("cool")],
            [mkpod("a", "proc", cpu=1_000), mkpod("b", "proc", cpu=1_000)],
            BALANCE,
            detected=["proc"],
            # The machine is at 95 %, its pods use 10 % of it: moving both would leave 85 %.
            moves=[],
            loads={"proc": measured(95, 0, 10), "cool": measured(0)},
        ),
        id="pods-that-do-not-cause-the-load-stay",
    ),
    pytest.param(
        Case(
            [mknode("proc"), mknode("cool")],
            [mkpod("a", "proc", cpu=1_000), mkpod("b", "proc", cpu=1_000)],
            BALANCE,
            detected=["proc"],
            # Its pods use 40 % of the 90 %: each 20 %; one leaving brings it to 70 %.
            moves=[("a", "proc", "cool")],
            loads={"proc": measured(90, 0, 40), "cool": measured(0)},
        ),
        id="pods-measured-apart-from-the-machine",
    ),
]


@pytest.mark.parametrize("case", LOADBALANCE_CASES + MEASURED_CASES)
def test_loadbalance_detects_nodes_above_high(case: Case) -> None:
    view = build_view(case.nodes, case.pods, case.scope, case.loads)
    assert [d.node for d in case.plugin.detect(view)] == case.detected


@pytest.mark.parametrize("case", LOADBALANCE_CASES + MEASURED_CASES)
def test_loadbalance_moves(case: Case) -> None:
    view = build_view(case.nodes, case.pods, case.scope, case.loads)
    moves = case.plugin.reschedule(view, case.plugin.detect(view), case.veto)
    assert triples(moves) == case.moves


def test_loadbalance_detection_says_which_watermark_and_basis() -> None:
    view = build_view(
        [mknode("n"), mknode("r")],
        [mkpod("x", "r", cpu=9_000)],
        loads={"n": measured(85, 90)},
    )
    reasons = {d.node: d.reason for d in BALANCE.detect(view)}
    assert reasons == {
        "n": "load 85.0% > 80%, network 90.0% > 80% (measured)",
        "r": "load 90.0% > 80% (requests)",
    }


# -- TopologySpread ---------------------------------------------------------------------------


def zones(*spec: tuple[str, str]) -> list[pb.Node]:
    """Nodes by (name, zone); an empty zone means the node has no zone label."""
    return [mknode(name, labels={"zone": z} if z else {}) for name, z in spec]


THREE_ZONES = zones(("a1", "a"), ("a2", "a"), ("b1", "b"), ("c1", "c"))
SIX_IN_A = [mkpod(f"j{i}", "a1" if i < 3 else "a2", cpu=500) for i in range(6)]
SPREAD = topologyspread.new(topologyspread.Args(topology_key="zone"))

SPREAD_CASES = [
    pytest.param(
        Case(
            THREE_ZONES,
            SIX_IN_A,
            SPREAD,
            detected=["a1", "a2"],
            moves=[
                ("j0", "a1", "b1"),
                ("j1", "a1", "c1"),
                ("j2", "a1", "b1"),
                ("j3", "a2", "c1"),
            ],
        ),
        id="six-pods-in-one-zone-four-moves-two-into-each-other-zone",
    ),
    pytest.param(
        Case(
            THREE_ZONES,
            SIX_IN_A,
            topologyspread.new(topologyspread.Args(topology_key="zone", max_skew=2)),
            detected=["a1", "a2"],
            moves=[("j0", "a1", "b1"), ("j1", "a1", "c1"), ("j2", "a1", "b1")],
        ),
        id="max-skew-2-stops-at-3-2-1",
    ),
    pytest.param(
        Case(
            THREE_ZONES,
            [mkpod("j0", "a1"), mkpod("j1", "a2"), mkpod("j2", "b1"), mkpod("j3", "c1")],
            SPREAD,
            detected=[],
            moves=[],
        ),
        id="within-max-skew-nothing",
    ),
    pytest.param(
        Case(
            THREE_ZONES,
            [mkpod("j0", "a1"), mkpod("j1", "a1")],
            topologyspread.new(topologyspread.Args(topology_key="zone", min_pods=3)),
            detected=[],
            moves=[],
        ),
        id="job-below-min-pods-ignored",
    ),
    pytest.param(
        Case(
            [*THREE_ZONES, *zones(("bare", ""))],
            [mkpod(f"j{i}", "bare") for i in range(4)] + [mkpod("k", "a1")],
            SPREAD,
            detected=[],
            moves=[],
        ),
        id="node-without-the-key-is-in-no-domain",
    ),
    pytest.param(
        Case(
            [*zones(("a1", "a"), ("c1", "c")), mknode("b1", labels={"zone": "b"}, taint="t")],
            [mkpod(f"j{i}", "a1", cpu=500) for i in range(3)] + [mkpod("fill", "c1", cpu=9_800)],
            SPREAD,
            detected=["a1"],
            moves=[],
        ),
        id="no-fitting-node-in-the-sparse-zones-stops",
    ),
]


@pytest.mark.parametrize("case", SPREAD_CASES)
def test_topologyspread_detects_the_crowded_domain(case: Case) -> None:
    view = build_view(case.nodes, case.pods, case.scope)
    assert [d.node for d in case.plugin.detect(view)] == case.detected


@pytest.mark.parametrize("case", SPREAD_CASES)
def test_topologyspread_moves(case: Case) -> None:
    view = build_view(case.nodes, case.pods, case.scope)
    moves = case.plugin.reschedule(view, case.plugin.detect(view), case.veto)
    assert triples(moves) == case.moves


def test_topologyspread_detection_names_the_jobs_pods_in_the_crowded_zone() -> None:
    view = build_view(THREE_ZONES, SIX_IN_A)
    assert [d.pods for d in SPREAD.detect(view)] == [("j0", "j1", "j2"), ("j3", "j4", "j5")]


def test_spread_share_before_and_after() -> None:
    view = build_view(
        THREE_ZONES, [*SIX_IN_A, mkpod("k0", "a1", job="k"), mkpod("k1", "b1", job="k")]
    )
    before = topologyspread.spread_share(view, "zone", 1, 2)
    SPREAD.reschedule(view, SPREAD.detect(view), allow_all)
    after = topologyspread.spread_share(view, "zone", 1, 2)
    assert (before, after) == (0.5, 1.0)


# -- CoLocation -------------------------------------------------------------------------------


def colo(mode: str) -> colocation.CoLocation:
    return colocation.new(colocation.Args(mode=mode, resources={"cpu": 1}))


COLOCATION_CASES = [
    pytest.param(
        Case(
            [
                mknode("hot", be_cpu=4_000),
                mknode("calm50", be_cpu=4_000),
                mknode("calm20", be_cpu=4_000),
                mknode("nobe"),
            ],
            [
                mkpod("g", "hot", cpu=8_000),
                mkpod("e", "hot", cpu=1_000, qos=BE),
                mkpod("g50", "calm50", cpu=5_000),
                mkpod("g20", "calm20", cpu=2_000),
            ],
            colo("separate"),
            detected=["hot"],
            moves=[("e", "hot", "calm20")],
        ),
        id="separate-moves-best-effort-to-the-least-guaranteed-loaded-node",
    ),
    pytest.param(
        Case(
            [mknode("hot", be_cpu=4_000), mknode("calm")],
            [mkpod("g", "hot", cpu=8_000), mkpod("e", "hot", cpu=1_000, qos=BE)],
            colo("separate"),
            detected=["hot"],
            moves=[],
        ),
        id="separate-no-best-effort-room-no-move",
    ),
    pytest.param(
        Case(
            [mknode("hot", be_cpu=4_000), mknode("calm", be_cpu=4_000)],
            [mkpod("g", "hot", cpu=6_000), mkpod("e", "hot", cpu=1_000, qos=BE)],
            colo("separate"),
            detected=[],
            moves=[],
        ),
        id="separate-under-threshold-nothing",
    ),
    pytest.param(
        Case(
            [
                mknode("be", be_cpu=4_000),
                mknode("g30", be_cpu=4_000),
                mknode("g60", be_cpu=4_000),
                mknode("idle", be_cpu=4_000),
            ],
            [
                mkpod("e1", "be", cpu=1_000, qos=BE),
                mkpod("e2", "be", cpu=1_000, qos=BE),
                mkpod("a", "g30", cpu=3_000),
                mkpod("b", "g60", cpu=6_000),
            ],
            colo("together"),
            detected=["be"],
            moves=[("e1", "be", "g60"), ("e2", "be", "g60")],
        ),
        id="together-moves-best-effort-onto-the-fullest-guaranteed-node",
    ),
    pytest.param(
        Case(
            [mknode("be", be_cpu=8_000), mknode("g60", be_cpu=4_000)],
            [
                mkpod("e1", "be", cpu=1_000, qos=BE),
                mkpod("e2", "be", cpu=6_000, qos=BE),
                mkpod("b", "g60", cpu=6_000),
            ],
            colo("together"),
            detected=["be"],
            moves=[],
        ),
        id="together-all-or-nothing-when-one-pod-has-no-room",
    ),
]


@pytest.mark.parametrize("case", COLOCATION_CASES)
def test_colocation_detects(case: Case) -> None:
    view = build_view(case.nodes, case.pods, case.scope)
    assert [d.node for d in case.plugin.detect(view)] == case.detected


@pytest.mark.parametrize("case", COLOCATION_CASES)
def test_colocation_moves(case: Case) -> None:
    view = build_view(case.nodes, case.pods, case.scope)
    moves = case.plugin.reschedule(view, case.plugin.detect(view), case.veto)
    assert triples(moves) == case.moves


# -- args and registry ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plugin", "raw", "field_named"),
    [
        pytest.param("BinPacking", {"resources": {"disk": 1}}, "resources", id="unknown-resource"),
        pytest.param("BinPacking", {"resources": {"cpu": -1}}, "resources", id="negative-weight"),
        pytest.param("BinPacking", {"resources": {"cpu": 0}}, "resources", id="weights-all-zero"),
        pytest.param("BinPacking", {"resources": ["cpu"]}, "resources", id="weights-not-a-map"),
        pytest.param(
            "BinPacking", {"threshold_percentage": 101}, "threshold_percentage", id="threshold>100"
        ),
        pytest.param("BinPacking", {"pool": "spot"}, "pool", id="unknown-pool"),
        pytest.param(
            "LoadBalance",
            {"high_percentage": 30, "low_percentage": 30},
            "low_percentage",
            id="low-not-below-high",
        ),
        pytest.param(
            "LoadBalance",
            {"network_high_percentage": 50, "network_low_percentage": 60},
            "network_low_percentage",
            id="network-low-not-below-high",
        ),
        pytest.param(
            "LoadBalance",
            {"network_high_percentage": 120},
            "network_high_percentage",
            id="network-high>100",
        ),
        pytest.param(
            "LoadBalance",
            {"network_high_percentage": "80%"},
            "arg 'network_high_percentage'",
            id="network-high-not-an-int",
        ),
        pytest.param("TopologySpread", {}, "topology_key", id="topology-key-required"),
        pytest.param(
            "TopologySpread", {"topology_key": "zone", "max_skew": 0}, "max_skew", id="skew<1"
        ),
        pytest.param("CoLocation", {"mode": "mixed"}, "mode", id="unknown-mode"),
        pytest.param(
            "CoLocation",
            {"guaranteed_threshold_percentage": -1},
            "guaranteed_threshold_percentage",
            id="threshold<0",
        ),
    ],
)
def test_invalid_args_are_refused_naming_the_field(
    plugin: str, raw: dict[str, Any], field_named: str
) -> None:
    with pytest.raises(PluginConfigError, match=f"{plugin}: {field_named}"):
        new_plugin_registry().get(plugin).parse_args(raw)


@pytest.mark.parametrize(
    "name", ["BinPacking", "CoLocation", "LoadBalance", "TopologySpread"], ids=str
)
def test_registry_builds_each_plugin_as_detector_and_algorithm(name: str) -> None:
    raw = {"topology_key": "zone"} if name == "TopologySpread" else {}
    plugin = new_plugin_registry().get(name).build(raw)
    assert (plugin.NAME, isinstance(plugin, Detector), isinstance(plugin, Algorithm)) == (
        name,
        True,
        True,
    )


# -- target search helpers --------------------------------------------------------------------


def test_ranked_nodes_rerank_one_node_keeps_the_order() -> None:
    values = {"a": 0.5, "b": 0.2, "c": 0.9}
    ranked = RankedNodes(values.__getitem__, values, descending=True)
    values["b"] = 0.95
    ranked.rank("b")
    ranked.discard("c")
    assert list(ranked.items()) == [(0.95, "b"), (0.5, "a")]


@pytest.mark.parametrize(
    ("ceiling", "expected"),
    [
        pytest.param(1.0, ["c", "d", "a", "b"], id="all"),
        pytest.param(0.75, ["a", "b"], id="ties-at-the-ceiling-included"),
        pytest.param(0.1, [], id="none"),
    ],
)
def test_ranked_nodes_items_below_ceiling(ceiling: float, expected: list[str]) -> None:
    values = {"a": 0.75, "b": 0.5, "c": 1.0, "d": 0.875}
    ranked = RankedNodes(values.__getitem__, values, descending=True)
    assert [name for _, name in ranked.items_below(ceiling)] == expected


@pytest.mark.parametrize(
    ("freed", "expected"),
    [
        pytest.param(False, False, id="no-room-is-remembered"),
        pytest.param(True, True, id="forgotten-once-the-node-loses-a-pod"),
    ],
)
def test_room_cache(freed: bool, expected: bool) -> None:
    view = build_view([mknode("n")], [mkpod("big", "n", cpu=9_000)])
    pod = PodRequest("p", "g", 2_000, 0, 0)
    room = RoomCache()
    room.has_room(view.nodes["n"], pod)
    view.nodes["n"].remove_pod("big")
    if freed:
        room.freed("n")
    assert ("n" not in room.lacking(pod)) is expected


@pytest.mark.parametrize(
    ("req", "expected"),
    [
        pytest.param(PodRequest("p", "g", 0, 0, 2), 1 - 2 / 16, id="gpu-share-of-largest-node"),
        pytest.param(PodRequest("p", "g", 1_000, 0, 0), None, id="no-weighted-resource"),
        pytest.param(PodRequest("p", "be", 0, 0, 2), None, id="other-pool"),
    ],
)
def test_utilisation_ceiling(req: PodRequest, expected: float | None) -> None:
    ceiling = utilisation_ceiling(req, {"gpu": 1}, "g", [10_000, 10, 16])
    assert ceiling == (None if expected is None else pytest.approx(expected))


# -- metrics ----------------------------------------------------------------------------------

GPU_CLUSTER = build_view(
    [mknode("g1", gpus=8), mknode("g2", gpus=8), mknode("g3", gpus=8), mknode("cpu")],
    [
        mkpod("six", "g1", gpus=6, cpu=2_000),
        mkpod("two", "g2", gpus=2, cpu=6_000),
        mkpod("web", "cpu", cpu=1_000),
    ],
)


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        # Idle GPUs: 2 on g1 and 6 on g2 (both partly used), 8 on g3: 8 of 16 stranded.
        pytest.param(gpu_fragmentation, 0.5, id="gpu-fragmentation"),
        # Shapes: 6 cards with 2 CPUs, 2 cards with 6 CPUs, once each. Free: 2 cards and 8 CPUs
        # on g1 (no 6-card task: 2000 stranded), 6 cards and 4 CPUs on g2 (no 2-card task for
        # want of CPU: 6000), 8 and 10 on g3 (none): 8000 / (2 × 16000).
        pytest.param(expected_gpu_fragmentation, 0.25, id="expected-gpu-fragmentation"),
        pytest.param(free_nodes, 1, id="free-nodes"),
        pytest.param(whole_free_gpu_nodes, 1, id="whole-free-gpu-nodes"),
        # CPU utilisation of the nodes with pods: 0.2, 0.6, 0.1 -> mean 0.3.
        pytest.param(
            lambda v: utilisation_spread(v, {"cpu": 1}),
            (((0.2 - 0.3) ** 2 + (0.6 - 0.3) ** 2 + (0.1 - 0.3) ** 2) / 3) ** 0.5,
            id="utilisation-spread",
        ),
    ],
)
def test_metrics(metric: Any, expected: float) -> None:
    assert metric(GPU_CLUSTER) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        pytest.param(gpu_fragmentation, 0.0, id="gpu-fragmentation-nothing-idle"),
        pytest.param(expected_gpu_fragmentation, 0.0, id="expected-nothing-free"),
        pytest.param(lambda v: utilisation_spread(v, {"cpu": 1}), 0.0, id="spread-no-pods"),
    ],
)
def test_metrics_of_a_cluster_without_idle_gpus_or_pods(metric: Any, expected: float) -> None:
    assert metric(build_view([mknode("cpu")], [])) == expected


# -- the rules the node filters cannot see ----------------------------------------------------


@pytest.mark.parametrize(
    ("target", "refused"),
    [("a2", ""), ("b1", "JobLevelAffinity: node is in rack=b, the job's pods are in rack=a")],
    ids=["same-rack", "other-rack"],
)
def test_a_job_level_affinity_pod_moves_only_within_its_domain(target: str, refused: str) -> None:
    nodes = [mknode(n, labels={"rack": n[0]}) for n in ("a1", "a2", "b1")]
    view = build_view(nodes, [mkpod("p", "a1", cpu=1000, job="g")])
    view.jobs["g"] = job_affinity(job("g"), ["rack"])
    status = view.fits("p", target)
    if refused:
        assert status is not None and refused in status.reasons[0]
    else:
        assert status is None


def _with_rules(pod: pb.Pod, app: str, *, anti_on: str = "", spread_on: str = "") -> pb.Pod:
    """``pod`` labelled app=<app>; required anti-affine to its own app on ``anti_on``, or
    spread (max skew 1, never anywhere) by ``spread_on``."""
    pod.metadata.labels["app"] = app
    pod.spec.template.labels["app"] = app
    tpl = pod.spec.template
    if anti_on:
        term = tpl.affinity.pod_anti_affinity.required.add(topology_key=anti_on)
        term.label_selector.add(key="app", operator=pb.LabelSelectorRequirement.IN, values=[app])
    if spread_on:
        c = tpl.topology_spread_constraints.add(max_skew=1, topology_key=spread_on)
        c.when_unsatisfiable = pb.TopologySpreadConstraint.DO_NOT_SCHEDULE
        c.label_selector.add(key="app", operator=pb.LabelSelectorRequirement.IN, values=[app])
    return pod


def _zoned_view() -> ClusterView:
    """Zones z1 (two nodes), z2 (two), z3, z4 (empty). Pods a (z1) and b (z2): app=web, each
    anti-affine to web in its zone; c: app=web, no rule, in z3; d1-d3: app=batch spread by
    zone, one in each of z1-z3."""
    names = ["z1-a", "z1-b", "z2-a", "z2-b", "z3-a", "z4-a"]
    nodes = [mknode(n, labels={"zone": n[:2]}) for n in names]
    pods = [
        _with_rules(mkpod("a", "z1-a"), "web", anti_on="zone"),
        _with_rules(mkpod("b", "z2-a"), "web", anti_on="zone"),
        _with_rules(mkpod("c", "z3-a"), "web"),
        *(_with_rules(mkpod(f"d{i}", f"z{i}-a"), "batch", spread_on="zone") for i in (1, 2, 3)),
    ]
    return build_view(nodes, pods)


@pytest.mark.parametrize(
    ("pod", "target", "refused"),
    [
        ("b", "z1-b", "InterPodAffinity"),  # its rule: a web pod is in z1
        ("b", "z4-a", ""),
        ("b", "z2-b", ""),  # within its own zone: itself does not count
        ("c", "z1-b", "InterPodAffinity"),  # a's rule keeps web out of z1
        ("c", "z4-a", ""),
        ("d1", "z2-b", "PodTopologySpread"),  # z2 would hold 2, z1 none
        ("d1", "z4-a", ""),  # one in each of z2-z4
    ],
)
def test_moves_are_judged_by_inter_pod_affinity_and_spread(
    pod: str, target: str, refused: str
) -> None:
    """The rules that count pods beyond the target node constrain the rescheduler as they
    constrain a shard and the Binder (the placement library's topology filters)."""
    status = _zoned_view().fits(pod, target)
    if refused:
        assert status is not None and status.plugin == refused
    else:
        assert status is None


def test_the_topology_counts_follow_the_moves_of_a_round() -> None:
    view = _zoned_view()
    assert view.fits("c", "z4-a") is None
    view.move("b", "z4-a")  # b's rule now keeps web out of z4, and no longer out of z2
    refused = view.fits("c", "z4-a")
    assert refused is not None and refused.plugin == "InterPodAffinity"
    assert view.fits("c", "z2-b") is None
    view.remove("a")
    assert view.fits("c", "z1-b") is None


def test_stale_or_foreign_loads_are_no_measurement() -> None:
    """A report older than the rescheduler's limit counts as none (its node falls back to its
    requests), and a report of a node the view does not hold is dropped."""
    loads = {
        "fresh": pb.NodeLoad(milli_cpu=9_000, measured_ms=100_000),
        "stale": pb.NodeLoad(milli_cpu=9_000, measured_ms=10_000),
        "gone": pb.NodeLoad(milli_cpu=9_000, measured_ms=100_000),
    }
    kept = fresh_loads(loads, now_ms=110_000, max_age_ms=60_000)
    assert set(kept) == {"fresh", "gone"}
    view = build_cluster_view([mknode("fresh"), mknode("stale")], [], [], [], FRAMEWORK, loads=kept)
    assert set(view.loads) == {"fresh"}
    assert [d.node for d in BALANCE.detect(view)] == ["fresh"]  # stale: 0 % requested


def test_a_simulated_move_holds_cards_of_its_target_and_frees_its_own() -> None:
    """The rescheduler's simulation keeps GPU cards as the shards do: a share moved holds a card
    of its target (best fit), its old card comes free, and a target whose cards cannot hold it
    fails the GpuCards filter."""
    a, b, c = (mknode(name, gpus=2) for name in ("a", "b", "c"))
    pods = []
    for name, on, milli, card in (("s", "a", 400, 1), ("t", "b", 500, 0), ("full", "c", 0, 0)):
        p = mkpod(name, on, cpu=100, gpus=2 if name == "full" else 1)
        p.spec.template.gpu_milli = milli
        p.spec.gpu_cards.extend([0, 1] if name == "full" else [card])
        pods.append(p)
    view = build_view([a, b, c], pods)
    blocked = view.fits("s", "c")
    assert blocked is not None and blocked.reasons == ("no GPU card with enough free share",)
    assert view.fits("s", "b") is None
    view.move("s", "b")
    assert list(view.nodes["a"].card_used) == [0, 0]
    assert list(view.nodes["b"].card_used) == [900, 0]  # beside t: the best fit
