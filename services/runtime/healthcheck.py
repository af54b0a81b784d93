"""A tiny gRPC health probe, for docker-compose healthchecks and the CLI (no Go binary needed).

    python -m services.runtime.healthcheck --addr HOST:PORT [--service NAME] [--timeout 2]

exits 0 when the server (or the named service) is SERVING, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = "SERVING"
UNREACHABLE = "UNREACHABLE"
TIMEOUT = "TIMEOUT"


def probe(address: str, service: str = "", timeout: float = 2.0) -> str:
    """One ``Health.Check``: the status name (``SERVING``, ``NOT_SERVING``, ``SERVICE_UNKNOWN``)
    or why there is none (``UNREACHABLE``, ``TIMEOUT``, or another gRPC status code name)."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                return UNREACHABLE
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
    args = parser.parse_args(argv)
    status = probe(args.addr, args.service, args.timeout)
    print(f"{args.addr} {args.service or '(server)'}: {status}")
    return 0 if status == SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
