"""A scheduler shard: schedules the units the dispatcher streams to it, sends decisions to the
Binder leader, and hands back what it cannot place. See README.md for the contract.

Tasks: the informer (Nodes, Pods, SchedulerInstances → the live cache), one scheduling loop (the
only code that touches the snapshot and the unit queue), one Binder stream (decisions out,
verdicts in; reconnects to the current leader and resends undecided batches), the heartbeat.
Each dispatcher stream is served by its own handler; it only enqueues units and writes replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc
import structlog

from placement.framework import (
    Framework,
    JobAffinity,
    PluginConfigError,
    PodInfo,
    Profile,
    UnitInfo,
    load_profile,
)
from placement.nodeinfo import PodRequest
from placement.plugins import new_in_tree_registry
from placement.postfilter import Preemption
from placement.search import Diagnosis, Placement, SearchConfig, UnitResult, UnitScheduler
from placement.snapshot import Snapshot
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services import metrics
from services.peers.binder import LEASE as BINDER_LEASE
from services.runtime import Service, ServiceConfig, option
from services.runtime.config import ConfigError
from services.runtime.service import MAX_MESSAGE_BYTES
from services.scheduler.cache import SchedulerCache
from services.scheduler.movements import MovementTracker
from services.scheduler.victims import ShardVictims
from store.client import MAX_OPS_PER_CALL
from store.errors import AlreadyExistsError, ConflictError, NotFoundError, StoreError
from store.informer import Handlers, Informer

log = structlog.get_logger(__name__)

SCHEDULER_SERVICE = ipb.DESCRIPTOR.services_by_name["Scheduler"].full_name
# How long a stopping shard lets its in-flight writes (pods marked unschedulable) finish.
SIDE_TASKS_GRACE_SECONDS = 1.0
# How long a unit search runs before letting the event loop serve streams and heartbeats.
YIELD_SECONDS = 0.02
# A unit of up to this many pod refs is read without looking at the clock (well under a
# millisecond); larger ones yield every YIELD_SECONDS while read.
_READ_AT_ONCE = 1000
# Pods per round trip when recording why pods were handed back: the store's bound on one script
# (store.client.MAX_OPS_PER_CALL), so a huge unit's pods go as many short calls with the event
# loop free in between.
MARK_CHUNK_PODS = MAX_OPS_PER_CALL
# One-pod units searched together at most (Gödel mode): a stream of one-pod jobs paid the
# search's set-up, a coroutine and a timing sample per pod. Bounded so one search stays short.
MAX_LOOSE_GROUP = 256
# How often a unit waiting for a Movement's recommended node (a swap) looks again.
MOVEMENT_WAIT_POLL_SECONDS = 0.2
_RETRY_CODES = {ipb.CONFLICT, ipb.GANG_REJECTED, ipb.STALE, ipb.ERROR, ipb.VERDICT_UNSPECIFIED}
# Rejections that count as optimistic-concurrency conflicts between shards (what the node
# shuffler's conflict rate measures): the room was taken, or a sibling's was and sank the gang.
_CONFLICT_CODES = {ipb.CONFLICT, ipb.GANG_REJECTED}
# Unit outcomes joined in one ShardMessage at most (a UNIT_DONE names its bound pods, so a
# message of this many units of 1,000 pods stays far below MAX_MESSAGE_BYTES).
MAX_OUTCOMES_PER_MESSAGE = 1000
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


@dataclass(frozen=True)
class SchedulerConfig(ServiceConfig):
    """Scheduler shard settings."""

    profile: str = field(
        default="", metadata=option("scheduling profile YAML (plugins, weights); empty: default")
    )
    mode: Literal["godel", "kube"] = field(
        default="godel",
        metadata=option("'godel' (feasible-node cache, units+N scan) or 'kube' (for comparison)"),
    )
    feasible_cache: bool = field(
        default=True, metadata=option("reuse feasible nodes across pods of the same template")
    )
    scan_extra: int = field(
        default=50, metadata=option("feasible nodes scanned beyond the unit size", minimum=0)
    )
    preemption_candidates: int = field(
        default=5,
        metadata=option(
            "preemption: nodes with a victim set to find before choosing the best", minimum=1
        ),
    )
    percentage_of_nodes_to_score: int = field(
        default=0,
        metadata=option("kube mode: 0 = adaptive, else this percentage", minimum=0, maximum=100),
    )
    capacity: int = field(
        default=5000, metadata=option("pods the dispatcher may hand this shard at once", minimum=1)
    )
    max_attempts: int = field(
        default=5, metadata=option("binder rejections of a unit before handing it back", minimum=1)
    )
    backoff_initial_seconds: float = field(
        default=0.1, metadata=option("first retry delay after a binder rejection", minimum=0)
    )
    backoff_max_seconds: float = field(
        default=10.0, metadata=option("cap of the exponential retry delay", minimum=0)
    )
    heartbeat_seconds: float = field(
        default=1.0, metadata=option("SchedulerInstance heartbeat period", minimum=0.05)
    )
    max_batch_pods: int = field(
        default=5000, metadata=option("placements per DecisionBatch (many units each)", minimum=1)
    )
    cycle_budget_ms: int = field(
        default=50, metadata=option("scheduling time per cycle before yielding to I/O", minimum=1)
    )
    assumed_ttl_seconds: float = field(
        default=30.0,
        metadata=option("how long a bound placement counts until the watch shows it", minimum=0),
    )
    movement_wait_seconds: float = field(
        default=30.0,
        metadata=option(
            "how long after a Movement is made its replacements wait for a recommended node "
            "still held by the Movement's own evicted pod (a swap)",
            minimum=0,
        ),
    )
    sync_timeout_seconds: float = field(
        default=30.0, metadata=option("how long to wait for the store view to sync", minimum=0.1)
    )
    verdict_timeout_seconds: float = field(
        default=30.0,
        metadata=option(
            "a decision written to the Binder, unanswered this long while a later one was "
            "answered, is taken back and retried (the reconciler's repair of a lost verdict)",
            minimum=0.1,
        ),
    )
    reconcile_interval_seconds: float = field(
        default=5.0,
        metadata=option(
            "how often the shard looks for decisions stuck without a verdict", minimum=0.05
        ),
    )

    def __post_init__(self) -> None:
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ConfigError("backoff_max_seconds must be >= backoff_initial_seconds")
        self.load_profile()  # a bad profile is a config error: refused before anything starts

    def load_profile(self) -> Profile:
        if not self.profile:
            return Profile()
        try:
            return load_profile(Path(self.profile), new_in_tree_registry())
        except PluginConfigError as exc:
            raise ConfigError(f"profile: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# Units and streams
# ---------------------------------------------------------------------------------------------


class _DispatchStream:
    """The reply side of one Dispatch stream: outcomes in order, credits coalesced."""

    def __init__(self) -> None:
        self.out: deque[ipb.ShardMessage] = deque()
        self.credit = 0
        self.closed = False
        self._wake = asyncio.Event()
        # The UnitOutcomes message at the tail of ``out`` that outcomes still join, and how
        # many it holds (kept here: asking the message costs more than the outcome itself).
        self._joining: ipb.UnitOutcomes | None = None
        self._joined = 0

    def send(self, msg: ipb.ShardMessage) -> None:
        if not self.closed:
            self.out.append(msg)
            self._joining = None
            self._wake.set()

    def outcome(
        self, job: str, code: ipb.UnitOutcomeCode.ValueType, pods: Iterable[str], reason: str = ""
    ) -> None:
        """Queue one unit's outcome, joining the outcomes already waiting at the tail (order
        is kept: a unit's nominations still precede its outcome). Units end by the thousand
        per verdict batch when they are one-pod jobs; one stream message each was most of
        what this stream cost on both ends."""
        if self.closed:
            return
        if self._joining is None or self._joined >= MAX_OUTCOMES_PER_MESSAGE:
            tail = ipb.ShardMessage(outcomes=ipb.UnitOutcomes())
            self.out.append(tail)
            self._joining, self._joined = tail.outcomes, 0
        self._joining.outcomes.add(job=job, code=code, pods=pods, reason=reason)
        self._joined += 1
        self._wake.set()

    def give(self, pods: int) -> None:
        if pods > 0 and not self.closed:
            self.credit += pods
            self._wake.set()

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    async def next(self) -> ipb.ShardMessage | None:
        while True:
            if self.out:
                if len(self.out) == 1:
                    self._joining = None  # on its way: later outcomes start a new message
                return self.out.popleft()
            if self.credit:
                credit, self.credit = self.credit, 0
                return ipb.ShardMessage(credit=ipb.Credit(pods=credit))
            if self.closed:
                return None
            self._wake.clear()
            await self._wake.wait()


@dataclass(eq=False)
class _Unit:
    job: pb.Job
    stream: _DispatchStream
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

    # Read from ``job`` once: a unit's name is asked for a dozen times on its way, and each
    # read of a protobuf field builds a wrapper (one-pod units are many).
    name: str = field(init=False)
    priority: int = field(init=False)
    affinity: JobAffinity | None = field(init=False)  # the job's job-level affinity (spec)
    # A job whose pods are placed each on its own (min_member 1, no job-level affinity): when
    # it has one pod to place it may share a search with others (``_attempt_loose``).
    loose: bool = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.job.metadata.name
        self.priority = self.job.spec.priority
        self.affinity = JobAffinity.from_job(self.job)
        self.loose = self.job.spec.min_member <= 1 and self.affinity is None

    def undecided(self) -> int:
        return len(self.pending) + len(self.inflight) + len(self.retry)


# ---------------------------------------------------------------------------------------------
# The service
# ---------------------------------------------------------------------------------------------


class SchedulerService(Service[SchedulerConfig]):
    component = "scheduler"
    config_class = SchedulerConfig
    grpc_services = (SCHEDULER_SERVICE,)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.framework = Framework(self.config.load_profile(), new_in_tree_registry())
        self.cache = SchedulerCache()
        self.snapshot = Snapshot()
        self.informer = Informer(
            self.store, ["Node", "Pod", "SchedulerInstance", "DisruptionBudget", "Movement"]
        )
        self.movements = MovementTracker(
            self.store,
            self.config.name,
            self._holds,
            max_wait_seconds=self.config.movement_wait_seconds,
        )
        self.victims = ShardVictims(self.cache, self.informer)
        self.scheduler = UnitScheduler(
            self.framework,
            SearchConfig(
                mode=self.config.mode,
                feasible_cache=self.config.feasible_cache,
                scan_extra=self.config.scan_extra,
                percentage_of_nodes_to_score=self.config.percentage_of_nodes_to_score,
            ),
            Preemption(self.framework, self.victims, self.config.preemption_candidates),
        )
        self.informer.add_handlers(Handlers(self._on_add, self._on_update, self._on_delete))
        # Our record's spec as last seen (its partition is applied only when the spec changed).
        self._spec_seen: pb.SchedulerInstanceSpec | None = None
        self.units: dict[str, _Unit] = {}
        self._ready: list[tuple[int, int, _Unit]] = []  # (-priority, arrival, unit)
        self._backoff: list[tuple[float, int, _Unit]] = []  # (not before, arrival, unit)
        self._seq = 0
        self._wake = asyncio.Event()
        # Decisions sent (or to send) and not yet answered, by batch id; resent on reconnect.
        self._undecided: dict[int, tuple[ipb.DecisionBatch, list[_Unit]]] = {}
        self._unsent: deque[int] = deque()
        self._send_wake = asyncio.Event()
        self._batch_id = 0
        # Each undecided batch written on the current Binder stream: when (monotonic) and in
        # which order; and the latest write the Binder has answered. A batch left behind by an
        # answer to a later one was lost, not merely slow.
        self._written_at: dict[int, tuple[float, int]] = {}
        self._writes = 0
        self._answered_write = 0
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._heartbeat: asyncio.Task[None] | None = None
        self.stats = {
            "decided_pods": 0,
            "bound": 0,
            "rejected": 0,
            "conflicted": 0,
            "handed_back": 0,
            "repaired_decisions": 0,
        }

    # -- lifecycle ---------------------------------------------------------------------------

    def add_servicers(self, server: grpc.aio.Server) -> None:
        internal_pb2_grpc.add_SchedulerServicer_to_server(_SchedulerServicer(self), server)

    async def on_start(self) -> None:
        self.informer.start()
        await self.informer.wait_synced(self.config.sync_timeout_seconds)
        await self._register()
        self.spawn(self._schedule_loop(), name="scheduler-loop")
        self.spawn(self._binder_loop(), name="scheduler-binder-stream")
        self.spawn(self.movements.ack_loop(), name="scheduler-movement-acks")
        self._heartbeat = self.spawn(self._heartbeat_loop(), name="scheduler-heartbeat")
        self.spawn(self._reconcile_loop(), name="scheduler-reconciler")
        log.info("shard ready", address=self.address, nodes=len(self.cache.present))

    def sample_metrics(self) -> None:
        # Heap entries of revoked units are skipped when popped; counted here, they are few.
        metrics.SCHEDULER_PENDING_UNITS.publish(
            {("ready",): len(self._ready), ("backoff",): len(self._backoff)}
        )

    async def on_stop(self) -> None:
        # Stop heartbeating first: a heartbeat in flight would re-register the deleted shard.
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        with contextlib.suppress(StoreError):
            await self.store.delete(pb.SchedulerInstance, self.config.name)
        # Writes in flight (pods marked unschedulable) get one second in all, not one each:
        # a shard stopped while handing back many units holds hundreds of them.
        side = list(self._side_tasks)
        if side:
            # Within the grace: on_stop gets only a quarter of it once RPCs drained (runtime).
            wait = min(SIDE_TASKS_GRACE_SECONDS, self.config.grace_seconds / 8)
            _, late = await asyncio.wait(side, timeout=wait)
            for task in late:
                task.cancel()
            await asyncio.gather(*side, return_exceptions=True)
        await self.informer.stop()

    async def _register(self) -> None:
        inst = pb.SchedulerInstance(metadata=pb.ObjectMeta(name=self.config.name))
        inst.spec.address = self.address
        inst.status.heartbeat_ms = _now_ms()
        inst.status.ready = True
        try:
            await self.store.create(inst)
        except AlreadyExistsError:  # a restart under the same name: take it over
            current = await self.store.get(pb.SchedulerInstance, self.config.name)
            current.spec.address = self.address
            current.status.CopyFrom(inst.status)
            await self.store.update(current, force=True)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_seconds)
            try:
                # The record as the watch last showed it: with a node partition it is ~100 KB,
                # and fetching it every beat cost more than the beat. A copy the watch has not
                # caught up with fails the compare-and-set and the beat goes again on a fresh one.
                seen = self.informer.get("SchedulerInstance", self.config.name)
                beaten = False
                if isinstance(seen, pb.SchedulerInstance):
                    with contextlib.suppress(ConflictError):
                        # CAS: never overwrite a partition the dispatcher wrote meanwhile.
                        await self.store.update(self._beat(seen))
                        beaten = True
                if not beaten:
                    fresh = await self.store.get(pb.SchedulerInstance, self.config.name)
                    await self.store.update(self._beat(fresh))
            except NotFoundError:
                await self._register()  # deleted (e.g. declared dead): announce again
            except (ConflictError, StoreError) as exc:
                log.warning("heartbeat failed", error=str(exc))

    def _beat(self, seen: pb.SchedulerInstance) -> pb.SchedulerInstance:
        """A copy of the record with this beat's liveness and counters."""
        inst = pb.SchedulerInstance()
        inst.CopyFrom(seen)
        inst.status.heartbeat_ms = _now_ms()
        inst.status.ready = True
        inst.status.undecided_pods = sum(u.undecided() for u in self.units.values())
        inst.status.proposed_pods = self.stats["decided_pods"]
        inst.status.bound_pods = self.stats["bound"]
        inst.status.conflicted_pods = self.stats["conflicted"]
        return inst

    # -- informer ----------------------------------------------------------------------------

    def _holds(self, pod: str, node: str) -> bool:
        bound = self.cache.bound.get(pod)
        return bound is not None and bound[0] == node

    def _on_add(self, kind: str, obj: Any) -> None:
        if kind == "Movement":
            self.movements.on_add(kind, obj)
            return
        if kind == "SchedulerInstance":
            if obj.metadata.name == self.config.name:
                # Every heartbeat echoes the record: the spec compared as a message (~0.2 ms at
                # 5,000 names) spares building the set (~8 ms) when the partition did not change.
                if self._spec_seen is not None and obj.spec == self._spec_seen:
                    return
                self._spec_seen = obj.spec
                partition = frozenset(obj.spec.partition)
                # Keep the same set unless it changed, so the search's cached scan order (keyed
                # on it) is not compared node by node per cycle.
                if partition != self.scheduler.partition:
                    self.scheduler.partition = partition
                    log.info("partition changed", nodes=len(partition))
            return
        if kind == "DisruptionBudget":
            self.victims.budgets_changed()
            return
        self.cache.on_add(kind, obj)

    def _on_update(self, kind: str, old: Any, new: Any) -> None:
        self._on_add(kind, new)

    def _on_delete(self, kind: str, obj: Any) -> None:
        if kind == "DisruptionBudget":
            self.victims.budgets_changed()
        elif kind == "Movement":
            self.movements.on_delete(kind, obj)
        elif kind != "SchedulerInstance":
            self.cache.on_delete(kind, obj)

    # -- dispatcher side ---------------------------------------------------------------------

    async def accept_units(self, stream: _DispatchStream, batch: ipb.UnitBatch) -> None:
        for u in batch.units:
            name = u.job.metadata.name
            if not name or name in self.units:
                # Already held (a re-dispatch): the dispatcher spent credits; give them back.
                stream.give(len(u.pods))
                continue
            refs = u.pods
            if len(refs) <= _READ_AT_ONCE:
                pending = {p.name: p.resource_version for p in refs}
            else:
                pending = {}
                until = time.monotonic() + YIELD_SECONDS
                for p in refs:
                    pending[p.name] = p.resource_version
                    if time.monotonic() >= until:
                        # 100,000 pod refs take seconds to read on a busy machine: heartbeats
                        # run between (a stream that closes meanwhile cancels this read).
                        await asyncio.sleep(0)
                        until = time.monotonic() + YIELD_SECONDS
            self._seq += 1
            unit = _Unit(
                job=u.job,
                stream=stream,
                seq=self._seq,
                credits=len(u.pods),
                already_bound=u.already_bound,
                pending=pending,
            )
            self.units[name] = unit
            heapq.heappush(self._ready, (-unit.priority, unit.seq, unit))
        self._wake.set()

    def revoke(self, jobs: Iterable[str]) -> None:
        for job in jobs:
            unit = self.units.get(job)
            if unit is not None:
                self._drop(unit)

    def stream_closed(self, stream: _DispatchStream) -> None:
        """The dispatcher re-dispatches what this stream held: drop its units here."""
        stream.close()
        for unit in [u for u in self.units.values() if u.stream is stream]:
            self._drop(unit)

    def _drop(self, unit: _Unit) -> None:
        unit.revoked = True
        self.units.pop(unit.name, None)
        for pod in unit.inflight:
            # Verdicts still come; until then the placement keeps counting (it may bind).
            self.cache.confirm(pod, self.config.assumed_ttl_seconds)
        unit.stream.give(unit.credits)
        unit.credits = 0

    def _finish_pods(self, unit: _Unit, count: int) -> None:
        count = min(count, unit.credits)
        unit.credits -= count
        unit.stream.give(count)

    def _maybe_finish(self, unit: _Unit) -> None:
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
            self.stats["handed_back"] += len(unit.handed_back)
            self._side_task(self._mark_unschedulable(dict(unit.handed_back), dict(unit.diagnoses)))
        else:
            unit.stream.outcome(unit.name, ipb.UNIT_DONE, unit.bound)
        self._finish_pods(unit, unit.credits)

    async def _mark_unschedulable(
        self, reasons: dict[str, str], diagnoses: dict[str, Diagnosis]
    ) -> None:
        """PodScheduled=False with the reason on pods handed back, and the search's diagnosis
        as data in ``status.unschedulable`` (what `godel explain` renders; a pod handed back
        for another cause, e.g. the Binder's rejections, has none); conflicts are ignored:
        whoever changed the pod meanwhile knows better."""
        now = _now_ms()
        pods: list[pb.Pod] = []
        for name, reason in reasons.items():
            if len(pods) >= MARK_CHUNK_PODS:
                # Tens of thousands of pods handed back (a huge unit on a full cluster): written
                # a chunk at a time, so building and encoding them never holds the event loop
                # (heartbeats) for long.
                await self._record_unschedulable(pods)
                pods = []
            cached = self.informer.get("Pod", name)
            if not isinstance(cached, pb.Pod) or cached.spec.node_name:
                continue
            pod = pb.Pod()
            pod.CopyFrom(cached)
            cond = next((c for c in pod.status.conditions if c.type == "PodScheduled"), None)
            if cond is None:
                cond = pod.status.conditions.add(type="PodScheduled")
            if cond.status != "False":
                cond.last_transition_ms = now
            cond.status, cond.reason, cond.message = "False", "Unschedulable", reason
            pod.status.scheduler = self.config.name
            pod.status.attempts += 1
            diagnosis = diagnoses.get(name)
            if diagnosis is None:
                pod.status.ClearField("unschedulable")
            else:
                pod.status.unschedulable.CopyFrom(diagnosis.to_proto())
            pods.append(pod)
        await self._record_unschedulable(pods)

    async def _record_unschedulable(self, pods: list[pb.Pod]) -> None:
        if not pods:
            return
        try:
            await self.store.update_many(pods)
        except StoreError as exc:
            log.warning("could not record unschedulable pods", error=str(exc), pods=len(pods))

    def _side_task(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    # -- the scheduling loop -----------------------------------------------------------------

    async def _schedule_loop(self) -> None:
        while True:
            timeout = None
            if self._backoff:
                timeout = max(0.0, self._backoff[0][0] - time.monotonic())
            if not self._ready:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            now = time.monotonic()
            while self._backoff and self._backoff[0][0] <= now:
                _, seq, unit = heapq.heappop(self._backoff)
                if not unit.revoked:
                    heapq.heappush(self._ready, (-unit.priority, seq, unit))
            if self._ready:
                await self.run_cycle()
                await asyncio.sleep(0)  # let streams and the informer run between cycles

    async def run_cycle(self) -> None:
        """One scheduling cycle: refresh the snapshot, schedule ready units for up to the cycle
        budget, send their decisions as one DecisionBatch."""
        self.cache.expire()
        self.snapshot.update(self.cache)
        deadline = time.monotonic() + self.config.cycle_budget_ms / 1000
        # Decisions are written into the batch as they are made: built apart, each (with its
        # placements) would be copied whole into the batch.
        batch = ipb.DecisionBatch(shard=self.config.name)
        units: list[_Unit] = []
        pods = 0
        grouping = self.config.mode == "godel"
        while self._ready and pods < self.config.max_batch_pods:
            _, _, unit = heapq.heappop(self._ready)
            if unit.revoked or not unit.pending:
                continue
            if grouping and self._is_loose(unit):
                group = self._take_loose(unit, self.config.max_batch_pods - pods)
                for decided in await self._attempt_loose(group, batch):
                    units.append(decided)
                    pods += 1
            else:
                decision = await self._attempt(unit, batch)
                if decision is not None:
                    units.append(unit)
                    pods += len(decision.placements)
            if time.monotonic() >= deadline:
                break
        if units:
            metrics.SCHEDULER_PODS_SCHEDULED.inc(pods)  # once a cycle: one-pod units are many
            self._send(batch, units)

    async def _attempt(self, unit: _Unit, batch: ipb.DecisionBatch) -> ipb.UnitDecision | None:
        """Place the unit's pending pods; on success its decision is appended to ``batch``
        and returned."""
        infos: list[PodInfo] = []
        revision = self.informer.revision
        until = time.monotonic() + YIELD_SECONDS
        for name, rv in list(unit.pending.items()):
            if time.monotonic() >= until:
                # A 100,000-pod unit takes seconds to read: heartbeats and streams run between
                # (its pods are read one by one anyway, each as the view has it then).
                await asyncio.sleep(0)
                until = time.monotonic() + YIELD_SECONDS
                if unit.revoked:
                    return None
            pod = self._pending_pod(unit, name, rv, revision)
            if isinstance(pod, _NotYet):
                return None
            if pod is not None:
                infos.append(pod)
        if not infos:
            self._maybe_finish(unit)
            return None
        waiting = self.movements.waiting_for(unit.name)
        if waiting:
            # A swap: the recommended room is being vacated; wait for it instead of going
            # elsewhere (bounded by the Movement's age).
            log.debug("unit waits for a recommended node", job=unit.name, reason=waiting)
            self._defer(unit, MOVEMENT_WAIT_POLL_SECONDS)
            return None
        spec = unit.job.spec
        affinity = unit.affinity
        info = UnitInfo(
            unit.name,
            spec.min_member,
            unit.already_bound,
            spec.priority,
            infos,
            preferred=self.movements.preferences(unit.name, [p.name for p in infos]),
            affinity=affinity,
            placed_nodes=self._placed_nodes(unit) if affinity is not None else (),
        )
        with metrics.SCHEDULER_SCHEDULING_DURATION.time():
            result = await self._search(info)
        unit.pending.clear()
        if unit.revoked:
            return None  # revoked while being placed: its placements die with the snapshot
        unit.infeasible = result.infeasible
        if not result.success:
            self._hand_back(unit, result.unplaced, result.diagnoses, result.reason)
            return None
        unit.handed_back.update(result.unplaced)
        unit.diagnoses.update(result.diagnoses)
        return self._propose(unit, result.placements, {p.name: p.req for p in infos}, batch)

    def _pending_pod(
        self, unit: _Unit, name: str, rv: int, revision: int
    ) -> PodInfo | _NotYet | None:
        """A pending pod of ``unit`` as the search takes it; None when it needs no placing
        any more (deleted by its owner, or bound meanwhile: counted here); ``_NOT_YET`` when
        the view has not caught up with the dispatcher (the unit is deferred)."""
        pod = self.informer.get("Pod", name)
        if not isinstance(pod, pb.Pod) or pod.metadata.resource_version < rv:
            if revision < rv:  # the view has not caught up with the dispatcher yet
                self._defer(unit, 0.02)
                return _NOT_YET
            del unit.pending[name]  # deleted by its owner
            self._finish_pods(unit, 1)
            return None
        if pod.spec.node_name or pod.status.phase != pb.POD_PENDING:
            del unit.pending[name]  # bound meanwhile (e.g. an earlier decision of ours)
            if pod.spec.node_name:
                unit.bound.append(name)
                unit.already_bound += 1
            self._finish_pods(unit, 1)
            return None
        return PodInfo.from_pod(pod)

    def _is_loose(self, unit: _Unit) -> bool:
        """Whether the unit's search may be shared: one pod to place, placed on its own, and
        no Movement's recommendations or waits to honour."""
        return unit.loose and len(unit.pending) == 1 and not self.movements.lists(unit.name)

    def _take_loose(self, first: _Unit, room: int) -> list[_Unit]:
        """``first`` and the loose units next in line after it (the ready order is kept: they
        are searched in it), at most ``MAX_LOOSE_GROUP`` and ``room`` pods."""
        group = [first]
        limit = min(MAX_LOOSE_GROUP, max(1, room))
        ready = self._ready
        while ready and len(group) < limit:
            unit = ready[0][2]
            if unit.revoked or not unit.pending:
                heapq.heappop(ready)
                continue
            if not self._is_loose(unit):
                break
            heapq.heappop(ready)
            group.append(unit)
        return group

    async def _attempt_loose(self, group: list[_Unit], batch: ipb.DecisionBatch) -> list[_Unit]:
        """Place the one pending pod of each of ``group``'s units in one search (pods placed
        independently: ``UnitInfo.independent``); each unit then ends, or sends its decision
        into ``batch``, as alone. Returns the units that sent one."""
        revision = self.informer.revision
        owners: list[tuple[_Unit, PodInfo]] = []
        for unit in group:
            name, rv = next(iter(unit.pending.items()))
            pod = self._pending_pod(unit, name, rv, revision)
            if pod is None:
                self._maybe_finish(unit)
            elif not isinstance(pod, _NotYet):
                owners.append((unit, pod))
        if not owners:
            return []
        search = UnitInfo("", 1, 0, 0, [info for _, info in owners], independent=True)
        with metrics.SCHEDULER_SCHEDULING_DURATION.time():
            result = await self._search(search)
        placed = {p.pod: p for p in result.placements}
        decided: list[_Unit] = []
        for unit, info in owners:
            unit.pending.clear()
            if unit.revoked:
                continue  # revoked while being placed: its placement dies with the snapshot
            placement = placed.get(info.name)
            if placement is None:
                unit.infeasible = info.name in result.infeasible_pods
                reason = result.unplaced.get(info.name, result.reason)
                self._hand_back(unit, {info.name: reason}, result.diagnoses, reason)
                continue
            self._propose(unit, [placement], {info.name: info.req}, batch)
            decided.append(unit)
        return decided

    def _hand_back(
        self,
        unit: _Unit,
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
        self._maybe_finish(unit)

    def _propose(
        self,
        unit: _Unit,
        placements: list[Placement],
        requests: dict[str, PodRequest],
        batch: ipb.DecisionBatch,
    ) -> ipb.UnitDecision:
        """Append the unit's decision to ``batch``, its placements assumed in the cache."""
        spec = unit.job.spec
        decision = batch.units.add(
            job=unit.name, min_member=spec.min_member, already_bound=unit.already_bound
        )
        out = decision.placements
        # Any replacement of a job a live Movement lists is recorded against it (actual when it
        # used a recommendation, mismatched when not).
        movement = self.movements.movement_of(unit.name)
        for p in placements:
            if p.recommendation:
                self.movements.proposed(p.pod, p.recommendation, unit.name, p.node)
            req = requests[p.pod].pinned(p.numa_nodes) if p.numa_nodes else requests[p.pod]
            self.cache.assume(req, p.node, p.victims)
            self.victims.admit(p.victims)
            unit.inflight[p.pod] = p.node
            out.add(
                pod=p.pod,
                pod_resource_version=p.resource_version,
                node=p.node,
                victims=p.victims,
                movement=p.recommendation or movement,
                numa_nodes=p.numa_nodes,
            )
        self.stats["decided_pods"] += len(out)
        self._nominate(unit, out)
        return decision

    def _placed_nodes(self, unit: _Unit) -> tuple[str, ...]:
        """Nodes of the job's pods bound (as this shard's cache knows them) or in flight: the
        domain a job-level affinity confines the rest to."""
        nodes = list(unit.inflight.values())
        if unit.already_bound:
            nodes += self.cache.bound_nodes_of(unit.name)
        return tuple(nodes)

    @staticmethod
    def _nominate(unit: _Unit, placements: Iterable[ipb.Placement]) -> None:
        """Tell the dispatcher which pods of this decision preempt, and where, while the
        Binder has it (one message per unit, and only for units that preempt or did)."""
        nominations = [
            ipb.Nomination(pod=p.pod, node=p.node, victims=p.victims)
            for p in placements
            if p.victims
        ]
        if nominations or unit.nominated:
            unit.nominated = bool(nominations)
            unit.stream.send(
                ipb.ShardMessage(nominations=ipb.Nominations(job=unit.name, pods=nominations))
            )

    async def _search(self, info: UnitInfo) -> UnitResult:
        """The unit search, letting the event loop run every ``YIELD_SECONDS``: a large unit
        (a 10,000-pod gang, or kube mode's per-pod scans) takes seconds, and heartbeats, streams
        and SIGTERM must not wait for it. Only this loop touches the snapshot meanwhile."""
        steps = self.scheduler.steps(info, self.snapshot)
        until = time.monotonic() + YIELD_SECONDS
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result: UnitResult = done.value
                return result
            if time.monotonic() >= until:
                await asyncio.sleep(0)
                until = time.monotonic() + YIELD_SECONDS

    def _defer(self, unit: _Unit, delay: float) -> None:
        heapq.heappush(self._backoff, (time.monotonic() + delay, unit.seq, unit))
        self._wake.set()

    # -- the Binder side ---------------------------------------------------------------------

    def _send(self, batch: ipb.DecisionBatch, units: list[_Unit]) -> None:
        self._batch_id += 1
        batch.batch_id = self._batch_id
        self._undecided[self._batch_id] = (batch, units)
        self._unsent.append(self._batch_id)
        self._send_wake.set()

    async def _binder_loop(self) -> None:
        delay = 0.05
        while True:
            address = await self._binder_address()
            if address is None:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            try:
                await self._run_binder_stream(address)
                log.info("binder stream ended; looking up the leader again", binder=address)
            except grpc.aio.AioRpcError as exc:
                log.info(
                    "binder stream failed; looking up the leader again",
                    binder=address,
                    code=exc.code().name,
                    details=exc.details(),
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _binder_address(self) -> str | None:
        try:
            lease = await self.store.get_lease(BINDER_LEASE)
        except StoreError as exc:
            log.warning("cannot read the binder lease", error=str(exc))
            return None
        if lease is None or not lease.holder or not lease.holder_address:
            return None
        return lease.holder_address

    async def _run_binder_stream(self, address: str) -> None:
        async with self.dial(address, _CHANNEL_OPTIONS) as channel:
            call = internal_pb2_grpc.BinderStub(channel).Decide()
            # Everything not yet answered goes again, in order; the Binder answers duplicates of
            # already-bound pods with STALE.
            self._unsent = deque(sorted(self._undecided))
            self._written_at.clear()
            self._answered_write = 0
            writer = asyncio.create_task(self._write_batches(call))
            try:
                async for verdicts in call:
                    if self.on_verdicts(verdicts):
                        return  # NOT_LEADER: reconnect to the new leader
            finally:
                writer.cancel()
                # A write racing the call's end raises InvalidStateError ("RPC already
                # finished", e.g. when the Binder stepped down mid-stream): the stream is over
                # either way, and the loop looks the leader up again.
                with contextlib.suppress(
                    asyncio.CancelledError, grpc.aio.AioRpcError, asyncio.InvalidStateError
                ):
                    await writer

    async def _write_batches(self, call: Any) -> None:
        while True:
            while self._unsent:
                batch_id = self._unsent.popleft()
                entry = self._undecided.get(batch_id)
                if entry is not None:
                    await call.write(entry[0])
                    if batch_id not in self._written_at:
                        self._writes += 1
                        self._written_at[batch_id] = (time.monotonic(), self._writes)
            self._send_wake.clear()
            await self._send_wake.wait()

    def on_verdicts(self, vb: ipb.VerdictBatch) -> bool:
        """Apply one VerdictBatch. Returns True when the Binder said it is not the leader (the
        batch stays undecided and is resent to the new leader)."""
        entry = self._undecided.get(vb.batch_id)
        if entry is None:
            return False
        if vb.verdicts and all(v.code == ipb.NOT_LEADER for v in vb.verdicts):
            return True
        del self._undecided[vb.batch_id]
        written = self._written_at.pop(vb.batch_id, None)
        if written is not None:
            self._answered_write = max(self._answered_write, written[1])
        batch, units = entry
        got = {v.pod: v for v in vb.verdicts}
        for decision, unit in zip(batch.units, units, strict=True):
            for placement in decision.placements:
                pod = placement.pod
                verdict = got.get(pod)
                code = verdict.code if verdict is not None else ipb.ERROR
                reason = verdict.reason if verdict is not None else "no verdict from the binder"
                unit.inflight.pop(pod, None)
                if code == ipb.BOUND:
                    self.stats["bound"] += 1
                    self.cache.confirm(pod, self.config.assumed_ttl_seconds)
                    if not unit.revoked:
                        unit.bound.append(pod)
                        unit.already_bound += 1
                        self._finish_pods(unit, 1)
                    continue
                self.stats["rejected"] += 1
                if code in _CONFLICT_CODES:
                    self.stats["conflicted"] += 1
                self.cache.forget(pod)
                if not unit.revoked:
                    name = ipb.VerdictCode.Name(code) if code in _RETRY_CODES else str(code)
                    unit.retry[pod] = f"binder: {name}: {reason}"
                    if verdict is not None:
                        unit.min_revision = max(unit.min_revision, verdict.resource_version)
            if not unit.revoked and not unit.inflight:
                self._after_verdicts(unit)
        self._wake.set()
        return False

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.reconcile_interval_seconds)
            self.reconcile()

    def reconcile(self) -> int:
        """Take back decisions the Binder received and never answered (a verdict lost while the
        stream stayed up: a reconnect resends everything by itself): unanswered for
        ``verdict_timeout_seconds`` although a decision written after them has been answered,
        so a Binder that is only slow is left alone. Their placements are forgotten and their
        pods retried, as after an ERROR verdict; a pod that did bind is found bound by the
        retry. Returns the number of decisions repaired."""
        deadline = time.monotonic() - self.config.verdict_timeout_seconds
        stuck = [
            batch_id
            for batch_id, (at, write) in self._written_at.items()
            if at <= deadline and write < self._answered_write
        ]
        repaired = 0
        for batch_id in stuck:
            entry = self._undecided.get(batch_id)
            if entry is None:
                self._written_at.pop(batch_id, None)
                continue
            repaired += 1
            batch, _ = entry
            reason = f"no verdict within {self.config.verdict_timeout_seconds:g}s (reconciler)"
            pods = [(d.job, p.pod) for d in batch.units for p in d.placements]
            self.on_verdicts(
                ipb.VerdictBatch(
                    batch_id=batch_id,
                    verdicts=[
                        ipb.PodVerdict(pod=pod, job=job, code=ipb.ERROR, reason=reason)
                        for job, pod in pods
                    ],
                )
            )
            self.stats["repaired_decisions"] += 1
            log.warning(
                "reconciler: decision without a verdict taken back",
                batch_id=batch_id,
                pods=len(pods),
                repaired_total=self.stats["repaired_decisions"],
            )
        return repaired

    def _after_verdicts(self, unit: _Unit) -> None:
        if unit.retry:
            unit.attempts += 1
            if unit.attempts >= self.config.max_attempts:
                for pod, reason in unit.retry.items():
                    unit.handed_back[pod] = f"{reason} (after {unit.attempts} attempts)"
                unit.retry.clear()
            else:
                # Retry against a view that has seen at least what the Binder saw.
                unit.pending = {pod: unit.min_revision for pod in unit.retry}
                unit.retry.clear()
                delay = min(
                    self.config.backoff_initial_seconds * 2 ** (unit.attempts - 1),
                    self.config.backoff_max_seconds,
                )
                self._defer(unit, delay)
                return
        self._maybe_finish(unit)


class _SchedulerServicer(internal_pb2_grpc.SchedulerServicer):
    def __init__(self, service: SchedulerService) -> None:
        self.service = service

    # Written with context.read()/write() (reads and writes run concurrently), not as the
    # generator the generated base class declares.
    async def Dispatch(  # type: ignore[override]
        self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        service = self.service
        stream = _DispatchStream()
        stream.give(service.config.capacity)
        peer = context.peer()
        log.info("dispatcher connected", peer=peer)

        async def read() -> None:
            try:
                while True:
                    msg = await context.read()
                    if msg is grpc.aio.EOF:
                        return
                    assert isinstance(msg, ipb.DispatchMessage)
                    body = msg.WhichOneof("body")
                    if body == "units":
                        await service.accept_units(stream, msg.units)
                    elif body == "revoke":
                        service.revoke(msg.revoke.jobs)
            finally:
                stream.close()

        reader = asyncio.create_task(read())
        try:
            while (out := await stream.next()) is not None:
                await context.write(out)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            service.stream_closed(stream)
            log.info("dispatcher disconnected", peer=peer)


class _NotYet:
    """A pending pod the shard's view has not caught up with (``_pending_pod``)."""


_NOT_YET = _NotYet()


def _now_ms() -> int:
    return int(time.time() * 1000)
