"""DisruptionBudget: a pod whose disruption budgets allow no disruption now is never moved.

The budgets are the DisruptionBudget objects preemption obeys, read through the one budget
logic (``placement.budgets``). This check answers "may this pod be disrupted at all"; how many
may go at once is the movement generator's business, which cuts the plan into batches each
admitted by a fresh copy of the same budgets.
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
        # Admitted moves do not use up the budget here: batches do (see the module docstring).
        return None

    def record(self, moves: Sequence[Move], view: ClusterView, generation: int, now: float) -> None:
        return None


def new(args: NoArgs) -> DisruptionBudget:
    return DisruptionBudget()


_check: type[Check] = DisruptionBudget
SPEC = PluginSpec(NAME, NoArgs, new)
