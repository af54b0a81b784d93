"""The rescheduler service: policies from config, their triggers, and the Rescheduler RPCs.

``Trigger`` runs one round of a named policy (or of each policy in turn) and returns its plan;
``dry_run`` simulates the round on a copy of the state and changes nothing stored.
``ListPolicies`` lists the policies with their triggers and last round. Periodic, cron and signal
triggers run rounds by themselves. A round's view of the cluster is the pods and jobs listed from
the store when it starts and an informer on nodes, budgets and reservations brought up to that
listing's revision (the informer keeps GPU nodes' pods only, for the GPU figures).

A round that is not a dry run is executed batch by batch (``executor.py``): a Movement per batch,
acknowledged by every live shard, then eviction through the Binder. ``Pause`` is the kill switch.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import grpc
import structlog
import yaml
from google.protobuf.message import Message

from placement.framework import Framework
from placement.gpu import GpuFigures
from placement.rules import hard_rules
from protos.godel.v1 import api_pb2, api_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services import events
from services import metrics as service_metrics
from services.peers.binder import BinderEvictor
from services.rescheduler.checks import new_check_registry
from services.rescheduler.config import PolicyConfig, PolicyConfigError, load_policies
from services.rescheduler.executor import ExecutionConfig, RoundExecutor
from services.rescheduler.framework import Algorithm, Check, ClusterView, Detector
from services.rescheduler.manager import PausedError, PolicyManager, UnknownPolicyError
from services.rescheduler.metrics import gpu_figures
from services.rescheduler.movements import Recycler
from services.rescheduler.plugins import new_plugin_registry
from services.rescheduler.round import Policy, RoundPlan
from services.rescheduler.triggers import TriggerScheduler
from services.rescheduler.view import PodInfoCache, build_view, fresh_loads
from services.runtime import Service, ServiceConfig
from services.runtime.config import ConfigError, option
from store.encoded import EncodedObjects
from store.informer import Handlers, Informer

log = structlog.get_logger(__name__)

# Jobs are not watched: a round reads them from the store (below). A watch would decode every
# job's creation (and status change) between rounds, one per pod when every pod is its own job.
KINDS = ("Node", "Pod", "DisruptionBudget", "Reservation")
DEFAULT_POLICIES = "default_policies.yaml"


@dataclass(frozen=True)
class ReschedulerConfig(ServiceConfig):
    """Rescheduler settings. Policies come from the `policies` list of the --config file (see
    services/rescheduler/README.md); without one, the built-in defaults apply."""

    policies: object = field(
        default=None,
        metadata=option("rescheduling policies (a list; --config file only)", file_only=True),
    )
    sync_timeout_seconds: float = field(
        default=30.0,
        metadata=option("how long a round waits for the view to reach the store", minimum=0.1),
    )
    ack_timeout_seconds: float = field(
        default=30.0,
        metadata=option("how long a batch waits for every live shard's acknowledgement", minimum=0),
    )
    budget_wait_seconds: float = field(
        default=60.0,
        metadata=option("how long a batch waits for disruption budgets to allow it", minimum=0),
    )
    landing_timeout_seconds: float = field(
        default=60.0,
        metadata=option("how long a batch waits for its replacements to run", minimum=0),
    )
    reserve_timeout_seconds: float = field(
        default=10.0,
        metadata=option(
            "how long a batch waits for the Binder to reserve its moves' room before evicting",
            minimum=0,
        ),
    )
    reservation_ttl_seconds: int = field(
        default=0,
        metadata=option(
            "the TTL of a batch's reservations (0: the reserve, ack and landing timeouts + 10 s)",
            minimum=0,
        ),
    )
    movement_ttl_seconds: float = field(
        default=600.0,
        metadata=option("how long a Movement stays live for the shards", minimum=1),
    )
    movement_retention_seconds: float = field(
        default=3600.0,
        metadata=option("how long a finished Movement is kept before it is deleted", minimum=0),
    )

    gpu_figures_seconds: float = field(
        default=15.0,
        metadata=option(
            "how often the cluster's GPU fragmentation metrics are recomputed (0: never)",
            minimum=0,
        ),
    )

    load_max_age_seconds: float = field(
        default=120.0,
        metadata=option(
            "a node's measured load older than this counts as none (the node is judged by its "
            "requests); agents refresh theirs every 30 s",
            minimum=1,
        ),
    )

    def __post_init__(self) -> None:
        try:
            self.policy_configs()
        except PolicyConfigError as exc:
            raise ConfigError(str(exc)) from exc

    def policy_configs(self) -> list[PolicyConfig]:
        """The configured policies, validated against the plugin registries."""
        plugins = new_plugin_registry()
        if self.policies is None:
            text = (resources.files("services.rescheduler") / DEFAULT_POLICIES).read_text()
        else:
            text = yaml.safe_dump({"policies": self.policies})
        return load_policies(text, plugins, plugins, new_check_registry())


def build_policy(config: PolicyConfig) -> Policy:
    plugins = new_plugin_registry()
    checks = new_check_registry()
    detector = plugins.get(config.detector.name).build(config.detector.args)
    algorithm = plugins.get(config.algorithm.name).build(config.algorithm.args)
    assert isinstance(detector, Detector) and isinstance(algorithm, Algorithm)
    built_checks: list[Check] = []
    for ref in config.checks:
        check = checks.get(ref.name).build(ref.args)
        assert isinstance(check, Check)
        built_checks.append(check)
    return Policy(
        name=config.name,
        detector=detector,
        algorithm=algorithm,
        checks=built_checks,
        scope_labels=dict(config.scope),
        failure_ratio_threshold=config.failure_ratio_threshold,
        detector_args=dict(config.detector.args),
    )


class ReschedulerService(Service[ReschedulerConfig]):
    component = "rescheduler"
    config_class = ReschedulerConfig
    grpc_services = (api_pb2.DESCRIPTOR.services_by_name["Rescheduler"].full_name,)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.configs = {c.name: c for c in self.config.policy_configs()}
        # The pods a round reads are listed from the store when it starts; the informer keeps
        # only those of GPU nodes, for the GPU figures between rounds (a million pods were a
        # third of a GiB here, held for rounds that may never run).
        self._gpu_nodes: set[str] = set()
        # A node change is in a read of the feed not applied yet: it may bring a GPU node, so
        # the pod changes after it in the same read are decoded (``_reads``).
        self._node_change_unapplied = False
        self.informer = Informer(self.store, list(KINDS), hold=self._keeps, reads=self._reads)
        self.informer.add_handlers(
            Handlers.of(
                pb.Node,
                on_add=lambda _, node: self._node_seen(node),
                on_update=lambda _, __, node: self._node_seen(node),
                on_delete=lambda _, node: self._node_gone(node),
            )
        )
        self.rules = hard_rules()
        self.pod_infos = PodInfoCache()
        self._figure_infos = PodInfoCache()
        self.recycler = Recycler(self.store, self.config.movement_retention_seconds)
        self.events = events.EventRecorder(self.store, self.config.name)
        self.executor = RoundExecutor(
            self.store,
            BinderEvictor(self.store, f"rescheduler/{self.config.name}", self.dial),
            lambda: self.manager.paused,
            ExecutionConfig(
                ack_timeout_seconds=self.config.ack_timeout_seconds,
                budget_wait_seconds=self.config.budget_wait_seconds,
                landing_timeout_seconds=self.config.landing_timeout_seconds,
                movement_ttl_seconds=self.config.movement_ttl_seconds,
                reserve_timeout_seconds=self.config.reserve_timeout_seconds,
                reservation_ttl_seconds=self.config.reservation_ttl_seconds,
            ),
            events=self.events,
        )
        self.manager = PolicyManager(
            [build_policy(c) for c in self.configs.values()],
            self._fresh_view,
            execute=self.executor.execute,
            prepare=self._prepare,
        )
        self.triggers = TriggerScheduler(list(self.configs.values()), self._fire)

    def add_servicers(self, server: grpc.aio.Server) -> None:
        api_pb2_grpc.add_ReschedulerServicer_to_server(ReschedulerServicer(self), server)

    async def on_start(self) -> None:
        self.informer.start()
        await self.informer.wait_synced(self.config.sync_timeout_seconds)
        # A previous rescheduler's rounds are over: none of its Movements should steer shards.
        await self.recycler.all_stale()
        self.spawn(
            self.recycler.run(min(60.0, self.config.movement_retention_seconds or 60.0)),
            name="recycler",
        )
        self.triggers.install_signal_handlers(asyncio.get_running_loop())
        self.spawn(self.triggers.run(), name="triggers")
        self.spawn(self.events.run(), name="events")
        if self.config.gpu_figures_seconds > 0:
            self.spawn(self._gpu_figures_loop(), name="gpu-figures")
        log.info("policies loaded", policies=self.manager.names())

    async def on_stop(self) -> None:
        self.triggers.remove_signal_handlers()
        await self.informer.stop()

    def _keeps(self, kind: str, obj: Message) -> bool:
        """What the informer keeps: every object but pods, and pods of GPU nodes while the GPU
        figures are kept (``refresh_gpu_figures``)."""
        if isinstance(obj, pb.Pod):
            return self.config.gpu_figures_seconds > 0 and obj.spec.node_name in self._gpu_nodes
        return True

    def _reads(self, kind: str, name: bytes) -> bool:
        """Which changes of the feed the informer decodes at all: every change but a pod's;
        a pod's while some node has GPUs (or a node change read with it may bring one) and the
        GPU figures are kept, or when the informer holds the pod (its update or deletion). A
        cluster without GPUs decodes none of its pods' changes here (five a pod, ~2/3 of the
        rescheduler's CPU under a stream of pods)."""
        if kind != "Pod":
            if kind == "Node":
                self._node_change_unapplied = True
            return True
        if self.config.gpu_figures_seconds > 0 and (self._gpu_nodes or self._node_change_unapplied):
            return True
        return self.informer.has("Pod", name.decode(errors="replace"))

    def _node_seen(self, node: pb.Node) -> None:
        # A node's GPUs are registered with it, before any pod is bound there; one that gains
        # GPUs later has its pods counted as they next change.
        self._node_change_unapplied = False
        if node.status.allocatable.gpus:
            self._gpu_nodes.add(node.metadata.name)
        else:
            self._gpu_nodes.discard(node.metadata.name)

    def _node_gone(self, node: pb.Node) -> None:
        self._node_change_unapplied = False
        self._gpu_nodes.discard(node.metadata.name)

    async def _fresh_view(self, scope_labels: Mapping[str, str]) -> ClusterView:
        """The cluster as of now: the pods listed from the store, the informer caught up to
        that listing's revision."""
        # Decoded one at a time as the view is built (all of them decoded at once would be
        # 2.6 GiB at a million pods); their bytes are let go once it is.
        listing = await self.store.list_stored(["Pod"])
        revision = listing.revision
        await self.informer.wait_for_revision(revision, self.config.sync_timeout_seconds)
        inf = self.informer
        nodes = inf.list(pb.Node)
        pods = (p for p in listing.objects("Pod") if isinstance(p, pb.Pod))
        jobs, _ = await self.store.list_all(pb.Job)  # at least as new as the pods above
        budgets = inf.list(pb.DisruptionBudget)
        loads = fresh_loads(
            await self.store.node_loads(),
            int(time.time() * 1000),
            int(self.config.load_max_age_seconds * 1000),
        )
        # The informer replaces objects on change and never mutates them, so the lists (and the
        # listing of the pods) can be read off the event loop.
        return await asyncio.to_thread(
            build_view,
            nodes,
            pods,
            jobs,
            budgets,
            self.rules,
            scope_labels=scope_labels,
            revision=revision,
            pod_infos=self.pod_infos,
            loads=loads,
            reservations=inf.list(pb.Reservation),
        )

    async def _gpu_figures_loop(self) -> None:
        while True:
            try:
                await self.refresh_gpu_figures()
            except Exception:
                # Stale gauges are better than a rescheduler stopped over its metrics.
                log.exception("GPU figures failed")
            await asyncio.sleep(self.config.gpu_figures_seconds)

    async def refresh_gpu_figures(self) -> GpuFigures:
        """The cluster's GPU figures (every node with GPUs, the reservations' holds counted)
        from the informer as it stands, published as the rescheduler's GPU gauges."""
        nodes = [n for n in self.informer.list(pb.Node) if n.status.allocatable.gpus]
        if nodes:
            cached = self.informer.objects(pb.Pod)
            copied = cached.copy() if isinstance(cached, EncodedObjects) else dict(cached)
            reservations = self.informer.list(pb.Reservation)
            # Its own PodInfo cache: a round converts pods in another thread with the other one.
            figures = await asyncio.to_thread(
                _gpu_figures, nodes, copied.values(), reservations, self.rules, self._figure_infos
            )
        else:
            # No GPU node: nothing to measure, and no reading of every pod every period (a
            # million of them at the paper's scale) to find that out.
            figures = GpuFigures(0.0, 0.0, 0, 0)
        service_metrics.RESCHEDULER_GPU_EXPECTED_FRAGMENTATION.set(figures.expected_fragmentation)
        service_metrics.RESCHEDULER_GPU_FRAGMENTATION.set(figures.fragmentation)
        service_metrics.RESCHEDULER_WHOLE_FREE_GPU_NODES.set(figures.whole_free_nodes)
        service_metrics.RESCHEDULER_FREE_GPU_MILLI.set(figures.free_milli)
        return figures

    async def _prepare(self, policy: Policy) -> None:
        """A policy's new executed round replaces its previous round's Movements."""
        await self.recycler.previous_of(policy.name)

    async def _fire(self, policy: str, trigger: str) -> None:
        if self.manager.paused:
            log.info("paused: trigger ignored", policy=policy, trigger=trigger)
            return
        try:
            await self.manager.run(policy, trigger=trigger, dry_run=False)
        except Exception:
            log.exception("round failed", policy=policy, trigger=trigger)

    def policy_info(self, name: str) -> api_pb2.PolicyInfo:
        config = self.configs[name]
        state = self.manager.state(name)
        info = api_pb2.PolicyInfo(
            name=name,
            detectors=[config.detector.name],
            algorithms=[config.algorithm.name],
            triggers=[*config.trigger.kinds(), "rpc"],
            checks=[c.name for c in config.checks],
            scope=dict(config.scope),
            schedule=describe_schedule(config),
            last_run_ms=state.last_run_ms,
            running=state.running,
        )
        if state.last is not None:
            info.last_round.CopyFrom(state.last.to_proto())
        return info


def _gpu_figures(
    nodes: list[pb.Node],
    pods: Iterable[pb.Pod],
    reservations: list[pb.Reservation],
    rules: Framework,
    infos: PodInfoCache,
) -> GpuFigures:
    view = build_view(nodes, pods, (), (), rules, pod_infos=infos, reservations=reservations)
    return gpu_figures(view)


def describe_schedule(config: PolicyConfig) -> str:
    parts = []
    trigger = config.trigger
    if trigger.period_seconds is not None:
        parts.append(f"every {_duration(trigger.period_seconds)}")
    if trigger.cron is not None:
        parts.append(f"cron {trigger.cron}")
    if trigger.signal is not None:
        parts.append(f"signal {signal.Signals(trigger.signal).name}")
    return ", ".join(parts) or "on request"


def _duration(seconds: float) -> str:
    whole = int(seconds)
    if whole != seconds or whole < 60:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if v)


class ReschedulerServicer(api_pb2_grpc.ReschedulerServicer):
    def __init__(self, service: ReschedulerService) -> None:
        self._service = service

    async def Trigger(
        self, request: api_pb2.TriggerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.TriggerResponse:
        manager = self._service.manager
        names = [request.policy] if request.policy else manager.names()
        plans: list[RoundPlan] = []
        try:
            for name in names:
                plans.append(await manager.run(name, trigger="rpc", dry_run=request.dry_run))
        except UnknownPolicyError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, exc.message)
        except PausedError as exc:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{exc} (godel reschedule --resume; a --dry-run still works)",
            )
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the rescheduler's view could not reach the store"
            )
        response = api_pb2.TriggerResponse(
            generation=plans[-1].generation if plans else 0,
            plans=[p.to_proto() for p in plans],
        )
        response.message = "; ".join(f"{p.policy}: {p.outcome} ({p.message})" for p in plans)
        if not plans:
            response.message = "no policies are configured"
        return response

    async def ListPolicies(
        self, request: api_pb2.ListPoliciesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.ListPoliciesResponse:
        return api_pb2.ListPoliciesResponse(
            policies=[self._service.policy_info(n) for n in self._service.manager.names()],
            paused=self._service.manager.paused,
        )

    async def Pause(
        self, request: api_pb2.PauseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.PauseResponse:
        manager = self._service.manager
        if manager.paused != request.paused:
            manager.paused = request.paused
            log.warning("rescheduling paused" if request.paused else "rescheduling resumed")
        return api_pb2.PauseResponse(paused=manager.paused)
