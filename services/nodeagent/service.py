"""The node agent: registers its nodes, heartbeats them, runs the pods bound to them, and serves
the logs of process-mode pods (``godel.v1.NodeAgent``). See README.md.
"""

from __future__ import annotations

import asyncio
import functools
import os
import pwd
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import grpc
import psutil
import structlog

from foundation import certnames, tls
from protos.godel.v1 import api_pb2, api_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services import metrics, tenancy
from services.nodeagent.gpus import machine_gpus, model_problem
from services.nodeagent.isolation import (
    DEFAULT_UID_RANGE,
    Cgroups,
    PodUids,
    UidClaims,
    resolve_uid_range,
    uid_lock_file,
)
from services.nodeagent.load import (
    DEFAULT_NETWORK_BANDWIDTH,
    LoadReporter,
    LoadSettings,
    MachineLoad,
)
from services.nodeagent.nodelist import ListedNode, load_node_list, node_list_part, parse_part
from services.nodeagent.nodes import (
    HOLLOW,
    PROCESS,
    GiB,
    MachineNuma,
    NodeSet,
    Shape,
    agent_nodes,
    dns_name,
    hollow_nodes,
    listed_nodes,
    machine_node_name,
    machine_numa,
    now_ms,
    parse_labels,
    parse_taints,
    process_node,
)
from services.nodeagent.runner import PodRunner, ProcessRun, RunAs, RunNames, resolve_run_as
from services.nodeagent.tidal import (
    ProcessUsage,
    TidalController,
    TidalSettings,
    Usage,
    UsageCurve,
    gives_way,
)
from services.peers.binder import BinderEvictor
from services.runtime import (
    ConfigError,
    Service,
    ServiceConfig,
    StartupError,
    cancel_and_wait,
    option,
)
from services.runtime.auth import caller
from store import StoreError
from store.client import POD_STARTED
from store.informer import Informer
from store.kinds import StoredObject

log = structlog.get_logger(__name__)

LOG_CHUNK_BYTES = 64 * 1024
LOG_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class NodeAgentConfig(ServiceConfig):
    """Node agent settings: the simulated (hollow) nodes and this machine as a process node."""

    hollow_nodes: int = field(
        default=100, metadata=option("simulated nodes served by this agent", minimum=0)
    )
    hollow_cpu_milli: int = field(
        default=4000, metadata=option("guaranteed milli-CPU of each hollow node", minimum=0)
    )
    hollow_memory_bytes: int = field(
        default=32 * GiB, metadata=option("guaranteed memory of each hollow node", minimum=0)
    )
    hollow_max_pods: int = field(
        default=110, metadata=option("pod slots of each hollow node", minimum=0)
    )
    hollow_gpus: int = field(default=0, metadata=option("GPUs of each hollow node", minimum=0))
    hollow_gpu_model: str = field(
        default="",
        metadata=option(
            "the model of each hollow node's GPU cards, e.g. V100M32 (with hollow_gpus)"
        ),
    )
    hollow_node_list: str = field(
        default="",
        metadata=option(
            "a CSV of hollow nodes, each its own shape (sn,cpu_milli,memory_mib,gpu,model, as the "
            "openb trace's node lists), served instead of hollow_nodes of one shape"
        ),
    )
    hollow_node_list_part: str = field(
        default="0/1",
        metadata=option(
            "which contiguous part of hollow_node_list this agent serves, INDEX/COUNT "
            "(godel up splits the list among its agents)"
        ),
    )
    hollow_sockets: int = field(
        default=2, metadata=option("CPU sockets of each hollow node", minimum=1)
    )
    hollow_numa_per_socket: int = field(
        default=1,
        metadata=option(
            "NUMA nodes per socket of each hollow node (cpu, memory and GPUs split evenly)",
            minimum=1,
        ),
    )
    hollow_reclaimable_percent: int = field(
        default=50,
        metadata=option(
            "share of a node's cpu and memory offered to best-effort pods (its reclaimable pool)",
            minimum=0,
            maximum=100,
        ),
    )
    hollow_labels: str = field(
        default="",
        metadata=option(
            "labels of every hollow node, e.g. 'zone=a,disk=ssd' (each also gets hostname=<name>"
            " and zone=zone-0..zone-3 unless zone is given)"
        ),
    )
    hollow_taints: str = field(
        default="",
        metadata=option("taints of every hollow node, e.g. 'gpu=true:NoSchedule,spot:NoExecute'"),
    )
    node_prefix: str = field(
        default="",
        metadata=option("hollow nodes are named <prefix>-<i> (default: the instance name)"),
    )
    process_node: bool = field(
        default=False,
        metadata=option(
            "also serve this machine as a node (named after its hostname) that really runs pods"
        ),
    )
    process_node_name: str = field(
        default="",
        metadata=option("the process node's name (default: this machine's hostname)"),
    )
    heartbeat_seconds: float = field(
        default=2.0, metadata=option("seconds between node heartbeats", minimum=0.05)
    )
    work_dir: str = field(
        default="",
        metadata=option("process-mode pod work dirs and logs (default: <home>/pods)"),
    )
    run_as: str = field(
        default="",
        metadata=option(
            "one user (name or uid) every process-mode pod runs as, never root (default: each "
            "pod a uid of its own from pod_uid_range when the agent runs as root, else the "
            "agent's own user)"
        ),
    )
    pod_uid_range: str = field(
        default="",
        metadata=option(
            "uids a root agent gives process-mode pods, one each while it runs, 'FIRST-LAST' "
            f"(default {DEFAULT_UID_RANGE}; no user of the machine may be in it)"
        ),
    )
    status_flush_ms: int = field(
        default=50,
        metadata=option("how long pod phase changes gather before one batched write", minimum=1),
    )
    status_batch_max: int = field(
        default=500,
        metadata=option("pod phase changes that trigger a write at once", minimum=1),
    )

    network_bandwidth_bytes_per_second: int = field(
        default=DEFAULT_NETWORK_BANDWIDTH,
        metadata=option(
            "each node's network bandwidth, bytes/s (default 10 Gbit/s; the process node reads "
            "its links' speed from /sys/class/net when they report one)",
            minimum=1,
        ),
    )
    hollow_network_percent_min: int = field(
        default=50,
        metadata=option(
            "a hollow node's network load as a percent of its CPU load: the least (each node "
            "gets a fixed percent within min..max, drawn from its name)",
            minimum=0,
        ),
    )
    hollow_network_percent_max: int = field(
        default=100,
        metadata=option("a hollow node's network load as a percent of its CPU load: the most"),
    )
    hollow_hot_nodes: int = field(
        default=0,
        metadata=option(
            "the first N hollow nodes are hot machines: their online pods use "
            "hollow_hot_percent of their requests, whatever the usage curve says",
            minimum=0,
        ),
    )
    hollow_hot_percent: int = field(
        default=100,
        metadata=option(
            "what online pods use on a hot hollow node, percent of their requests",
            minimum=0,
            maximum=1000,
        ),
    )

    tidal: bool = field(
        default=False,
        metadata=option(
            "reclaimable pools follow what guaranteed pods use (tidal best-effort capacity); "
            "best-effort pods over a shrunk pool are evicted"
        ),
    )
    tidal_usage_curve: str = field(
        default="",
        metadata=option(
            "hollow online pods' usage through the day as a percent of their requests, "
            "'hour=percent,...' linear between points (default: all of their requests)"
        ),
    )
    tidal_period_seconds: float = field(
        default=86_400.0,
        metadata=option("the length of the curve's day (shorter plays a day faster)", minimum=1),
    )
    tidal_interval_seconds: float = field(
        default=2.0, metadata=option("seconds between tidal pool updates", minimum=0.05)
    )
    tidal_reserve_percent: int = field(
        default=10,
        metadata=option(
            "share of a node kept free of best-effort pods for online bursts",
            minimum=0,
            maximum=100,
        ),
    )

    def __post_init__(self) -> None:
        try:
            resolve_run_as(self.run_as, os.geteuid())
        except ValueError as exc:
            raise ConfigError(f"run_as: {exc}") from None
        try:
            self.pod_uids()
        except ValueError as exc:
            raise ConfigError(f"pod_uid_range: {exc}") from None
        if self.tidal_usage_curve:
            try:
                UsageCurve.parse(self.tidal_usage_curve, self.tidal_period_seconds)
            except ValueError as exc:
                raise ConfigError(f"tidal_usage_curve: {exc}") from None
        if self.hollow_network_percent_max < self.hollow_network_percent_min:
            raise ConfigError(
                f"hollow_network_percent_max ({self.hollow_network_percent_max}) must be at "
                f"least hollow_network_percent_min ({self.hollow_network_percent_min})"
            )
        # Bad labels or taints are a configuration error (exit 2), not a failed start.
        for name, parse in (("hollow_labels", parse_labels), ("hollow_taints", parse_taints)):
            try:
                parse(getattr(self, name))
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}") from None
        self._check_gpus()

    def _check_gpus(self) -> None:
        """The hollow cards' model, and every row of the node list: a bad one is a configuration
        error naming it, before any node is registered."""
        if self.hollow_gpu_model:
            if (problem := model_problem(self.hollow_gpu_model)) is not None:
                raise ConfigError(f"hollow_gpu_model: {problem}")
            if not self.hollow_gpus:
                raise ConfigError(
                    "hollow_gpu_model: given to hollow nodes of 0 cards (hollow_gpus)"
                )
        try:
            parse_part(self.hollow_node_list_part)
        except ValueError as exc:
            raise ConfigError(f"hollow_node_list_part: {exc}") from None
        if self.hollow_node_list:
            try:
                self.node_list()
            except ValueError as exc:
                raise ConfigError(f"hollow_node_list: {exc}") from None

    def node_list(self) -> list[ListedNode] | None:
        """This agent's part of the node list; None when it serves hollow_nodes of one shape."""
        if not self.hollow_node_list:
            return None
        index, count = parse_part(self.hollow_node_list_part)
        return node_list_part(load_node_list(self.hollow_node_list), index, count)

    def pod_uids(self) -> range | None:
        """The uids process pods get one each of; None: they run as one user."""
        return resolve_uid_range(
            self.pod_uid_range,
            agent_uid=os.geteuid(),
            run_as=self.run_as,
            machine_users={entry.pw_uid: entry.pw_name for entry in pwd.getpwall()},
        )

    def shape(self) -> Shape:
        return Shape(
            milli_cpu=self.hollow_cpu_milli,
            memory_bytes=self.hollow_memory_bytes,
            max_pods=self.hollow_max_pods,
            gpus=self.hollow_gpus,
            gpu_model=self.hollow_gpu_model,
            reclaimable_percent=self.hollow_reclaimable_percent,
            sockets=self.hollow_sockets,
            numa_per_socket=self.hollow_numa_per_socket,
        )

    def resolved_work_dir(self) -> Path:
        if self.work_dir:
            return Path(self.work_dir).expanduser()
        if self.home:
            return Path(self.home) / "pods"
        return Path(tempfile.mkdtemp(prefix="godel-pods-"))


class NodeAgentService(Service[NodeAgentConfig]):
    component = "nodeagent"
    config_class = NodeAgentConfig
    grpc_services = (api_pb2.DESCRIPTOR.services_by_name["NodeAgent"].full_name,)

    nodes: NodeSet
    runner: PodRunner
    informer: Informer
    loads: LoadReporter

    @classmethod
    def credentials_stem(cls, config: NodeAgentConfig) -> str:
        # Its own, naming its nodes: another agent's certificate must not act on them.
        return tls.agent_stem(config.name)

    def add_servicers(self, server: grpc.aio.Server) -> None:
        api_pb2_grpc.add_NodeAgentServicer_to_server(_NodeAgentServicer(self), server)

    @functools.cached_property
    def machine_numa(self) -> list[MachineNuma]:
        """This machine's NUMA nodes and their CPUs (the process node's topology, and the CPUs
        a process pod holding NUMA nodes is pinned to)."""
        return machine_numa()

    def desired_nodes(self) -> list[pb.Node]:
        cfg = self.config
        now = now_ms()
        prefix, machine = self._node_names()
        labels, taints = parse_labels(cfg.hollow_labels), parse_taints(cfg.hollow_taints)
        listed = cfg.node_list()
        if listed is not None:
            nodes = listed_nodes(
                listed, agent=cfg.name, shape=cfg.shape(), labels=labels, taints=taints, now=now
            )
        else:
            nodes = hollow_nodes(
                cfg.hollow_nodes,
                prefix=dns_name(prefix),
                agent=cfg.name,
                shape=cfg.shape(),
                labels=labels,
                taints=taints,
                now=now,
            )
        if machine:
            nodes.append(
                process_node(
                    machine,
                    agent=cfg.name,
                    cpus=psutil.cpu_count() or 1,
                    memory_bytes=psutil.virtual_memory().total,
                    max_pods=cfg.hollow_max_pods,
                    reclaimable_percent=cfg.hollow_reclaimable_percent,
                    labels={},
                    taints=(),
                    now=now,
                    numa=self.machine_numa,
                    gpus=machine_gpus(),
                )
            )
        # Where `godel logs` reaches us: the advertised address, so it works with no local state.
        for node in nodes:
            node.spec.agent_address = self.address
        return nodes

    async def on_start(self) -> None:
        cfg = self.config
        work_dir = cfg.resolved_work_dir()
        work_dir.mkdir(parents=True, exist_ok=True)
        try:
            # No pod may list it, nor read another pod's log in it (a pod's own dir is entered by
            # its child while still root).
            work_dir.chmod(0o700)
        except PermissionError:
            log.warning("the pods' work dir is not ours: it stays as it is", work_dir=str(work_dir))
        self.nodes = NodeSet(self.store, self.desired_nodes())
        if not self.nodes.desired:
            log.warning("this agent serves no nodes (hollow_nodes=0, process_node=false)")
        self._check_certificate_names_the_nodes()
        await self.nodes.register()
        run_as, pod_uids, cgroups = self._pod_isolation(work_dir)
        self.runner = PodRunner(
            self.store,
            self.nodes.mode,
            work_dir,
            flush_interval=cfg.status_flush_ms / 1000,
            flush_max=cfg.status_batch_max,
            run_as=run_as,
            pod_uids=pod_uids,
            cgroups=cgroups,
            numa_cpus={z.id: z.cpus for z in self.machine_numa} if cfg.process_node else {},
        )
        self.loads = self._load_reporter()
        self.informer = self._informer()
        informer = self.informer
        self.runner.informed = lambda name: informer.encoded("Pod", name)
        self.informer.add_handlers(self.runner.handlers())
        self.loads.usage.name_of = self.runner.name_of  # its handlers run after the runner's
        self.informer.add_handlers(self.loads.usage.handlers())
        tide = self.tidal() if cfg.tidal else None
        self.informer.start()
        await self.informer.wait_synced()
        self._heartbeat_task = self.spawn(self._heartbeat_loop(), name="heartbeat")
        self._tidal_task = self.spawn(tide.run(), name="tidal") if tide is not None else None
        self._flusher_task = self.spawn(self.runner.run_flusher(), name="pod-status-flusher")
        log.info(
            "node agent started",
            nodes=len(self.nodes.desired),
            work_dir=str(work_dir),
            heartbeat_seconds=cfg.heartbeat_seconds,
        )

    def _informer(self) -> Informer:
        """The pods bound to this agent's nodes (at 200,000 pods, caching every pod cost each
        agent over 300 MiB). Of those it keeps the bytes of the process node's pods only (what
        a process is started from, measured by and its logs served for): a hollow pod is its
        run's record and its usage record (the informer asks the runner and the load model
        which such pods exist, to deliver their changes and deletions), and its status is
        written over the pod as read from the store (the tide reads its records too, and the
        best-effort pods it chooses among from the store)."""
        ours = self.nodes.names()
        modes = self.nodes.mode

        def selector(_kind: str, pod: StoredObject) -> bool:
            return type(pod) is pb.Pod and pod.spec.node_name in ours

        def keeps(_kind: str, pod: StoredObject) -> bool:
            return type(pod) is pb.Pod and modes.get(pod.spec.node_name) == PROCESS

        runner, usage = self.runner, self.loads.usage
        return Informer(
            self.store,
            ["Pod"],
            selector=selector,
            hold=keeps,
            held_elsewhere=lambda _kind: RunNames(runner.known(), usage.names()),
            hinted=_reads_hinted,
        )

    def _check_certificate_names_the_nodes(self) -> None:
        """Refuse to start on nodes the certificate does not name: the Binder would refuse
        this agent's evictions there (``services/binder/evictrules.py``), so its tidal pressure
        could never be relieved. Said at start, with the command that issues the right one."""
        if self.credentials is None:
            return  # insecure mode: no identities
        identity = certnames.identity_of(self.credentials.certificate)
        name = self.config.name
        foreign = [n for n in self.nodes.names() if not identity.serves(n)]
        if identity.agent == name and not foreign:
            return
        listed = self.config.node_list()
        served = agent_nodes(*self._node_names(), [n.name for n in listed] if listed else None)
        nodes = " ".join(f"--node '{p}'" for p in served)
        raise StartupError(
            f"{tls.agent_stem(name)}.crt names agent {identity.agent!r} serving "
            f"{', '.join(identity.nodes) or 'no nodes'}; this is agent {name!r}"
            + (f", serving {', '.join(sorted(foreign)[:3])}" if foreign else "")
            + (" ..." if len(foreign) > 3 else "")
            + f": issue its certificate with `godel certs issue {name} --role nodeagent "
            f"{nodes} --force`"
        )

    def _load_reporter(self) -> LoadReporter:
        """Nodes' measured load (load.py): the process node's from the OS, hollow nodes' from
        their pods' usage on the usage curve."""
        cfg = self.config
        curve = (
            UsageCurve.parse(cfg.tidal_usage_curve, cfg.tidal_period_seconds)
            if cfg.tidal_usage_curve
            else None
        )
        measured = ProcessUsage(self.runner.pid_of)

        def process_pods(node: str, percent: float) -> Usage:
            return measured(
                [
                    p
                    for p in self.informer.each(pb.Pod)
                    if p.spec.node_name == node and gives_way(p)
                ],
                percent,
            )

        # The first hollow nodes in the agent's order (<prefix>-0, -1, ..., or the node list's).
        hollow = [name for name, node in self.nodes.desired.items() if node.spec.mode != PROCESS]
        hot = hollow[: cfg.hollow_hot_nodes]
        return LoadReporter(
            self.store,
            self.nodes.desired,
            curve,
            LoadSettings(
                network_bandwidth=cfg.network_bandwidth_bytes_per_second,
                hollow_network_percent_min=cfg.hollow_network_percent_min,
                hollow_network_percent_max=cfg.hollow_network_percent_max,
                hot_nodes=frozenset(hot),
                hot_percent=cfg.hollow_hot_percent,
            ),
            lambda: MachineLoad(cfg.network_bandwidth_bytes_per_second),
            process_pods,
        )

    def _node_names(self) -> tuple[str, str]:
        """The hollow nodes' prefix and the process node's name ("" when none)."""
        cfg = self.config
        process = machine_node_name(cfg.process_node_name) if cfg.process_node else ""
        return cfg.node_prefix or cfg.name, process

    def _pod_isolation(self, work_dir: Path) -> tuple[RunAs | None, PodUids | None, Cgroups | None]:
        """Who process pods run as (one user, or a uid each) and their cgroups; what does not
        hold is logged once."""
        cfg = self.config
        run_as = resolve_run_as(cfg.run_as, os.geteuid())
        uids = cfg.pod_uids()
        if not cfg.process_node:
            return run_as, None, None
        pod_uids = None
        if uids is not None:
            pod_uids = PodUids(uids, work_dir, UidClaims(uid_lock_file()))
            log.info("process pods run as a uid of their own", uids=f"{uids.start}-{uids[-1]}")
        elif run_as is not None:
            log.warning(
                "process pods all run as one user: they are not isolated from each other",
                user=run_as.name,
            )
        else:
            log.warning(
                "process pods run as the agent's own user: they are not isolated from each "
                "other nor from the agent (start the agent as root for a uid per pod)",
                uid=os.geteuid(),
            )
        return run_as, pod_uids, Cgroups.detect()

    def sample_metrics(self) -> None:
        if not hasattr(self, "runner"):
            return  # still starting
        running = Counter(run.mode for run in self.runner.runs.values() if not run.finished)
        metrics.NODEAGENT_PODS_RUNNING.publish(
            {(mode,): running[mode] for mode in (HOLLOW, PROCESS)}
        )
        metrics.NODEAGENT_NODES.set(len(self.nodes.desired))
        metrics.NODEAGENT_STATUS_WRITES_PENDING.set(len(self.runner.pending))
        if not hasattr(self, "loads"):
            return
        cpu_total, cpu_max, net_total, net_max = self.loads.totals()
        metrics.NODEAGENT_LOAD_MILLI_CPU.publish({("total",): cpu_total, ("max",): cpu_max})
        metrics.NODEAGENT_LOAD_NETWORK.publish({("total",): net_total, ("max",): net_max})

    async def on_stop(self) -> None:
        # Heartbeats just stop: nodes are not marked NotReady, so a quick restart fails no pod.
        tasks = (
            getattr(self, "_heartbeat_task", None),
            getattr(self, "_flusher_task", None),
            getattr(self, "_tidal_task", None),
        )
        await cancel_and_wait([t for t in tasks if t is not None])
        if hasattr(self, "informer"):
            await self.informer.stop()
        if hasattr(self, "runner"):
            await self.runner.stop()
            if self.runner.pod_uids is not None:
                self.runner.pod_uids.close()  # its pods are gone: their uids with them

    def tidal(self) -> TidalController:
        """The tidal loop over this agent's nodes: hollow nodes' online usage from the curve,
        the process node's measured. Its handlers are registered on the informer here: call it
        before the informer starts (it delivers the pods it keeps no bytes of once)."""
        cfg = self.config
        curve = (
            UsageCurve.parse(cfg.tidal_usage_curve, cfg.tidal_period_seconds)
            if cfg.tidal_usage_curve
            else None
        )
        measured = ProcessUsage(self.runner.pid_of)

        def usage(_node: str, guaranteed: list[pb.Pod], percent: float) -> Usage:
            return measured(guaranteed, percent)  # a process node's (hollow: the records')

        controller = TidalController(
            self.store,
            self.nodes.desired,
            lambda: self.informer.each(pb.Pod),  # the process node's pods: their bytes kept
            usage,
            curve,
            BinderEvictor(self.store, f"nodeagent/{cfg.name}", self.dial),
            TidalSettings(
                interval_seconds=cfg.tidal_interval_seconds,
                reserve_percent=cfg.tidal_reserve_percent,
            ),
        )
        controller.name_of = self.runner.name_of  # its handlers run after the runner's
        self.informer.add_handlers(controller.handlers())  # what its pods hold per node
        return controller

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.config.heartbeat_seconds
        next_tick = loop.time() + interval
        while True:
            await asyncio.sleep(max(0.0, next_tick - loop.time()))
            next_tick = max(next_tick + interval, loop.time())
            try:
                await self.nodes.heartbeat()
            except StoreError as exc:
                log.warning("heartbeat failed", error=str(exc))
                continue
            try:
                await self.loads.report()
            except (StoreError, OSError, ValueError) as exc:
                log.warning("load report failed", error=str(exc))


class _NodeAgentServicer(api_pb2_grpc.NodeAgentServicer):
    def __init__(self, agent: NodeAgentService) -> None:
        self._agent = agent

    async def Logs(
        self, request: api_pb2.LogsRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[api_pb2.LogChunk]:
        if request.tail_lines < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "tail_lines: must be >= 0")
        runner = getattr(self._agent, "runner", None)
        run = runner.runs.get(request.pod) if runner is not None else None
        if not isinstance(run, ProcessRun) or run.log_path is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"pod {request.pod!r} is not run by node agent {self._agent.config.name!r} "
                "(only process-mode pods on this agent's nodes have logs)",
            )
            return
        # A tenant reads the logs of its own pods only (the rule the Dispatcher applies).
        if (why := tenancy.read_refusal(caller(), "Pod", run.pod)) is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
        path = run.log_path
        # The child may not have opened its log yet.
        while not path.exists():
            if run.exited or not request.follow:
                return
            await asyncio.sleep(LOG_POLL_SECONDS)
        with path.open("rb") as f:
            if request.tail_lines:
                f.seek(_tail_offset(f, request.tail_lines))
            while True:
                chunk = f.read(LOG_CHUNK_BYTES)
                if chunk:
                    yield api_pb2.LogChunk(data=chunk)
                    continue
                if not request.follow or run.exited:
                    # One last read: output written just before the exit was noticed.
                    while chunk := f.read(LOG_CHUNK_BYTES):
                        yield api_pb2.LogChunk(data=chunk)
                    return
                await asyncio.sleep(LOG_POLL_SECONDS)


def _tail_offset(f: BinaryIO, lines: int) -> int:
    """The offset where the last ``lines`` lines of the file start (a trailing newline does not
    start an empty line)."""
    end = f.seek(0, os.SEEK_END)
    pos, found = end, 0
    while pos > 0:
        step = min(LOG_CHUNK_BYTES, pos)
        pos -= step
        f.seek(pos)
        block = f.read(step)
        for i in range(len(block) - 1, -1, -1):
            if block[i] == 0x0A and pos + i != end - 1:
                found += 1
                if found == lines:
                    return pos + i + 1
    return 0


def _reads_hinted(kind: str, name: str, hint: bytes) -> bool:
    """Whether the agent's informer reads a change its writer hinted (``Informer(hinted=)``),
    of a pod whose bytes it does not keep: not a start (``POD_STARTED``: phase and start time
    alone), which changes nothing its selector (the pod's node; the agent's nodes are fixed),
    its runs, the load model or the tide read — its own write's echo for a hollow pod of its
    nodes, another agent's write for any other pod. A process pod's start is read (the informer
    keeps its bytes)."""
    return hint[:1] != POD_STARTED
