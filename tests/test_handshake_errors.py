"""What the SDK and the CLI say when a TLS server of the cluster refuses the caller in the
handshake (mutual TLS: no certificate of the cluster's CA, or none at all). gRPC reports that as
UNAVAILABLE, like a server that is down; the SDK turns it into Unauthenticated saying where the
credentials are looked for, and keeps Unavailable for a server that is really not there. A real
gRPC server with the cluster's service certificate on loopback; real clients."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health, health_pb2_grpc

from foundation import pki, tls
from godel.cli.main import app
from godel.client import ClientError, ProtoClient, Unauthenticated, Unavailable
from services.runtime.healthcheck import probe


@pytest.fixture
def cluster_tls(tmp_path: Path) -> Path:
    pki.init_cluster(tmp_path / "cluster")
    pki.init_cluster(tmp_path / "other")
    return tmp_path / "cluster"


@pytest.fixture
def server(cluster_tls: Path) -> Iterator[str]:
    """A TLS server as every service is one: the service identity, client certificates of the
    cluster's CA required."""
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), grpc_server)
    credentials = tls.load(cluster_tls, tls.SERVICE).server()
    port = grpc_server.add_secure_port("127.0.0.1:0", credentials)
    grpc_server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        grpc_server.stop(None)


@pytest.mark.parametrize(
    ("details", "refused"),
    [
        (
            "failed to connect to all addresses; last error: UNAVAILABLE: "
            "ipv4:127.0.0.1:39755: Socket closed",
            True,
        ),
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
            "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: BAD_SIGNATURE",
            True,
        ),
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
            "Failed to connect to remote host: Connection refused",
            False,
        ),
        ("Socket closed", False),  # a connection that was up, then broke: the server went away
        ("", False),
    ],
)
def test_which_unavailable_details_are_a_refused_handshake(details: str, refused: bool) -> None:
    assert (tls.handshake_refusal(details) is not None) is refused


def test_a_foreign_client_certificate_is_unauthenticated_and_says_where_the_cli_looks(
    server: str, cluster_tls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = tls.load(cluster_tls, tls.ADMIN), tls.load(tmp_path / "other", tls.ADMIN)
    # It trusts the server, but its certificate is not of the cluster's CA.
    foreign = tls.Credentials(ours.ca, theirs.certificate, theirs.private_key)
    monkeypatch.setenv(tls.TLS_DIR_VARIABLE, str(tmp_path / "somewhere"))
    with ProtoClient(server, credentials=foreign) as client, pytest.raises(Unauthenticated) as e:
        client.list("Node")
    message = str(e.value)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "requires a client certificate" in message
    assert str(tmp_path / "somewhere") in message and "admin.crt" in message


def test_plaintext_to_the_tls_cluster_is_unauthenticated(server: str) -> None:
    with ProtoClient(server, insecure=True) as client, pytest.raises(Unauthenticated) as e:
        client.list("Node")
    assert "plaintext" in str(e.value) and "mutual TLS" in str(e.value)


def test_another_clusters_credentials_are_unauthenticated(server: str, tmp_path: Path) -> None:
    theirs = tls.load(tmp_path / "other", tls.ADMIN)
    with ProtoClient(server, credentials=theirs) as client, pytest.raises(Unauthenticated) as e:
        client.list("Node")
    assert "handshake failed" in str(e.value)


def test_the_clusters_own_certificate_gets_through_the_handshake(
    server: str, cluster_tls: Path
) -> None:
    # The handshake succeeds; this bare server has no Dispatcher, which is what the call learns.
    with ProtoClient(server, credentials=tls.load(cluster_tls, tls.ADMIN)) as client:
        with pytest.raises(ClientError) as e:
            client.list("Node")
    assert e.value.code == grpc.StatusCode.UNIMPLEMENTED


def test_a_server_that_is_down_stays_unavailable(cluster_tls: Path) -> None:
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = grpc_server.add_secure_port("127.0.0.1:0", tls.load(cluster_tls, tls.SERVICE).server())
    grpc_server.start()
    grpc_server.stop(None)  # nothing listens there any more
    admin = tls.load(cluster_tls, tls.ADMIN)
    with ProtoClient(f"127.0.0.1:{port}", credentials=admin) as client:
        with pytest.raises(Unavailable) as e:
            client.list("Node")
    assert not isinstance(e.value, Unauthenticated)
    assert "cannot reach" in str(e.value)


def test_the_cli_reports_a_refused_certificate_as_such(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GODEL_TLS_DIR names another cluster's credentials directory: wrong CA, wrong admin.
    other = tmp_path / "other"
    monkeypatch.setenv("GODEL_ADDRESS", server)
    monkeypatch.setenv(tls.TLS_DIR_VARIABLE, str(other))
    result = CliRunner().invoke(app, ["get", "nodes"])
    assert result.exit_code != 0
    assert "requires a client certificate" in result.output, result.output
    assert str(other) in result.output


def test_health_probes_tell_a_refused_handshake_from_a_server_that_is_down(
    server: str, cluster_tls: Path, tmp_path: Path
) -> None:
    admin = tls.load(cluster_tls, tls.ADMIN)
    assert probe(server, credentials=admin) == "SERVING"
    assert probe(server, credentials=None) == "UNAUTHENTICATED"  # plaintext
    assert probe(server, credentials=tls.load(tmp_path / "other", tls.ADMIN)) == "UNAUTHENTICATED"
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = grpc_server.add_secure_port("127.0.0.1:0", tls.load(cluster_tls, tls.SERVICE).server())
    grpc_server.start()
    grpc_server.stop(None)
    assert probe(f"127.0.0.1:{port}", credentials=admin) == "UNREACHABLE"
