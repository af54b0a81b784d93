"""A scheduler shard: schedules the units the dispatcher streams to it, sends decisions to the
Binder leader, and hands back what it cannot place. See README.md for the contract.

This module composes the parts (README.md's table): the informer (Nodes, Pods,
SchedulerInstances → the live cache), the unit queue (``queue.ShardQueue``) and the units held
(``units.UnitBook``), one scheduling loop running ``cycle.ShardCycle`` (the only code that
touches the snapshot), the Binder link (``binder_link.BinderLink``: decisions out, verdicts in,
the reconciler), registration, the liveness stamps (``store.pulse.ShardPulse``, from a thread of
their own) and the counters written into the record. Each dispatcher stream is served by its own
handler; it only enqueues units and writes replies.

The shard's name is a lease (``shardlease.ShardLease``): the process holding it is the shard;
another configured for the name (or a spare, ``standby_for``) waits warm until it frees.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import grpc
import structlog
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from placement.framework import Framework, PluginConfigError, Profile, load_profile
from placement.plugins import new_in_tree_registry
from placement.postfilter import Preemption
from placement.search import SearchConfig, UnitScheduler
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services import metrics
from services.runtime import Service, ServiceConfig, option
from services.runtime.config import ConfigError
from services.runtime.streams import messages
from services.scheduler.binder_link import BinderLink
from services.scheduler.cache import SchedulerCache
from services.scheduler.cycle import YIELD_SECONDS, CycleSettings, ShardCycle
from services.scheduler.movements import MovementTracker
from services.scheduler.queue import ShardQueue
from services.scheduler.shardlease import ShardLease
from services.scheduler.units import Unit, UnitBook, reservation_job
from services.scheduler.unschedulable import UnschedulableRecorder, now_ms
from services.scheduler.victims import ShardVictims
from store.errors import (
    AlreadyExistsError,
    CommitError,
    ConflictError,
    FencedError,
    NotFoundError,
    StoreError,
)
from store.informer import Handlers, Informer
from store.lease import Fence, Leases, incarnation
from store.ops import Create, Delete, Update, hinted_start
from store.pulse import ShardHeartbeats, ShardPulse

log = structlog.get_logger(__name__)

SCHEDULER_SERVICE = ipb.DESCRIPTOR.services_by_name["Scheduler"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# How long a stopping shard lets its in-flight writes (pods marked unschedulable) finish.
SIDE_TASKS_GRACE_SECONDS = 1.0
# A unit of up to this many pod refs is read without looking at the clock (well under a
# millisecond); larger ones yield every YIELD_SECONDS while read.
_READ_AT_ONCE = 1000
# Unit outcomes joined in one ShardMessage at most (a UNIT_DONE names its bound pods, so a
# message of this many units of 1,000 pods stays far below MAX_MESSAGE_BYTES).
MAX_OUTCOMES_PER_MESSAGE = 1000


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
        default=1.0,
        metadata=option(
            "liveness stamp period (written from a thread of its own, outside the change feed)",
            minimum=0.05,
        ),
    )
    status_seconds: float = field(
        default=5.0,
        metadata=option(
            "how often the shard writes its counters into its SchedulerInstance record (only "
            "when they changed)",
            minimum=0.05,
        ),
    )
    max_loop_silence_seconds: float = field(
        default=60.0,
        metadata=option(
            "liveness stamps stop once the shard's event loop has not run for this long (a "
            "wedged shard is judged dead; a busy one is not)",
            minimum=0.1,
        ),
    )
    drill_stall_seconds: float = field(
        default=0.0,
        metadata=option(
            "fault drill: on SIGUSR1 the shard's event loop blocks this long (0: off), to see "
            "a busy shard kept alive by its liveness stamps",
            minimum=0,
        ),
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
    standby_for: str = field(
        default="",
        metadata=option(
            "a spare: the shard names (comma-separated) it stands by for, taking whichever "
            "frees first; empty: this process is shard `name` (a standby while another holds it)"
        ),
    )
    lease_ms: int = field(
        default=3000,
        metadata=option(
            "the shard name's lease; a killed holder's name is taken over after this",
            minimum=100,
        ),
    )
    renew_ms: int = field(
        default=500,
        metadata=option(
            "how often the holder renews its name's lease, and a standby asks for it (at most "
            "half of lease_ms)",
            minimum=10,
        ),
    )

    def __post_init__(self) -> None:
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ConfigError("backoff_max_seconds must be >= backoff_initial_seconds")
        if self.max_loop_silence_seconds <= self.heartbeat_seconds:
            raise ConfigError("max_loop_silence_seconds must be > heartbeat_seconds")
        if self.renew_ms * 2 > self.lease_ms:
            raise ConfigError(
                f"renew_ms ({self.renew_ms}) must be at most half of lease_ms ({self.lease_ms})"
            )
        if self.standby_for and not self.shard_names():
            raise ConfigError("standby_for names no shard")
        self.load_profile()  # a bad profile is a config error: refused before anything starts

    def shard_names(self) -> tuple[str, ...]:
        """The names this process may be: ``standby_for``'s for a spare, else its own."""
        if not self.standby_for:
            return (self.name,)
        return tuple(n for n in (part.strip() for part in self.standby_for.split(",")) if n)

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
        done = self._joining.outcomes.add(job=job, code=code, pods=pods)
        if reason:  # most units end bound, without one: an empty text given costs as a set one
            done.reason = reason
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


# ---------------------------------------------------------------------------------------------
# The service: the composition of the parts, its lifecycle, the informer, the loops
# ---------------------------------------------------------------------------------------------


def _read_whole(kind: str, obj: Message) -> bool:
    """What the shard's informer keeps: every object but the pods the cache keeps as records
    (``SchedulerCache.keeps_whole``)."""
    return not isinstance(obj, pb.Pod) or SchedulerCache.keeps_whole(obj)


class SchedulerService(Service[SchedulerConfig]):
    component = "scheduler"
    config_class = SchedulerConfig
    grpc_services = (SCHEDULER_SERVICE,)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = self.config
        # The shard this process is: its own name, or (a spare) the one it takes; "" until then.
        self.shard = "" if config.standby_for else config.name
        self.framework = Framework(config.load_profile(), new_in_tree_registry())
        self.cache = SchedulerCache()
        self.informer = Informer(
            self.store,
            ["Node", "Pod", "SchedulerInstance", "DisruptionBudget", "Movement", "Reservation"],
            hold=_read_whole,
            held_elsewhere=lambda kind: self.cache.bound if kind == "Pod" else (),
            # A bound pod's start into its record from the feed's hint, undecoded.
            hinted=self._reads_hinted,
            # A (re)start's bound pods straight into the cache's records, each read once.
            take_listed={"Pod": self.cache.take_listed},
        )
        self.movements = MovementTracker(
            self.store, self.shard, self._holds, max_wait_seconds=config.movement_wait_seconds
        )
        self.victims = ShardVictims(self.cache, self.informer)
        self.scheduler = UnitScheduler(
            self.framework,
            SearchConfig(
                mode=config.mode,
                feasible_cache=config.feasible_cache,
                scan_extra=config.scan_extra,
                percentage_of_nodes_to_score=config.percentage_of_nodes_to_score,
            ),
            Preemption(self.framework, self.victims, config.preemption_candidates),
        )
        # Pods straight to the cache, the few other kinds through the dispatch below: a
        # (re)start delivers every bound pod, and each type test a pod failed on its way
        # cost a fifth of a microsecond.
        self.informer.add_handlers(
            Handlers.of(
                pb.Pod,
                on_add=lambda _, pod: self.cache.set_pod(pod),
                on_update=lambda _, __, pod: self.cache.set_pod(pod),
                on_delete=lambda _, pod: self.cache.remove_pod(pod.metadata.name),
            )
        )
        self.informer.add_handlers(
            Handlers(
                self._on_add,
                self._on_update,
                self._on_delete,
                kinds=frozenset(
                    {"Node", "SchedulerInstance", "DisruptionBudget", "Movement", "Reservation"}
                ),
            )
        )
        # Our record's spec as last seen (its partition is applied only when the spec changed).
        self._spec_seen: pb.SchedulerInstanceSpec | None = None
        self._wake = asyncio.Event()  # the scheduling loop's: a unit became ready or due
        self.stats = {
            "decided_pods": 0,
            "bound": 0,
            "rejected": 0,
            "conflicted": 0,
            "handed_back": 0,
            "repaired_decisions": 0,
        }
        self.queue: ShardQueue[Unit] = ShardQueue(
            config.backoff_initial_seconds, config.backoff_max_seconds
        )
        self.recorder = UnschedulableRecorder(self.store, self.informer, self.shard)
        self.book = UnitBook(
            self.queue,
            self.cache,
            self.recorder,
            self.stats,
            self._wake.set,
            max_attempts=config.max_attempts,
            assumed_ttl_seconds=config.assumed_ttl_seconds,
        )
        self.units = self.book.units  # by job: what the shard holds
        self.link: BinderLink[Unit] = BinderLink(
            self.store, self.dial, self.book, config.verdict_timeout_seconds
        )
        self.cycle = ShardCycle(
            CycleSettings(
                self.shard, config.mode == "godel", config.max_batch_pods, config.cycle_budget_ms
            ),
            self.book,
            self.link,
            self.scheduler,
            self.cache,
            self.informer,
            self.movements,
            self.victims,
            self.stats,
        )
        self.snapshot = self.cycle.snapshot
        # Liveness: stamps from a thread of its own, over a connection of its own (ShardPulse,
        # made once the name is taken); the record gets the counters now and then
        # (_status_loop).
        self.pulse: ShardPulse | None = None
        url, cluster = config.store_connection_url(), config.cluster
        # The name's lease, renewed from a thread of its own; the holder is this process (its
        # name and a token: a restart under the same name is another holder).
        self.lease = ShardLease(
            self.store,
            lambda: Leases.connect(url, cluster=cluster, max_connections=4),
            config.shard_names(),
            incarnation(config.name),
            lease_ms=config.lease_ms,
            renew_ms=config.renew_ms,
            spare=bool(config.standby_for),
            spawn=self.spawn,
            on_taken=self._take_over,
            on_lost=self._lost,
        )
        # The epoch this process acts as the shard under (None: a standby, or stepped down).
        self.fence: Fence | None = None
        self._role_changed = asyncio.Event()
        self._took_name = asyncio.Event()
        self._resigned = False
        self._streams: set[_DispatchStream] = set()
        self._status: asyncio.Task[None] | None = None
        self._registering = False
        self._stopping = False
        # The counters as last written to the record (None: not yet).
        self._counters_written: tuple[int, int, int, int] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def add_servicers(self, server: grpc.aio.Server) -> None:
        internal_pb2_grpc.add_SchedulerServicer_to_server(_SchedulerServicer(self), server)

    async def on_start(self) -> None:
        self.informer.start()
        await self.informer.wait_synced(self.config.sync_timeout_seconds)
        self.spawn(self._keep_health(), name="scheduler-health")
        self.spawn(self._resign_on_stop(), name="scheduler-resign")
        if await self.lease.try_once(self.address):
            # Free: serve as the shard before reporting SERVING, as a shard always did (the
            # keeper's first renewal confirms the lease and calls _take_over).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._took_name.wait(), self.config.sync_timeout_seconds)
        else:
            self.spawn(self.lease.campaign(self.address), name="scheduler-standby")
            log.info(
                "standby: every name held; waiting warm",
                standby_for=list(self.lease.candidates),
                address=self.address,
                nodes=len(self.cache.present),
            )

    @property
    def serving(self) -> bool:
        """Whether this process acts as its shard now (holds the name's lease)."""
        return self.fence is not None

    async def _take_over(self, name: str, fence: Fence) -> None:
        """The name's lease is ours (at ``fence``): become the shard — register, stamp, start
        the loops (the first time) and take dispatcher streams."""
        if self.stop_requested.is_set():
            return
        if not self.shard:
            self._become(name)
        self.fence = fence
        while self.fence is fence:
            try:
                await self._register(fence)
                # A fresh stamp at once: the dead holder's last one may be old already.
                await self.store.record_shard_heartbeat(self.shard)
                break
            except FencedError as exc:
                await self._fenced(exc)
                return
            except StoreError as exc:
                log.warning("registering as the shard failed; retrying", error=str(exc))
                await asyncio.sleep(self.config.renew_ms / 1000)
        if self.fence is not fence:
            return
        self._counters_written = None  # the record has none of ours yet
        if self.pulse is None:
            self._start_loops()
        self._role_changed.set()
        self._took_name.set()
        log.info(
            "serving as the shard",
            shard=self.shard,
            epoch=fence.epoch,
            address=self.address,
            nodes=len(self.cache.present),
        )

    def _become(self, name: str) -> None:
        """A spare takes ``name``: the parts that act in a shard's name learn it (they were
        made before it was known; each only reads it when acting)."""
        self.shard = name
        self.movements.shard = name
        self.recorder.shard = name
        self.cycle.settings = replace(self.cycle.settings, shard=name)
        for movement in self.informer.list("Movement"):  # acknowledged as this shard now
            self.movements.on_add("Movement", movement)
        own = self.informer.get("SchedulerInstance", name)
        if isinstance(own, pb.SchedulerInstance):
            self._own_record(own.spec)

    def _start_loops(self) -> None:
        config = self.config
        url, cluster = config.store_connection_url(), config.cluster
        self.pulse = ShardPulse(
            lambda: ShardHeartbeats.connect(url, cluster=cluster, max_connections=2),
            self.shard,
            every_seconds=config.heartbeat_seconds,
            max_owner_silence_seconds=config.max_loop_silence_seconds,
            on_missing=self._record_missing,
            may_stamp=self.lease.holds_now,
        )
        self.spawn(self._schedule_loop(), name="scheduler-loop")
        self.spawn(self.link.run(), name="scheduler-binder-stream")
        self.spawn(self.movements.ack_loop(), name="scheduler-movement-acks")
        self.spawn(self.pulse.run(), name="scheduler-pulse")
        self._status = self.spawn(self._status_loop(), name="scheduler-status")
        if config.drill_stall_seconds > 0:
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self._drill_stall)
        self.spawn(self._reconcile_loop(), name="scheduler-reconciler")

    async def _lost(self, fence: Fence) -> None:
        """The lease is gone (not renewed in time: a freeze, a store outage): stop acting as
        the shard at once — end the dispatcher streams (their units go back to the dispatcher)
        and stop stamping — and wait as a standby for the name again."""
        if self.fence is None or self.fence != fence:
            return
        self.fence = None
        for stream in list(self._streams):
            stream.close()
        self._role_changed.set()
        log.warning("no longer the shard: lease lost", shard=self.shard, epoch=fence.epoch)

    async def _fenced(self, exc: FencedError) -> None:
        """The store refused our epoch: another process is the shard now."""
        fence = self.fence
        if fence is not None:
            await self._lost(fence)
        await self.lease.step_down(f"fenced: {exc}")

    async def _resign_on_stop(self) -> None:
        # Give the name up as the stop begins, not after the gRPC grace (as the Binder's leader
        # does): a standby serves it at once, and the open streams end now.
        await self.stop_requested.wait()
        await self._resign()

    async def _resign(self) -> None:
        """Stop being the shard for good: streams ended (their units go back to the
        dispatcher), the record and its stamp deleted, the name's lease released."""
        if self._resigned:
            return
        self._resigned = self._stopping = True
        fence, self.fence = self.fence, None
        for stream in list(self._streams):
            stream.close()
        self._role_changed.set()
        if fence is not None:
            # Fenced: a holder deposed meanwhile deletes nothing of the process that took over
            # (nor its stamp: forgotten only once the record went).
            with contextlib.suppress(StoreError):
                await self.store.commit([Delete("SchedulerInstance", self.shard)], fence=fence)
                await self.store.forget_shard_heartbeat(self.shard)
        # Then the name is free: a standby takes it at once instead of after the lease.
        await self.lease.stop()

    async def _keep_health(self) -> None:
        """The Scheduler service entry is SERVING only while this process is the shard, as
        the Binder's is only on its leader; the overall entry ("") is SERVING once the view
        has synced, standby or not. The runtime marks every entry SERVING once on_start returns:
        wait for that, then keep ours in line with the role."""
        request = health_pb2.HealthCheckRequest(service=SCHEDULER_SERVICE)
        while (await self.health.Check(request, None)).status != SERVING:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # the runtime offers no event for it
        while True:
            self._role_changed.clear()
            await self.health.set(SCHEDULER_SERVICE, SERVING if self.serving else NOT_SERVING)
            await self._role_changed.wait()

    def sample_metrics(self) -> None:
        # Heap entries of revoked units are skipped when popped; counted here, they are few.
        ready, backoff = self.queue.sizes()
        metrics.SCHEDULER_PENDING_UNITS.publish({("ready",): ready, ("backoff",): backoff})

    async def on_stop(self) -> None:
        # Stop the status writes and the stamps first: either in flight would re-register or
        # re-stamp the deleted shard. The stamp goes with the record: nobody waits out a grace.
        self._stopping = True
        if self._status is not None:
            self._status.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._status
        if self.pulse is not None:
            await self.pulse.stop()
        await self._resign()
        # Writes in flight (pods marked unschedulable) get one second in all, not one each:
        # a shard stopped while handing back many units holds hundreds of them. Within the
        # grace: on_stop gets only a quarter of it once RPCs drained (runtime).
        await self.recorder.drain(min(SIDE_TASKS_GRACE_SECONDS, self.config.grace_seconds / 8))
        await self.informer.stop()

    async def _register(self, fence: Fence) -> None:
        """Write our record (fenced with the name's lease: FencedError once another process
        holds it). heartbeat_ms: the registration time, the shard's sign of life until its
        first stamp."""
        inst = pb.SchedulerInstance(metadata=pb.ObjectMeta(name=self.shard))
        inst.spec.address = self.address
        inst.status.heartbeat_ms = now_ms()
        inst.status.ready = True
        try:
            await self._commit_fenced(Create(inst), fence)
        except AlreadyExistsError:  # a restart, or a standby taking over: take the record over
            current = await self.store.get(pb.SchedulerInstance, self.shard)
            current.spec.address = self.address
            current.status.CopyFrom(inst.status)
            await self._commit_fenced(Update(current, force=True), fence)

    async def _commit_fenced(self, op: Create | Update, fence: Fence) -> None:
        """One write of our record, refused by the store unless our epoch is the lease's."""
        try:
            await self.store.commit([op], fence=fence)
        except CommitError as exc:
            raise exc.cause from None

    async def _record_missing(self) -> None:
        """A stamp found no record of ours (deleted as dead while we were frozen, say):
        register again, once at a time, unless we are stopping (we deleted it) or no longer
        hold the name (the fenced write would be refused anyway)."""
        fence = self.fence
        if self._registering or self._stopping or fence is None or not self.lease.holds_now():
            return
        self._registering = True
        try:
            await self._register(fence)
            self._counters_written = None  # the new record has none yet
            log.warning("record was gone; registered again", shard=self.shard)
        except FencedError as exc:
            await self._fenced(exc)
        except StoreError as exc:
            log.warning("registering again failed", shard=self.shard, error=str(exc))
        finally:
            self._registering = False

    def counters(self) -> tuple[int, int, int, int]:
        """What the record's status reports: (undecided, proposed, bound, conflicted) pods."""
        stats = self.stats
        return (
            self.book.undecided_pods(),
            stats["decided_pods"],
            stats["bound"],
            stats["conflicted"],
        )

    async def _status_loop(self) -> None:
        """Write the counters into the record every ``status_seconds``, when they changed.
        Liveness is the stamps' (``ShardPulse``), so this write is rare and may be late."""
        while True:
            await asyncio.sleep(self.config.status_seconds)
            counters = self.counters()
            fence = self.fence
            if counters == self._counters_written or fence is None:
                continue
            try:
                # The record as the watch last showed it: with a node partition it is ~100 KB,
                # and fetching it for every write cost more than the write. A copy the watch
                # has not caught up with fails the compare-and-set; it goes again on a fresh one.
                seen = self.informer.get("SchedulerInstance", self.shard)
                written = False
                if isinstance(seen, pb.SchedulerInstance):
                    with contextlib.suppress(ConflictError):
                        # CAS: never overwrite a partition the dispatcher wrote meanwhile.
                        await self._commit_fenced(
                            Update(self._with_counters(seen, counters)), fence
                        )
                        written = True
                if not written:
                    fresh = await self.store.get(pb.SchedulerInstance, self.shard)
                    await self._commit_fenced(Update(self._with_counters(fresh, counters)), fence)
                self._counters_written = counters
            except NotFoundError:
                await self._record_missing()
            except FencedError as exc:
                await self._fenced(exc)
            except (ConflictError, StoreError) as exc:
                log.warning("status write failed", error=str(exc))

    @staticmethod
    def _with_counters(
        seen: pb.SchedulerInstance, counters: tuple[int, int, int, int]
    ) -> pb.SchedulerInstance:
        """A copy of the record with these counters (``heartbeat_ms`` keeps the registration
        time: liveness is the stamps')."""
        inst = pb.SchedulerInstance()
        inst.CopyFrom(seen)
        inst.status.ready = True
        (
            inst.status.undecided_pods,
            inst.status.proposed_pods,
            inst.status.bound_pods,
            inst.status.conflicted_pods,
        ) = counters
        return inst

    def _drill_stall(self) -> None:
        """The fault drill (``drill_stall_seconds``): block the event loop, as a long
        computation would."""
        log.warning("fault drill: blocking the event loop", seconds=self.config.drill_stall_seconds)
        time.sleep(self.config.drill_stall_seconds)
        log.warning("fault drill: event loop released")

    # -- informer ----------------------------------------------------------------------------

    def _reads_hinted(self, kind: str, name: str, hint: bytes) -> bool:
        """Whether the informer reads a change its writer hinted (``Informer(hinted=)``): not a
        bound pod's start (``POD_STARTED``) that its record takes from the hint itself
        (``SchedulerCache.started``); anything else is read."""
        if kind != "Pod":
            return True
        started_ms = hinted_start(hint)
        return started_ms is None or not self.cache.started(name, started_ms)

    def _holds(self, pod: str, node: str) -> bool:
        bound = self.cache.bound.get(pod)
        return bound is not None and bound.node == node

    def _on_add(self, kind: str, obj: Message) -> None:
        if isinstance(obj, pb.Movement):
            self.movements.on_add(kind, obj)
        elif isinstance(obj, pb.SchedulerInstance):
            if self.shard and obj.metadata.name == self.shard:
                self._own_record(obj.spec)
        elif isinstance(obj, pb.DisruptionBudget):
            self.victims.budgets_changed()
        else:
            self.cache.on_add(kind, obj)

    def _own_record(self, spec: pb.SchedulerInstanceSpec) -> None:
        """Our record as the watch shows it: apply its partition when it changed."""
        # Every status write echoes the record: the spec compared as a message (~0.2 ms at 5,000
        # names) spares building the set (~8 ms) when the partition did not change.
        if self._spec_seen is not None and spec == self._spec_seen:
            return
        self._spec_seen = spec
        partition = frozenset(spec.partition)
        # Keep the same set unless it changed, so the search's cached scan order (keyed on it)
        # is not compared node by node per cycle.
        if partition != self.scheduler.partition:
            self.scheduler.partition = partition
            log.info("partition changed", nodes=len(partition))

    def _on_update(self, kind: str, old: Message, new: Message) -> None:
        self._on_add(kind, new)

    def _on_delete(self, kind: str, obj: Message) -> None:
        if kind == "DisruptionBudget":
            self.victims.budgets_changed()
        elif kind == "Movement":
            self.movements.on_delete(kind, obj)
        elif kind != "SchedulerInstance":
            self.cache.on_delete(kind, obj)

    # -- dispatcher side ---------------------------------------------------------------------

    async def accept_units(self, stream: _DispatchStream, batch: ipb.UnitBatch) -> None:
        for u in batch.units:
            job = reservation_job(u.reservation) if u.reservation else u.job
            name = job.metadata.name
            if not name or name in self.book:
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
            self.book.add(job, stream, pending, u.already_bound, u.reservation)
        self._wake.set()

    def revoke(self, jobs: Iterable[str]) -> None:
        self.book.revoke(jobs)

    def open_stream(self, stream: _DispatchStream) -> None:
        self._streams.add(stream)

    def stream_closed(self, stream: _DispatchStream) -> None:
        """The dispatcher re-dispatches what this stream held: drop its units here."""
        stream.close()
        self._streams.discard(stream)
        self.book.drop_stream(stream)

    # -- the loops ---------------------------------------------------------------------------

    async def _schedule_loop(self) -> None:
        queue = self.queue
        while True:
            # A holder woken from a freeze decides nothing before its lease is known to be its
            # own (the Binder's re-checks would refuse stale decisions; they cost it still):
            # it waits, its streams ending as it learns the lease is lost, or renewed.
            holding = self.lease.holds_now()
            if not queue.has_ready() or not holding:
                wait = queue.wait_seconds() if holding else self.config.renew_ms / 1000
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
            self._wake.clear()
            queue.promote()
            if queue.has_ready() and self.lease.holds_now():
                await self.run_cycle()
                await asyncio.sleep(0)  # let streams and the informer run between cycles

    async def run_cycle(self) -> None:
        """One scheduling cycle (``cycle.ShardCycle``)."""
        await self.cycle.run()

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.reconcile_interval_seconds)
            self.reconcile()

    def reconcile(self) -> int:
        """Take back decisions the Binder received and never answered
        (``binder_link.BinderLink.reconcile``). Returns the number of decisions repaired."""
        repaired = self.link.reconcile()
        self.stats["repaired_decisions"] += repaired
        return repaired


class _SchedulerServicer(internal_pb2_grpc.SchedulerServicer):
    def __init__(self, service: SchedulerService) -> None:
        self.service = service

    # Written with context.read()/write() (reads and writes run concurrently), not as the
    # generator the generated base class declares; hence the override its signature differs by.
    async def Dispatch(  # type: ignore[override]  # read()/write(), not the generator form
        self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        service = self.service
        if not service.serving:
            # A standby (or a holder that lost its name): the dispatcher's view of the record
            # is behind; it finds the shard at the address the record names now.
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"scheduler {service.config.name} is a standby for "
                f"{', '.join(service.lease.candidates)}, not serving as a shard",
            )
        stream = _DispatchStream()
        service.open_stream(stream)
        stream.give(service.config.capacity)
        peer = context.peer()
        log.info("dispatcher connected", peer=peer)

        async def read() -> None:
            try:
                async for msg in messages(context.read, ipb.DispatchMessage):
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
