"""The service lifecycle shared by every Gödel component.

A component is a :class:`Service` subclass: it registers its gRPC servicers and may override
``on_start`` / ``on_stop``. :class:`ServiceHost` runs one — it connects the store, serves gRPC with
health and reflection, reports SERVING once ``on_start`` returns, and stops in a fixed order:

1. health → NOT_SERVING (clients and load balancers stop sending),
2. ``server.stop(grace)`` (in-flight RPCs get ``grace_seconds``, then are cancelled),
3. ``on_stop()`` (drain work, release leases),
4. background tasks started with :meth:`Service.spawn` are cancelled,
5. the store connection is closed.

:func:`main` is what ``python -m services.<name>`` calls: config, logging, uvloop, signals.
"""

from __future__ import annotations

import abc
import asyncio
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ClassVar, Generic, NoReturn

import grpc
import structlog
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from foundation import certnames, tls
from foundation.retry import Backoff, Retry
from services.runtime import gcpolicy
from services.runtime.auth import Authorize
from services.runtime.config import (
    ConfigError,
    ConfigT,
    ServiceConfig,
    advertised_address,
    load_config,
)
from services.runtime.decoding import RejectUndecodable
from services.runtime.logging import configure_logging
from services.runtime.looplag import LoopLag, watch_loop_lag
from services.runtime.metrics import MetricsServer
from store import Store, StoreUnavailableError, redact_url

log = structlog.get_logger(__name__)

# Units and decision batches travel whole in one message; gRPC's 4 MiB default is too small.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

# While the store is unreachable at startup: try every half second, up to store_connect_seconds.
_STORE_RETRY = Backoff(0.5)
# Of a stop's grace, what is kept for on_stop after the gRPC server stopped (at most a quarter).
DRAIN_RESERVE_SECONDS = 1.5


Dial = Callable[[str, Sequence[tuple[str, Any]]], grpc.aio.Channel]
"""``Service.dial``: a channel to a peer's published address with the service's credentials."""


class StartupError(Exception):
    """An expected reason not to start (store unreachable, port taken): logged without traceback."""


class Service(abc.ABC, Generic[ConfigT]):
    """One Gödel component. Subclasses set the class attributes and implement the hooks."""

    component: ClassVar[str]
    """Short name: ``python -m services.<component>``, the log field ``service``."""
    config_class: type[ConfigT]
    """The frozen dataclass this component is configured with."""
    grpc_services: ClassVar[tuple[str, ...]] = ()
    """Full names of the gRPC services it serves: reported in health and reflection."""

    def __init__(self, config: ConfigT, store: Store, health: health.aio.HealthServicer) -> None:
        self.config = config
        self.store = store
        self.health = health
        self.stop_requested = asyncio.Event()
        self.exit_code = 0
        self._tasks: set[asyncio.Task[None]] = set()
        # host:port the server listens on, and the port alone; set by the runtime before on_start.
        self.bound_address = ""
        self.bound_port = 0
        # What this service presents to its peers and trusts (None: insecure mode); set by the
        # runtime before on_start.
        self.credentials: tls.Credentials | None = None
        # host:port of the Prometheus endpoint ("" when none is served) and its URL; set before
        # on_start.
        self.metrics_address = ""
        self.metrics_url = ""

    @classmethod
    def credentials_stem(cls, config: ConfigT) -> str:
        """The certificate this service serves and dials with (``<stem>.crt`` in the TLS
        directory): its kind's, which every replica shares. A node agent has its own."""
        return cls.component

    @property
    def address(self) -> str:
        """Where other components reach this service (leases, registrations): the configured
        advertise address, else the bound host and port (port 0 picks a free port at start),
        with the hostname in place of a wildcard bind host (see ``advertised_address``)."""
        return advertised_address(self.config.advertise_address, self.config.host, self.bound_port)

    def dial(self, address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """A channel to a peer service at the address it published, with this service's
        credentials (mutual TLS), or plaintext in insecure mode."""
        return tls.aio_channel(address, self.credentials, options)

    def https_files(self, host: str, what: str) -> tls.CredentialFiles | None:
        """The credentials an HTTP endpoint bound to ``host`` serves HTTPS with (client
        certificates required), or None for plain HTTP: loopback (unless
        ``https_on_loopback``) and insecure mode. ``what`` names the endpoint in the warning
        an insecure service logs when it exposes one in plain HTTP."""
        if not self.config.serves_https(host):
            if self.config.insecure and not tls.is_loopback(host):
                log.warning(
                    "plain HTTP on an exposed address (--insecure): anyone may read it",
                    endpoint=what,
                    host=host,
                )
            return None
        try:
            return tls.files(self.config.credentials_dir(), self.credentials_stem(self.config))
        except tls.CredentialsError as exc:
            raise StartupError(f"{what} on {host} needs HTTPS: {exc}") from exc

    @abc.abstractmethod
    def add_servicers(self, server: grpc.aio.Server) -> None:
        """Register this component's servicers; health and reflection are added by the runtime."""

    async def on_start(self) -> None:
        """Runs once the server listens and before health reports SERVING: load state, wait for
        the store's watch to sync, start loops with :meth:`spawn`. Raising aborts startup."""

    async def on_stop(self) -> None:
        """Runs after the gRPC server has stopped and before the store is closed: drain in-flight
        work, release leases. Tasks started with :meth:`spawn` are cancelled afterwards."""

    def sample_metrics(self) -> None:
        """Copy this service's gauges (queue depths, credits, leadership) from its state into
        their ``SampledGauge`` s. Runs on the event loop every ``metrics_sample_seconds``, so it
        may read anything the service's tasks change; keep it to a pass over small state."""

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        """Run ``coro`` for the life of the service. If it raises, the service stops with exit
        code 1 — a crashed loop is a crashed process, and its supervisor restarts it."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def request_stop(self, reason: str, *, exit_code: int = 0) -> None:
        """Begin the graceful shutdown; the first non-zero exit code requested is kept."""
        if self.exit_code == 0:
            self.exit_code = exit_code
        if not self.stop_requested.is_set():
            log.info("stop requested", reason=reason)
            self.stop_requested.set()

    async def cancel_background_tasks(self) -> None:
        await cancel_and_wait(list(self._tasks))

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        if (error := task.exception()) is not None:
            log.error("background task failed", task=task.get_name(), exc_info=error)
            self.request_stop(f"task {task.get_name()} failed", exit_code=1)


async def cancel_and_wait(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Cancel the tasks and wait until every one has really ended. Once is not enough: redis-py
    can swallow a cancellation that lands while it reads a reply, and a loop around that read
    then carries on (a scheduler shard's stop hung there until it was killed)."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.05)
    await asyncio.gather(*tasks, return_exceptions=True)


class ServiceHost(Generic[ConfigT]):
    """Runs one :class:`Service`: store connection, gRPC server, health, ordered shutdown.

    ``async with ServiceHost(cls, config) as host:`` starts it and stops it on exit; tests use this
    to run a service in-process on a free port (``host.address``).
    """

    def __init__(self, service_cls: type[Service[ConfigT]], config: ConfigT) -> None:
        self.service_cls = service_cls
        self.config = config
        self.health = health.aio.HealthServicer()
        self.address = ""
        self.service: Service[ConfigT] | None = None
        self._store: Store | None = None
        self._server: grpc.aio.Server | None = None
        self._metrics: MetricsServer | None = None
        self._sampler: asyncio.Task[None] | None = None
        # How long the event loop stalls (``looplag.py``): watched once serving.
        self.loop_lag = LoopLag()
        self._lag_probe: asyncio.Task[None] | None = None
        self._stopped = False

    async def start(self) -> None:
        """Connect the store, start serving, run ``on_start``, then report SERVING. On failure
        the caller should still call :meth:`stop` to release what was acquired."""
        credentials = _load_credentials(self.config, self.service_cls.credentials_stem(self.config))
        self._store = await _connect_store(self.config)
        service = self.service = self.service_cls(self.config, self._store, self.health)
        service.credentials = credentials
        # Nothing is SERVING until on_start has finished (the servicer starts with "" SERVING).
        served = ("", *service.grpc_services)
        for name in served:
            await self.health.set(name, NOT_SERVING)

        server = self._server = grpc.aio.server(
            # Authorisation first: a refused caller learns nothing about its request's shape.
            interceptors=[RejectUndecodable()]
            if credentials is None
            else [Authorize(), RejectUndecodable()],
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                # Two processes must never share a port silently (gRPC enables SO_REUSEPORT).
                ("grpc.so_reuseport", 0),
            ],
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        service.add_servicers(server)
        reflection.enable_server_reflection(
            (*service.grpc_services, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        try:
            if credentials is None:
                port = server.add_insecure_port(f"{host}:{self.config.port}")
            else:
                port = server.add_secure_port(f"{host}:{self.config.port}", credentials.server())
        except RuntimeError as exc:
            raise StartupError(f"cannot listen on {host}:{self.config.port}: {exc}") from exc
        self.address = service.bound_address = f"{host}:{port}"
        service.bound_port = port
        if credentials is not None and self.config.advertise_address:
            _check_advertised_name(credentials, service.address)
        await server.start()
        log.info(
            "listening",
            address=self.address,
            advertised=service.address,
            grpc_services=list(service.grpc_services),
            tls="off (--insecure)" if credentials is None else "mutual TLS",
        )

        if self.config.metrics_port >= 0:
            host = self.config.metrics_host
            https = service.https_files(host, "metrics")
            self._metrics = _start_metrics(host, self.config.metrics_port, https)
            service.metrics_address = self._metrics.address
            service.metrics_url = self._metrics.url
            log.info(
                "metrics listening",
                url=service.metrics_url,
                tls="off" if https is None else "client certificate required",
            )

        await service.on_start()
        if self._metrics is not None:
            # The runtime's own task, not the service's: it ends after on_stop, with the server.
            self._sampler = asyncio.create_task(_sample_metrics(service), name="metrics-sampler")
        self._lag_probe = asyncio.create_task(watch_loop_lag(self.loop_lag), name="loop-lag")
        for name in served:
            await self.health.set(name, SERVING)
        log.info("serving", address=self.address)

    async def stop(self) -> None:
        """Shut down in the documented order, within ``grace_seconds`` in all (an orchestrator
        SIGKILLs a process that overstays its grace): in-flight RPCs get the grace less a drain
        reserve — long-lived streams use all of it — and ``on_stop`` gets what remains, at least
        the reserve. Idempotent, and safe after a partial start."""
        if self._stopped:
            return
        self._stopped = True
        loop = asyncio.get_running_loop()
        grace = self.config.grace_seconds
        reserve = min(DRAIN_RESERVE_SECONDS, grace / 4)
        deadline = loop.time() + grace
        await self.health.enter_graceful_shutdown()
        if self._server is not None:
            log.info("stopping gRPC server", grace_seconds=grace)
            await self._server.stop(grace - reserve)
        if self.service is not None:
            try:
                await asyncio.wait_for(self.service.on_stop(), max(deadline - loop.time(), reserve))
            except TimeoutError:
                log.warning("on_stop overran the grace; its work was cancelled")
            except Exception:
                log.exception("on_stop failed")
                self.service.exit_code = self.service.exit_code or 1
            await self.service.cancel_background_tasks()
        if self._store is not None:
            await self._store.close()
        probes = [t for t in (self._sampler, self._lag_probe) if t is not None]
        await cancel_and_wait(probes)
        if self._metrics is not None:
            # Last: a scrape during the stop still answers.
            await asyncio.to_thread(self._metrics.stop)
        log.info("stopped")

    async def __aenter__(self) -> ServiceHost[ConfigT]:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


async def serve(service_cls: type[Service[ConfigT]], config: ConfigT) -> int:
    """Run the service until SIGTERM/SIGINT (or a fatal error) and return the exit code.

    grpc.aio under uvloop does not stop on SIGTERM by itself, hence explicit loop handlers. A
    second signal exits at once, for when a graceful shutdown hangs.
    """
    gcpolicy.tune_for_service()
    host = ServiceHost(service_cls, config)
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: signal.Signals) -> None:
        if interrupted.is_set():
            log.warning("second signal: exiting without draining", signal=signum.name)
            os._exit(128 + signum)
        interrupted.set()
        if host.service is not None:
            host.service.request_stop(signum.name)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)

    # A signal during startup (e.g. while the store is still unreachable) aborts the startup.
    starting = asyncio.create_task(host.start())
    interrupt_wait = asyncio.create_task(interrupted.wait())
    await asyncio.wait((starting, interrupt_wait), return_when=asyncio.FIRST_COMPLETED)
    interrupt_wait.cancel()
    if not starting.done():
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await host.stop()
        return 0
    if (error := starting.exception()) is not None:
        if isinstance(error, StartupError):
            log.error("startup failed", error=str(error))
        else:
            log.error("startup failed", exc_info=error)
        await host.stop()
        return 1

    assert host.service is not None
    if interrupted.is_set():  # the signal and the end of startup landed in the same loop turn
        host.service.request_stop("signal during startup")
    gcpolicy.settle()  # serving, its caches loaded: take them out of the collector's sight
    await host.service.stop_requested.wait()
    await host.stop()
    return host.service.exit_code


def run_service(service_cls: type[Service[Any]], argv: Sequence[str]) -> int:
    """Parse config from ``argv`` and the environment, configure logging and run on uvloop.

    Returns the process exit code: 0 after a graceful stop, 1 on a fatal error, 2 on bad config.
    """
    prog = f"python -m services.{service_cls.component}"
    try:
        config = load_config(service_cls.config_class, argv, prog=prog)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    configure_logging(service_cls.component, config.name, config.log_level, config.log_format)
    log.info("starting", pid=os.getpid(), store_url=redact_url(config.store_url))
    exit_code: int = uvloop.run(serve(service_cls, config))
    return exit_code


def main(service_cls: type[Service[Any]]) -> NoReturn:
    """The body of a service's ``__main__``: run it and exit with its code."""
    raise SystemExit(run_service(service_cls, sys.argv[1:]))


def _load_credentials(config: ServiceConfig, stem: str) -> tls.Credentials | None:
    """This service's identity (``<stem>.crt``, ``Service.credentials_stem``) from the config's
    TLS directory; None only when asked for by name (``insecure``). Missing credentials stop the
    start: a service never falls back to plaintext by itself, nor to another identity."""
    if config.insecure:
        log.warning("serving WITHOUT TLS (--insecure): every caller may do everything")
        return None
    directory = config.credentials_dir()
    try:
        return tls.load(directory, stem)
    except tls.CredentialsError as exc:
        older = (directory / f"{tls.SERVICE}.crt").exists()
        agent_prefix = tls.agent_stem("")
        if stem.startswith(agent_prefix) and older:
            # A node agent's own certificate, which names its nodes: made per agent.
            agent = stem.removeprefix(agent_prefix)
            hint = (
                f"each node agent has its own certificate, naming the nodes it serves: "
                f"`godel certs issue {agent} --role nodeagent --dir {directory}` issues it for "
                f"its hollow nodes {agent}-* (--node names others: the process node, another "
                "--node-prefix); `godel up`, and compose's certs service for its agent, do it "
                "by themselves"
            )
        elif older:
            # A directory from before each kind had its own certificate.
            hint = (
                f"each service kind now has its own certificate: `godel certs init --dir "
                f"{directory}` issues the missing ones and keeps the rest (`godel up` and "
                "compose's certs service do it by themselves)"
            )
        else:
            hint = (
                "`godel up` issues the cluster's credentials into HOME/tls (compose: the "
                "certs service), --tls-dir names another directory, --insecure true (or "
                "GODEL_INSECURE=true) serves without TLS"
            )
        raise StartupError(f"{exc}; {hint}") from exc


def _check_advertised_name(credentials: tls.Credentials, advertised: str) -> None:
    """Warn when the certificate does not name the address an operator told this replica to
    advertise: the cluster's own clients verify ``godel-service`` and still connect, but tools
    that verify the host they dial (grpcurl, a Prometheus without ``server_name``) refuse it."""
    if not certnames.names_address(credentials.certificate, advertised):
        log.warning(
            "the service certificate does not name the advertised address; tools that verify "
            "the host need the name godel-service (grpcurl -authority), or issue the "
            "certificate with it (`godel certs init --host NAME` on a fresh directory)",
            advertised=advertised,
        )


def _start_metrics(host: str, port: int, https: tls.CredentialFiles | None) -> MetricsServer:
    try:
        return MetricsServer.start(host, port, https)
    except OSError as exc:
        raise StartupError(f"cannot serve metrics on {host}:{port}: {exc}") from exc


async def _sample_metrics(service: Service[Any]) -> None:
    while True:
        try:
            service.sample_metrics()
        except Exception:
            # Stale gauges are better than a service stopped over its metrics.
            log.exception("sampling metrics failed")
        await asyncio.sleep(service.config.metrics_sample_seconds)


async def _connect_store(config: ServiceConfig) -> Store:
    """Connect, retrying while the store is unreachable (it may be starting or restarting)."""
    loop = asyncio.get_running_loop()
    retry = Retry(_STORE_RETRY, deadline_seconds=config.store_connect_seconds, clock=loop.time)
    try:
        url = config.store_connection_url()
    except ConfigError as exc:
        raise StartupError(str(exc)) from exc
    while True:
        try:
            return await Store.connect(url, cluster=config.cluster)
        except StoreUnavailableError as exc:
            if retry.expired:
                raise StartupError(
                    f"store {redact_url(config.store_url)} still unreachable after "
                    f"{config.store_connect_seconds:g}s: {exc}"
                ) from exc
            log.warning(
                "store unreachable, retrying", url=redact_url(config.store_url), error=str(exc)
            )
            await retry.sleep()
