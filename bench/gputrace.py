"""Reading openb-format GPU traces (Alibaba's cluster-trace-gpu-v2023; bench/data/openb/).

A node file has the columns ``sn, cpu_milli, memory_mib, gpu, model``; a pod file ``name,
cpu_milli, memory_mib, num_gpu, gpu_milli`` and optionally ``gpu_spec`` (accepted models,
``A|B``; empty: any), and for the time replay ``creation_time, deletion_time`` (seconds).
Other columns (qos, phases) are ignored. Any pair of files in that
format can be passed by path; a malformed row is refused with ``TraceError`` naming the file,
the line and the field.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from placement.gpufrag import MILLI_PER_GPU, GpuNodeState, TaskShape

MIB = 1 << 20
DATA = Path(__file__).resolve().parent / "data" / "openb"
GPU_NODES = DATA / "openb_node_list_gpu_node.csv"
# The trace's pod lists by the name the simulator takes.
POD_LISTS = {
    "default": DATA / "openb_pod_list_default.csv",
    "gpushare40": DATA / "openb_pod_list_gpushare40.csv",
    "multigpu20": DATA / "openb_pod_list_multigpu20.csv",
}
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TIME_COLUMNS = ("creation_time", "deletion_time")
MAX_CARDS = 64  # a sanity bound on one node's card count


class TraceError(ValueError):
    """A trace file that cannot be read as openb: ``path:line: field: rule (got ...)``."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory: int  # bytes
    gpus: int
    model: str

    def initial_state(self) -> GpuNodeState:
        """The node empty: every card wholly free."""
        return GpuNodeState(
            model=self.model,
            free_milli=(MILLI_PER_GPU,) * self.gpus,
            cpu_milli=self.cpu_milli,
            memory=self.memory,
            cpu_capacity_milli=self.cpu_milli,
            memory_capacity=self.memory,
        )


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    shape: TaskShape


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            missing = [column for column in required if column not in header]
            if missing:
                raise TraceError(f"{path}:1: header: missing column(s) {', '.join(missing)}")
            rows: list[tuple[int, dict[str, str]]] = []
            for row in reader:
                if None in row or any(row[c] is None for c in required):
                    raise TraceError(
                        f"{path}:{reader.line_num}: row: expected {len(header)} fields"
                    )
                rows.append((reader.line_num, row))
            return rows
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: not a CSV file: {exc}") from exc


def _integer(path: Path, line: int, row: dict[str, str], column: str, low: int = 0) -> int:
    text = row[column].strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{path}:{line}: {column}: must be an integer (got {text!r})") from None
    if value < low:
        raise TraceError(f"{path}:{line}: {column}: must be at least {low} (got {value})")
    return value


def load_nodes(path: Path, *, gpu_only: bool = True) -> list[TraceNode]:
    """The nodes of an openb node file; with ``gpu_only`` (the paper's experiments) the ones
    with at least one GPU."""
    nodes: list[TraceNode] = []
    names: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        name = row["sn"].strip()
        if not name:
            raise TraceError(f"{path}:{line}: sn: must not be empty")
        if name in names:
            raise TraceError(f"{path}:{line}: sn: duplicate node {name!r}")
        names.add(name)
        gpus = _integer(path, line, row, "gpu")
        if gpus > MAX_CARDS:
            raise TraceError(f"{path}:{line}: gpu: at most {MAX_CARDS} cards (got {gpus})")
        model = row["model"].strip()
        if gpus and not model:
            raise TraceError(f"{path}:{line}: model: a node with GPUs must name their model")
        node = TraceNode(
            name=name,
            cpu_milli=_integer(path, line, row, "cpu_milli"),
            memory=_integer(path, line, row, "memory_mib") * MIB,
            gpus=gpus,
            model=model,
        )
        if gpus or not gpu_only:
            nodes.append(node)
    if not nodes:
        raise TraceError(f"{path}: no {'GPU ' if gpu_only else ''}nodes")
    return nodes


@dataclass(frozen=True, slots=True)
class TimedPod:
    """A task with when the trace created and deleted it (seconds)."""

    pod: TracePod
    created: int
    deleted: int


def load_pods(path: Path) -> list[TracePod]:
    """The tasks of an openb pod file, in file order."""
    return [pod for _, _, pod in _pods(path, POD_COLUMNS)]


def load_timed_pods(path: Path) -> list[TimedPod]:
    """The tasks of an openb pod file with their creation and deletion times, in file order;
    a file without those columns, or a pod deleted before it was created, is refused."""
    timed: list[TimedPod] = []
    for line, row, pod in _pods(path, POD_COLUMNS + TIME_COLUMNS):
        created = _integer(path, line, row, "creation_time")
        deleted = _integer(path, line, row, "deletion_time")
        if deleted < created:
            raise TraceError(
                f"{path}:{line}: deletion_time: must not be before creation_time "
                f"(got {deleted} < {created})"
            )
        timed.append(TimedPod(pod, created, deleted))
    return timed


def _pods(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str], TracePod]]:
    pods: list[tuple[int, dict[str, str], TracePod]] = []
    for line, row in _rows(path, columns):
        name = row["name"].strip()
        if not name:
            raise TraceError(f"{path}:{line}: name: must not be empty")
        spec = (row.get("gpu_spec") or "").strip()
        models = frozenset(part.strip() for part in spec.split("|") if part.strip())
        try:
            shape = TaskShape(
                cpu_milli=_integer(path, line, row, "cpu_milli"),
                memory=_integer(path, line, row, "memory_mib") * MIB,
                gpu_count=_integer(path, line, row, "num_gpu"),
                gpu_milli=_integer(path, line, row, "gpu_milli"),
                models=models,
            )
        except ValueError as exc:
            if isinstance(exc, TraceError):
                raise
            raise TraceError(f"{path}:{line}: {_trace_field(str(exc))}") from None
        pods.append((line, row, TracePod(name, shape)))
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods


def _trace_field(problem: str) -> str:
    """A shape rule spelt with the file's column names."""
    for ours, theirs in (("gpu_count", "num_gpu"), ("memory", "memory_mib")):
        problem = problem.replace(ours, theirs)
    return problem
