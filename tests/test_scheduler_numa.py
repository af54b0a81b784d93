"""NumaTopology, table-driven in kube-scheduler's manner: (pod's NUMA policy and request, node's
sockets/NUMA nodes and what NUMA-bound pods hold) -> filter status and the NUMA ids chosen; the
score's packing order; the Binder's and audit's verification of a claimed assignment; and the
unit search handing NUMA nodes out one by one through the feasible-node cache."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from placement.framework import Code, Framework, PodInfo, Profile, UnitInfo
from placement.nodeinfo import NUMA_EXCLUSIVE, NUMA_SINGLE, NodeInfo, PodRequest
from placement.plugins import new_in_tree_registry, numatopology
from placement.plugins.numatopology import (
    EXCEEDS_NUMA_NODE,
    EXCEEDS_SOCKET,
    NO_FREE_NUMA,
    NO_NUMA_ROOM,
    NO_SHARED_ROOM,
    NO_TOPOLOGY,
    NumaFailure,
    choose,
    verify,
)
from placement.search import UnitScheduler
from placement.snapshot import Snapshot
from protos.godel.v1 import objects_pb2 as pb
from tests.factories import GiB, job, node, numa_job, pods_of, with_numa

NONE = 0
SINGLE = int(NUMA_SINGLE)
EXCLUSIVE = int(NUMA_EXCLUSIVE)


def numa_node(
    *, sockets: int = 2, per_socket: int = 1, cpu: int = 8000, gpus_per_numa: int = 0
) -> NodeInfo:
    n = node("n1", cpu=cpu, mem=32 * GiB)
    if sockets:
        with_numa(n, sockets=sockets, per_socket=per_socket, gpus_per_numa=gpus_per_numa)
    return NodeInfo.from_node(n)


def held(
    name: str, policy: int, ids: tuple[int, ...], *, cpu: int = 1000, gpu: int = 0
) -> PodRequest:
    """A bound pod holding NUMA nodes."""
    return PodRequest(name, "g", cpu, GiB, gpu, numa_policy=policy, numa_nodes=ids)


def shared(name: str, cpu: int) -> PodRequest:
    return PodRequest(name, "g", cpu, GiB, 0)


def pod(policy: int, *, cpu: int = 1000, gpus: int = 0, qos: int = pb.QOS_GUARANTEED) -> PodInfo:
    j = numa_job(job("p", cpu=cpu, mem=GiB, qos=qos), policy, gpus=gpus)
    return PodInfo.from_pod(pods_of(j)[0])


@dataclass
class FitCase:
    id: str
    pod: PodInfo
    node: NodeInfo
    used: list[PodRequest] = field(default_factory=list)
    # Expected: the NUMA ids chosen, or (code, reason) of the filter's failure.
    ids: tuple[int, ...] | None = None
    code: Code = Code.SUCCESS
    reason: str = ""


FIT_CASES = [
    FitCase("none: no NUMA-bound pod here passes", pod(NONE, cpu=7000), numa_node(), ids=()),
    FitCase("single: fits one NUMA node", pod(SINGLE, cpu=2000), numa_node(), ids=(0,)),
    FitCase(
        "single: needing two NUMA nodes across sockets fails for good",
        pod(SINGLE, cpu=6000), numa_node(),
        code=Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reason=EXCEEDS_NUMA_NODE,
    ),
    FitCase(
        "exclusive: two NUMA nodes across sockets fails for good",
        pod(EXCLUSIVE, cpu=6000), numa_node(),
        code=Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reason=EXCEEDS_SOCKET,
    ),
    FitCase(
        "exclusive: two NUMA nodes of one socket pass",
        pod(EXCLUSIVE, cpu=6000), numa_node(sockets=1, per_socket=2), ids=(0, 1),
    ),
    FitCase(
        "single: four GPUs on one NUMA node pass",
        pod(SINGLE, cpu=1000, gpus=4), numa_node(sockets=2, per_socket=2, cpu=16000, gpus_per_numa=4),
        ids=(0,),
    ),
    FitCase(
        "single: five GPUs exceed every NUMA node",
        pod(SINGLE, gpus=5), numa_node(sockets=2, per_socket=2, cpu=16000, gpus_per_numa=4),
        code=Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reason=EXCEEDS_NUMA_NODE,
    ),
    FitCase(
        "single: GPUs come from a NUMA node with GPUs left",
        pod(SINGLE, gpus=2), numa_node(sockets=2, per_socket=2, cpu=16000, gpus_per_numa=4),
        used=[held("a", SINGLE, (0,), gpu=3000)], ids=(1,),  # milli-GPU: 3 cards
    ),
    FitCase(
        "exclusive: the NUMA node nobody holds",
        pod(EXCLUSIVE, cpu=2000), numa_node(), used=[held("x", EXCLUSIVE, (0,))], ids=(1,),
    ),
    FitCase(
        "exclusive: every NUMA node held, resolvable",
        pod(EXCLUSIVE, cpu=2000), numa_node(),
        used=[held("x", EXCLUSIVE, (0,)), held("y", EXCLUSIVE, (1,))],
        code=Code.UNSCHEDULABLE, reason=NO_FREE_NUMA,
    ),
    FitCase(
        "exclusive: a NUMA node with a single-NUMA pod is not free",
        pod(EXCLUSIVE, cpu=2000), numa_node(), used=[held("s", SINGLE, (0,), cpu=100)], ids=(1,),
    ),
    FitCase(
        "exclusive: packs the socket already in use",
        pod(EXCLUSIVE, cpu=2000), numa_node(sockets=2, per_socket=2, cpu=16000),
        used=[held("x", EXCLUSIVE, (0,))], ids=(1,),
    ),
    FitCase(
        "single: an exclusively held NUMA node is not shared",
        pod(SINGLE, cpu=2000), numa_node(),
        used=[held("x", EXCLUSIVE, (0,)), held("s", SINGLE, (1,), cpu=3000)],
        code=Code.UNSCHEDULABLE, reason=NO_NUMA_ROOM,
    ),
    FitCase(
        "single: best fit, the fuller NUMA node",
        pod(SINGLE, cpu=1000), numa_node(),
        used=[held("a", SINGLE, (0,), cpu=1000), held("b", SINGLE, (1,), cpu=2500)], ids=(1,),
    ),
    FitCase(
        "none: must fit outside exclusively held NUMA nodes",
        pod(NONE, cpu=4500), numa_node(), used=[held("x", EXCLUSIVE, (0,), cpu=1000)],
        code=Code.UNSCHEDULABLE, reason=NO_SHARED_ROOM,
    ),
    FitCase(
        "none: fits beside an exclusive pod",
        pod(NONE, cpu=3000), numa_node(), used=[held("x", EXCLUSIVE, (0,), cpu=1000)], ids=(),
    ),
    FitCase(
        "exclusive: refused when the shared pods would lose their room",
        pod(EXCLUSIVE, cpu=1000), numa_node(), used=[shared("s", 5000)],
        code=Code.UNSCHEDULABLE, reason=NO_SHARED_ROOM,
    ),
    FitCase(
        "best-effort pods are never NUMA-bound",
        pod(SINGLE, cpu=100, qos=pb.QOS_BEST_EFFORT), numa_node(), ids=(),
    ),
    FitCase(
        "single: a node without topology fails for good",
        pod(SINGLE), numa_node(sockets=0),
        code=Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reason=NO_TOPOLOGY,
    ),
    FitCase(
        "exclusive: a node without topology fails for good",
        pod(EXCLUSIVE), numa_node(sockets=0),
        code=Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reason=NO_TOPOLOGY,
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", FIT_CASES, ids=[c.id for c in FIT_CASES])
def test_numa_fit(case: FitCase) -> None:
    for r in case.used:
        case.node.add_pod(r)
    status = numatopology.NumaTopology().filter(case.pod, case.node)
    found = choose(case.node, case.pod.req)
    if case.code == Code.SUCCESS:
        assert status is None
        assert found == case.ids
        # What the filter admits, the Binder's verification accepts.
        assert verify(case.node, case.pod.req, found) is None
    else:
        assert status is not None
        assert (status.code, status.reasons, status.plugin) == (
            case.code,
            (case.reason,),
            numatopology.NAME,
        )
        assert isinstance(found, NumaFailure)


@dataclass
class ScoreCase:
    id: str
    pod: PodInfo
    # Nodes as what NUMA-bound pods hold on them; expected order, best first.
    nodes: dict[str, list[PodRequest]]
    best_first: list[str]


SCORE_CASES = [
    ScoreCase(
        "single: the partly used NUMA node first",
        pod(SINGLE, cpu=1000),
        {"empty": [], "half": [held("a", SINGLE, (0,), cpu=2000)]},
        ["half", "empty"],
    ),
    ScoreCase(
        "exclusive: the node with NUMA nodes already held first",
        pod(EXCLUSIVE, cpu=1000),
        {"empty": [], "one-held": [held("x", EXCLUSIVE, (0,))]},
        ["one-held", "empty"],
    ),
    ScoreCase("none: no preference", pod(NONE), {"a": [], "b": []}, ["a", "b"]),
]


@pytest.mark.parametrize("case", SCORE_CASES, ids=[c.id for c in SCORE_CASES])
def test_numa_score_packs(case: ScoreCase) -> None:
    plugin = numatopology.NumaTopology()
    scores = {}
    for name, used in case.nodes.items():
        info = numa_node()
        for r in used:
            info.add_pod(r)
        scores[name] = plugin.score(case.pod, info)
    assert sorted(scores, key=lambda n: (-scores[n], n)) == case.best_first


@dataclass
class VerifyCase:
    id: str
    pod: PodInfo
    ids: tuple[int, ...]
    used: list[PodRequest]
    reason: str | None  # substring of the refusal; None: accepted


VERIFY_CASES = [
    VerifyCase("exclusive: a free NUMA node", pod(EXCLUSIVE), (1,), [], None),
    VerifyCase(
        "exclusive: held by another pod",
        pod(EXCLUSIVE), (0,), [held("x", EXCLUSIVE, (0,))],
        "NUMA node 0 is held exclusively by pod 'x'",
    ),
    VerifyCase(
        "single: on a NUMA node held exclusively",
        pod(SINGLE), (0,), [held("x", EXCLUSIVE, (0,))], "held exclusively by pod 'x'",
    ),
    VerifyCase("a NUMA node that does not exist", pod(SINGLE), (7,), [], "no NUMA node 7"),
    VerifyCase("single: two NUMA nodes", pod(SINGLE), (0, 1), [], "holds one NUMA node, not 2"),
    VerifyCase("exclusive: across sockets", pod(EXCLUSIVE), (0, 1), [], "more than one socket"),
    VerifyCase(
        "exclusive: on a NUMA node with a single-NUMA pod",
        pod(EXCLUSIVE), (0,), [held("s", SINGLE, (0,))], "holds single-NUMA pods",
    ),
    VerifyCase("single: no room left", pod(SINGLE, cpu=3000), (0,),
               [held("s", SINGLE, (0,), cpu=2000)], "no room"),
    VerifyCase("a pod without a policy claims NUMA nodes", pod(NONE), (0,), [], "no NUMA policy"),
    VerifyCase("a NUMA-bound pod with no assignment", pod(SINGLE), (), [], "no NUMA node assigned"),
]  # fmt: skip


@pytest.mark.parametrize("case", VERIFY_CASES, ids=[c.id for c in VERIFY_CASES])
def test_numa_verify(case: VerifyCase) -> None:
    info = numa_node()
    for r in case.used:
        info.add_pod(r)
    why = verify(info, case.pod.req, case.ids)
    if case.reason is None:
        assert why is None
    else:
        assert why is not None and case.reason in why


def test_node_accounting_follows_pods_added_and_removed() -> None:
    info = numa_node()
    info.add_pod(held("x", EXCLUSIVE, (0,)))
    info.add_pod(held("s", SINGLE, (1,), cpu=500))
    clone = info.clone()
    assert (clone.numa_owner, clone.numa_used[1][0], clone.numa_pods) == ({0: "x"}, 500, 2)
    info.remove_pod("x")
    info.remove_pod("s")
    assert (info.numa_owner, info.numa_used, info.numa_pods, info.numa_bound) == (
        {},
        {},
        0,
        [0, 0, 0],
    )
    assert clone.numa_owner == {0: "x"}  # the clone is its own
    assert clone.numa_used[1][0] == 500 and clone.numa_bound[0] > 0
    # And the other way: what a clone takes leaves its source as it was.
    again = info.clone()
    again.add_pod(held("y", EXCLUSIVE, (1,)))
    again.add_pod(held("t", SINGLE, (0,), cpu=300))
    assert (info.numa_owner, info.numa_used, info.numa_pods) == ({}, {}, 0)
    assert again.numa_owner == {1: "y"} and again.numa_used[0][0] == 300


def test_search_hands_out_each_exclusive_numa_node_once() -> None:
    """Three exclusive pods of one template, one node of two NUMA nodes: the feasible-node cache
    re-checks the chosen node after each placement, so two pods get one NUMA node each and the
    third finds none (a gang of 3 therefore fails whole; min_member 2 places two)."""
    snapshot = Snapshot.of([numa_node()])
    framework = Framework(Profile(), new_in_tree_registry())
    pods = [PodInfo.from_pod(p) for p in pods_of(numa_job(job("x", replicas=3), EXCLUSIVE))]
    result = UnitScheduler(framework).schedule(UnitInfo("x", 2, 0, 0, pods), snapshot)
    assert result.success
    assert sorted(p.numa_nodes for p in result.placements) == [(0,), (1,)]
    assert NO_FREE_NUMA in next(iter(result.unplaced.values()))
    owners = snapshot.infos["n1"].numa_owner
    assert {owners[p.numa_nodes[0]] for p in result.placements} == {
        p.pod for p in result.placements
    }

    gang = [PodInfo.from_pod(p) for p in pods_of(numa_job(job("g", replicas=3), EXCLUSIVE))]
    fresh = Snapshot.of([numa_node()])
    failed = UnitScheduler(framework).schedule(UnitInfo("g", 3, 0, 0, gang), fresh)
    assert not failed.success and not failed.placements
    assert fresh.infos["n1"].numa_owner == {}  # the failed gang's NUMA nodes are given back


def test_a_replacement_holds_no_numa_nodes_until_placed() -> None:
    """The rescheduler's simulated replacement of a bound pod starts without its NUMA nodes."""
    bound = pods_of(numa_job(job("x"), EXCLUSIVE))[0]
    bound.spec.numa_nodes.append(1)
    info = PodInfo.from_pod(bound)
    assert info.req.numa_nodes == (1,)
    replacement = info.renamed("x-0-r1", b"k")
    assert (replacement.req.numa_nodes, replacement.req.numa_policy) == ((), EXCLUSIVE)
