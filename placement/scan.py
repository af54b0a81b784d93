"""The order nodes are scanned in: a shard's own partition first, each segment from a rotating
offset. Shared by the unit search's Filter step (``search.py``) and preemption's PostFilter
(``postfilter.py``), each of which keeps its own offset: successive scans start where the last
one stopped, so a stream of pods spreads over the cluster instead of re-examining the same
first nodes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Set
from itertools import chain
from typing import TypeVar

from placement.nodeinfo import NodeInfo

T = TypeVar("T")


def rotated(segment: Sequence[T], offset: int) -> Iterator[T]:
    """Every item of ``segment`` once, from ``offset % len(segment)`` on, wrapping round. The
    start is fixed when called (a caller may move its offset while iterating). Iterated in C:
    no copy of the segment, no index arithmetic per node."""
    n = len(segment)
    if not n:
        return iter(())
    start = offset % n
    return map(segment.__getitem__, chain(range(start, n), range(start)))


def partition_first(nodes: Sequence[NodeInfo], partition: Set[str]) -> list[list[NodeInfo]]:
    """``nodes`` as segments to scan in order: those in ``partition``, then the others (empty
    segments left out)."""
    inside = [n for n in nodes if n.name in partition]
    outside = [n for n in nodes if n.name not in partition]
    return [s for s in (inside, outside) if s]
