"""The movement generator: batches under budgets, deepest sink first, cycles whole, and an error
naming the moves no budget will ever admit."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.rescheduler.framework import Move
from services.rescheduler.generator import (
    BatchBudget,
    InfeasiblePlanError,
    PerKeyBudget,
    plan_batches,
)

BudgetFactory = Callable[[], BatchBudget] | None


def moves_of(*edges: tuple[str, str, str, str]) -> list[Move]:
    """(pod, job, source, target) tuples as moves."""
    return [Move(pod, job, source, target) for pod, job, source, target in edges]


def per_job(**limit: int) -> Callable[[], BatchBudget]:
    return lambda: PerKeyBudget.per_job(limit)


def at_most(cap: int) -> Callable[[], BatchBudget]:
    return lambda: PerKeyBudget(lambda _move: "batch", {"batch": cap})


def pods(batches: list[list[Move]]) -> list[list[str]]:
    return [[move.pod for move in batch] for batch in batches]


# -- invariants, shared by the graph tests and the property test -----------------------------------


def batch_index(batches: list[list[Move]]) -> dict[Move, int]:
    return {move: i for i, batch in enumerate(batches) for move in batch}


def components(moves: Sequence[Move]) -> dict[str, int]:
    graph: nx.DiGraph[str] = nx.DiGraph()
    graph.add_edges_from((m.source, m.target) for m in moves)
    return {
        node: i
        for i, members in enumerate(nx.strongly_connected_components(graph))
        for node in members
    }


def cycle_of(move: Move, component: dict[str, int]) -> int | None:
    """The strongly connected component ``move`` lies inside, or None if it joins two."""
    return component[move.source] if component[move.source] == component[move.target] else None


def assert_every_move_once(moves: Sequence[Move], batches: list[list[Move]]) -> None:
    planned = [move for batch in batches for move in batch]
    assert sorted(planned, key=lambda m: m.pod) == sorted(moves, key=lambda m: m.pod)


def assert_each_batch_fits_a_fresh_budget(
    batches: list[list[Move]], new_budget: Callable[[], BatchBudget]
) -> None:
    for i, batch in enumerate(batches):
        assert new_budget().admit(batch) is None, f"batch {i} exceeds its budget"


def assert_cycles_kept_together(moves: Sequence[Move], batches: list[list[Move]]) -> None:
    component, index = components(moves), batch_index(batches)
    cycle_batches: dict[int, set[int]] = {}
    for move in moves:
        cycle = cycle_of(move, component)
        if cycle is not None:
            cycle_batches.setdefault(cycle, set()).add(index[move])
    assert all(len(found) == 1 for found in cycle_batches.values()), cycle_batches


def assert_moves_out_no_later_than_moves_in(
    moves: Sequence[Move], batches: list[list[Move]]
) -> None:
    component, index = components(moves), batch_index(batches)
    for move_in in moves:
        for move_out in moves:
            if move_out.source != move_in.target:
                continue
            same_cycle = cycle_of(move_in, component) is not None and cycle_of(
                move_in, component
            ) == cycle_of(move_out, component)
            if not same_cycle:
                assert index[move_out] <= index[move_in], (move_out.pod, move_in.pod)


# -- table tests --------------------------------------------------------------------------------

WEB = moves_of(
    ("p1", "web", "n1", "n2"),
    ("p2", "web", "n3", "n4"),
    ("p3", "web", "n5", "n6"),
)


@pytest.mark.parametrize(
    ("case", "new_budget", "want"),
    [
        ("per-job-1", per_job(web=1), [["p1"], ["p2"], ["p3"]]),
        ("per-job-2", per_job(web=2), [["p1", "p2"], ["p3"]]),
        ("unlimited", None, [["p1", "p2", "p3"]]),
        ("cap-on-another-job-only", per_job(db=1), [["p1", "p2", "p3"]]),
    ],
)
def test_independent_moves_fill_each_batch_up_to_the_job_cap(
    case: str, new_budget: BudgetFactory, want: list[list[str]]
) -> None:
    assert pods(plan_batches(WEB, new_budget)) == want


CHAIN = moves_of(("p1", "web", "A", "B"), ("p2", "web", "B", "C"))


@pytest.mark.parametrize(
    ("case", "new_budget", "want"),
    [
        ("budget-1-frees-B-first", per_job(web=1), [["p2"], ["p1"]]),
        ("unlimited-one-batch-deepest-first", None, [["p2", "p1"]]),
    ],
)
def test_chain_moves_out_of_the_middle_node_first(
    case: str, new_budget: BudgetFactory, want: list[list[str]]
) -> None:
    assert pods(plan_batches(CHAIN, new_budget)) == want


SWAP = moves_of(("p1", "web", "A", "B"), ("p2", "web", "B", "A"))


@pytest.mark.parametrize(
    ("case", "new_budget"),
    [("unlimited", None), ("budget-2", per_job(web=2))],
)
def test_swap_is_one_batch(case: str, new_budget: BudgetFactory) -> None:
    assert pods(plan_batches(SWAP, new_budget)) == [["p1", "p2"]]


def test_swap_under_budget_1_is_infeasible_naming_both_moves() -> None:
    with pytest.raises(InfeasiblePlanError) as raised:
        plan_batches(SWAP, per_job(web=1))
    assert raised.value.remaining == SWAP
    assert raised.value.blocked == SWAP
    assert "p1 (A->B)" in str(raised.value) and "p2 (B->A)" in str(raised.value)
    assert "'web' allows 1 move(s) per batch" in raised.value.reason


@pytest.mark.parametrize(
    ("case", "moves", "new_budget", "want"),
    [
        ("alone", moves_of(("p1", "web", "A", "A")), None, [["p1"]]),
        (
            "before-a-move-into-its-node",
            moves_of(("p2", "web", "B", "A"), ("p1", "web", "A", "A")),
            per_job(web=1),
            [["p1"], ["p2"]],
        ),
        (
            "after-a-move-out-of-its-node",
            moves_of(("p1", "web", "A", "A"), ("p2", "web", "A", "C")),
            per_job(web=1),
            [["p2"], ["p1"]],
        ),
    ],
)
def test_self_loop_is_a_cycle_of_one(
    case: str, moves: list[Move], new_budget: BudgetFactory, want: list[list[str]]
) -> None:
    assert pods(plan_batches(moves, new_budget)) == want


# A 4-cycle A→B→C→D→A; G→E→A and F→B feed into it; C→H→J and D→I flow out of it.
RING = moves_of(
    ("r1", "ring", "A", "B"),
    ("r2", "ring", "B", "C"),
    ("r3", "ring", "C", "D"),
    ("r4", "ring", "D", "A"),
    ("f1", "feed", "E", "A"),
    ("f2", "feed", "F", "B"),
    ("f3", "feed", "G", "E"),
    ("o1", "out", "C", "H"),
    ("o2", "out", "D", "I"),
    ("o3", "out", "H", "J"),
)
RING_BUDGETS = [
    ("per-job", per_job(ring=4, feed=1, out=1)),
    ("at-most-4", at_most(4)),
    ("at-most-5", at_most(5)),
    ("at-most-4-of-ring-2-of-others", per_job(ring=4, feed=2, out=2)),
]


@pytest.mark.parametrize(("case", "new_budget"), RING_BUDGETS)
def test_four_cycle_graph_respects_caps_cycles_and_dependencies(
    case: str, new_budget: Callable[[], BatchBudget]
) -> None:
    batches = plan_batches(RING, new_budget)
    assert_each_batch_fits_a_fresh_budget(batches, new_budget)
    assert any({"r1", "r2", "r3", "r4"} <= set(batch) for batch in pods(batches))
    assert_every_move_once(RING, batches)
    assert_moves_out_no_later_than_moves_in(RING, batches)


@pytest.mark.parametrize(
    ("case", "new_budget", "want"),
    [
        (
            "per-job",
            per_job(ring=4, feed=1, out=1),
            [["o3"], ["o1"], ["o2", "r1", "r2", "r3", "r4", "f1"], ["f2"], ["f3"]],
        ),
        (
            "at-most-4",
            at_most(4),
            [["o3", "o1", "o2"], ["r1", "r2", "r3", "r4"], ["f1", "f2", "f3"]],
        ),
        (
            "unlimited",
            None,
            [["o3", "o1", "o2", "r1", "r2", "r3", "r4", "f1", "f2", "f3"]],
        ),
    ],
)
def test_four_cycle_graph_batches_are_deterministic(
    case: str, new_budget: BudgetFactory, want: list[list[str]]
) -> None:
    assert pods(plan_batches(RING, new_budget)) == want
    assert pods(plan_batches(list(RING), new_budget)) == want


def test_cycle_larger_than_any_batch_is_infeasible_naming_the_cycle() -> None:
    with pytest.raises(InfeasiblePlanError) as raised:
        plan_batches(RING, at_most(3))
    message = str(raised.value)
    assert all(f"{pod} (" in message for pod in ("r1", "r2", "r3", "r4"))
    # The outflow was planned before the ring blocked; everything after it is left.
    assert [m.pod for m in raised.value.remaining] == ["r1", "r2", "r3", "r4", "f1", "f2", "f3"]


def test_infeasible_error_message_lists_at_most_ten_blocked_moves() -> None:
    ring = [Move(f"p{i}", "web", f"n{i}", f"n{(i + 1) % 12}") for i in range(12)]
    with pytest.raises(InfeasiblePlanError) as raised:
        plan_batches(ring, per_job(web=11))
    assert "p9 (n9->n10) and 2 more:" in str(raised.value)
    assert "p10 (" not in str(raised.value)
    assert len(raised.value.blocked) == 12


def test_empty_input_plans_no_batches() -> None:
    assert plan_batches([], per_job(web=1)) == []


@pytest.mark.parametrize(
    ("case", "moves", "error"),
    [
        (
            "pod-moved-twice",
            moves_of(("p1", "web", "A", "B"), ("p1", "web", "B", "C")),
            r"move 1 \(p1 \(B->C\)\) moves pod 'p1' again \(already moved by move 0\)",
        ),
        (
            "empty-target",
            moves_of(("p1", "web", "A", "B"), ("p2", "web", "A", "")),
            r"move 1 \(p2 \(A->\)\) has an empty node name",
        ),
    ],
)
def test_bad_moves_are_rejected_naming_the_entry(case: str, moves: list[Move], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        plan_batches(moves)


# -- PerKeyBudget ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "asks", "want_admitted"),
    [
        ("within-limit", [["web"], ["web"]], [True, True]),
        ("over-limit-by-one-call", [["web", "web", "web"]], [False]),
        ("all-or-nothing", [["db", "web", "web", "web"], ["web", "web"]], [False, True]),
        ("rejection-counts-nothing", [["web"], ["web", "web"], ["web"]], [True, False, True]),
        ("unlisted-key-unlimited", [["db"] * 50], [True]),
        ("zero-limit-admits-none", [["batch"]], [False]),
    ],
)
def test_per_key_budget_admits_whole_asks_within_limit(
    case: str, asks: list[list[str]], want_admitted: list[bool]
) -> None:
    budget = PerKeyBudget.per_job({"web": 2, "batch": 0})
    got = [
        budget.admit([Move(f"p{i}", job, "A", "B") for i, job in enumerate(ask)]) is None
        for ask in asks
    ]
    assert got == want_admitted


def test_per_key_budget_reason_names_the_key() -> None:
    budget = PerKeyBudget.per_job({"web": 1})
    reason = budget.admit(moves_of(("p1", "web", "A", "B"), ("p2", "web", "C", "D")))
    assert reason == "'web' allows 1 move(s) per batch; 0 already in the batch, 2 more asked"


def test_per_key_budget_rejects_a_negative_limit_naming_the_key() -> None:
    with pytest.raises(ValueError, match="limit for 'web' is -1"):
        PerKeyBudget.per_job({"web": -1})


# -- properties over random move graphs -----------------------------------------------------------

NODES = ["A", "B", "C", "D", "E"]
JOBS = ["j1", "j2", "j3"]

random_moves = st.lists(
    st.tuples(st.sampled_from(NODES), st.sampled_from(NODES), st.sampled_from(JOBS)),
    max_size=14,
).map(lambda edges: [Move(f"p{i}", job, src, dst) for i, (src, dst, job) in enumerate(edges)])
random_limits = st.dictionaries(st.sampled_from(JOBS), st.integers(min_value=1, max_value=4))


def rejected_by_a_fresh_budget(moves: Sequence[Move], limits: dict[str, int]) -> bool:
    """Whether some cycle, or some single move, does not fit an empty batch."""
    component = components(moves)
    cycles: dict[int, list[Move]] = {}
    for move in moves:
        cycle = cycle_of(move, component)
        if cycle is not None:
            cycles.setdefault(cycle, []).append(move)
    asks = [*cycles.values(), *([move] for move in moves)]
    return any(PerKeyBudget.per_job(limits).admit(ask) is not None for ask in asks)


@settings(deadline=None, max_examples=300)
@given(moves=random_moves, limits=random_limits)
def test_random_graphs_plan_every_move_once_within_budget_in_dependency_order(
    moves: list[Move], limits: dict[str, int]
) -> None:
    def new_budget() -> BatchBudget:
        return PerKeyBudget.per_job(limits)

    try:
        batches = plan_batches(moves, new_budget)
    except InfeasiblePlanError as error:
        assert rejected_by_a_fresh_budget(moves, limits)
        assert error.remaining
        return
    assert all(batches)
    assert_every_move_once(moves, batches)
    assert_each_batch_fits_a_fresh_budget(batches, new_budget)
    assert_cycles_kept_together(moves, batches)
    assert_moves_out_no_later_than_moves_in(moves, batches)


@settings(deadline=None)
@given(moves=random_moves)
def test_random_graphs_without_a_budget_plan_one_batch(moves: list[Move]) -> None:
    assert len(plan_batches(moves)) == (1 if moves else 0)


def test_a_gangs_moves_share_one_batch() -> None:
    """g1 goes where w1 makes room (depth 2), g2 to a node nothing feeds (depth 1); w3 waits at
    depth 2 for its budget, so depth 1 waits too: without ``together`` the gang is split over
    two batches, with it both go in the first, and what they depend on (w1) with them."""
    w1, w2, w3, w4 = (Move("w1", "w", "y", "z"), Move("w2", "w", "x", "y"),
                      Move("w3", "w", "n", "o"), Move("w4", "w", "m", "n"))  # fmt: skip
    g1, g2 = Move("g1", "g", "a", "z"), Move("g2", "g", "c", "d")
    moves = [w1, w2, w3, w4, g1, g2]

    def budget() -> PerKeyBudget:
        return PerKeyBudget.per_job({"w": 1})

    split = plan_batches(moves, budget)
    assert [i for i, batch in enumerate(split) for m in batch if m.job == "g"] == [0, 1]
    whole = plan_batches(moves, budget, together=[[g1, g2]])
    assert {m.pod for m in whole[0]} == {"g1", "g2", "w1"}
    assert sorted(m.pod for batch in whole for m in batch) == sorted(m.pod for m in moves)


def test_a_gang_no_fresh_budget_admits_whole_is_infeasible() -> None:
    g1, g2 = Move("g1", "g", "a", "b"), Move("g2", "g", "c", "d")
    with pytest.raises(InfeasiblePlanError):
        plan_batches([g1, g2], lambda: PerKeyBudget.per_job({"g": 1}), together=[[g1, g2]])
