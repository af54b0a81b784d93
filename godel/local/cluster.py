"""A local cluster: the store server and every service as separate OS processes on loopback.

`up` starts them detached (their own sessions, so they outlive the CLI and a Ctrl-C in its
terminal), waits until each reports SERVING and records them in ``cluster.json``; `down` stops
them; `status` checks that each is alive and healthy. The CLI is only a thin shell over these.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import psutil
import structlog

from foundation import pki, privatefiles, tls
from foundation.allocator import AllocatorError, jemalloc_env
from foundation.netutil import free_ports
from foundation.retry import Backoff, Retry
from godel.local.home import SENTINEL, STORE, ClusterState, ComponentRecord, GodelHome, now_iso
from protos.godel.v1 import objects_pb2 as pb
from services.nodeagent.gpus import model_problem
from services.nodeagent.nodelist import ListedNode, load_node_list, node_list_part
from services.nodeagent.nodes import agent_nodes, machine_node_name
from services.peers.binder import LEASE as BINDER_LEASE
from services.runtime.healthcheck import SERVING, TIMEOUT, UNREACHABLE, probe
from store import Store, StoreError, StoreUnavailableError
from store.server import (
    LOG_FILE,
    ReplicatedStore,
    StoreServer,
    StoreServerError,
    store_url_from_env,
)

log = structlog.get_logger(__name__)

HOST = "127.0.0.1"
_LOG_TAIL_LINES = 30
_POLL = Backoff(0.1)  # waiting for components to serve: a constant poll within the timeout
_STORE_STOP_SECONDS = 10.0
# Spare scheduler processes' names: standbys for the shards' names, not shards of their own.
SPARE_PREFIX = "scheduler-spare-"


class ClusterError(Exception):
    """The local cluster could not be started, found or stopped; the message says why."""


@dataclass(frozen=True)
class ClusterSpec:
    """What `godel up` starts."""

    schedulers: int = 2
    standby_shards: int = 0
    """Spare scheduler processes (``scheduler-spare-<i>``), each a warm standby for every
    shard's name (the scheduler's ``--standby-for``)."""
    binders: int = 2
    nodeagents: int = 1
    ready_timeout: float = 30.0
    """Seconds for every service to report SERVING."""
    grace_seconds: float = 5.0
    """Passed to each service: how long in-flight RPCs may run after SIGTERM."""
    fsync: Literal["always", "everysec", "no"] = "always"
    hollow_nodes: int = 100
    """Simulated nodes, split across the node agents."""
    hollow_gpus: int = 0
    """GPU cards of each simulated node, of model ``hollow_gpu_model``."""
    hollow_gpu_model: str = ""
    hollow_node_list: str = ""
    """A CSV of simulated nodes each of its own shape (``services/nodeagent/nodelist.py``),
    served instead of ``hollow_nodes``, split across the node agents in contiguous parts."""
    process_node: bool = True
    """Whether the first node agent also serves this machine as a process-mode node."""
    insecure: bool = False
    """Serve plaintext gRPC with no authentication (`godel up --insecure`); the default issues
    a cluster CA and certificates into ``$GODEL_HOME/tls`` and every service serves mutual TLS."""
    run_as: str = ""
    """One user every process-mode pod runs as (the node agents' --run-as; default: each pod a
    uid of its own when the agents run as root)."""
    dashboard: bool = True
    """Whether to start the web dashboard (`godel status` shows its URL)."""
    store_replicas: int = 0
    """Replicas of the store server; with any, three Sentinels watch the primary, services find
    it through them, and a write is acknowledged only once a replica has it."""
    service_args: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Extra command-line arguments per service kind, e.g. (("scheduler", ("--x", "1")),)."""

    def args_for(self, name: str, kind: str) -> list[str]:
        args: list[str] = []
        if kind == "scheduler" and name.startswith(SPARE_PREFIX):
            shards = ",".join(f"scheduler-{i}" for i in range(self.schedulers))
            args += ["--standby-for", shards]
        if kind == "nodeagent":
            index = int(name.rsplit("-", 1)[1])
            if self.hollow_node_list:
                args += ["--hollow-node-list", str(Path(self.hollow_node_list).resolve())]
                args += ["--hollow-node-list-part", f"{index}/{self.nodeagents}"]
            else:
                share = self.hollow_nodes // self.nodeagents + (
                    1 if index < self.hollow_nodes % self.nodeagents else 0
                )
                args += ["--hollow-nodes", str(share)]
            if self.hollow_gpus:
                args += ["--hollow-gpus", str(self.hollow_gpus)]
            if self.hollow_gpu_model:
                args += ["--hollow-gpu-model", self.hollow_gpu_model]
            args += ["--process-node", "true" if self.process_node and index == 0 else "false"]
            if self.run_as:
                args += ["--run-as", self.run_as]
        for k, extra in self.service_args:
            if k == kind:
                args += extra
        return args

    def agents(self) -> dict[str, list[str]]:
        """Each node agent's name and the nodes its certificate names: its hollow nodes (named
        after it, or its part of the node list by name) and, for the first, this machine as a
        process node. A node list that does not load is a ClusterError naming its bad row."""
        names = [name for name, kind in self.services() if kind == "nodeagent"]
        listed = self.node_list()
        return {
            name: agent_nodes(
                name,
                machine_node_name() if self.process_node and i == 0 else "",
                None if listed is None else [n.name for n in node_list_part(listed, i, len(names))],
            )
            for i, name in enumerate(names)
        }

    def check_nodes(self) -> None:
        """The simulated nodes' GPU options and node list hold together (ClusterError naming
        the option, or the list's bad row): checked before anything starts."""
        if self.hollow_gpu_model:
            if (problem := model_problem(self.hollow_gpu_model)) is not None:
                raise ClusterError(f"--hollow-gpu-model: {problem}")
            if not self.hollow_gpus:
                raise ClusterError(
                    "--hollow-gpu-model: give --hollow-gpus too (cards of that model)"
                )
        if self.hollow_node_list and (self.hollow_gpus or self.hollow_gpu_model):
            raise ClusterError(
                "--hollow-node-list gives each node its cards and model: no --hollow-gpus or "
                "--hollow-gpu-model with it"
            )
        self.node_list()

    def node_list(self) -> list[ListedNode] | None:
        """Every node of ``hollow_node_list`` (None without one); ClusterError names a bad row."""
        if not self.hollow_node_list:
            return None
        try:
            return load_node_list(self.hollow_node_list)
        except ValueError as exc:
            raise ClusterError(f"--hollow-node-list: {exc}") from None

    @property
    def https_on_loopback(self) -> bool:
        """Whether metrics and the dashboard require a client certificate on loopback too: when
        process-mode pods run on this machine, loopback is no boundary (any pod reaches it)."""
        return self.process_node and not self.insecure

    def services(self) -> list[tuple[str, str]]:
        """(name, kind) of every service process, in start order."""
        return [
            ("dispatcher", "dispatcher"),
            *((f"scheduler-{i}", "scheduler") for i in range(self.schedulers)),
            *((f"{SPARE_PREFIX}{i}", "scheduler") for i in range(self.standby_shards)),
            *((f"binder-{i}", "binder") for i in range(self.binders)),
            ("rescheduler", "rescheduler"),
            *((f"nodeagent-{i}", "nodeagent") for i in range(self.nodeagents)),
            *((("dashboard", "dashboard"),) if self.dashboard else ()),
        ]


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    kind: str
    pid: int | None
    address: str
    metrics_address: str
    metrics_url: str
    """Its Prometheus endpoint (https:// when it requires a client certificate); empty if none."""
    web_url: str
    alive: bool
    health: str
    """SERVING, NOT_SERVING, UNREACHABLE, TIMEOUT, ..."""
    started: str

    @property
    def healthy(self) -> bool:
        return self.alive and self.health == SERVING


def up(home: GodelHome, spec: ClusterSpec) -> ClusterState:
    """Start the store (unless $GODEL_REDIS_URL names one) and every service, and return once all
    report SERVING. On any failure everything started is stopped again and ClusterError says which
    component failed, with the tail of its log."""
    # Everything the cluster writes under its home — state with the store's secret, logs, store
    # data, pod work dirs — is private to its owner: files 0600, directories 0700 (the lock
    # sets the umask every process started here inherits; GodelHome).
    spec.check_nodes()
    with home.lock():
        home.make_private()
        home.mark()
        _refuse_running_cluster(home)
        privatefiles.make_dir(home.logs_dir)
        state = ClusterState(
            store_url="",
            started=now_iso(),
            grace_seconds=spec.grace_seconds,
            insecure=spec.insecure,
            https_on_loopback=spec.https_on_loopback,
        )
        started: list[subprocess.Popen[bytes]] = []
        if not spec.insecure:
            # Kept across `down`/`up`: clients and tenants holding certificates stay valid.
            # Each node agent's own is issued when missing (a home from before they had their
            # own) or naming other nodes (another hostname, another process node).
            pki.init_cluster(home.tls_dir, agents=spec.agents())
        try:
            state.store_url = _start_store(home, spec, state)
            services = list(spec.services())
            ports = iter(free_ports(len(services) * 2 + 1, HOST))
            for name, kind in services:
                started.append(_start_service(home, spec, state, name, kind, ports))
            _wait_serving(home, state, started, spec.ready_timeout)
        except BaseException:
            _stop(state)
            home.clear()
            raise
        log.info("cluster up", home=str(home), components=len(state.components))
        return state


def down(home: GodelHome, timeout: float | None = None) -> list[tuple[str, str]]:
    """Stop every component (services first, then the store): SIGTERM, then SIGKILL whatever is
    still running after ``timeout`` (default: the services' grace plus margin). Returns (name,
    outcome) per component; empty when no cluster is recorded. Safe to run twice."""
    with home.lock():
        state = home.load()
        if state is None:
            return []
        outcomes = _stop(state, timeout)
        home.clear()
        return outcomes


def status(home: GodelHome, timeout: float = 1.0) -> list[ComponentStatus]:
    """Liveness (the recorded process still runs) and health (gRPC health check, or PING for the
    store) of every component, probed in parallel with ``timeout`` each."""
    state = home.load()
    if state is None:
        raise ClusterError(f"no cluster in {home}: start one with `godel up`")
    credentials = probe_credentials(home, state)
    scheme = http_scheme(state)
    with ThreadPoolExecutor(max_workers=len(state.components)) as pool:
        return list(
            pool.map(lambda c: _component_status(c, timeout, credentials, scheme), state.components)
        )


def binder_lease(home: GodelHome, timeout: float = 2.0) -> pb.Lease | None:
    """The Binder lease as the store has it now (``holder`` empty when nobody leads), or None
    when the store cannot say within ``timeout``."""
    state = home.load()
    if state is None:
        raise ClusterError(f"no cluster in {home}: start one with `godel up`")

    async def read() -> pb.Lease | None:
        store = await Store.connect(state.store_url)
        try:
            return await store.get_lease(BINDER_LEASE)
        finally:
            await store.close()

    try:
        return asyncio.run(asyncio.wait_for(read(), timeout))
    except (TimeoutError, StoreError):
        return None


SCALABLE = ("scheduler", "binder")


def scale(home: GodelHome, kind: str, replicas: int, ready_timeout: float = 30.0) -> list[str]:
    """Run exactly ``replicas`` processes of ``kind`` (scheduler shards or binders): start the
    missing ones and wait until they serve, or stop the newest ones gracefully (a stopped shard's
    undecided units go back to the dispatcher). Returns what was done, one line per process."""
    if kind not in SCALABLE:
        raise ClusterError(f"cannot scale {kind!r}: only {', '.join(SCALABLE)} scale")
    if replicas < 1:
        raise ClusterError(f"{kind} needs at least 1 replica, not {replicas}")
    with home.lock():
        state = home.load()
        if state is None:
            raise ClusterError(f"no cluster in {home}: start one with `godel up`")
        current = [
            c
            for c in state.components
            if c.kind == kind and not c.name.startswith(SPARE_PREFIX) and c.process() is not None
        ]
        changes: list[str] = []
        if len(current) > replicas:
            retiring = sorted(current, key=lambda c: c.started)[replicas:]
            for name, outcome in _terminate(retiring, state.grace_seconds + 5.0):
                changes.append(f"{name} {outcome}")
            gone = {c.name for c in retiring}
            state.components = [c for c in state.components if c.name not in gone]
            home.save(state)
        elif len(current) < replicas:
            spec = ClusterSpec(grace_seconds=state.grace_seconds, insecure=state.insecure)
            taken = {c.name for c in state.components}
            names = (f"{kind}-{i}" for i in range(10_000) if f"{kind}-{i}" not in taken)
            ports = iter(free_ports((replicas - len(current)) * 2, HOST))
            procs = [
                _start_service(home, spec, state, next(names), kind, ports)
                for _ in range(replicas - len(current))
            ]
            started = state.components[-len(procs) :]
            _wait_serving_records(started, procs, ready_timeout, probe_credentials(home, state))
            changes += [f"{c.name} started at {c.address}" for c in started]
        return changes


def _refuse_running_cluster(home: GodelHome) -> None:
    state = home.load()
    if state is None:
        return
    alive = [c.name for c in state.components if c.process() is not None]
    if alive:
        raise ClusterError(
            f"a cluster is already running in {home} ({', '.join(alive)}); "
            "stop it with `godel down` or use another --home"
        )
    log.info("removing the record of a cluster that is no longer running", home=str(home))
    home.clear()


def _start_store(home: GodelHome, spec: ClusterSpec, state: ClusterState) -> str:
    external = store_url_from_env()
    if external:
        state.components.append(
            ComponentRecord(
                name=STORE,
                kind=STORE,
                address=external,
                pid=None,
                create_time=None,
                command=[],
                log="",
                started=now_iso(),
            )
        )
        return external
    log.info("starting store server", data_dir=str(home.store_dir), replicas=spec.store_replicas)
    # A fresh secret per cluster: the store refuses anyone without it, and the services get it
    # in their environment (never in argv, which every local user can read).
    password = secrets.token_urlsafe(24)
    try:
        if spec.store_replicas:
            replicated = ReplicatedStore.start(
                home.path, password=password, replicas=spec.store_replicas, fsync=spec.fsync,
                detach=True,
            )  # fmt: skip
            servers, sentinels, url = replicated.servers, replicated.sentinels, replicated.url
        else:
            servers = [
                StoreServer.start(home.store_dir, fsync=spec.fsync, detach=True, password=password)
            ]
            sentinels, url = [], servers[0].url
    except StoreServerError as exc:
        raise ClusterError(f"store: {exc}") from exc
    # Each recorded with the command that runs it again (as an operator restarts a dead one).
    for i, server in enumerate(servers):
        _record_store_process(
            state, STORE if i == 0 else f"{STORE}-replica-{i - 1}", STORE, server.url,
            server.pid, server.argv, server.data_dir,
        )  # fmt: skip
    for i, sentinel in enumerate(sentinels):
        address = f"{HOST}:{sentinel.port}"
        _record_store_process(
            state, f"{SENTINEL}-{i}", SENTINEL, address, sentinel.pid, sentinel.argv,
            sentinel.data_dir,
        )  # fmt: skip
    home.save(state)
    return url


def _record_store_process(
    state: ClusterState,
    name: str,
    kind: str,
    address: str,
    pid: int | None,
    command: list[str],
    data_dir: Path,
) -> None:
    assert pid is not None
    state.components.append(
        ComponentRecord(
            name=name,
            kind=kind,
            address=address,
            pid=pid,
            create_time=psutil.Process(pid).create_time(),
            command=command,
            log=str(data_dir / LOG_FILE),
            started=now_iso(),
        )
    )


def _service_env(state: ClusterState) -> dict[str, str]:
    """A service's environment: the store URL travels here, not in argv (`ps` shows argv to
    every user of the machine, and the URL may carry a password); jemalloc is preloaded when
    the system has it (``foundation.allocator``)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GODEL_STORE_URL": state.store_url}
    try:
        return jemalloc_env(env)
    except AllocatorError as exc:
        raise ClusterError(str(exc)) from None


def _start_service(
    home: GodelHome,
    spec: ClusterSpec,
    state: ClusterState,
    name: str,
    kind: str,
    ports: Iterator[int],
) -> subprocess.Popen[bytes]:
    """Start one service on free ports taken from ``ports``: gRPC, metrics, and for the
    dashboard its web page."""
    port, metrics_port = next(ports), next(ports)
    address = f"{HOST}:{port}"
    web_args: list[str] = []
    web_url = ""
    if kind == "dashboard":
        web_port = next(ports)
        web_args = ["--web-host", HOST, "--web-port", str(web_port)]
        web_url = f"{http_scheme(state)}://{HOST}:{web_port}/"
    command = [
        # -P: never import from the working directory (a `store/` data dir there would shadow
        # the `store` package).
        sys.executable, "-P", "-m", f"services.{kind}",
        "--name", name,
        "--host", HOST,
        "--port", address.rsplit(":", 1)[1],
        "--home", str(home.path),
        "--grace-seconds", str(spec.grace_seconds),
        "--log-format", "json",
        *(["--insecure", "true"] if spec.insecure else []),
        *(["--https-on-loopback", "true"] if state.https_on_loopback else []),
        "--metrics-host", HOST,
        "--metrics-port", str(metrics_port),
        *web_args,
        *spec.args_for(name, kind),
    ]  # fmt: skip
    log_path = home.log_file(name)
    proc = _spawn_service(command, str(log_path), home, state)
    state.components.append(
        ComponentRecord(
            name=name,
            kind=kind,
            address=address,
            pid=proc.pid,
            create_time=psutil.Process(proc.pid).create_time(),
            command=command,
            log=str(log_path),
            started=now_iso(),
            metrics_address=f"{HOST}:{metrics_port}",
            web_url=web_url,
        )
    )
    # Recorded at once, so `godel down` can clean up even if this `up` is killed halfway.
    home.save(state)
    log.info("started", component=name, pid=proc.pid, address=address)
    return proc


def _spawn_service(
    command: list[str], log: str, home: GodelHome, state: ClusterState
) -> subprocess.Popen[bytes]:
    """A service process of the cluster, its output appended to ``log`` (none if empty)."""
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(privatefiles.open_append(log)) if log else subprocess.DEVNULL
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C in the terminal of `godel up` does not reach it.
            start_new_session=True,
            cwd=home.path,
            env=_service_env(state),
            # What it writes (logs, pods' work dirs) is private, however it was started.
            umask=privatefiles.PRIVATE_UMASK,
        )


def http_scheme(state: ClusterState) -> str:
    """How the cluster's HTTP endpoints (metrics, the dashboard) are reached on loopback."""
    return "https" if state.https_on_loopback else "http"


def _wait_serving(
    home: GodelHome, state: ClusterState, procs: list[subprocess.Popen[bytes]], timeout: float
) -> None:
    services = [c for c in state.components if c.kind not in (STORE, SENTINEL)]
    _wait_serving_records(services, procs, timeout, probe_credentials(home, state))


def probe_credentials(home: GodelHome, state: ClusterState) -> tls.Credentials | None:
    """What `godel` presents to the cluster's health checks: the admin identity, or nothing for
    a cluster started with --insecure."""
    if state.insecure:
        return None
    try:
        return tls.load(home.tls_dir, tls.ADMIN)
    except tls.CredentialsError as exc:
        raise ClusterError(str(exc)) from exc


def _wait_serving_records(
    services: list[ComponentRecord],
    procs: list[subprocess.Popen[bytes]],
    timeout: float,
    credentials: tls.Credentials | None,
) -> None:
    pending = dict(zip((c.name for c in services), zip(services, procs, strict=True), strict=True))
    retry = Retry(_POLL, deadline_seconds=timeout)
    while pending:
        for name, (record, proc) in list(pending.items()):
            if (code := proc.poll()) is not None:
                raise ClusterError(
                    f"{name} exited with code {code} during startup{_log_tail(record.log)}"
                )
            if probe(record.address, timeout=0.5, credentials=credentials) == SERVING:
                log.info("serving", component=name)
                del pending[name]
        if pending and retry.expired:
            first = next(iter(pending.values()))[0]
            raise ClusterError(
                f"{', '.join(pending)} not SERVING after {timeout:g}s{_log_tail(first.log)}"
            )
        if pending:
            retry.sleep_sync()


def _stop(state: ClusterState, timeout: float | None = None) -> list[tuple[str, str]]:
    services = [c for c in state.components if c.kind not in (STORE, SENTINEL)]
    sentinels = [c for c in state.components if c.kind == SENTINEL]
    stores = [c for c in state.components if c.kind == STORE]
    outcomes = _terminate(services, timeout if timeout is not None else state.grace_seconds + 5.0)
    # The store goes last: services drain into it while they stop. Its Sentinels go before it,
    # or they would fail over from a primary that is merely shutting down.
    store_timeout = timeout if timeout is not None else _STORE_STOP_SECONDS
    outcomes += _terminate(sentinels, store_timeout)
    outcomes += _terminate(stores, store_timeout)
    return outcomes


def _terminate(records: list[ComponentRecord], timeout: float) -> list[tuple[str, str]]:
    outcomes: dict[str, str] = {}
    running: dict[str, psutil.Process] = {}
    for record in records:
        if record.pid is None:
            outcomes[record.name] = "not managed"
        elif (proc := record.process()) is None:
            outcomes[record.name] = "not running"
        else:
            running[record.name] = proc
    for proc in running.values():
        _signal(proc, signal.SIGTERM)
    stragglers = _wait_gone(running, timeout)
    for name, proc in stragglers.items():
        log.warning("did not stop in time, killing", component=name, pid=proc.pid)
        _signal(proc, signal.SIGKILL)
    _wait_gone(stragglers, 5.0)
    for name in running:
        outcomes[name] = "killed" if name in stragglers else "stopped"
    return [(r.name, outcomes[r.name]) for r in records]


def _wait_gone(procs: dict[str, psutil.Process], timeout: float) -> dict[str, psutil.Process]:
    """Wait until the processes have exited; return those still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    remaining = dict(procs)
    while remaining:
        remaining = {name: proc for name, proc in remaining.items() if _running(proc)}
        if not remaining or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return remaining


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal(proc: psutil.Process, signum: signal.Signals) -> None:
    try:
        proc.send_signal(signum)
    except psutil.NoSuchProcess:
        pass


def _component_status(
    record: ComponentRecord, timeout: float, credentials: tls.Credentials | None, scheme: str
) -> ComponentStatus:
    if record.kind == SENTINEL:
        alive = record.process() is not None
        health = SERVING if alive else UNREACHABLE
    elif record.kind == STORE:
        health = _ping_store(record.address, timeout)
        alive = record.process() is not None if record.pid is not None else health == SERVING
    else:
        alive = record.process() is not None
        health = (
            probe(record.address, timeout=timeout, credentials=credentials)
            if alive
            else UNREACHABLE
        )
    return ComponentStatus(
        name=record.name, kind=record.kind, pid=record.pid, address=record.address,
        metrics_address=record.metrics_address,
        metrics_url=f"{scheme}://{record.metrics_address}/metrics" if record.metrics_address else "",
        web_url=record.web_url,
        alive=alive, health=health, started=record.started,
    )  # fmt: skip


def _ping_store(url: str, timeout: float) -> str:
    async def ping() -> None:
        store = await Store.connect(url)
        await store.close()

    try:
        asyncio.run(asyncio.wait_for(ping(), timeout))
    except TimeoutError:
        return TIMEOUT
    except StoreUnavailableError:
        return UNREACHABLE
    except StoreError as exc:
        return type(exc).__name__
    return SERVING


def _log_tail(path: str) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    except OSError as exc:
        return f"; cannot read its log {path}: {exc}"
    if not lines:
        return f"; its log {path} is empty"
    return f"\n--- last {len(lines)} lines of {path} ---\n" + "\n".join(lines)


def start_again(home: GodelHome, name: str) -> ComponentRecord:
    """Start a dead component with the command `godel up` recorded for it, as an operator (or a
    supervisor) would, and record the new process. A store server comes back on its data dir
    and port, and a server of a replicated store in the role its Sentinels give it: a former
    primary as the new primary's replica (its command asks them first: ``store/rejoin.py``)."""
    with home.lock():
        state = home.load()
        if state is None:
            raise ClusterError(f"no cluster in {home}: start one with `godel up`")
        record = state.component(name)
        if record is None or not record.command:
            raise ClusterError(f"{name!r} is not a component `godel up` started in {home}")
        if record.process() is not None:
            raise ClusterError(f"{name} is still running (pid {record.pid})")
        proc = _spawn_service(record.command, record.log, home, state)
        again = replace(
            record,
            pid=proc.pid,
            create_time=psutil.Process(proc.pid).create_time(),
            started=now_iso(),
        )
        state.components = [again if c.name == name else c for c in state.components]
        home.save(state)
        log.info("started again", component=name, pid=proc.pid)
        return again
