"""Protection: a pod marked exclude-from-rescheduling is never moved.

The mark (``godel.io/exclude-from-rescheduling: "true"``) may be on the job (a label or an
annotation: the whole job is protected) or on the pod template's labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from placement.framework import NoArgs, PluginSpec
from services.rescheduler.framework import EXCLUDE_FROM_RESCHEDULING, Check, ClusterView, Move

NAME = "Protection"


def protected(view: ClusterView, pod: str) -> bool:
    running = view.pods.get(pod)
    if running is None:
        return False
    marks = [running.pod.spec.template.labels.get(EXCLUDE_FROM_RESCHEDULING)]
    job = view.jobs.get(running.job)
    if job is not None:
        marks.append(job.metadata.labels.get(EXCLUDE_FROM_RESCHEDULING))
        marks.append(job.metadata.annotations.get(EXCLUDE_FROM_RESCHEDULING))
    return any(m is not None and m.lower() == "true" for m in marks)


class Protection:
    NAME: ClassVar[str] = NAME

    def start_round(self, view: ClusterView, now: float) -> None:
        return None

    def check(self, view: ClusterView, move: Move) -> str | None:
        if protected(view, move.pod):
            return f"pod {move.pod} is protected ({EXCLUDE_FROM_RESCHEDULING})"
        return None

    def admit(self, view: ClusterView, move: Move) -> None:
        return None

    def retract(self, view: ClusterView, move: Move) -> None:
        return None

    def record(self, moves: Sequence[Move], view: ClusterView, generation: int, now: float) -> None:
        return None


def new(args: NoArgs) -> Protection:
    return Protection()


_check: type[Check] = Protection
SPEC = PluginSpec(NAME, NoArgs, new)
