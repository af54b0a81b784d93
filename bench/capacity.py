"""A capacity model: the throughput predicted for 1-8 scheduler shards on a machine with a core
for every process, from CPU measured on this one (issue 15 item 4).

    python -m bench CapacityModel-5000                  # one shard, then two, each on its own core
    python -m bench.capacity bench/results/CapacityModel-5000-<stamp>.json
    python -m bench.capacity REPORT.json --binder-micro  # also the Binder's planning alone

Inputs are a bench report holding a one-shard and a two-shard run of the same workload. For
each process the report gives CPU seconds over the measured phase; divided by the measured pods
that is its CPU per pod. Every service is one Python process and so runs on at most one core
(its event loop holds the GIL), so a process that spends ``c`` seconds per pod caps the whole
cluster at ``1 / c`` pods per second: the prediction for N shards is the smallest cap, and the
process holding it is the one that saturates first.

How each cost is carried from 1 and 2 shards to N (fitted, not assumed):

- **A shard** does two kinds of work. Some every shard does for every pod of the cluster
  (``a``: its informer and cache take in every bind); some only for the pods it schedules
  (``b``: the search, its messages). One shard costs ``a + b`` per pod; two together cost
  ``2a + b``. So ``a = s2 - s1`` and ``b = s1 - a``, and at N shards each shard spends
  ``a + b / N`` per cluster pod.
- **Every other process** (dispatcher, Binder leader, store, rescheduler) is one process at any
  shard count; what a second shard added to its cost per pod (more streams, more conflicts) is
  carried on linearly, never taken as a saving (noise could make it negative).
- **Node agents** are one per machine in production and so scale with the cluster: they count
  towards the cores needed, not the cap.

The one point checkable here (two cores): with each shard pinned to a core of its own
(``cluster.pin_shards`` in the workload), every process shares those two cores, so the
prediction for N shards on this machine is ``min(cap(N), cores / total CPU per pod(N))``. The
report prints that prediction for 2 shards against 1 beside what was measured.

``--binder-micro`` times the Binder's planning of decision batches (``BatchPlan``: the per-pod
checks, every hard rule per node, the cross-node rules, building the commit) on one core with no
I/O, the part of its work a leader must do itself (the rest is protocol and the store commit).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHARD = "scheduler"
SCALES_OUT = ("nodeagent",)
"""One per machine in production: never the bottleneck, but their cores count."""
CLIENT = ("load",)
"""The load generator is the users', not the cluster's."""


@dataclass(frozen=True)
class Measured:
    """CPU seconds per pod of each kind of process in one run, and its throughput."""

    shards: int
    cpu_per_pod: dict[str, float]
    """By kind: ``scheduler`` is every shard together; ``nodeagent`` every agent together."""
    pods_per_second: float


@dataclass(frozen=True)
class Prediction:
    shards: int
    pods_per_second: float
    saturates: str
    cores: float
    """Cores busy at that throughput (every process, node agents included)."""


@dataclass(frozen=True)
class Model:
    shard_every_pod: float
    """``a``: what each shard spends per pod of the cluster whatever it schedules."""
    shard_own_pod: float
    """``b``: what scheduling a pod costs the shard that schedules it."""
    base: dict[str, float]
    """Every other kind's CPU per pod at one shard."""
    per_extra_shard: dict[str, float]
    """What each further shard adds to that (never negative)."""

    @classmethod
    def fit(cls, one: Measured, two: Measured) -> Model:
        if (one.shards, two.shards) != (1, 2):
            raise ValueError(f"need runs with 1 and 2 shards (got {one.shards}, {two.shards})")
        s1, s2 = one.cpu_per_pod.get(SHARD, 0.0), two.cpu_per_pod.get(SHARD, 0.0)
        every = min(max(s2 - s1, 0.0), s1)
        others = (set(one.cpu_per_pod) | set(two.cpu_per_pod)) - {SHARD, *CLIENT}
        base = {k: one.cpu_per_pod.get(k, 0.0) for k in sorted(others)}
        extra = {k: max(two.cpu_per_pod.get(k, 0.0) - base[k], 0.0) for k in base}
        return cls(every, s1 - every, base, extra)

    def cost(self, kind: str, shards: int) -> float:
        """CPU seconds per cluster pod of one process of ``kind`` (one shard, for shards)."""
        if kind == SHARD:
            return self.shard_every_pod + self.shard_own_pod / shards
        return self.base[kind] + self.per_extra_shard[kind] * (shards - 1)

    def total(self, shards: int) -> float:
        """CPU seconds per pod of the whole cluster."""
        return shards * self.cost(SHARD, shards) + sum(self.cost(k, shards) for k in self.base)

    def predict(self, shards: int, cores: float | None = None) -> Prediction:
        """Throughput with a core for every process, or sharing ``cores`` when given."""
        caps = {
            k: 1.0 / c
            for k in (SHARD, *self.base)
            if k not in SCALES_OUT and (c := self.cost(k, shards)) > 0
        }
        saturates = min(caps, key=lambda k: caps[k])
        rate = caps[saturates]
        if cores is not None and cores / self.total(shards) < rate:
            rate, saturates = cores / self.total(shards), f"all {cores:g} cores"
        return Prediction(shards, rate, saturates, rate * self.total(shards))


def measured_runs(report: dict[str, Any]) -> list[Measured]:
    """Each run of a bench report as CPU per pod by kind of process."""
    out = []
    for run in report["runs"]:
        pods = run["measured_pods"]
        by_kind: dict[str, float] = {}
        for name, usage in run["resources"].items():
            kind = _kind(name)
            by_kind[kind] = by_kind.get(kind, 0.0) + usage["cpu_seconds"] / pods
        out.append(Measured(run["cluster"]["shards"], by_kind, run["throughput"]["average"]))
    return out


def _kind(process: str) -> str:
    """``scheduler-1`` -> ``scheduler``; ``binder-0`` -> ``binder``; ``store`` -> ``store``."""
    head, _, tail = process.rpartition("-")
    return head if head and tail.isdigit() else process


def render(model: Model, one: Measured, two: Measured, cores: int, micro: float | None) -> str:
    ms = 1000.0
    lines = [
        "| process | CPU ms per pod, 1 shard | 2 shards | model at N shards |",
        "|---|---|---|---|",
        f"| each shard | {one.cpu_per_pod.get(SHARD, 0) * ms:.3f} | "
        f"{two.cpu_per_pod.get(SHARD, 0) * ms / 2:.3f} | "
        f"{model.shard_every_pod * ms:.3f} + {model.shard_own_pod * ms:.3f} / N |",
    ]
    for kind in model.base:
        lines.append(
            f"| {kind} | {one.cpu_per_pod[kind] * ms:.3f} | "
            f"{two.cpu_per_pod.get(kind, 0) * ms:.3f} | "
            f"{model.base[kind] * ms:.3f} + {model.per_extra_shard[kind] * ms:.3f} × (N−1) |"
        )
    lines += [
        "",
        "| shards | predicted pods/s (a core per process) | saturates first | cores busy |",
        "|---|---|---|---|",
    ]
    for n in range(1, 9):
        p = model.predict(n)
        lines.append(f"| {n} | {p.pods_per_second:,.0f} | {p.saturates} | {p.cores:.1f} |")
    p1, p2 = model.predict(1, cores), model.predict(2, cores)
    lines += [
        "",
        f"On this machine ({cores} cores, shards pinned one per core):",
        "",
        "| | 1 shard | 2 shards | 2 vs 1 |",
        "|---|---|---|---|",
        f"| predicted pods/s | {p1.pods_per_second:,.0f} | {p2.pods_per_second:,.0f} | "
        f"{p2.pods_per_second / p1.pods_per_second:.2f}× |",
        f"| measured pods/s (avg) | {one.pods_per_second:,.0f} | {two.pods_per_second:,.0f} | "
        f"{two.pods_per_second / one.pods_per_second:.2f}× |",
    ]
    if micro is not None:
        lines += [
            "",
            f"Binder planning alone (`--binder-micro`): {micro * 1e6:.1f} µs per pod on one core "
            f"(a cap of {1 / micro:,.0f} pods/s if the leader did nothing else).",
        ]
    return "\n".join(lines)


def binder_plan_seconds_per_pod(nodes: int = 5000, pods: int = 20000, batch: int = 500) -> float:
    """CPU seconds per pod of ``BatchPlan`` (plan, run, ops) for batches of one-pod units of
    100m / 500 MiB on ``nodes`` empty hollow-shaped nodes, each batch's pods then taken in."""
    from placement.rules import hard_rules
    from protos.godel.v1 import internal_pb2 as ipb
    from protos.godel.v1 import objects_pb2 as pb
    from services.binder.decide import BatchPlan, bound_pod
    from services.binder.state import ClusterState

    state, rules = ClusterState(), hard_rules()
    for i in range(nodes):
        node = pb.Node(metadata=pb.ObjectMeta(name=f"node-{i:05d}"))
        node.metadata.labels.update({"hostname": node.metadata.name})
        a = node.status.allocatable
        a.milli_cpu, a.memory_bytes, a.pods = 4000, 32 << 30, 110
        node.status.ready = True
        state.on_add("Node", node)
    spent = 0.0
    for first in range(0, pods, batch):
        names = [f"p-{k}" for k in range(first, min(first + batch, pods))]
        found: dict[str, pb.Pod | None] = {}
        jobs: dict[str, pb.Job | None] = {}
        decisions = ipb.DecisionBatch(shard="micro", batch_id=first)
        for k, name in enumerate(names):
            pod = pb.Pod(metadata=pb.ObjectMeta(name=name, resource_version=1))
            pod.spec.job = f"j-{name}"
            pod.spec.template.requests.milli_cpu = 100
            pod.spec.template.requests.memory_bytes = 500 << 20
            found[name] = pod
            jobs[pod.spec.job] = pb.Job(metadata=pb.ObjectMeta(name=pod.spec.job))
            unit = decisions.units.add(job=pod.spec.job, min_member=1)
            unit.placements.add(
                pod=name, pod_resource_version=1, node=f"node-{(first + k) % nodes:05d}"
            )
        started = time.process_time()
        plan = BatchPlan(decisions, found, jobs, state, rules, {})
        plan.run()
        plan.ops()
        spent += time.process_time() - started
        for cand in plan.candidates.values():
            bound = bound_pod(
                cand.pod, cand.placement, "micro", plan.now_ms, cand.numa_nodes, cand.gpu_cards
            )
            state.on_add("Pod", bound)
    return spent / pods


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__)
    parser.add_argument("report", type=Path, help="a bench report with 1- and 2-shard runs")
    parser.add_argument("--cores", type=int, default=2, help="cores of the measuring machine")
    parser.add_argument("--binder-micro", action="store_true", help="time BatchPlan alone")
    opts = parser.parse_args(argv)
    try:
        runs = {m.shards: m for m in measured_runs(json.loads(opts.report.read_text()))}
        one, two = runs[1], runs[2]
    except (OSError, ValueError, KeyError) as exc:
        sys.stderr.write(
            f"error: {opts.report}: need a bench report with 1- and 2-shard runs "
            f"({type(exc).__name__}: {exc})\n"
        )
        return 2
    micro = binder_plan_seconds_per_pod() if opts.binder_micro else None
    sys.stdout.write(render(Model.fit(one, two), one, two, opts.cores, micro) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
