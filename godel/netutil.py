"""Small TCP helpers for starting local servers (store, gRPC services) on loopback."""

from __future__ import annotations

import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is unused right now on ``host``.

    The kernel picks it (bind to port 0). Another process may still take it before the caller
    binds, so servers started on it must fail loudly rather than silently share a port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


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
