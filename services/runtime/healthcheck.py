"""A tiny gRPC health probe, for docker-compose healthchecks and the CLI (no Go binary needed).

    python -m services.runtime.healthcheck --addr HOST:PORT [--service NAME] [--timeout 2]
        [--tls-dir DIR] [--identity NAME] [--insecure]

exits 0 when the server (or the named service) is SERVING, 1 otherwise. It calls with the
cluster's credentials: ``--tls-dir`` (default ``$GODEL_TLS_DIR``, else ``$GODEL_HOME/tls``, else
``~/.godel/tls``) holding ``ca.crt`` and ``<identity>.crt/.key`` (default: the service identity, as
a container's healthcheck has it); ``--insecure`` (or ``GODEL_INSECURE=true``) for a plaintext
server.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from foundation import tls

SERVING = "SERVING"
UNREACHABLE = "UNREACHABLE"
TIMEOUT = "TIMEOUT"
UNAUTHENTICATED = "UNAUTHENTICATED"


def probe(
    address: str,
    service: str = "",
    timeout: float = 2.0,
    credentials: tls.Credentials | None = None,
) -> str:
    """One ``Health.Check``: the status name (``SERVING``, ``NOT_SERVING``, ``SERVICE_UNKNOWN``)
    or why there is none (``UNREACHABLE``, ``UNAUTHENTICATED`` — the TLS handshake refused these
    credentials —, ``TIMEOUT``, or another gRPC status code name).
    ``credentials`` None: plaintext, for a server started with --insecure."""
    with tls.channel(address, credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                # Reached, but the handshake refused these credentials: not a server that is down.
                refused = tls.handshake_refusal(exc.details() or "")
                return UNREACHABLE if refused is None else UNAUTHENTICATED
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return TIMEOUT
            if code == grpc.StatusCode.NOT_FOUND:  # the server does not know that service name
                return "SERVICE_UNKNOWN"
            return str(code.name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.runtime.healthcheck",
        description="Exit 0 if the gRPC server (or --service) reports SERVING, 1 otherwise.",
    )
    parser.add_argument("--addr", required=True, metavar="HOST:PORT", help="gRPC server address")
    parser.add_argument("--service", default="", help="service name; default: the whole server")
    parser.add_argument("--timeout", type=float, default=2.0, help="deadline in seconds")
    parser.add_argument(
        "--tls-dir", type=Path, default=None, help="the cluster's credentials (see above)"
    )
    parser.add_argument("--identity", default=tls.SERVICE, help="certificate to present")
    parser.add_argument(
        "--insecure",
        action="store_true",
        default=os.environ.get(tls.INSECURE_VARIABLE, "").lower() in ("1", "true", "yes", "on"),
        help="plaintext, for a server started with --insecure",
    )
    args = parser.parse_args(argv)
    credentials = None
    if not args.insecure:
        directory = args.tls_dir or _default_tls_dir()
        try:
            credentials = tls.load(directory, args.identity)
        except tls.CredentialsError as exc:
            print(f"{args.addr}: {exc}", file=sys.stderr)
            return 1
    status = probe(args.addr, args.service, args.timeout, credentials)
    print(f"{args.addr} {args.service or '(server)'}: {status}")
    return 0 if status == SERVING else 1


def _default_tls_dir() -> Path:
    if directory := os.environ.get(tls.TLS_DIR_VARIABLE):
        return Path(directory)
    return Path(os.environ.get("GODEL_HOME") or Path.home() / ".godel") / "tls"


if __name__ == "__main__":
    sys.exit(main())
