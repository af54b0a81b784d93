"""The HTTP endpoints (every service's /metrics, the dashboard's page) require the cluster's
credentials when exposed beyond loopback: HTTPS with the service certificate and a client
certificate of the cluster's CA. Services run in-process against the real store server and are
requested over real sockets; loopback stays plain HTTP unless asked for. Also `godel certs
export`, the PKCS#12 bundle a browser imports to open an exposed dashboard."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.serialization import pkcs12

from foundation import pki, tls
from foundation.netutil import free_port
from godel.cli.main import app
from services.dashboard.service import DashboardConfig, DashboardService
from services.runtime import Service, ServiceConfig, ServiceHost


class Plain(Service[ServiceConfig]):
    component = "plain"
    config_class = ServiceConfig

    def add_servicers(self, server: grpc.aio.Server) -> None:
        pass


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "tls"
    pki.init_cluster(directory)
    pki.issue(directory, "alice", "tenant", queues=["default"])
    pki.issue(directory, Plain.component, "service")  # the test service's kind has no default
    return directory


@pytest.fixture
def config(store_url: str, cluster_name: str, tmp_path: Path, tls_dir: Path) -> ServiceConfig:
    return ServiceConfig(
        name="http-1",
        port=free_port(),
        store_url=store_url,
        cluster=cluster_name,
        grace_seconds=0.5,
        home=tmp_path,
        tls_dir=str(tls_dir),
    )


def _context(tls_dir: Path, identity: str | None) -> ssl.SSLContext:
    """A client trusting the cluster CA, presenting ``identity``'s certificate (None: none).
    The host is not checked: tests dial 127.0.0.1 at whatever port; the CA is what matters."""
    if identity is None:
        context = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    else:
        context = tls.https_client_context(tls.files(tls_dir, identity))
    context.check_hostname = False
    return context


def _get(url: str, context: ssl.SSLContext | None = None) -> bytes:
    """Blocking: a dashboard, which serves on the test's event loop, is asked from a thread."""
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        body: bytes = response.read()
        return body


def _loopback(url: str) -> str:
    """A URL of a server bound to every interface, dialled on loopback."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://127.0.0.1:{rest.split('/', 1)[0].rsplit(':', 1)[1]}/{rest.split('/', 1)[1]}"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.7", False),
        ("dashboard", False),  # a name: exposed, whatever it resolves to today
    ],
)
def test_which_bind_hosts_are_loopback(host: str, loopback: bool) -> None:
    assert tls.is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("host", "insecure", "on_loopback", "https"),
    [
        ("127.0.0.1", False, False, False),  # the default: loopback stays plain HTTP
        ("127.0.0.1", False, True, True),  # ... unless asked for
        ("0.0.0.0", False, False, True),  # exposed: the cluster's credentials required
        ("10.0.0.7", False, False, True),
        ("0.0.0.0", True, False, False),  # insecure: no credentials to require
        ("127.0.0.1", True, True, False),
    ],
)
def test_when_an_http_endpoint_requires_credentials(
    config: ServiceConfig, host: str, insecure: bool, on_loopback: bool, https: bool
) -> None:
    chosen = replace(config, insecure=insecure, https_on_loopback=on_loopback)
    assert chosen.serves_https(host) is https


async def test_exposed_metrics_require_a_client_certificate_of_the_cluster(
    config: ServiceConfig, tls_dir: Path, tmp_path: Path
) -> None:
    pki.init_cluster(tmp_path / "other")  # another cluster's CA and admin
    exposed = replace(config, metrics_host="0.0.0.0", metrics_port=0)
    async with ServiceHost(Plain, exposed) as host:
        assert host.service is not None
        url = _loopback(host.service.metrics_url)
        assert url.startswith("https://")
        assert b"process_cpu_seconds_total" in _get(url, _context(tls_dir, tls.ADMIN))
        assert b"process_cpu_seconds_total" in _get(url, _context(tls_dir, "alice"))
        with pytest.raises(OSError):  # no client certificate: the handshake is refused
            _get(url, _context(tls_dir, None))
        other = _context(tmp_path / "other", tls.ADMIN)
        other.load_verify_locations(str(tls_dir / "ca.crt"))  # trusts the server, but is foreign
        with pytest.raises(OSError):
            _get(url, other)
        with pytest.raises(OSError):  # plain HTTP to the TLS port
            _get(url.replace("https://", "http://"))
        # A stranger who connects and says nothing holds no one else up: each connection
        # shakes hands in its own thread.
        port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)):
            assert b"process_cpu_seconds_total" in _get(url, _context(tls_dir, tls.ADMIN))


async def test_metrics_on_loopback_stay_plain_http_unless_asked(
    config: ServiceConfig, tls_dir: Path
) -> None:
    async with ServiceHost(Plain, config) as host:
        assert host.service is not None
        assert host.service.metrics_url.startswith("http://127.0.0.1:")
        assert b"process_cpu_seconds_total" in _get(host.service.metrics_url)
    async with ServiceHost(Plain, replace(config, https_on_loopback=True)) as host:
        assert host.service is not None
        url = host.service.metrics_url
        assert url.startswith("https://127.0.0.1:")
        assert b"process_cpu_seconds_total" in _get(url, _context(tls_dir, tls.ADMIN))
        with pytest.raises(OSError):
            _get(url, _context(tls_dir, None))


async def test_an_insecure_service_exposes_metrics_in_plain_http(config: ServiceConfig) -> None:
    exposed = replace(config, insecure=True, metrics_host="0.0.0.0")
    async with ServiceHost(Plain, exposed) as host:
        assert host.service is not None
        url = _loopback(host.service.metrics_url)
        assert url.startswith("http://")
        assert b"process_cpu_seconds_total" in _get(url)


def _dashboard(config: ServiceConfig, web_host: str) -> DashboardConfig:
    fields = {f: getattr(config, f) for f in config.__dataclass_fields__}
    fields["metrics_port"] = -1
    return DashboardConfig(**fields, web_host=web_host, web_port=free_port())


async def test_an_exposed_dashboard_requires_a_client_certificate_of_the_cluster(
    config: ServiceConfig, tls_dir: Path
) -> None:
    async with ServiceHost(DashboardService, _dashboard(config, "0.0.0.0")) as host:
        assert isinstance(host.service, DashboardService)
        url = _loopback(host.service.url)
        assert url.startswith("https://")
        summary = json.loads(
            await asyncio.to_thread(_get, url + "api/summary", _context(tls_dir, tls.ADMIN))
        )
        assert summary["cluster"] == config.cluster
        with pytest.raises(OSError):
            await asyncio.to_thread(_get, url + "api/summary", _context(tls_dir, None))
        with pytest.raises(OSError):
            await asyncio.to_thread(_get, url.replace("https://", "http://") + "api/summary")


def _refusal(url: str, context: ssl.SSLContext) -> tuple[int, str]:
    """The HTTP status and body of a request the server answers with an error."""
    with pytest.raises(urllib.error.HTTPError) as refused:
        _get(url, context)
    return refused.value.code, refused.value.read().decode()


async def test_the_dashboard_is_the_admins_alone(config: ServiceConfig, tls_dir: Path) -> None:
    """Over HTTPS (here on loopback, as `godel up` serves it when process-mode pods run on the
    machine) the summary — every queue, pending reasons, movements — is the admin's: no
    certificate fails the handshake, a tenant's (or a service's) is refused with 403."""
    dashboard = replace(_dashboard(config, "127.0.0.1"), https_on_loopback=True)
    async with ServiceHost(DashboardService, dashboard) as host:
        assert isinstance(host.service, DashboardService)
        url = host.service.url
        assert url.startswith("https://127.0.0.1:")
        admin = _context(tls_dir, tls.ADMIN)
        summary = json.loads(await asyncio.to_thread(_get, url + "api/summary", admin))
        assert summary["cluster"] == config.cluster
        assert b"<html" in await asyncio.to_thread(_get, url, admin)
        with pytest.raises(OSError):
            await asyncio.to_thread(_get, url + "api/summary", _context(tls_dir, None))
        for identity in ("alice", "dashboard"):
            for path in ("", "api/summary", "api/events", "static/dashboard.js"):
                code, body = await asyncio.to_thread(
                    _refusal, url + path, _context(tls_dir, identity)
                )
                assert code == 403 and "admin" in body, (identity, path)
        # Its health is no secret: any certificate of the cluster may ask.
        assert await asyncio.to_thread(_get, url + "healthz", _context(tls_dir, "alice")) == b"ok"


async def test_the_dashboard_on_loopback_stays_plain_http(config: ServiceConfig) -> None:
    async with ServiceHost(DashboardService, _dashboard(config, "127.0.0.1")) as host:
        assert isinstance(host.service, DashboardService)
        assert host.service.url.startswith("http://127.0.0.1:")
        assert await asyncio.to_thread(_get, host.service.url + "healthz") == b"ok"


def test_certs_export_writes_a_pkcs12_bundle_a_browser_imports(tls_dir: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["certs", "export", "alice", "--dir", str(tls_dir)])
    assert result.exit_code == 0, result.output
    password = result.output.split("password: ", 1)[1].strip()
    bundle = tls_dir / "alice.p12"
    assert bundle.stat().st_mode & 0o077 == 0, "private to its owner, as the key it holds"
    key, certificate, chain = pkcs12.load_key_and_certificates(
        bundle.read_bytes(), password.encode()
    )
    assert key is not None and certificate is not None
    assert pki.identity_of(tls.load(tls_dir, "alice").certificate).name == "alice"
    assert (
        certificate.public_bytes(pki.serialization.Encoding.PEM)
        == tls.load(tls_dir, "alice").certificate
    )
    assert [c.subject.rfc4514_string() for c in chain] == ["CN=godel cluster CA"]
    with pytest.raises(ValueError):
        pkcs12.load_key_and_certificates(bundle.read_bytes(), b"wrong")
    # A chosen password; an identity that does not exist is a clear error.
    out = tls_dir / "mine.p12"
    given = ["--password", "s3cret", "--out", str(out)]
    result = runner.invoke(app, ["certs", "export", "--dir", str(tls_dir), *given])
    assert result.exit_code == 0 and "password:" not in result.output, result.output
    assert pkcs12.load_key_and_certificates(out.read_bytes(), b"s3cret")[1] is not None
    result = runner.invoke(app, ["certs", "export", "nobody", "--dir", str(tls_dir)])
    assert result.exit_code != 0 and "nobody" in result.output
