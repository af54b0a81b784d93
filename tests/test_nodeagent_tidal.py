"""Tidal best-effort capacity, table by table: the usage curve, the reclaimable pool, which
best-effort pods give way, and when a pool is worth writing."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from protos.godel.v1 import objects_pb2 as pb
from services.nodeagent.tidal import (
    ProcessUsage,
    Usage,
    UsageCurve,
    hollow_usage,
    pool_moved,
    pressure_victims,
    reclaimable_pool,
)

DAY = 86_400
HOUR = 3_600


@pytest.mark.parametrize(
    ("text", "seconds", "expected"),
    [
        ("0=50", 12 * HOUR, 50),  # one point: flat
        ("0=20,12=80", 6 * HOUR, 50),  # halfway up
        ("0=20,12=80", 12 * HOUR, 80),
        ("0=20,12=80", 18 * HOUR, 50),  # back down towards midnight's 20
        ("6=20,18=80", 0, 50),  # wraps over midnight: 18h→80 … 6h→20, midnight halfway
        ("6=20,18=80", DAY + 6 * HOUR, 20),  # every day the same
    ],
)
def test_curve_percent_at(text: str, seconds: float, expected: float) -> None:
    assert UsageCurve.parse(text).percent_at(seconds) == pytest.approx(expected)


def test_curve_period_compresses_the_day() -> None:
    curve = UsageCurve.parse("0=0,12=100", period_seconds=60)
    assert curve.percent_at(30) == pytest.approx(100)  # 30 s of 60: noon
    assert curve.percent_at(75) == pytest.approx(50)  # 15 s into the next "day": 6 h


@pytest.mark.parametrize(
    ("text", "period", "error"),
    [
        ("", DAY, "no points"),
        ("noon=5", DAY, "expected hour=percent"),
        ("12", DAY, "expected hour=percent"),
        ("24=5", DAY, "within 0..24"),
        ("3=101", DAY, "within 0..100"),
        ("3=5,3=6", DAY, "given twice"),
        ("3=5", 0, "above 0 seconds"),
    ],
)
def test_curve_rejects(text: str, period: float, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        UsageCurve.parse(text, period)


def pod(name: str, cpu: int, mem: int = 0, priority: int = 0, started_ms: int = 1) -> pb.Pod:
    p = pb.Pod(metadata=pb.ObjectMeta(name=name))
    p.spec.template.requests.milli_cpu = cpu
    p.spec.template.requests.memory_bytes = mem
    p.spec.priority = priority
    p.status.started_ms = started_ms
    return p


def test_hollow_usage_is_the_curve_share_of_requests() -> None:
    assert hollow_usage([pod("a", 1000, 100), pod("b", 3000, 300)], 50) == Usage(2000, 200)
    assert hollow_usage([], 90) == Usage(0, 0)


@pytest.mark.parametrize(
    ("usage", "reserve", "expected"),
    [
        (Usage(0, 0), 10, (7200, 900)),
        (Usage(2000, 100), 10, (5200, 800)),
        (Usage(8000, 0), 0, (0, 1000)),
        (Usage(9000, 2000), 10, (0, 0)),  # online over the node: nothing, never negative
    ],
)
def test_reclaimable_pool(usage: Usage, reserve: int, expected: tuple[int, int]) -> None:
    node = pb.Resources(milli_cpu=8000, memory_bytes=1000)
    pool = reclaimable_pool(node, usage, reserve, gpus=0)
    assert (pool.milli_cpu, pool.memory_bytes) == expected


@pytest.mark.parametrize(
    ("pods", "pool", "expected"),
    [
        # Everything fits: nobody goes.
        ([pod("a", 1000), pod("b", 1000)], (2000, 0), []),
        # Lowest priority first, however large.
        ([pod("hi", 1000, priority=5), pod("lo", 1000, priority=1)], (1500, 0), ["lo"]),
        # Among equals, the most recently started first.
        ([pod("old", 1000, started_ms=1), pod("new", 1000, started_ms=9)], (1000, 0), ["new"]),
        # As many as it takes, in that order.
        (
            [pod("a", 1000, priority=1), pod("b", 1000, priority=2), pod("c", 1000, priority=3)],
            (1000, 0),
            ["a", "b"],
        ),
        # Memory counts too.
        ([pod("a", 100, 600), pod("b", 100, 600, priority=1)], (5000, 1000), ["a"]),
        # An empty pool: all of them.
        ([pod("a", 1), pod("b", 1)], (0, 0), ["a", "b"]),
    ],
)
def test_pressure_victims(pods: list[pb.Pod], pool: tuple[int, int], expected: list[str]) -> None:
    got = pressure_victims(pods, pb.Resources(milli_cpu=pool[0], memory_bytes=pool[1]))
    assert [p.metadata.name for p in got] == expected


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ((4000, 500), (4000, 500), False),
        ((4000, 500), (4100, 500), False),  # 1 % of the node's cpu
        ((4000, 500), (4200, 500), True),  # 2 %
        ((4000, 500), (4000, 480), True),  # 2 % of its memory
    ],
)
def test_pool_moved(old: tuple[int, int], new: tuple[int, int], expected: bool) -> None:
    node = pb.Resources(milli_cpu=10_000, memory_bytes=1000)
    a = pb.Resources(milli_cpu=old[0], memory_bytes=old[1])
    b = pb.Resources(milli_cpu=new[0], memory_bytes=new[1])
    assert pool_moved(a, b, node, 2) is expected


def test_process_usage_measures_the_pod_process_tree() -> None:
    """A real process (with a child) is measured; a pod without a process counts as hollow."""
    busy = "import subprocess, sys, time; c = subprocess.Popen(['sleep', '30']); t = time.time()\nwhile time.time() - t < 30: pass"
    proc = subprocess.Popen([sys.executable, "-c", busy])
    try:
        # Measured too soon, the child is still between fork and exec (a few KiB of RSS): wait
        # until it runs Python (a CI flake measured 4 KiB).
        deadline = time.monotonic() + 30
        while psutil.Process(proc.pid).memory_info().rss <= 1 << 20:
            assert time.monotonic() < deadline, "the measured process never started"
            time.sleep(0.05)
        pids = {"real": proc.pid}
        measure = ProcessUsage(pids.get)
        pods = [pod("real", 1000, 1 << 30), pod("simulated", 2000, 1000)]
        first = measure(pods, 50)
        assert first.memory_bytes > 500 + (1 << 20)  # the simulated half plus a real RSS
        time.sleep(0.5)
        second = measure(pods, 50)
        # The simulated pod adds half its request; the busy loop used some CPU since the first
        # measurement (how much depends on the machine's load).
        assert second.milli_cpu > 1000
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
