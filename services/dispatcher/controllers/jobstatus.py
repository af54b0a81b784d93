"""Controllers the dispatcher runs beside its queues: node lifecycle, job status, queue status,
disruption budget status.

All are plain classes over the dispatcher's informer (kinds Job, Pod, Node, Queue,
DisruptionBudget) and store::

    lifecycle = NodeLifecycleController(store, informer, grace_seconds=10.0, interval_seconds=1.0)
    job_status = JobStatusController(store, informer, interval_seconds=1.0)
    queue_status = QueueStatusController(store, informer, core.queue_statuses)
    budget_status = BudgetStatusController(store, informer, interval_seconds=1.0)
    service.spawn(lifecycle.run(), name="node-lifecycle")
    service.spawn(job_status.run(), name="job-status")

Construct them before (or after) ``informer.start()``: each registers its handlers at once and
builds its indexes from what the cache already holds. ``run()`` waits for the informer to sync,
then calls ``tick()`` every ``interval_seconds`` until cancelled; a store error in one tick is
logged and retried on the next. ``tick()`` is public so tests can drive a controller
deterministically.

Who writes what (services/README.md): the node agent writes heartbeats and pod phases; the node
lifecycle controller writes ``ready = False`` for lapsed nodes, fails their pods (``NodeLost``)
and creates replacements; the job status controller writes ``Job.status`` counts and phase of
jobs of more than one pod (a one-pod job's are derived from its pod when read: ``as_read``) and
never ``status.ever_scheduled`` (the Binder's); the queue status controller writes only
``Queue.status``; the budget status controller writes only ``DisruptionBudget.status``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import cached_property

import structlog
from google.protobuf.message import Message

from placement.budgets import current_status
from placement.claims import CLAIM_PHASES
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.objects import being_deleted, pods_complete
from services.eviction import (
    EVICTION_REASONS,
    NODE_LOST,
    evicted,
    replacement,
    replacement_number,
)
from services.grouped import GroupedNames
from store import CommitError, ConflictError, NotFoundError, Store, StoreError
from store.client import Create, Op, Release, Update
from store.informer import Handlers, Informer

log = structlog.get_logger(__name__)

READY = "Ready"
HEARTBEAT_LAPSED = "NodeHeartbeatLapsed"


async def _tick_forever(
    name: str, informer: Informer, tick: Callable[[], Awaitable[None]], interval: float
) -> None:
    """Run ``tick`` every ``interval`` once the view has synced; a store failure skips a tick
    (the next one decides again from the then-current view)."""
    await informer.wait_synced()
    while True:
        try:
            await tick()
        except StoreError as exc:
            log.warning("controller tick failed", controller=name, error=str(exc))
        await asyncio.sleep(interval)


class PodIndex:
    """The names of pods by node and by job, kept from informer events; the pods themselves are
    read from the informer (which holds them encoded: a reference to each decoded pod here kept
    2.6 KiB a pod alive). One index serves every controller of the dispatcher (each pod event
    is indexed once, not once per controller); a controller that acts on changed jobs takes its
    own feed of their names (:meth:`subscribe`)."""

    def __init__(self, informer: Informer) -> None:
        self.by_node = GroupedNames()
        self.by_job = GroupedNames()
        self._informer = informer
        # Each subscriber's feed, and what it ignores of a job's own updates (subscribe).
        self._feeds: list[tuple[set[str], Callable[[pb.Job], bool] | None]] = []
        informer.add_handlers(
            Handlers(
                on_add=self._on_add,
                on_update=self._on_update,
                on_delete=self._on_delete,
                kinds=frozenset({"Pod", "Job"}),
            )
        )

    def pods_on(self, node: str) -> list[pb.Pod]:
        return self._read(self.by_node.get(node))

    def pods_of(self, job: str) -> list[pb.Pod]:
        return self._read(self.by_job.get(job))

    def job_as_read(self, job: pb.Job, newer: pb.Pod | None = None) -> pb.Job:
        """``job`` with its status as readers see it (:func:`as_read`), from the pods in the
        view; ``newer``, a pod of the job fresher than the view's copy, counts instead."""
        if not derives_status(job):
            return job
        pods = self.pods_of(job.metadata.name)
        if newer is not None:
            name = newer.metadata.name
            pods = [p for p in pods if p.metadata.name != name] + [newer]
        return as_read(job, pods)

    def _read(self, names: Iterable[str]) -> list[pb.Pod]:
        cached = self._informer.cache["Pod"]
        return [cached[n] for n in names if n in cached]  # type: ignore[misc]

    def subscribe(self, *, ignore: Callable[[pb.Job], bool] | None = None) -> set[str]:
        """A set that collects the names of jobs whose pods (or themselves) changed from now
        on, starting with every job known; its owner takes names out as it handles them.
        ``ignore(job)`` keeps an update of the job itself out of this feed (its owner's own
        write coming back through the watch)."""
        feed = {j.metadata.name for j in self._informer.list("Job")}  # type: ignore[attr-defined]
        feed |= self.by_job.keys()
        self._feeds.append((feed, ignore))
        return feed

    def _changed(self, job: str) -> None:
        for feed, _ in self._feeds:
            feed.add(job)

    def _job_changed(self, job: pb.Job) -> None:
        for feed, ignore in self._feeds:
            if ignore is None or not ignore(job):
                feed.add(job.metadata.name)

    def _on_add(self, kind: str, obj: Message) -> None:
        if isinstance(obj, pb.Pod):
            self._put(obj)
        elif isinstance(obj, pb.Job):
            self._changed(obj.metadata.name)

    def _on_update(self, kind: str, old: Message, obj: Message) -> None:
        if isinstance(old, pb.Pod) and isinstance(obj, pb.Pod):
            if (old.spec.node_name, old.spec.job) != (obj.spec.node_name, obj.spec.job):
                self._drop(old)
            self._put(obj)
        elif isinstance(obj, pb.Job):
            self._job_changed(obj)

    def _on_delete(self, kind: str, obj: Message) -> None:
        if isinstance(obj, pb.Pod):
            self._drop(obj)
        elif isinstance(obj, pb.Job):
            for feed, _ in self._feeds:
                feed.discard(obj.metadata.name)

    def _put(self, pod: pb.Pod) -> None:
        name = pod.metadata.name
        if pod.spec.node_name:
            self.by_node.add(pod.spec.node_name, name)
        if pod.spec.job:
            self.by_job.add(pod.spec.job, name)
            self._changed(pod.spec.job)

    def _drop(self, pod: pb.Pod) -> None:
        name = pod.metadata.name
        self.by_node.discard(pod.spec.node_name, name)
        self.by_job.discard(pod.spec.job, name)
        if pod.spec.job:
            self._changed(pod.spec.job)


# ---------------------------------------------------------------------------------------------
# Node lifecycle
# ---------------------------------------------------------------------------------------------


class NodeLifecycleController:
    """Marks nodes whose heartbeat lapsed NotReady and fails their pods (``NodeLost``), creating
    replacements for jobs with ``spec.replace_lost_pods``; marks them ready again when their
    heartbeat resumes (if the lapse was what made them NotReady).

    Heartbeats are read from the store's heartbeat hash (one read per tick, in the store's clock),
    not from Node objects, which the agents write only at registration. One atomic commit per lost
    node (node update, its pods' ``Release``s, the replacements), all nodes of a tick in one
    ``commit_many``. Every op is compare-and-set: a pod or node that changed since this view makes
    that node's commit fail, and the node is reconsidered on the next tick. Pods bound to a node
    that no longer exists are failed the same way.

    A node with no ``spec.agent`` that never heartbeated (created directly, e.g. by a test or a
    simulator) is left alone; any other node gets the grace from its last heartbeat, or from its
    creation until its first one.
    """

    def __init__(
        self,
        store: Store,
        informer: Informer,
        *,
        grace_seconds: float = 10.0,
        interval_seconds: float = 1.0,
        pods: PodIndex | None = None,
    ) -> None:
        self._store = store
        self._informer = informer
        self.grace_ms = int(grace_seconds * 1000)
        self.interval = interval_seconds
        self.pods = pods or PodIndex(informer)
        # Nodes NotReady because their heartbeat lapsed: the ones that may come back.
        self.lapsed: set[str] = set()
        informer.add_handlers(
            Handlers(
                on_add=self._on_node,
                on_update=lambda kind, _old, new: self._on_node(kind, new),
                on_delete=lambda kind, obj: self._on_node(kind, obj, deleted=True),
                kinds=frozenset({"Node"}),
            )
        )
        # Round trips, for tests and metrics.
        self.commit_calls = 0
        self.full_ticks = 0  # ticks that read every node's stamp

    def _on_node(self, kind: str, obj: Message, deleted: bool = False) -> None:
        if not isinstance(obj, pb.Node):
            return
        name = obj.metadata.name
        if not deleted and not obj.status.ready and _ready_reason(obj) == HEARTBEAT_LAPSED:
            self.lapsed.add(name)
        else:
            self.lapsed.discard(name)

    async def run(self) -> None:
        await _tick_forever("node lifecycle", self._informer, self.tick, self.interval)

    async def tick(self) -> None:
        """One pass. Usually only the stale stamps and those of lapsed nodes travel and are
        looked at (a cluster of 20,000 healthy nodes costs one small round trip); every node is
        read when some node has no stamp at all (registered, not yet heartbeating)."""
        beats = await self._store.stale_heartbeats(self.grace_ms, sorted(self.lapsed))
        if beats.stamped < self._informer.count("Node"):
            await self._full_tick()
            return
        now = beats.now_ms
        commits: list[list[Op]] = []
        described: list[tuple[str, str, int]] = []  # (node, what, pods failed)
        gone: list[str] = []
        for name, last in beats.stale.items():
            node = self._informer.get("Node", name)
            if not isinstance(node, pb.Node):
                gone.append(name)  # a deleted node's stamp, lapsed
                continue
            ops = self._lost(node, now, last)
            if ops:
                commits.append(ops)
                described.append((name, "lost", len(ops) - 1))
        for name, last in beats.named.items():
            node = self._informer.get("Node", name)
            if isinstance(node, pb.Node) and now - last <= self.grace_ms:
                commits.append([Update(_set_ready(node, True, now, "NodeHeartbeatResumed", ""))])
                described.append((name, "ready again", 0))
        await self._store.forget_heartbeats(gone)
        for name in list(self.pods.by_node):
            if not self._informer.has("Node", name):
                ops = self._fail_pods(name, now, f"node {name!r} no longer exists")
                if ops:
                    commits.append(ops)
                    described.append((name, "gone", len(ops)))
        await self._commit(commits, described)

    async def _full_tick(self) -> None:
        self.full_ticks += 1
        beats = await self._store.heartbeats()
        now = beats.now_ms  # the store's clock, like the heartbeats it compares against
        commits: list[list[Op]] = []
        described: list[tuple[str, str, int]] = []  # (node, what, pods failed)
        nodes = {n.metadata.name: n for n in self._nodes()}
        for name, node in nodes.items():
            # The heartbeat hash (server clock) when the agent has stamped it; the registration
            # time written on the Node (the agent's clock) only before that.
            last = beats.last_ms.get(name) or node.status.heartbeat_ms
            if not node.spec.agent and not last:
                continue  # no agent and never a heartbeat: not under heartbeat management
            # A new node gets the grace from its creation before its first heartbeat.
            last = last or node.metadata.creation_timestamp_ms
            if now - last > self.grace_ms:
                ops = self._lost(node, now, last)
                if ops:
                    commits.append(ops)
                    described.append((name, "lost", len(ops) - 1))
            elif not node.status.ready and _ready_reason(node) == HEARTBEAT_LAPSED:
                commits.append([Update(_set_ready(node, True, now, "NodeHeartbeatResumed", ""))])
                described.append((name, "ready again", 0))
        # Heartbeats of deleted nodes, once they lapsed (a node registering right now may be
        # stamped before this view sees its object).
        gone = [n for n, ms in beats.last_ms.items() if n not in nodes and now - ms > self.grace_ms]
        await self._store.forget_heartbeats(gone)
        for name in list(self.pods.by_node):
            if name not in nodes:
                ops = self._fail_pods(name, now, f"node {name!r} no longer exists")
                if ops:
                    commits.append(ops)
                    described.append((name, "gone", len(ops)))
        await self._commit(commits, described)

    async def _commit(self, commits: list[list[Op]], described: list[tuple[str, str, int]]) -> None:
        if not commits:
            return
        self.commit_calls += 1
        results = await self._store.commit_many(commits)
        for (node_name, what, failed), result in zip(described, results, strict=True):
            if isinstance(result, StoreError):
                # Most often a heartbeat or a pod phase raced us: the next tick decides again.
                log.debug("node lifecycle commit skipped", node=node_name, error=str(result))
            elif what == "ready again":
                log.info("node ready again", node=node_name)
            else:
                log.warning("node lost", node=node_name, reason=what, pods_failed=failed)

    def _nodes(self) -> Iterable[pb.Node]:
        for obj in self._informer.list("Node"):
            assert isinstance(obj, pb.Node)
            yield obj

    def _lost(self, node: pb.Node, now: int, last: int) -> list[Op]:
        name = node.metadata.name
        ops: list[Op] = []
        if node.status.ready:
            age_s = (now - last) / 1000
            message = f"no heartbeat for {age_s:.1f}s (grace {self.grace_ms / 1000:g}s)"
            ops.append(Update(_set_ready(node, False, now, HEARTBEAT_LAPSED, message)))
        ops += self._fail_pods(name, now, f"node {name!r} stopped heartbeating")
        return ops

    def _fail_pods(self, node: str, now: int, message: str) -> list[Op]:
        ops: list[Op] = []
        taken: set[str] = set()  # replacement names used in this commit
        for pod in self.pods.pods_on(node):
            if pod.status.phase not in CLAIM_PHASES:
                continue
            ops.append(Release(evicted(pod, NODE_LOST, message, now)))
            job = self._informer.get("Job", pod.spec.job) if pod.spec.job else None
            if isinstance(job, pb.Job) and job.spec.replace_lost_pods:
                siblings = self.pods.pods_of(pod.spec.job)
                new = replacement(pod, siblings, taken)
                taken.add(new.metadata.name)
                ops.append(Create(new))
        return ops


def _ready_reason(node: pb.Node) -> str:
    for cond in node.status.conditions:
        if cond.type == READY:
            return cond.reason
    return ""


def _set_ready(node: pb.Node, ready: bool, now: int, reason: str, message: str) -> pb.Node:
    out = pb.Node()
    out.CopyFrom(node)
    out.status.ready = ready
    status = "True" if ready else "False"
    for cond in out.status.conditions:
        if cond.type == READY:
            if cond.status != status:
                cond.last_transition_ms = now
            cond.status, cond.reason, cond.message = status, reason, message
            return out
    out.status.conditions.append(
        pb.Condition(
            type=READY, status=status, reason=reason, message=message, last_transition_ms=now
        )
    )
    return out


# ---------------------------------------------------------------------------------------------
# Queue status
# ---------------------------------------------------------------------------------------------


class QueueStatusController:
    """Keeps ``Queue.status`` (resources its bound pods hold, its pending units and pods) current
    from the dispatcher's accounting: the queues whose status changed are written with one
    ``update_many`` per interval. Compare-and-set on the cached version; a conflict is left to
    the next tick, which starts from the fresh copy the watch brings. Only status is changed."""

    def __init__(
        self,
        store: Store,
        informer: Informer,
        statuses: Callable[[], dict[str, pb.QueueStatus]],
        *,
        interval_seconds: float = 1.0,
    ) -> None:
        self._store = store
        self._informer = informer
        self._statuses = statuses
        self.interval = interval_seconds
        self.writes = 0  # update_many round trips, for tests and metrics

    async def run(self) -> None:
        await _tick_forever("queue status", self._informer, self.tick, self.interval)

    async def tick(self) -> None:
        updates: list[pb.Queue] = []
        statuses = self._statuses()
        for obj in self._informer.list("Queue"):
            assert isinstance(obj, pb.Queue)
            status = statuses.get(obj.metadata.name, pb.QueueStatus())
            if status == obj.status:
                continue
            queue = pb.Queue()
            queue.CopyFrom(obj)
            queue.status.CopyFrom(status)
            updates.append(queue)
        if updates:
            self.writes += 1
            await self._store.update_many(updates)


# ---------------------------------------------------------------------------------------------
# Job status
# ---------------------------------------------------------------------------------------------


def job_status(job: pb.Job, pods: Iterable[pb.Pod]) -> tuple[int, int, int, int, int]:
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
    - SCHEDULED: at least ``min_member`` bound, running or succeeded;
    - otherwise PENDING (or UNSCHEDULABLE, if the dispatcher said so and nothing is placed).
    """
    # One pass over the pods (a 100,000-pod job's status is recomputed as its pods change, on
    # the dispatcher's event loop): the newest per index and the failures together.
    newest: dict[int, pb.Pod] = {}
    failures = 0
    for pod in pods:
        _keep_newest(newest, pod)
        if pod.status.phase == pb.POD_FAILED and not replaced(job, pod):
            failures += 1
    policy = FailurePolicy(
        job.spec.backoff_limit if job.spec.HasField("backoff_limit") else None, failures
    )
    bound = running = succeeded = failed = final_failed = 0
    for pod in newest.values():
        phase = pod.status.phase
        if phase == pb.POD_BOUND:
            bound += 1
        elif phase == pb.POD_RUNNING:
            running += 1
        elif phase == pb.POD_SUCCEEDED:
            succeeded += 1
        elif phase == pb.POD_FAILED:
            failed += 1
            if not (replaced(job, pod) or policy.retrying):
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
    elif job.status.phase == pb.JOB_UNSCHEDULABLE and bound + running + succeeded == 0:
        phase_ = pb.JOB_UNSCHEDULABLE
    else:
        phase_ = pb.JOB_PENDING
    return phase_, bound, running, succeeded, failed


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
        return min(initial_ms << max(self.failures - 1, 0), max_ms)


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
    s.phase, s.bound, s.running, s.succeeded, s.failed = computed  # type: ignore[assignment]
    if computed[0] in FINISHED_JOB_PHASES:
        finished = max((p.status.finished_ms for p in pods), default=0)
        s.finished_ms = finished or job.metadata.creation_timestamp_ms
    else:
        s.finished_ms = 0
    return out


def _current(job: pb.Job) -> tuple[int, int, int, int, int]:
    s = job.status
    return s.phase, s.bound, s.running, s.succeeded, s.failed


# Bound on the job status controller's record of its own writes not yet seen back.
_MAX_UNSEEN_WRITES = 100_000


def _written_status(job: pb.Job) -> tuple[int, ...]:
    """The fields of a job's status that the job status controller writes."""
    s = job.status
    return (s.phase, s.bound, s.running, s.succeeded, s.failed, s.finished_ms)


class JobStatusController:
    """Keeps ``Job.status`` counts and phase (see :func:`job_status`) current, in the store, for
    jobs of more than one replica (a one-pod job's is derived when read: :func:`derives_status`).

    Jobs whose pods (or themselves) changed are recomputed every ``interval_seconds`` and the
    changed ones written with one ``update_many``, so a job is written at most once per
    interval. Writes are compare-and-set on the job's cached version; a conflict (the Binder set
    ``ever_scheduled``, the dispatcher a condition) re-reads those jobs and writes again on top
    of the fresh copies, so their fields are kept. Only phase and counts are ever changed.
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
        # The status this controller wrote to each job, until the update comes back through
        # the watch. That update changes nothing the status is computed from (it is what was
        # computed), so it does not bring the job back for another look: with one-pod jobs that
        # look was a second status computation per job, each reading the job's pods. Recorded
        # before the write, since the watch may deliver the update before the write's reply.
        self._written: dict[str, tuple[int, ...]] = {}
        # jobs to look at on the next tick
        self.changed_jobs = self.pods.subscribe(ignore=self._own_write)
        # The jobs of the tick under way: their writes may be in flight (seconds, on a busy
        # store), so the reconciler does not judge them meanwhile.
        self.writing: set[str] = set()
        self.writes = 0  # update_many round trips, for tests and metrics

    def _own_write(self, job: pb.Job) -> bool:
        return self._written.pop(job.metadata.name, None) == _written_status(job)

    async def run(self) -> None:
        await _tick_forever("job status", self._informer, self.tick, self.interval)

    async def tick(self) -> None:
        dirty = set(self.changed_jobs)
        self.changed_jobs.clear()
        self.writing |= dirty  # the reconciler may run a tick of its own meanwhile
        try:
            await self._tick(dirty)
        finally:
            self.writing -= dirty

    async def _tick(self, dirty: set[str]) -> None:
        jobs: list[pb.Job] = []
        for name in dirty:
            job = self._informer.get("Job", name)
            # A job whose pods are still being created is pending, nothing of it placed (it is
            # not dispatched): recounting its growing pods every tick would only cost. The
            # update that completes it brings it back here.
            if (
                isinstance(job, pb.Job)
                and not derives_status(job)  # most jobs, with one-pod jobs: asked first
                and pods_complete(job)
                and not being_deleted(job)
            ):
                jobs.append(job)
        try:
            retry = await self._write(jobs)
            if retry:
                fresh = await self._store.get_many(pb.Job, retry)
                retry = await self._write([j for j in fresh if j is not None])
        except StoreError:
            self.changed_jobs |= dirty  # try them all again next tick
            raise
        self.changed_jobs.update(retry)

    async def _write(self, jobs: list[pb.Job]) -> list[str]:
        """Write the jobs whose status changed; returns the names that conflicted."""
        updates: list[pb.Job] = []
        now_ms = int(time.time() * 1000)
        for job in jobs:
            computed = job_status(job, self.pods.pods_of(job.metadata.name))
            finished = computed[0] in FINISHED_JOB_PHASES
            # A job finished before finished_ms existed gets it now (its TTL counts from here).
            stamp = finished and not job.status.finished_ms
            if computed == _current(job) and not stamp:
                continue
            new = pb.Job()
            new.CopyFrom(job)
            s = new.status
            s.phase, s.bound, s.running, s.succeeded, s.failed = computed  # type: ignore[assignment]
            if stamp:
                s.finished_ms = now_ms
            elif not finished:
                s.finished_ms = 0
            updates.append(new)
        if not updates:
            return []
        self.writes += 1
        conflicts: list[str] = []
        if len(self._written) > _MAX_UNSEEN_WRITES:
            # Left by jobs deleted before their update was seen (a relist skips it): forgetting
            # them costs at most one more look each.
            self._written.clear()
        for job in updates:
            self._written[job.metadata.name] = _written_status(job)
        for job, result in zip(updates, await self._store.update_many(updates), strict=True):
            if isinstance(result, pb.Job):
                continue
            # Not written: any update that comes is someone else's.
            self._written.pop(job.metadata.name, None)
            if isinstance(result, ConflictError):
                conflicts.append(job.metadata.name)
            elif isinstance(result, NotFoundError | CommitError):
                continue  # deleted meanwhile
            elif isinstance(result, StoreError):
                log.error("job status write failed", job=job.metadata.name, error=str(result))
        return conflicts


# ---------------------------------------------------------------------------------------------
# Job failure policy
# ---------------------------------------------------------------------------------------------

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
                on_update=lambda kind, _old, new: self._on_pod(kind, new),
                kinds=frozenset({"Pod"}),
            )
        )

    def _on_pod(self, kind: str, obj: Message) -> None:
        if isinstance(obj, pb.Pod) and obj.status.phase == pb.POD_FAILED and obj.spec.job:
            self.failing.add(obj.spec.job)

    async def run(self) -> None:
        await _tick_forever("job retry", self._informer, self.tick, self.interval)

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
            pods = self.pods.pods_of(obj.metadata.name)
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


# ---------------------------------------------------------------------------------------------
# Disruption budget status
# ---------------------------------------------------------------------------------------------


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
        await _tick_forever("budget status", self._informer, self.tick, self.interval)

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
            status = view.status_of(obj)
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
    """One tick's view of pods and jobs to compute budget statuses from. Every selector budget
    looks at every pod, so all pods and their jobs are gathered once per tick, and only if a
    selector budget needs them."""

    def __init__(self, pods: PodIndex, informer: Informer) -> None:
        self._pods = pods
        self._informer = informer

    def status_of(self, budget: pb.DisruptionBudget) -> pb.DisruptionBudgetStatus:
        if budget.spec.job:
            candidates = self._pods.pods_of(budget.spec.job)
            jobs = self._jobs((budget.spec.job,))
        else:
            candidates, jobs = self._everyone
        return current_status(budget, candidates, jobs)

    @cached_property
    def _everyone(self) -> tuple[list[pb.Pod], dict[str, pb.Job]]:
        pods = [p for job in self._pods.by_job for p in self._pods.pods_of(job)]
        return pods, self._jobs(self._pods.by_job.keys())

    def _jobs(self, names: Iterable[str]) -> dict[str, pb.Job]:
        out: dict[str, pb.Job] = {}
        for name in names:
            job = self._informer.get("Job", name)
            if isinstance(job, pb.Job):
                out[name] = job
        return out
