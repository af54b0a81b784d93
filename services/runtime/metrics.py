"""The Prometheus endpoint every service serves, and the gauge kind the services sample.

:class:`MetricsServer` exposes the process's default registry (``prometheus_client.REGISTRY``)
over HTTP on ``metrics_host:metrics_port`` — loopback unless configured otherwise — from
prometheus-client's own threaded server, so a scrape never waits on the event loop. Bound to any
other address it is HTTPS and requires a client certificate of the cluster's CA
(``ServiceConfig.serves_https``), as the gRPC port does. The metric
names live in ``services/metrics.py`` (and the store's in ``store/metrics.py``).

State that only the event loop may read (queues, credits, leadership) is not read by the scrape
thread: the service copies it into :class:`SampledGauge` s once per ``metrics_sample_seconds``
(``Service.sample_metrics``), and a scrape reads the last copy. That also keeps gauges off the hot
path entirely.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import structlog
from prometheus_client import REGISTRY, make_wsgi_app, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from foundation.tls import CredentialFiles

log = structlog.get_logger(__name__)


class MetricsServer:
    """prometheus-client's HTTP exposition server for this process's registry."""

    def __init__(
        self, server: WSGIServer, thread: threading.Thread, host: str, scheme: str
    ) -> None:
        self._server = server
        self._thread = thread
        self.host = host
        self.port: int = server.server_address[1]
        self.scheme = scheme

    @classmethod
    def start(cls, host: str, port: int, https: CredentialFiles | None = None) -> MetricsServer:
        """Listen on ``host:port`` (port 0 picks a free one); raises OSError if it is taken.
        With ``https``: TLS with that certificate, and a client certificate of its CA required
        (a scrape without one fails the handshake)."""
        if https is None:
            server, thread = start_http_server(port, addr=host, registry=REGISTRY)
            return cls(server, thread, host, "http")
        # Not prometheus-client's own TLS: it wraps the listening socket, so each handshake runs
        # in the accepting thread, and one client that connects and says nothing stops every
        # scrape. Here a request's thread shakes hands, within HANDSHAKE_SECONDS.
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(https.ca))
        context.load_cert_chain(str(https.certificate), str(https.private_key))
        context.verify_mode = ssl.CERT_REQUIRED
        server_class = _HttpsServer6 if ":" in host else _HttpsServer
        https_server = make_server(
            host.strip("[]"), port, make_wsgi_app(REGISTRY), server_class, _QuietHandler
        )
        https_server.context = context
        thread = threading.Thread(
            target=https_server.serve_forever, name="metrics-https", daemon=True
        )
        thread.start()
        return cls(https_server, thread, host, "https")

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}/metrics"

    def stop(self) -> None:
        """Stop serving and close the port. ``serve_forever`` looks for a shutdown only between
        two waits on its socket, half a second each, so every stop (every service's, every
        test's) would wait out the rest of one; a connection ends the wait at once, and the
        loop leaves before accepting it. Poked until the loop has left, as the first poke may
        land just before the shutdown is asked for."""
        stopping = threading.Thread(target=self._server.shutdown, name="metrics-stop")
        stopping.start()
        while stopping.is_alive():
            self._poke()
            stopping.join(0.02)
        self._server.server_close()
        self._thread.join(timeout=5)

    def _poke(self) -> None:
        listening = self._server.socket
        with contextlib.suppress(OSError), socket.socket(listening.family) as poke:
            poke.settimeout(0.2)
            poke.connect(listening.getsockname()[:2])


HANDSHAKE_SECONDS = 10.0
"""How long a metrics client may take over the TLS handshake and its request."""


class _HttpsServer(ThreadingWSGIServer):
    context: ssl.SSLContext

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = self.socket.accept()
        connection.settimeout(HANDSHAKE_SECONDS)
        # The handshake happens at the first read, in the request's own thread.
        wrapped = self.context.wrap_socket(
            connection, server_side=True, do_handshake_on_connect=False
        )
        return wrapped, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A refused or stalled handshake is the client's failure, not the server's: no
        # traceback on stderr for each stranger that knocks.
        log.debug("metrics request failed", client=str(client_address), exc_info=True)


class _HttpsServer6(_HttpsServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape on stderr is noise


class SampledGauge(Collector):
    """A labelled gauge whose whole set of series is replaced at once by :meth:`publish`.

    Labels that disappear (a deleted queue, a dead shard) disappear from the next scrape, which a
    ``Gauge`` with ``labels()`` cannot do without a window where the scrape sees none. ``publish``
    swaps one reference, so the scrape thread always sees one complete sample."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self._values: Mapping[tuple[str, ...], float] = {}
        REGISTRY.register(self)

    def publish(self, values: Mapping[tuple[str, ...], float]) -> None:
        self._values = dict(values)

    def set(self, value: float) -> None:
        """For a gauge without labels."""
        self._values = {(): value}

    def value(self, *labels: str) -> float | None:
        return self._values.get(labels)

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return [GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in self._values.items():
            family.add_metric(list(labels), value)
        return [family]
