"""A job's status as its pods say it (``job_status``), its failure policy, and the status readers
see (``as_read``: a one-pod job's is derived when read, never stored; ``as_deleting``: a job
being deleted reads as Deleting). Pure functions (``StatusTally``: ``job_status`` a slice of pods
at a time), used by the job status and job retry controllers, the reconciler, the finished-job
collector and the API."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from foundation.retry import Backoff
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.objects import pods_created
from services.eviction import EVICTION_REASONS, replacement_number, replacement_number_of

# (phase, bound, running, succeeded, failed): what the job status controller writes of a job.
JobCounts = tuple["pb.JobPhase.ValueType", int, int, int, int]


def job_status(job: pb.Job, pods: Iterable[pb.Pod], now_ms: int | None = None) -> JobCounts:
    """(phase, bound, running, succeeded, failed) of a job from its pods.

    Counts are over replicas: each index counts once, by its newest pod (a replacement
    ``-r<n>`` supersedes the pod it replaces), so they add up to at most ``spec.replicas``.
    ``bound`` is the replicas bound but not yet running. Phase, first match wins:

    - SUCCEEDED: every replica ended and at least ``min_member`` succeeded (all of them when
      ``min_member == replicas``);
    - FAILED: more pods failed than ``backoff_limit`` allows, or so many replicas failed for
      good that ``min_member`` can no longer succeed (a pod lost with its node or evicted is
      not failed for good while its job replaces lost pods, nor a failed pod while the job's
      failure policy retries it);
    - RUNNING: at least ``min_member`` running;
    - SCHEDULED: at least ``min_member`` bound, running or succeeded; for a gang
      (``min_member > 1``, :func:`is_gang`) also any of its pods running or finished, and a
      gang once Scheduled (or further) stays so: it never goes back to PENDING/PRESCHEDULING
      (the counts say the rest), as the original Gödel's PodGroup;
    - TIMEOUT (gangs): already TIMEOUT (sticky until restarted), or still waiting at
      ``now_ms`` past its schedule deadline (:func:`schedule_deadline_ms`; not judged when
      ``now_ms`` is None);
    - UNSCHEDULABLE, if the dispatcher said so and nothing is placed;
    - PRESCHEDULING (gangs): at least ``min_member`` pods exist;
    - otherwise PENDING.
    """
    tally = StatusTally(job)
    tally.add(pods)
    return tally.counts(now_ms)


# A gang's schedule timeout when its spec sets none (the original Gödel's PodGroup default).
DEFAULT_SCHEDULE_TIMEOUT_SECONDS = 300
# The phases a gang has once it was scheduled: it never leaves them for PENDING/PRESCHEDULING.
_SCHEDULED_ONCE = frozenset({pb.JOB_SCHEDULED, pb.JOB_RUNNING, pb.JOB_SUCCEEDED, pb.JOB_FAILED})
# The phases a gang's schedule timeout runs in.
WAITING_GANG_PHASES = frozenset({pb.JOB_PENDING, pb.JOB_PRESCHEDULING})


def is_gang(job: pb.Job) -> bool:
    """Whether the job is a gang (``min_member > 1``; unset means all replicas): it has the
    PreScheduling and Timeout phases. A ``min_member: 1`` job behaves like a Deployment."""
    return (job.spec.min_member or job.spec.replicas) > 1


def schedule_timeout_seconds(job: pb.Job) -> int:
    spec = job.spec
    if spec.HasField("schedule_timeout_seconds"):
        return spec.schedule_timeout_seconds
    return DEFAULT_SCHEDULE_TIMEOUT_SECONDS


def schedule_deadline_ms(job: pb.Job) -> int | None:
    """When a waiting gang times out: ``spec.schedule_timeout_seconds`` after its last restart
    (``status.schedule_started_ms``), else after its creation. None for a job that is not a
    gang, or one never stored (no creation time to count from). From stored times only, so a
    restarted dispatcher finds the same deadline."""
    if not is_gang(job):
        return None
    start = job.status.schedule_started_ms or job.metadata.creation_timestamp_ms
    if not start:
        return None
    return start + schedule_timeout_seconds(job) * 1000


class HoldingPod(Protocol):
    """A pod holding a claim as its record has it (``dispatching.entries.Claim``)."""

    @property
    def name(self) -> str: ...
    @property
    def job(self) -> str: ...
    @property
    def pod_index(self) -> int: ...
    @property
    def phase(self) -> pb.PodPhase.ValueType: ...


class StatusTally:
    """:func:`job_status` over a job's pods handed in slices (:meth:`add`), so a caller on the
    event loop can yield between them: a 100,000-pod job's pods decoded and counted at once
    held the dispatcher's loop for a second, health checks and streams waiting. Keeps per index
    only what the counts need of its newest pod, not the pod."""

    __slots__ = ("_failures", "_job", "_newest", "_replaces_lost")

    def __init__(self, job: pb.Job) -> None:
        self._job = job
        self._replaces_lost = job.spec.replace_lost_pods  # read once, not per pod
        # index -> (name, phase, replaced) of its newest pod so far
        self._newest: dict[int, tuple[str, int, bool]] = {}
        self._failures = 0

    def add(self, pods: Iterable[pb.Pod]) -> None:
        count = self.count
        for pod in pods:
            spec, status = pod.spec, pod.status
            count(pod.metadata.name, spec.job, spec.index, status.phase, status.reason)

    def count(
        self, name: str, job_name: str, index: int, phase: pb.PodPhase.ValueType, reason: str
    ) -> None:
        """One pod, by what the counts read of it (a caller holding a record of the pod, not
        the pod, passes its fields: ``PodIndex.status_of``)."""
        lost = self._replaces_lost and reason in EVICTION_REASONS  # ``replaced``
        if phase == pb.POD_FAILED and not lost:
            self._failures += 1
        newest = self._newest
        cur = newest.get(index)
        # Names are compared only when an index has two pods (a replacement): rarely.
        if cur is None or replacement_number_of(job_name, index, name) > replacement_number_of(
            job_name, index, cur[0]
        ):
            newest[index] = (name, phase, lost)

    def count_holding(self, pods: Iterable[HoldingPod]) -> None:
        """``count`` of pods holding a claim (bound or running: never failed, never lost), by
        their records: what most of a big job's pods are, counted without a call each."""
        newest = self._newest
        for pod in pods:
            index, name = pod.pod_index, pod.name
            cur = newest.get(index)
            if cur is None or replacement_number_of(pod.job, index, name) > replacement_number_of(
                pod.job, index, cur[0]
            ):
                newest[index] = (name, pod.phase, False)

    def counts(self, now_ms: int | None = None) -> JobCounts:
        """:func:`job_status` of the pods added so far."""
        job = self._job
        policy = FailurePolicy(
            job.spec.backoff_limit if job.spec.HasField("backoff_limit") else None,
            self._failures,
        )
        bound = running = succeeded = failed = final_failed = 0
        for _, phase, lost in self._newest.values():
            if phase == pb.POD_BOUND:
                bound += 1
            elif phase == pb.POD_RUNNING:
                running += 1
            elif phase == pb.POD_SUCCEEDED:
                succeeded += 1
            elif phase == pb.POD_FAILED:
                failed += 1
                if not (lost or policy.retrying):
                    final_failed += 1
        replicas = job.spec.replicas
        min_member = job.spec.min_member or replicas
        if replicas > 0 and succeeded + final_failed == replicas and succeeded >= min_member:
            phase_ = pb.JOB_SUCCEEDED
        elif policy.exceeded or (replicas > 0 and replicas - final_failed < min_member):
            phase_ = pb.JOB_FAILED
        elif running >= min_member:
            phase_ = pb.JOB_RUNNING
        elif bound + running + succeeded >= min_member:
            phase_ = pb.JOB_SCHEDULED
        elif min_member > 1:
            phase_ = self._gang_phase(now_ms, bound, running + succeeded + failed > 0)
        elif job.status.phase == pb.JOB_UNSCHEDULABLE and bound + running + succeeded == 0:
            phase_ = pb.JOB_UNSCHEDULABLE
        else:
            phase_ = pb.JOB_PENDING
        return phase_, bound, running, succeeded, failed

    def _gang_phase(self, now_ms: int | None, bound: int, started: bool) -> pb.JobPhase.ValueType:
        """The phase of a gang below ``min_member`` placed (see :func:`job_status`):
        ``bound`` of its pods bound, ``started`` whether any runs or has finished."""
        job = self._job
        current = job.status.phase
        if started or current in _SCHEDULED_ONCE or job.status.ever_scheduled:
            return pb.JOB_SCHEDULED
        if current == pb.JOB_TIMEOUT:
            return pb.JOB_TIMEOUT
        deadline = schedule_deadline_ms(job)
        if now_ms is not None and deadline is not None and now_ms >= deadline:
            return pb.JOB_TIMEOUT
        if current == pb.JOB_UNSCHEDULABLE and bound == 0:
            return pb.JOB_UNSCHEDULABLE
        if len(self._newest) >= (job.spec.min_member or job.spec.replicas):
            return pb.JOB_PRESCHEDULING
        return pb.JOB_PENDING


def newest_per_index(pods: Iterable[pb.Pod]) -> dict[int, pb.Pod]:
    """Each index's newest pod (a replacement ``-r<n>`` supersedes the pod it replaces)."""
    newest: dict[int, pb.Pod] = {}
    for pod in pods:
        _keep_newest(newest, pod)
    return newest


def _keep_newest(newest: dict[int, pb.Pod], pod: pb.Pod) -> None:
    index = pod.spec.index
    cur = newest.get(index)
    # Names are compared only when an index has two pods (a replacement): rarely.
    if cur is None or replacement_number(pod) > replacement_number(cur):
        newest[index] = pod


def replaced(job: pb.Job, pod: pb.Pod) -> bool:
    """A failed pod its job replaces without counting it a failure: lost or evicted, in a job
    that replaces lost pods (services keep replacing)."""
    return job.spec.replace_lost_pods and pod.status.reason in EVICTION_REASONS


@dataclass(frozen=True, slots=True)
class FailurePolicy:
    """A batch job's failure policy (``spec.backoff_limit``): its failed pods are retried, each
    after an exponential backoff, until more than ``backoff_limit`` have failed; then the job
    is Failed, reason ``BackoffLimitExceeded``. Unset: no retries (the job fails as its pods
    do, as before the field existed). Pods a job that replaces lost pods replaced do not count.
    """

    limit: int | None
    failures: int

    @classmethod
    def of(cls, job: pb.Job, pods: Iterable[pb.Pod]) -> FailurePolicy:
        limit = job.spec.backoff_limit if job.spec.HasField("backoff_limit") else None
        failures = sum(1 for p in pods if p.status.phase == pb.POD_FAILED and not replaced(job, p))
        return cls(limit, failures)

    @property
    def retrying(self) -> bool:
        return self.limit is not None and self.failures <= self.limit

    @property
    def exceeded(self) -> bool:
        return self.limit is not None and self.failures > self.limit

    def delay_ms(self, initial_ms: int, max_ms: int) -> int:
        """How long after the latest failure its retry starts: ``initial`` doubled per earlier
        failure, at most ``max`` (Kubernetes: 10 s, 20 s, 40 s, ... 6 min)."""
        return int(Backoff(initial_ms, cap=max_ms).delay(max(self.failures - 1, 0)))


FINISHED_JOB_PHASES = frozenset({pb.JOB_SUCCEEDED, pb.JOB_FAILED})


def derives_status(job: pb.Job) -> bool:
    """Whether the job's status is derived from its pod when it is read, never stored: a job of
    one replica. Its status says no more than its pod's phase does, and for a cluster of one-pod
    jobs (online services, small batch tasks) writing it was a fifth of the change feed and a
    tenth of the cluster's CPU: another store write per pod, and another event that every
    watcher decoded. So the job status controller leaves such a job alone, and whatever shows a
    job (Get, List, Watch, the finished-job collector) reads it through :func:`as_read`."""
    return job.spec.replicas == 1


def as_read(job: pb.Job, pods: Iterable[pb.Pod]) -> pb.Job:
    """The job as readers see it: itself if its status is stored; else a copy with phase,
    counts and ``finished_ms`` derived from ``pods`` (all of the job's, replacements included),
    as the job status controller would have written them. ``finished_ms`` is when its last pod
    finished (the job's creation if no pod says: its TTL then counts from there)."""
    if not derives_status(job):
        return job
    pods = list(pods)
    computed = job_status(job, pods)
    out = pb.Job()
    out.CopyFrom(job)
    s = out.status
    s.phase, s.bound, s.running, s.succeeded, s.failed = computed
    if computed[0] in FINISHED_JOB_PHASES:
        finished = max((p.status.finished_ms for p in pods), default=0)
        s.finished_ms = finished or job.metadata.creation_timestamp_ms
    else:
        s.finished_ms = 0
    return out


def as_creating(job: pb.Job) -> pb.Job:
    """A big job whose pods are still being created (``objects.pods_complete`` false) as
    readers see it: a copy with ``pods_created``, the pods stored so far, from its creation
    mark (which each chunk's commit advances). Never stored: the mark is the state; the job is
    Pending meanwhile (its unit goes whole, once every pod is stored)."""
    out = pb.Job()
    out.CopyFrom(job)
    out.status.pods_created = pods_created(job)
    return out


def as_deleting(job: pb.Job, pods_remaining: int) -> pb.Job:
    """A job marked for deletion (``objects.being_deleted``) as readers see it: a copy in phase
    Deleting with the pods it has left. Never stored: the mark is the state (the job status
    controller leaves a marked job alone), this is how it shows."""
    out = pb.Job()
    out.CopyFrom(job)
    out.status.phase = pb.JOB_DELETING
    out.status.pods_remaining = pods_remaining
    return out
