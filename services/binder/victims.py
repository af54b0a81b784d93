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

The victims are read from the store with the batch's pods (one read per batch): the Binder
keeps records of bound pods, not their bytes, and a victim's eviction writes the whole pod.
The budgets' statuses are counted from those records (``LiveBudgets``).

A preemptor refused later (node check, gang rule, store) gives its victims back
(:meth:`VictimClaims.release`); the budgets are then charged again for the claims that remain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from placement.budgets import BudgetTracker, expected_of_jobs, status_of
from placement.claims import holds_claim
from placement.framework import PodInfo
from placement.preemption import preemptor_refusal, victim_reason
from protos.godel.v1 import objects_pb2 as pb
from services.binder.state import ClusterState


class LiveBudgets:
    """The disruption budgets that select any of some pods, with allowances computed from the
    Binder's own current view (not the lagging stored statuses); ``tracker()`` charges evictions
    against them. A budget's status is counted from the Binder's records, not its pods': a
    selected pod is healthy while it holds a claim and is not being deleted
    (``placement.budgets.healthy``), and it expects its job's replicas."""

    def __init__(self, state: ClusterState, pods: Iterable[pb.Pod]) -> None:
        self.state = state
        self.budgets = self._relevant(pods)
        self.statuses = {b.metadata.name: self._status(b) for b in self.budgets}

    def tracker(self) -> BudgetTracker:
        return BudgetTracker(self.budgets, self.statuses)

    def _relevant(self, pods: Iterable[pb.Pod]) -> list[pb.DisruptionBudget]:
        """Only the budgets selecting one of ``pods`` get their status computed."""
        budgets = self.state.budgets.values()
        if not budgets:
            return []
        index = BudgetTracker(budgets)
        found: dict[str, pb.DisruptionBudget] = {}
        for pod in pods:
            for b in index.budgets_of(pod):
                found[b.metadata.name] = b
        return list(found.values())

    def _status(self, budget: pb.DisruptionBudget) -> pb.DisruptionBudgetStatus:
        state = self.state
        deleting = state.deleting
        if budget.spec.job:
            # A job budget's pods are its job's placed pods (the others are not healthy and
            # expect no more than the job does).
            placed = state.job_pods.get(budget.spec.job)
            healthy = sum(1 for n in placed if n not in deleting)
            jobs: Iterable[str] = [budget.spec.job] * len(placed)
        else:
            members = state.budget_members.members(budget.metadata.name)
            placed_now = state.pod_node
            healthy = sum(1 for n in members if n in placed_now and n not in deleting)
            jobs = members.values()
        return status_of(budget, healthy, expected_of_jobs(budget, jobs, state.jobs))


class VictimClaims:
    def __init__(
        self, state: ClusterState, victims: Mapping[str, pb.Pod | None], now_ms: int
    ) -> None:
        """``victims``: every victim the batch names, as read from the store (None: gone)."""
        self.state = state
        self.victims = victims
        self.now_ms = now_ms
        self.by: dict[str, str] = {}  # victim -> the preemptor that claimed it
        self.evict: dict[str, list[pb.Pod]] = {}  # preemptor -> its live victims, claimed
        self._budgets = LiveBudgets(state, (p for p in victims.values() if p is not None))
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
            pod = self.victims.get(name)
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
