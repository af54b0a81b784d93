"""DisruptionBudget: a move may not take more disruptions than its pod's budgets allow now, and
the moves a round plans use the allowance up (as the original's PDBChecker assumes each move it
passes): one round never plans more moves of a budget than ``disruptions_allowed``, so a plan
never promises moves that the batches and the Binder would refuse.

The budgets are the DisruptionBudget objects preemption obeys, read through the one budget
logic (``placement.budgets.BudgetTracker``), which a round charges move by move and gives back
when the algorithm takes a move back. The movement generator then cuts the plan into batches,
each admitted by a fresh copy of the same budgets, and the Binder checks every eviction again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from placement.budgets import BudgetTracker
from placement.framework import NoArgs, PluginSpec
from services.rescheduler.framework import Check, ClusterView, Move

NAME = "DisruptionBudget"


class DisruptionBudget:
    NAME: ClassVar[str] = NAME

    def __init__(self) -> None:
        self._tracker = BudgetTracker([])

    def start_round(self, view: ClusterView, now: float) -> None:
        self._tracker = BudgetTracker(view.budgets)

    def check(self, view: ClusterView, move: Move) -> str | None:
        running = view.pods.get(move.pod)
        if running is None or not view.budgets:
            return None
        broken = self._tracker.violations([running.pod])
        return "; ".join(broken) if broken else None

    def admit(self, view: ClusterView, move: Move) -> None:
        running = view.pods.get(move.pod)
        if running is not None and view.budgets:
            self._tracker.admit([running.pod])

    def retract(self, view: ClusterView, move: Move) -> None:
        running = view.pods.get(move.pod)
        if running is not None and view.budgets:
            self._tracker.release([running.pod])

    def record(self, moves: Sequence[Move], view: ClusterView, generation: int, now: float) -> None:
        return None


def new(args: NoArgs) -> DisruptionBudget:
    return DisruptionBudget()


_check: type[Check] = DisruptionBudget
SPEC = PluginSpec(NAME, NoArgs, new)
