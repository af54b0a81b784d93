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
    ClusterView,
    Move,
    MoveVeto,
    RunningPod,
    weighted_fraction,
)


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
        self._entries = {name: (self._sign * value(name), name) for name in names}
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

    def items_below(self, ceiling: float) -> Iterator[tuple[float, str]]:
        """The (value, name) pairs with value ≤ ``ceiling``, in rank order (descending only)."""
        assert self._sign < 0, "items_below skips a prefix of a descending ranking"
        start = bisect.bisect_left(self._order, (-ceiling, ""))
        order = self._order
        return ((-order[i][0], order[i][1]) for i in range(start, len(order)))


Shape = tuple[str, int, int, int]  # a request's pool and amounts


class RoomCache:
    """Remembers which nodes lack room for requests of each shape (pool and amounts).

    Sound because room only shrinks while a node gains pods; :meth:`freed` forgets a node's
    verdicts once it loses one. The test is NodeResourcesFit's own (placement.nodeinfo), so a
    node it rejects would fail ``view.fits`` too.
    """

    def __init__(self) -> None:
        self._lacking: dict[Shape, set[str]] = {}
        self._shapes_of: dict[str, set[Shape]] = {}

    def lacking(self, req: PodRequest) -> set[str]:
        """The nodes known to lack room for ``req``'s shape (a live set, for fast skipping)."""
        q = req.requests
        return self._lacking.setdefault((req.pool, q.cpu, q.mem, q.gpus), set())

    def has_room(self, node: NodeInfo, req: PodRequest) -> bool:
        """Whether ``node`` has room for ``req`` (remembering a no)."""
        if not resource_fit_failures(node, req):
            return True
        q = req.requests
        shape = (req.pool, q.cpu, q.mem, q.gpus)
        self._lacking.setdefault(shape, set()).add(node.name)
        self._shapes_of.setdefault(node.name, set()).add(shape)
        return False

    def freed(self, node: str) -> None:
        for shape in self._shapes_of.pop(node, ()):
            self._lacking[shape].discard(node)


def first_target(
    view: ClusterView,
    pod: RunningPod,
    candidates: Iterable[str],
    room: RoomCache,
    veto: MoveVeto,
) -> str | None:
    """The first candidate every plugin may target: in scope, not the pod's own node, with room,
    passing every placement filter (``view.fits``), and not vetoed by the round's checks."""
    # Read once: this loop runs for every candidate of every pod.
    own, req, scope, nodes = pod.node, pod.info.req, view.scope, view.nodes
    lacking = room.lacking(req)
    for name in candidates:
        if name == own or name in lacking or name not in scope:
            continue
        node = nodes.get(name)
        if node is None or not room.has_room(node, req):
            continue
        if view.fits(pod.name, name) is not None:
            continue
        if veto(Move(pod.name, pod.job, own, name)) is not None:
            continue
        return name
    return None


def pod_share(node: NodeInfo, req: PodRequest, weights: dict[str, int], pool: str) -> float:
    """How much of ``node``'s ``pool`` utilisation (framework.utilisation) ``req`` accounts for;
    0 for a pod of the other pool."""
    if req.pool != pool:
        return 0.0
    q = req.requests
    return weighted_fraction((q.cpu, q.mem, q.gpus), node.capacity[pool], weights)


def utilisation_ceiling(
    req: PodRequest, weights: dict[str, int], pool: str, largest: Sequence[int]
) -> float | None:
    """The highest utilisation (framework.utilisation of ``pool``) a node can have and still take
    ``req``, or None when there is no such bound (a pod taking no weighted resource of ``pool``).

    A node that takes the pod is over capacity in no resource, so its utilisation after the pod
    is at most 1; and the pod adds at least its share of the largest node (``largest``: the
    biggest capacity of each resource among the candidates). A node lacking a resource the pod
    requests cannot take it at all, so the bound holds for every candidate.
    """
    if req.pool != pool:
        return None
    q = req.requests
    share = weighted_fraction((q.cpu, q.mem, q.gpus), largest, weights)
    if share <= 0:
        return None
    # Rounding may put a node that fits exactly a hair above the bound; keep it.
    return 1.0 - share + 1e-9


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
