"""GpuFragmentation: score a GPU pod's candidate nodes by how little the cluster's GPU
fragmentation grows if the pod goes there (issue 30; the measures are ``placement.gpufrag``'s,
the conversions ``placement.gpu``'s).

Policies (``args.policy``):

- ``fgd-balance`` (default): fgd-fill's growth plus the growth of the cards' room that the
  mix's common share sizes cannot fill and of the GPU the node's CPU and memory could not feed
  (``FgdBalancePolicy``), on the card the same policy picks for a share.
- ``fgd-fill``: the growth of the learned shape mix's expected fragmentation plus its
  expected unfillable GPU (``FgdFillPolicy``), on the card the same policy picks for a share.
- ``fgd``: the growth of expected fragmentation alone (the paper's FGD, ``FgdPolicy``).
- ``best-fit``: the node left with the least free GPU, CPU and memory (``BestFitPolicy``).
- ``packing``: shares onto shared cards, then onto nodes in use (``GpuPackingPolicy``).

The shape mix is learned from the pods this plugin scores (one framework instance: a shard's
plugin sees its shard's pods): each new pod is observed once, before its nodes are scored
(``LearningScore.observe``: the search calls it first), in a ``ShapeWindow`` of the last
``window`` pods, so even the first pod scores against a mix (its own shape). Pods asking no GPU
count once a node with cards has been scored (the offline check's mix has them too). The
policy is rebuilt from the window when a new shape arrives or every ``refresh`` pods, not per
pod, so its answers stay cached; each rebuild moves ``score_generation``, and the search then
drops the candidates it kept scored under the old mix (else an idle node, never re-scored,
would keep a score of the first few pods' mix and win: through the services multi-card tasks
went unplaced for it on multigpu20).

Raw scores: for fgd-balance the policy's own order, minus 1,000 × (its growth × 1,000,000 +
the milli-GPU the node is left with free), one step of which at the profile's weight outweighs
every 0..100 default score together: they only break its exact ties (squashed into 0..100,
thousands of growths fell into a few points and LeastAllocated spread the pods; a node with no
room ranks last). For fgd-fill and fgd 50 minus the expected growth in steps of
``milli_per_point`` milli-GPU (a placement that fills a sliver scores above 50); for best-fit
100 less the share left free; for packing by tier, then by GPU left free. A pod asking no GPU
is scored by the learning policies on a node with cards by what it strands there (fgd-balance:
the GPU its CPU and memory leave unfed, ``cpu_stranded``, and unfillable), and on a node
without cards as growth 0 with nothing left free (so it prefers those): one attribute read per
node in a cluster without GPU nodes. The comparison policies score it 0, as a node the policy
finds no room on (the filters decide fit).

Cost: a node's answer depends only on (model, the cards' use in any order, free and total CPU
and memory of the pod's pool), the ``Fleet`` grouping of ``placement.gpufrag``: answers are
cached by that key per task shape, so scoring thousands of alike nodes costs a tuple and a dict
lookup each (``bench/gpuscore_micro.py``). A new shape or a rebuilt policy scores each distinct
state once again. The card a share takes on the chosen node (``share_policy``, which
``gpu.choose_cards`` asks when the pod is assumed) is the policy's choice on that node's exact
state, kept when the state was scored (a memo of a pure function: the same answer), so placing
a share costs no second evaluation of the policy: in GpuShares-1213 it was most of a share's
search CPU. Like every non-normalizing score, a node's answer is cached by the search's
feasible-node cache until the node changes, so a mix learned meanwhile reaches it then.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from placement.framework import MAX_NODE_SCORE, PluginSpec, PodInfo, ScorePlugin
from placement.gpu import node_state, task_shape
from placement.gpufrag import (
    FGD_FILL_COVERAGE_PERCENT,
    MILLI_PER_GPU,
    BestFitPolicy,
    Choice,
    FgdBalancePolicy,
    FgdFillPolicy,
    FgdPolicy,
    GpuNodeState,
    GpuPackingPolicy,
    Policy,
    ShapeWindow,
    TaskShape,
)
from placement.nodeinfo import NodeInfo

NAME = "GpuFragmentation"

POLICIES = ("fgd-balance", "fgd-fill", "fgd", "best-fit", "packing")
_LEARNING = ("fgd-balance", "fgd-fill", "fgd")
_NEUTRAL = MAX_NODE_SCORE // 2
# Packing tiers (GpuPackingPolicy: 0 a shared card, 1 a node in use, 2 an idle node).
_TIER_POINTS = 40
# fgd-balance's scale: per milli-GPU of growth, _FREE_SPAN steps of free GPU left after (more
# than any node has), each _DECIDING points (so one step, at the profile's weight 10, outweighs
# every 0..100 score of the default profile together); a node with no room ranks last.
_FREE_SPAN = 1_000_000
_DECIDING = 1_000
_NO_ROOM = -(1 << 62)

# A node state as the policies read it, the cards in their own order: the key of a remembered
# choice (a plain tuple hashes and compares faster than the dataclass).
_ExactState = tuple[str, tuple[int, ...], int, int, int, int]


def _exact(state: GpuNodeState) -> _ExactState:
    return (
        state.model,
        state.free_milli,
        state.cpu_milli,
        state.memory,
        state.cpu_capacity_milli,
        state.memory_capacity,
    )


@dataclass(frozen=True)
class GpuFragmentationArgs:
    policy: str = "fgd-balance"
    window: int = 5000  # pods whose shapes make the mix (2000: 0.1 point more on openb)
    refresh: int = 64  # pods between rebuilds of the mix (a new shape rebuilds at once)
    milli_per_point: int = 10  # expected growth per score point (fgd-*)

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy: must be one of {', '.join(POLICIES)} (got {self.policy!r})")
        for name in ("window", "refresh", "milli_per_point"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name}: must be at least 1 (got {value})")


class GpuFragmentation:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: GpuFragmentationArgs) -> None:
        self.args = args
        self._learns = args.policy in _LEARNING
        self._window = ShapeWindow(args.window, FGD_FILL_COVERAGE_PERCENT)
        self._seen: set[TaskShape] = set()
        self._since_refresh = 0
        self._mix_total = 1
        self._policy: Policy = self._build()
        self._last_pod = ""
        self._shape: TaskShape | None = None
        self._generation = 0
        # A node with GPU cards has been scored: from then on pods asking no GPU are scored
        # (and learned) too, by the GPU their CPU and memory strand.
        self._gpu_nodes_seen = False
        # A pod asking no GPU, on a node without cards: it strands nothing there.
        self._no_cards_points = _NEUTRAL if args.policy in ("fgd-fill", "fgd") else 0
        # Per task shape: (model, card use, free cpu, free memory, total cpu, total memory) ->
        # raw score. Cleared when the policy is rebuilt.
        self._scores: dict[TaskShape, dict[tuple[object, ...], int]] = {}
        self._current: dict[tuple[object, ...], int] = {}
        # Per task shape: the policy's choice on a node state, cards in their own order (which
        # card of equal ones it takes may depend on it). Cleared with the scores.
        self._choices: dict[TaskShape, dict[_ExactState, Choice | None]] = {}
        self._current_choices: dict[_ExactState, Choice | None] = {}
        self._remembered = _RememberedChoices(self)

    def _build(self) -> Policy:
        policy = self.args.policy
        mix = self._window.mix()
        self._mix_total = mix.total or 1
        if policy == "fgd-balance":
            return FgdBalancePolicy(mix)
        if policy == "fgd-fill":
            return FgdFillPolicy(mix)
        if policy == "fgd":
            return FgdPolicy(mix)
        if policy == "best-fit":
            return BestFitPolicy()
        return GpuPackingPolicy()

    @property
    def policy(self) -> Policy:
        """The policy the scores are the answers of (rebuilt as the mix is learned)."""
        return self._policy

    def share_policy(self) -> Policy | None:
        """The policy a shard's card choice for a share follows (``gpu.choose_cards``), so the
        card it proposes is the one this score assumed: the current ``policy``, its choices
        remembered from scoring (``choose``); None: best fit (the same card for best-fit and
        packing)."""
        return self._remembered if self._learns else None

    def choose(self, state: GpuNodeState, task: TaskShape) -> Choice | None:
        """``policy.choose(state, task)``, remembered: a node scored in this state for this
        task has it already."""
        choices = self._choices.setdefault(task, {})
        key = _exact(state)
        if key in choices:
            return choices[key]
        found = choices[key] = self._policy.choose(state, task)
        return found

    def learn(self, shapes: Iterable[TaskShape]) -> None:
        """Start the mix afresh from ``shapes`` (the last ``window`` of them), as if these were
        the pods scored so far: the rescheduler's simulation learns the running pods' shapes,
        the mix a shard's window holds once the cluster has run a while, so the cards it picks
        for shares are the ones the shards' score would."""
        self._window = ShapeWindow(self.args.window, FGD_FILL_COVERAGE_PERCENT)
        self._seen = set()
        if self._learns:
            for shape in shapes:
                self._window.observe(shape)
                self._seen.add(shape)
        self._since_refresh = 0
        self._last_pod = ""
        self._rebuild()

    def forget_scores(self) -> None:
        """Drop every cached answer, as a rebuilt policy does (``bench/gpuscore_micro.py``)."""
        for answers in self._scores.values():
            answers.clear()
        for choices in self._choices.values():
            choices.clear()

    def observe(self, pod: PodInfo) -> None:
        """Take a new pod's shape into the mix, once per pod, before its nodes are scored
        (``LearningScore``: the search calls it first; ``score`` too, for callers that score
        directly). A pod asking no GPU counts once a node with cards has been scored: in a
        cluster without GPU nodes nothing is learned and nothing costs."""
        if pod.name == self._last_pod:
            return
        req = pod.req
        if not req.requests.gpus and not (self._learns and self._gpu_nodes_seen):
            return
        self._last_pod = pod.name
        shape = task_shape(req)
        self._shape = shape
        if self._learns:
            self._window.observe(shape)
            self._since_refresh += 1
            if shape not in self._seen or self._since_refresh >= self.args.refresh:
                self._seen.add(shape)
                self._since_refresh = 0
                self._rebuild()
        self._current = self._scores.setdefault(shape, {})
        self._current_choices = self._choices.setdefault(shape, {})

    def score_generation(self) -> int:
        """Changes with every rebuilt policy (``LearningScore``): a node's answer may differ."""
        return self._generation

    def _rebuild(self) -> None:
        self._policy = self._build()
        self._scores.clear()
        self._choices.clear()  # the old policy's choices, no longer this one's
        self._generation += 1

    def score(self, pod: PodInfo, node: NodeInfo) -> int:
        req = pod.req
        if not req.requests.gpus:
            if not node.card_used:
                return self._no_cards_points  # the one read a cluster without GPUs pays
            if not self._learns:
                return 0
            self._gpu_nodes_seen = True
        if pod.name != self._last_pod:
            self.observe(pod)
        capacity, used = node.capacity[req.pool], node.requested[req.pool]
        # Cards in any order score alike (the measures read the multiset of free amounts).
        key = (
            node.gpu_model,
            tuple(sorted(node.card_used)),
            capacity[0] - used[0],
            capacity[1] - used[1],
            capacity[0],
            capacity[1],
        )
        found = self._current.get(key)
        if found is None:
            shape = self._shape
            assert shape is not None  # set by observe
            self._gpu_nodes_seen = True
            state = node_state(node, req.pool)
            choice = self._policy.choose(state, shape)
            if self._learns:  # only a learning policy chooses a share's card (share_policy)
                self._current_choices[_exact(state)] = choice
            found = self._current[key] = self._points(state, choice)
        return found

    def _points(self, state: GpuNodeState, choice: Choice | None) -> int:
        policy = self.args.policy
        if policy == "fgd-balance":
            if choice is None:
                return _NO_ROOM
            # The policy's order itself: its growth (milli-GPU), then the free GPU left (its
            # packing tie-break), at a scale no other score's 0..100 reaches, so they only
            # break its exact ties. Squashed into 0..100 it lost both: thousands of distinct
            # growths fell into a few points, and LeastAllocated then spread the pods.
            growth, free_after = choice.score[0], choice.score[1]
            key = growth * _FREE_SPAN // self._mix_total + free_after
            return -_DECIDING * key
        if choice is None:
            return 0
        if policy in _LEARNING:
            growth = choice.score[0] // (self._mix_total * self.args.milli_per_point)
            return _clamp(_NEUTRAL - growth)
        if policy == "best-fit":
            # The sum of three shares of a million (GPU, CPU, memory left free).
            return _clamp(MAX_NODE_SCORE - choice.score[0] * MAX_NODE_SCORE // 3_000_000)
        tier, gpu_left = choice.score
        cards_total = len(state.free_milli) * MILLI_PER_GPU or 1
        spare = MAX_NODE_SCORE - 2 * _TIER_POINTS
        return _clamp((2 - tier) * _TIER_POINTS + spare - spare * gpu_left // cards_total)


class _RememberedChoices:
    """The GpuFragmentation plugin's current policy as ``gpu.choose_cards`` asks it for a
    share's card, answered from the choices the plugin kept while scoring."""

    def __init__(self, plugin: GpuFragmentation) -> None:
        self._plugin = plugin

    @property
    def name(self) -> str:
        return self._plugin.policy.name

    @property
    def policy(self) -> Policy:
        """The policy answering (the plugin's current one)."""
        return self._plugin.policy

    def choose(self, node: GpuNodeState, task: TaskShape) -> Choice | None:
        return self._plugin.choose(node, task)


def _clamp(points: int) -> int:
    return max(0, min(MAX_NODE_SCORE, points))


def new(args: GpuFragmentationArgs) -> GpuFragmentation:
    return GpuFragmentation(args)


_check: type[ScorePlugin] = GpuFragmentation
_check_policy: type[Policy] = _RememberedChoices
SPEC = PluginSpec(NAME, GpuFragmentationArgs, new)
