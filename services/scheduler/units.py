"""The units a shard holds, from the dispatcher's hand-over to their one outcome.

``Unit`` is one job's unit as the shard keeps it (pods pending, in flight, to retry, bound,
handed back; its credits). ``UnitBook`` holds them by job and keeps their lifecycle: credits
given back as pods finish, the one ``UnitOutcome`` once nothing is undecided, the hand-back
(with the pods' status written by ``UnschedulableRecorder``), the Binder's verdicts (it is the
link's ``VerdictHandler``) and the retry of rejected pods with exponential backoff
(``ShardQueue``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from placement.framework import JobAffinity
from placement.reservations import hold_name
from placement.search import Diagnosis
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services import metrics
from services.scheduler.cache import SchedulerCache
from services.scheduler.queue import ShardQueue
from services.scheduler.unschedulable import UnschedulableRecorder

log = structlog.get_logger(__name__)


class ReplyStream(Protocol):
    """The reply side of the Dispatch stream a unit came on (``service._DispatchStream``)."""

    def send(self, msg: ipb.ShardMessage) -> None: ...

    def outcome(
        self, job: str, code: ipb.UnitOutcomeCode.ValueType, pods: Iterable[str], reason: str = ""
    ) -> None: ...

    def give(self, pods: int) -> None: ...


@dataclass(eq=False)
class Unit:
    job: pb.Job
    stream: ReplyStream
    seq: int
    credits: int  # credits still held: returned as pods finish
    already_bound: int
    # Pods to schedule -> the resource version the view must have reached before trying them.
    pending: dict[str, int] = field(default_factory=dict)
    inflight: dict[str, str] = field(default_factory=dict)  # pod -> node, sent to the Binder
    retry: dict[str, str] = field(default_factory=dict)  # pod -> rejection reason
    bound: list[str] = field(default_factory=list)
    handed_back: dict[str, str] = field(default_factory=dict)  # pod -> why not placed
    # The search's diagnosis of handed-back pods, as data (stored on the pod for explain).
    diagnoses: dict[str, Diagnosis] = field(default_factory=dict)
    # The last search found every node failing for reasons no placement change can fix
    # (taints, affinity, cordons): the dispatcher holds such a unit until the nodes change.
    infeasible: bool = False
    attempts: int = 0
    # Retries wait until the view has reached what the Binder saw when it rejected.
    min_revision: int = 0
    revoked: bool = False
    # Its last decision told the dispatcher of preemptions (a later one must say what changed).
    nominated: bool = False
    # Set: the unit places this Reservation (its one "pod" is the hold name, ``as_pod``), not a
    # job's pods; ``job`` is a stand-in of that name (``reservation_job``).
    reservation: str = ""

    # Read from ``job`` once: a unit's name is asked for a dozen times on its way, and each
    # read of a protobuf field builds a wrapper (one-pod units are many).
    name: str = field(init=False)
    priority: int = field(init=False)
    affinity: JobAffinity | None = field(init=False)  # the job's job-level affinity (spec)
    # A job whose pods are placed each on its own (min_member 1, no job-level affinity): when
    # it has one pod to place it may share a search with others (``cycle.ShardCycle``).
    loose: bool = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.job.metadata.name
        self.priority = self.job.spec.priority
        self.affinity = JobAffinity.from_job(self.job)
        self.loose = self.job.spec.min_member <= 1 and self.affinity is None

    def undecided(self) -> int:
        return len(self.pending) + len(self.inflight) + len(self.retry)


def reservation_job(reservation: str) -> pb.Job:
    """The stand-in job of a unit that places reservation ``reservation``: named after its
    hold (no job can be: job names hold no ``:``), one pod, placed on its own."""
    job = pb.Job(metadata=pb.ObjectMeta(name=hold_name(reservation)))
    job.spec.replicas = 1
    job.spec.min_member = 1
    return job


class UnitBook:
    def __init__(
        self,
        queue: ShardQueue[Unit],
        cache: SchedulerCache,
        recorder: UnschedulableRecorder,
        stats: dict[str, int],
        wake: Callable[[], None],
        *,
        max_attempts: int,
        assumed_ttl_seconds: float,
    ) -> None:
        self.units: dict[str, Unit] = {}
        self.queue = queue
        self._cache = cache
        self._recorder = recorder
        self._stats = stats
        self._wake = wake  # the scheduling loop's: a unit became ready or due
        self.max_attempts = max_attempts
        self.assumed_ttl_seconds = assumed_ttl_seconds
        self._seq = 0

    def __contains__(self, job: str) -> bool:
        return job in self.units

    def add(
        self,
        job: pb.Job,
        stream: ReplyStream,
        pods: dict[str, int],
        already_bound: int,
        reservation: str = "",
    ) -> None:
        """A unit handed over by the dispatcher, ready to schedule (the caller wakes the loop)."""
        self._seq += 1
        unit = Unit(
            job=job,
            stream=stream,
            seq=self._seq,
            credits=len(pods),
            already_bound=already_bound,
            pending=pods,
            reservation=reservation,
        )
        self.units[unit.name] = unit
        self.queue.add(unit)

    def defer(self, unit: Unit, delay: float) -> None:
        self.queue.defer(unit, delay)
        self._wake()

    def undecided_pods(self) -> int:
        return sum(u.undecided() for u in self.units.values())

    # -- leaving -----------------------------------------------------------------------------

    def revoke(self, jobs: Iterable[str]) -> None:
        for job in jobs:
            unit = self.units.get(job)
            if unit is not None:
                self.drop(unit)

    def drop_stream(self, stream: ReplyStream) -> None:
        """The dispatcher re-dispatches what this stream held: drop its units here."""
        for unit in [u for u in self.units.values() if u.stream is stream]:
            self.drop(unit)

    def drop(self, unit: Unit) -> None:
        unit.revoked = True
        self.units.pop(unit.name, None)
        for pod in unit.inflight:
            # Verdicts still come; until then the placement keeps counting (it may bind).
            self._cache.confirm(pod, self.assumed_ttl_seconds)
        unit.stream.give(unit.credits)
        unit.credits = 0

    def finish_pods(self, unit: Unit, count: int) -> None:
        count = min(count, unit.credits)
        unit.credits -= count
        unit.stream.give(count)

    def maybe_finish(self, unit: Unit) -> None:
        """Send the unit's one outcome once nothing of it is left undecided."""
        if unit.revoked or unit.undecided():
            return
        self.units.pop(unit.name, None)
        if unit.handed_back:
            unit.stream.outcome(
                unit.name,
                ipb.UNIT_INFEASIBLE if unit.infeasible else ipb.UNIT_UNSCHEDULABLE,
                list(unit.handed_back),
                reason=next(iter(unit.handed_back.values())),
            )
            self._stats["handed_back"] += len(unit.handed_back)
            if not unit.reservation:  # a reservation's reason is written by the dispatcher
                self._recorder.record(dict(unit.handed_back), dict(unit.diagnoses))
        else:
            unit.stream.outcome(unit.name, ipb.UNIT_DONE, unit.bound)
        self.finish_pods(unit, unit.credits)

    def hand_back(
        self,
        unit: Unit,
        unplaced: dict[str, str],
        diagnoses: dict[str, Diagnosis],
        reason: str,
    ) -> None:
        """The attempt placed nothing of the unit: its pods go back with why."""
        metrics.SCHEDULER_UNITS_UNSCHEDULABLE.inc()
        unit.handed_back.update(unplaced)
        for pod in unplaced:
            diagnosis = diagnoses.get(pod)
            if diagnosis is not None:
                unit.diagnoses[pod] = diagnosis
        log.info("unit unschedulable", job=unit.name, reason=reason)
        self.maybe_finish(unit)

    # -- verdicts (binder_link.VerdictHandler) -----------------------------------------------

    def bound(self, unit: Unit, pod: str) -> None:
        unit.inflight.pop(pod, None)
        self._stats["bound"] += 1
        self._cache.confirm(pod, self.assumed_ttl_seconds)
        if not unit.revoked:
            unit.bound.append(pod)
            unit.already_bound += 1
            self.finish_pods(unit, 1)

    def rejected(
        self, unit: Unit, pod: str, why: str, conflict: bool, resource_version: int
    ) -> None:
        unit.inflight.pop(pod, None)
        self._stats["rejected"] += 1
        if conflict:
            self._stats["conflicted"] += 1
        self._cache.forget(pod)
        if not unit.revoked:
            unit.retry[pod] = why
            unit.min_revision = max(unit.min_revision, resource_version)

    def settled(self, unit: Unit) -> None:
        if not unit.revoked and not unit.inflight:
            self._after_verdicts(unit)
        self._wake()

    def _after_verdicts(self, unit: Unit) -> None:
        if unit.retry:
            unit.attempts += 1
            if unit.attempts >= self.max_attempts:
                for pod, reason in unit.retry.items():
                    unit.handed_back[pod] = f"{reason} (after {unit.attempts} attempts)"
                unit.retry.clear()
            else:
                # Retry against a view that has seen at least what the Binder saw.
                unit.pending = {pod: unit.min_revision for pod in unit.retry}
                unit.retry.clear()
                self.queue.retry(unit, unit.attempts)
                self._wake()
                return
        self.maybe_finish(unit)
