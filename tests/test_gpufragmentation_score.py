"""GpuFragmentation: the Score plugin that places GPU pods where the learned shape mix's
fragmentation grows least, the card choice for a share it shares with ``gpu.choose_cards``, and
its profile args. Expected values are hand-computed in the comments."""

from __future__ import annotations

import pytest

from placement import gpu
from placement.framework import Framework, PluginConfigError, PodInfo, Profile, UnitInfo
from placement.gpufrag import FgdBalancePolicy, FgdFillPolicy, ShapeMix, TaskShape
from placement.nodeinfo import NodeInfo, PodRequest
from placement.plugins import new_in_tree_registry
from placement.plugins.gpufragmentation import SPEC, GpuFragmentation, GpuFragmentationArgs
from placement.search import UnitScheduler
from placement.snapshot import Snapshot
from tests.factories import gpu_node


def card_node(name: str, used: tuple[int, ...], model: str = "V100M32") -> NodeInfo:
    """A node whose cards hold ``used`` milli-GPU each (one holder pod per used card)."""
    info = NodeInfo.from_node(gpu_node(name, len(used), model, cpu=64_000))
    for index, milli in enumerate(used):
        if milli:
            assert info.add_pod(
                PodRequest(f"{name}-h{index}", "g", 100, 0, milli, gpu_cards=(index,))
            )
    return info


def share_pod(name: str, milli: int, models: tuple[str, ...] = ()) -> PodInfo:
    req = PodRequest(name, "g", 100, 0, milli, gpu_models=models)
    return PodInfo(name, "j", 1, req)


@pytest.mark.parametrize(
    ("milli", "nodes", "expected"),
    [
        # Mix {600}: on the card with 600 free the pod fills it (growth 0: 50). On an empty card
        # it leaves 400 that a 600 cannot use: fragmentation 0→400, unfillable 400→400, growth
        # 400 milli = 40 points below 50.
        (600, {"gap": (400,), "empty": (0,)}, {"gap": 50, "empty": 10}),
        # Mix {500}: either node leaves nothing a 500 cannot use: equal scores.
        (500, {"half": (500,), "empty": (0,)}, {"half": 50, "empty": 50}),
        # A card with 300 free holds no 600: the policy finds no room (the filter says so), 0.
        (600, {"full": (700,), "gap": (400,)}, {"full": 0, "gap": 50}),
        # A pod asking no GPU, mix {itself}: it strands no GPU on either node (64 CPUs for its
        # 100m): growth 0, 50 on both.
        (0, {"gap": (400,), "empty": (0,)}, {"gap": 50, "empty": 50}),
    ],
    ids=["fills-the-gap", "tie", "no-room", "cpu-only"],
)
def test_score(milli: int, nodes: dict[str, tuple[int, ...]], expected: dict[str, int]) -> None:
    plugin = GpuFragmentation(GpuFragmentationArgs(policy="fgd-fill"))
    pod = share_pod("p", milli)
    got = {name: plugin.score(pod, card_node(name, used)) for name, used in nodes.items()}
    assert got == expected


def test_the_fgd_balance_score_charges_the_sliver_too() -> None:
    """Mix {600}, policy fgd-balance: on the gap the pod fills the card (every term
    grows 0: 50). On the empty card it leaves 400: fgd-fill's growth 400 as above, plus 10 x
    the card waste (the common sizes 600 and 1000 fill none of 400: 0 -> 400), plus 10 x the
    GPU that CPU cannot feed (64 CPUs for 100m per 600 milli: none): growth 4,400 milli, 400
    left free. The score is the policy's order at a scale no 0..100 score reaches: minus
    1,000 x (growth x 1,000,000 + free GPU left)."""
    plugin = GpuFragmentation(GpuFragmentationArgs(policy="fgd-balance"))
    pod = share_pod("p", 600)
    got = {
        name: plugin.score(pod, card_node(name, used))
        for name, used in {"gap": (400,), "empty": (0,)}.items()
    }
    assert got == {"gap": 0, "empty": -1_000 * (4_400 * 1_000_000 + 400)}


def test_the_fgd_balance_score_outweighs_every_other_default_score() -> None:
    """One milli of growth, or one milli of free GPU left, at the profile's weight, is more
    than every other default score at its best together: they only break its ties."""
    others = sum(weight for name, weight in Profile().scores if name != "GpuFragmentation")
    gpu_weight = dict(Profile().scores)["GpuFragmentation"]
    plugin = GpuFragmentation(GpuFragmentationArgs(policy="fgd-balance"))
    pod = share_pod("p", 500)
    # Mix {500}: both nodes take it with growth 0; "half" is left with 0 free, "empty" 500.
    half, empty = (
        plugin.score(pod, card_node(n, u)) for n, u in (("half", (500,)), ("empty", (0,)))
    )
    assert (half - empty) * gpu_weight > 100 * others


def test_a_cpu_only_pod_is_not_observed_without_gpu_nodes() -> None:
    """In a cluster without GPU nodes a pod asking no GPU costs an attribute read per node:
    one score for every node (no ranking change), nothing learned."""
    plugin = GpuFragmentation(GpuFragmentationArgs())
    plain = NodeInfo.from_node(gpu_node("plain", 0, "", cpu=64_000))
    pod = share_pod("cpu", 0)
    plugin.observe(pod)
    assert plugin.score(pod, plain) == 0
    assert plugin.share_policy() is not None
    assert not len(plugin._window)
    assert plugin.score_generation() == 0


def cpu_node(name: str, used: tuple[int, ...], cpu: int) -> NodeInfo:
    info = NodeInfo.from_node(gpu_node(name, len(used), "V100M32", cpu=cpu))
    for index, milli in enumerate(used):
        if milli:
            assert info.add_pod(
                PodRequest(f"{name}-h{index}", "g", 1_000, 0, milli, gpu_cards=(index,))
            )
    return info


@pytest.mark.parametrize(
    ("nodes", "best"),
    [
        # Mix {a 1000 share asking 8 CPUs}, then the CPU-only pod (8 CPUs) counted too. On
        # "poor" (2 free cards, 16 CPUs - 2 of the holders' = 14 free) it leaves 6 CPUs: one
        # card's worth, so a card is stranded. On "rich" (2 cards, 104 CPUs) nothing is. On
        # "plain" (no cards) nothing is and no GPU is left free: the best.
        ({"poor": ((0, 0, 1000, 1000), 16_000), "rich": ((0, 0), 104_000)}, "rich"),
        ({"rich": ((0, 0), 104_000), "plain": ((), 104_000)}, "plain"),
        # Two GPU nodes that strand nothing: the one left with less free GPU (packing).
        ({"two": ((0, 0), 104_000), "one": ((0, 1000), 104_000)}, "one"),
    ],
    ids=["strands-a-card", "no-cards-first", "packs"],
)
def test_a_cpu_only_pod_scores_by_the_gpu_it_strands(
    nodes: dict[str, tuple[tuple[int, ...], int]], best: str
) -> None:
    plugin = GpuFragmentation(GpuFragmentationArgs(policy="fgd-balance"))
    plugin.score(PodInfo("g", "j", 1, PodRequest("g", "g", 8_000, 0, 1000)), card_node("w", (0,)))
    pod = PodInfo("c", "j", 1, PodRequest("c", "g", 8_000, 0, 0))
    scores = {
        name: plugin.score(pod, cpu_node(name, used, cpu)) for name, (used, cpu) in nodes.items()
    }
    assert max(scores, key=scores.__getitem__) == best
    assert len(set(scores.values())) == len(scores)  # no tie: the other scores decide nothing


def test_a_rebuilt_policy_moves_the_score_generation() -> None:
    plugin = GpuFragmentation(GpuFragmentationArgs(policy="fgd-balance"))
    before = plugin.score_generation()
    plugin.observe(share_pod("a", 500))  # a new shape: rebuilt
    after = plugin.score_generation()
    plugin.observe(share_pod("b", 500))  # a known shape, no refresh due: kept
    assert after > before
    assert plugin.score_generation() == after


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # best-fit: the shares left free of GPU, CPU and memory, out of 3: gap 0 + 0.997 + 1
        # (100 - 66), empty 0.4 + 0.997 + 1 (100 - 79).
        ("best-fit", {"gap": 34, "empty": 21}),
        # packing: gap is tier 0 (a shared card), empty tier 2.
        ("packing", {"gap": 100, "empty": 12}),
    ],
)
def test_comparison_policies(policy: str, expected: dict[str, int]) -> None:
    plugin = GpuFragmentation(GpuFragmentationArgs(policy=policy))
    pod = share_pod("p", 600)
    nodes = {"gap": (400,), "empty": (0,)}
    got = {name: plugin.score(pod, card_node(name, used)) for name, used in nodes.items()}
    assert got == expected
    assert plugin.share_policy() is None  # their card is the best fit


def shape(milli: int) -> TaskShape:
    return TaskShape(100, 0, 1, milli)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # Free [500, 700], a 400 share, mix {300}: best fit takes card 0 (100 left). fgd-fill:
        # card 0 → [100, 700]: fragmentation 100, unfillable 200, from 0 + 300: growth 0;
        # card 1 → [500, 300]: fragmentation 0, unfillable 200: growth -100. Card 1.
        (None, (0,)),
        (FgdFillPolicy(ShapeMix(((shape(300), 1),))), (1,)),
    ],
    ids=["best-fit", "fgd-fill"],
)
def test_choose_cards_with_a_mix(policy: FgdFillPolicy | None, expected: tuple[int, ...]) -> None:
    node = card_node("n", (500, 300))
    assert gpu.choose_cards(node, share_pod("p", 400).req, policy) == expected


def test_choose_cards_falls_back_to_best_fit_when_the_policy_finds_no_room() -> None:
    node = card_node("n", (500, 300))
    hungry = PodRequest("p", "g", 128_000, 0, 400)  # more CPU than the node has: no choice
    policy = FgdFillPolicy(ShapeMix(((shape(300), 1),)))
    assert gpu.choose_cards(node, hungry, policy) == (0,)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            {"policy": "spread"},
            "policy: must be one of fgd-balance, fgd-fill, fgd, best-fit, packing",
        ),
        ({"window": 0}, "window: must be at least 1"),
        ({"refresh": 0}, "refresh: must be at least 1"),
        ({"policy": 3}, "arg 'policy': 3 has the wrong type"),
        ({"mix": {}}, "unknown arg 'mix'"),
    ],
)
def test_bad_args_are_refused_naming_the_field(args: dict[str, object], words: str) -> None:
    with pytest.raises(PluginConfigError, match=words):
        SPEC.parse_args(args)


@pytest.mark.parametrize("policy", ["fgd-balance", "fgd-fill", "fgd", "best-fit", "packing"])
def test_each_policy_is_accepted(policy: str) -> None:
    assert SPEC.parse_args({"policy": policy}).policy == policy


def test_the_default_profile_scores_gpu_fragmentation() -> None:
    assert "GpuFragmentation" in dict(Profile().scores)


def test_the_search_places_a_share_where_fragmentation_grows_least() -> None:
    """Default profile: LeastAllocated prefers the empty nodes, GpuFragmentation the card with
    exactly the share free (see ``test_score``); a node of another model would score as well
    but the pod does not accept it (GpuCards)."""
    snapshot = Snapshot.of(
        [
            card_node("empty", (0,)),
            card_node("gap", (400,)),
            card_node("other-model", (400,), model="A100"),
            card_node("empty2", (0, 0)),
        ]
    )
    framework = Framework(Profile(), new_in_tree_registry())
    pod = share_pod("p", 600, models=("V100M32",))
    result = UnitScheduler(framework).schedule(UnitInfo("j", 1, 0, 0, [pod]), snapshot)
    assert [(p.node, p.gpu_cards) for p in result.placements] == [("gap", (0,))]


def test_the_search_proposes_the_card_the_score_assumed() -> None:
    """After three 300 shares the mix is {300: 3, 400: 1}; a 400 share on free [500, 700]:
    card 0 → [100, 700] grows fragmentation 300 + 100 and unfillable not at all (growth 100);
    card 1 → [500, 300] grows fragmentation 0 + 300 (growth 0). Best fit would take card 0."""
    snapshot = Snapshot.of([card_node("n", (500, 300))])
    framework = Framework(Profile(), new_in_tree_registry())
    plugin = framework.plugins["GpuFragmentation"]
    assert isinstance(plugin, GpuFragmentation)
    for i in range(3):
        plugin.observe(share_pod(f"small-{i}", 300))
    pod = share_pod("p", 400)
    result = UnitScheduler(framework).schedule(UnitInfo("j", 1, 0, 0, [pod]), snapshot)
    assert [(p.node, p.gpu_cards) for p in result.placements] == [("n", (1,))]
    assert gpu.choose_cards(card_node("m", (500, 300)), pod.req) == (0,)


def test_the_fgd_balance_policy_is_the_share_policy_when_chosen() -> None:
    plugin = GpuFragmentation(GpuFragmentationArgs(policy="fgd-balance"))
    plugin.score(share_pod("p", 400), card_node("n", (0,)))
    share_policy = plugin.share_policy()
    assert share_policy is not None and share_policy.name == "fgd-balance"
    assert isinstance(plugin.policy, FgdBalancePolicy)


def test_the_share_policy_is_the_scores_latest() -> None:
    """The search asks for the share policy when it places a pod, after the score has observed
    that pod: the policy's mix holds its shape."""
    framework = Framework(Profile(), new_in_tree_registry())
    plugin = framework.plugins["GpuFragmentation"]
    assert isinstance(plugin, GpuFragmentation)
    plugin.score(share_pod("p", 400), card_node("n", (0,)))
    policy = framework.share_policy()
    assert policy is not None and isinstance(plugin.policy, FgdBalancePolicy)
    assert plugin.policy.mix.shapes == ((shape(400), 1),)
    # The share policy answers as the plugin's latest policy does.
    state = gpu.node_state(card_node("m", (0, 300)), "g")
    assert policy.choose(state, shape(400)) == plugin.policy.choose(state, shape(400))


def test_a_shares_card_is_remembered_from_scoring_not_chosen_again() -> None:
    """The card choice for a share on the node the search picked is the answer the score
    computed for that node's state (one evaluation of the policy per state, not a second one
    when the pod is assumed): asked again, the same answer, not a recomputed one."""
    framework = Framework(Profile(), new_in_tree_registry())
    plugin = framework.plugins["GpuFragmentation"]
    assert isinstance(plugin, GpuFragmentation)
    node, pod = card_node("n", (500, 300)), share_pod("p", 400)
    plugin.score(pod, node)
    policy = framework.share_policy()
    assert policy is not None
    state, task = gpu.node_state(node, "g"), gpu.task_shape(pod.req)
    first = policy.choose(state, task)
    assert first is not None and policy.choose(state, task) is first
    assert first == plugin.policy.choose(state, task)


@pytest.mark.parametrize("policy_name", ["fgd-fill", "fgd"])
def test_remembered_cards_are_the_policys_own_whatever_the_cards_order(policy_name: str) -> None:
    """Nodes alike but for the order of their cards score alike from one cache entry; the card
    each is given is still the one the policy picks on that node's own order (FGD breaks a tie
    by the lower index, so the orders pick different amounts)."""
    profile = Profile(args={"GpuFragmentation": {"policy": policy_name}})
    framework = Framework(profile, new_in_tree_registry())
    plugin = framework.plugins["GpuFragmentation"]
    assert isinstance(plugin, GpuFragmentation)
    pod = share_pod("p", 200)
    nodes = [
        card_node(f"n{i}", used)
        for i, used in enumerate([(0, 500, 300, 500), (300, 500, 0, 500), (500, 500, 300, 0)])
    ]
    scores = {plugin.score(pod, n) for n in nodes}
    assert len(scores) == 1
    policy = framework.share_policy()
    assert policy is not None
    for n in nodes:
        own = gpu.choose_cards(n, pod.req, plugin.policy)
        assert gpu.choose_cards(n, pod.req, policy) == own


def test_a_profile_without_the_score_chooses_best_fit() -> None:
    profile = Profile(scores=(("LeastAllocated", 1),))
    assert Framework(profile, new_in_tree_registry()).share_policy() is None


def test_a_rebuilt_mix_makes_the_search_scan_afresh() -> None:
    """The search keeps a template's scored candidates across one-pod jobs; scores taken
    under an older mix would stay on every node no pod touched since (an idle node would keep
    the score of a mix long gone and win). A pod of a new shape rebuilds the policy, so the
    next pod of the first template scans again instead of reusing the kept scores."""
    snapshot = Snapshot.of([card_node(f"n{i}", (0, 0)) for i in range(4)])
    framework = Framework(Profile(), new_in_tree_registry())
    scheduler = UnitScheduler(framework)

    def one(name: str, milli: int) -> int:
        pod = share_pod(name, milli)
        pod.template_key = f"share-{milli}".encode()
        result = scheduler.schedule(UnitInfo(name, 1, 0, 0, [pod]), snapshot)
        assert result.placements
        return result.scans

    assert one("a", 500) == 1  # the first pod of its template scans
    assert one("b", 500) == 0  # the next reuses the kept candidates
    assert one("c", 300) == 1  # a new shape: the mix is rebuilt
    assert one("d", 500) == 1  # the kept 500 candidates were scored under the old mix
