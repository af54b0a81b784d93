"""Small TCP helpers for starting local servers (store, gRPC services) on loopback."""

from __future__ import annotations

import contextlib
import random
import socket
import time
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_STABLE_PORTS_FROM = 10_000


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is unused right now on ``host``.

    The kernel picks it (bind to port 0). Another process may still take it before the caller
    binds, so servers started on it must fail loudly rather than silently share a port.
    """
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports unused right now on ``host``, for servers started together
    (a local cluster's services bind theirs a moment later).

    Chosen below the kernel's ephemeral range, as ``stable_free_port`` is: a port the kernel
    picked (bind to port 0) is one it also hands out as the local port of outgoing connections,
    so on a busy machine a connection could take it before its server binds it. All sockets stay
    bound until every port is chosen, so the ports are distinct. Falls back to the kernel's pick
    when nothing below the range is free."""
    low = _ephemeral_low()
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count * 20):
            if len(ports) == count:
                return ports
            port = random.randrange(_STABLE_PORTS_FROM, low)
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind((host, port))
            except OSError:
                continue
            ports.append(port)
        while len(ports) < count:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def stable_free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port *outside* the kernel's ephemeral range, for a server that must come
    back on the same port after a crash (the store). While such a server is down, its clients'
    reconnect attempts get local ports from the ephemeral range; on loopback one of them can be
    handed the server's own port and connect to itself, keeping the port busy so the restarted
    server cannot bind. A port below that range is never handed out that way."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(_STABLE_PORTS_FROM, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    return free_port(host)  # nothing free below the range: fall back rather than fail


def _ephemeral_low() -> int:
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    return max(low, _STABLE_PORTS_FROM + 1000)


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    """Poll until ``host:port`` accepts a TCP connection; False if ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        try:
            with socket.create_connection((host, port), timeout=min(remaining, 0.5)):
                return True
        except OSError:
            time.sleep(min(0.02, max(deadline - time.monotonic(), 0.0)))
