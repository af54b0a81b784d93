"""The cluster's credentials on the wire: loading them, and gRPC servers and channels using them.
(Making them — the CA, issuing certificates — is ``foundation.pki``; it needs ``cryptography``,
which neither clients nor servers import. Reading the identity one names is
``foundation.certnames``, standard library only.)

A cluster's trust lives in one directory (``$GODEL_HOME/tls`` for `godel up`, a volume written
by the ``certs`` init service in compose)::

    ca.crt / ca.key           the cluster CA (the key only ever issues certificates)
    <kind>.crt / .key         each shared service kind's identity (dispatcher, scheduler,
                              binder, rescheduler, dashboard): what its replicas serve and dial with
    nodeagent.<agent>.crt/.key  each node agent's own identity: its name and the nodes it serves
    service.crt / .key        a service identity of no kind: health probes (compose, `godel up`)
    admin.crt / .key          the admin client identity: what the CLI and the SDK use by default
    <tenant>.crt / .key       tenant identities, issued with `godel certs issue`

Who a certificate belongs to is in its subject: the common name is the identity's name and the
organizational unit its role (``service``, ``admin`` or ``tenant``); a service's name is its
kind, so that each internal RPC admits only the kinds that call it (``services.runtime.auth``). A
tenant's certificate also lists the queues it may submit to, as URIs ``urn:godel:queue:<name>`` among its subject
alternative names (``openssl x509 -text`` shows them), so that the services authorise a call from
the certificate alone, with no lookup. Likewise a node agent's certificate (CN ``nodeagent``)
names the agent, ``urn:godel:agent:<name>``, and the nodes it serves, ``urn:godel:node:<pattern>``
(a node's name, or a prefix ending in ``*``: ``nodeagent-0-*`` covers the hollow nodes
``nodeagent-0-0``, ``nodeagent-0-1``, ...): the replicas of the other kinds are interchangeable
and share their kind's certificate, but each agent acts on its own nodes only, so what one agent
holds must not act for another (the Binder's eviction rules, ``services/binder/evictrules.py``).

Every service certificate names every address a replica may be dialled at — loopback, the
machine's hostname, the compose service names — and also the fixed name ``SERVICE_NAME``. Our
channels (services to their peers, the CLI, the SDK) verify the server against the cluster CA and
``SERVICE_NAME`` rather than the dialled host: services dial the addresses their peers publish,
and a compose replica's hostname is its container id, unknown when the certificate is issued.
Tools such as grpcurl verify the host, which the certificate names.

HTTP endpoints (every service's ``/metrics``, the dashboard's page) bound to a non-loopback
address use the same trust: HTTPS with the service certificate, and a client certificate of the
cluster's CA required (:func:`https_server_files`; Prometheus' ``tls_config`` with ``ca_file``,
``cert_file``, ``key_file``; a browser imports the PKCS#12 bundle `godel certs export` writes).
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc

Role = Literal["service", "admin", "tenant"]
ROLES: tuple[Role, ...] = ("service", "admin", "tenant")
SERVICE_NAME = "godel-service"
"""A name every service certificate carries; peers verify it instead of the dialled host."""
CA = "ca"
SERVICE = "service"
NODEAGENT = "nodeagent"
SERVICE_KINDS = ("dispatcher", "scheduler", "binder", "rescheduler", NODEAGENT, "dashboard")
"""The service kinds: the name (CN) of their certificates."""
SHARED_KINDS = tuple(kind for kind in SERVICE_KINDS if kind != NODEAGENT)
"""The kinds whose replicas share one certificate named after the kind (``<kind>.crt``). Node
agents are not among them: each has its own, naming its nodes (:func:`agent_stem`)."""
ADMIN = "admin"
QUEUE_URI_PREFIX = "urn:godel:queue:"
AGENT_URI_PREFIX = "urn:godel:agent:"
NODE_URI_PREFIX = "urn:godel:node:"
TLS_DIR_VARIABLE = "GODEL_TLS_DIR"
IDENTITY_VARIABLE = "GODEL_IDENTITY"
INSECURE_VARIABLE = "GODEL_INSECURE"


class CredentialsError(Exception):
    """Credentials are missing, unreadable or not the cluster's; the message says which file."""


@dataclass(frozen=True)
class Identity:
    """Who is calling, as its certificate says."""

    name: str
    role: Role
    queues: tuple[str, ...] = ()
    """For a tenant: the queues it may submit to."""
    agent: str = ""
    """For a node agent: the agent (its ``--name``) the certificate was issued to."""
    nodes: tuple[str, ...] = ()
    """For a node agent: the nodes it serves, each a name or a prefix ending in ``*``."""

    def serves(self, node: str) -> bool:
        """Whether ``node`` is among the nodes this identity's certificate names."""
        return any(
            node.startswith(pattern[:-1]) if pattern.endswith("*") else node == pattern
            for pattern in self.nodes
        )


def agent_stem(agent: str) -> str:
    """The file stem of node agent ``agent``'s own certificate: ``nodeagent.<agent>``. No name
    `godel certs issue` accepts has a dot, so it never meets a tenant's or an admin's."""
    return f"{NODEAGENT}.{agent}"


@dataclass(frozen=True)
class Credentials:
    """What one party presents and trusts: the cluster CA, its certificate and key (PEM)."""

    ca: bytes
    certificate: bytes
    private_key: bytes

    def server(self) -> grpc.ServerCredentials:
        # Mutual TLS: a caller without a certificate of this cluster's CA fails the handshake.
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate)],
            root_certificates=self.ca,
            require_client_auth=True,
        )

    def channel(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.private_key, self.certificate)


@dataclass(frozen=True)
class CredentialFiles:
    """Where a party's credentials are on disk, for TLS stacks that take file names (the
    HTTPS servers of prometheus-client and uvicorn, stdlib ``ssl``)."""

    ca: Path
    certificate: Path
    private_key: Path


# ---------------------------------------------------------------------------------------------
# Loading and channels
# ---------------------------------------------------------------------------------------------


def load(directory: Path, stem: str) -> Credentials:
    """The CA and ``<stem>.crt`` / ``<stem>.key`` from ``directory``."""
    files = [directory / f"{CA}.crt", directory / f"{stem}.crt", directory / f"{stem}.key"]
    try:
        ca, certificate, key = (path.read_bytes() for path in files)
    except OSError as exc:
        raise CredentialsError(f"cannot read the cluster credentials: {exc}") from exc
    return Credentials(ca, certificate, key)


def files(directory: Path, stem: str) -> CredentialFiles:
    """The paths of the CA and ``<stem>.crt`` / ``<stem>.key`` in ``directory``, each checked
    readable now, so that a server fails at its start rather than at its first request."""
    found = CredentialFiles(
        directory / f"{CA}.crt", directory / f"{stem}.crt", directory / f"{stem}.key"
    )
    for path in (found.ca, found.certificate, found.private_key):
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise CredentialsError(f"cannot read the cluster credentials: {exc}") from exc
    return found


def is_loopback(host: str) -> bool:
    """Whether a bind host is reachable from this machine only: a loopback address or
    ``localhost``. Any other name counts as exposed, whatever it resolves to today."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def https_client_context(found: CredentialFiles) -> ssl.SSLContext:
    """A client's TLS context for the cluster's HTTPS endpoints: trusts only the cluster CA and
    presents ``found``'s certificate (the endpoints require one)."""
    context = ssl.create_default_context(cafile=str(found.ca))
    context.load_cert_chain(str(found.certificate), str(found.private_key))
    return context


def handshake_refusal(details: str) -> str | None:
    """What went wrong, when an UNAVAILABLE call's details say that the server was reached but
    the TLS handshake did not complete; None when the server was not reached at all.

    The services' mutual TLS (``require_client_auth``) refuses a client without a certificate
    of the cluster's CA inside the handshake, so gRPC reports UNAVAILABLE, not UNAUTHENTICATED:
    over TLS 1.3 the client has finished its side when the server checks the certificate, and
    all it sees is the server closing the connection ("Socket closed"), which a plaintext client
    sees too. A server that is down refuses the TCP connection instead ("Connection refused"),
    or does not answer (a deadline). When the client rejects the server — another cluster's
    CA — gRPC says "handshake failed"."""
    lowered = details.lower()
    if "failed to connect to all addresses" not in lowered:
        return None  # a connection that broke after it was up: the server went away
    if "handshake failed" in lowered:
        return "and these credentials are not of the same cluster: the TLS handshake failed"
    if "socket closed" in lowered:
        return "closed the connection during the TLS handshake: it requires a client certificate"
    return None


def aio_channel(
    address: str, credentials: Credentials | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    """An asyncio channel to ``address``: mutual TLS with ``credentials``, plaintext when None
    (insecure mode)."""
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    return grpc.aio.secure_channel(address, credentials.channel(), options=_tls_options(options))


def channel(
    address: str, credentials: Credentials | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """The blocking twin of :func:`aio_channel`."""
    if credentials is None:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, credentials.channel(), options=_tls_options(options))


def _tls_options(options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    # The server must hold the cluster's service certificate, whatever address it was dialled
    # at: a published port, a compose replica's container id, a port forward. Only the cluster
    # CA issues SERVICE_NAME, so this is as strict as checking the host, and never breaks on one.
    return [*options, ("grpc.ssl_target_name_override", SERVICE_NAME)]
