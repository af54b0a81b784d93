"""What a shard's preemption reads beyond its snapshot: the bound pods' compact records and
claims (the cache), and the disruption budgets (the informer).

The shard's budget view is a preference, not the rule: allowances start from the budgets'
stored statuses (the dispatcher's controller keeps them current, about once a second) and are
charged with the victims this shard proposed since, so it does not propose what it already knows
would break a budget. The Binder re-checks every budget authoritatively before it evicts.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

from placement.budgets import BudgetTracker
from placement.preemption import VictimCandidate
from protos.godel.v1 import objects_pb2 as pb
from services.scheduler.cache import SchedulerCache
from store.informer import Informer


class ShardVictims:
    """A ``placement.postfilter.VictimSource`` over the shard's cache and informer."""

    def __init__(self, cache: SchedulerCache, informer: Informer) -> None:
        self._cache = cache
        self._informer = informer
        self._tracker: BudgetTracker | None = None  # None: rebuild from the budgets
        self._any = False  # any budget at all (else no pod is looked up)

    def running(self, pod: str) -> VictimCandidate | None:
        return self._cache.running(pod)

    def bound_on(self, node: str) -> int:
        return self._cache.bound_on(node)

    def lowest_bound_priority(self) -> int | None:
        return self._cache.lowest_bound_priority()

    @property
    def claimed(self) -> Set[str]:
        return self._cache.claimed.keys()

    def budgets_changed(self) -> None:
        """A budget was added, changed (its status too) or deleted: start again from them."""
        self._tracker = None

    def budget_violations(self, victims: Sequence[str]) -> list[str]:
        tracker = self._budgets()
        if not self._any:
            return []
        return tracker.broken(self._pods(victims))

    def admit(self, victims: Sequence[str]) -> None:
        """Charge victims this shard proposed to the Binder."""
        tracker = self._budgets()
        if self._any and victims:
            tracker.admit(self._pods(victims))

    def _budgets(self) -> BudgetTracker:
        if self._tracker is None:
            budgets = [
                b
                for b in self._informer.list("DisruptionBudget")
                if isinstance(b, pb.DisruptionBudget)
            ]
            self._any = bool(budgets)
            self._tracker = BudgetTracker(budgets)
        return self._tracker

    def _pods(self, names: Sequence[str]) -> list[pb.Pod]:
        """The victims as a budget reads them: a bound pod from its record (the informer keeps
        no bytes of it), any other as the informer has it."""
        out: list[pb.Pod] = []
        for name in names:
            pod = self._informer.get("Pod", name)
            if isinstance(pod, pb.Pod):
                out.append(pod)
                continue
            record = self._cache.running(name)
            if record is not None:
                out.append(_as_budget_reads(record))
        return out


def _as_budget_reads(record: VictimCandidate) -> pb.Pod:
    """A bound pod's record as the pod a disruption budget reads (its name, job, template
    labels and a phase that holds its node; a pod being deleted is read whole instead)."""
    pod = pb.Pod(metadata=pb.ObjectMeta(name=record.name))
    pod.spec.job = record.job
    pod.spec.template.labels.update(record.labels)
    pod.status.phase = pb.POD_RUNNING if record.started_ms else pb.POD_BOUND
    return pod
