"""The offline algorithm check of fragmentation-aware GPU placement on the openb trace
(issue 30 items 3 and 5): the FGD paper's protocol, in-process on ``placement.gpufrag``.

    python -m bench.gpufrag_sim                       # 10 seeds, the three traces, every policy
    python -m bench.gpufrag_sim --quick               # 2 seeds
    python -m bench.gpufrag_sim --trace default --policy fgd --policy fgd-fill --seeds 3
    python -m bench.gpufrag_sim --nodes N.csv --pods P.csv   # any openb-format pair
    python -m bench.gpufrag_sim --learn 2000 --policy fgd-fill   # the mix learnt as tasks come
    python -m bench.gpufrag_sim --combine OUT/gpufrag-A.csv OUT/gpufrag-B.csv   # one report

The protocol, as the paper's artifact runs it: the GPU nodes, empty; the trace's tasks placed
one at a time in a seeded random order, then tasks drawn uniformly from the trace until the
GPU request would pass 130 % of capacity; no deletions; a task no node fits stays unplaced
and is not retried. After every task: *arrived %* (the GPU request of every task submitted so
far, placed or not, over the cluster's GPU capacity), *unallocated %* (100 − allocated over
capacity) and *fragmentation %* (the nodes' expected fragmentation over the trace's frequent
shapes, over capacity). The figure of merit is unallocated % at 100 % arrived, median over
the seeds.

This checks the algorithm only; the same protocol through the services (shards, Binder,
store) is ``python -m bench.gputrace_services``. Writes ``gpufrag-<stamp>.csv`` (the curves, a row per whole arrived percent),
``gpufrag-<stamp>-summary.csv`` (each run at 100 % arrived) and ``gpufrag-<stamp>.png``.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.gputrace import GPU_NODES, POD_LISTS, TraceError, TraceNode, load_nodes, load_pods
from placement.gpufrag import (
    FGD_FILL_COVERAGE_PERCENT,
    MILLI_PER_GPU,
    BestFitPolicy,
    FgdBalancePolicy,
    FgdFillPolicy,
    FgdPolicy,
    Fleet,
    GpuPackingPolicy,
    LeastAllocatedPolicy,
    Policy,
    RandomPolicy,
    ShapeMix,
    ShapeWindow,
    TaskShape,
    place,
)

DEFAULT_OUT = Path("bench/results")
OVERSUBSCRIBE_PERCENT = 130  # tasks are drawn until the GPU request would pass this
READ_AT_PERCENT = 100  # the figure of merit is read at this arrived %
PLOT_FROM_PERCENT = 70  # the plot's first arrived %
RELEARN_EVERY = 500  # tasks between handing a learnt mix to the policy (--learn)

# Each policy built from the trace's shape counts (the paper's FGD reads the shapes covering
# 95 % of tasks; FgdFill reads them all: the rare small shares are what fills a card's sliver).
POLICIES: dict[str, Callable[[Mapping[TaskShape, int]], Policy]] = {
    "fgd-balance": lambda counts: FgdBalancePolicy(
        ShapeMix.of_counts(counts, FGD_FILL_COVERAGE_PERCENT)
    ),
    "fgd-fill": lambda counts: FgdFillPolicy(ShapeMix.of_counts(counts, FGD_FILL_COVERAGE_PERCENT)),
    "fgd": lambda counts: FgdPolicy(ShapeMix.of_counts(counts)),
    "best-fit": lambda _counts: BestFitPolicy(),
    "gpu-packing": lambda _counts: GpuPackingPolicy(),
    "least-allocated": lambda _counts: LeastAllocatedPolicy(),
    "random": lambda _counts: RandomPolicy(),
}


@dataclass(frozen=True, slots=True)
class Point:
    tasks: int
    arrived_pct: float
    unallocated_pct: float
    fragmentation_pct: float
    placed: int
    unplaced: int


@dataclass(frozen=True, slots=True)
class Run:
    trace: str
    policy: str
    seed: int
    points: tuple[Point, ...]  # the first task at or past each whole arrived percent, and the last
    at_read: Point  # interpolated at READ_AT_PERCENT arrived


def task_sequence(shapes: Sequence[TaskShape], capacity_milli: int, seed: int) -> list[TaskShape]:
    """The trace's tasks in a seeded random order, then tasks drawn uniformly from it until
    the GPU request would pass OVERSUBSCRIBE_PERCENT of capacity."""
    rng = random.Random(seed)
    order = list(shapes)
    rng.shuffle(order)
    requested = sum(task.gpu_request_milli for task in order)
    limit = capacity_milli * OVERSUBSCRIBE_PERCENT // 100
    while True:
        task = shapes[rng.randrange(len(shapes))]
        if requested + task.gpu_request_milli > limit:
            return order
        order.append(task)
        requested += task.gpu_request_milli


def simulate(
    nodes: Sequence[TraceNode],
    shapes: Sequence[TaskShape],
    policy_name: str,
    seed: int,
    trace: str = "",
    learn_window: int = 0,
) -> Run:
    """One run of the protocol. The policy reads the trace's shape mix, or with
    ``learn_window`` the mix of the last that many tasks submitted (``ShapeWindow``), learnt
    from nothing and handed to the policy every RELEARN_EVERY tasks."""
    counts = Counter(shapes)
    mix = ShapeMix.of_counts(counts)  # the paper's, for the fragmentation % reported
    window = ShapeWindow(learn_window, coverage_percent=100) if learn_window else None
    make_policy = POLICIES[policy_name]
    fleet = Fleet(make_policy({} if window else counts), mix)
    for node in nodes:
        fleet.set(node.name, node.initial_state())
    capacity = sum(node.gpus for node in nodes) * MILLI_PER_GPU
    ties = random.Random(seed * 1_000_003 + 7)  # apart from the order: same tasks per policy
    arrived = allocated = placed = unplaced = 0
    points: list[Point] = []
    next_percent = 0
    previous: Point | None = None
    at_read: Point | None = None
    tasks = task_sequence(shapes, capacity, seed)
    for count, task in enumerate(tasks, start=1):
        arrived += task.gpu_request_milli
        if window is not None:
            window.observe(task)
            if count % RELEARN_EVERY == 0:
                fleet.use_policy(make_policy(dict(window.mix().shapes)))
        chosen = fleet.choose(task, ties)
        if chosen is None:
            unplaced += 1
        else:
            name, choice = chosen
            fleet.set(name, place(fleet.state(name), task, choice.cards))
            allocated += task.gpu_request_milli
            placed += 1
        point = Point(
            tasks=count,
            arrived_pct=100 * arrived / capacity,
            unallocated_pct=100 - 100 * allocated / capacity,
            fragmentation_pct=100 * fleet.expected_fragmentation_total() / capacity,
            placed=placed,
            unplaced=unplaced,
        )
        if point.arrived_pct >= next_percent or count == len(tasks):
            points.append(point)
            next_percent = int(point.arrived_pct) + 1
        if at_read is None and point.arrived_pct >= READ_AT_PERCENT:
            at_read = _interpolate(previous, point, READ_AT_PERCENT)
        previous = point
    if at_read is None:  # the trace never reached it: read the end
        assert previous is not None
        at_read = previous
    label = f"{policy_name}/learn{learn_window}" if learn_window else policy_name
    return Run(trace, label, seed, tuple(points), at_read)


def _interpolate(before: Point | None, after: Point, arrived_pct: float) -> Point:
    if before is None or after.arrived_pct == before.arrived_pct:
        return after
    share = (arrived_pct - before.arrived_pct) / (after.arrived_pct - before.arrived_pct)

    def between(a: float, b: float) -> float:
        return a + (b - a) * share

    return Point(
        tasks=after.tasks,
        arrived_pct=arrived_pct,
        unallocated_pct=between(before.unallocated_pct, after.unallocated_pct),
        fragmentation_pct=between(before.fragmentation_pct, after.fragmentation_pct),
        placed=after.placed,
        unplaced=after.unplaced,
    )


@dataclass(frozen=True, slots=True)
class Job:
    trace: str
    nodes_path: Path
    pods_path: Path
    policy: str
    seed: int
    learn_window: int = 0


def run_job(job: Job) -> Run:
    nodes = load_nodes(job.nodes_path)
    shapes = [pod.shape for pod in load_pods(job.pods_path)]
    return simulate(nodes, shapes, job.policy, job.seed, job.trace, job.learn_window)


CURVE_COLUMNS = (
    "trace", "policy", "seed", "tasks", "arrived_pct", "unallocated_pct",
    "fragmentation_pct", "placed", "unplaced",
)  # fmt: skip


def write_curves(runs: Sequence[Run], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CURVE_COLUMNS)
        for run in runs:
            for p in run.points:
                writer.writerow(_row(run, p))


def write_summary(runs: Sequence[Run], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CURVE_COLUMNS)
        for run in runs:
            writer.writerow(_row(run, run.at_read))


def _row(run: Run, p: Point) -> list[object]:
    return [
        run.trace, run.policy, run.seed, p.tasks, f"{p.arrived_pct:.3f}",
        f"{p.unallocated_pct:.3f}", f"{p.fragmentation_pct:.3f}", p.placed, p.unplaced,
    ]  # fmt: skip


def summary_table(runs: Sequence[Run]) -> str:
    """Unallocated GPU % at 100 % arrived per trace and policy: median, mean, min–max."""
    traces = list(dict.fromkeys(run.trace for run in runs))
    policies = list(dict.fromkeys(run.policy for run in runs))
    lines = [
        "| trace | policy | seeds | unallocated % median | mean | min–max | fragmentation % median |",
        "|---|---|---|---|---|---|---|",
    ]
    for trace in traces:
        for policy in policies:
            mine = [r.at_read for r in runs if r.trace == trace and r.policy == policy]
            if not mine:
                continue
            values = [p.unallocated_pct for p in mine]
            frag = statistics.median(p.fragmentation_pct for p in mine)
            lines.append(
                f"| {trace} | {policy} | {len(mine)} | {statistics.median(values):.2f} | "
                f"{statistics.mean(values):.2f} | {min(values):.2f}–{max(values):.2f} | {frag:.2f} |"
            )
    return "\n".join(lines)


def plot(runs: Sequence[Run], path: Path) -> None:
    """Unallocated % against arrived % (from PLOT_FROM_PERCENT), per trace a panel, per policy
    the median over seeds at each whole arrived percent."""
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(run.trace for run in runs))
    policies = list(dict.fromkeys(run.policy for run in runs))
    figure, axes = plt.subplots(1, len(traces), figsize=(6 * len(traces), 4.5), squeeze=False)
    for axis, trace in zip(axes[0], traces, strict=True):
        for policy in policies:
            by_percent: dict[int, list[float]] = {}
            for run in runs:
                if run.trace != trace or run.policy != policy:
                    continue
                for p in run.points:
                    by_percent.setdefault(int(p.arrived_pct), []).append(p.unallocated_pct)
            xs = sorted(by_percent)
            axis.plot(xs, [statistics.median(by_percent[x]) for x in xs], label=policy)
        axis.axvline(READ_AT_PERCENT, color="grey", linewidth=0.5)
        axis.set_title(f"openb {trace}")
        axis.set_xlabel("arrived GPU request, % of capacity")
        axis.set_ylabel("unallocated GPU, %")
        # The policies part in the last third: below 70 % arrived every one places everything.
        axis.set_xlim(PLOT_FROM_PERCENT, OVERSUBSCRIBE_PERCENT)
        axis.set_ylim(0, 100 - PLOT_FROM_PERCENT + 5)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def read_runs(curves: Path) -> list[Run]:
    """The runs a previous invocation wrote (``gpufrag-<stamp>.csv`` and its ``-summary.csv``)."""
    summary = curves.with_name(f"{curves.stem}-summary.csv")
    points: dict[tuple[str, str, int], list[Point]] = {}
    for row in csv.DictReader(curves.open()):
        points.setdefault(_run_key(row), []).append(_point(row))
    runs = []
    for row in csv.DictReader(summary.open()):
        key = _run_key(row)
        runs.append(Run(key[0], key[1], key[2], tuple(points.get(key, ())), _point(row)))
    return runs


def _run_key(row: dict[str, str]) -> tuple[str, str, int]:
    return row["trace"], row["policy"], int(row["seed"])


def _point(row: dict[str, str]) -> Point:
    return Point(
        tasks=int(row["tasks"]),
        arrived_pct=float(row["arrived_pct"]),
        unallocated_pct=float(row["unallocated_pct"]),
        fragmentation_pct=float(row["fragmentation_pct"]),
        placed=int(row["placed"]),
        unplaced=int(row["unplaced"]),
    )


def _progress(run: Run, done: int, total: int) -> Run:
    sys.stderr.write(
        f"[{done}/{total}] {run.trace} {run.policy} seed {run.seed}: "
        f"{run.at_read.unallocated_pct:.2f} % unallocated at {READ_AT_PERCENT} % arrived\n"
    )
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpufrag_sim",
        description="The FGD paper's protocol on an openb-format trace, in-process.",
    )
    parser.add_argument(
        "--trace",
        action="append",
        choices=sorted(POD_LISTS),
        help="a pod list of the bundled trace (repeatable; default: all three)",
    )
    parser.add_argument("--nodes", type=Path, help="an openb node file (with --pods)")
    parser.add_argument("--pods", type=Path, help="an openb pod file (with --nodes)")
    parser.add_argument(
        "--policy", action="append", choices=list(POLICIES), help="repeatable; default: all"
    )
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    parser.add_argument("--quick", action="store_true", help="2 seeds")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--no-plot", action="store_true", help="write the CSVs only")
    parser.add_argument(
        "--learn",
        type=int,
        default=0,
        metavar="N",
        help="policies learn the shape mix from the last N tasks instead of reading the trace's",
    )
    parser.add_argument(
        "--combine",
        type=Path,
        nargs="+",
        metavar="CSV",
        help="no runs: merge earlier outputs (gpufrag-<stamp>.csv, beside its -summary.csv)",
    )
    args = parser.parse_args(argv)

    if (args.nodes is None) != (args.pods is None):
        parser.error("--nodes and --pods go together")
    seeds = 2 if args.quick else args.seeds
    if seeds < 1:
        parser.error(f"--seeds: must be at least 1 (got {seeds})")
    if args.jobs < 1:
        parser.error(f"--jobs: must be at least 1 (got {args.jobs})")
    if args.learn < 0:
        parser.error(f"--learn: must not be negative (got {args.learn})")
    pairs: list[tuple[str, Path, Path]] = []
    if args.nodes is not None:
        pairs.append((args.pods.stem, args.nodes, args.pods))
    if args.trace or (args.nodes is None and not args.combine):
        for trace in args.trace or list(POD_LISTS):
            pairs.append((trace, GPU_NODES, POD_LISTS[trace]))
    try:  # refuse a bad file before any run starts
        for _, nodes_path, pods_path in pairs:
            load_nodes(nodes_path)
            load_pods(pods_path)
    except TraceError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    jobs = [
        Job(trace, nodes_path, pods_path, policy, seed, args.learn)
        for trace, nodes_path, pods_path in pairs
        for policy in args.policy or list(POLICIES)
        for seed in range(seeds)
    ]
    started = time.perf_counter()
    runs: list[Run] = []
    if args.combine:
        jobs = []
        for path in args.combine:
            try:
                runs.extend(read_runs(path))
            except (OSError, KeyError, ValueError) as exc:
                sys.stderr.write(f"error: {path}: cannot read earlier runs: {exc}\n")
                return 2
    elif args.jobs == 1:
        for job in jobs:
            runs.append(_progress(run_job(job), len(runs) + 1, len(jobs)))
    else:
        with ProcessPoolExecutor(args.jobs) as pool:
            for run in pool.map(run_job, jobs):
                runs.append(_progress(run, len(runs) + 1, len(jobs)))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"gpufrag-{time.strftime('%Y%m%d-%H%M%S')}"
    curves, summary, figure = (
        Path(f"{stem}.csv"),
        Path(f"{stem}-summary.csv"),
        Path(f"{stem}.png"),
    )
    write_curves(runs, curves)
    write_summary(runs, summary)
    if not args.no_plot:
        plot(runs, figure)
    sys.stdout.write(summary_table(runs) + "\n\n")
    if args.combine:
        sys.stdout.write(f"{len(runs)} runs combined\n")
    else:
        sys.stdout.write(f"{len(runs)} runs in {time.perf_counter() - started:.0f} s\n")
    for path in (curves, summary) + (() if args.no_plot else (figure,)):
        sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
