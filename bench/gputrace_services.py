"""The FGD paper's protocol on the openb trace through the real services (issue 30 item 5): the
same task stream as the offline check (``bench.gpufrag_sim.task_sequence``), placed by the
scheduler shards and bound by the Binder on hollow nodes served from the trace's node list.

    python -m bench.gputrace_services                    # 3 traces, 5 policies, 10 seeds, all nodes
    python -m bench.gputrace_services --quick            # default trace, 60 nodes, 2 seeds
    python -m bench.gputrace_services --trace default --policy default --policy random --seeds 3
    python -m bench.gputrace_services --nodes N.csv --pods P.csv   # any openb-format pair

Per trace, profile and seed, a fresh cluster (``godel.local.up``: the store, the dispatcher,
the shards, a Binder, node agents serving the CSV's nodes as hollow nodes), then each task as
a one-pod job (cpu, memory, gpus and gpuMilli for a share of one card, gpuModels from
``gpu_spec``), one at a time: the next is submitted only once the previous pod is bound or
the shard has written it unschedulable (``status.unschedulable``), which is then deleted
(counted unplaced; not retried: no task ever leaves, so a retry could not fit either). The
wait reads a Watch stream, not a poll. After each task the allocation is read from the bound
pod as stored (``spec.node_name``, ``spec.gpu_cards``) into a ``placement.gpufrag.Fleet``:
unallocated % and fragmentation % (the trace's frequent shapes) against arrived %, the
offline check's definitions; at the end the stored pods are listed once more and the whole
allocation recomputed from them must agree.

The shards score every feasible node (``--scan-extra`` past the node count), as the paper's
simulator does; the production default scans ``units + 50``. Profiles (``bench/profiles/``):
``default`` (the scheduler's own), and the paper's comparison policies, run by default:
``gpufrag-best-fit`` and ``gpufrag-packing`` (the GpuFragmentation score's policies),
``least-allocated`` (kube-like spreading) and ``random`` (no score, the select step's random
tie-break: uniformly among the feasible nodes, seeded per seed); on request ``most-allocated``,
``gpufrag-fgd-fill`` and ``gpufrag-fgd``. A gpufrag profile is skipped with a note while that
plugin is not registered.

Writes, rewritten after every run (so a long run interrupted keeps what it finished):
``gputrace-services-<stamp>.csv`` (a row per whole arrived percent per run),
``…-runs.csv`` (each run at 100 % arrived, with its rate and the services' CPU seconds per
task), ``…-summary.csv`` (per trace and profile, the median over seeds at 100 % arrived) and
``….png`` (unallocated % against arrived %, the median curve per profile, a panel per trace).
"""

from __future__ import annotations

import argparse
import csv
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from bench.gpucluster import (
    TraceRunError,
    never_fits,
    spaced_nodes,
    stored_allocation,
    task_job,
    trace_cluster,
)
from bench.gpufrag_sim import (
    READ_AT_PERCENT,
    Point,
    Run,
    _interpolate,
    plot,
    summary_table,
    task_sequence,
)
from bench.gputrace import GPU_NODES, POD_LISTS, TraceError, TraceNode, load_nodes, load_pods
from godel import local
from godel.client import ClientError, ProtoClient, ReschedulerClient
from placement.gpufrag import (
    MILLI_PER_GPU,
    Fleet,
    LeastAllocatedPolicy,
    ShapeMix,
    TaskShape,
    place,
)
from placement.plugins import new_in_tree_registry
from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from store.kinds import unwrap

DEFAULT_OUT = Path("bench/results")
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
GPU_FRAGMENTATION_PLUGIN = "GpuFragmentation"
# Profile name -> YAML under PROFILES_DIR ("" for the scheduler's default profile).
PROFILES: dict[str, str] = {
    "default": "",
    "least-allocated": "least-allocated.yaml",
    "most-allocated": "most-allocated.yaml",
    "gpufrag-fgd-fill": "gpufrag-fgd-fill.yaml",
    "gpufrag-fgd": "gpufrag-fgd.yaml",
    "gpufrag-best-fit": "gpufrag-best-fit.yaml",
    "gpufrag-packing": "gpufrag-packing.yaml",
    "random": "random.yaml",
}
# The comparison, run unless --policy says otherwise: ours, Best-fit, GPU packing,
# kube-like LeastAllocated and random.
DEFAULT_PROFILES = ("default", "gpufrag-best-fit", "gpufrag-packing", "least-allocated", "random")
FULL_SEEDS = 10
QUICK_NODES = 60
QUICK_SEEDS = 2
DECIDE_TIMEOUT_SECONDS = 120.0  # one task bound or written unschedulable, at most
JOB_PREFIX = "t"
PROGRESS_EVERY = 1000  # tasks between progress lines on stderr
CURVE_COLUMNS = (
    "trace",
    "policy",
    "seed",
    "tasks",
    "arrived_pct",
    "unallocated_pct",
    "fragmentation_pct",
    "placed",
    "unplaced",
)
RUN_COLUMNS = (
    "seconds", "tasks_per_second", "scheduler_cpu_ms_per_task", "services_cpu_ms_per_task",
)  # fmt: skip
SUMMARY_COLUMNS = (
    "trace", "policy", "seeds", "unallocated_pct_median", "unallocated_pct_min",
    "unallocated_pct_max", "fragmentation_pct_median", "unplaced_median",
    "scheduler_cpu_ms_per_task_median", "tasks_per_second_median",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ServicesRun:
    run: Run
    seconds: float  # submitting and deciding every task (the cluster's start not counted)
    tasks: int
    # CPU seconds the services spent over the same span: the shards alone, and every service
    # process with the store (on a shared machine the figure to trust, not the rate).
    scheduler_cpu_seconds: float = 0.0
    services_cpu_seconds: float = 0.0

    @property
    def tasks_per_second(self) -> float:
        return self.tasks / self.seconds if self.seconds else 0.0

    def cpu_ms_per_task(self, seconds: float) -> float:
        return 1000 * seconds / self.tasks if self.tasks else 0.0


def profile_available(name: str) -> str:
    """Why the profile cannot run here ("" if it can)."""
    if name.startswith("gpufrag-") and GPU_FRAGMENTATION_PLUGIN not in new_in_tree_registry():
        return f"the {GPU_FRAGMENTATION_PLUGIN} score plugin is not registered"
    return ""


def trace_subset(
    nodes: Sequence[TraceNode], shapes: Sequence[TaskShape], node_count: int
) -> tuple[list[TraceNode], list[TaskShape]]:
    """What --quick and --nodes run: the same protocol, smaller. ``node_count`` nodes evenly
    spaced through the list (its mix of models and sizes kept), and the trace's first tasks up
    to the same share of its GPU request as those nodes hold of the GPU capacity (and as many
    CPU-only tasks as come among them)."""
    if node_count <= 0 or node_count >= len(nodes):
        return list(nodes), list(shapes)
    kept = spaced_nodes(nodes, node_count)
    share = sum(n.gpus for n in kept) / sum(n.gpus for n in nodes)
    budget = share * sum(task.gpu_request_milli for task in shapes)
    tasks: list[TaskShape] = []
    requested = 0
    for task in shapes:
        if requested + task.gpu_request_milli > budget:
            break
        tasks.append(task)
        requested += task.gpu_request_milli
    return kept, tasks or [shapes[0]]


class PodEvents:
    """A Watch stream of pods read on a thread into a queue, so waiting for one pod's outcome
    needs no polling round trips."""

    def __init__(self, address: str, home: Path) -> None:
        self._events: queue.Queue[pb.Pod | None] = queue.Queue()
        # A connection of its own: closing it ends the stream (a generator cannot be closed
        # from another thread while it waits).
        self._client = ProtoClient(address, timeout=120, home=home)
        self._stream = self._client.watch(["Pod"])
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._stream:
                if event.type in (api_pb2.WatchEvent.ADDED, api_pb2.WatchEvent.MODIFIED):
                    _, obj = unwrap(event.object)
                    if isinstance(obj, pb.Pod):
                        self._events.put(obj)
        except ClientError:
            pass  # the connection closed: the end is signalled below
        finally:
            self._events.put(None)

    def next(self, timeout: float) -> pb.Pod | None:
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._client.close()
        self._thread.join(timeout=10)


def _decided(pod: pb.Pod) -> str:
    """ "bound", "unschedulable" or "" (still pending)."""
    if pod.spec.node_name:
        return "bound"
    if pod.status.HasField("unschedulable"):
        return "unschedulable"
    return ""


def wait_decided(events: PodEvents, job: str, deadline: float) -> pb.Pod:
    while (left := deadline - time.monotonic()) > 0:
        pod = events.next(left)
        if pod is None:
            break
        if pod.spec.job == job and _decided(pod):
            return pod
    raise TraceRunError(f"job {job}: neither bound nor unschedulable in {DECIDE_TIMEOUT_SECONDS}s")


def run_protocol(
    client: ProtoClient,
    home: Path,
    nodes: Sequence[TraceNode],
    tasks: Sequence[TaskShape],
    mix: ShapeMix,
    label: str,
    seed: int,
    trace: str,
) -> ServicesRun:
    """The tasks one at a time on a started cluster serving ``nodes``; the curve."""
    fleet = Fleet(LeastAllocatedPolicy(), mix)  # only its states and fragmentation are read
    for node in nodes:
        fleet.set(node.name, node.initial_state())
    capacity = sum(node.gpus for node in nodes) * MILLI_PER_GPU
    shapes: dict[str, TaskShape] = {}
    arrived = allocated = placed = unplaced = 0
    points: list[Point] = []
    next_percent = 0
    previous: Point | None = None
    at_read: Point | None = None
    events = PodEvents(client.address, home)
    started = time.monotonic()
    try:
        for count, task in enumerate(tasks, start=1):
            job = f"{JOB_PREFIX}{count:06d}"
            shapes[job] = task
            response = client.submit([task_job(job, task)])
            result = response.results[0]
            arrived += task.gpu_request_milli
            if not result.created:
                if not never_fits(result.violations):
                    why = "; ".join(f"{v.field}: {v.description}" for v in result.violations)
                    raise TraceRunError(f"job {job} refused: {why}")
                pod = None  # refused at the door: bigger than every node, so never placed
            else:
                pod = wait_decided(events, job, time.monotonic() + DECIDE_TIMEOUT_SECONDS)
            if pod is not None and pod.spec.node_name:
                name = pod.spec.node_name
                fleet.set(name, place(fleet.state(name), task, list(pod.spec.gpu_cards)))
                allocated += task.gpu_request_milli
                placed += 1
            else:
                if pod is not None:
                    client.delete(
                        "Job", job
                    )  # not retried: nothing ever leaves, it cannot fit later
                unplaced += 1
            point = Point(
                tasks=count,
                arrived_pct=100 * arrived / capacity,
                unallocated_pct=100 - 100 * allocated / capacity,
                fragmentation_pct=100 * fleet.expected_fragmentation_total() / capacity,
                placed=placed,
                unplaced=unplaced,
            )
            if count % PROGRESS_EVERY == 0:
                rate = count / (time.monotonic() - started)
                print(f"  {count}/{len(tasks)} tasks, {rate:.1f}/s", file=sys.stderr, flush=True)
            if point.arrived_pct >= next_percent or count == len(tasks):
                points.append(point)
                next_percent = int(point.arrived_pct) + 1
            if at_read is None and point.arrived_pct >= READ_AT_PERCENT:
                at_read = _interpolate(previous, point, READ_AT_PERCENT)
            previous = point
        seconds = time.monotonic() - started
    finally:
        events.close()
    _check_stored(client, nodes, shapes, fleet)
    assert previous is not None
    run = Run(trace, label, seed, tuple(points), at_read or previous)
    return ServicesRun(run, seconds, len(tasks))


def _check_stored(
    client: ProtoClient,
    nodes: Sequence[TraceNode],
    shapes: dict[str, TaskShape],
    fleet: Fleet,
) -> None:
    """The allocation recomputed from every stored pod must be the one the curve was read
    from: no pod bound late, moved or lost."""
    stored = stored_allocation(client.list(pb.Pod), nodes, shapes)
    differing = [name for name, state in stored.items() if state != fleet.state(name)]
    if differing:
        raise TraceRunError(
            f"the stored pods' allocation differs from the one read as tasks were decided, on "
            f"{len(differing)} node(s), e.g. {differing[0]}"
        )


def run_on_cluster(
    nodes: Sequence[TraceNode],
    tasks: Sequence[TaskShape],
    mix: ShapeMix,
    profile: str,
    seed: int,
    trace: str,
    *,
    shards: int,
    nodeagents: int,
) -> ServicesRun:
    """One run on a fresh cluster; the cluster is gone when this returns or raises."""
    scheduler_args = ["--scan-extra", str(len(nodes) + 1)]
    with tempfile.TemporaryDirectory(prefix="godel-gputrace-profile-") as tmp:
        if PROFILES[profile]:
            profile_file = seeded_profile(PROFILES[profile], seed, Path(tmp))
            scheduler_args += ["--profile", str(profile_file)]
        with trace_cluster(
            nodes, shards=shards, nodeagents=nodeagents, scheduler_args=scheduler_args
        ) as cluster:
            with ReschedulerClient(cluster.rescheduler, home=cluster.home) as rescheduler:
                rescheduler.pause()  # the protocol has no deletions: nothing may be moved
            with ProtoClient(cluster.dispatcher, timeout=120, home=cluster.home) as client:
                shards_before = cluster.cpu_seconds(cluster.scheduler_pids)
                services_before = cluster.cpu_seconds()
                r = run_protocol(client, cluster.home, nodes, tasks, mix, profile, seed, trace)
                return replace(
                    r,
                    scheduler_cpu_seconds=(
                        cluster.cpu_seconds(cluster.scheduler_pids) - shards_before
                    ),
                    services_cpu_seconds=cluster.cpu_seconds() - services_before,
                )


def seeded_profile(file: str, seed: int, tmp: Path) -> Path:
    """The profile to load: a profile that breaks ties at random gets ``tieBreakSeed`` (the
    run's seed, so a random run repeats), written beside the node list; others as they are."""
    path = PROFILES_DIR / file
    doc = yaml.safe_load(path.read_text()) or {}
    if doc.get("tieBreak") != "random":
        return path
    seeded = tmp / file
    seeded.write_text(yaml.safe_dump({**doc, "tieBreakSeed": seed}))
    return seeded


def write_outputs(runs: Sequence[ServicesRun], out: Path, stamp: str) -> list[Path]:
    """The curves, each run at 100 % arrived, the medians and the plot (rewritten whole)."""
    out.mkdir(parents=True, exist_ok=True)
    curves = out / f"gputrace-services-{stamp}.csv"
    with curves.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CURVE_COLUMNS)
        for r in runs:
            for p in r.run.points:
                w.writerow(_row(r.run, p))
    per_run = out / f"gputrace-services-{stamp}-runs.csv"
    with per_run.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*CURVE_COLUMNS, *RUN_COLUMNS])
        for r in runs:
            w.writerow(
                [
                    *_row(r.run, r.run.at_read),
                    f"{r.seconds:.1f}",
                    f"{r.tasks_per_second:.1f}",
                    f"{r.cpu_ms_per_task(r.scheduler_cpu_seconds):.2f}",
                    f"{r.cpu_ms_per_task(r.services_cpu_seconds):.2f}",
                ]
            )
    summary = out / f"gputrace-services-{stamp}-summary.csv"
    with summary.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SUMMARY_COLUMNS)
        for row in medians(runs):
            w.writerow(row)
    figure = out / f"gputrace-services-{stamp}.png"
    plot([r.run for r in runs], figure)
    return [curves, per_run, summary, figure]


def medians(runs: Sequence[ServicesRun]) -> list[list[object]]:
    """Per trace and profile (in run order), the median over its seeds at 100 % arrived, with
    the seeds' range of unallocated %."""
    groups: dict[tuple[str, str], list[ServicesRun]] = {}
    for r in runs:
        groups.setdefault((r.run.trace, r.run.policy), []).append(r)
    rows: list[list[object]] = []
    for (trace, policy), mine in groups.items():
        unallocated = [r.run.at_read.unallocated_pct for r in mine]
        rows.append(
            [
                trace,
                policy,
                len(mine),
                f"{statistics.median(unallocated):.3f}",
                f"{min(unallocated):.3f}",
                f"{max(unallocated):.3f}",
                f"{statistics.median(r.run.at_read.fragmentation_pct for r in mine):.3f}",
                f"{statistics.median(r.run.at_read.unplaced for r in mine):g}",
                f"{statistics.median(r.cpu_ms_per_task(r.scheduler_cpu_seconds) for r in mine):.2f}",
                f"{statistics.median(r.tasks_per_second for r in mine):.1f}",
            ]
        )
    return rows


def _row(run: Run, p: Point) -> list[object]:
    return [
        run.trace, run.policy, run.seed, p.tasks, f"{p.arrived_pct:.3f}",
        f"{p.unallocated_pct:.3f}", f"{p.fragmentation_pct:.3f}", p.placed, p.unplaced,
    ]  # fmt: skip


def _profiles(wanted: Sequence[str]) -> Iterator[str]:
    for name in wanted:
        why = profile_available(name)
        if why:
            print(f"skipping profile {name}: {why}", file=sys.stderr)
        else:
            yield name


@dataclass(frozen=True, slots=True)
class Trace:
    """One node and pod list pair, as run: its name, nodes and task shapes."""

    name: str
    nodes: list[TraceNode]
    shapes: list[TaskShape]


def load_traces(
    names: Sequence[str], nodes_path: Path | None, pods_path: Path | None, node_count: int
) -> list[Trace]:
    """The bundled traces asked for and the pair given by path, cut to ``node_count`` nodes
    (``trace_subset``); a malformed file raises ``TraceError`` before any run starts."""
    pairs: list[tuple[str, Path, Path]] = []
    if nodes_path is not None and pods_path is not None:
        pairs.append((pods_path.stem, nodes_path, pods_path))
    pairs.extend((name, GPU_NODES, POD_LISTS[name]) for name in names)
    traces = []
    for name, node_file, pod_file in pairs:
        nodes = load_nodes(node_file)
        shapes = [pod.shape for pod in load_pods(pod_file)]
        kept, tasks = trace_subset(nodes, shapes, node_count)
        traces.append(Trace(name, kept, tasks))
    return traces


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gputrace_services",
        description="The FGD paper's protocol on openb-format traces through the real services.",
    )
    parser.add_argument(
        "--trace",
        action="append",
        choices=sorted(POD_LISTS),
        help="a pod list of the bundled trace (repeatable; default: all three, the default "
        "trace with --quick, none with --nodes/--pods)",
    )
    parser.add_argument("--nodes", type=Path, help="an openb node file (with --pods)")
    parser.add_argument("--pods", type=Path, help="an openb pod file (with --nodes)")
    parser.add_argument(
        "--policy",
        action="append",
        choices=list(PROFILES),
        help=f"a profile (repeatable; default: {', '.join(DEFAULT_PROFILES)})",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        help=f"how many seeds (default {FULL_SEEDS}; {QUICK_SEEDS} with --quick)",
    )
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument(
        "--node-count", type=int, default=0, help="N evenly spaced nodes and their share of tasks"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"--node-count {QUICK_NODES}, {QUICK_SEEDS} seeds, the default trace unless --trace",
    )
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--nodeagents", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    opts = parser.parse_args(argv)
    if (opts.nodes is None) != (opts.pods is None):
        parser.error("--nodes and --pods go together")
    seeds = opts.seeds if opts.seeds is not None else QUICK_SEEDS if opts.quick else FULL_SEEDS
    if seeds < 1:
        parser.error(f"--seeds: must be at least 1 (got {seeds})")
    if opts.node_count < 0:
        parser.error(f"--node-count: must not be negative (got {opts.node_count})")
    node_count = QUICK_NODES if opts.quick and not opts.node_count else opts.node_count
    every_trace = ["default"] if opts.quick else sorted(POD_LISTS)
    names = opts.trace or ([] if opts.nodes is not None else every_trace)
    try:
        traces = load_traces(names, opts.nodes, opts.pods, node_count)
    except TraceError as exc:
        parser.error(str(exc))
    profiles = list(_profiles(opts.policy or list(DEFAULT_PROFILES)))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs: list[ServicesRun] = []
    paths: list[Path] = []
    for trace in traces:
        mix = ShapeMix.of_counts(Counter(trace.shapes))
        capacity = sum(node.gpus for node in trace.nodes) * MILLI_PER_GPU
        for profile in profiles:
            for seed in range(opts.first_seed, opts.first_seed + seeds):
                tasks = task_sequence(trace.shapes, capacity, seed)
                print(
                    f"{trace.name} {profile} seed {seed}: {len(trace.nodes)} nodes, "
                    f"{len(tasks)} tasks",
                    file=sys.stderr,
                )
                try:
                    r = run_on_cluster(
                        trace.nodes, tasks, mix, profile, seed, trace.name,
                        shards=opts.shards, nodeagents=opts.nodeagents,
                    )  # fmt: skip
                except (TraceRunError, ClientError, local.ClusterError) as exc:
                    print(f"{trace.name} {profile} seed {seed}: {exc}", file=sys.stderr)
                    return 1
                runs.append(r)
                at = r.run.at_read
                print(
                    f"  unallocated {at.unallocated_pct:.2f} % at {at.arrived_pct:.1f} % "
                    f"arrived, {at.unplaced} unplaced; {r.tasks_per_second:.1f} tasks/s, "
                    f"shards {r.cpu_ms_per_task(r.scheduler_cpu_seconds):.1f} CPU-ms/task",
                    file=sys.stderr,
                )
                paths = write_outputs(runs, opts.out, stamp)
    if not runs:
        print("no profile could run", file=sys.stderr)
        return 1
    print(summary_table([r.run for r in runs]))
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
