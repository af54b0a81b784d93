"""GpuDefrag (services/rescheduler/plugins/gpudefrag.py): moves of GPU shares and whole-card
pods that lower the cluster's expected GPU fragmentation, BinPacking's drains kept only when
they do not raise it, and the round's card choice for a share made by the shards' score policy.
Table-driven over views of real NodeInfos, with the placement library's real filters."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from placement.framework import Framework, PluginConfigError, PodInfo, Profile
from placement.gpufrag import FgdBalancePolicy
from placement.nodeinfo import NodeInfo, PodRequest
from placement.plugins import gpufragmentation, new_in_tree_registry
from protos.godel.v1 import objects_pb2 as pb
from services.rescheduler.framework import ClusterView, Move, RunningPod, allow_all
from services.rescheduler.metrics import (
    expected_gpu_fragmentation,
    running_mix,
    whole_free_gpu_nodes,
)
from services.rescheduler.plugins import new_plugin_registry
from services.rescheduler.plugins.gpudefrag import Args, GpuDefrag
from services.rescheduler.round import PLANNED, Policy, RoundRunner
from services.rescheduler.service import ReschedulerConfig, build_policy
from tests.factories import GiB, node

FRAMEWORK = Framework(Profile(), new_in_tree_registry())
DEFRAG = GpuDefrag(Args())

# (name, node, milli-GPU: < 1000 a share of one card, else whole cards; the cards it holds;
# milli-CPU)
Pod = tuple[str, str, int, tuple[int, ...], int]


def share(name: str, on: str, milli: int, card: int, cpu: int = 1000) -> Pod:
    return (name, on, milli, (card,), cpu)


def whole(name: str, on: str, cards: tuple[int, ...], cpu: int = 1000) -> Pod:
    return (name, on, 1000 * len(cards), cards, cpu)


def gpu_pod(spec: Pod) -> pb.Pod:
    name, on, milli, cards, cpu = spec
    p = pb.Pod(metadata=pb.ObjectMeta(name=name))
    p.spec.job = name
    p.spec.node_name = on
    p.spec.template.requests.milli_cpu = cpu
    p.spec.template.requests.memory_bytes = GiB
    p.spec.template.requests.gpus = 1 if milli < 1000 else milli // 1000
    if milli < 1000:
        p.spec.template.gpu_milli = milli
    p.spec.gpu_cards.extend(cards)
    p.status.phase = pb.POD_RUNNING
    return p


def view_of(nodes: dict[str, int], pods: list[Pod]) -> ClusterView:
    """``nodes``: name -> cards; every node has 10 CPUs and 10 GiB."""
    infos = {
        name: NodeInfo.from_node(node(name, cpu=10_000, mem=10 * GiB, gpus=cards))
        for name, cards in nodes.items()
    }
    running = {}
    for spec in pods:
        p = gpu_pod(spec)
        infos[p.spec.node_name].add_pod(PodRequest.from_pod(p))
        running[p.metadata.name] = RunningPod.of(p, PodInfo.from_pod(p))
    return ClusterView(nodes=infos, pods=running, jobs={}, framework=FRAMEWORK)


def cards_of(view: ClusterView) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {
        pod: (name, req.gpu_cards)
        for name, info in sorted(view.nodes.items())
        for pod, req in sorted(info.pods.items())
    }


@dataclass(frozen=True)
class Case:
    nodes: dict[str, int]
    pods: list[Pod]
    moves: list[tuple[str, str, str]]  # (pod, from, to)
    before: float  # expected GPU fragmentation
    after: float


CASES = {
    # Mix {300 ×2, 2 cards}: a and b each strand all 1,700 free for the 2-card task. a's share
    # beside b's: b 400|1000 strands 1,400, a is whole.
    "shares-come-together": Case(
        {"a": 2, "b": 2, "c": 2},
        [share("s1", "a", 300, 0), share("s2", "b", 300, 0), whole("w", "c", (0, 1))],
        [("s1", "a", "b")],
        3400 / (3 * 3400),
        1400 / (3 * 3400),
    ),
    # Mix {1 card ×2, 2 cards}: each lone card strands 1,000 for the 2-card task.
    "whole-cards-come-together": Case(
        {"a": 2, "b": 2, "c": 2},
        [whole("w1", "a", (0,)), whole("w2", "b", (1,)), whole("w3", "c", (0, 1))],
        [("w1", "a", "b")],
        2000 / (3 * 2000),
        0.0,
    ),
    # Mix {600 ×2}: a 600 share beside the other's strands as much as it frees (400 each way,
    # counted twice): no move lowers the sum, but BinPacking's drain of a, which does not raise
    # it, frees a whole node.
    "a-neutral-drain-frees-a-node": Case(
        {"a": 2, "b": 2},
        [share("s1", "a", 600, 0), share("s2", "b", 600, 0)],
        [("s1", "a", "b")],
        1600 / (2 * 2800),
        1600 / (2 * 2800),
    ),
    # Mix {1 card ×2, 1 card of 8.5 CPUs}: c's free card lacks the CPU for the big task (1,000
    # stranded); a's pod fills it, and a comes whole.
    "a-card-without-cpu-gets-filled": Case(
        {"a": 2, "b": 2, "c": 2},
        [whole("w1", "a", (0,)), whole("w2", "b", (0,)), whole("big", "c", (0,), cpu=8500)],
        [("w1", "a", "c")],
        1000 / (3 * 3000),
        0.0,
    ),
    # Mix {500 ×4}: every free card holds a 500 share, and both nodes are 75 % used.
    "nothing-stranded": Case(
        {"a": 2, "b": 2},
        [
            share("s1", "a", 500, 0),
            share("s2", "a", 500, 0),
            share("s3", "a", 500, 1),
            share("s4", "b", 500, 1),
            share("s5", "b", 500, 1),
            share("s6", "b", 500, 0),
        ],
        [],
        0.0,
        0.0,
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_gpu_defrag_moves_only_where_expected_fragmentation_falls(case: Case) -> None:
    view = view_of(case.nodes, case.pods)
    view.share_policy = RoundRunner().learn_shapes(view)
    before = expected_gpu_fragmentation(view)
    moves = DEFRAG.reschedule(view, DEFRAG.detect(view), allow_all)
    assert [(m.pod, m.source, m.target) for m in moves] == case.moves
    assert (before, expected_gpu_fragmentation(view)) == pytest.approx((case.before, case.after))


def test_gpu_defrag_detects_stranded_and_lightly_used_gpu_nodes_least_used_first() -> None:
    view = view_of(
        {"a": 2, "b": 2, "c": 2, "d": 2, "e": 0},
        [
            share("s1", "a", 600, 0),  # 30 %, 400 stranded
            whole("w1", "b", (0,)),  # 50 %, nothing stranded for a 600 share
            whole("w2", "c", (0, 1)),  # full: nothing free, nothing stranded
        ],
    )
    detected = DEFRAG.detect(view)
    assert [d.node for d in detected] == ["a", "b"]
    # Mix {600, 1 card, 2 cards}: a strands 400 for the share and the card, 1,400 for two cards.
    assert detected[0].reason == "expected fragmentation 733 milli-GPU, GPU 30.0% used"


def test_a_drain_that_would_raise_expected_fragmentation_is_undone() -> None:
    """Mix {300, 500 ×2}: src's 300 share on either of dst's 500 cards strands 200 of it for
    the 500s (counted twice), where nothing was stranded: src's drain is undone and the view is
    as it was, every share on its own card."""
    view = view_of(
        {"src": 2, "dst": 2},
        [
            share("s300", "src", 300, 0),
            share("s500a", "dst", 500, 0),
            share("s500b", "dst", 500, 1),
        ],
    )
    view.share_policy = RoundRunner().learn_shapes(view)
    untouched = cards_of(view)
    assert [d.node for d in DEFRAG.detect(view)] == ["src", "dst"]
    assert DEFRAG.reschedule(view, DEFRAG.detect(view), allow_all) == []
    assert cards_of(view) == untouched


def test_a_drain_that_keeps_expected_fragmentation_frees_a_node() -> None:
    """Mix {300, 500, 200}: src's 300 share goes to dst's 800 card (fgd-balance), leaving 500|500
    where every shape still fits: kept, src whole."""
    view = view_of(
        {"src": 2, "dst": 2},
        [share("s300", "src", 300, 0), share("s500", "dst", 500, 0), share("s200", "dst", 200, 1)],
    )
    view.share_policy = RoundRunner().learn_shapes(view)
    moves = DEFRAG.reschedule(view, DEFRAG.detect(view), allow_all)
    assert [(m.pod, m.target) for m in moves] == [("s300", "dst")]
    assert cards_of(view)["s300"] == ("dst", (1,))
    assert whole_free_gpu_nodes(view) == 1
    assert expected_gpu_fragmentation(view) == 0.0


def test_a_moved_share_takes_the_card_the_shards_score_would_pick() -> None:
    """The round's moves choose a share's card by the GpuFragmentation score's policy over the
    running pods' shapes (fgd-balance, the default), not by best fit: dst's 800 card, not its 500 one."""
    view = view_of(
        {"src": 2, "dst": 2},
        [share("s300", "src", 300, 0), share("s500", "dst", 500, 0), share("s200", "dst", 200, 1)],
    )
    runner = RoundRunner()
    view.share_policy = runner.learn_shapes(view)
    assert view.share_policy is not None and view.share_policy.name == "fgd-balance"
    view.move("s300", "dst")
    assert cards_of(view)["s300"] == ("dst", (1,))
    # Back on its own node, it holds its own card again.
    view.move("s300", "src")
    assert cards_of(view)["s300"] == ("src", (0,))


def test_the_built_in_gpu_defrag_dry_run_lowers_expected_fragmentation_with_shares() -> None:
    [config] = [c for c in ReschedulerConfig().policy_configs() if c.name == "gpu-defrag"]
    policy: Policy = build_policy(config)
    view = view_of(
        {"a": 2, "b": 2, "c": 2},
        [share("s1", "a", 300, 0), share("s2", "b", 300, 0), whole("w", "c", (0, 1))],
    )
    plan = RoundRunner().run(policy, view, generation=1, dry_run=True, trigger="rpc")
    assert plan.outcome == PLANNED, plan.message
    assert [(m.pod, m.target) for m in plan.moves] == [("s1", "b")]
    # The simulated replacement lands where the plan sent it, on the card the score picks.
    assert plan.simulated == {"s1": "b"}
    assert plan.after is not None
    assert plan.before.expected_gpu_fragmentation == pytest.approx(1 / 3)
    assert plan.after.expected_gpu_fragmentation == pytest.approx(1400 / (3 * 3400))
    assert plan.after.whole_free_gpu_nodes == plan.before.whole_free_gpu_nodes + 1
    proto = plan.to_proto()
    assert proto.after.expected_gpu_fragmentation < proto.before.expected_gpu_fragmentation


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"threshold_percentage": 101}, "threshold_percentage"),
        ({"threshold_percentage": "50"}, "threshold_percentage"),
        ({"resources": {"gpu": 1}}, "resources"),
    ],
)
def test_bad_gpu_defrag_args_are_refused_naming_the_field(
    raw: dict[str, object], named: str
) -> None:
    with pytest.raises(PluginConfigError) as refused:
        new_plugin_registry().get("GpuDefrag").parse_args(raw)
    message = str(refused.value)
    assert message.startswith("GpuDefrag: ") and named in message and "\n" not in message


def test_moves_are_vetoed_by_the_checks() -> None:
    view = view_of(
        {"a": 2, "b": 2, "c": 2},
        [share("s1", "a", 300, 0), share("s2", "b", 300, 0), whole("w", "c", (0, 1))],
    )

    def protect_s1(move: Move) -> str | None:
        return "protected" if move.pod == "s1" else None

    moves = DEFRAG.reschedule(view, DEFRAG.detect(view), protect_s1)
    # s1 stays; s2 comes to it instead.
    assert [(m.pod, m.source, m.target) for m in moves] == [("s2", "b", "a")]


def test_the_simulation_learns_the_running_shapes_afresh_each_round() -> None:
    """The scheduling profile's GpuFragmentation score (the simulation's searches pick shares'
    cards by it) holds exactly the running pods' mix after ``learn_shapes``, whatever an
    earlier round taught it."""
    runner = RoundRunner()
    earlier = view_of({"a": 2}, [share("old", "a", 700, 0)])
    runner.learn_shapes(earlier)
    view = view_of(
        {"a": 2, "b": 2},
        [share("s1", "a", 300, 0), share("s2", "b", 300, 0), whole("w", "b", (1,))],
    )
    policy = runner.learn_shapes(view)
    # The score's card choice for a share: its current policy, answers remembered from scoring.
    assert policy is not None and runner.scheduling.share_policy() is policy
    score = runner.scheduling.plugins[gpufragmentation.NAME]
    assert isinstance(score, gpufragmentation.GpuFragmentation)
    assert isinstance(score.policy, FgdBalancePolicy)
    assert score.policy.mix == running_mix(view)
