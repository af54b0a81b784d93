"""The openb trace replayed in time through the real services and node agents (issue 30 item 5,
the *time replay*), once without and once with the rescheduler's gpu-defrag on a period.

    python -m bench.gputrace_replay                  # the default trace, every GPU node, 10,000x
    python -m bench.gputrace_replay --quick          # 24 nodes, one day of the trace, in seconds
    python -m bench.gputrace_replay --speedup 2000 --defrag-period 21600
    python -m bench.gputrace_replay --nodes my_nodes.csv --pods my_pods.csv

Each run starts a fresh local cluster (``bench.gpucluster.trace_cluster``: the store, the
dispatcher, the shards, a Binder, the rescheduler, node agents serving the node file's nodes as
hollow nodes) and replays the pod file's tasks as one-pod jobs in creation order, on the trace's
clock divided by ``--speedup``: a task is submitted at its ``creation_time`` and its job deleted
at its ``deletion_time``. A task that cannot be placed stays pending and the shards retry it as
they do any pod (backoff, cluster events); while it waits its GPU request counts as pending
demand. Due tasks are submitted in one call per tick. A task the dispatcher refuses because no
node could ever hold it is counted ``refused`` and left out; a task whose deletion time equals
its creation time (it never ran) is skipped.

The window starts by default at the trace's first deletion: before it the trace only adds
tasks, a handful over months (the default trace: 33 of 8,152 in its first 115 days), so those
alive then are submitted at once, in creation order, and the clock starts; it ends at the last
deletion. ``--start``/``--end`` (trace seconds) choose another window.

The rescheduler's ``--config`` is written by the bench: the policy ``--policy`` (gpu-defrag) as
``services/rescheduler/default_policies.yaml`` defines it (whatever its detector, algorithm and
checks are today), with ``trigger: {period: ...}`` of ``--defrag-period`` trace seconds ÷ the
speedup in the *on* run and no trigger in the *off* run (nothing runs by itself).

Every ``--sample-every`` trace seconds the bench lists the stored pods and computes, from the
bound pods' nodes and cards (not from any service's figure): GPU allocation (% of capacity),
expected GPU fragmentation (the rescheduler's definition, ``bench.gpucluster.
expected_fragmentation_milli``; % of capacity, and % of the free GPU as the rescheduler
reports it), pending GPU demand (unbound pods of live jobs; % of capacity). The summary has the
time-weighted average of each over the window (trapezoids over trace time), the peaks, the
moved pods (replacements seen), and how late the replay ran behind the compressed clock.

Writes ``gputrace-replay-<stamp>.csv`` (a row per sample per run), ``…-summary.csv`` (a row per
run) and ``….png`` (three panels, both runs).
"""

from __future__ import annotations

import argparse
import csv
import heapq
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from itertools import pairwise
from pathlib import Path

import yaml

from bench.gpucluster import (
    TraceRunError,
    expected_fragmentation_milli,
    never_fits,
    spaced_nodes,
    stored_allocation,
    task_job,
    trace_cluster,
)
from bench.gputrace import (
    GPU_NODES,
    POD_LISTS,
    TimedPod,
    TraceError,
    TraceNode,
    load_nodes,
    load_timed_pods,
)
from godel import local
from godel.client import ClientError, ProtoClient
from placement.claims import holds_claim, is_terminal
from placement.gpufrag import MILLI_PER_GPU, TaskShape
from protos.godel.v1 import objects_pb2 as pb

DEFAULT_OUT = Path("bench/results")
DEFAULT_SPEEDUP = 10_000
DEFAULT_SAMPLE_EVERY = 3 * 3600  # trace seconds between samples
DEFAULT_DEFRAG_PERIOD = 6 * 3600  # trace seconds between gpu-defrag rounds in the "on" run
DEFAULT_POLICY = "gpu-defrag"
QUICK_NODES = 24
QUICK_WINDOW = 86_400  # one day of the trace
QUICK_SPEEDUP = 20_000
QUICK_SAMPLE_EVERY = 3600
QUICK_DEFRAG_PERIOD = 3 * 3600
SUBMIT_CHUNK = 500  # jobs per Submit call
MAX_NAP_SECONDS = 0.25  # the loop wakes at least this often
JOB_PREFIX = "r"
RUNS = ("defrag-off", "defrag-on")
SAMPLE_COLUMNS = (
    "run",
    "trace_seconds",
    "real_seconds",
    "allocated_pct",
    "fragmentation_pct",
    "fragmentation_of_free_pct",
    "pending_gpu_pct",
    "pending_gpus",
    "bound_pods",
    "pending_pods",
)
AVERAGED = ("allocated_pct", "fragmentation_pct", "fragmentation_of_free_pct", "pending_gpu_pct")
SUMMARY_COLUMNS = (
    "run",
    "nodes",
    "gpus",
    "speedup",
    "defrag_period_trace_seconds",
    "window_trace_seconds",
    "submitted",
    "refused",
    "skipped",
    "moved_pods",
    "samples",
    *(f"avg_{name}" for name in AVERAGED),
    "max_fragmentation_pct",
    "max_pending_gpu_pct",
    "max_lag_seconds",
    "real_seconds",
    "services_cpu_seconds",
)


@dataclass(frozen=True, slots=True)
class Sample:
    trace_seconds: float  # since the window's start
    real_seconds: float
    allocated_pct: float
    fragmentation_pct: float
    fragmentation_of_free_pct: float
    pending_gpu_pct: float
    pending_gpus: float
    bound_pods: int
    pending_pods: int

    def value(self, name: str) -> float:
        return float(getattr(self, name))


@dataclass(frozen=True, slots=True)
class Window:
    start: int
    end: int

    @property
    def seconds(self) -> int:
        return self.end - self.start


@dataclass
class ReplayRun:
    label: str
    defrag_period: int  # trace seconds; 0: no period
    samples: list[Sample] = field(default_factory=list)
    submitted: int = 0
    refused: int = 0
    skipped: int = 0
    moved: set[str] = field(default_factory=set)
    max_lag_seconds: float = 0.0
    real_seconds: float = 0.0
    cpu_seconds: float = 0.0  # the cluster's processes, over the replay (not their start)

    def average(self, name: str) -> float:
        return time_weighted_average([(s.trace_seconds, s.value(name)) for s in self.samples])


def time_weighted_average(points: Sequence[tuple[float, float]]) -> float:
    """The mean of a quantity over time from (time, value) samples: trapezoids between
    consecutive samples; one sample's value when they span no time."""
    if not points:
        return 0.0
    span = points[-1][0] - points[0][0]
    if span <= 0:
        return points[-1][1]
    area = sum((t1 - t0) * (v0 + v1) / 2 for (t0, v0), (t1, v1) in pairwise(points))
    return area / span


def default_window(pods: Sequence[TimedPod]) -> Window:
    """From the first deletion (before it the trace only adds tasks) to the last."""
    return Window(min(p.deleted for p in pods), max(p.deleted for p in pods))


def rescheduler_config(
    policy: str, period_seconds: float | None
) -> dict[str, list[dict[str, object]]]:
    """The rescheduler's --config: ``policy`` as its built-in defaults define it, on a period
    (milliseconds, as the config's durations take it) or with no trigger at all."""
    text = (resources.files("services.rescheduler") / "default_policies.yaml").read_text()
    defaults = yaml.safe_load(text)["policies"]
    try:
        [entry] = [dict(p) for p in defaults if p["name"] == policy]
    except ValueError:
        known = ", ".join(p["name"] for p in defaults)
        raise TraceRunError(
            f"--policy: no built-in rescheduler policy {policy!r} (known: {known})"
        ) from None
    entry.pop("trigger", None)
    if period_seconds is not None:
        entry["trigger"] = {"period": f"{max(1, round(period_seconds * 1000))}ms"}
    return {"policies": [entry]}


class Replayer:
    """One run's replay on a started cluster: submissions and deletions on the compressed
    clock, and the samples."""

    def __init__(
        self,
        client: ProtoClient,
        nodes: Sequence[TraceNode],
        pods: Sequence[TimedPod],
        window: Window,
        *,
        speedup: float,
        sample_every: int,
        run: ReplayRun,
    ) -> None:
        self._client = client
        self._nodes = nodes
        self._window = window
        self._speedup = speedup
        self._sample_every = sample_every
        self._run = run
        self._capacity = sum(node.gpus for node in nodes) * MILLI_PER_GPU
        self._shapes: dict[str, TaskShape] = {}
        self._live: set[str] = set()  # jobs submitted and not yet deleted
        self._creations: list[
            tuple[int, str, TaskShape, int]
        ] = []  # (created, job, shape, deleted)
        self._deletions: list[tuple[int, str]] = []  # heap of (deleted, job)
        for index, timed in enumerate(sorted(pods, key=lambda p: p.created)):
            if timed.deleted <= window.start or timed.created >= window.end:
                continue
            if timed.deleted == timed.created:
                run.skipped += 1
                continue
            job = f"{JOB_PREFIX}{index:06d}"
            self._creations.append((timed.created, job, timed.pod.shape, timed.deleted))
        self._creations.reverse()  # popped from the end: earliest first
        self._started = 0.0

    def _trace_now(self) -> float:
        return self._window.start + (time.monotonic() - self._started) * self._speedup

    def run(self) -> ReplayRun:
        self._started = time.monotonic()
        next_sample = float(self._window.start)
        while True:
            now = self._trace_now()
            self._submit_due(now)
            self._delete_due(now)
            if now >= next_sample or now >= self._window.end:
                # A sample stands for the mark it was due at (the end, for the last), not the
                # moment it ran: at 20,000x a tenth of a millisecond late is two trace seconds.
                self._sample(next_sample if now < self._window.end else float(self._window.end))
                while next_sample <= now:
                    next_sample += self._sample_every
            if now >= self._window.end:
                break
            upcoming = [next_sample, float(self._window.end)]
            if self._creations:
                upcoming.append(max(self._creations[-1][0], self._window.start))
            if self._deletions:
                upcoming.append(self._deletions[0][0])
            nap = (min(upcoming) - self._trace_now()) / self._speedup
            if nap > 0:
                time.sleep(min(nap, MAX_NAP_SECONDS))
        self._run.real_seconds = time.monotonic() - self._started
        return self._run

    def _lag(self, due: float) -> None:
        """How late (real seconds) something due at trace time ``due`` is done."""
        late = (self._trace_now() - max(due, self._window.start)) / self._speedup
        self._run.max_lag_seconds = max(self._run.max_lag_seconds, late)

    def _submit_due(self, now: float) -> None:
        due: list[tuple[int, str, TaskShape, int]] = []
        while self._creations and self._creations[-1][0] <= now:
            due.append(self._creations.pop())
        for first in range(0, len(due), SUBMIT_CHUNK):
            chunk = due[first : first + SUBMIT_CHUNK]
            response = self._client.submit([task_job(job, shape) for _, job, shape, _ in chunk])
            for (_, job, shape, deleted), result in zip(chunk, response.results, strict=True):
                if result.created:
                    self._shapes[job] = shape
                    self._live.add(job)
                    heapq.heappush(self._deletions, (deleted, job))
                    self._run.submitted += 1
                elif never_fits(result.violations):
                    self._run.refused += 1
                else:
                    why = "; ".join(f"{v.field}: {v.description}" for v in result.violations)
                    raise TraceRunError(f"job {job} refused: {why}")
            self._lag(chunk[-1][0])

    def _delete_due(self, now: float) -> None:
        while self._deletions and self._deletions[0][0] <= now:
            deleted, job = heapq.heappop(self._deletions)
            self._client.delete("Job", job)
            self._live.discard(job)
            self._lag(deleted)

    def _sample(self, mark: float) -> None:
        pods = self._client.list(pb.Pod)
        ours = [pod for pod in pods if pod.spec.job in self._shapes]
        bound = [pod for pod in ours if holds_claim(pod)]
        pending = [
            pod
            for pod in ours
            if not pod.spec.node_name
            and not is_terminal(pod.status.phase)
            and pod.spec.job in self._live
            and not pod.metadata.deletion_timestamp_ms
        ]
        try:
            states = stored_allocation(bound, self._nodes, self._shapes)
        except (KeyError, ValueError) as exc:
            raise TraceRunError(f"the stored pods' cards do not add up: {exc}") from exc
        running = [self._shapes[pod.spec.job] for pod in bound]
        fragmented = expected_fragmentation_milli(states.values(), running)
        free = sum(state.free_gpu_milli for state in states.values())
        allocated = sum(shape.gpu_request_milli for shape in running)
        pending_milli = sum(self._shapes[pod.spec.job].gpu_request_milli for pod in pending)
        for pod in ours:
            if pod.metadata.name.startswith(f"{pod.spec.job}-{pod.spec.index}-r"):
                self._run.moved.add(pod.metadata.name)
        self._run.samples.append(
            Sample(
                trace_seconds=mark - self._window.start,
                real_seconds=time.monotonic() - self._started,
                allocated_pct=100 * allocated / self._capacity,
                fragmentation_pct=100 * fragmented / self._capacity,
                fragmentation_of_free_pct=100 * fragmented / free if free else 0.0,
                pending_gpu_pct=100 * pending_milli / self._capacity,
                pending_gpus=pending_milli / MILLI_PER_GPU,
                bound_pods=len(bound),
                pending_pods=len(pending),
            )
        )


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    window: Window
    speedup: float
    sample_every: int
    defrag_period: int
    policy: str
    shards: int
    nodeagents: int


def run_replay(
    label: str, nodes: Sequence[TraceNode], pods: Sequence[TimedPod], settings: ReplaySettings
) -> ReplayRun:
    """One run (``defrag-off`` or ``defrag-on``) on a fresh cluster, gone when this returns."""
    on = label == "defrag-on"
    period = settings.defrag_period / settings.speedup if on else None
    run = ReplayRun(label, settings.defrag_period if on else 0)
    with trace_cluster(
        nodes,
        shards=settings.shards,
        nodeagents=settings.nodeagents,
        rescheduler_config=rescheduler_config(settings.policy, period),
    ) as cluster:
        with ProtoClient(cluster.dispatcher, timeout=120, home=cluster.home) as client:
            cpu_before = cluster.cpu_seconds()
            replayer = Replayer(
                client,
                nodes,
                pods,
                settings.window,
                speedup=settings.speedup,
                sample_every=settings.sample_every,
                run=run,
            )
            replayer.run()
            run.cpu_seconds = cluster.cpu_seconds() - cpu_before
            return run


def write_outputs(
    runs: Sequence[ReplayRun],
    nodes: Sequence[TraceNode],
    settings: ReplaySettings,
    out: Path,
    stamp: str,
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    samples = out / f"gputrace-replay-{stamp}.csv"
    with samples.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SAMPLE_COLUMNS)
        for run in runs:
            for s in run.samples:
                w.writerow(
                    [run.label, f"{s.trace_seconds:.0f}", f"{s.real_seconds:.2f}",
                     *(f"{s.value(n):.3f}" for n in SAMPLE_COLUMNS[3:8]),
                     s.bound_pods, s.pending_pods]
                )  # fmt: skip
    summary = out / f"gputrace-replay-{stamp}-summary.csv"
    with summary.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SUMMARY_COLUMNS)
        for run in runs:
            w.writerow(_summary_row(run, nodes, settings))
    return [samples, summary, plot(runs, out / f"gputrace-replay-{stamp}.png")]


def _summary_row(
    run: ReplayRun, nodes: Sequence[TraceNode], settings: ReplaySettings
) -> list[object]:
    return [
        run.label, len(nodes), sum(n.gpus for n in nodes), f"{settings.speedup:g}",
        run.defrag_period, settings.window.seconds, run.submitted, run.refused, run.skipped,
        len(run.moved), len(run.samples), *(f"{run.average(n):.3f}" for n in AVERAGED),
        f"{max((s.fragmentation_pct for s in run.samples), default=0):.3f}",
        f"{max((s.pending_gpu_pct for s in run.samples), default=0):.3f}",
        f"{run.max_lag_seconds:.2f}", f"{run.real_seconds:.1f}", f"{run.cpu_seconds:.1f}",
    ]  # fmt: skip


def plot(runs: Sequence[ReplayRun], path: Path) -> Path:
    """Allocation, fragmentation and pending GPU demand (% of capacity) over trace time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("allocated_pct", "GPU allocated, %"),
        ("fragmentation_pct", "GPU fragmentation, %"),
        ("pending_gpu_pct", "pending GPU demand, %"),
    )
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 8), sharex=True)
    for ax, (name, label) in zip(axes, panels, strict=True):
        for run in runs:
            days = [s.trace_seconds / 86_400 for s in run.samples]
            average = run.average(name)
            ax.plot(
                days,
                [s.value(name) for s in run.samples],
                label=f"{run.label} (avg {average:.2f})",
                linewidth=0.9,
            )
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[-1].set_xlabel("trace time, days from the window's start")
    axes[0].set_title("openb time replay through the services (% of GPU capacity)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gputrace_replay",
        description="The openb trace replayed in time through the services, gpu-defrag off/on.",
    )
    parser.add_argument("--nodes", type=Path, default=GPU_NODES, help="an openb node file")
    parser.add_argument(
        "--pods", type=Path, default=POD_LISTS["default"], help="an openb pod file with times"
    )
    parser.add_argument("--node-count", type=int, default=0, help="N evenly spaced nodes (0: all)")
    parser.add_argument("--speedup", type=float, default=None, help="trace seconds per second")
    parser.add_argument("--start", type=int, default=None, help="window start, trace seconds")
    parser.add_argument("--end", type=int, default=None, help="window end, trace seconds")
    parser.add_argument("--sample-every", type=int, default=None, help="trace seconds")
    parser.add_argument("--defrag-period", type=int, default=None, help="trace seconds")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="the rescheduler policy")
    parser.add_argument("--quick", action="store_true", help="24 nodes, one day, in seconds")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--nodeagents", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    opts = parser.parse_args(argv)
    try:
        all_nodes = load_nodes(opts.nodes)
        pods = load_timed_pods(opts.pods)
    except TraceError as exc:
        parser.error(str(exc))
    node_count = opts.node_count or (QUICK_NODES if opts.quick else 0)
    if node_count < 0:
        parser.error("--node-count: must be at least 0")
    nodes = spaced_nodes(all_nodes, node_count)
    window = default_window(pods)
    start = window.start if opts.start is None else opts.start
    end = opts.end if opts.end is not None else (start + QUICK_WINDOW if opts.quick else window.end)
    if end <= start:
        parser.error(f"--end: must be after the start ({start}; got {end})")
    speedup = opts.speedup or (QUICK_SPEEDUP if opts.quick else DEFAULT_SPEEDUP)
    if speedup <= 0:
        parser.error("--speedup: must be positive")
    sample_every = opts.sample_every or (QUICK_SAMPLE_EVERY if opts.quick else DEFAULT_SAMPLE_EVERY)
    period = opts.defrag_period or (QUICK_DEFRAG_PERIOD if opts.quick else DEFAULT_DEFRAG_PERIOD)
    if sample_every <= 0 or period <= 0:
        parser.error("--sample-every and --defrag-period: must be positive")
    settings = ReplaySettings(
        Window(start, end), speedup, sample_every, period, opts.policy, opts.shards, opts.nodeagents
    )
    try:
        rescheduler_config(opts.policy, None)  # an unknown policy before any cluster starts
    except TraceRunError as exc:
        parser.error(str(exc))
    runs: list[ReplayRun] = []
    for label in RUNS:
        print(
            f"{label}: {len(nodes)} nodes, {settings.window.seconds} trace seconds at "
            f"{speedup:g}x (~{settings.window.seconds / speedup:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        try:
            run = run_replay(label, nodes, pods, settings)
        except (TraceRunError, ClientError, local.ClusterError) as exc:
            print(f"{label}: {exc}", file=sys.stderr)
            return 1
        runs.append(run)
        print(
            f"  avg allocated {run.average('allocated_pct'):.2f} %, fragmentation "
            f"{run.average('fragmentation_pct'):.2f} %, pending {run.average('pending_gpu_pct'):.2f}"
            f" %; {run.submitted} submitted, {len(run.moved)} moved, max lag "
            f"{run.max_lag_seconds:.1f} s; services {run.cpu_seconds:.0f} CPU-s",
            file=sys.stderr,
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for path in write_outputs(runs, nodes, settings, opts.out, stamp):
        print(path)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
