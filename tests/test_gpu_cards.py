"""GPU cards (placement/gpu.py, plugins/gpucards.py): the units, the per-card accounting of
NodeInfo, the filter, the one choice of cards and its verification, preemption freeing cards,
the audit's card rules and the dispatcher's refusal of bad GPU requests. Pure tables."""

from __future__ import annotations

import pytest

from placement import gpu
from placement.framework import Code, PodInfo
from placement.nodeinfo import NodeInfo, PodRequest
from placement.plugins.gpucards import GpuCards
from placement.preemption import VictimCandidate, search_victims
from placement.quotas import format_amount
from placement.resources import Quantities, request_milli, resources_milli
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.api.validation import validate_node, validate_template
from services.eviction import replacement
from tests.factories import gpu_job, gpu_node, job, pods_of


def card_node(cards: int = 4, model: str = "V100M32") -> NodeInfo:
    return NodeInfo.from_node(gpu_node("n", cards, model, cpu=64_000))


def share(
    name: str, milli: int, cards: tuple[int, ...] = (), gpu_models: tuple[str, ...] = ()
) -> PodRequest:
    """A pod holding a share of one card (``cards``: where, once chosen)."""
    return PodRequest(name, "g", 100, 0, milli, gpu_cards=cards, gpu_models=gpu_models)


def whole(
    name: str, count: int, cards: tuple[int, ...] = (), gpu_models: tuple[str, ...] = ()
) -> PodRequest:
    """A pod holding ``count`` whole cards."""
    return PodRequest(name, "g", 100, 0, count * 1000, gpu_cards=cards, gpu_models=gpu_models)


def pod_info(req: PodRequest, priority: int = 0) -> PodInfo:
    return PodInfo(req.name, "j", 1, req, priority=priority)


def with_pods(info: NodeInfo, *pods: PodRequest) -> NodeInfo:
    for p in pods:
        assert info.add_pod(p)
    return info


# --------------------------------------------------------------------------------------------
# Units: milli-GPU inside, whole cards at the boundary
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cards", "milli", "expected"),
    [(0, 0, 0), (1, 0, 1000), (3, 0, 3000), (1, 250, 250), (1, 999, 999), (2, 500, 2000)],
    ids=["none", "one-card", "three-cards", "share", "largest-share", "share-ignored-for-two"],
)
def test_request_milli(cards: int, milli: int, expected: int) -> None:
    assert request_milli(cards, milli) == expected


def test_shares_count_as_milli_in_the_resource_vector() -> None:
    tpl = gpu_job(job("s", cpu=100), milli=300).spec.template
    assert Quantities.of_pod_request(tpl, 3).gpus == 900
    assert Quantities.shared_request(tpl).gpus == 300
    assert PodRequest.from_pod(pods_of(gpu_job(job("s"), milli=300))[0]).requests.gpus == 300
    # An offer or a quota in whole cards; a figure written back keeps the exact milli.
    assert Quantities.of(pb.Resources(gpus=2)).gpus == 2000
    used = Quantities(gpus=1500)
    written = used.as_resources()
    assert (written.gpus, written.milli_gpus) == (2, 1500)
    assert Quantities.of(written).gpus == 1500 == resources_milli(written)
    assert [format_amount("gpus", m) for m in (2000, 1500, 250, 0)] == ["2", "1.5", "0.25", "0"]


# --------------------------------------------------------------------------------------------
# Per-card accounting (NodeInfo.add_pod / remove_pod, clone, set_node)
# --------------------------------------------------------------------------------------------

ACCOUNTING = [
    ("empty node", [], [0, 0, 0, 0], 4),
    ("one share", [share("a", 300, (1,))], [0, 300, 0, 0], 3),
    ("shares on one card", [share("a", 300, (1,)), share("b", 700, (1,))], [0, 1000, 0, 0], 3),
    ("whole cards", [whole("w", 2, (0, 3))], [1000, 0, 0, 1000], 2),
    ("share without a card yet: pool totals only", [share("a", 300)], [0, 0, 0, 0], 4),
    ("a card outside the node is not counted", [share("a", 300, (9,))], [0, 0, 0, 0], 4),
]


@pytest.mark.parametrize(
    ("name", "pods", "used", "whole_free"), ACCOUNTING, ids=[c[0] for c in ACCOUNTING]
)
def test_card_accounting(
    name: str, pods: list[PodRequest], used: list[int], whole_free: int
) -> None:
    info = with_pods(card_node(), *pods)
    assert list(info.card_used) == used
    assert gpu.free_milli(info) == [1000 - u for u in used]
    assert gpu.whole_free_cards(info) == whole_free
    assert info.capacity["g"][2] == 4000  # the pool in milli-GPU
    for p in pods:
        info.remove_pod(p.name)
    assert list(info.card_used) == [0, 0, 0, 0]


def test_clone_keeps_cards_apart_and_set_node_keeps_the_pods_cards() -> None:
    info = with_pods(card_node(), share("a", 400, (2,)))
    copy = info.clone()
    copy.add_pod(whole("w", 1, (0,)))
    assert list(info.card_used) == [0, 0, 400, 0]
    assert list(copy.card_used) == [1000, 0, 400, 0]
    grown = gpu_node("n", 6, "A100", cpu=64_000)
    info.set_node(grown)
    assert (info.gpu_model, list(info.card_used)) == ("A100", [0, 0, 400, 0, 0, 0])


# --------------------------------------------------------------------------------------------
# The filter: model, a share on one card, whole cards wholly free
# --------------------------------------------------------------------------------------------

FILTER = [
    # name, node's pods, the pod, expected (code, reason) or None
    ("no GPU asked", [whole("w", 4, (0, 1, 2, 3))], PodRequest("p", "g", 100), None),
    ("share fits a free card", [], share("p", 500), None),
    ("share fits the room left on a card",
     [share("a", 600, (0,)), whole("w", 3, (1, 2, 3))], share("p", 400), None),
    ("no card with enough free share",
     [share("a", 600, (0,)), whole("w", 3, (1, 2, 3))], share("p", 401),
     (Code.UNSCHEDULABLE, gpu.NO_CARD_SHARE)),
    ("shares add up to a card, yet on no one card",
     [share(f"s{i}", 600, (i,)) for i in range(4)], share("p", 500),
     (Code.UNSCHEDULABLE, gpu.NO_CARD_SHARE)),
    ("whole cards wholly free", [share("a", 1, (0,))], whole("p", 3), None),
    ("a card with a share is not whole",
     [share("a", 1, (0,)), share("b", 1, (1,))], whole("p", 3),
     (Code.UNSCHEDULABLE, gpu.NO_WHOLE_CARDS)),
    ("model accepted", [], share("p", 500, gpu_models=("V100M16", "V100M32")), None),
    ("model not accepted", [], share("p", 500, gpu_models=("A100",)),
     (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, gpu.MODEL_NOT_ACCEPTED)),
    ("more cards than the node has: the pool's check says so", [], whole("p", 5), None),
]  # fmt: skip


@pytest.mark.parametrize(("name", "pods", "pod", "expected"), FILTER, ids=[c[0] for c in FILTER])
def test_filter(
    name: str, pods: list[PodRequest], pod: PodRequest, expected: tuple[Code, str] | None
) -> None:
    info = with_pods(card_node(), *pods)
    status = GpuCards().filter(pod_info(pod), info)
    got = None if status is None else (status.code, status.reasons[0])
    assert got == expected


def test_model_filter_on_a_node_without_gpus() -> None:
    info = NodeInfo.from_node(gpu_node("n", 0, ""))
    status = GpuCards().filter(pod_info(share("p", 500, gpu_models=("A100",))), info)
    assert status is not None and status.reasons == (gpu.MODEL_NOT_ACCEPTED,)


# --------------------------------------------------------------------------------------------
# The one choice of cards, and its verification (the Binder's, the audit's)
# --------------------------------------------------------------------------------------------

CHOOSE = [
    ("share on an empty node: the lowest index", [], share("p", 300), (0,)),
    ("share: best fit, the card with the least free that holds it",
     [share("a", 500, (0,)), share("b", 800, (1,)), share("c", 600, (2,))], share("p", 200),
     (1,)),
    ("share: a full card is skipped", [share("a", 900, (0,))], share("p", 200), (1,)),
    ("whole: the lowest indices wholly free",
     [share("a", 100, (0,)), whole("w", 1, (2,))], whole("p", 2), (1, 3)),
    ("whole: not enough", [whole("w", 3, (0, 1, 2))], whole("p", 2), gpu.NO_WHOLE_CARDS),
    ("share: no room", [whole("w", 4, (0, 1, 2, 3))], share("p", 1), gpu.NO_CARD_SHARE),
    ("model", [], whole("p", 1, gpu_models=("T4",)), gpu.MODEL_NOT_ACCEPTED),
    ("no GPU asked", [], PodRequest("p", "g", 100), ()),
]  # fmt: skip


@pytest.mark.parametrize(("name", "pods", "pod", "expected"), CHOOSE, ids=[c[0] for c in CHOOSE])
def test_choose_cards(
    name: str, pods: list[PodRequest], pod: PodRequest, expected: tuple[int, ...] | str
) -> None:
    info = with_pods(card_node(), *pods)
    found = gpu.choose_cards(info, pod)
    assert (found.reason if isinstance(found, gpu.GpuFailure) else found) == expected
    if isinstance(expected, tuple):
        assert gpu.verify_cards(info, pod, expected) is None  # the choice verifies
        assert gpu.pin_cards(info, pod).gpu_cards == expected


VERIFY = [
    ("a share on a card with room", [share("a", 500, (0,))], share("p", 500), (0,), None),
    ("a share on a card without room", [share("a", 600, (0,))], share("p", 500), (0,),
     "GPU card 0 has 400 milli free, the pod's share is 500"),
    ("a whole card held by a share", [share("a", 1, (0,))], whole("p", 1), (0,),
     "GPU card 0 is not wholly free"),
    ("a whole card another pod holds", [whole("a", 1, (2,))], whole("p", 2), (1, 2),
     "GPU card 2 is not wholly free"),
    ("a card the node does not have", [], share("p", 500), (4,), "no GPU card 4"),
    ("a share on two cards", [], share("p", 500), (0, 1), "holds 1 distinct GPU card(s)"),
    ("one card twice for two", [], whole("p", 2), (1, 1), "holds 2 distinct GPU card(s)"),
    ("too few cards", [], whole("p", 2), (1,), "holds 2 distinct GPU card(s)"),
    ("cards for a pod asking none", [], PodRequest("p", "g", 100), (0,), "asks for no GPU"),
    ("a model the pod does not accept", [], share("p", 5, gpu_models=("T4",)), (0,),
     gpu.MODEL_NOT_ACCEPTED),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "pods", "pod", "cards", "expected"), VERIFY, ids=[c[0] for c in VERIFY]
)
def test_verify_cards(
    name: str, pods: list[PodRequest], pod: PodRequest, cards: tuple[int, ...], expected: str | None
) -> None:
    why = gpu.verify_cards(with_pods(card_node(), *pods), pod, cards)
    if expected is None:
        assert why is None
    else:
        assert why is not None and expected in why


# --------------------------------------------------------------------------------------------
# Preemption: victims free cards, not just counts
# --------------------------------------------------------------------------------------------


def victim(req: PodRequest, priority: int, started_ms: int) -> VictimCandidate:
    return VictimCandidate(req.name, req.name, priority, started_ms, req)


def preempt(pods: list[VictimCandidate], preemptor: PodRequest, cards: int = 2) -> list[str] | None:
    info = with_pods(card_node(cards), *(v.req for v in pods))
    pre = pod_info(preemptor, priority=100)
    found = search_victims(pre, info, [v for v in pods if v.priority < 100]).victims
    return None if found is None else sorted(v.name for v in found)


def test_a_whole_card_preemptor_evicts_the_pod_whose_card_it_frees() -> None:
    """Card 0: a (500); card 1: b (300) and c (300, priority above the preemptor's). Counting
    milli alone, evicting b (the least valuable) leaves 1000 free — on no one card. The card
    that can come wholly free is a's."""
    a = victim(share("a", 500, (0,)), 0, started_ms=1)
    b = victim(share("b", 300, (1,)), 0, started_ms=2)
    c = victim(share("c", 300, (1,)), 200, started_ms=1)
    assert preempt([a, b, c], whole("p", 1)) == ["a"]


def test_a_share_preemptor_needs_one_card_with_its_share_freed() -> None:
    """Card 0: a (400) and x (500, not preemptible by priority); card 1: b (600). 500 asked: a
    alone frees 400+100 on card 0 — enough; b would free 1000 on card 1 but is more valuable."""
    a = victim(share("a", 400, (0,)), 0, started_ms=2)
    x = victim(share("x", 500, (0,)), 200, started_ms=1)
    b = victim(share("b", 600, (1,)), 0, started_ms=1)
    assert preempt([a, x, b], share("p", 500)) == ["a"]


def test_no_victim_set_frees_a_card_held_by_higher_priority_pods() -> None:
    x = victim(share("x", 600, (0,)), 200, started_ms=1)
    y = victim(share("y", 600, (1,)), 200, started_ms=1)
    low = victim(share("low", 100, (0,)), 0, started_ms=1)
    assert preempt([x, y, low], whole("p", 1)) is None


# --------------------------------------------------------------------------------------------
# Audit: the card rules over a node's pods
# --------------------------------------------------------------------------------------------

PROBLEMS = [
    ("consistent", [share("a", 500, (0,)), share("b", 500, (0,)), whole("w", 2, (1, 2))], ""),
    ("a card over 1000", [share("a", 600, (0,)), share("b", 500, (0,))],
     "GPU card 0 of node n holds 1100 milli-GPU (pods a, b), over 1000"),
    ("a whole card shared", [whole("w", 1, (3,)), share("b", 1, (3,))],
     "whole GPU card 3 of node n held by pod w is shared with b"),
    ("a card outside the node", [share("a", 100, (7,))],
     "pod a holds GPU card 7, node n has cards 0..3"),
    ("a pod holding no card", [share("a", 100)], "pod a holds GPU card(s) [], not 1 card(s)"),
    ("a model the pod does not accept", [share("a", 100, (0,), gpu_models=("T4",))],
     "pod a accepts GPU models T4, node n has V100M32"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "pods", "expected"), PROBLEMS, ids=[c[0] for c in PROBLEMS])
def test_card_problems(name: str, pods: list[PodRequest], expected: str) -> None:
    problems = gpu.card_problems(with_pods(card_node(), *pods))
    if expected:
        assert any(expected in p for p in problems), problems
    else:
        assert problems == []


# --------------------------------------------------------------------------------------------
# Bad input: the dispatcher refuses it, naming the field
# --------------------------------------------------------------------------------------------


def template(cards: int = 1, milli: int = 0, models: tuple[str, ...] = ()) -> pb.PodTemplate:
    return gpu_job(job("j"), cards, milli=milli, models=models).spec.template


BAD = [
    ("a share with two cards", template(2, 500), "t.gpu_milli", "needs requests.gpus: 1 (got 2)"),
    ("a share without a card", template(0, 500), "t.gpu_milli", "needs requests.gpus: 1 (got 0)"),
    ("a share of a whole card", template(1, 1000), "t.gpu_milli", "must be 1..999"),
    ("a negative share", template(1, -5), "t.gpu_milli", "must be 1..999"),
    ("an empty model", template(1, 0, ("V100M16", "")), "t.gpu_models[1]", "must not be empty"),
    ("a malformed model", template(1, 0, ("V100 M16",)), "t.gpu_models[0]",
     "not a GPU model name"),
    ("a model listed twice", template(1, 0, ("T4", "T4")), "t.gpu_models[1]", "listed twice"),
    ("models without a GPU", template(0, 0, ("T4",)), "t.gpu_models", "no GPU asked"),
    ("the scheduler's figure in a request",
     pb.PodTemplate(requests=pb.Resources(milli_cpu=1, milli_gpus=500)),
     "t.requests.milli_gpus", "ask whole cards in gpus"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "tpl", "field", "words"), BAD, ids=[c[0] for c in BAD])
def test_bad_gpu_requests_are_refused_naming_the_field(
    name: str, tpl: pb.PodTemplate, field: str, words: str
) -> None:
    violations = validate_template(tpl, "t")
    assert [v.field for v in violations] == [field], violations
    assert words in violations[0].description


@pytest.mark.parametrize(
    "tpl",
    [template(1), template(4), template(1, 1), template(1, 999), template(2, 0, ("V100M16", "T4"))],
    ids=["one-card", "four-cards", "smallest-share", "largest-share", "models"],
)
def test_good_gpu_requests_pass(tpl: pb.PodTemplate) -> None:
    assert validate_template(tpl, "t") == []


@pytest.mark.parametrize(
    ("node", "words"),
    [(gpu_node("n", 2, "V100 M32"), "not a GPU model name"),
     (gpu_node("n", 0, "V100M32"), "set on a node without GPU cards")],
    ids=["malformed-model", "model-without-cards"],
)  # fmt: skip
def test_bad_node_gpu_model_is_refused(node: pb.Node, words: str) -> None:
    violations = validate_node(node, "node")
    assert [v.field for v in violations] == ["node.status.gpu_model"]
    assert words in violations[0].description


def test_a_replacement_holds_no_card_of_the_pod_it_replaces() -> None:
    """A victim's replacement is pending: its cards are chosen where it lands, not copied."""
    [old] = pods_of(gpu_job(job("j"), 2))
    old.spec.node_name, old.spec.index = "n", 0
    old.spec.gpu_cards.extend([0, 1])
    new = replacement(old, [old])
    assert (new.spec.node_name, list(new.spec.gpu_cards)) == ("", [])
    assert PodRequest.from_pod(new).gpu_cards == ()
