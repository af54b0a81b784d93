"""A workload's ``reservations:`` (bench/workload.py): parsed into one Reservation per node for a
job that never comes, and each mistake named by file and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import workload
from bench.workload import WorkloadError
from protos.godel.v1 import objects_pb2 as pb
from tests.test_bench import _with

HELD = {"count": 3, "template": {"requests": {"cpu": "1", "memory": "4Gi"}}, "ttl_seconds": 60}


def test_reservations_are_one_per_node_for_a_job_that_never_comes() -> None:
    [run] = workload.parse(_with("reservations", HELD), Path("w.yaml")).runs
    assert run.reservations is not None
    made = run.reservations.manifests(["n0", "n1", "n2", "n3"])
    assert [(r.metadata.name, r.spec.node, r.spec.owner.job) for r in made] == [
        ("bench-reserved-0", "n0", "bench-reserved-0"),
        ("bench-reserved-1", "n1", "bench-reserved-1"),
        ("bench-reserved-2", "n2", "bench-reserved-2"),
    ]
    assert made[0].spec.ttl_seconds == 60
    assert made[0].spec.template.requests == pb.Resources(milli_cpu=1000, memory_bytes=4 << 30)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({**HELD, "count": 11}, "reservations.count: one per node; 10 nodes, got 11"),
        ({**HELD, "count": 0}, "reservations.count: must be at least 1"),
        ({**HELD, "ttl_seconds": 0}, "reservations.ttl_seconds: must be at least 1"),
        (
            {**HELD, "template": {"requests": {"cpu": "x"}}},
            "reservations.template.requests.cpu",
        ),
        ({**HELD, "node": "n1"}, "reservations.node: unknown field"),
    ],
)
def test_bad_reservations_name_file_and_field(value: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkloadError) as err:
        workload.parse(_with("reservations", value), Path("w.yaml"))
    assert "w.yaml" in str(err.value) and message in str(err.value)
