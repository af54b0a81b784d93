"""The FGD paper's protocol on the openb trace through the real services (issue 30 item 5): the
same task stream as the offline check (``bench.gpufrag_sim.task_sequence``), placed by the
scheduler shards and bound by the Binder on hollow nodes served from the trace's node list.

    python -m bench.gputrace_services                         # every profile, 1 seed, all nodes
    python -m bench.gputrace_services --quick                 # 60 nodes, their share of tasks
    python -m bench.gputrace_services --policy default --policy most-allocated --seeds 2

Per profile and seed, a fresh cluster (``godel.local.up``: the store, the dispatcher, the
shards, a Binder, node agents serving the CSV's nodes as hollow nodes), then each task as a
one-pod job (cpu, memory, gpus and gpuMilli for a share of one card, gpuModels from
``gpu_spec``), one at a time: the next is submitted only once the previous pod is bound or
the shard has written it unschedulable (``status.unschedulable``), which is then deleted
(counted unplaced; not retried: no task ever leaves, so a retry could not fit either). The
wait reads a Watch stream, not a poll. After each task the allocation is read from the bound
pod as stored (``spec.node_name``, ``spec.gpu_cards``) into a ``placement.gpufrag.Fleet``:
unallocated % and fragmentation % (the trace's frequent shapes) against arrived %, the
offline check's definitions; at the end the stored pods are listed once more and the whole
allocation recomputed from them must agree.

The shards score every feasible node (``--scan-extra`` past the node count), as the paper's
simulator does; the production default scans ``units + 50``. Profiles: ``default`` (the
scheduler's own), ``least-allocated`` (kube-like spreading) and ``most-allocated`` (packing)
from ``bench/profiles/``, and ``gpufrag-<policy>`` (the GpuFragmentation score's policies),
skipped with a note while that plugin is not registered. No random score exists among the
plugins (and this benchmark adds none: placement/ is out of its scope), so no random curve.

Writes ``gputrace-services-<stamp>.csv`` (a row per whole arrived percent per run),
``…-summary.csv`` (each run at 100 % arrived, with its rate in tasks per second) and ``….png``.
"""

from __future__ import annotations

import argparse
import csv
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.gpucluster import (
    TraceRunError,
    never_fits,
    spaced_nodes,
    stored_allocation,
    task_job,
    trace_cluster,
)
from bench.gpufrag_sim import (
    PLOT_FROM_PERCENT,
    READ_AT_PERCENT,
    Point,
    Run,
    _interpolate,
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
}
QUICK_NODES = 60
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


@dataclass(frozen=True, slots=True)
class ServicesRun:
    run: Run
    seconds: float  # submitting and deciding every task (the cluster's start not counted)
    tasks: int

    @property
    def tasks_per_second(self) -> float:
        return self.tasks / self.seconds if self.seconds else 0.0


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
    if PROFILES[profile]:
        scheduler_args += ["--profile", str(PROFILES_DIR / PROFILES[profile])]
    with trace_cluster(
        nodes, shards=shards, nodeagents=nodeagents, scheduler_args=scheduler_args
    ) as cluster:
        with ReschedulerClient(cluster.rescheduler, home=cluster.home) as rescheduler:
            rescheduler.pause()  # the protocol has no deletions: nothing may be moved
        with ProtoClient(cluster.dispatcher, timeout=120, home=cluster.home) as client:
            return run_protocol(client, cluster.home, nodes, tasks, mix, profile, seed, trace)


def write_outputs(runs: Sequence[ServicesRun], out: Path, stamp: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    curves = out / f"gputrace-services-{stamp}.csv"
    with curves.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CURVE_COLUMNS)
        for r in runs:
            for p in r.run.points:
                w.writerow(_row(r.run, p))
    summary = out / f"gputrace-services-{stamp}-summary.csv"
    with summary.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*CURVE_COLUMNS, "seconds", "tasks_per_second"])
        for r in runs:
            w.writerow(
                [*_row(r.run, r.run.at_read), f"{r.seconds:.1f}", f"{r.tasks_per_second:.1f}"]
            )
    return [curves, summary, plot(runs, out / f"gputrace-services-{stamp}.png")]


def _row(run: Run, p: Point) -> list[object]:
    return [
        run.trace, run.policy, run.seed, p.tasks, f"{p.arrived_pct:.3f}",
        f"{p.unallocated_pct:.3f}", f"{p.fragmentation_pct:.3f}", p.placed, p.unplaced,
    ]  # fmt: skip


def plot(runs: Sequence[ServicesRun], path: Path) -> Path:
    """Unallocated % against arrived %, a line per profile (seed), as the paper draws it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        xs = [p.arrived_pct for p in r.run.points if p.arrived_pct >= PLOT_FROM_PERCENT]
        ys = [p.unallocated_pct for p in r.run.points if p.arrived_pct >= PLOT_FROM_PERCENT]
        if not xs:  # a small run: draw all of it
            xs = [p.arrived_pct for p in r.run.points]
            ys = [p.unallocated_pct for p in r.run.points]
        ax.plot(xs, ys, label=f"{r.run.policy} (seed {r.run.seed})")
    ax.set_xlabel("arrived GPU request, % of capacity")
    ax.set_ylabel("unallocated GPU, % of capacity")
    ax.set_title(f"openb {runs[0].run.trace if runs else ''} through the services")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _profiles(wanted: Sequence[str]) -> Iterator[str]:
    for name in wanted:
        why = profile_available(name)
        if why:
            print(f"skipping profile {name}: {why}", file=sys.stderr)
        else:
            yield name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gputrace_services",
        description="The FGD paper's protocol on the openb trace through the real services.",
    )
    parser.add_argument("--trace", choices=sorted(POD_LISTS), default="default")
    parser.add_argument(
        "--policy", action="append", choices=list(PROFILES), help="a profile (repeatable; all)"
    )
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds (default 1)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--nodes", type=int, default=0, help="the first N GPU nodes (0: all)")
    parser.add_argument("--quick", action="store_true", help=f"--nodes {QUICK_NODES}")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--nodeagents", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    opts = parser.parse_args(argv)
    if opts.seeds < 1:
        parser.error("--seeds: must be at least 1")
    node_count = QUICK_NODES if opts.quick and not opts.nodes else opts.nodes
    try:
        all_nodes = load_nodes(GPU_NODES)
        all_shapes = [pod.shape for pod in load_pods(POD_LISTS[opts.trace])]
    except TraceError as exc:
        parser.error(str(exc))
    nodes, shapes = trace_subset(all_nodes, all_shapes, node_count)
    mix = ShapeMix.of_counts(Counter(shapes))
    capacity = sum(node.gpus for node in nodes) * MILLI_PER_GPU
    runs: list[ServicesRun] = []
    for profile in _profiles(opts.policy or list(PROFILES)):
        for seed in range(opts.first_seed, opts.first_seed + opts.seeds):
            tasks = task_sequence(shapes, capacity, seed)
            print(f"{profile} seed {seed}: {len(nodes)} nodes, {len(tasks)} tasks", file=sys.stderr)
            try:
                r = run_on_cluster(
                    nodes, tasks, mix, profile, seed, opts.trace,
                    shards=opts.shards, nodeagents=opts.nodeagents,
                )  # fmt: skip
            except (TraceRunError, ClientError, local.ClusterError) as exc:
                print(f"{profile} seed {seed}: {exc}", file=sys.stderr)
                return 1
            runs.append(r)
            at = r.run.at_read
            print(
                f"  unallocated {at.unallocated_pct:.2f} % at {at.arrived_pct:.1f} % arrived, "
                f"{at.unplaced} unplaced; {r.tasks_per_second:.1f} tasks/s",
                file=sys.stderr,
            )
    if not runs:
        print("no profile could run", file=sys.stderr)
        return 1
    for path in write_outputs(runs, opts.out, time.strftime("%Y%m%d-%H%M%S")):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
