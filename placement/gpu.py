"""GPU cards: the one home of per-card accounting, read by every judge of room (the shards'
filter and their assumed placements, the Binder's re-check and card assignment, preemption, the
rescheduler's simulation and ``godel audit``).

A node has ``allocatable.gpus`` cards, indexed 0..n-1, all of one model (``status.gpu_model``).
A pod asks for whole cards (``requests.gpus: N``) or for a share of one card
(``requests.gpus: 1`` with ``template.gpu_milli: 1..999``), and may accept only some models
(``template.gpu_models``, empty: any). Amounts are milli-GPU, 1000 per card, everywhere inside
(``placement.resources.Quantities.gpus``): a share counts as its milli in quotas, DRF,
partitions and room, a whole card as 1000.

The units are ``placement.resources``' (``MILLI_PER_CARD``, ``request_milli``). Per node,
``NodeInfo.card_used`` holds the milli-GPU used on each card, kept by ``NodeInfo.add_pod`` and
``remove_pod`` (as NUMA use is) from the cards a pod holds (``PodRequest.gpu_cards``:
``spec.gpu_cards`` of a bound pod, or the choice a shard assumed it with). A share fits a card
with at least its milli free; a whole-card pod needs N cards wholly free (nothing on them), so
no whole card is ever shared. The Binder assigns the cards in its commit (``choose_cards``, or
``verify_cards`` of the shard's proposal), so two shards never hand out the same card.

A pod asking for GPUs but holding no card (not yet chosen) counts in its pool's totals only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from placement.gpufrag import (
    FGD_FILL_COVERAGE_PERCENT,
    GpuNodeState,
    Policy,
    ShapeMix,
    TaskShape,
    weighted_fragmentation,
)
from placement.nodeinfo import GUARANTEED, NodeInfo, PodRequest
from placement.resources import MILLI_PER_CARD

# Where GPUs are in a NodeInfo's per-pool [milli-CPU, memory bytes, milli-GPU] lists.
GPU_INDEX = 2

# Filter reasons (placement/plugins/gpucards.py), as `godel explain` shows them.
MODEL_NOT_ACCEPTED = "GPU model not accepted"
NO_CARD_SHARE = "no GPU card with enough free share"
NO_WHOLE_CARDS = "not enough whole free GPU cards"

# task_shape's instances by (cpu, memory, milli-GPU, models) of the request.
_SHAPES: dict[tuple[int, int, int, tuple[str, ...]], TaskShape] = {}
_MAX_SHAPES = 4096


def is_share(milli: int) -> bool:
    """Whether a request of ``milli`` milli-GPU is a share of one card (else whole cards)."""
    return 0 < milli < MILLI_PER_CARD


def cards_needed(milli: int) -> int:
    """How many cards a request of ``milli`` holds: one for a share, else its whole cards."""
    return 1 if is_share(milli) else milli // MILLI_PER_CARD


def model_accepted(models: tuple[str, ...], node_model: str) -> bool:
    return not models or node_model in models


def free_milli(node: NodeInfo) -> list[int]:
    """Milli-GPU free on each card of ``node``, by index."""
    return [MILLI_PER_CARD - used for used in node.card_used]


def whole_free_cards(node: NodeInfo) -> int:
    """How many of ``node``'s cards nothing holds."""
    return sum(1 for used in node.card_used if not used)


@dataclass(frozen=True, slots=True)
class GpuFailure:
    reason: str
    # Only a node change helps (the model): preemption does not try.
    unresolvable: bool = False


def fit_failure(node: NodeInfo, req: PodRequest) -> GpuFailure | None:
    """Why ``req``'s GPUs cannot be held on ``node``'s cards (None: they can, or it asks none).
    A node with fewer cards in all than the pod needs is left to the pool's check
    (``resource_fit_failures``: insufficient gpus)."""
    milli = req.requests.gpus
    if not milli:
        return None
    if req.gpu_models and node.gpu_model not in req.gpu_models:
        return GpuFailure(MODEL_NOT_ACCEPTED, unresolvable=True)
    used = node.card_used
    if is_share(milli):
        # No card has the share free: even the least used one (min: no per-card Python loop).
        if used and MILLI_PER_CARD - min(used) < milli:
            return GpuFailure(NO_CARD_SHARE)
        return None
    want = milli // MILLI_PER_CARD
    if len(used) >= want and used.count(0) < want:
        return GpuFailure(NO_WHOLE_CARDS)
    return None


def node_state(node: NodeInfo, pool: str) -> GpuNodeState:
    """``node`` as the fragmentation measures (``placement.gpufrag``) read it: its model, the
    milli-GPU free on each card, and the free and total CPU and memory of ``pool``."""
    capacity, used = node.capacity[pool], node.requested[pool]
    return GpuNodeState(
        node.gpu_model,
        tuple(MILLI_PER_CARD - u for u in node.card_used),
        capacity[0] - used[0],
        capacity[1] - used[1],
        capacity[0],
        capacity[1],
    )


def task_shape(req: PodRequest) -> TaskShape:
    """What ``req`` asks of one node, as the fragmentation measures read it (one instance per
    distinct request: building and checking a TaskShape per pod cost more than the lookup)."""
    requests = req.requests
    key = (requests.cpu, requests.mem, requests.gpus, req.gpu_models)
    found = _SHAPES.get(key)
    if found is None:
        milli = requests.gpus
        cards = cards_needed(milli) if milli else 0
        per_card = milli if is_share(milli) else (MILLI_PER_CARD if milli else 0)
        found = TaskShape(requests.cpu, requests.mem, cards, per_card, frozenset(req.gpu_models))
        if len(_SHAPES) >= _MAX_SHAPES:
            _SHAPES.clear()  # a bound on memory; forgetting costs a rebuild each
        _SHAPES[key] = found
    return found


def choose_cards(
    node: NodeInfo, req: PodRequest, share_policy: Policy | None = None
) -> tuple[int, ...] | GpuFailure:
    """The cards ``req`` would hold on ``node`` (() for a pod asking no GPU). For a share: the
    card ``share_policy`` picks (the GpuFragmentation score's policy, fgd-balance by default: the
    card where the learned shape mix's fragmentation grows least), else — no policy, or it
    finds no card (the pool's CPU or memory short) — the best fit: the card with the least
    free that still holds it, lowest index among equals. For whole cards, the lowest indices
    wholly free. The one choice of cards: the shard proposes it (with its score's policy), the
    Binder verifies that proposal and makes the choice (best fit) only when a decision names
    none."""
    milli = req.requests.gpus
    if not milli:
        return ()
    if not model_accepted(req.gpu_models, node.gpu_model):
        return GpuFailure(MODEL_NOT_ACCEPTED, unresolvable=True)
    used = node.card_used
    if is_share(milli):
        if share_policy is not None:
            choice = share_policy.choose(node_state(node, req.pool), task_shape(req))
            if choice is not None:
                return choice.cards
        best: tuple[int, int] | None = None
        for index, u in enumerate(used):
            left = MILLI_PER_CARD - u - milli
            if left >= 0 and (best is None or left < best[0]):
                best = (left, index)
        return (best[1],) if best is not None else GpuFailure(NO_CARD_SHARE)
    want = milli // MILLI_PER_CARD
    free = [index for index, u in enumerate(used) if not u]
    if len(free) < want:
        return GpuFailure(NO_WHOLE_CARDS, unresolvable=len(used) < want)
    return tuple(free[:want])


def pin_cards(node: NodeInfo, req: PodRequest, share_policy: Policy | None = None) -> PodRequest:
    """``req`` holding the cards :func:`choose_cards` picks on ``node`` (unchanged for a pod
    asking no GPU; holding none when none fit: the Binder then chooses or refuses). Cards it
    held elsewhere (a simulated move) are not kept."""
    if not req.requests.gpus:
        return req
    found = choose_cards(node, req, share_policy)
    cards = found if isinstance(found, tuple) else ()
    return req if cards == req.gpu_cards else req.with_cards(cards)


def verify_cards(node: NodeInfo, req: PodRequest, cards: tuple[int, ...]) -> str | None:
    """Why the cards a decision names for ``req`` cannot be held on ``node`` (None: they can):
    the Binder's check of a shard's proposal. ``node`` does not hold ``req`` itself."""
    milli = req.requests.gpus
    if not milli:
        return "the pod asks for no GPU but GPU cards were assigned" if cards else None
    if not model_accepted(req.gpu_models, node.gpu_model):
        return f"{MODEL_NOT_ACCEPTED}: node has {node.gpu_model or 'no model'}"
    count = len(node.card_used)
    outside = [c for c in cards if not 0 <= c < count]
    if outside:
        return f"no GPU card {', '.join(map(str, outside))} (the node has {count})"
    want = cards_needed(milli)
    if len(set(cards)) != want or len(cards) != want:
        return f"the pod holds {want} distinct GPU card(s), not {list(cards)}"
    for card in cards:
        free = MILLI_PER_CARD - node.card_used[card]
        if is_share(milli) and free < milli:
            return f"GPU card {card} has {free} milli free, the pod's share is {milli}"
        if not is_share(milli) and free < MILLI_PER_CARD:
            return f"GPU card {card} is not wholly free"
    return None


def card_problems(node: NodeInfo) -> list[str]:
    """What breaks the card rules among ``node``'s pods (audit): a card over 1000 milli-GPU, a
    whole card shared with anything, a card outside 0..n-1, a pod holding the wrong number of
    cards, a model the pod does not accept."""
    problems: list[str] = []
    count = len(node.card_used)
    holders: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for req in node.pods.values():
        milli = req.requests.gpus
        if not milli:
            if req.gpu_cards:
                problems.append(f"pod {req.name} asks for no GPU but holds card(s) {_list(req)}")
            continue
        if not model_accepted(req.gpu_models, node.gpu_model):
            problems.append(
                f"pod {req.name} accepts GPU models {', '.join(req.gpu_models)}, "
                f"node {node.name} has {node.gpu_model or 'none'}"
            )
        want = cards_needed(milli)
        if len(set(req.gpu_cards)) != want or len(req.gpu_cards) != want:
            problems.append(f"pod {req.name} holds GPU card(s) [{_list(req)}], not {want} card(s)")
        for card in req.gpu_cards:
            if not 0 <= card < count:
                problems.append(
                    f"pod {req.name} holds GPU card {card}, node {node.name} has cards "
                    f"0..{count - 1}"
                )
            else:
                holders[card].append((req.name, milli))
    for card, pods in sorted(holders.items()):
        total = sum(MILLI_PER_CARD if not is_share(m) else m for _, m in pods)
        if total > MILLI_PER_CARD:
            problems.append(
                f"GPU card {card} of node {node.name} holds {total} milli-GPU "
                f"(pods {', '.join(sorted(n for n, _ in pods))}), over {MILLI_PER_CARD}"
            )
        whole = [n for n, m in pods if not is_share(m)]
        if whole and len(pods) > 1:
            others = sorted(n for n, _ in pods if n != whole[0])
            problems.append(
                f"whole GPU card {card} of node {node.name} held by pod {whole[0]} is shared "
                f"with {', '.join(others)}"
            )
    return problems


def _list(req: PodRequest) -> str:
    return ", ".join(map(str, req.gpu_cards))


# --- The cluster's GPU fragmentation figures ----------------------------------------------------

# The shape a cluster running no GPU pod is measured against: one whole card.
ONE_CARD = TaskShape(0, 0, 1, MILLI_PER_CARD)


def gpu_shapes(reqs: Iterable[PodRequest]) -> list[TaskShape]:
    """The task shapes of the pods among ``reqs`` that ask GPUs, in order."""
    return [task_shape(req) for req in reqs if req.requests.gpus]


def shape_mix(shapes: Sequence[TaskShape]) -> ShapeMix:
    """The mix the cluster's expected fragmentation is measured against: every shape of
    ``shapes`` by count (as the fgd-fill score's mix keeps them), or one whole card when
    there is none."""
    return ShapeMix.of_tasks(shapes or [ONE_CARD], FGD_FILL_COVERAGE_PERCENT)


def card_state(node: NodeInfo) -> GpuNodeState:
    """``node``'s guaranteed pool as the fragmentation measures read it. GPU pods holding no
    card yet (none chosen) are taken to hold the freest cards, as the Binder would give
    them."""
    state = node_state(node, GUARANTEED)
    unplaced = node.requested[GUARANTEED][GPU_INDEX] - sum(node.card_used)
    if unplaced <= 0:
        return state
    free = sorted(state.free_milli, reverse=True)
    for index, amount in enumerate(free):
        taken = min(amount, unplaced)
        free[index] -= taken
        unplaced -= taken
    return replace(state, free_milli=tuple(free))


@dataclass(frozen=True, slots=True)
class GpuFigures:
    """A set of nodes' GPU fragmentation, as the rescheduler's plans, its metrics and the
    dashboard report it (GPU counted in the guaranteed pool, milli-GPU)."""

    # Σ over nodes of the mix-weighted fragmentation (``placement.gpufrag.fragmentation``,
    # the GpuFragmentation score's measure) ÷ (the mix's count × all free GPU): the share of
    # free GPU a task drawn from the mix could not use. 0..1; 0 when no GPU is free.
    expected_fragmentation: float
    # Free GPU on nodes where some GPU is in use ÷ all free GPU: what a whole-machine task
    # cannot use. 0..1; 0 when no GPU is free.
    fragmentation: float
    # Nodes with GPUs, none of them in use.
    whole_free_nodes: int
    free_milli: int


def gpu_figures(nodes: Iterable[NodeInfo], mix: ShapeMix) -> GpuFigures:
    """The figures of ``nodes`` (each with its pods accounted) against ``mix``."""
    free = weighted = stranded = idle = whole = 0
    for node in nodes:
        capacity = node.capacity[GUARANTEED][GPU_INDEX]
        if capacity <= 0:
            continue
        used = node.requested[GUARANTEED][GPU_INDEX]
        spare = max(capacity - used, 0)
        idle += spare
        if used > 0:
            stranded += spare
        else:
            whole += 1
        state = card_state(node)
        free += state.free_gpu_milli
        if state.free_gpu_milli:
            weighted += weighted_fragmentation(state, mix)
    return GpuFigures(
        weighted / (mix.total * free) if free else 0.0,
        stranded / idle if idle else 0.0,
        whole,
        free,
    )
