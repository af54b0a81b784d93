"""The movement generator: orders a round's moves into eviction batches.

Evicting a pod only helps its replacement if the target node has room, and the room is often made
by other moves out of that target. So moves form a graph of nodes (machines) with one edge per
move, and a move into a node should be evicted no earlier than the moves out of it. Strongly
connected components (swaps, rings, a pod moving within its own node) have no such order: their
moves must be evicted together or not at all, so each batch takes a cycle whole.

The condensation of that graph is acyclic. A component's *depth* is the longest chain of moves
flowing into it, so the deepest sinks are where room is made first: each batch starts at the
deepest depth, gives budget first to cycles and then to moves into components whose cycle is
taken, and only goes down a depth once every component above is finished. Each batch has a fresh
budget (disruption budgets recover between batches), and the greedy takes all it can, so
independent moves share batches.

Moves that must share a batch (a running gang's, moved whole: ``rescheduler/gangs.py``) are
tied into one component by edges that are no moves (each move's target to the next move's
source), so they are taken together, as a cycle is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from services.rescheduler.framework import Move

if TYPE_CHECKING:
    import networkx as nx


class BatchBudget(Protocol):
    def admit(self, moves: Sequence[Move]) -> str | None:
        """Admit all of ``moves`` into the batch being formed, or none of them: None when
        admitted (and counted), else the reason they do not fit this batch's budget."""
        ...


class InfeasiblePlanError(Exception):
    """Some moves can never be batched: a fresh budget rejects them (e.g. a swap of 2 pods under
    a budget of 1). ``remaining`` is every move not planned, in input order; ``blocked`` the moves
    a fresh budget rejected; ``reason`` the budget's last reason."""

    def __init__(self, remaining: list[Move], blocked: Sequence[Move], reason: str) -> None:
        super().__init__(
            f"no batch budget admits {describe_moves(blocked, limit=10)}: {reason} "
            f"({len(remaining)} move(s) left unplanned)"
        )
        self.remaining = remaining
        self.blocked = list(blocked)
        self.reason = reason


class PerKeyBudget:
    """At most ``limit[key(move)]`` moves per batch for each key; keys absent from ``limit``
    are unlimited."""

    def __init__(self, key: Callable[[Move], str], limit: Mapping[str, int]) -> None:
        for name, cap in limit.items():
            if cap < 0:
                raise ValueError(f"limit for {name!r} is {cap}; a per-batch limit must be >= 0")
        self._key = key
        self._limit = dict(limit)
        self._admitted: Counter[str] = Counter()

    @classmethod
    def per_job(cls, limit: Mapping[str, int]) -> PerKeyBudget:
        return cls(lambda move: move.job, limit)

    def admit(self, moves: Sequence[Move]) -> str | None:
        wanted = Counter(self._key(move) for move in moves)
        for name in sorted(wanted):
            cap = self._limit.get(name)
            if cap is not None and self._admitted[name] + wanted[name] > cap:
                return (
                    f"{name!r} allows {cap} move(s) per batch; {self._admitted[name]} already "
                    f"in the batch, {wanted[name]} more asked"
                )
        self._admitted.update(wanted)
        return None


class _Unlimited:
    def admit(self, moves: Sequence[Move]) -> str | None:
        return None


def describe_moves(moves: Sequence[Move], limit: int | None = None) -> str:
    """Moves as "p1 (A->B), p2 (B->A)"; beyond ``limit`` of them, a count of the rest."""
    shown = moves if limit is None else moves[:limit]
    text = ", ".join(f"{m.pod} ({m.source}->{m.target})" for m in shown)
    return text if len(shown) == len(moves) else f"{text} and {len(moves) - len(shown)} more"


@dataclass(slots=True)
class _Component:
    """A strongly connected set of nodes: the moves inside it (taken together) and the moves
    into it from other components (taken one by one, after the inside ones)."""

    first_seen: int  # earliest first appearance of its nodes: the tie-break between components
    depth: int = 0
    cycle: list[Move] = field(default_factory=list)
    inflow: list[Move] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return not self.cycle and not self.inflow


class _DepthChart:
    """The unfinished components by depth, each depth in first-appearance order."""

    def __init__(self, moves: Sequence[Move], together: Sequence[Sequence[Move]] = ()) -> None:
        # Imported by the first round that has moves: networkx is ~15 MiB of the process's heap,
        # which an idle rescheduler (no policy triggers a round by default) never needs.
        import networkx as nx

        graph: nx.DiGraph[str] = nx.DiGraph()
        for move in moves:  # node insertion order is first appearance, source before target
            graph.add_edge(move.source, move.target)
        for group in together:  # a ring through the group's nodes: one strong component
            for move, after in zip(group, [*group[1:], group[0]], strict=True):
                graph.add_edge(move.target, after.source)
        condensed = nx.condensation(graph)
        membership: dict[str, int] = condensed.graph["mapping"]
        first_seen = {node: index for index, node in enumerate(graph.nodes)}
        components = {
            scc: _Component(first_seen=min(first_seen[n] for n in condensed.nodes[scc]["members"]))
            for scc in condensed.nodes
        }
        for scc in nx.topological_sort(condensed):
            components[scc].depth = max(
                (components[feeder].depth + 1 for feeder in condensed.predecessors(scc)),
                default=0,
            )
        for move in moves:
            source, target = membership[move.source], membership[move.target]
            if source == target:
                components[source].cycle.append(move)
            else:
                components[target].inflow.append(move)
        self._by_depth: dict[int, list[_Component]] = {}
        for component in sorted(components.values(), key=lambda c: c.first_seen):
            if not component.finished:  # pure sources: nothing moves into or within them
                self._by_depth.setdefault(component.depth, []).append(component)

    def __bool__(self) -> bool:
        return bool(self._by_depth)

    def deepest_first(self) -> list[int]:
        return sorted(self._by_depth, reverse=True)

    def unfinished_at(self, depth: int) -> bool:
        return depth in self._by_depth

    def at(self, depth: int) -> list[_Component]:
        return self._by_depth[depth]

    def drop_finished(self, depth: int) -> None:
        unfinished = [c for c in self._by_depth[depth] if not c.finished]
        if unfinished:
            self._by_depth[depth] = unfinished
        else:
            del self._by_depth[depth]

    def remaining(self) -> set[Move]:
        return {
            move
            for components in self._by_depth.values()
            for component in components
            for move in (*component.cycle, *component.inflow)
        }


@dataclass(slots=True)
class _BatchAttempt:
    moves: list[Move] = field(default_factory=list)
    rejected: list[Move] = field(default_factory=list)
    reason: str = ""

    def offer(self, budget: BatchBudget, moves: list[Move]) -> bool:
        reason = budget.admit(moves)
        if reason is None:
            self.moves.extend(moves)
            return True
        self.rejected.extend(moves)
        self.reason = reason
        return False


def _fill_batch(chart: _DepthChart, budget: BatchBudget) -> _BatchAttempt:
    batch = _BatchAttempt()
    for depth in chart.deepest_first():
        components = chart.at(depth)
        for component in components:
            if component.cycle and batch.offer(budget, component.cycle):
                component.cycle = []
        for component in components:
            if not component.cycle:
                component.inflow = [m for m in component.inflow if not batch.offer(budget, [m])]
        chart.drop_finished(depth)
        if chart.unfinished_at(depth):
            break  # lower depths wait until every component above them is finished
    return batch


def _check_moves(moves: Sequence[Move]) -> None:
    seen: dict[str, int] = {}
    for index, move in enumerate(moves):
        if not move.source or not move.target:
            raise ValueError(f"move {index} ({describe_moves([move])}) has an empty node name")
        if move.pod in seen:
            raise ValueError(
                f"move {index} ({describe_moves([move])}) moves pod {move.pod!r} again "
                f"(already moved by move {seen[move.pod]})"
            )
        seen[move.pod] = index


def plan_batches(
    moves: Sequence[Move],
    new_budget: Callable[[], BatchBudget] | None = None,
    together: Sequence[Sequence[Move]] = (),
) -> list[list[Move]]:
    """Order ``moves`` into batches: each batch admitted by a fresh budget from new_budget()
    (None = unlimited: everything in one batch), dependencies respected (a move into a node
    comes in the same batch as, or a later batch than, the moves out of that node that make
    room for it — deepest sink first), cycles kept together, as few batches as the greedy
    allows. Raises InfeasiblePlanError when some component can never be admitted (e.g. a
    swap of 2 pods under a budget of 1). Each group of ``together`` (moves of ``moves``) is
    evicted in one batch, with whatever else must come with it.

    Within a batch, moves are in the order they were chosen: deepest first, cycles before the
    moves into them, ties by first appearance in ``moves``."""
    _check_moves(moves)
    budgets: Callable[[], BatchBudget] = new_budget or _Unlimited
    chart = _DepthChart(moves, together)
    batches: list[list[Move]] = []
    while chart:
        batch = _fill_batch(chart, budgets())
        if not batch.moves:
            # A fresh budget took nothing, and the next one would be just as fresh: stuck.
            left = chart.remaining()
            remaining = [move for move in moves if move in left]
            raise InfeasiblePlanError(remaining, batch.rejected, batch.reason)
        batches.append(batch.moves)
    return batches
