"""Disruption budgets: the one rule for "may these pods be evicted?" that the scheduler's
preemption, the Binder (authoritatively) and the rescheduler's plans share. Pure and synchronous.

A budget selects pods by job (``spec.job``) or else by a label selector over the pod template's
labels, and says either how many of them must stay healthy (``min_available``) or how many of
the expected ones may be missing (``max_unavailable``). Semantics follow Kubernetes'
PodDisruptionBudget::

    desired_healthy     = min_available                   or  max(0, expected - max_unavailable)
    current_healthy     = selected pods that are healthy  (see healthy())
    disruptions_allowed = max(0, current_healthy - desired_healthy)

The status controller keeps every budget's status current; a decision builds a
:class:`BudgetTracker` from the budgets and charges its victims against it::

    tracker = BudgetTracker(budgets)
    why = tracker.try_admit(victims)     # all or none; [] when admitted, else one line per budget

A planner that takes a move back (the rescheduler's all-or-nothing drains) gives the disruption
back with ``tracker.release(pods)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from placement.claims import CLAIM_PHASES
from protos.godel.v1 import objects_pb2 as pb

_Req = pb.LabelSelectorRequirement
# Phases in which a pod holds its node: evicting it is a disruption.


# ---------------------------------------------------------------------------------------------
# Which pods a budget covers, and which of them count
# ---------------------------------------------------------------------------------------------


def selects(budget: pb.DisruptionBudget, pod: pb.Pod) -> bool:
    """Whether ``budget`` covers ``pod``: by job when ``spec.job`` is set (the selector is then
    ignored), else when every selector requirement holds on the pod template's labels
    (In, NotIn, Exists, DoesNotExist; Gt and Lt compare integers, as node affinity does). A
    budget with neither selects nothing (an empty selector protecting every pod is a trap).
    To test many pods, compile once with :class:`Selection`."""
    return Selection(budget).matches(pod)


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    op: int
    values: frozenset[str]
    number: int | None  # Gt / Lt: the bound; None when it does not parse (matches nothing)

    def holds(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        op = self.op
        if op == _Req.IN:
            return value is not None and value in self.values
        if op == _Req.NOT_IN:
            return value is None or value not in self.values
        if op == _Req.EXISTS:
            return value is not None
        if op == _Req.DOES_NOT_EXIST:
            return value is None
        if op in (_Req.GT, _Req.LT) and value is not None and self.number is not None:
            try:
                have = int(value)
            except ValueError:
                return False
            return have > self.number if op == _Req.GT else have < self.number
        return False  # unspecified or unknown operator: validation rejects it; match nothing


def _compile(r: pb.LabelSelectorRequirement) -> _Requirement:
    number = None
    if r.operator in (_Req.GT, _Req.LT) and len(r.values) == 1:
        try:
            number = int(r.values[0])
        except ValueError:
            number = None
    return _Requirement(r.key, int(r.operator), frozenset(r.values), number)


class Selection:
    """Which pods a budget selects (see :func:`selects`), compiled once from its spec so that
    testing thousands of pods does not re-read the protobuf requirements each time."""

    __slots__ = ("_job", "_requirements")

    def __init__(self, budget: pb.DisruptionBudget) -> None:
        self._job = budget.spec.job
        self._requirements = tuple(_compile(r) for r in budget.spec.selector)

    def matches(self, pod: pb.Pod) -> bool:
        spec = pod.spec
        return self.matches_parts(spec.job, spec.template.labels)

    def matches_parts(self, job: str, labels: Mapping[str, str]) -> bool:
        """:meth:`matches` on a pod's job and template labels, read once by a caller that
        tests one pod against many budgets."""
        if self._job:
            return job == self._job
        if not self._requirements:
            return False
        for r in self._requirements:
            if not r.holds(labels):
                return False
        return True


class SelectorMembers:
    """The pods each label-selector budget selects, with each one's job, kept as pods and
    budgets change, so that whoever recomputes statuses often (the Binder, per batch with
    victims) reads a budget's own pods instead of testing every pod of the cluster, and counts
    its expected pods from their jobs without reading a pod. Job budgets are not kept here:
    their pods are the job's, which callers index already.

    A pod is tested against each selector budget when first seen, when its labels change (they
    seldom do: they are its job template's), and when a budget is added or changed.
    """

    def __init__(self) -> None:
        self._selections: dict[str, Selection] = {}
        self._members: dict[str, dict[str, str]] = {}

    def __bool__(self) -> bool:
        """Whether any label-selector budget is kept: while none is, ``set_pod`` has nothing
        to test, and a caller may skip asking whether a pod's labels changed."""
        return bool(self._selections)

    def set_budget(
        self, budget: pb.DisruptionBudget, pods: Iterable[tuple[str, str, Mapping[str, str]]]
    ) -> None:
        """Add or change a budget; ``pods``: every pod now known, as (name, job, the template's
        labels), tested once (a holder of records rather than pods gives them from those)."""
        name = budget.metadata.name
        if budget.spec.job or not budget.spec.selector:
            self.remove_budget(name)
            return
        selection = Selection(budget)
        self._selections[name] = selection
        self._members[name] = {
            pod: job for pod, job, labels in pods if selection.matches_parts(job, labels)
        }

    def remove_budget(self, name: str) -> None:
        self._selections.pop(name, None)
        self._members.pop(name, None)

    def set_pod(self, pod: pb.Pod) -> None:
        """A new pod, or one whose labels changed."""
        if not self._selections:
            return
        name, job, labels = pod.metadata.name, pod.spec.job, pod.spec.template.labels
        for budget, selection in self._selections.items():
            if selection.matches_parts(job, labels):
                self._members[budget][name] = job
            else:
                self._members[budget].pop(name, None)

    def remove_pod(self, name: str) -> None:
        for members in self._members.values():
            members.pop(name, None)

    def members(self, budget: str) -> Mapping[str, str]:
        """The pods the budget selects, name -> job (empty for a budget not kept here)."""
        return self._members.get(budget, {})


def healthy(pod: pb.Pod) -> bool:
    """Bound or running, and not being deleted.

    A bound pod counts although it may not have started yet: it holds its node, so evicting it is
    as much a disruption as evicting a running one, and counting it avoids a budget that flaps
    between bind and start. Pending pods, terminal pods (succeeded, failed, evicted) and pods
    whose deletion was requested do not count: they are not serving, and evicting them costs
    nothing.
    """
    return pod.status.phase in CLAIM_PHASES and not pod.metadata.deletion_timestamp_ms


def expected_pods(
    budget: pb.DisruptionBudget, pods: Iterable[pb.Pod], jobs: Mapping[str, pb.Job]
) -> int:
    """How many pods the budget should see: the replicas of every job it selects.

    A job budget expects its job's replicas. A selector budget selects the jobs of the pods it
    selects (a job's pods carry its template's labels). A selected pod whose job is not in
    ``jobs`` (deleted, its pods going) counts as one expected pod of its own, as Kubernetes
    counts pods without a controller. ``pods`` may hold more than the selected pods.
    """
    selection = Selection(budget)
    return _expected(budget, [p for p in pods if selection.matches(p)], jobs)


def _expected(
    budget: pb.DisruptionBudget, selected: Iterable[pb.Pod], jobs: Mapping[str, pb.Job]
) -> int:
    return expected_of_jobs(budget, (p.spec.job for p in selected), jobs)


def expected_of_jobs(
    budget: pb.DisruptionBudget, selected_jobs: Iterable[str], jobs: Mapping[str, pb.Job]
) -> int:
    """:func:`expected_pods` from the job of each selected pod (one entry a pod), for a holder
    of records rather than pods."""
    seen_jobs: set[str] = set()
    orphans = 0
    if budget.spec.job and budget.spec.job in jobs:
        seen_jobs.add(budget.spec.job)
    for job in selected_jobs:
        if job in jobs:
            seen_jobs.add(job)
        else:
            orphans += 1
    return orphans + sum(jobs[name].spec.replicas for name in seen_jobs)


def desired_healthy(budget: pb.DisruptionBudget, expected: int) -> int:
    """``min_available``, else ``expected - max_unavailable`` floored at 0. A budget with
    neither set (only possible for one stored before the fields had presence, when 0 meant
    unset) protects nothing: 0."""
    spec = budget.spec
    if spec.HasField("min_available"):
        return max(0, spec.min_available)
    if spec.HasField("max_unavailable"):
        return max(0, expected - spec.max_unavailable)
    return 0


def compute_status(
    budget: pb.DisruptionBudget, pods: Iterable[pb.Pod], expected: int
) -> pb.DisruptionBudgetStatus:
    """The budget's status over ``pods`` (which may hold more than the selected pods) and
    ``expected`` (see :func:`expected_pods`)."""
    selection = Selection(budget)
    return _status(budget, [p for p in pods if selection.matches(p)], expected)


def _status(
    budget: pb.DisruptionBudget, selected: Iterable[pb.Pod], expected: int
) -> pb.DisruptionBudgetStatus:
    return status_of(budget, sum(1 for p in selected if healthy(p)), expected)


def status_of(
    budget: pb.DisruptionBudget, current_healthy: int, expected: int
) -> pb.DisruptionBudgetStatus:
    """The budget's status once its selected pods are counted: ``current_healthy`` of them
    healthy (:func:`healthy`), ``expected`` (:func:`expected_pods`)."""
    desired = desired_healthy(budget, expected)
    return pb.DisruptionBudgetStatus(
        current_healthy=current_healthy,
        desired_healthy=desired,
        disruptions_allowed=max(0, current_healthy - desired),
        expected_pods=expected,
    )


def compute_statuses(
    budgets: Iterable[pb.DisruptionBudget], pods: Iterable[pb.Pod], jobs: Mapping[str, pb.Job]
) -> dict[str, pb.DisruptionBudgetStatus]:
    """Every budget's status by name, from one view of pods and jobs (what the Binder or a
    rescheduler round computes afresh instead of trusting stored statuses). A job budget looks
    only at its job's pods."""
    everyone = list(pods)
    by_job: dict[str, list[pb.Pod]] = {}
    for pod in everyone:
        by_job.setdefault(pod.spec.job, []).append(pod)
    return {
        b.metadata.name: current_status(
            b, by_job.get(b.spec.job, []) if b.spec.job else everyone, jobs
        )
        for b in budgets
    }


def current_status(
    budget: pb.DisruptionBudget, pods: Iterable[pb.Pod], jobs: Mapping[str, pb.Job]
) -> pb.DisruptionBudgetStatus:
    """:func:`compute_status` with ``expected`` from :func:`expected_pods`, selecting the pods
    once. ``pods`` may hold more than the selected pods."""
    selection = Selection(budget)
    selected = [p for p in pods if selection.matches(p)]
    return _status(budget, selected, _expected(budget, selected, jobs))


# ---------------------------------------------------------------------------------------------
# Charging evictions against budgets within one decision or round
# ---------------------------------------------------------------------------------------------


class BudgetTracker:
    """How many more disruptions each budget allows, as evictions are admitted one decision or
    round at a time.

    The starting allowance of each budget is ``statuses[name].disruptions_allowed`` when
    ``statuses`` is given, else its stored ``status.disruptions_allowed`` (a budget whose status
    was never computed allows nothing, as Kubernetes blocks evictions under a budget it has not
    yet observed). A stored status lags the controller's tick: it still counts a pod evicted a
    moment ago. Whoever decides authoritatively (the Binder) therefore passes statuses computed
    from its own current view, ``compute_statuses(budgets, pods, jobs)``. Budgets with
    ``spec.job`` are indexed by job, so looking up a pod's budgets costs one dict lookup plus
    the selector budgets.

    A pod counts once however often it is passed (a pod admitted earlier costs nothing again);
    a pod that is not healthy costs nothing; a pod no budget selects is always allowed.
    """

    def __init__(
        self,
        budgets: Iterable[pb.DisruptionBudget],
        statuses: Mapping[str, pb.DisruptionBudgetStatus] | None = None,
    ) -> None:
        self._by_job: dict[str, list[pb.DisruptionBudget]] = {}
        self._by_selector: list[tuple[Selection, pb.DisruptionBudget]] = []
        self._left: dict[str, int] = {}
        self._evicted: set[str] = set()  # pods admitted so far, by name
        for b in budgets:
            name = b.metadata.name
            status = b.status if statuses is None else statuses.get(name, b.status)
            self._left[name] = status.disruptions_allowed
            if b.spec.job:
                self._by_job.setdefault(b.spec.job, []).append(b)
            elif b.spec.selector:
                self._by_selector.append((Selection(b), b))

    def copy(self) -> BudgetTracker:
        """An independent tracker with the same allowances and admitted pods (to try a set of
        evictions and throw it away)."""
        out = BudgetTracker(())
        out._by_job = self._by_job  # the budgets never change: share them
        out._by_selector = self._by_selector
        out._left = dict(self._left)
        out._evicted = set(self._evicted)
        return out

    def remaining(self, budget: str) -> int:
        """Disruptions the named budget still allows (0 for a budget not tracked)."""
        return self._left.get(budget, 0)

    def budgets_of(self, pod: pb.Pod) -> list[pb.DisruptionBudget]:
        """The budgets that select ``pod``."""
        spec = pod.spec
        out = list(self._by_job.get(spec.job, ()))
        if self._by_selector:
            job, labels = spec.job, spec.template.labels
            out += [b for sel, b in self._by_selector if sel.matches_parts(job, labels)]
        return out

    def violations(self, pods: Sequence[pb.Pod]) -> list[str]:
        """Why evicting all of ``pods`` on top of what was admitted would break budgets: one
        message per broken budget, in budget-name order; empty when it is allowed."""
        cost = self._cost(pods)
        return [
            f"disruption budget {name} allows {self._left[name]} more "
            f"{'disruption' if self._left[name] == 1 else 'disruptions'} ({needed} needed)"
            for name, needed in sorted(cost.items())
            if needed > self._left[name]
        ]

    def broken(self, pods: Sequence[pb.Pod]) -> list[str]:
        """The names of the budgets :meth:`violations` describes, in name order."""
        cost = self._cost(pods)
        return [name for name, needed in sorted(cost.items()) if needed > self._left[name]]

    def admit(self, pods: Sequence[pb.Pod]) -> None:
        """Record the eviction of ``pods``. It does not check: call :meth:`violations` first
        (an over-admitted budget shows a negative :meth:`remaining`)."""
        for name, needed in self._cost(pods).items():
            self._left[name] -= needed
        self._evicted.update(p.metadata.name for p in pods if healthy(p))

    def release(self, pods: Sequence[pb.Pod]) -> None:
        """Undo :meth:`admit` for ``pods``: an eviction that was counted is given up (a plan
        took a move back), and each budget of an admitted pod allows one disruption more again.
        A pod that was not admitted changes nothing."""
        for pod in pods:
            name = pod.metadata.name
            if name not in self._evicted:
                continue
            self._evicted.discard(name)
            for b in self.budgets_of(pod):
                self._left[b.metadata.name] += 1

    def try_admit(self, pods: Sequence[pb.Pod]) -> list[str]:
        """Admit all of ``pods`` if no budget breaks, else none of them: the violations (empty
        when admitted). A gang's victims or a batch of moves are all-or-nothing."""
        why = self.violations(pods)
        if not why:
            self.admit(pods)
        return why

    def _cost(self, pods: Sequence[pb.Pod]) -> dict[str, int]:
        """Disruptions per budget that evicting ``pods`` would add."""
        cost: dict[str, int] = {}
        counted: set[str] = set()
        for pod in pods:
            name = pod.metadata.name
            if name in self._evicted or name in counted or not healthy(pod):
                continue
            counted.add(name)
            for b in self.budgets_of(pod):
                cost[b.metadata.name] = cost.get(b.metadata.name, 0) + 1
        return cost
