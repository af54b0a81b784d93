"""The cluster CA: creating it and issuing the certificates of services, the admin and tenants
(``cryptography``). The layout of a credentials directory and the meaning of a certificate's
subject are described in ``foundation.tls``, which uses them; this module is imported by what
makes certificates (`godel up`, `godel certs`), not by the servers nor by clients: reading the
identity a certificate names is ``foundation.certnames`` (re-exported here), which needs no
``cryptography``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Reading a certificate's names needs no cryptography (servers do it: foundation.certnames);
# re-exported here for what makes certificates and checks them.
from foundation.certnames import identity_of as identity_of
from foundation.certnames import names_address as names_address
from foundation.tls import (
    ADMIN,
    AGENT_URI_PREFIX,
    CA,
    NODE_URI_PREFIX,
    NODEAGENT,
    QUEUE_URI_PREFIX,
    ROLES,
    SERVICE,
    SERVICE_KINDS,
    SERVICE_NAME,
    SHARED_KINDS,
    CredentialsError,
    Role,
    agent_stem,
)

VALID_DAYS = 825  # the longest validity common TLS stacks accept for a leaf certificate
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A node's name as node agents make them (DNS names: hostnames keep their dots), or a prefix of
# one ending in '*'; never '*' alone, which would be every node of the cluster.
_NODE_PATTERN = re.compile(
    r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"  # a node's name
    r"|[a-z0-9][-a-z0-9.]{0,251}\*"  # a prefix of names
)


# ---------------------------------------------------------------------------------------------


def default_hosts() -> list[str]:
    """Where a local cluster's services may be dialled: loopback and this machine's name."""
    return ["127.0.0.1", "::1", "localhost", socket.gethostname()]


def init_cluster(
    directory: Path,
    hosts: Iterable[str] = (),
    cluster: str = "godel",
    agents: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """A fresh CA with the certificate of each shared service kind, the probes' service
    certificate, the admin's, and each of ``agents``' own (agent name → the nodes it serves,
    :func:`issue_agent`). A directory that already holds a CA keeps it and every certificate it
    has (so that restarting a cluster keeps its credentials); only the missing ones are issued,
    which brings a directory from an older release up to date, and an agent's is issued again
    when it names other nodes than asked. The one certificate all node agents shared before
    each had its own is removed: it names no agent and may evict nothing. Files are 0600.
    Returns the stems issued."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not (directory / f"{CA}.crt").exists():
        _new_ca(directory, cluster)
    service_hosts = [*default_hosts(), *hosts]
    wanted: list[tuple[str, str, Role]] = [
        (SERVICE, SERVICE_NAME, "service"),
        *((kind, kind, "service") for kind in SHARED_KINDS),
        (ADMIN, ADMIN, "admin"),
    ]
    issued = []
    for stem, name, role in wanted:
        if not (directory / f"{stem}.crt").exists():
            issue(
                directory, name, role, hosts=service_hosts if role == "service" else (), stem=stem
            )
            issued.append(stem)
    for suffix in (".crt", ".key"):
        (directory / f"{NODEAGENT}{suffix}").unlink(missing_ok=True)
    for agent, nodes in (agents or {}).items():
        if _agent_identity(directory, agent) != (agent, tuple(dict.fromkeys(nodes))):
            issue_agent(directory, agent, nodes, hosts=service_hosts)
            issued.append(agent_stem(agent))
    return issued


def _agent_identity(directory: Path, agent: str) -> tuple[str, tuple[str, ...]] | None:
    """The agent and nodes the certificate of ``agent`` in ``directory`` names, if it has one."""
    try:
        identity = identity_of((directory / f"{agent_stem(agent)}.crt").read_bytes())
    except (OSError, ValueError, CredentialsError):
        return None
    return identity.agent, identity.nodes


def reserved_names() -> tuple[str, ...]:
    """The identities `init_cluster` makes and only it may: the CA, the services' and the
    admin's (and ``nodeagent``, the kind whose agents each have their own). Issuing one by hand
    would replace it (``godel certs issue`` refuses them)."""
    return (CA, SERVICE, *SERVICE_KINDS, ADMIN)


def _new_ca(directory: Path, cluster: str) -> None:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{cluster} cluster CA")])
    now = _now()
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=10 * 365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    _write(directory, CA, ca, key)


def issue(
    directory: Path,
    name: str,
    role: Role,
    *,
    hosts: Sequence[str] = (),
    queues: Sequence[str] = (),
    stem: str | None = None,
) -> Path:
    """Sign a certificate for ``name`` in ``role`` with the CA in ``directory`` and write
    ``<stem>.crt`` / ``<stem>.key`` (stem: the name); returns the certificate's path."""
    if role not in ROLES:
        raise CredentialsError(f"role {role!r} is not one of {', '.join(ROLES)}")
    if (stem or name) == CA:
        # Written once, by _new_ca: a leaf under its name would replace the cluster's CA key.
        raise CredentialsError(f"{CA!r} names the cluster CA: no identity may be issued as it")
    for what, value in [("name", name), *(("queue", q) for q in queues)]:
        if not _NAME.match(value):
            raise CredentialsError(
                f"{what} {value!r} must be a DNS-1123 label (lowercase letters, digits, '-')"
            )
    uris = [QUEUE_URI_PREFIX + q for q in queues]
    return _sign(directory, name, role, hosts, uris, stem or name)


def issue_agent(
    directory: Path, agent: str, nodes: Sequence[str], *, hosts: Sequence[str] = ()
) -> Path:
    """Sign node agent ``agent``'s own certificate: the service kind ``nodeagent``, naming the
    agent and the ``nodes`` it serves (names, or prefixes ending in ``*``), so that it acts on
    those nodes only; its server names are the services' (it serves ``NodeAgent.Logs``).
    Written as ``nodeagent.<agent>.crt`` / ``.key`` (``tls.agent_stem``)."""
    if not _NAME.match(agent):
        raise CredentialsError(
            f"agent {agent!r} must be a DNS-1123 label (lowercase letters, digits, '-')"
        )
    if not nodes:
        raise CredentialsError(f"agent {agent!r}: name at least one node it serves")
    for node in nodes:
        if not _NODE_PATTERN.fullmatch(node):
            raise CredentialsError(
                f"node {node!r} must be a node's name (lowercase letters, digits, '-', '.') or "
                "such a prefix ending in '*', e.g. 'nodeagent-0-*'"
            )
    uris = [AGENT_URI_PREFIX + agent, *(NODE_URI_PREFIX + node for node in dict.fromkeys(nodes))]
    hosts = [*default_hosts(), *hosts]
    return _sign(directory, NODEAGENT, "service", hosts, uris, agent_stem(agent))


def _sign(
    directory: Path, name: str, role: Role, hosts: Sequence[str], uris: Sequence[str], stem: str
) -> Path:
    ca_cert, ca_key = _load_ca(directory)
    key = _new_key()
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
            x509.NameAttribute(NameOID.COMMON_NAME, name),
        ]
    )
    alt_names: list[x509.GeneralName] = []
    if role == "service":
        alt_names.append(x509.DNSName(SERVICE_NAME))
        for host in dict.fromkeys(hosts):
            try:
                alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                alt_names.append(x509.DNSName(host))
    alt_names += [x509.UniformResourceIdentifier(uri) for uri in uris]
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role == "service":
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    certificate = builder.sign(ca_key, hashes.SHA256())
    return _write(directory, stem, certificate, key)


def export_pkcs12(directory: Path, stem: str, password: bytes) -> bytes:
    """``<stem>.crt`` and ``.key`` with the cluster CA as one PKCS#12 bundle, encrypted with
    ``password``: the form browsers and OS key stores import a client identity in (to open a
    dashboard exposed with HTTPS). The CA rides along so that importers can show the chain."""
    if not password:
        raise CredentialsError("a PKCS#12 bundle needs a password: it holds a private key")
    try:
        ca = x509.load_pem_x509_certificate((directory / f"{CA}.crt").read_bytes())
        certificate = x509.load_pem_x509_certificate((directory / f"{stem}.crt").read_bytes())
        key = serialization.load_pem_private_key(
            (directory / f"{stem}.key").read_bytes(), password=None
        )
    except (OSError, ValueError) as exc:
        raise CredentialsError(f"cannot export {stem!r} from {directory}: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CredentialsError(f"{directory / (stem + '.key')} is not a key this CA issues")
    return pkcs12.serialize_key_and_certificates(
        stem.encode(), key, certificate, [ca], serialization.BestAvailableEncryption(password)
    )


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(directory: Path, stem: str, certificate: x509.Certificate, key: Any) -> Path:
    key_path = directory / f"{stem}.key"
    # Created 0600 from the start: the key is never readable by others, not even for a moment.
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    cert_path = directory / f"{stem}.crt"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    cert_path.chmod(0o600)
    return cert_path


def _load_ca(directory: Path) -> tuple[x509.Certificate, Any]:
    try:
        certificate = x509.load_pem_x509_certificate((directory / f"{CA}.crt").read_bytes())
        key = serialization.load_pem_private_key(
            (directory / f"{CA}.key").read_bytes(), password=None
        )
    except (OSError, ValueError) as exc:
        raise CredentialsError(f"cannot use the cluster CA in {directory}: {exc}") from exc
    return certificate, key
