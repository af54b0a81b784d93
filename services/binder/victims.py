"""The victims of one decision batch: claimed by one preemptor each, re-validated against the
Binder's view, charged to disruption budgets. Synchronous and free of I/O.

A shard's victim choice is a proposal, like its placement. Serially, in batch order, each
preemptor's victims are checked:

- a preemptor whose ``preemptionPolicy`` is Never may have no victims at all
  (``placement.preemption.preemptor_refusal``): its placement is refused, nothing evicted;
- a victim already gone (deleted, finished, evicted by an earlier batch) needs nothing: it is
  simply not evicted again;
- a victim claimed by another preemptor of this batch, moved to another node, or no longer a
  possible victim (same pool, strictly lower priority, preemptible, past its protection window:
  ``placement.preemption.victim_reason``) refuses the placement with the reason;
- the live victims are admitted to a :class:`~placement.budgets.BudgetTracker` whose allowances
  come from the Binder's own current view (not the lagging stored statuses), all or none: a
  budget that would break refuses the placement, naming the budget. One tracker serves the whole
  batch and the batches are decided one at a time, so two shards can never together evict more
  than a budget allows.

A preemptor refused later (node check, gang rule, store) gives its victims back
(:meth:`VictimClaims.release`); the budgets are then charged again for the claims that remain.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from placement.budgets import BudgetTracker, current_status
from placement.claims import holds_claim
from placement.framework import PodInfo
from placement.preemption import preemptor_refusal, victim_reason
from protos.godel.v1 import objects_pb2 as pb
from services.binder.state import ClusterState


class LiveBudgets:
    """The disruption budgets that select any of some pods, with allowances computed from the
    Binder's own current view (not the lagging stored statuses); ``tracker()`` charges evictions
    against them."""

    def __init__(self, state: ClusterState, pods: Iterable[str]) -> None:
        self.state = state
        self.budgets = self._relevant(pods)
        self.statuses = {
            b.metadata.name: current_status(b, self._pods_of(b), state.jobs) for b in self.budgets
        }

    def tracker(self) -> BudgetTracker:
        return BudgetTracker(self.budgets, self.statuses)

    def _relevant(self, pods: Iterable[str]) -> list[pb.DisruptionBudget]:
        """Only the budgets selecting one of ``pods`` get their status computed."""
        budgets = self.state.budgets.values()
        if not budgets:
            return []
        index = BudgetTracker(budgets)
        found: dict[str, pb.DisruptionBudget] = {}
        for name in pods:
            pod = self.state.pods.get(name)
            if pod is not None:
                for b in index.budgets_of(pod):
                    found[b.metadata.name] = b
        return list(found.values())

    def _pods_of(self, budget: pb.DisruptionBudget) -> Iterable[pb.Pod]:
        # Only pods holding a claim count as healthy; a job budget needs only its job's.
        if budget.spec.job:
            return self.state.placed_pods(budget.spec.job)
        pods = self.state.pods
        members = self.state.budget_members.members(budget.metadata.name)
        return [pods[n] for n in members if n in pods]


class VictimClaims:
    def __init__(self, state: ClusterState, victims: Iterable[str], now_ms: int) -> None:
        self.state = state
        self.now_ms = now_ms
        self.by: dict[str, str] = {}  # victim -> the preemptor that claimed it
        self.evict: dict[str, list[pb.Pod]] = {}  # preemptor -> its live victims, claimed
        self._budgets = LiveBudgets(state, victims)
        self.tracker = self._budgets.tracker()

    def claim(self, preemptor: PodInfo, node: str, victims: Sequence[str]) -> str | None:
        """Claim ``victims`` for ``preemptor`` placed on ``node``: None when claimed (the live
        ones are in ``evict[preemptor.name]``), else why not (nothing claimed). A preemptor
        whose policy is Never claims none, even victims already gone: such a decision is not
        one a shard makes."""
        refused = preemptor_refusal(preemptor)
        if refused is not None:
            return refused
        live: list[pb.Pod] = []
        for name in dict.fromkeys(victims):
            other = self.by.get(name)
            if other is not None and other != preemptor.name:
                return f"victim {name!r} is claimed by {other!r}"
            pod = self.state.pods.get(name)
            if pod is None or not holds_claim(pod):
                continue  # already gone: nothing to evict
            if pod.spec.node_name != node:
                return f"victim {name!r} is on node {pod.spec.node_name!r}, not {node!r}"
            why = victim_reason(preemptor, pod, self.now_ms, frozenset())
            if why is not None:
                return f"victim {name!r}: {why}"
            live.append(pod)
        broken = self.tracker.try_admit(live)
        if broken:
            return "; ".join(broken)
        for pod in live:
            self.by[pod.metadata.name] = preemptor.name
        self.evict[preemptor.name] = live
        return None

    def release(self, preemptor: str) -> None:
        """Give back a refused preemptor's victims and their budget charge."""
        victims = self.evict.pop(preemptor, None)
        if victims is None:
            return
        for pod in victims:
            self.by.pop(pod.metadata.name, None)
        if victims:
            self.tracker = self._budgets.tracker()
            for kept in self.evict.values():
                self.tracker.admit(kept)
