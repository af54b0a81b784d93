"""The names a certificate carries, read from its DER (RFC 5280) with the standard library only:
the identity a verified certificate names (``identity_of``) and whether it names an address
(``names_address``). What every server reads on each call and at start, without
``cryptography``: that package (~9 MiB of a process's resident set, its Rust library and the
modules that wrap it) is for making certificates (``foundation.pki``: `godel up`, `godel
certs`), which no service does.

The certificates read here are the cluster's own: a caller's was verified against the cluster
CA by the TLS handshake before a handler sees it, and a service reads its own from its
credentials directory. The reader still checks every length and tag it walks and refuses
anything else with a ``ValueError``, as ``cryptography``'s parser would.
"""

from __future__ import annotations

import base64
import binascii
import functools
import ipaddress
import re
from collections.abc import Iterator

from foundation.tls import (
    AGENT_URI_PREFIX,
    NODE_URI_PREFIX,
    QUEUE_URI_PREFIX,
    ROLES,
    CredentialsError,
    Identity,
)

# DER tags (X.690): universal ones, and the context-specific ones of the fields read here.
_SEQUENCE = 0x30
_SET = 0x31
_OID = 0x06
_BOOLEAN = 0x01
_OCTET_STRING = 0x04
_INTEGER = 0x02
_VERSION = 0xA0  # TBSCertificate's [0] EXPLICIT version
_EXTENSIONS = 0xA3  # TBSCertificate's [3] EXPLICIT extensions
_SAN_DNS = 0x82  # GeneralName dNSName [2] IA5String
_SAN_URI = 0x86  # GeneralName uniformResourceIdentifier [6] IA5String
_SAN_IP = 0x87  # GeneralName iPAddress [7] OCTET STRING
# String types a name's attribute may have, and how each is decoded.
_STRINGS = {
    0x0C: "utf-8",  # UTF8String
    0x13: "ascii",  # PrintableString
    0x16: "ascii",  # IA5String
    0x14: "latin-1",  # TeletexString, as OpenSSL reads it
    0x1E: "utf-16-be",  # BMPString
    0x1C: "utf-32-be",  # UniversalString
}
_COMMON_NAME = bytes.fromhex("550403")  # 2.5.4.3
_ORGANIZATIONAL_UNIT = bytes.fromhex("55040b")  # 2.5.4.11
_SUBJECT_ALT_NAME = bytes.fromhex("551d11")  # 2.5.29.17
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL)


class _Reader:
    """One DER element after another from ``data[at:end]``."""

    def __init__(self, data: bytes, at: int = 0, end: int | None = None) -> None:
        self.data = data
        self.at = at
        self.end = len(data) if end is None else end

    def done(self) -> bool:
        return self.at >= self.end

    def peek(self) -> int:
        if self.at >= self.end:
            raise ValueError("certificate: truncated")
        return self.data[self.at]

    def element(self, tag: int | None = None) -> tuple[int, int, int]:
        """The next element: its tag and where its contents start and end."""
        got = self.peek()
        if tag is not None and got != tag:
            raise ValueError(f"certificate: tag {got:#04x} where {tag:#04x} belongs")
        if got & 0x1F == 0x1F:
            raise ValueError("certificate: a multi-byte tag")
        at = self.at + 1
        if at >= self.end:
            raise ValueError("certificate: truncated")
        length = self.data[at]
        at += 1
        if length & 0x80:
            count = length & 0x7F
            if count == 0 or count > 4 or at + count > self.end:
                raise ValueError("certificate: a length DER does not allow")
            length = int.from_bytes(self.data[at : at + count], "big")
            at += count
        if at + length > self.end:
            raise ValueError("certificate: an element runs past its container")
        self.at = at + length
        return got, at, at + length

    def inside(self, tag: int) -> _Reader:
        """A reader of the next element's contents (which must have ``tag``)."""
        _, start, end = self.element(tag)
        return _Reader(self.data, start, end)

    def skip(self) -> None:
        self.element()

    def contents(self, tag: int | None = None) -> tuple[int, bytes]:
        got, start, end = self.element(tag)
        return got, self.data[start:end]


def _der_of(pem: bytes) -> bytes:
    found = _PEM.search(pem)
    if found is None:
        raise ValueError("certificate: no PEM certificate block")
    try:
        return base64.b64decode(b"".join(found.group(1).split()), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"certificate: the PEM block is not base64: {exc}") from None


def _tbs(der: bytes) -> _Reader:
    """The TBSCertificate, positioned at its subject (version, serial, signature algorithm,
    issuer and validity skipped)."""
    certificate = _Reader(der).inside(_SEQUENCE)
    tbs = certificate.inside(_SEQUENCE)
    if tbs.peek() == _VERSION:
        tbs.skip()
    tbs.element(_INTEGER)  # serial number
    tbs.element(_SEQUENCE)  # signature algorithm
    tbs.element(_SEQUENCE)  # issuer
    tbs.element(_SEQUENCE)  # validity
    return tbs


def _string(tag: int, value: bytes) -> str:
    encoding = _STRINGS.get(tag)
    if encoding is None:
        raise ValueError(f"certificate: a name attribute of string type {tag:#04x}")
    try:
        return value.decode(encoding)
    except UnicodeDecodeError as exc:
        raise ValueError(f"certificate: a name attribute that is not {encoding}") from exc


def _attributes(name: _Reader) -> Iterator[tuple[bytes, str]]:
    """A Name's (type, value) pairs in order: each relative name's attributes in turn."""
    while not name.done():
        rdn = name.inside(_SET)
        while not rdn.done():
            pair = rdn.inside(_SEQUENCE)
            _, oid = pair.contents(_OID)
            tag, value = pair.contents()
            yield oid, _string(tag, value)


def _alt_names(tbs: _Reader) -> list[tuple[int, bytes]] | None:
    """The subject alternative names (tag, value) in order; None when there is no such
    extension. A certificate with two is refused, as ``cryptography`` refuses it."""
    tbs.element(_SEQUENCE)  # subject public key info
    found: list[tuple[int, bytes]] | None = None
    while not tbs.done():
        tag = tbs.peek()
        if tag != _EXTENSIONS:
            tbs.skip()  # issuer / subject unique ids
            continue
        extensions = tbs.inside(_EXTENSIONS).inside(_SEQUENCE)
        while not extensions.done():
            extension = extensions.inside(_SEQUENCE)
            _, oid = extension.contents(_OID)
            if extension.peek() == _BOOLEAN:
                extension.skip()  # critical
            _, value = extension.contents(_OCTET_STRING)
            if oid != _SUBJECT_ALT_NAME:
                continue
            if found is not None:
                raise ValueError("certificate: two subject alternative name extensions")
            names = _Reader(value).inside(_SEQUENCE)
            found = []
            while not names.done():
                found.append(names.contents())
    return found


def _ia5(value: bytes) -> str:
    try:
        return value.decode("ascii")
    except UnicodeDecodeError as exc:
        raise ValueError("certificate: an alternative name that is not IA5 (ASCII)") from exc


@functools.lru_cache(maxsize=1024)
def identity_of(pem: bytes) -> Identity:
    """The identity a (verified) certificate names: its subject's first common name and first
    organizational unit (the role), the queues, agent and nodes its URIs name. Cached: every
    call of a connection carries the same certificate, and reading it each time would cost the
    hot path."""
    tbs = _tbs(_der_of(pem))
    names: list[str] = []
    units: list[str] = []
    for oid, value in _attributes(tbs.inside(_SEQUENCE)):
        if oid == _COMMON_NAME:
            names.append(value)
        elif oid == _ORGANIZATIONAL_UNIT:
            units.append(value)
    name = names[0] if names else ""
    role = units[0] if units else ""
    if role not in ROLES:
        raise CredentialsError(f"certificate of {name!r} names no role (service, admin, tenant)")
    uris = [_ia5(v) for tag, v in _alt_names(tbs) or () if tag == _SAN_URI]
    queues = tuple(u[len(QUEUE_URI_PREFIX) :] for u in uris if u.startswith(QUEUE_URI_PREFIX))
    agents = [u[len(AGENT_URI_PREFIX) :] for u in uris if u.startswith(AGENT_URI_PREFIX)]
    nodes = tuple(u[len(NODE_URI_PREFIX) :] for u in uris if u.startswith(NODE_URI_PREFIX))
    if len(agents) > 1:
        raise CredentialsError(f"certificate of {name!r} names {len(agents)} agents, not one")
    return Identity(name, role, queues, agents[0] if agents else "", nodes)


def names_address(pem: bytes, address: str) -> bool:
    """Whether a certificate names the host of ``address`` (``host:port``, ``[v6]:port`` or a
    bare host) among its subject alternative names, as a client that verifies the host checks."""
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or "]:" in address else address
    host = host.strip("[]")
    tbs = _tbs(_der_of(pem))
    tbs.element(_SEQUENCE)  # subject
    alt = _alt_names(tbs)
    if alt is None:
        return False
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host.lower() in (_ia5(v).lower() for tag, v in alt if tag == _SAN_DNS)
    return any(
        tag == _SAN_IP and len(v) in (4, 16) and ipaddress.ip_address(v) == ip for tag, v in alt
    )
