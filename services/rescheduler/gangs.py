"""Running gangs move whole or not at all.

A job with ``minMember > 1`` is a gang: its pods run together (a training job's workers), and
evicting some of them restarts all of them. So a round never evicts part of a running gang: a
policy either moves every placed pod of the gang — and the movement generator keeps those moves
in one batch — or leaves the gang where it is and says why (``RoundPlan.left_whole``).

The algorithms move pods one at a time, so the round enforces this around them
(``round.py``): it runs the algorithm, finds the gangs it moved only in part
(:func:`partial_gangs`), and runs it again with those gangs' pods vetoed (:func:`GangVeto`),
until no gang is moved in part (a few passes at most: each pass only adds gangs to leave).
Validation can still drop a gang's move (its target no longer fits); then the gang's other
moves are dropped too (:func:`drop_partial_gangs`).

(``godel drain`` and preemption keep their own rules: a drain is the operator's decision, and
preemption takes gangs as units already.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.rescheduler.framework import ClusterView, Move


@dataclass(frozen=True, slots=True)
class PartialGang:
    """A gang some of whose placed pods a plan moves, but not all."""

    job: str
    min_member: int
    moved: int
    placed: int

    def reason(self, mover: str) -> str:
        return (
            f"a running gang (minMember {self.min_member}) is moved whole or not at all; "
            f"{mover} would move {self.moved} of its {self.placed} pods"
        )


def gang_min_member(view: ClusterView, job: str) -> int:
    """The job's ``minMember`` if it is a gang (more than 1), else 0."""
    stored = view.jobs.get(job)
    if stored is None or stored.spec.min_member <= 1:
        return 0
    return stored.spec.min_member


def partial_gangs(view: ClusterView, moves: Sequence[Move]) -> list[PartialGang]:
    """The gangs ``moves`` move in part, in the order their first move appears."""
    moved = Counter(m.job for m in moves)
    gangs = {job: n for job in moved if (n := gang_min_member(view, job))}
    if not gangs:
        return []
    placed = Counter(p.job for p in view.pods.values() if p.job in gangs)  # one pass
    return [
        PartialGang(job, min_member, moved[job], placed[job])
        for job, min_member in gangs.items()
        if moved[job] < placed[job]
    ]


def gang_groups(view: ClusterView, moves: Sequence[Move]) -> list[list[Move]]:
    """The moves of each gang the plan moves whole: the generator keeps each group in one
    batch."""
    groups: dict[str, list[Move]] = {}
    for move in moves:
        if gang_min_member(view, move.job):
            groups.setdefault(move.job, []).append(move)
    return [group for group in groups.values() if len(group) > 1]


def drop_partial_gangs(
    view: ClusterView, moves: Sequence[Move], mover: str
) -> tuple[list[Move], list[tuple[Move, str]], dict[str, str]]:
    """``moves`` without those of gangs they move in part. Returns (kept, dropped with why,
    job -> why it is left whole)."""
    partial = {gang.job: gang.reason(mover) for gang in partial_gangs(view, moves)}
    kept = [m for m in moves if m.job not in partial]
    dropped = [(m, f"left whole: {partial[m.job]}") for m in moves if m.job in partial]
    return kept, dropped, partial


class GangVeto:
    """Vetoes every move of the gangs a round has decided to leave whole (``left``: job ->
    why)."""

    def __init__(self, left: Mapping[str, str]) -> None:
        self._left = left

    def __call__(self, move: Move) -> str | None:
        why = self._left.get(move.job)
        return None if why is None else f"left whole: {why}"
