"""The dashboard service: an informer over the cluster, one summary per tick, a web server.

It is a runtime ``Service`` like the others (gRPC health for `godel up` and compose, metrics,
SIGTERM), plus a uvicorn server for the page on ``web_host:web_port`` (HTTPS requiring the
admin's client certificate when that is not loopback, or with ``https_on_loopback``; see
``web.py``). The summary is built once
per ``refresh_seconds`` whatever the number of browsers, serialised once, and every open event
stream gets the same bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import orjson
import structlog
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from foundation.certnames import identity_of
from foundation.tls import CredentialFiles, CredentialsError, Identity
from protos.godel.v1 import objects_pb2 as pb
from services.dashboard.summary import (
    ClusterTracker,
    lease_summary,
    movement_summary,
    queue_summary,
    reservation_summary,
    shard_summary,
)
from services.dashboard.web import Callers, build_app
from services.peers.binder import LEASE as BINDER_LEASE
from services.runtime import Service, ServiceConfig, StartupError, option
from services.runtime.config import WILDCARD_HOSTS
from store.errors import StoreUnavailableError
from store.informer import Handlers, Informer

log = structlog.get_logger(__name__)

KINDS = ("Node", "Pod", "Queue", "SchedulerInstance", "Movement", "Job", "Reservation")


@dataclass(frozen=True)
class DashboardConfig(ServiceConfig):
    """The live web dashboard."""

    web_host: str = field(
        default="127.0.0.1",
        metadata=option("address the web page binds to (loopback by default)"),
    )
    web_port: int = field(
        default=0,
        metadata=option(
            "port of the web page; 0 picks a free one (it is logged)", minimum=0, maximum=65535
        ),
    )
    refresh_seconds: float = field(
        default=1.0, metadata=option("how often the page is updated", minimum=0.1)
    )
    window_seconds: int = field(
        default=300,
        metadata=option("how many seconds of throughput and latency the page shows", minimum=10),
    )
    heatmap_cells: int = field(
        default=2048,
        metadata=option(
            "at most this many heatmap cells per pool (a cell averages nodes)", minimum=16
        ),
    )
    sync_timeout_seconds: float = field(
        default=60.0, metadata=option("how long the first listing may take", minimum=1)
    )


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside a service: signals are the runtime's (SIGTERM stops the whole service in
    its documented order), so uvicorn must not install handlers of its own."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class DashboardService(Service[DashboardConfig]):
    component = "dashboard"
    config_class = DashboardConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.config
        self.tracker = ClusterTracker(
            window_seconds=cfg.window_seconds, max_cells=cfg.heatmap_cells
        )
        self.informer = Informer(self.store, KINDS)
        self.informer.add_handlers(
            Handlers(self.tracker.on_add, self.tracker.on_update, self.tracker.on_delete)
        )
        self.summary: bytes = b"{}"
        self.version = 0
        self.updated = asyncio.Condition()
        self.closing = asyncio.Event()
        self.web_address = ""
        self.web_scheme = "http"
        self._web: _EmbeddedServer | None = None

    @property
    def url(self) -> str:
        return f"{self.web_scheme}://{self.web_address}/"

    def add_servicers(self, server: grpc.aio.Server) -> None:
        pass  # health and reflection only

    async def on_start(self) -> None:
        self.informer.start()
        await self.informer.wait_synced(self.config.sync_timeout_seconds)
        await self._refresh()
        # Exposed beyond loopback (or asked to on loopback), the page asks the browser for the
        # admin's client certificate (`godel certs export` makes a bundle of it).
        https = self.https_files(self.config.web_host, "dashboard")
        callers: Callers | None = None if https is None else {}
        sock = _listen(self.config.web_host, self.config.web_port)
        host, port = sock.getsockname()[:2]
        shown = socket.gethostname() if host in WILDCARD_HOSTS else host
        self.web_address = f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"
        self._web = _EmbeddedServer(
            uvicorn.Config(
                build_app(self, callers),
                log_config=None,
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=1,
                # The client address is the connection's own: no forwarding header may name
                # another (an admin's connection, to borrow its identity).
                proxy_headers=False,
                http="auto" if callers is None else _identifying_protocol(callers),
                **_ssl_options(https),
            )
        )
        self.web_scheme = "http" if https is None else "https"
        self.spawn(self._web.serve(sockets=[sock]), name="dashboard-web")
        self.spawn(self._refresh_loop(), name="dashboard-refresh")
        log.info(
            "dashboard listening",
            url=self.url,
            tls="off" if https is None else "client certificate required",
        )

    async def on_stop(self) -> None:
        self.closing.set()
        async with self.updated:
            self.updated.notify_all()  # open event streams end now
        if self._web is not None:
            self._web.should_exit = True
        await self.informer.stop()

    async def wait_for_update(self, seen: int) -> None:
        """Until a summary newer than version ``seen`` is out, or the service stops."""
        async with self.updated:
            await self.updated.wait_for(lambda: self.version != seen or self.closing.is_set())

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.refresh_seconds)
            try:
                await self._refresh()
            except StoreUnavailableError as exc:
                log.warning("dashboard refresh failed; retrying", error=str(exc))

    async def _refresh(self) -> None:
        lease = await self.store.get_lease(BINDER_LEASE)
        now_ms = int(time.time() * 1000)
        informer, tracker = self.informer, self.tracker
        summary = {
            "cluster": self.store.cluster,
            "time_ms": now_ms,
            "informer_lag_seconds": min(informer.staleness(), 1e9),
            "nodes": tracker.node_summary(),
            "pods": tracker.pod_summary(),
            "gpus": tracker.gpu_summary(),
            "gpu_fragmentation": tracker.gpu_fragmentation(),
            "pending_reasons": tracker.pending_reasons(),
            "gangs": tracker.gang_summary(),
            "throughput": tracker.throughput(now_ms / 1000),
            "queues": queue_summary(informer.list(pb.Queue), tracker.default_queue_status()),
            "shards": shard_summary(
                informer.list(pb.SchedulerInstance), await self.store.shard_heartbeats()
            ),
            "binder": lease_summary(lease),
            "movements": movement_summary(informer.list(pb.Movement)),
            "reservations": reservation_summary(informer.list(pb.Reservation)),
        }
        self.summary = orjson.dumps(summary)
        async with self.updated:
            self.version += 1
            self.updated.notify_all()


def _ssl_options(https: CredentialFiles | None) -> dict[str, Any]:
    if https is None:
        return {}
    return {
        "ssl_certfile": str(https.certificate),
        "ssl_keyfile": str(https.private_key),
        "ssl_ca_certs": str(https.ca),
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
    }


def _identifying_protocol(callers: Callers) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol, noting in ``callers`` whom each connection's client
    certificate names while the connection is open (the handshake is over by then)."""

    class Identifying(H11Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            # A stream server's transport (uvloop's is not an asyncio.Transport subclass).
            super().connection_made(cast(asyncio.Transport, transport))
            caller = _caller(transport)
            if self.client is not None and caller is not None:
                callers[self.client] = caller

        def connection_lost(self, exc: Exception | None) -> None:
            if self.client is not None:
                callers.pop(self.client, None)
            super().connection_lost(exc)

    return Identifying


def _caller(transport: asyncio.BaseTransport) -> Identity | None:
    tls = transport.get_extra_info("ssl_object")
    der = tls.getpeercert(binary_form=True) if isinstance(tls, ssl.SSLObject) else None
    if not der:
        return None
    try:
        return identity_of(ssl.DER_cert_to_PEM_cert(der).encode())
    except CredentialsError:
        return None  # a certificate of the CA that names no role: nobody


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot serve the dashboard on {host}:{port}: {exc}") from exc
    sock.listen(128)
    sock.setblocking(False)
    return sock
