"""Queue sort policies, fairness between queues and the quota arithmetic: pure, table-driven.
A queue's max (``placement.quotas``) is tested in tests/test_quotas.py."""

from __future__ import annotations

import pytest

from placement.resources import Quantities
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.api.validation import queue_cycles
from services.dispatcher.dispatching.queueing import (
    FAIRNESS,
    FifoPolicy,
    PendingUnit,
    PriorityPolicy,
    QueueLoad,
    dominant_share,
    less,
    next_queue,
    permille,
    policy_for,
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


def test_quantities() -> None:
    per_pod = pb.Resources(milli_cpu=100, memory_bytes=10, gpus=1, extended={"x": 2})
    total = Quantities.of_pod_request(pb.PodTemplate(requests=per_pod), 3)
    assert total == Quantities(300, 30, 3000, 3, {"x": 6})  # GPUs in milli-GPU
    acc = Quantities()
    acc.add(total)
    acc.add(total, -1)
    assert acc.is_zero() and acc.extended == {}


# ---------------------------------------------------------------------------------------------
# Fairness between queues: given usages and weights, which queue goes next
# ---------------------------------------------------------------------------------------------

CLUSTER = q(cpu=100_000, mem=400 * 2**30, gpus=8)

# (case, policy, [(queue, used, weight)], expected next queue)
FAIRNESS_CASES: list[tuple[str, str, list[tuple[str, Quantities, int]], str]] = [
    ("drf: smaller dominant share", "drf",
     [("a", q(cpu=50_000), 1), ("b", q(cpu=10_000), 1)], "b"),
    ("drf: memory can be the dominant resource", "drf",
     [("a", q(cpu=30_000), 1), ("b", q(cpu=1_000, mem=200 * 2**30), 1)], "a"),
    ("drf: gpus dominate", "drf",
     [("a", q(cpu=40_000), 1), ("b", q(gpus=4), 1)], "a"),
    ("drf: ignores weights", "drf",
     [("a", q(cpu=20_000), 9), ("b", q(cpu=10_000), 1)], "b"),
    ("drf: ties by name", "drf", [("b", q(cpu=5_000), 1), ("a", q(cpu=5_000), 1)], "a"),
    ("drf: an idle queue first", "drf", [("busy", q(cpu=1), 1), ("idle", q(), 1)], "idle"),
    ("fair-share: share per weight (3:1 at 60/30 -> 20 < 30)", "fair-share",
     [("heavy", q(cpu=60_000), 3), ("light", q(cpu=30_000), 1)], "heavy"),
    ("fair-share: at 3:1 exactly, ties by name", "fair-share",
     [("heavy", q(cpu=75_000), 3), ("light", q(cpu=25_000), 1)], "heavy"),
    ("fair-share: past 3:1 the light queue", "fair-share",
     [("heavy", q(cpu=76_000), 3), ("light", q(cpu=24_000), 1)], "light"),
    ("fair-share: weight 0 counts as 1", "fair-share",
     [("a", q(cpu=10_000), 0), ("b", q(cpu=15_000), 1)], "a"),
    ("round-robin: shares do not matter, ties by name", "round-robin",
     [("b", q(), 1), ("a", q(cpu=90_000), 1)], "a"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "loads", "expected"),
    [c[1:] for c in FAIRNESS_CASES],
    ids=[c[0] for c in FAIRNESS_CASES],
)
def test_next_queue(policy: str, loads: list[tuple[str, Quantities, int]], expected: str) -> None:
    got = next_queue([QueueLoad(n, used, w) for n, used, w in loads], CLUSTER, FAIRNESS[policy])
    assert got == expected


# (case, used, capacity, dominant share in thousandths)
SHARE_CASES: list[tuple[str, Quantities, Quantities, int]] = [
    ("nothing used", q(), CLUSTER, 0),
    ("cpu", q(cpu=25_000), CLUSTER, 250),
    ("the largest resource", q(cpu=10_000, mem=300 * 2**30), CLUSTER, 750),
    ("a resource the cluster lacks does not count", q(cpu=10_000, gpus=2), q(cpu=100_000), 100),
    ("rounded down", q(cpu=1), CLUSTER, 0),
    ("all of it", CLUSTER, CLUSTER, 1000),
]  # fmt: skip


@pytest.mark.parametrize(
    ("used", "capacity", "expected"),
    [c[1:] for c in SHARE_CASES],
    ids=[c[0] for c in SHARE_CASES],
)
def test_dominant_share(used: Quantities, capacity: Quantities, expected: int) -> None:
    assert permille(dominant_share(used, capacity)) == expected


# (case, amount, floor, beyond)
BEYOND_CASES: list[tuple[str, Quantities, Quantities, Quantities]] = [
    ("below the floor: nothing borrowed", q(cpu=10), q(cpu=20), q()),
    ("per resource", q(cpu=30, mem=5), q(cpu=20, mem=10), q(cpu=10)),
    ("no floor: all of it", q(cpu=30, pods=2), q(), q(cpu=30, pods=2)),
    ("extended", q(fpga=3), q(fpga=1), q(fpga=2)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("amount", "floor", "expected"),
    [c[1:] for c in BEYOND_CASES],
    ids=[c[0] for c in BEYOND_CASES],
)
def test_beyond(amount: Quantities, floor: Quantities, expected: Quantities) -> None:
    assert amount.beyond(floor) == expected


# (case, parents {queue: parent}, queues in a cycle)
CYCLE_CASES: list[tuple[str, dict[str, str], set[str]]] = [
    ("no parents", {"a": "", "b": ""}, set()),
    ("a tree", {"org": "", "a": "org", "b": "org", "c": "a"}, set()),
    ("two queues", {"a": "b", "b": "a"}, {"a", "b"}),
    ("three, and one hanging off it", {"a": "b", "b": "c", "c": "a", "d": "a"}, {"a", "b", "c"}),
    ("a parent not (yet) known", {"a": "ghost"}, set()),
]  # fmt: skip


@pytest.mark.parametrize(
    ("parents", "expected"), [c[1:] for c in CYCLE_CASES], ids=[c[0] for c in CYCLE_CASES]
)
def test_queue_cycles(parents: dict[str, str], expected: set[str]) -> None:
    assert set(queue_cycles(parents)) == expected


Q = Quantities


@pytest.mark.parametrize(
    ("ask", "room", "fits"),
    [
        (Q(100, 10, 0, 1), Q(100, 10, 0, 1), True),  # exactly
        (Q(101, 10, 0, 1), Q(100, 10, 0, 1), False),  # cpu over
        (Q(100, 11, 0, 1), Q(100, 10, 0, 1), False),  # memory over
        (Q(0, 0, 1, 0), Q(100, 10, 0, 1), False),  # a gpu where there is none
        (Q(100, 10, 0, 2), Q(100, 10, 0, 1), False),  # pod slots over
        (Q(100, 0, 0, 0), Q(100, -5, -1, -1), True),  # what is not asked is not judged
        (Q(100, extended={"x": 1}), Q(100, extended={"x": 1}), True),
        (Q(100, extended={"x": 2}), Q(100, extended={"x": 1}), False),
        (Q(100), Q(100, extended={"x": 1}), True),  # room of a kind not asked for
    ],
)
def test_fits_in(ask: Quantities, room: Quantities, fits: bool) -> None:
    assert ask.fits_in(room) is fits
