"""The disruption budget status controller: ``DisruptionBudget.status`` kept current."""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from google.protobuf.message import Message

from placement.budgets import current_status
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.podindex import PodIndex
from services.dispatcher.controllers.ticking import tick_forever
from store import CommitError, ConflictError, NotFoundError, Store, StoreError
from store.informer import Handlers, Informer

log = structlog.get_logger(__name__)


class BudgetStatusController:
    """Keeps every ``DisruptionBudget.status`` current (placement.budgets.current_status: healthy
    selected pods, desired, disruptions allowed, expected pods) as pods and jobs come and go.

    A tick recomputes only the budgets that may have changed: a job budget when its job or one
    of its pods changed, a selector budget when any pod or job changed (it may select any), and
    a budget whose own object changed (a new spec). The changed statuses are written with one
    ``update_many``, compare-and-set on the cached version: a conflict means the budget was
    written meanwhile (a user applied a new spec), and the watch brings that version as an
    update, which marks the budget for the next tick. Only status is changed.
    """

    def __init__(
        self,
        store: Store,
        informer: Informer,
        *,
        interval_seconds: float = 1.0,
        pods: PodIndex | None = None,
    ) -> None:
        self._store = store
        self._informer = informer
        self.interval = interval_seconds
        self.pods = pods or PodIndex(informer)
        self.changed_jobs = self.pods.subscribe()  # jobs to look at on the next tick
        self._changed_budgets: set[str] = set()
        informer.add_handlers(
            Handlers(
                on_add=self._on_budget,
                on_update=lambda kind, _old, obj: self._on_budget(kind, obj),
                kinds=frozenset({"DisruptionBudget"}),
            )
        )
        self.writes = 0  # update_many round trips, for tests and metrics

    def _on_budget(self, kind: str, obj: Message) -> None:
        if isinstance(obj, pb.DisruptionBudget):
            self._changed_budgets.add(obj.metadata.name)

    async def run(self) -> None:
        await tick_forever("budget status", self._informer, self.tick, self.interval)

    async def tick(self) -> None:
        changed_jobs = set(self.changed_jobs)
        self.changed_jobs.clear()
        changed_budgets, self._changed_budgets = self._changed_budgets, set()
        updates: list[pb.DisruptionBudget] = []
        view = _BudgetView(self.pods, self._informer)
        for obj in self._informer.list("DisruptionBudget"):
            assert isinstance(obj, pb.DisruptionBudget)
            job = obj.spec.job
            affected = job in changed_jobs if job else bool(changed_jobs)
            if not affected and obj.metadata.name not in changed_budgets:
                continue
            status = await view.status_of(obj)
            if status == obj.status:
                continue
            new = pb.DisruptionBudget()
            new.CopyFrom(obj)
            new.status.CopyFrom(status)
            updates.append(new)
        if not updates:
            return
        self.writes += 1
        try:
            results = await self._store.update_many(updates)
        except StoreError:
            self._changed_budgets.update(b.metadata.name for b in updates)  # next tick
            raise
        for budget, result in zip(updates, results, strict=True):
            if isinstance(result, ConflictError | NotFoundError | CommitError):
                continue  # rewritten or deleted meanwhile: the watch brings what to do
            if isinstance(result, StoreError):
                self._changed_budgets.add(budget.metadata.name)
                log.error(
                    "budget status write failed", budget=budget.metadata.name, error=str(result)
                )


class _BudgetView:
    """One tick's view of pods and jobs to compute budget statuses from. The pods are read
    whole from the store (labels and conditions: the dispatcher's view keeps a record of a pod
    on a node, not the pod), a job's in one read; every selector budget looks at every pod, so
    all pods are read once per tick, and only if a selector budget needs them."""

    def __init__(self, pods: PodIndex, informer: Informer) -> None:
        self._pods = pods
        self._informer = informer
        self._everyone: tuple[list[pb.Pod], dict[str, pb.Job]] | None = None

    async def status_of(self, budget: pb.DisruptionBudget) -> pb.DisruptionBudgetStatus:
        if budget.spec.job:
            candidates = await self._pods.fetch_of(budget.spec.job)
            jobs = self._jobs((budget.spec.job,))
        else:
            if self._everyone is None:
                names = [p for job in self._pods.by_job for p in self._pods.by_job.get(job)]
                self._everyone = await self._pods.fetch(names), self._jobs(self._pods.by_job.keys())
            candidates, jobs = self._everyone
        return current_status(budget, candidates, jobs)

    def _jobs(self, names: Iterable[str]) -> dict[str, pb.Job]:
        out: dict[str, pb.Job] = {}
        for name in names:
            job = self._informer.get("Job", name)
            if isinstance(job, pb.Job):
                out[name] = job
        return out
