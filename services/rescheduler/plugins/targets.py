"""Finding move targets fast: nodes kept ranked by a key (utilisation), a memo of nodes known to
lack room for a request shape, the generic acceptance test every target passes, and all-or-nothing
draining.

A round may consider thousands of pods against thousands of nodes, so nothing here re-sorts or
re-scans the cluster per pod: rankings move one node at a time, and a "no room" verdict is
remembered until the node loses a pod (a node that only gains pods never regains room).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Sequence

from placement.nodeinfo import NodeInfo, PodRequest, resource_fit_failures
from services.rescheduler.framework import (
    RESOURCE_INDEX,
    ClusterView,
    Move,
    MoveVeto,
    RunningPod,
)

# Sorts after every node name, so bisecting on (key, _AFTER_ALL_NAMES) passes all ties of key.
_AFTER_ALL_NAMES = chr(0x10FFFF)


class RankedNodes:
    """Node names ordered by ``value(name)`` (ascending, or descending), ties by name.

    Call :meth:`rank` after a node's value changed (or to add it) and :meth:`discard` to drop it;
    both cost a bisection, not a sort. Do not change the ranking while iterating it.
    """

    def __init__(
        self, value: Callable[[str], float], names: Iterable[str], *, descending: bool
    ) -> None:
        self._value = value
        self._sign = -1.0 if descending else 1.0
        self._entries: dict[str, tuple[float, str]] = {}
        self._order: list[tuple[float, str]] = []
        for name in names:
            self._entries[name] = (self._sign * value(name), name)
        self._order = sorted(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._order)

    def rank(self, name: str) -> None:
        self.discard(name)
        entry = (self._sign * self._value(name), name)
        self._entries[name] = entry
        bisect.insort(self._order, entry)

    def discard(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is not None:
            del self._order[bisect.bisect_left(self._order, entry)]

    def items(self) -> Iterator[tuple[float, str]]:
        """(value, name) pairs in rank order."""
        return ((self._sign * key, name) for key, name in self._order)

    def items_past(self, value: float) -> Iterator[tuple[float, str]]:
        """The pairs ranked after every node whose value is ``value`` or comes before it
        (descending: value < ``value``; ascending: value > ``value``)."""
        start = bisect.bisect_right(self._order, (self._sign * value, _AFTER_ALL_NAMES))
        order = self._order
        return ((self._sign * order[i][0], order[i][1]) for i in range(start, len(order)))


class RoomCache:
    """Remembers "``node`` has no room for requests of this shape" (pool and amounts).

    Sound because room only shrinks while a node gains pods; :meth:`freed` forgets a node's
    verdicts once it loses one. The test is NodeResourcesFit's own (placement.nodeinfo), so a
    node it rejects would fail ``view.fits`` too.
    """

    def __init__(self) -> None:
        self._full: dict[str, set[tuple[str, int, int, int]]] = {}

    def has_room(self, node: NodeInfo, req: PodRequest) -> bool:
        shape = (req.pool, req.cpu, req.mem, req.gpu)
        full = self._full.get(node.name)
        if full is not None and shape in full:
            return False
        if resource_fit_failures(node, req):
            self._full.setdefault(node.name, set()).add(shape)
            return False
        return True

    def freed(self, node: str) -> None:
        self._full.pop(node, None)


def first_target(
    view: ClusterView,
    pod: RunningPod,
    candidates: Iterable[str],
    room: RoomCache,
    veto: MoveVeto,
) -> str | None:
    """The first candidate every plugin may target: in scope, not the pod's own node, with room,
    passing every placement filter (``view.fits``), and not vetoed by the round's checks."""
    for name in candidates:
        if name == pod.node or name not in view.scope:
            continue
        node = view.nodes.get(name)
        if node is None or not room.has_room(node, pod.info.req):
            continue
        if view.fits(pod.name, name) is not None:
            continue
        if veto(Move(pod.name, pod.job, pod.node, name)) is not None:
            continue
        return name
    return None


def pod_share(node: NodeInfo, req: PodRequest, weights: dict[str, int], pool: str) -> float:
    """How much of ``node``'s ``pool`` utilisation (framework.utilisation) ``req`` accounts for;
    0 for a pod of the other pool."""
    if req.pool != pool:
        return 0.0
    cap = node.capacity[pool]
    amounts = (req.cpu, req.mem, req.gpu)
    total = weight_sum = 0.0
    for name, weight in weights.items():
        i = RESOURCE_INDEX[name]
        weight_sum += weight
        if cap[i] > 0:
            total += weight * amounts[i] / cap[i]
    return total / weight_sum if weight_sum else 0.0


def adds_utilisation(req: PodRequest, weights: dict[str, int], pool: str) -> bool:
    """Whether ``req`` takes some weighted resource of ``pool`` (so it cannot fit a node whose
    weighted resources are all used up)."""
    amounts = (req.cpu, req.mem, req.gpu)
    return req.pool == pool and any(
        w > 0 and amounts[RESOURCE_INDEX[r]] for r, w in weights.items()
    )


def drain(
    view: ClusterView,
    pods: Sequence[RunningPod],
    choose_target: Callable[[RunningPod], str | None],
    moved: Callable[[Move], None],
) -> list[Move] | None:
    """Move every one of ``pods`` (in order, each to ``choose_target(pod)``) or none of them: a
    half-emptied node frees nothing. On the first pod without a target the earlier moves are
    undone in the view and None is returned. ``moved`` hears of every move applied to the view,
    undoing ones included (as the reverse move), so callers can re-rank the nodes involved.
    """
    moves: list[Move] = []
    for pod in pods:
        target = choose_target(pod)
        if target is None:
            undo(view, moves, moved)
            return None
        move = Move(pod.name, pod.job, pod.node, target)
        view.move(pod.name, target)
        moves.append(move)
        moved(move)
    return moves


def undo(view: ClusterView, moves: Sequence[Move], moved: Callable[[Move], None]) -> None:
    """Put ``moves`` back in the view, latest first, telling ``moved`` of each reverse move."""
    for move in reversed(moves):
        view.move(move.pod, move.source)
        moved(Move(move.pod, move.job, move.target, move.source))
