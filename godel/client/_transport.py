"""What every client shares, sync or async: finding the cluster, the channel's options (message
sizes, retries), deadlines and turning a failed call into a typed ClientError.

Retries of UNAVAILABLE are gRPC's own retry policy, set through the channel's service config:
exponential backoff with jitter (gRPC randomises each delay in [0, backoff]), applied by the
channel to unary calls and to a stream until its first message. Nothing is retried by hand for
unary calls; a Watch that breaks mid-stream is resumed by the SDK from its last revision.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc

from foundation import tls
from foundation.retry import Backoff

MAX_MESSAGE_BYTES = 64 << 20
DEFAULT_TIMEOUT = 30.0
# gRPC caps maxAttempts at 5; with these backoffs a call rides out about 3 s of a restarting
# server before it reports Unavailable.
RETRY_POLICY: dict[str, Any] = {
    "maxAttempts": 5,
    "initialBackoff": "0.2s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
# Not the Rescheduler: a Trigger whose reply was lost has run its round, and running it again
# would move pods twice. The Dispatcher's writes are safe to resend: Submit by its request id,
# Apply is declarative; a resent Delete that had worked reports NotFound.
_SERVICES = ("godel.v1.Dispatcher", "godel.v1.NodeAgent")
SERVICE_CONFIG = json.dumps(
    {"methodConfig": [{"name": [{"service": s} for s in _SERVICES], "retryPolicy": RETRY_POLICY}]}
)
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 1),
    ("grpc.service_config", SERVICE_CONFIG),
]
# Addresses a program may be given, in the order they are looked at.
ADDRESS_VARIABLES = ("GODEL_ADDRESS", "GODEL_SERVER")


class ClosedOnExit:
    """``with`` support for a blocking client: the block's end calls ``close()``."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Violation:
    """One problem with one field of a request, e.g. ``jobs[0].spec.min_member``."""

    field: str
    description: str


class ClientError(Exception):
    """A call failed; ``code`` is the gRPC status code, the message says why."""

    stored: Sequence[str] = ()
    """A batch submit refused in part: the jobs of the batch that were stored nonetheless."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class NotFound(ClientError):
    """The object does not exist (NOT_FOUND)."""


class AlreadyExists(ClientError):
    """An object of that name exists and was not made by this request."""


class Invalid(ClientError):
    """The request was refused as it stands (INVALID_ARGUMENT, or a rejected manifest or job);
    ``violations`` says which fields are wrong and why."""

    def __init__(
        self, code: grpc.StatusCode, message: str, violations: list[Violation] | None = None
    ) -> None:
        super().__init__(code, message)
        self.violations = violations or []


class Unavailable(ClientError):
    """The cluster could not be reached, even after retrying."""


class Conflict(ClientError):
    """A compare-and-set lost: the object changed since the version the caller named (ABORTED)."""


class DeadlineExceeded(ClientError):
    """The call took longer than its deadline."""


class ClusterNotFound(Unavailable):
    """No address was given and none could be discovered, or no credentials for it."""


class Unauthenticated(ClientError):
    """The server did not accept the caller's credentials (UNAUTHENTICATED)."""


class PermissionDenied(ClientError):
    """The caller's identity may not do this (PERMISSION_DENIED); the message names the rule."""


_ERRORS: dict[grpc.StatusCode, type[ClientError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: Invalid,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.ABORTED: Conflict,
    grpc.StatusCode.FAILED_PRECONDITION: Conflict,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
}


def client_error(exc: grpc.RpcError, address: str, *, plaintext: bool = False) -> ClientError:
    """The typed error of a failed call (sync and aio errors alike). ``plaintext``: the call
    went without TLS (insecure mode), which a TLS server refuses the same way."""
    code: grpc.StatusCode = exc.code()
    details: str = exc.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE and (refusal := tls.handshake_refusal(details)):
        return Unauthenticated(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{address} {refusal}: {_credentials_hint(plaintext)} ({details})",
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        details = f"cannot reach {address}: {details}"
    return _ERRORS.get(code, ClientError)(code, details)


def _credentials_hint(plaintext: bool) -> str:
    if plaintext:
        return (
            "this client spoke plaintext (GODEL_INSECURE or --insecure), but the cluster serves "
            "mutual TLS; unset it to use the cluster's credentials"
        )
    if directory := os.environ.get(tls.TLS_DIR_VARIABLE):
        where = f"$GODEL_TLS_DIR ({directory})"
    else:
        from godel.local import home as local  # as discover_credentials: only when needed

        where = f"{local.GodelHome(local.default_home()).tls_dir} (or $GODEL_TLS_DIR)"
    identity = os.environ.get(tls.IDENTITY_VARIABLE) or tls.ADMIN
    return (
        "the cluster requires a client certificate signed by its own CA; the CLI and SDK "
        f"look for ca.crt, {identity}.crt and {identity}.key in "
        f"{where} (identity: $GODEL_IDENTITY, default admin); copy the cluster's there, or "
        "issue one with `godel certs issue`"
    )


def rejected(violations: list[Violation], what: str) -> ClientError:
    """The error for a request the server answered with field violations: AlreadyExists when a
    name clash is the only problem, else Invalid carrying every violation."""
    text = "; ".join(f"{v.field}: {v.description}" for v in violations)
    if all(v.description.startswith("AlreadyExists:") for v in violations):
        return AlreadyExists(grpc.StatusCode.ALREADY_EXISTS, f"{what}: {text}")
    return Invalid(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {text}", violations)


# Seconds before each reconnect of a broken stream: exponential, capped, with full jitter so that
# many watchers of a restarted server do not return in step.
RECONNECT_BACKOFF = Backoff(0.2, cap=5.0, jitter=True)


# ---------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------


def local_address(kind: str, home: Path | None = None) -> str:
    """Where the local cluster in ``home`` (default ``$GODEL_HOME``, else ``~/.godel``) serves
    ``kind`` ("dispatcher", "rescheduler", ...), from the cluster.json `godel up` wrote."""
    # Imported here: a program given an address never needs the local-cluster machinery.
    from godel.local import home as local

    godel_home = local.GodelHome(home or local.default_home())
    try:
        state = godel_home.load()
    except local.StateError as exc:
        raise ClusterNotFound(grpc.StatusCode.UNAVAILABLE, str(exc)) from None
    if state is None:
        raise ClusterNotFound(
            grpc.StatusCode.UNAVAILABLE,
            f"no cluster in {godel_home}: start one with `godel up`, or give its address "
            "(GODEL_ADDRESS)",
        )
    try:
        return state.address_of(kind)
    except KeyError as exc:
        raise ClusterNotFound(grpc.StatusCode.UNAVAILABLE, str(exc.args[0])) from None


def discover_credentials(home: Path | None = None) -> tls.Credentials | None:
    """The credentials to call the cluster with, found as the address is: ``$GODEL_TLS_DIR``
    (a directory holding ``ca.crt`` and the identity's certificate and key), else the
    ``tls/`` directory of ``home`` / ``$GODEL_HOME``. The identity is ``$GODEL_IDENTITY``
    (default ``admin``). None — plaintext — only when asked for by name: ``$GODEL_INSECURE``
    set to true, or a local cluster that `godel up --insecure` started."""
    if os.environ.get(tls.INSECURE_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on"):
        return None
    identity = os.environ.get(tls.IDENTITY_VARIABLE) or tls.ADMIN
    if directory := os.environ.get(tls.TLS_DIR_VARIABLE):
        return _load_credentials(Path(directory), identity)
    # Imported here, as in local_address: a program given its credentials never needs it.
    from godel.local import home as local

    godel_home = local.GodelHome(home or local.default_home())
    try:
        state = godel_home.load()
    except local.StateError:
        state = None
    if state is not None and state.insecure:
        return None
    if not (godel_home.tls_dir / f"{tls.CA}.crt").exists():
        raise ClusterNotFound(
            grpc.StatusCode.UNAVAILABLE,
            f"no cluster credentials: {godel_home.tls_dir} holds none and $GODEL_TLS_DIR is not "
            "set (`godel up` issues them; for compose, copy the certs volume and set "
            "GODEL_TLS_DIR; for a cluster started with --insecure, set GODEL_INSECURE=true)",
        )
    return _load_credentials(godel_home.tls_dir, identity)


def resolve_credentials(
    credentials: tls.Credentials | None, insecure: bool, home: Path | None
) -> tls.Credentials | None:
    """What a client uses: none when ``insecure`` (asked for by name), the ``credentials``
    given, else those :func:`discover_credentials` finds."""
    if insecure:
        return None
    if credentials is not None:
        return credentials
    return discover_credentials(home)


def _load_credentials(directory: Path, identity: str) -> tls.Credentials:
    try:
        return tls.load(directory, identity)
    except tls.CredentialsError as exc:
        raise ClusterNotFound(grpc.StatusCode.UNAVAILABLE, str(exc)) from None


def discover(address: str | None = None, *, home: Path | None = None) -> str:
    """The dispatcher's address: ``address`` if given, else ``$GODEL_ADDRESS`` or
    ``$GODEL_SERVER`` (what a compose deployment or a remote cluster sets), else the local
    cluster of ``home`` / ``$GODEL_HOME``."""
    if address:
        return address
    for variable in ADDRESS_VARIABLES:
        if value := os.environ.get(variable):
            return value
    return local_address("dispatcher", home)
