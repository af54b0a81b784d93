"""Priority classes at admission (Kubernetes' Priority admission plugin): which class a job takes,
and what the class gives it. The one home of the precedence of a job's priority, preemption
policy and preemptibility:

| what | the job's own | else its class's | else |
|---|---|---|---|
| priority | ``spec.priority`` (with a class: equal to its value, or 0) | ``value`` | 0 |
| preemption policy | ``spec.preemption_policy`` | ``preemption_policy`` | PreemptLowerPriority |
| its pods' preemptible | ``spec.preemptible`` | ``preemptible`` | its queue's ``preemptible_default`` |

A job's class is the one it names (``spec.priority_class_name``); a job that names none and gives
no priority (0 reads as none, the API cannot tell them apart) takes the globalDefault class, if
there is one. It is resolved once, at Submit (:func:`resolve`, :func:`pod_preemptible`): the job
is stored with its class's name, its priority and its policy, and its pods with their
preemptibility (their replacements are copied from them), so a class changed or deleted later
changes nothing stored. That is why a class's value, policy and preemptibility are immutable
(``immutable_changes``: they would leave its jobs with what the class no longer says) and a
class that stored jobs name is not deleted (``jobs_naming``). A Submit naming a class and a
Delete of that class at the same moment may both succeed (the job's commit does not lock the
class): the job keeps what it was admitted with, and names a class no longer stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.objects import being_deleted

# How many of the jobs naming a class a refused deletion lists by name.
JOBS_NAMED = 5


@dataclass(frozen=True, slots=True)
class PriorityClasses:
    """The stored priority classes, by name (what a Submit is judged and resolved against)."""

    by_name: Mapping[str, pb.PriorityClass]

    @classmethod
    def of(cls, classes: Iterable[pb.PriorityClass]) -> PriorityClasses:
        return cls({c.metadata.name: c for c in classes})

    @property
    def global_default(self) -> pb.PriorityClass | None:
        """The globalDefault class (at most one is stored: Apply refuses a second; of several
        the first by name, should a race have stored two)."""
        defaults = sorted(n for n, c in self.by_name.items() if c.global_default)
        return self.by_name[defaults[0]] if defaults else None

    def class_for(self, spec: pb.JobSpec) -> pb.PriorityClass | None:
        """The class a job takes: the one it names (None if that does not exist: validation
        refuses the job), else the globalDefault when it gives no priority either."""
        if spec.priority_class_name:
            return self.by_name.get(spec.priority_class_name)
        if spec.priority:
            return None
        return self.global_default


def resolve(job: pb.Job, klass: pb.PriorityClass | None) -> None:
    """What the job's class gives it, written into it (in place): the class's name, its value as
    the priority, and its preemption policy where the job leaves its own unspecified."""
    if klass is None:
        return
    spec = job.spec
    spec.priority_class_name = klass.metadata.name
    spec.priority = klass.value
    if spec.preemption_policy == pb.PREEMPTION_POLICY_UNSPECIFIED:
        spec.preemption_policy = klass.preemption_policy


def pod_preemptible(
    spec: pb.JobSpec, klass: pb.PriorityClass | None, queue: pb.Queue | None
) -> bool:
    """Whether the job's pods may be preempted: the job's own ``preemptible``, else its
    class's, else its queue's ``preemptible_default`` (a queue that is not stored, e.g.
    "default" before anyone applied it, says false)."""
    if spec.HasField("preemptible"):
        return spec.preemptible
    if klass is not None and klass.HasField("preemptible"):
        return klass.preemptible
    return queue is not None and queue.spec.preemptible_default


def as_admitted(wanted: pb.JobSpec, stored: pb.JobSpec) -> None:
    """``wanted`` (a job's spec as submitted or applied again) with what admission resolved
    from ``stored``'s class filled in where ``wanted`` leaves it unsaid, in place: the same
    manifest applied again, or a Submit retried, is then the stored job, not a change of its
    priority. A job stored without a class keeps its own fields, compared as they are."""
    if not stored.priority_class_name:
        return
    if not wanted.priority_class_name and not wanted.priority:
        wanted.priority_class_name = stored.priority_class_name  # the globalDefault it took
    if wanted.priority_class_name == stored.priority_class_name:
        wanted.priority = wanted.priority or stored.priority
        if wanted.preemption_policy == pb.PREEMPTION_POLICY_UNSPECIFIED:
            wanted.preemption_policy = stored.preemption_policy


def immutable_changes(stored: pb.PriorityClass, applied: pb.PriorityClass) -> list[str]:
    """The fields of a stored class that ``applied`` would change and may not."""
    return [f for f, said in _RESOLVED.items() if said(stored) != said(applied)]


# What a class says of each field admission resolves into its jobs and pods (``preemptible``
# unset says "the queue's", which is not ``false``).
_RESOLVED: dict[str, Callable[[pb.PriorityClass], object]] = {
    "value": lambda c: c.value,
    "preemption_policy": lambda c: c.preemption_policy,
    "preemptible": lambda c: c.preemptible if c.HasField("preemptible") else None,
}


def jobs_naming(jobs: Iterable[pb.Job], name: str) -> list[str]:
    """The jobs that name class ``name``, by name (those being deleted are going: not counted)."""
    return sorted(
        j.metadata.name for j in jobs if j.spec.priority_class_name == name and not being_deleted(j)
    )


def in_use(name: str, jobs: list[str]) -> str:
    """Why class ``name`` may not be deleted: the jobs naming it, a few by name, and their count."""
    shown = ", ".join(jobs[:JOBS_NAMED])
    more = f" and {len(jobs) - JOBS_NAMED} more" if len(jobs) > JOBS_NAMED else ""
    return (
        f"priority class {name!r} is in use by {len(jobs)} job{'s' if len(jobs) != 1 else ''} "
        f"({shown}{more}): delete them first (their priority was resolved from it)"
    )
