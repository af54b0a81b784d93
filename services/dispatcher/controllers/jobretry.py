"""The job retry controller: a job's failure policy (``spec.backoff_limit``) applied."""

from __future__ import annotations

import time

from google.protobuf.message import Message

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.jobphase import FailurePolicy, newest_per_index, replaced
from services.dispatcher.controllers.podindex import PodIndex
from services.dispatcher.controllers.ticking import tick_forever
from services.dispatcher.objects import being_deleted
from services.eviction import replacement
from store import Store
from store.informer import Handlers, Informer

BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
FAILED_CONDITION = "Failed"


class JobRetryController:
    """Applies jobs' failure policy (:class:`FailurePolicy`): creates the retry of a failed pod
    (``<job>-<index>-r<n>``, pending, through its queue like any new pod) once its backoff has
    passed, and marks a job whose failures exceeded ``backoff_limit`` with the condition
    ``Failed``/``BackoffLimitExceeded`` (the job status controller sets the phase). Retries
    of a tick in one ``create_many``; a name taken meanwhile is left to the next tick.

    A tick looks only at jobs with a failed pod (kept from pod events), not at every job: at a
    million one-pod jobs a scan per second of all of them would be most of the dispatcher's
    time. A job leaves that set once it has nothing more to retry (finished, marked failed, or
    without a failure policy)."""

    def __init__(
        self,
        store: Store,
        informer: Informer,
        *,
        interval_seconds: float = 1.0,
        initial_backoff_seconds: float = 10.0,
        max_backoff_seconds: float = 360.0,
        pods: PodIndex | None = None,
    ) -> None:
        self._store = store
        self._informer = informer
        self.interval = interval_seconds
        self.initial_ms = int(initial_backoff_seconds * 1000)
        self.max_ms = int(max_backoff_seconds * 1000)
        self.pods = pods or PodIndex(informer)
        self.failing: set[str] = set()  # jobs with a failed pod that may still need a retry
        informer.add_handlers(
            Handlers(
                on_add=self._on_pod,
                on_update=self._on_pod_updated,
                kinds=frozenset({"Pod"}),
                on_listed=self._on_listed,
                refused_at_listing=False,  # a listed pod on a node: the pod index's record
            )
        )

    def _on_pod(self, kind: str, obj: Message) -> None:
        if isinstance(obj, pb.Pod) and obj.status.phase == pb.POD_FAILED and obj.spec.job:
            self.failing.add(obj.spec.job)

    def _on_pod_updated(self, kind: str, _old: Message, obj: Message) -> None:
        # ``_on_pod`` without a call more: every pod update comes here.
        if isinstance(obj, pb.Pod) and obj.status.phase == pb.POD_FAILED and obj.spec.job:
            self.failing.add(obj.spec.job)

    def _on_listed(self, kind: str) -> None:
        """The listing's failed pods on a node, from the pod index's records."""
        self.failing |= self.pods.jobs_failed_on_nodes()

    async def run(self) -> None:
        await tick_forever("job retry", self._informer, self.tick, self.interval)

    async def tick(self, now_ms: int | None = None) -> None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        retries: list[pb.Pod] = []
        marked: list[pb.Job] = []
        for name in list(self.failing):
            obj = self._informer.get("Job", name)
            if (
                not isinstance(obj, pb.Job)
                or not obj.spec.HasField("backoff_limit")
                or self.pods.job_as_read(obj).status.phase == pb.JOB_SUCCEEDED
                or being_deleted(obj)
            ):
                self.failing.discard(name)  # gone, no policy, or nothing left to retry for
                continue
            pods = await self.pods.fetch_of(obj.metadata.name)  # whole: replacements copy them
            policy = FailurePolicy.of(obj, pods)
            if policy.exceeded:
                if not any(c.type == FAILED_CONDITION for c in obj.status.conditions):
                    marked.append(_failed(obj, policy, now))
                else:
                    self.failing.discard(name)  # marked: the job is Failed for good
                continue
            delay = policy.delay_ms(self.initial_ms, self.max_ms)
            for pod in newest_per_index(pods).values():
                failed = pod.status.phase == pb.POD_FAILED and not replaced(obj, pod)
                if failed and now >= pod.status.finished_ms + delay:
                    retries.append(replacement(pod, pods))
        if retries:
            await self._store.create_many(retries)
        if marked:
            await self._store.update_many(marked)


def _failed(job: pb.Job, policy: FailurePolicy, now_ms: int) -> pb.Job:
    out = pb.Job()
    out.CopyFrom(job)
    out.status.conditions.add(
        type=FAILED_CONDITION,
        status="True",
        reason=BACKOFF_LIMIT_EXCEEDED,
        message=f"{policy.failures} pods failed; backoffLimit is {policy.limit}",
        last_transition_ms=now_ms,
    )
    return out
