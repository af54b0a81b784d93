"""`godel get nodes -o wide`: the measured load columns (CPU-LOAD, NET-LOAD)."""

from __future__ import annotations

import pytest

from godel.cli.resources import _cpu_load, _network_load
from protos.godel.v1 import objects_pb2 as pb
from tests.factories import node


def _loaded(cpu: int, network: int, bandwidth: int) -> pb.Node:
    n = node("n", cpu=4000)
    n.status.load.CopyFrom(
        pb.NodeLoad(
            milli_cpu=cpu,
            network_bytes_per_second=network,
            network_capacity_bytes_per_second=bandwidth,
        )
    )
    return n


@pytest.mark.parametrize(
    ("obj", "cpu", "network"),
    [
        pytest.param(node("n"), "<none>", "<none>", id="no-report-yet"),
        pytest.param(_loaded(3000, 937_500_000, 1_250_000_000), "3 (75%)", "937.5MB/s (75%)"),
        pytest.param(_loaded(500, 1_500, 0), "500m (12%)", "1.5kB/s", id="bandwidth-unknown"),
        pytest.param(_loaded(0, 0, 10), "0 (0%)", "0B/s (0%)", id="idle"),
    ],
)
def test_load_columns(obj: pb.Node, cpu: str, network: str) -> None:
    assert (_cpu_load(obj), _network_load(obj)) == (cpu, network)
