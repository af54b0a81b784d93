"""Micro-benchmark of the unit search alone (placement.search), one core, no services:

    PYTHONPATH=. python -m bench.search_micro basic          # SchedulingBasic's pods
    PYTHONPATH=. python -m bench.search_micro anti           # required anti-affinity, hostname
    PYTHONPATH=. python -m bench.search_micro preferred      # preferred pod affinity, hostname
    PYTHONPATH=. python -m bench.search_micro spread         # DoNotSchedule spread over zones
    PYTHONPATH=. python -m bench.search_micro gpushare       # GpuShares-1213's share pods
    ... [--nodes 5000] [--pods 10000] [--job 1000] [--mode godel|kube] [--reservations 1000]

Nodes as the hollow nodes are (4 CPU, 32 GiB, 110 pods; ``hostname`` and ``zone`` zone-0..3);
jobs of ``--job`` pods of 100m / 500 MiB, min_member 1, placed one unit after another into one
snapshot (assumed, as a shard's cycle does). Prints pods/s of the search itself: what the shard's
scheduling loop costs before the Binder and the store. ``--reservations N`` holds 1 CPU / 4 GiB
on each of the first N nodes for a job that never comes, and each pod is asked which holds it
may take, as the shard asks (``placement.reservations``).

``gpushare`` is GpuShares-1213's cluster and pods instead: the openb trace's 1,213 GPU nodes
(``--nodes`` of them, evenly spaced, when fewer), each job one share task of the trace's default
pod list drawn as ``bench.load.build_jobs`` draws them (init pods too); ``--placements FILE``
writes every pod's node and cards, to check that a change of speed changed no decision.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from bench.gputrace import GPU_NODES, load_nodes
from bench.load import draw_gpu_shares
from bench.workload import share_shapes
from placement.framework import Framework, PodInfo, Profile, UnitInfo
from placement.nodeinfo import NodeInfo
from placement.plugins import new_in_tree_registry
from placement.reservations import Reservations
from placement.search import SearchConfig, UnitScheduler
from placement.snapshot import Snapshot
from protos.godel.v1 import objects_pb2 as pb

ZONES = 4


def _nodes(n: int) -> list[NodeInfo]:
    out = []
    for i in range(n):
        node = pb.Node(metadata=pb.ObjectMeta(name=f"node-{i:05d}"))
        node.metadata.labels.update({"hostname": f"node-{i:05d}", "zone": f"zone-{i % ZONES}"})
        a = node.status.allocatable
        a.milli_cpu, a.memory_bytes, a.pods = 4000, 32 << 30, 110
        node.status.ready = True
        out.append(NodeInfo.from_node(node))
    return out


def _gpu_nodes(n: int) -> list[NodeInfo]:
    """``n`` of the openb trace's GPU nodes, evenly spaced (all of them for n >= 1,213)."""
    listed = load_nodes(GPU_NODES)
    n = min(n, len(listed))
    out = []
    for i in range(n):
        row = listed[i * len(listed) // n]
        node = pb.Node(metadata=pb.ObjectMeta(name=row.name))
        node.metadata.labels.update({"hostname": row.name, "zone": f"zone-{i % ZONES}"})
        a = node.status.allocatable
        a.milli_cpu, a.memory_bytes, a.pods, a.gpus = row.cpu_milli, row.memory, 110, row.gpus
        node.status.gpu_model = row.model
        node.status.ready = True
        out.append(NodeInfo.from_node(node))
    return out


def _share_units(prefix: str, pods: int, job: int) -> list[UnitInfo]:
    """GpuShares-1213's jobs: each one share task's shape, drawn as the load process does."""
    jobs = [pb.Job() for _ in range(0, pods, job)]
    for j in jobs:
        j.spec.template.requests.milli_cpu = 1  # replaced by the draw
    draw_gpu_shares(jobs, share_shapes("default"), random.Random(prefix))
    return [
        _unit(f"{prefix}-{k}", min(job, pods - k * job), j.spec.template)
        for k, j in enumerate(jobs)
    ]


def _template(kind: str) -> pb.PodTemplate:
    t = pb.PodTemplate()
    t.requests.milli_cpu, t.requests.memory_bytes = 100, 500 << 20
    req = pb.LabelSelectorRequirement
    if kind == "anti":
        t.labels["color"] = "green"
        term = t.affinity.pod_anti_affinity.required.add(topology_key="hostname")
        term.label_selector.add(key="color", operator=req.IN, values=["green"])
    elif kind == "preferred":
        t.labels["color"] = "red"
        w = t.affinity.pod_affinity.preferred.add(weight=1)
        w.term.topology_key = "hostname"
        w.term.label_selector.add(key="color", operator=req.IN, values=["red"])
    elif kind == "spread":
        t.labels["color"] = "blue"
        c = t.topology_spread_constraints.add(max_skew=1, topology_key="zone")
        c.label_selector.add(key="color", operator=req.IN, values=["blue"])
    return t


def _unit(
    job: str, size: int, template: pb.PodTemplate, held: Reservations | None = None
) -> UnitInfo:
    pods = []
    for i in range(size):
        p = pb.Pod(metadata=pb.ObjectMeta(name=f"{job}-{i}", resource_version=1))
        p.metadata.labels.update(template.labels)
        p.spec.job = job
        p.spec.template.CopyFrom(template)
        info = PodInfo.from_pod(p)
        pods.append(held.own(info, p) if held is not None else info)
    return UnitInfo(job, 1, 0, 0, pods)


def _reserve(snapshot: Snapshot, count: int) -> Reservations:
    held = Reservations()
    for i, info in enumerate(snapshot.nodes[:count]):
        rsv = pb.Reservation(metadata=pb.ObjectMeta(name=f"bench-reserved-{i}"))
        rsv.spec.template.requests.milli_cpu, rsv.spec.template.requests.memory_bytes = (
            1000,
            4 << 30,
        )
        rsv.spec.owner.job, rsv.spec.ttl_seconds = f"bench-reserved-{i}", 3600
        rsv.status.phase, rsv.status.node = pb.RESERVATION_RESERVED, info.name
        held.track(rsv, snapshot.infos, snapshot.infos.__getitem__)
    return held


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["basic", "anti", "preferred", "spread", "gpushare"])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--init", type=int, default=1000)
    ap.add_argument("--job", type=int, default=1000)
    ap.add_argument("--mode", choices=["godel", "kube"], default="godel")
    ap.add_argument("--reservations", type=int, default=0)
    ap.add_argument("--placements", type=Path, help="write each pod's node and cards here")
    args = ap.parse_args()

    gpu = args.kind == "gpushare"
    snapshot = Snapshot.of(_gpu_nodes(args.nodes) if gpu else _nodes(args.nodes))
    held = _reserve(snapshot, args.reservations) if args.reservations else None
    fw = Framework(Profile(), new_in_tree_registry())
    config = SearchConfig(mode=args.mode, feasible_cache=args.mode == "godel")
    scheduler = UnitScheduler(fw, config)
    plain = _template("basic")
    decisions: list[str] = []
    if gpu:
        for unit in _share_units("init", args.init, args.job):
            result = scheduler.schedule(unit, snapshot)
            decisions += [f"{p.pod} {p.node} {list(p.gpu_cards)}" for p in result.placements]
        units = _share_units("m", args.pods, args.job)
    else:
        for k in range(0, args.init, args.job):
            scheduler.schedule(_unit(f"init-{k}", min(args.job, args.init - k), plain), snapshot)
        template = _template(args.kind)
        units = [
            _unit(f"m-{k}", min(args.job, args.pods - k), template, held)
            for k in range(0, args.pods, args.job)
        ]
    placed = examined = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for unit in units:
        result = scheduler.schedule(unit, snapshot)
        placed += len(result.placements)
        examined += result.examined
        decisions += [f"{p.pod} {p.node} {list(p.gpu_cards)}" for p in result.placements]
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    # CPU time too: on a shared machine the wall clock also counts other processes' turns.
    print(
        f"{args.kind} ({args.mode}, {args.reservations} reservations): {placed}/{args.pods} "
        f"pods placed on {args.nodes} nodes in "
        f"{elapsed:.2f} s = {placed / elapsed:,.0f} pods/s (CPU {cpu:.2f} s = "
        f"{placed / cpu:,.0f} pods/CPU-s); {examined / max(placed, 1):.1f} nodes filtered per pod"
    )
    if args.placements:
        args.placements.write_text("\n".join(decisions) + "\n")


if __name__ == "__main__":
    main()
