"""Queue sort policies and the quota check: pure, table-driven."""

from __future__ import annotations

import pytest

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.queueing import (
    FifoPolicy,
    PendingUnit,
    PriorityPolicy,
    Quantities,
    less,
    policy_for,
    quota_excess,
)


def unit(job: str, *, priority: int = 0, created: int = 0, seq: int = 0) -> PendingUnit:
    return PendingUnit(job, "q", priority=priority, created_ms=created, seq=seq)


ORDER_CASES: list[tuple[str, int, list[PendingUnit], list[str]]] = [
    ("fifo by creation time", pb.SORT_FIFO,
     [unit("b", created=2), unit("a", created=1), unit("c", created=3)], ["a", "b", "c"]),
    ("fifo ignores priority", pb.SORT_FIFO,
     [unit("low", created=1), unit("high", priority=100, created=2)], ["low", "high"]),
    ("fifo ties broken by arrival", pb.SORT_FIFO,
     [unit("second", created=5, seq=2), unit("first", created=5, seq=1)], ["first", "second"]),
    ("unspecified is fifo", pb.SORT_POLICY_UNSPECIFIED,
     [unit("late", created=9), unit("early", created=1)], ["early", "late"]),
    ("priority first", pb.SORT_PRIORITY,
     [unit("low", created=1), unit("high", priority=100, created=2)], ["high", "low"]),
    ("priority: negative last", pb.SORT_PRIORITY,
     [unit("neg", priority=-5), unit("zero"), unit("pos", priority=5)], ["pos", "zero", "neg"]),
    ("priority: fifo among equals", pb.SORT_PRIORITY,
     [unit("b", priority=3, created=2), unit("a", priority=3, created=1), unit("c", priority=1)],
     ["a", "b", "c"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "units", "expected"),
    [c[1:] for c in ORDER_CASES],
    ids=[c[0] for c in ORDER_CASES],
)
def test_order(policy: int, units: list[PendingUnit], expected: list[str]) -> None:
    assert [u.job for u in sorted(units, key=policy_for(policy).key)] == expected


def test_less_and_names() -> None:
    assert less(FifoPolicy(), unit("a", created=1), unit("b", created=2))
    assert not less(PriorityPolicy(), unit("a"), unit("b", priority=1))
    assert policy_for(pb.SORT_PRIORITY).name == "Priority"
    assert policy_for(3).name == "FIFO"  # the retired DRF value of queues stored before


def q(cpu: int = 0, mem: int = 0, gpus: int = 0, pods: int = 0, **ext: int) -> Quantities:
    return Quantities(cpu, mem, gpus, pods, dict(ext))


QUOTA_CASES: list[tuple[str, pb.Resources | None, Quantities, Quantities, str]] = [
    ("no quota", None, q(cpu=10**9), q(cpu=10**9), ""),
    ("empty quota is unlimited", pb.Resources(), q(cpu=5), q(cpu=5), ""),
    ("fits exactly", pb.Resources(milli_cpu=1000), q(cpu=600), q(cpu=400), ""),
    ("cpu over", pb.Resources(milli_cpu=1000), q(cpu=600), q(cpu=401), "cpu"),
    ("unset cpu unlimited, memory over", pb.Resources(memory_bytes=100), q(cpu=10**6, mem=50),
     q(mem=51), "memory"),
    ("gpus over", pb.Resources(gpus=2), q(gpus=2), q(gpus=1), "gpus"),
    ("pod count over", pb.Resources(pods=3), q(pods=2), q(pods=2), "pods"),
    ("extended over", pb.Resources(extended={"fpga": 1}), q(fpga=1), q(fpga=1), "fpga"),
    ("extended not requested", pb.Resources(extended={"fpga": 1}), q(fpga=1), q(cpu=1), ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("quota", "used", "request_", "expected"),
    [c[1:] for c in QUOTA_CASES],
    ids=[c[0] for c in QUOTA_CASES],
)
def test_quota(
    quota: pb.Resources | None, used: Quantities, request_: Quantities, expected: str
) -> None:
    assert quota_excess(quota, used, request_) == expected


def test_quantities() -> None:
    per_pod = pb.Resources(milli_cpu=100, memory_bytes=10, gpus=1, extended={"x": 2})
    total = Quantities.of_pod_request(per_pod, 3)
    assert total == Quantities(300, 30, 3, 3, {"x": 6})
    acc = Quantities()
    acc.add(total)
    acc.add(total, -1)
    assert acc.is_zero() and acc.extended == {}
