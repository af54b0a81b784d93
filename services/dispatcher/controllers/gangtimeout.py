"""A gang's schedule timeout: when it is due (``ScheduleDeadlines``, the job status controller's
heap of them), what a timed-out job records (``timed_out``: the ``Timeout`` condition, with the
reason its last scheduling attempt gave), and its restart (``restarted``: RetryJob, or a
timed-out job applied again). The phase itself is ``jobphase.job_status``'s."""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.jobphase import (
    WAITING_GANG_PHASES,
    schedule_deadline_ms,
    schedule_timeout_seconds,
)

# The condition a timed-out gang carries (its type is the phase's word, as ``Failed`` is).
TIMEOUT_CONDITION = "Timeout"
SCHEDULE_TIMEOUT = "ScheduleTimeout"  # its reason, and the Event's
POD_SCHEDULED = "PodScheduled"
# How Explain's summary of a pod of a timed-out gang begins (the CLI shows it whole then).
TIMEOUT_SUMMARY = "Timeout: gang "


class ScheduleDeadlines:
    """The deadlines of waiting gangs, earliest first, so the job status controller looks at a
    gang when its timeout is due rather than scanning every job each tick. A job is pushed
    whenever its status is computed while it waits (``watch``); an item whose deadline changed
    since (restart, a new timeout applied) or whose job stopped waiting is dropped when it comes
    up. Rebuilt after a dispatcher restart from the jobs' stored times, as every job is
    computed once at start."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, str]] = []
        self._deadline: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._deadline)

    def watch(self, job: pb.Job, phase: pb.JobPhase.ValueType) -> None:
        """``job`` was computed to be in ``phase``: track its deadline while it waits."""
        name = job.metadata.name
        deadline = schedule_deadline_ms(job) if phase in WAITING_GANG_PHASES else None
        if deadline is None:
            self._deadline.pop(name, None)
            return
        if self._deadline.get(name) == deadline:
            return
        self._deadline[name] = deadline
        heapq.heappush(self._heap, (deadline, name))

    def forget(self, name: str) -> None:
        self._deadline.pop(name, None)

    def due(self, now_ms: int) -> list[str]:
        """The jobs whose deadline has passed (each once)."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            deadline, name = heapq.heappop(heap)
            if self._deadline.get(name) == deadline:
                del self._deadline[name]
                out.append(name)
        if len(heap) > 2 * len(self._deadline) + 64:  # mostly stale items: keep it bounded
            self._heap = [(d, n) for n, d in self._deadline.items()]
            heapq.heapify(self._heap)
        return out


def last_attempt(pods: Iterable[pb.Pod]) -> str:
    """What the gang's last scheduling attempt said of its pending pods: the newest
    ``PodScheduled=False`` message (the shard's diagnosis in words)."""
    newest: pb.Condition | None = None
    for pod in pods:
        if pod.spec.node_name or pod.status.phase != pb.POD_PENDING:
            continue
        for cond in pod.status.conditions:
            if cond.type == POD_SCHEDULED and cond.status == "False":
                if newest is None or cond.last_transition_ms > newest.last_transition_ms:
                    newest = cond
    if newest is None:
        return "no scheduling attempt has finished"
    return newest.message or newest.reason


def timeout_message(job: pb.Job, pods: Iterable[pb.Pod]) -> str:
    minimum = job.spec.min_member or job.spec.replicas
    return (
        f"not scheduled within {schedule_timeout_seconds(job)}s (scheduleTimeoutSeconds; "
        f"minMember {minimum}); its pods are not dispatched until `godel retry job/"
        f"{job.metadata.name}`; last attempt: {last_attempt(pods)}"
    )


def timed_out(job: pb.Job, message: str, now_ms: int) -> None:
    """Record on ``job`` (in place) why it is Timeout: its ``Timeout`` condition."""
    drop_timeout_condition(job)
    job.status.conditions.add(
        type=TIMEOUT_CONDITION,
        status="True",
        reason=SCHEDULE_TIMEOUT,
        message=message,
        last_transition_ms=now_ms,
    )


def timeout_condition(job: pb.Job) -> pb.Condition | None:
    for cond in job.status.conditions:
        if cond.type == TIMEOUT_CONDITION:
            return cond
    return None


def drop_timeout_condition(job: pb.Job) -> None:
    kept = [c for c in job.status.conditions if c.type != TIMEOUT_CONDITION]
    if len(kept) != len(job.status.conditions):
        del job.status.conditions[:]
        job.status.conditions.extend(kept)


def restarted(job: pb.Job, now_ms: int) -> pb.Job:
    """A copy of a timed-out ``job`` started again: Pending, its schedule timer running from
    ``now_ms``, without the Timeout condition. Its pods are dispatched again once the
    dispatcher sees the change."""
    out = pb.Job()
    out.CopyFrom(job)
    out.status.phase = pb.JOB_PENDING
    out.status.schedule_started_ms = now_ms
    drop_timeout_condition(out)
    return out
