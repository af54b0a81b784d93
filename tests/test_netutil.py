"""Ports for local servers: free, distinct, and never from the range the kernel hands to
outgoing connections (so no connection can take a port before its server binds it)."""

from __future__ import annotations

import socket

from foundation import netutil


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low = netutil._ephemeral_low()
    ports = netutil.free_ports(40)
    assert len(set(ports)) == 40
    for port in ports:
        assert netutil._STABLE_PORTS_FROM <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # free now: raises if not


def test_a_port_in_use_is_never_chosen() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", netutil.free_port()))
        taken = held.getsockname()[1]
        assert taken not in netutil.free_ports(200)
