"""The dispatcher: the public entry point (submissions, logical queues, dispatch to shards).

``on_start`` syncs one informer (pods, jobs, nodes, queues, scheduler instances, disruption
budgets) before anything is served, so the pending units are rebuilt from the store before the
first dispatch round and no pod is lost across a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import grpc
import structlog

from protos.godel.v1 import api_pb2, api_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services import events, metrics
from services.dispatcher.api.admission import AdmissionLimits
from services.dispatcher.api.servicer import DispatcherServicer
from services.dispatcher.controllers.budgetstatus import BudgetStatusController
from services.dispatcher.controllers.creation import PodCreator
from services.dispatcher.controllers.deletion import JobDeleter
from services.dispatcher.controllers.jobretry import JobRetryController
from services.dispatcher.controllers.jobstatus import JobStatusController
from services.dispatcher.controllers.nodelifecycle import NodeLifecycleController
from services.dispatcher.controllers.podindex import PodIndex, keeps_bytes
from services.dispatcher.controllers.queuestatus import QueueStatusController
from services.dispatcher.controllers.reconciler import Reconciler
from services.dispatcher.controllers.reservations import ReservationController
from services.dispatcher.controllers.ttl import FinishedJobCollector
from services.dispatcher.dispatching.dispatch import DispatchSettings, UnitDispatcher
from services.dispatcher.dispatching.partitions import NodeShuffler, PartitionSettings
from services.peers.binder import BinderEvictor
from services.runtime import Service, ServiceConfig
from services.runtime.config import option
from store.client import MAX_OPS_PER_CALL
from store.informer import Informer

log = structlog.get_logger(__name__)

# What the dispatcher's one informer caches: the dispatch core's kinds (budgets included: reclaim
# respects them, and the budget status controller keeps their status), and reservations (the
# reservation controller releases them).
INFORMER_KINDS = (*UnitDispatcher.KINDS, "Reservation")

# The longest the controllers that keep statuses wait after SERVING before their first tick
# (their interval, if shorter): the first health checks are answered meanwhile, and a reader
# of a Job, who waits for the job status controller's first tick, waits no longer for a long
# ``controller_interval_seconds``.
FIRST_TICKS_AFTER_SECONDS = 1.0


@dataclass(frozen=True)
class DispatcherConfig(ServiceConfig):
    """Dispatcher settings."""

    max_replicas: int = field(
        default=10_000,
        metadata=option(
            "most pods one job of a tenant may ask for (a queue's default max_pods_per_job "
            "for tenants)",
            minimum=1,
        ),
    )
    admin_max_replicas: int = field(
        default=100_000,
        metadata=option(
            "most pods one job of the admin identity may ask for; in a cluster without TLS "
            "every caller is the admin (a queue's default max_pods_per_job for the admin)",
            minimum=1,
        ),
    )
    max_pods_per_tenant: int = field(
        default=50_000,
        metadata=option(
            "most live pods (not Succeeded or Failed) one tenant may hold; a job past it is "
            "refused (the admin has no such limit)",
            minimum=1,
        ),
    )
    max_pending_pods: int = field(
        default=200_000,
        metadata=option(
            "most pods that may wait pending in one queue (a queue's default max_pending_pods)",
            minimum=1,
        ),
    )
    queue_fairness: Literal["round-robin", "drf", "fair-share"] = field(
        default="drf",
        metadata=option(
            "which queue dispatches next: drf (smallest dominant share of the cluster), "
            "fair-share (smallest dominant share per unit of queue weight) or round-robin"
        ),
    )
    reclaim_interval_seconds: float = field(
        default=1.0,
        metadata=option(
            "how often queues below their min are checked for borrowed capacity to reclaim",
            minimum=0.05,
        ),
    )
    shard_grace_seconds: float = field(
        default=5.0,
        metadata=option("a shard whose heartbeat is older than this is dead", minimum=0.1),
    )
    backoff_initial_seconds: float = field(
        default=1.0,
        metadata=option("first requeue delay of an unschedulable unit (doubles)", minimum=0),
    )
    backoff_max_seconds: float = field(
        default=60.0, metadata=option("longest requeue delay of an unschedulable unit", minimum=0)
    )
    infeasible_recheck_seconds: float = field(
        default=300.0,
        metadata=option(
            "a unit that can never fit is queued again on a node change, or after this long",
            minimum=0,
        ),
    )
    max_batch_pods: int = field(
        default=5000,
        metadata=option("pods per UnitBatch message (a larger unit travels alone)", minimum=1),
    )
    creation_chunk_pods: int = field(
        default=MAX_OPS_PER_CALL,
        metadata=option(
            "pods per store commit when a big job's pods are created or deleted (a job of more "
            "is created in the background after Submit answers)",
            minimum=1,
        ),
    )
    node_grace_seconds: float = field(
        default=10.0,
        metadata=option("a node whose heartbeat is older than this is lost", minimum=0.1),
    )
    controller_interval_seconds: float = field(
        default=1.0,
        metadata=option(
            "how often node lifecycle and job, queue and budget status are reconciled",
            minimum=0.01,
        ),
    )
    event_retention_seconds: float = field(
        default=events.DEFAULT_RETENTION_SECONDS,
        metadata=option("how long events are kept before they are deleted", minimum=1),
    )
    max_events: int = field(
        default=events.DEFAULT_MAX_EVENTS,
        metadata=option("the most events kept (the oldest go first)", minimum=1),
    )
    informer_sync_seconds: float = field(
        default=60.0, metadata=option("how long startup waits for the store's listing", minimum=1)
    )
    finished_job_ttl_seconds: int = field(
        default=86_400,
        metadata=option(
            "a finished job (and its pods) is deleted this long after it finished unless its "
            "spec.ttlSecondsAfterFinished says otherwise; -1 keeps finished jobs",
            minimum=-1,
        ),
    )
    partitioning: Literal["auto", "on", "off"] = field(
        default="auto",
        metadata=option(
            "node partitions between shards: 'auto' (past the thresholds below), 'on', 'off'"
        ),
    )
    partition_allocation_percent: float = field(
        default=90.0,
        metadata=option(
            "auto: partition above this guaranteed-pool allocation", minimum=0, maximum=100
        ),
    )
    partition_throughput: float = field(
        default=2000.0,
        metadata=option("auto: partition above this many pods bound per second", minimum=0),
    )
    partition_conflict_percent: float = field(
        default=1.0,
        metadata=option(
            "auto: partition above this share of proposed pods the Binder rejects as conflicts",
            minimum=0,
            maximum=100,
        ),
    )
    partition_window_seconds: float = field(
        default=10.0,
        metadata=option("throughput and conflict rate are measured over this window", minimum=1),
    )
    partition_off_after_seconds: float = field(
        default=30.0,
        metadata=option("auto: partitioning goes off once no trigger fired this long", minimum=0),
    )
    reconcile_interval_seconds: float = field(
        default=5.0,
        metadata=option(
            "how often the reconciler looks for stuck units, shards, jobs", minimum=0.05
        ),
    )
    dead_shard_seconds: float = field(
        default=60.0,
        metadata=option(
            "the reconciler deletes a SchedulerInstance silent for this long", minimum=1
        ),
    )


class DispatcherService(Service[DispatcherConfig]):
    component = "dispatcher"
    config_class = DispatcherConfig
    grpc_services = (api_pb2.DESCRIPTOR.services_by_name["Dispatcher"].full_name,)

    def add_servicers(self, server: grpc.aio.Server) -> None:
        cfg = self.config
        # Built here with everything that registers handlers on it (the servicer, the
        # controllers), and started in on_start: the listing feeds them all at once.
        # It keeps no bytes of a pod on a node: the pod index and the quota ledger keep a
        # record of each (controllers/podindex.py), read back for the handlers (``recall``).
        self.informer = Informer(
            self.store,
            INFORMER_KINDS,
            hold=keeps_bytes,
            held_elsewhere=lambda kind: self.pods.placed_names(kind),
            recall=lambda kind, name: self.pods.recall(kind, name),
            # A listed pod holding a claim goes straight to the feed's ledger, bytes and
            # version unread (``ViewFeed.take_listed``): most of a restart's pods.
            take_listed={"Pod": lambda pod: self.core.feed.take_listed(pod)},
        )
        self.core = UnitDispatcher(
            self.store,
            self.informer,
            DispatchSettings(
                shard_grace_seconds=cfg.shard_grace_seconds,
                backoff_initial_seconds=cfg.backoff_initial_seconds,
                backoff_max_seconds=cfg.backoff_max_seconds,
                infeasible_recheck_seconds=cfg.infeasible_recheck_seconds,
                max_batch_pods=cfg.max_batch_pods,
                queue_fairness=cfg.queue_fairness,
                reclaim_interval_seconds=cfg.reclaim_interval_seconds,
            ),
            BinderEvictor(self.store, f"dispatcher/{cfg.name}", self.dial, timeout_seconds=30.0),
            dial=self.dial,
        )
        # One creator of big jobs' pods, shared by Submit and the reconciler that resumes them.
        self.creator = PodCreator(self.store, cfg.creation_chunk_pods + 1)
        # One index of pods by node and job, for every controller and the API's job statuses.
        self.pods = PodIndex(
            self.informer, claims=self.core.queue, store=self.store, listed_from=self.core.feed
        )
        # One deleter of jobs with their pods (big ones in chunks), shared by Delete, the
        # finished-job collector and the reconciler that resumes a deletion left midway.
        self.deleter = JobDeleter(self.store, self._pods_of_job, cfg.creation_chunk_pods + 1)
        # Set by the job status controller's first tick; Get and List of Jobs wait for it.
        self.job_statuses_counted = asyncio.Event()
        self.api = servicer = DispatcherServicer(
            self.store,
            self.core,
            self.pods,
            limits=AdmissionLimits(
                max_replicas=cfg.max_replicas,
                admin_max_replicas=cfg.admin_max_replicas,
                max_pods_per_tenant=cfg.max_pods_per_tenant,
            ),
            max_pending_pods=cfg.max_pending_pods,
            creator=self.creator,
            deleter=self.deleter,
            job_statuses_counted=self.job_statuses_counted,
        )
        self.core.events = self.events = events.EventRecorder(self.store, cfg.name)
        self._build_controllers()
        api_pb2_grpc.add_DispatcherServicer_to_server(servicer, server)

    def _build_controllers(self) -> None:
        """Every controller and the node shuffler, before the informer starts: each registers
        its handlers now, so the listing hands every object to all of them once (registered
        after it, each was handed the whole cache again, every pod decoded once more per late
        handler: a fifth of a restart's CPU at 100,000 pods; bench/README.md)."""
        cfg = self.config
        every = cfg.controller_interval_seconds
        pods = self.pods
        self.lifecycle = NodeLifecycleController(
            self.store,
            self.informer,
            grace_seconds=cfg.node_grace_seconds,
            interval_seconds=every,
            pods=pods,
        )
        self.job_status = JobStatusController(
            self.store,
            self.informer,
            interval_seconds=every,
            pods=pods,
            events=self.events,
            counted=self.job_statuses_counted,
        )
        self.queue_status = QueueStatusController(
            self.store, self.informer, self.core.queue_statuses, interval_seconds=every
        )
        self.budget_status = BudgetStatusController(
            self.store, self.informer, interval_seconds=every, pods=pods
        )
        self.job_retry = JobRetryController(
            self.store, self.informer, interval_seconds=every, pods=pods
        )
        ttl = cfg.finished_job_ttl_seconds
        self.finished_jobs = FinishedJobCollector(
            self.store,
            self.informer,
            pods,
            deleter=self.deleter,
            default_ttl_seconds=None if ttl < 0 else ttl,
            interval_seconds=max(every, 1.0),
        )
        self.reservations = ReservationController(
            self.store, self.informer, self.events, interval_seconds=every
        )
        self.shuffler = NodeShuffler(
            self.store,
            self.informer,
            PartitionSettings(
                mode=cfg.partitioning,
                allocation_percent=cfg.partition_allocation_percent,
                throughput_pods_per_second=cfg.partition_throughput,
                conflict_percent=cfg.partition_conflict_percent,
                window_seconds=cfg.partition_window_seconds,
                off_after_seconds=cfg.partition_off_after_seconds,
                interval_seconds=every,
            ),
            shard_grace_seconds=cfg.shard_grace_seconds,
            liveness=self.core.liveness,
            bound_claims=self.core.queue,  # its ledger's claims: no pod followed twice
        )
        # Units go first to a shard whose partition has room for them (``choose_shard``).
        self.core.partition_room = self.shuffler.room.of
        self.reconciler = Reconciler(
            self.store,
            self.informer,
            self.core,
            self.job_status,
            interval_seconds=cfg.reconcile_interval_seconds,
            dead_shard_seconds=cfg.dead_shard_seconds,
            creator=self.creator,
            deleter=self.deleter,
        )

    async def on_start(self) -> None:
        self.informer.start()
        try:
            await self.informer.wait_synced(self.config.informer_sync_seconds)
        except TimeoutError as exc:
            raise RuntimeError("the store's listing did not arrive in time") from exc
        log.info("queues rebuilt", pending_units=len(self.core.units))
        # SERVING means dispatching: the dispatch core, its events and the node partitions
        # (which shard a unit goes to) start now. The controllers that keep statuses and
        # repair the store start one interval later (``FIRST_TICKS_AFTER_SECONDS`` at most),
        # so that their first ticks — a restart's every job's status counted (~0.8 s of CPU
        # at a million pods), every node's heartbeat read, every event listed — are not in
        # the way of the first health checks.
        # Dispatch reads none of what they write: the quota ledger, the room and the pending
        # units are complete once listed; the API's reads of a Job wait for the job status
        # controller's first tick (``job_statuses_counted``).
        self.spawn(self.core.run(), name="dispatch")
        self.spawn(self.events.run(), name="events")
        self.spawn(self.shuffler.run(), name="node-shuffler")
        cfg = self.config
        reaper = events.EventReaper(
            self.store,
            events.Retention(cfg.event_retention_seconds, cfg.max_events),
            interval_seconds=min(30.0, cfg.event_retention_seconds / 2),
        )
        later: tuple[tuple[str, Callable[[], Awaitable[None]]], ...] = (
            ("job-status", self.job_status.run),
            ("node-lifecycle", self.lifecycle.run),
            ("queue-status", self.queue_status.run),
            ("budget-status", self.budget_status.run),
            ("job-retry", self.job_retry.run),
            ("event-reaper", reaper.run),
            ("finished-jobs", self.finished_jobs.run),
            ("reservations", self.reservations.run),
            ("reconciler", self.reconciler.run),
        )
        after = min(cfg.controller_interval_seconds, FIRST_TICKS_AFTER_SECONDS)
        for name, run in later:
            self.spawn(_after(after, run), name=name)

    def _pods_of_job(self, job: str) -> Iterable[str]:
        return self.pods.by_job.get(job)

    def sample_metrics(self) -> None:
        queues = self.core.queue_statuses()
        # Every known queue, so that an emptied queue reads 0 rather than vanishing.
        names = set(self.informer.names("Queue")) | set(queues)
        idle = pb.QueueStatus()
        metrics.DISPATCHER_QUEUE_PENDING_PODS.publish(
            {(name,): queues.get(name, idle).pending_pods for name in names}
        )
        metrics.DISPATCHER_QUEUE_PENDING_UNITS.publish(
            {(name,): queues.get(name, idle).pending_units for name in names}
        )
        links = self.core.links.values()
        metrics.DISPATCHER_SHARD_CREDITS.publish({(link.name,): link.credits for link in links})
        metrics.DISPATCHER_SHARD_UNDECIDED_PODS.publish({(link.name,): link.load for link in links})

    async def on_stop(self) -> None:
        # Deletions under way stop between chunks; their jobs stay marked for the next
        # dispatcher's reconciler.
        await self.deleter.close()
        await self.creator.close()  # likewise creations: each job keeps its mark
        await self.core.close()
        await self.informer.stop()


async def _after(seconds: float, run: Callable[[], Awaitable[None]]) -> None:
    """``run()`` once ``seconds`` have passed."""
    await asyncio.sleep(seconds)
    await run()
