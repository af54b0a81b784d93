"""foundation.certnames reads a certificate's names without ``cryptography`` (issue 34, item 3:
~9 MiB of every service's resident set). Each certificate the cluster CA issues is read here
and by ``cryptography``'s parser, which must agree; malformed input is refused."""

from __future__ import annotations

import base64
import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from foundation import certnames, pki, tls
from foundation.tls import CredentialsError

Names = tuple[str, str, tuple[str, ...], str, tuple[str, ...]]


def _names_by_cryptography(pem: bytes) -> Names:
    """What the certificate names, read by cryptography (the reader certnames replaced)."""
    certificate = x509.load_pem_x509_certificate(pem)
    subject = certificate.subject
    names = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    units = subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    try:
        alt = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = alt.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []

    def after(prefix: str) -> tuple[str, ...]:
        return tuple(u.removeprefix(prefix) for u in uris if u.startswith(prefix))

    agents = after(tls.AGENT_URI_PREFIX)
    return (
        str(names[0].value),
        str(units[0].value),
        after(tls.QUEUE_URI_PREFIX),
        agents[0] if agents else "",
        after(tls.NODE_URI_PREFIX),
    )


def _names(pem: bytes) -> Names:
    identity = certnames.identity_of(pem)
    return identity.name, identity.role, identity.queues, identity.agent, identity.nodes


def test_every_certificate_the_cluster_ca_issues_reads_as_cryptography_reads_it(
    tmp_path: Path,
) -> None:
    hosts = ["dispatcher.example", "10.0.0.7", "fd00::17", "Mixed.Case.Host"]
    agents = {"rack-7": ["rack-7-a", "rack-7-b", "gpu-*"], "edge": ["edge.example.org"]}
    pki.init_cluster(tmp_path, hosts, agents=agents)
    pki.issue(tmp_path, "alice", "tenant", queues=["research", "default"])
    pki.issue(tmp_path, "bob", "tenant", queues=[f"q{i}" for i in range(40)])  # a long SAN
    stems = [p.stem for p in tmp_path.glob("*.crt") if p.stem != tls.CA]
    assert len(stems) >= 10
    for stem in stems:
        pem = (tmp_path / f"{stem}.crt").read_bytes()
        assert _names(pem) == _names_by_cryptography(pem), stem
    assert _names((tmp_path / "bob.crt").read_bytes())[2] == tuple(f"q{i}" for i in range(40))
    assert certnames.identity_of((tmp_path / "nodeagent.rack-7.crt").read_bytes()).serves("gpu-3")
    service = (tmp_path / "service.crt").read_bytes()
    for address, named in [
        ("dispatcher.example:50051", True),
        ("DISPATCHER.example:1", True),  # DNS names compare without case
        ("mixed.case.host", True),
        ("10.0.0.7:443", True),
        ("[fd00::17]:50051", True),
        ("fd00::17", True),
        ("10.0.0.8:443", False),
        ("[fd00::18]:1", False),
        ("elsewhere.example:1", False),
        (f"{tls.SERVICE_NAME}:1", True),
    ]:
        assert certnames.names_address(service, address) is named, address
    assert not certnames.names_address((tmp_path / "admin.crt").read_bytes(), "10.0.0.7:1")


def _self_signed(subject: x509.Name, alt: list[x509.GeneralName] | None) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if alt is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    certificate = builder.sign(key, hashes.SHA256())
    return certificate.public_bytes(serialization.Encoding.PEM)


def test_names_of_other_string_types_and_a_certificate_naming_no_role() -> None:
    printable = x509.Name(
        [
            x509.NameAttribute(
                NameOID.COMMON_NAME, "carol", _type=x509.name._ASN1Type.PrintableString
            ),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "tenant"),
        ]
    )
    pem = _self_signed(printable, [x509.UniformResourceIdentifier(tls.QUEUE_URI_PREFIX + "a")])
    assert _names(pem) == ("carol", "tenant", ("a",), "", ())
    no_role = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mallory")])
    with pytest.raises(CredentialsError, match="'mallory' names no role"):
        certnames.identity_of(_self_signed(no_role, [x509.DNSName("x")]))
    wrong_role = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "root"),
            x509.NameAttribute(NameOID.COMMON_NAME, "mallory"),
        ]
    )
    with pytest.raises(CredentialsError, match="names no role"):
        certnames.identity_of(_self_signed(wrong_role, None))
    assert not certnames.names_address(_self_signed(wrong_role, None), "127.0.0.1:1")
    two_agents = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "service"),
            x509.NameAttribute(NameOID.COMMON_NAME, "nodeagent"),
        ]
    )
    uris = [x509.UniformResourceIdentifier(tls.AGENT_URI_PREFIX + a) for a in ("a", "b")]
    with pytest.raises(CredentialsError, match="names 2 agents, not one"):
        certnames.identity_of(_self_signed(two_agents, uris))


def test_malformed_certificates_are_refused_with_a_value_error(tmp_path: Path) -> None:
    pki.init_cluster(tmp_path)
    pem = (tmp_path / "binder.crt").read_bytes()
    body = b"".join(pem.split(b"\n")[1:-2])
    der = base64.b64decode(body)

    def as_pem(data: bytes) -> bytes:
        text = base64.b64encode(data)
        return b"-----BEGIN CERTIFICATE-----\n" + text + b"\n-----END CERTIFICATE-----\n"

    bad = {
        "no block": b"not a certificate",
        "not base64": b"-----BEGIN CERTIFICATE-----\n%%%%\n-----END CERTIFICATE-----\n",
        "truncated": as_pem(der[: len(der) // 2]),
        "empty": as_pem(b""),
        "a longer length than the data": as_pem(der[:1] + b"\x84\xff\xff\xff\xff" + der[4:]),
        "not a sequence": as_pem(b"\x04" + der[1:]),
    }
    for what, pem_bytes in bad.items():
        with pytest.raises(ValueError):
            certnames.identity_of(pem_bytes)
        with pytest.raises(ValueError):
            certnames.names_address(pem_bytes, "127.0.0.1:1")
        assert what
