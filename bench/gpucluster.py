"""What the openb benchmarks through the services share (``bench.gputrace_services``, the
paper's protocol, and ``bench.gputrace_replay``, the time replay): a local cluster serving a
trace's nodes as hollow nodes, a trace task as a one-pod job, and the GPU allocation and
fragmentation read back from the pods as stored.
"""

from __future__ import annotations

import csv
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.gputrace import TraceNode
from godel import local
from godel.client import ProtoClient
from placement.claims import holds_claim
from placement.gpufrag import (
    FGD_FILL_COVERAGE_PERCENT,
    MILLI_PER_GPU,
    GpuNodeState,
    ShapeMix,
    TaskShape,
    place,
    weighted_fragmentation,
)
from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb

CLUSTER_READY_SECONDS = 120.0
NODES_READY_SECONDS = 300.0
_ONE_CARD = TaskShape(0, 0, 1, MILLI_PER_GPU)
NEVER_FITS = "no node can ever hold this pod"  # the dispatcher's refusal of an oversized pod


class TraceRunError(Exception):
    """A run could not complete; the message says why."""


@dataclass(frozen=True, slots=True)
class TraceCluster:
    """A started cluster: the dispatcher's and the rescheduler's addresses, and the home whose
    certificates a client needs."""

    dispatcher: str
    rescheduler: str
    home: Path
    pids: tuple[int, ...]  # every process of the cluster, the store's included
    scheduler_pids: tuple[int, ...] = ()  # the scheduler shards' among them

    def cpu_seconds(self, pids: Sequence[int] | None = None) -> float:
        """CPU time (user + system) the cluster's processes (or ``pids`` of them) have used so
        far: on a shared machine the figure to trust where wall time is not (a process gone
        counts 0)."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in self.pids if pids is None else pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
        return total / ticks


def spaced_nodes(nodes: Sequence[TraceNode], count: int) -> list[TraceNode]:
    """``count`` nodes evenly spaced through the list, so its mix of models and sizes is kept
    (all of them for 0 or more than there are)."""
    if count <= 0 or count >= len(nodes):
        return list(nodes)
    return [nodes[i * len(nodes) // count] for i in range(count)]


def write_node_list(nodes: Sequence[TraceNode], path: Path) -> None:
    """The nodes as an openb-format node list (what ``--hollow-node-list`` reads)."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        for node in nodes:
            out.writerow([node.name, node.cpu_milli, node.memory >> 20, node.gpus, node.model])


def task_job(name: str, task: TaskShape) -> pb.Job:
    """One task as a one-pod job that runs until deleted (cpu, memory, gpus, gpuMilli for a
    share of one card, gpuModels from the trace's ``gpu_spec``)."""
    template = pb.PodTemplate(
        requests=pb.Resources(
            milli_cpu=task.cpu_milli, memory_bytes=task.memory, gpus=task.gpu_count
        ),
        gpu_milli=task.gpu_milli if task.is_share else 0,
        gpu_models=sorted(task.models),
    )
    return pb.Job(
        metadata=pb.ObjectMeta(name=name),
        spec=pb.JobSpec(replicas=1, min_member=1, template=template),
    )


def never_fits(violations: Sequence[api_pb2.FieldViolation]) -> bool:
    """Whether the dispatcher refused a job only because no node could ever hold its pod (the
    benchmarks count it unplaced, as the simulator does a task no node fits)."""
    return bool(violations) and all(NEVER_FITS in v.description for v in violations)


def stored_allocation(
    pods: Iterable[pb.Pod], nodes: Sequence[TraceNode], shapes: Mapping[str, TaskShape]
) -> dict[str, GpuNodeState]:
    """Every node's state from the pods holding room as stored (``placement.claims``: bound and
    not finished; an evicted pod is kept as a failed record); a pod's shape is its job's."""
    states = {node.name: node.initial_state() for node in nodes}
    for pod in sorted(pods, key=lambda p: (p.spec.job, p.metadata.name)):
        if holds_claim(pod) and pod.spec.job in shapes:
            name = pod.spec.node_name
            states[name] = place(states[name], shapes[pod.spec.job], list(pod.spec.gpu_cards))
    return states


def expected_fragmentation_milli(
    states: Iterable[GpuNodeState], running: Sequence[TaskShape]
) -> float:
    """The rescheduler's expected GPU fragmentation (``services/rescheduler/metrics.py``
    ``expected_gpu_fragmentation``) in milli-GPU rather than as a share of the free GPU: per
    node with free GPU and per shape of the running GPU pods (weighted by how many have it;
    one whole card when none runs), the free GPU that shape could not use
    (``placement.gpufrag``), averaged over the shapes and summed over the nodes."""
    gpu_shapes = [shape for shape in running if shape.gpu_count]
    mix = ShapeMix.of_tasks(gpu_shapes or [_ONE_CARD], FGD_FILL_COVERAGE_PERCENT)
    weighted = sum(weighted_fragmentation(s, mix) for s in states if s.free_gpu_milli)
    return weighted / mix.total if mix.total else 0.0


@contextmanager
def trace_cluster(
    nodes: Sequence[TraceNode],
    *,
    shards: int,
    nodeagents: int,
    scheduler_args: Sequence[str] = (),
    rescheduler_config: Mapping[str, object] | None = None,
) -> Iterator[TraceCluster]:
    """A fresh local cluster (its own store, a Binder, ``shards`` shards, node agents serving
    ``nodes`` as hollow nodes, every one Ready), stopped and removed on leaving.
    ``rescheduler_config`` is written as the rescheduler's ``--config`` file."""
    os.environ.pop("GODEL_REDIS_URL", None)  # its own store: an external one would mix data in
    tmp = Path(tempfile.mkdtemp(prefix="godel-gputrace-"))
    node_list = tmp / "nodes.csv"
    write_node_list(nodes, node_list)
    service_args: list[tuple[str, tuple[str, ...]]] = [("scheduler", tuple(scheduler_args))]
    if rescheduler_config is not None:
        config = tmp / "rescheduler.yaml"
        config.write_text(yaml.safe_dump(dict(rescheduler_config), sort_keys=False))
        service_args.append(("rescheduler", ("--config", str(config))))
    spec = local.ClusterSpec(
        schedulers=shards,
        binders=1,
        nodeagents=nodeagents,
        hollow_node_list=str(node_list),
        process_node=False,
        fsync="no",  # nothing here measures durability
        ready_timeout=CLUSTER_READY_SECONDS,
        service_args=tuple(service_args),
        dashboard=False,
    )
    home = local.GodelHome(tmp / "home")
    try:
        state = local.up(home, spec)
        cluster = TraceCluster(
            state.address_of("dispatcher"),
            state.address_of("rescheduler"),
            home.path,
            tuple(c.pid for c in state.components if c.pid is not None),
            tuple(c.pid for c in state.components if c.pid is not None and c.kind == "scheduler"),
        )
        with ProtoClient(cluster.dispatcher, timeout=120, home=home.path) as client:
            wait_nodes(client, {node.name for node in nodes})
        yield cluster
    finally:
        local.down(home)
        shutil.rmtree(tmp, ignore_errors=True)


def wait_nodes(client: ProtoClient, names: set[str], timeout: float = NODES_READY_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = {
            n.metadata.name
            for n in client.list(pb.Node)
            if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
        }
        if names <= ready:
            return
        time.sleep(0.5)
    raise TraceRunError(f"the {len(names)} listed nodes were not all Ready in {timeout:g}s")
