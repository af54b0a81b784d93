"""Fragmentation-aware GPU placement as pure functions (issue 30 item 3).

After Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent" (USENIX ATC '23). Inputs are plain values, so the same code
serves a Score plugin, the Binder's or a shard's card choice for a share, and the offline check
on the openb trace (``bench/gpufrag_sim.py``):

- ``GpuNodeState``: one node's model, free milli-GPU per card, free CPU milli and memory bytes
  (and the node's CPU and memory capacity, which only the Best-fit and LeastAllocated
  comparisons read).
- ``TaskShape``: what one task asks of one node: CPU milli, memory bytes, a card count and the
  milli-GPU it needs on each card, and the card models it accepts (empty: any).

A task with ``gpu_milli < 1000`` on one card is a *share*: it sits on one card with at least
that much free, beside others. A task of whole cards (``gpu_milli == 1000``) takes that many
wholly free cards of one node.

Definitions (module functions, each a table test in tests/test_gpufrag.py):

- ``fragmentation(node, shape)``: all the node's free milli-GPU if the shape cannot run there at
  all (a CPU-only shape, a model it does not accept, not enough CPU, memory or cards); else the
  free milli on the cards that each have less free than the shape needs per card.
- ``ShapeMix``: the frequent shapes (those covering 95 % of tasks, most frequent first) with
  their counts; ``weighted_fragmentation`` is the count-weighted sum over them, an integer;
  ``expected_fragmentation`` divides it by the counts' total (the paper's expected
  fragmentation, milli-GPU).
- ``ShapeWindow``: learns the mix from the last ``size`` tasks the cluster saw; O(1) per task,
  the frequent set recomputed only when asked after a change.
- ``unfillable(node, shape)``: the free milli-GPU a run of tasks of this shape would leave
  unused on the node (its cards, CPU and memory each bound how many fit): fragmentation looked
  at as far as the node goes rather than one task ahead.
- Policies, each a ``Policy`` (a node and a task → a ``Choice``: the score, lower is better,
  and the cards taken; None when the task does not fit): ``FgdPolicy`` (the growth of the
  expected fragmentation, the paper's FGD), ``FgdFillPolicy`` (this project's default: the
  growth of expected fragmentation plus expected unfillable GPU, then prefer nodes already in
  use), ``BestFitPolicy``, ``GpuPackingPolicy``, ``LeastAllocatedPolicy`` and
  ``RandomPolicy`` for comparison.
- ``Fleet``: many nodes' states grouped by identical state, each group's scores cached per task
  shape and its weighted fragmentation kept, so a placement costs a dict lookup per group and
  only the nodes that changed are scored again.

Quantities are integers; ties between equally scored nodes are broken uniformly at random with
the caller's ``random.Random`` (seeded in the benchmark), as kube-scheduler's selectHost does.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Protocol

MILLI_PER_GPU = 1000
# The paper's frequent shapes: the most frequent shapes that together make this share of tasks.
DEFAULT_COVERAGE_PERCENT = 95
# FgdFillPolicy's mix: every shape seen. The rare small shares are the ones that fill the
# sliver a large share leaves on its card; dropped from the mix, slivers all look alike.
FGD_FILL_COVERAGE_PERCENT = 100


@dataclass(frozen=True, slots=True)
class GpuNodeState:
    """One node's GPU-relevant state: what is free now, and what the node has."""

    model: str
    free_milli: tuple[int, ...]  # per card, 0..1000
    cpu_milli: int  # free
    memory: int  # free bytes
    cpu_capacity_milli: int = 0  # only the Best-fit and LeastAllocated comparisons read these
    memory_capacity: int = 0

    @property
    def free_gpu_milli(self) -> int:
        return sum(self.free_milli)


@dataclass(frozen=True, slots=True)
class TaskShape:
    """What one task asks of one node."""

    cpu_milli: int
    memory: int  # bytes
    gpu_count: int = 0
    gpu_milli: int = 0  # per card: < 1000 is a share of one card, 1000 whole cards
    models: frozenset[str] = frozenset()  # accepted card models; empty: any

    def __post_init__(self) -> None:
        problem = shape_problem(self)
        if problem:
            raise ValueError(problem)

    @property
    def gpu_request_milli(self) -> int:
        return self.gpu_count * self.gpu_milli

    @property
    def is_share(self) -> bool:
        return self.gpu_count == 1 and 0 < self.gpu_milli < MILLI_PER_GPU

    def accepts(self, model: str) -> bool:
        return not self.models or model in self.models


def shape_problem(shape: TaskShape) -> str:
    """The first rule a task shape breaks, as a one-line message; empty when it is valid."""
    if shape.cpu_milli < 0:
        return f"cpu_milli: must not be negative (got {shape.cpu_milli})"
    if shape.memory < 0:
        return f"memory: must not be negative (got {shape.memory})"
    if shape.gpu_count < 0:
        return f"gpu_count: must not be negative (got {shape.gpu_count})"
    if not 0 <= shape.gpu_milli <= MILLI_PER_GPU:
        return f"gpu_milli: must be 0..{MILLI_PER_GPU} (got {shape.gpu_milli})"
    if (shape.gpu_count == 0) != (shape.gpu_milli == 0):
        return (
            f"gpu_count and gpu_milli: both zero or both positive "
            f"(got {shape.gpu_count} cards of {shape.gpu_milli} milli)"
        )
    if shape.gpu_count > 1 and shape.gpu_milli != MILLI_PER_GPU:
        return (
            f"gpu_milli: a task of {shape.gpu_count} cards takes them whole (got {shape.gpu_milli})"
        )
    return ""


# --- Fitting and placing ---------------------------------------------------------------------


def fits_resources(node: GpuNodeState, task: TaskShape) -> bool:
    """The node's model, CPU and memory admit the task (cards aside)."""
    return (
        node.cpu_milli >= task.cpu_milli
        and node.memory >= task.memory
        and (not task.models or node.model in task.models)
    )


def card_options(node: GpuNodeState, task: TaskShape) -> list[tuple[int, ...]]:
    """The distinct ways to give the task its cards on this node (card indices, ascending);
    empty when it does not fit. Cards with the same free amount are interchangeable, so one
    option per distinct amount for a share; whole cards are all alike (the lowest free ones)."""
    if not fits_resources(node, task):
        return []
    if task.gpu_count == 0:
        return [()]
    free = node.free_milli
    if task.gpu_count == 1:
        seen: set[int] = set()
        options: list[tuple[int, ...]] = []
        for index, amount in enumerate(free):
            if amount >= task.gpu_milli and amount not in seen:
                seen.add(amount)
                options.append((index,))
        return options
    # Several cards: the ones with the least room that still hold the task each.
    candidates = sorted(
        (amount, index) for index, amount in enumerate(free) if amount >= task.gpu_milli
    )
    if len(candidates) < task.gpu_count:
        return []
    return [tuple(sorted(index for _, index in candidates[: task.gpu_count]))]


def fits(node: GpuNodeState, task: TaskShape) -> bool:
    return bool(card_options(node, task))


def place(node: GpuNodeState, task: TaskShape, cards: Sequence[int]) -> GpuNodeState:
    """The node's state once the task holds ``cards`` (as ``card_options`` gives them)."""
    if len(cards) != task.gpu_count:
        raise ValueError(f"cards: the task takes {task.gpu_count}, got {len(cards)}")
    free = list(node.free_milli)
    for index in cards:
        if free[index] < task.gpu_milli:
            raise ValueError(
                f"cards: card {index} has {free[index]} milli free, needs {task.gpu_milli}"
            )
        free[index] -= task.gpu_milli
    return replace(
        node,
        free_milli=tuple(free),
        cpu_milli=node.cpu_milli - task.cpu_milli,
        memory=node.memory - task.memory,
    )


# --- Fragmentation -----------------------------------------------------------------------------


def fragmentation(node: GpuNodeState, shape: TaskShape) -> int:
    """Milli-GPU of the node that a task of this shape could not use."""
    free = node.free_milli
    total = sum(free)
    if shape.gpu_count == 0 or not fits_resources(node, shape):
        return total
    usable = 0
    stranded = 0
    for amount in free:
        if amount >= shape.gpu_milli:
            usable += 1
        else:
            stranded += amount
    return stranded if usable >= shape.gpu_count else total


def unfillable(node: GpuNodeState, shape: TaskShape) -> int:
    """Milli-GPU of the node that a run of tasks of this shape would leave unused: all its free
    GPU less the GPU of as many such tasks as the node holds at once (cards, CPU and memory
    each bound the count). ``fragmentation`` looks one task ahead; this looks as far as the
    node goes, so a node whose CPU or memory runs out before its cards do counts the cards
    that would be left without them, and a card that holds two shares and a sliver counts the
    sliver."""
    free = node.free_milli
    total = sum(free)
    if shape.gpu_count == 0 or not fits_resources(node, shape):
        return total
    return total - _copies(free, node.cpu_milli, node.memory, shape) * shape.gpu_request_milli


def _copies(free: tuple[int, ...], cpu: int, memory: int, shape: TaskShape) -> int:
    if shape.gpu_count == 1:
        copies = sum(amount // shape.gpu_milli for amount in free)
    else:
        copies = sum(1 for amount in free if amount >= shape.gpu_milli) // shape.gpu_count
    if shape.cpu_milli:
        copies = min(copies, cpu // shape.cpu_milli)
    if shape.memory:
        copies = min(copies, memory // shape.memory)
    return copies


@dataclass(frozen=True, slots=True)
class ShapeMix:
    """The frequent task shapes and how often each was seen (most frequent first)."""

    shapes: tuple[tuple[TaskShape, int], ...]

    @property
    def total(self) -> int:
        return sum(count for _, count in self.shapes)

    @classmethod
    def of_counts(
        cls, counts: Mapping[TaskShape, int], coverage_percent: int = DEFAULT_COVERAGE_PERCENT
    ) -> ShapeMix:
        """The most frequent shapes that together make ``coverage_percent`` of the tasks
        (ties by a stable order of the shapes, so the same counts give the same mix)."""
        if not 0 < coverage_percent <= 100:
            raise ValueError(f"coverage_percent: must be 1..100 (got {coverage_percent})")
        ordered = sorted(counts.items(), key=lambda item: (-item[1], _shape_order(item[0])))
        seen = sum(count for _, count in ordered)
        chosen: list[tuple[TaskShape, int]] = []
        covered = 0
        for shape, count in ordered:
            if count <= 0 or covered * 100 >= coverage_percent * seen:
                break
            chosen.append((shape, count))
            covered += count
        return cls(tuple(chosen))

    @classmethod
    def of_tasks(
        cls, tasks: Iterable[TaskShape], coverage_percent: int = DEFAULT_COVERAGE_PERCENT
    ) -> ShapeMix:
        return cls.of_counts(Counter(tasks), coverage_percent)


def _shape_order(shape: TaskShape) -> tuple[int, int, int, int, tuple[str, ...]]:
    return (
        shape.gpu_count,
        shape.gpu_milli,
        shape.cpu_milli,
        shape.memory,
        tuple(sorted(shape.models)),
    )


def weighted_fragmentation(node: GpuNodeState, mix: ShapeMix) -> int:
    """Σ over the mix of count × fragmentation: the expected fragmentation times the total."""
    return _CompiledMix(mix).weighted(node)


def weighted_unfillable(node: GpuNodeState, mix: ShapeMix) -> int:
    """Σ over the mix of count × unfillable."""
    return _CompiledMix(mix).weighted_unfillable(node)


def expected_fragmentation(node: GpuNodeState, mix: ShapeMix) -> float:
    """The paper's expected fragmentation of the node, milli-GPU (0 for an empty mix)."""
    total = mix.total
    return weighted_fragmentation(node, mix) / total if total else 0.0


class _CompiledMix:
    """A mix laid out for the inner loop: shapes grouped by the per-card amount they need."""

    __slots__ = ("by_milli", "cpu_only", "mix")

    def __init__(self, mix: ShapeMix) -> None:
        self.mix = mix
        self.cpu_only = 0  # count of shapes that never use a GPU: all free GPU is theirs to lose
        grouped: dict[int, list[tuple[int, int, int, int, frozenset[str]]]] = {}
        for shape, count in mix.shapes:
            if shape.gpu_count == 0:
                self.cpu_only += count
                continue
            grouped.setdefault(shape.gpu_milli, []).append(
                (count, shape.cpu_milli, shape.memory, shape.gpu_count, shape.models)
            )
        self.by_milli = tuple((milli, tuple(rows)) for milli, rows in sorted(grouped.items()))

    def weighted(self, node: GpuNodeState) -> int:
        free = node.free_milli
        total = sum(free)
        if total == 0:
            return 0
        acc = self.cpu_only * total
        cpu = node.cpu_milli
        mem = node.memory
        model = node.model
        for milli, rows in self.by_milli:
            usable = 0
            stranded = 0
            for amount in free:
                if amount >= milli:
                    usable += 1
                else:
                    stranded += amount
            for count, need_cpu, need_mem, need_cards, models in rows:
                if (
                    usable >= need_cards
                    and cpu >= need_cpu
                    and mem >= need_mem
                    and (not models or model in models)
                ):
                    acc += count * stranded
                else:
                    acc += count * total
        return acc

    def weighted_unfillable(self, node: GpuNodeState) -> int:
        free = node.free_milli
        total = sum(free)
        if total == 0:
            return 0
        acc = self.cpu_only * total
        cpu = node.cpu_milli
        mem = node.memory
        model = node.model
        for milli, rows in self.by_milli:
            shares = 0  # copies of one card's worth of this milli
            whole = 0  # cards with this milli free
            for amount in free:
                if amount >= milli:
                    whole += 1
                    shares += amount // milli
            for count, need_cpu, need_mem, need_cards, models in rows:
                if models and model not in models:
                    acc += count * total
                    continue
                copies = shares if need_cards == 1 else whole // need_cards
                if need_cpu:
                    copies = min(copies, cpu // need_cpu)
                if need_mem:
                    copies = min(copies, mem // need_mem)
                acc += count * (total - copies * need_cards * milli)
        return acc


# --- Learning the mix ------------------------------------------------------------------------


class ShapeWindow:
    """The shape mix of the last ``size`` tasks seen: ``observe`` is O(1); ``mix()`` recomputes
    the frequent set only when something was observed since it last did."""

    def __init__(self, size: int, coverage_percent: int = DEFAULT_COVERAGE_PERCENT) -> None:
        if size < 1:
            raise ValueError(f"size: must be at least 1 (got {size})")
        if not 0 < coverage_percent <= 100:
            raise ValueError(f"coverage_percent: must be 1..100 (got {coverage_percent})")
        self.size = size
        self.coverage_percent = coverage_percent
        self._window: deque[TaskShape] = deque()
        self._counts: Counter[TaskShape] = Counter()
        self._mix: ShapeMix | None = ShapeMix(())

    def observe(self, shape: TaskShape) -> None:
        self._window.append(shape)
        self._counts[shape] += 1
        if len(self._window) > self.size:
            old = self._window.popleft()
            left = self._counts[old] - 1
            if left:
                self._counts[old] = left
            else:
                del self._counts[old]
        self._mix = None

    def __len__(self) -> int:
        return len(self._window)

    def mix(self) -> ShapeMix:
        if self._mix is None:
            self._mix = ShapeMix.of_counts(self._counts, self.coverage_percent)
        return self._mix


# --- Policies ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Choice:
    """A policy's verdict on one node: its score (lower is better) and the cards to take."""

    score: tuple[int, ...]
    cards: tuple[int, ...]


class Policy(Protocol):
    """Scores a node for a task; the same inputs give the same answer (a pure function)."""

    @property
    def name(self) -> str: ...

    def choose(self, node: GpuNodeState, task: TaskShape) -> Choice | None: ...


@dataclass(frozen=True)
class FgdPolicy:
    """FGD: the node and card where the expected fragmentation grows least."""

    mix: ShapeMix
    name: str = "fgd"
    _compiled: _CompiledMix = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", _CompiledMix(self.mix))

    def choose(self, node: GpuNodeState, task: TaskShape) -> Choice | None:
        options = card_options(node, task)
        if not options:
            return None
        compiled = self._compiled
        before = compiled.weighted(node)
        best: Choice | None = None
        for cards in options:
            growth = compiled.weighted(place(node, task, cards)) - before
            if best is None or growth < best.score[0]:
                best = Choice((growth,), cards)
        return best


def demand_weighted(mix: ShapeMix) -> ShapeMix:
    """The mix reweighted by the GPU each shape asks (count × milli-GPU per task), so a shape
    counts by the GPU demand it stands for rather than by how many tasks it is; CPU-only
    shapes drop out. (Tried as FGD's weights on the openb trace: bench/README.md.)"""
    return ShapeMix(
        tuple(
            (shape, count * shape.gpu_request_milli)
            for shape, count in mix.shapes
            if shape.gpu_request_milli
        )
    )


@dataclass(frozen=True)
class FgdFillPolicy:
    """fgd-balance's base: the node and card where the mix's expected fragmentation plus
    its expected ``unfillable`` GPU grow least (both count-weighted, so the score is in the
    same units as FGD's); among equal growth the node left with the least free GPU (pack onto
    nodes already in use, keep empty ones whole), then the card left with the least free.
    Give it the mix of every shape seen (``FGD_FILL_COVERAGE_PERCENT``).

    FGD alone sees one task ahead: a node whose CPU or memory will run out before its cards do
    looks unfragmented until the last moment, and nodes of equal growth (most of them for a
    whole-card or CPU-only task) are a coin toss. The unfillable term charges a placement for
    the GPU it leaves without the CPU or memory to use it; the packing tie-break keeps CPU-only
    tasks off nodes with free GPUs."""

    mix: ShapeMix
    name: str = "fgd-fill"
    _compiled: _CompiledMix = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", _CompiledMix(self.mix))

    def choose(self, node: GpuNodeState, task: TaskShape) -> Choice | None:
        options = card_options(node, task)
        if not options:
            return None
        compiled = self._compiled
        before = compiled.weighted(node) + compiled.weighted_unfillable(node)
        best: Choice | None = None
        for cards in options:
            after = place(node, task, cards)
            score = (
                compiled.weighted(after) + compiled.weighted_unfillable(after) - before,
                after.free_gpu_milli,
                sum(after.free_milli[i] for i in cards),
            )
            if best is None or score < best.score:
                best = Choice(score, cards)
        return best


# FgdBalancePolicy's weights on its two extra terms, against 1 each for fragmentation and
# unfillable (both count-weighted, so each extra term is scaled by the mix's total too). Found
# on the openb trace (bench/README.md, "Beating FGD"): 10 and 10 beat 1, 3 and 30 either way.
SLIVER_WEIGHT = 10
BALANCE_WEIGHT = 10
# A share size counts as a common one (a card's free milli can be expected to be filled by it)
# when at least this per mille of the mix's tasks ask it.
COMMON_SIZE_PER_MILLE = 10


def card_waste_table(mix: ShapeMix, per_mille: int = COMMON_SIZE_PER_MILLE) -> tuple[int, ...]:
    """For each free amount of one card, 0..1000: what stays free once that room is filled as
    well as the common per-card sizes allow (sizes asked by at least ``per_mille`` of the
    mix's tasks, summed per milli over shapes; whole cards always count). A rare size cannot be
    relied on: hundreds of 190-milli slivers wait on a few 160-milli shares."""
    if not 0 <= per_mille <= 1000:
        raise ValueError(f"per_mille: must be 0..1000 (got {per_mille})")
    by_milli: Counter[int] = Counter()
    for shape, count in mix.shapes:
        if shape.gpu_count:
            by_milli[shape.gpu_milli] += count
    total = mix.total
    sizes = sorted(
        {MILLI_PER_GPU}
        | {milli for milli, count in by_milli.items() if count * 1000 >= per_mille * total}
    )
    reachable = [False] * (MILLI_PER_GPU + 1)  # sums of common sizes that fit one card
    reachable[0] = True
    for amount in range(MILLI_PER_GPU + 1):
        if reachable[amount]:
            for size in sizes:
                if amount + size <= MILLI_PER_GPU:
                    reachable[amount + size] = True
    waste: list[int] = []
    best = 0
    for amount in range(MILLI_PER_GPU + 1):
        if reachable[amount]:
            best = amount
        waste.append(amount - best)
    return tuple(waste)


def card_waste(node: GpuNodeState, table: Sequence[int]) -> int:
    """Σ over the node's cards of the milli its free room would leave unfilled (``table``)."""
    return sum(table[amount] for amount in node.free_milli)


@dataclass(frozen=True, slots=True)
class GpuPerResource:
    """How much GPU the mix's GPU tasks ask per unit of CPU and of memory (count-weighted
    totals, kept as fractions of integers): the ratio a node must keep to use its cards."""

    gpu_milli: int  # Σ count × GPU request over the mix's GPU shapes
    cpu_milli: int  # Σ count × CPU request over the same shapes
    memory: int  # Σ count × memory over the same shapes

    @classmethod
    def of_mix(cls, mix: ShapeMix) -> GpuPerResource:
        gpu = cpu = memory = 0
        for shape, count in mix.shapes:
            if shape.gpu_count:
                gpu += count * shape.gpu_request_milli
                cpu += count * shape.cpu_milli
                memory += count * shape.memory
        return cls(gpu, cpu, memory)


def cpu_stranded(node: GpuNodeState, ratio: GpuPerResource) -> int:
    """Milli-GPU of the node that its free CPU and memory could not feed at the mix's average
    ratio: free GPU less what the scarcer of the two supports (0 when both suffice). Charges a
    placement that takes more CPU or memory per GPU than the workload's average on a node
    that has little to spare, before the node's last cards are stranded by it."""
    free = node.free_gpu_milli
    supported = free
    if ratio.cpu_milli:
        supported = min(supported, node.cpu_milli * ratio.gpu_milli // ratio.cpu_milli)
    if ratio.memory:
        supported = min(supported, node.memory * ratio.gpu_milli // ratio.memory)
    return free - supported


@dataclass(frozen=True)
class FgdBalancePolicy:
    """This project's default: ``FgdFillPolicy``'s score (expected fragmentation plus expected
    unfillable GPU, count-weighted) plus two terms, each weighted by the mix's total so all
    four share units, lowest growth first, then fgd-fill's tie-breaks:

    - ``SLIVER_WEIGHT`` × the growth of ``card_waste``: the room on the cards that the common
      share sizes cannot fill. FGD charges a half-used card as fragmented for every whole-card
      shape, so it hurries to fill it with whatever share comes (a 320 beside a 470 leaves
      210 that only rare shares fit); this term keeps such a card for a share that fits it
      well (another 470: 60 left).
    - ``BALANCE_WEIGHT`` × the growth of ``cpu_stranded``: the GPU the node's CPU and memory
      could not feed at the mix's average ratio, so CPU-hungry tasks go where CPU is plenty
      and the CPU-poor nodes (2 cards, 16 CPUs) keep theirs for GPU-heavy tasks.

    Give it the mix of every shape seen (``FGD_FILL_COVERAGE_PERCENT``)."""

    mix: ShapeMix
    name: str = "fgd-balance"
    _compiled: _CompiledMix = field(init=False, repr=False, compare=False)
    _waste: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _ratio: GpuPerResource = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", _CompiledMix(self.mix))
        object.__setattr__(self, "_waste", card_waste_table(self.mix))
        object.__setattr__(self, "_ratio", GpuPerResource.of_mix(self.mix))

    def measure(self, node: GpuNodeState) -> int:
        """The node's score before growth is taken: lower is a less fragmented node."""
        compiled = self._compiled
        total = self.mix.total
        return (
            compiled.weighted(node)
            + compiled.weighted_unfillable(node)
            + SLIVER_WEIGHT * total * card_waste(node, self._waste)
            + BALANCE_WEIGHT * total * cpu_stranded(node, self._ratio)
        )

    def choose(self, node: GpuNodeState, task: TaskShape) -> Choice | None:
        options = card_options(node, task)
        if not options:
            return None
        before = self.measure(node)
        best: Choice | None = None
        for cards in options:
            after = place(node, task, cards)
            score = (
                self.measure(after) - before,
                after.free_gpu_milli,
                sum(after.free_milli[i] for i in cards),
            )
            if best is None or score < best.score:
                best = Choice(score, cards)
        return best


@dataclass(frozen=True)
class BestFitPolicy:
    """Best-fit: the node left with the least free resources (free/capacity summed over GPU,
    CPU and memory, in parts per million); for a share, the card with the least free."""

    name: str = "best-fit"

    def choose(self, node: GpuNodeState, task: TaskShape) -> Choice | None:
        options = card_options(node, task)
        if not options:
            return None
        cards_total = len(node.free_milli) * MILLI_PER_GPU
        cpu_left = node.cpu_milli - task.cpu_milli
        mem_left = node.memory - task.memory
        left = _ppm(cpu_left, node.cpu_capacity_milli) + _ppm(mem_left, node.memory_capacity)
        gpu_left = node.free_gpu_milli - task.gpu_request_milli
        cards = min(options, key=lambda c: sum(node.free_milli[i] for i in c))
        return Choice((left + _ppm(gpu_left, cards_total),), cards)


@dataclass(frozen=True)
class GpuPackingPolicy:
    """GPU packing: a share goes first to a card already shared, then to a node with cards in
    use, then to an idle node; whole cards to the node with cards in use first. Within a tier,
    the least free GPU after."""

    name: str = "gpu-packing"

    def choose(self, node: GpuNodeState, task: TaskShape) -> Choice | None:
        options = card_options(node, task)
        if not options:
            return None
        cards = min(options, key=lambda c: sum(node.free_milli[i] for i in c))
        chosen_free = [node.free_milli[i] for i in cards]
        if any(0 < amount < MILLI_PER_GPU for amount in chosen_free):
            tier = 0
        elif any(amount < MILLI_PER_GPU for amount in node.free_milli):
            tier = 1
        else:
            tier = 2
        return Choice((tier, node.free_gpu_milli - task.gpu_request_milli), cards)


@dataclass(frozen=True)
class LeastAllocatedPolicy:
    """kube-scheduler's LeastAllocated over CPU and memory (the node left with the most free,
    as a share of capacity): spreads. A share takes the card with the most free."""

    name: str = "least-allocated"

    def choose(self, node: GpuNodeState, task: TaskShape) -> Choice | None:
        options = card_options(node, task)
        if not options:
            return None
        cpu_free = _ppm(node.cpu_milli - task.cpu_milli, node.cpu_capacity_milli)
        mem_free = _ppm(node.memory - task.memory, node.memory_capacity)
        cards = max(options, key=lambda c: sum(node.free_milli[i] for i in c))
        return Choice((-(cpu_free + mem_free),), cards)


@dataclass(frozen=True)
class RandomPolicy:
    """Every node that fits scores the same (so the tie-break picks one uniformly); the card
    is the first that holds the task."""

    name: str = "random"

    def choose(self, node: GpuNodeState, task: TaskShape) -> Choice | None:
        options = card_options(node, task)
        return Choice((0,), options[0]) if options else None


def _ppm(part: int, whole: int) -> int:
    return part * 1_000_000 // whole if whole > 0 else 0


def choose_node(
    nodes: Sequence[GpuNodeState], task: TaskShape, policy: Policy, rng: random.Random
) -> tuple[int, Choice] | None:
    """The index of the best node for the task and the policy's choice there (ties broken
    uniformly with ``rng``); None when no node fits. A scan without caches: ``Fleet`` is the
    fast form for many nodes."""
    best: Choice | None = None
    tied: list[tuple[int, Choice]] = []
    for index, node in enumerate(nodes):
        choice = policy.choose(node, task)
        if choice is None:
            continue
        if best is None or choice.score < best.score:
            best, tied = choice, [(index, choice)]
        elif choice.score == best.score:
            tied.append((index, choice))
    if not tied:
        return None
    return tied[rng.randrange(len(tied))] if len(tied) > 1 else tied[0]


# --- Many nodes --------------------------------------------------------------------------------


class _Group:
    """The nodes sharing one state, and that state's answers per task shape."""

    __slots__ = ("choices", "members", "state", "weighted")

    def __init__(self, state: GpuNodeState, weighted: int) -> None:
        self.state = state
        self.members: dict[str, None] = {}
        self.choices: dict[int, Choice | None] = {}
        self.weighted = weighted


class Fleet:
    """Nodes by name, grouped by identical state. Per group: its weighted fragmentation over
    ``mix`` and the policy's answer per task shape, computed when first asked; a changed node
    moves to the group of its new state, so only new states are scored. Choosing a node costs
    a dict lookup per distinct state."""

    def __init__(self, policy: Policy, mix: ShapeMix) -> None:
        self.policy = policy
        self.mix = mix
        self._compiled = _CompiledMix(mix)
        self._groups: dict[GpuNodeState, _Group] = {}
        self._node_state: dict[str, GpuNodeState] = {}
        self._order: dict[str, int] = {}  # when each node was first added
        self._shape_ids: dict[TaskShape, int] = {}
        self.weighted_total = 0  # Σ over nodes of weighted fragmentation

    def __len__(self) -> int:
        return len(self._node_state)

    def use_policy(self, policy: Policy) -> None:
        """Score with another policy from now on (a new mix learned): every cached answer goes."""
        self.policy = policy
        for group in self._groups.values():
            group.choices.clear()

    def state(self, name: str) -> GpuNodeState:
        return self._node_state[name]

    def states(self) -> Iterator[tuple[str, GpuNodeState]]:
        return iter(self._node_state.items())

    def expected_fragmentation_total(self) -> float:
        """Σ over nodes of expected fragmentation (milli-GPU)."""
        total = self.mix.total
        return self.weighted_total / total if total else 0.0

    def set(self, name: str, state: GpuNodeState) -> None:
        """Add the node, or move it to its new state."""
        old = self._node_state.get(name)
        if old == state:
            return
        if old is not None:
            self._leave(name, old)
        group = self._groups.get(state)
        if group is None:
            group = self._groups[state] = _Group(state, self._compiled.weighted(state))
        group.members[name] = None
        self.weighted_total += group.weighted
        self._order.setdefault(name, len(self._order))
        self._node_state[name] = state

    def remove(self, name: str) -> None:
        old = self._node_state.pop(name, None)
        if old is not None:
            self._leave(name, old)

    def _leave(self, name: str, state: GpuNodeState) -> None:
        group = self._groups[state]
        del group.members[name]
        self.weighted_total -= group.weighted
        if not group.members:
            del self._groups[state]

    def choose(self, task: TaskShape, rng: random.Random | None) -> tuple[str, Choice] | None:
        """The node and the policy's choice there: among the best scored, uniformly at random
        with ``rng``, or without one the first added (kube-scheduler's order of the list)."""
        shape_id = self._shape_ids.setdefault(task, len(self._shape_ids))
        choose = self.policy.choose
        best: tuple[int, ...] | None = None
        tied: list[_Group] = []
        tied_nodes = 0
        for group in self._groups.values():
            choices = group.choices
            if shape_id in choices:
                choice = choices[shape_id]
            else:
                choice = choices[shape_id] = choose(group.state, task)
            if choice is None:
                continue
            score = choice.score
            if best is None or score < best:
                best = score
                tied = [group]
                tied_nodes = len(group.members)
            elif score == best:
                tied.append(group)
                tied_nodes += len(group.members)
        if best is None:
            return None
        if rng is None:
            order = self._order
            first = min((name for group in tied for name in group.members), key=order.__getitem__)
            chosen = self._groups[self._node_state[first]].choices[shape_id]
            assert chosen is not None
            return first, chosen
        pick = rng.randrange(tied_nodes) if tied_nodes > 1 else 0
        for group in tied:
            if pick < len(group.members):
                name = next(islice(group.members, pick, None))
                chosen = group.choices[shape_id]
                assert chosen is not None
                return name, chosen
            pick -= len(group.members)
        raise AssertionError("tie pick out of range")  # unreachable: pick < tied_nodes
