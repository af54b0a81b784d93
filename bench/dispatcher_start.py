"""The dispatcher's restart cost in-process: CPU seconds until it answers SERVING over a store
holding ``jobs`` × ``pods`` bound pods on ``nodes`` nodes (bench/README.md, "Restart at scale").

    python -m bench.dispatcher_start fill  --store-url URL --cluster C --nodes 400 --jobs 20 --pods 1000
    python -m bench.dispatcher_start start --store-url URL --cluster C [--partitioning on]

``start`` prints one JSON line: ``cpu_s`` (``time.process_time`` from before the service is
built to SERVING, interpreter and imports excluded: they are paid before) and ``wall_s``. Run
it with ``PYTHONPATH`` at the tree to measure; run two trees' starts interleaved, as the
machine is shared and wall time is whatever the others leave."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import cast

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.partitions import Mode
from services.dispatcher.service import DispatcherConfig, DispatcherService
from services.runtime import ServiceHost
from store import Store
from store.ops import MAX_OPS_PER_CALL


def _node(name: str) -> pb.Node:
    n = pb.Node(metadata=pb.ObjectMeta(name=name))
    n.status.allocatable.milli_cpu = 64_000
    n.status.allocatable.memory_bytes = 256 << 30
    n.status.allocatable.pods = 110
    n.status.ready = True
    return n


def _bound_pods(job: str, count: int, nodes: int, first: int) -> list[pb.Pod]:
    out = []
    for i in range(count):
        p = pb.Pod(metadata=pb.ObjectMeta(name=f"{job}-{i}"))
        p.spec.job = job
        p.spec.index = i
        p.spec.qos = pb.QOS_GUARANTEED
        p.spec.template.requests.milli_cpu = 100
        p.spec.template.requests.memory_bytes = 256 << 20
        p.spec.node_name = f"n{(first + i) % nodes}"
        p.status.phase = pb.POD_RUNNING
        out.append(p)
    return out


async def fill(url: str, cluster: str, nodes: int, jobs: int, pods: int) -> None:
    store = await Store.connect(url, cluster=cluster)
    try:
        objs: list[pb.Node | pb.Job | pb.Pod] = [_node(f"n{i}") for i in range(nodes)]
        for j in range(jobs):
            job = pb.Job(metadata=pb.ObjectMeta(name=f"j{j}"))
            job.spec.replicas = job.spec.min_member = pods
            job.spec.qos = pb.QOS_GUARANTEED
            job.spec.template.requests.milli_cpu = 100
            job.spec.template.requests.memory_bytes = 256 << 20
            objs.append(job)
            objs.extend(_bound_pods(job.metadata.name, pods, nodes, j * pods))
        for at in range(0, len(objs), MAX_OPS_PER_CALL):
            await store.create_many(objs[at : at + MAX_OPS_PER_CALL])
    finally:
        await store.close()


async def start(url: str, cluster: str, partitioning: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as home:
        config = DispatcherConfig(
            name="dispatcher-bench",
            port=0,
            store_url=url,
            cluster=cluster,
            home=Path(home),
            insecure=True,
            partitioning=cast("Mode", partitioning),  # argparse's choices: one of them
            # Nothing heartbeats the filled nodes: with the default grace the dispatcher would
            # judge them lost and fail their pods, and every later start would list that instead.
            node_grace_seconds=1e9,
        )
        cpu, wall = time.process_time(), time.monotonic()
        async with ServiceHost(DispatcherService, config):
            return {
                "cpu_s": round(time.process_time() - cpu, 3),
                "wall_s": round(time.monotonic() - wall, 3),
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("fill", "start"))
    parser.add_argument("--store-url", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--nodes", type=int, default=400)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--partitioning", default="auto", choices=("auto", "on", "off"))
    args = parser.parse_args()
    if args.action == "fill":
        asyncio.run(fill(args.store_url, args.cluster, args.nodes, args.jobs, args.pods))
    else:
        print(json.dumps(asyncio.run(start(args.store_url, args.cluster, args.partitioning))))


if __name__ == "__main__":
    main()
