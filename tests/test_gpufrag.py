"""placement.gpufrag: each definition as a table of hand-computed cases, the policies' choices,
the learned shape mix and the Fleet's caches (which must answer as the plain scan does)."""

from __future__ import annotations

import random

import pytest

from placement.gpufrag import (
    BestFitPolicy,
    Choice,
    FgdBalancePolicy,
    FgdFillPolicy,
    FgdPolicy,
    Fleet,
    GpuNodeState,
    GpuPackingPolicy,
    GpuPerResource,
    LeastAllocatedPolicy,
    RandomPolicy,
    ShapeMix,
    ShapeWindow,
    TaskShape,
    card_options,
    card_waste_table,
    choose_node,
    cpu_stranded,
    demand_weighted,
    expected_fragmentation,
    fragmentation,
    place,
    unfillable,
    weighted_fragmentation,
    weighted_unfillable,
)

GIB = 1 << 30


def node(
    free: tuple[int, ...], cpu: int = 10_000, mem: int = 10 * GIB, model: str = "G2"
) -> GpuNodeState:
    return GpuNodeState(model, free, cpu, mem, cpu_capacity_milli=64_000, memory_capacity=64 * GIB)


def share(
    milli: int, cpu: int = 2_000, mem: int = GIB, models: frozenset[str] = frozenset()
) -> TaskShape:
    return TaskShape(cpu, mem, 1, milli, models)


def whole(cards: int, cpu: int = 2_000, mem: int = GIB) -> TaskShape:
    return TaskShape(cpu, mem, cards, 1000)


CPU_ONLY = TaskShape(1_000, GIB)
MIXED = node((1000, 530, 0, 200))  # 1,730 milli free


@pytest.mark.parametrize(
    ("state", "shape", "expected", "why"),
    [
        (MIXED, share(470), 200, "cards below 470: the 200 (the 0 counts nothing)"),
        (MIXED, share(810), 730, "cards below 810: 530 + 200"),
        (MIXED, whole(1), 730, "one whole card fits; the partial cards are stranded"),
        (MIXED, whole(2), 1730, "two whole cards do not fit: everything free"),
        (MIXED, CPU_ONLY, 1730, "a CPU-only shape uses no GPU: everything free"),
        (MIXED, share(470, cpu=20_000), 1730, "not enough CPU"),
        (MIXED, share(470, mem=20 * GIB), 1730, "not enough memory"),
        (MIXED, share(470, models=frozenset({"T4"})), 1730, "model not accepted"),
        (MIXED, share(470, models=frozenset({"G2", "T4"})), 200, "model accepted"),
        (node((1000,) * 8), whole(8), 0, "an empty node fits eight whole cards"),
        (node((0, 0)), share(100), 0, "nothing free, nothing stranded"),
        (node((100, 100)), share(100), 0, "a card with exactly the need is usable"),
        (node((99, 100)), share(100), 99, "one milli short is stranded"),
    ],
)
def test_fragmentation(state: GpuNodeState, shape: TaskShape, expected: int, why: str) -> None:
    assert fragmentation(state, shape) == expected, why


FILLING = node((1000, 1000, 530))  # 2,530 milli free, 10,000 CPU, 10 GiB


@pytest.mark.parametrize(
    ("state", "shape", "expected", "why"),
    [
        (FILLING, share(470), 180, "2 + 2 + 1 shares of 470 (CPU holds 5): 2,530 − 2,350"),
        (FILLING, share(470, cpu=4_000), 1590, "CPU holds 2 shares: 2,530 − 940"),
        (FILLING, share(470, mem=4 * GIB), 1590, "memory holds 2 shares: 2,530 − 940"),
        (FILLING, whole(1), 530, "two whole cards: the 530 is left"),
        (FILLING, whole(2), 530, "one pair of whole cards"),
        (FILLING, whole(2, mem=20 * GIB), 2530, "not enough memory for one"),
        (FILLING, CPU_ONLY, 2530, "a CPU-only shape uses no GPU"),
        (FILLING, share(470, models=frozenset({"T4"})), 2530, "model not accepted"),
        (node((0, 0)), share(100), 0, "nothing free"),
    ],
)
def test_unfillable(state: GpuNodeState, shape: TaskShape, expected: int, why: str) -> None:
    assert unfillable(state, shape) == expected, why
    assert weighted_unfillable(state, ShapeMix(((shape, 2),))) == 2 * expected


def test_expected_fragmentation_weights_the_mix_by_count() -> None:
    mix = ShapeMix(((share(470), 3), (whole(1), 1)))
    # 3 × 200 + 1 × 730
    assert weighted_fragmentation(MIXED, mix) == 1330
    assert expected_fragmentation(MIXED, mix) == pytest.approx(1330 / 4)
    assert expected_fragmentation(MIXED, ShapeMix(())) == 0.0


@pytest.mark.parametrize(
    ("coverage", "expected"),
    [
        (95, ("a", "b", "c")),  # 50, 80, 95: covers 95 %
        (80, ("a", "b")),
        (81, ("a", "b", "c")),
        (100, ("a", "b", "c", "d")),
        (1, ("a",)),
    ],
)
def test_shape_mix_keeps_the_frequent_shapes(coverage: int, expected: tuple[str, ...]) -> None:
    shapes = {"a": share(100), "b": share(200), "c": whole(1), "d": CPU_ONLY}
    counts = {shapes["a"]: 50, shapes["b"]: 30, shapes["c"]: 15, shapes["d"]: 5}
    mix = ShapeMix.of_counts(counts, coverage)
    assert [shape for shape, _ in mix.shapes] == [shapes[name] for name in expected]
    assert mix.total == sum(counts[shapes[name]] for name in expected)


def test_shape_mix_orders_equal_counts_stably() -> None:
    first = ShapeMix.of_tasks([share(300), share(200), share(200), share(300)])
    second = ShapeMix.of_tasks([share(200), share(300), share(300), share(200)])
    assert first == second


def test_shape_mix_refuses_a_bad_coverage() -> None:
    with pytest.raises(ValueError, match=r"coverage_percent: must be 1\.\.100"):
        ShapeMix.of_counts({}, 0)


def test_demand_weighting_counts_gpu_and_drops_cpu_only_shapes() -> None:
    mix = ShapeMix(((share(250), 4), (whole(2), 1), (CPU_ONLY, 9)))
    assert demand_weighted(mix) == ShapeMix(((share(250), 1000), (whole(2), 2000)))


def test_shape_window_forgets_the_oldest_and_recomputes_lazily() -> None:
    window = ShapeWindow(size=3, coverage_percent=100)
    a, b, c = share(100), share(200), whole(1)
    for shape in (a, a, b, c):
        window.observe(shape)
    assert len(window) == 3
    mix = window.mix()
    assert dict(mix.shapes) == {a: 1, b: 1, c: 1}  # the first a fell out of the window
    assert window.mix() is mix  # nothing seen since: not recomputed
    window.observe(c)
    assert dict(window.mix().shapes) == {b: 1, c: 2}


def test_shape_window_refuses_an_empty_window() -> None:
    with pytest.raises(ValueError, match="size: must be at least 1"):
        ShapeWindow(0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cpu_milli": -1, "memory": 0}, "cpu_milli: must not be negative"),
        (
            {"cpu_milli": 0, "memory": 0, "gpu_count": 1, "gpu_milli": 1001},
            "gpu_milli: must be 0..1000",
        ),
        ({"cpu_milli": 0, "memory": 0, "gpu_count": 1}, "both zero or both positive"),
        ({"cpu_milli": 0, "memory": 0, "gpu_count": 2, "gpu_milli": 500}, "takes them whole"),
    ],
)
def test_task_shape_refuses_what_cannot_be_placed(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TaskShape(
            kwargs["cpu_milli"],
            kwargs["memory"],
            kwargs.get("gpu_count", 0),
            kwargs.get("gpu_milli", 0),
        )


@pytest.mark.parametrize(
    ("state", "task", "expected"),
    [
        (node((1000, 530, 530, 200)), share(470), [(0,), (1,)]),  # one option per distinct amount
        (node((1000, 530, 1000, 200)), whole(2), [(0, 2)]),
        (node((1000, 530)), whole(2), []),
        (node((1000,), cpu=100), share(100), []),
        (node((0,)), CPU_ONLY, [()]),
    ],
)
def test_card_options(
    state: GpuNodeState, task: TaskShape, expected: list[tuple[int, ...]]
) -> None:
    assert card_options(state, task) == expected


def test_place_takes_cards_cpu_and_memory_and_refuses_a_short_card() -> None:
    after = place(MIXED, share(470), (1,))
    assert (after.free_milli, after.cpu_milli, after.memory) == ((1000, 60, 0, 200), 8_000, 9 * GIB)
    with pytest.raises(ValueError, match="card 3 has 200 milli free, needs 470"):
        place(MIXED, share(470), (3,))


def test_fgd_puts_a_share_where_expected_fragmentation_grows_least() -> None:
    mix = ShapeMix(((share(470), 1), (whole(1), 1)))
    state = node((1000, 530))
    # before: 0 (share) + 530 (whole) = 530
    # card 0 → (530, 530): 0 + 1060 (no whole card left) = 1060, growth +530
    # card 1 → (1000, 60): 60 + 60 = 120, growth −410
    assert FgdPolicy(mix).choose(state, share(470)) == Choice((-410,), (1,))


def test_fgd_prefers_the_node_that_strands_nothing() -> None:
    mix = ShapeMix(((whole(1), 1),))
    nodes = [node((1000, 1000), cpu=4_000), node((1000, 1000), cpu=10_000)]
    task = whole(1, cpu=2_000)
    # The first node keeps 2,000 CPU: its last card is stranded for a 2,000-CPU shape? no, it
    # fits; with a 3,000-CPU shape it would not: the mix's shape asks 2,000, so both grow 0 and
    # a heavier task decides.
    heavy = whole(1, cpu=3_000)
    mix_heavy = ShapeMix(((heavy, 1),))
    chosen = choose_node(nodes, task, FgdPolicy(mix_heavy), random.Random(0))
    assert chosen is not None and chosen[0] == 1  # node 0 would keep 2,000 CPU < 3,000
    assert FgdPolicy(mix).choose(nodes[0], task) == Choice((0,), (0,))


def test_fgd_fill_breaks_ties_towards_used_nodes() -> None:
    mix = ShapeMix(((whole(1), 1),))
    nodes = [node((1000, 1000)), node((1000, 0))]
    chosen = choose_node(nodes, whole(1), FgdFillPolicy(mix), random.Random(0))
    assert chosen is not None and chosen[0] == 1


def test_fgd_fill_keeps_cpu_for_the_cards_where_fgd_tosses_a_coin() -> None:
    """A CPU-only task: FGD sees no growth on either node (the mix's one-card shape still fits
    both); the unfillable term sees that on the CPU-tight node one card would be left without
    CPU for its task."""
    mix = ShapeMix(((whole(1, cpu=2_000), 1),))
    tight, roomy = node((1000, 1000), cpu=4_000), node((1000, 1000), cpu=40_000)
    task = TaskShape(2_000, GIB)
    assert FgdPolicy(mix).choose(tight, task) == FgdPolicy(mix).choose(roomy, task)
    chosen = choose_node([tight, roomy], task, FgdFillPolicy(mix), random.Random(0))
    assert chosen is not None and chosen[0] == 1
    fill_choice = FgdFillPolicy(mix).choose(tight, task)
    assert fill_choice is not None and fill_choice.score[0] == 1000


@pytest.mark.parametrize(
    ("policy", "nodes", "task", "expected_node", "expected_cards"),
    [
        # Best-fit: the node left with the least (GPU, CPU, memory) as shares of capacity.
        (BestFitPolicy(), [node((1000, 1000)), node((1000, 300))], share(200), 1, (1,)),
        (BestFitPolicy(), [node((1000,), cpu=60_000), node((1000,))], whole(1), 1, (0,)),
        # GPU packing: a card already shared first, even on a node with more free.
        (GpuPackingPolicy(), [node((1000, 1000)), node((1000, 600, 1000))], share(500), 1, (1,)),
        (GpuPackingPolicy(), [node((1000, 1000)), node((1000, 0))], whole(1), 1, (0,)),
        # LeastAllocated: the node left with most CPU and memory free; a share on the emptiest card.
        (
            LeastAllocatedPolicy(),
            [node((1000,), cpu=5_000), node((600, 900), cpu=40_000)],
            share(500),
            1,
            (1,),
        ),
    ],
)
def test_comparison_policies(
    policy: BestFitPolicy | GpuPackingPolicy | LeastAllocatedPolicy,
    nodes: list[GpuNodeState],
    task: TaskShape,
    expected_node: int,
    expected_cards: tuple[int, ...],
) -> None:
    chosen = choose_node(nodes, task, policy, random.Random(0))
    assert chosen is not None
    assert (chosen[0], chosen[1].cards) == (expected_node, expected_cards)


def test_random_policy_spreads_over_every_node_that_fits() -> None:
    nodes = [node((1000,)), node((1000,)), node((0,)), node((1000,))]
    rng = random.Random(3)
    seen = set()
    for _ in range(200):
        chosen = choose_node(nodes, whole(1), RandomPolicy(), rng)
        assert chosen is not None
        seen.add(chosen[0])
    assert seen == {0, 1, 3}


def test_no_node_fits() -> None:
    assert choose_node([node((500,))], whole(1), FgdPolicy(ShapeMix(())), random.Random(0)) is None


def test_fleet_answers_as_the_plain_scan_and_keeps_its_totals() -> None:
    """A seeded random run: the Fleet (grouped states, cached scores) picks a node the plain
    scan scores best, and its fragmentation total is the sum over nodes."""
    rng = random.Random(11)
    tasks = [share(470), share(230), whole(1), whole(2), CPU_ONLY, share(810, cpu=6_000)]
    mix = ShapeMix.of_tasks(tasks)
    policy = FgdPolicy(mix)
    fleet = Fleet(policy, mix)
    for index in range(12):
        fleet.set(f"n{index}", node((1000,) * (2 if index % 3 else 8), cpu=32_000, mem=64 * GIB))
    for _ in range(60):
        task = rng.choice(tasks)
        states = dict(fleet.states())
        scored = {name: policy.choose(state, task) for name, state in states.items()}
        feasible = {name: c.score for name, c in scored.items() if c is not None}
        chosen = fleet.choose(task, rng)
        if chosen is None:
            assert not feasible
            continue
        name, choice = chosen
        assert feasible[name] == min(feasible.values())
        assert choice == scored[name]
        fleet.set(name, place(states[name], task, choice.cards))
        expected_total = sum(weighted_fragmentation(s, mix) for _, s in fleet.states())
        assert fleet.weighted_total == expected_total


def test_fleet_without_a_random_source_takes_the_first_added_of_the_best() -> None:
    mix = ShapeMix(((whole(1), 1),))
    fleet = Fleet(FgdPolicy(mix), mix)
    for name in ("b", "a", "c"):
        fleet.set(name, node((1000, 1000)))
    chosen = fleet.choose(whole(1), None)
    assert chosen is not None and chosen[0] == "b"
    fleet.remove("b")
    chosen = fleet.choose(whole(1), None)
    assert chosen is not None and chosen[0] == "a"
    assert len(fleet) == 2


def test_fleet_forgets_its_cached_answers_for_a_new_policy() -> None:
    heavy = whole(1, cpu=3_000)
    fleet = Fleet(FgdPolicy(ShapeMix(((whole(1), 1),))), ShapeMix(()))
    fleet.set("tight", node((1000, 1000), cpu=4_000))
    fleet.set("roomy", node((1000, 1000), cpu=40_000))
    first = fleet.choose(whole(1, cpu=2_000), None)
    assert first is not None and first[0] == "tight"  # no growth anywhere: the first added
    fleet.use_policy(FgdPolicy(ShapeMix(((heavy, 1),))))
    second = fleet.choose(whole(1, cpu=2_000), None)
    assert second is not None and second[0] == "roomy"  # tight would keep 2,000 CPU < 3,000


# --- fgd-balance ---------------------------------------------------------------------------

BALANCE_MIX = ShapeMix(((share(470), 100), (share(320), 100), (share(160), 1), (whole(1), 100)))


@pytest.mark.parametrize(
    ("amount", "per_mille", "expected", "why"),
    [
        (1000, 10, 0, "a whole card is always filled"),
        (530, 10, 60, "a 470 fills it best"),
        (210, 10, 210, "the 160 is rare (1 of 301 tasks): nothing common fits"),
        (210, 0, 50, "every size counts: the 160 fits"),
        (680, 10, 40, "two 320s"),
        (790, 10, 0, "a 470 and a 320"),
        (0, 10, 0, "nothing free, nothing wasted"),
    ],
)
def test_card_waste_table(amount: int, per_mille: int, expected: int, why: str) -> None:
    assert card_waste_table(BALANCE_MIX, per_mille)[amount] == expected, why


def test_card_waste_table_refuses_a_bad_per_mille() -> None:
    with pytest.raises(ValueError, match=r"per_mille: must be 0\.\.1000 \(got 1001\)"):
        card_waste_table(BALANCE_MIX, 1001)


@pytest.mark.parametrize(
    ("state", "expected", "why"),
    [
        (node((1000, 1000), cpu=4_000), 0, "4 CPUs feed both cards at 2 CPUs a card"),
        (node((1000, 1000), cpu=1_000), 1500, "1 CPU feeds half a card"),
        (node((1000, 1000), cpu=40_000, mem=GIB // 2), 1500, "memory feeds half a card"),
        (node((0, 0), cpu=0), 0, "no free GPU, nothing stranded"),
    ],
)
def test_cpu_stranded(state: GpuNodeState, expected: int, why: str) -> None:
    ratio = GpuPerResource.of_mix(ShapeMix(((whole(1, cpu=2_000), 3), (CPU_ONLY, 5))))
    assert ratio == GpuPerResource(3000, 6000, 3 * GIB)  # the CPU-only shape does not count
    assert cpu_stranded(state, ratio) == expected, why


def test_fgd_balance_keeps_a_half_card_for_the_share_that_fits_it() -> None:
    """Free [530, 1000], a 320 share. fgd-fill fills the half card (its 530 counts as
    fragmented for every bigger shape), leaving 210 that no common size fills; fgd-balance
    puts it on the whole card (680: two 320s leave 40) and keeps the 530 for a 470 (60)."""
    state = node((530, 1000))
    fill_choice = FgdFillPolicy(BALANCE_MIX).choose(state, share(320))
    balance_choice = FgdBalancePolicy(BALANCE_MIX).choose(state, share(320))
    assert fill_choice is not None and fill_choice.cards == (0,)
    assert balance_choice is not None and balance_choice.cards == (1,)


def test_fgd_balance_sends_a_cpu_hungry_task_where_cpu_is_plenty() -> None:
    mix = ShapeMix(((whole(1, cpu=8_000), 10),))
    poor, rich = node((1000, 1000), cpu=16_000), node((1000, 1000), cpu=100_000)
    chosen = choose_node(
        [poor, rich], share(500, cpu=12_000), FgdBalancePolicy(mix), random.Random(0)
    )
    assert chosen is not None and chosen[0] == 1
