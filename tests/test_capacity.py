"""bench/capacity.py: the capacity model's fit and prediction (table tests, numbers chosen so
the answers are exact), the report reading, and bench.harness.pin_shards on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from bench import capacity
from bench.capacity import Measured, Model
from bench.harness import pin_shards

MS = 1e-3


def _measured(shards: int, rate: float = 1000.0, **ms: float) -> Measured:
    return Measured(shards, {k: v * MS for k, v in ms.items()}, rate)


@pytest.mark.parametrize(
    ("one", "two", "every", "own"),
    [
        # One shard 0.5 ms a pod; two together 0.6: each shard spends 0.1 on every pod of the
        # cluster and 0.4 on each pod it schedules.
        ({"scheduler": 0.5}, {"scheduler": 0.6}, 0.1, 0.4),
        # Two shards together cost what one did: the work divides perfectly.
        ({"scheduler": 0.5}, {"scheduler": 0.5}, 0.0, 0.5),
        # Noise below that is not a saving.
        ({"scheduler": 0.5}, {"scheduler": 0.45}, 0.0, 0.5),
        # Two cost twice one: nothing divides (every shard does all the work).
        ({"scheduler": 0.5}, {"scheduler": 1.0}, 0.5, 0.0),
        # More than twice is capped at "all of it is per cluster pod".
        ({"scheduler": 0.5}, {"scheduler": 1.5}, 0.5, 0.0),
    ],
)
def test_fit_splits_a_shards_cost_into_every_pod_and_own_pods(
    one: dict[str, float], two: dict[str, float], every: float, own: float
) -> None:
    model = Model.fit(_measured(1, **one), _measured(2, **two))
    assert model.shard_every_pod == pytest.approx(every * MS)
    assert model.shard_own_pod == pytest.approx(own * MS)


def test_fit_carries_what_a_second_shard_adds_to_the_others_never_a_saving() -> None:
    model = Model.fit(
        _measured(1, scheduler=0.5, binder=0.25, dispatcher=0.2, load=0.05),
        _measured(2, scheduler=0.6, binder=0.3, dispatcher=0.15, load=0.05),
    )
    assert model.base == pytest.approx({"binder": 0.25 * MS, "dispatcher": 0.2 * MS})
    assert model.per_extra_shard == pytest.approx({"binder": 0.05 * MS, "dispatcher": 0.0})
    assert model.cost("binder", 4) == pytest.approx(0.4 * MS)
    assert model.cost("scheduler", 4) == pytest.approx((0.1 + 0.4 / 4) * MS)


def test_fit_needs_one_and_two_shards() -> None:
    with pytest.raises(ValueError, match="1 and 2 shards"):
        Model.fit(_measured(2, scheduler=1.0), _measured(3, scheduler=1.0))


@pytest.mark.parametrize(
    ("shards", "rate", "saturates"),
    [
        # Shard: 0.1 + 0.9/N ms; binder 0.25 ms (cap 4,000/s); dispatcher 0.2 (5,000/s).
        (1, 1000.0, "scheduler"),  # 1 / 1.0 ms
        (2, 1000 / 0.55, "scheduler"),
        (3, 1000 / 0.4, "scheduler"),
        (6, 4000.0, "binder"),  # the shard's 0.25 ms ties; 8 shards: 0.2125 ms, binder first
        (8, 4000.0, "binder"),
    ],
)
def test_predict_with_a_core_per_process_is_the_smallest_cap(
    shards: int, rate: float, saturates: str
) -> None:
    model = Model(0.1 * MS, 0.9 * MS, {"binder": 0.25 * MS, "dispatcher": 0.2 * MS, "nodeagent": 2 * MS}, {"binder": 0.0, "dispatcher": 0.0, "nodeagent": 0.0})  # fmt: skip
    got = model.predict(shards)
    assert got.pods_per_second == pytest.approx(rate)
    if shards != 6:
        assert got.saturates == saturates
    # Node agents scale out with the machines: counted in cores, never the cap.
    assert got.cores == pytest.approx(rate * model.total(shards))


def test_predict_on_few_cores_is_bounded_by_the_total_cpu() -> None:
    model = Model(0.1 * MS, 0.9 * MS, {"binder": 0.5 * MS}, {"binder": 0.0})
    # Two cores: one shard takes 1.0 ms a pod (its own cap: 1,000/s), the cluster 1.5 ms in
    # all; two shards take 0.55 ms each (cap 1,818/s) and the cluster 1.6 ms: 2 cores / 1.6 ms.
    one, two = model.predict(1, cores=2), model.predict(2, cores=2)
    assert one.pods_per_second == pytest.approx(1000.0)  # the shard's own cap is lower
    assert two.pods_per_second == pytest.approx(2000 / 1.6)
    assert two.saturates == "all 2 cores"


def test_measured_runs_group_processes_by_kind() -> None:
    report: dict[str, Any] = {
        "runs": [
            {
                "measured_pods": 1000,
                "cluster": {"shards": 2},
                "throughput": {"average": 1234.0},
                "resources": {
                    "scheduler-0": {"cpu_seconds": 0.3},
                    "scheduler-1": {"cpu_seconds": 0.2},
                    "binder-0": {"cpu_seconds": 0.4},
                    "nodeagent-0": {"cpu_seconds": 0.1},
                    "nodeagent-1": {"cpu_seconds": 0.1},
                    "store": {"cpu_seconds": 0.25},
                },
            }
        ]
    }
    [run] = capacity.measured_runs(report)
    assert run.shards == 2 and run.pods_per_second == 1234.0
    assert run.cpu_per_pod == pytest.approx(
        {"scheduler": 0.5 * MS, "binder": 0.4 * MS, "nodeagent": 0.2 * MS, "store": 0.25 * MS}
    )


def test_binder_micro_measures_a_positive_cost_per_pod() -> None:
    assert capacity.binder_plan_seconds_per_pod(nodes=50, pods=200, batch=100) > 0


@dataclass
class _Component:
    name: str
    kind: str
    pid: int | None


@dataclass
class _State:
    components: list[_Component]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell them apart")
def test_pin_shards_puts_each_shard_with_all_its_threads_on_its_own_cpu() -> None:
    threads = (
        "import threading, time\n"
        "for _ in range(3): threading.Thread(target=time.sleep, args=(60,)).start()\n"
        "time.sleep(60)"
    )
    procs = [subprocess.Popen([sys.executable, "-c", threads]) for _ in range(3)]
    try:
        # The threads exist before the pinning (a service's gRPC threads do).
        for p in procs:
            while len(os.listdir(f"/proc/{p.pid}/task")) < 4:
                assert p.poll() is None
        state = _State(
            [
                _Component("scheduler-1", "scheduler", procs[1].pid),
                _Component("scheduler-0", "scheduler", procs[0].pid),
                _Component("binder-0", "binder", procs[2].pid),
            ]
        )
        cpus = sorted(os.sched_getaffinity(0))
        pinned = pin_shards(state)  # type: ignore[arg-type]
        assert pinned == {"scheduler-0": {cpus[0]}, "scheduler-1": {cpus[1]}}
        for proc, cpu in ((procs[0], cpus[0]), (procs[1], cpus[1])):
            for tid in os.listdir(f"/proc/{proc.pid}/task"):
                assert os.sched_getaffinity(int(tid)) == {cpu}
        assert os.sched_getaffinity(procs[2].pid) == set(cpus)  # not a shard: untouched
    finally:
        for p in procs:
            p.kill()
            p.wait()
