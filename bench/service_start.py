"""A service's restart cost in-process: CPU seconds until a dispatcher, a scheduler shard or a
Binder answers SERVING over a store filled by ``bench.dispatcher_start fill`` (bench/README.md,
"Restart at scale").

    python -m bench.dispatcher_start fill --store-url URL --cluster C --nodes 2000 --jobs 100 --pods 1000
    python -m bench.service_start fill --store-url URL --cluster C --nodes 2000 --jobs 100 --pods 1000
    python -m bench.service_start scheduler --store-url URL --cluster C [--profile out.prof]

This module's ``fill`` writes PaperScale-20000's shape instead: hollow nodes as the node agent
registers them, and jobs of running pods as the dispatcher makes them (``pods_for``) and the
Binder and the agent leave them (bound to a node by a shard, started, PodScheduled).

Prints one JSON line: ``cpu_s`` (``time.process_time`` from before the service is built to
SERVING; the interpreter and imports excluded, paid before) and ``wall_s``. ``--profile``
writes a cProfile of the start (its CPU then inflated by the profiler)."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from protos.godel.v1 import objects_pb2 as pb
from services.binder.config import BinderConfig
from services.binder.service import BinderService
from services.dispatcher.controllers.pods import normalise_job, pods_for
from services.dispatcher.service import DispatcherConfig, DispatcherService
from services.nodeagent.nodes import Shape, hollow_nodes
from services.runtime import ServiceHost
from services.scheduler.service import SchedulerConfig, SchedulerService
from store import Store
from store.ops import MAX_OPS_PER_CALL

KINDS: dict[str, tuple[Any, Any]] = {
    "dispatcher": (DispatcherService, DispatcherConfig),
    "scheduler": (SchedulerService, SchedulerConfig),
    "binder": (BinderService, BinderConfig),
}


async def fill(url: str, cluster: str, nodes: int, jobs: int, pods: int) -> None:
    now_ms = int(time.time() * 1000)
    objs: list[Any] = hollow_nodes(
        nodes, prefix="hollow", agent="nodeagent-0", shape=Shape(), labels={}, taints=(), now=now_ms
    )
    for j in range(jobs):
        job = pb.Job(metadata=pb.ObjectMeta(name=f"job-{j}"))
        job.spec.replicas = job.spec.min_member = pods
        job.spec.template.requests.milli_cpu = 50
        job.spec.template.requests.memory_bytes = 200 << 20
        job = normalise_job(job)
        job.status.phase = pb.JOB_RUNNING
        job.status.running = pods
        objs.append(job)
        for i, pod in enumerate(pods_for(job)):
            pod.spec.node_name = f"hollow-{(j * pods + i) % nodes}"
            pod.status.scheduler = "scheduler-0"
            pod.status.phase = pb.POD_RUNNING
            pod.status.bound_ms = pod.status.started_ms = now_ms
            pod.status.conditions.add(type="PodScheduled", status="True", last_transition_ms=now_ms)
            objs.append(pod)
    store = await Store.connect(url, cluster=cluster)
    try:
        for at in range(0, len(objs), MAX_OPS_PER_CALL):
            await store.create_many(objs[at : at + MAX_OPS_PER_CALL])
    finally:
        await store.close()


async def start(kind: str, url: str, cluster: str, profile: str) -> dict[str, float]:
    service_cls, config_cls = KINDS[kind]
    with tempfile.TemporaryDirectory() as home:
        config = config_cls(
            name=f"{kind}-bench",
            port=0,
            store_url=url,
            cluster=cluster,
            home=Path(home),
            insecure=True,
        )
        profiler = cProfile.Profile() if profile else None
        cpu, wall = time.process_time(), time.monotonic()
        if profiler:
            profiler.enable()
        async with ServiceHost(service_cls, config):
            if profiler:
                profiler.disable()
                profiler.dump_stats(profile)
            return {
                "cpu_s": round(time.process_time() - cpu, 3),
                "wall_s": round(time.monotonic() - wall, 3),
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("kind", choices=[*sorted(KINDS), "fill"])
    parser.add_argument("--store-url", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--profile", default="", help="write a cProfile of the start here")
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--pods", type=int, default=1000)
    args = parser.parse_args()
    if args.kind == "fill":
        asyncio.run(fill(args.store_url, args.cluster, args.nodes, args.jobs, args.pods))
        return
    result = asyncio.run(start(args.kind, args.store_url, args.cluster, args.profile))
    print(json.dumps({"kind": args.kind, **result}))


if __name__ == "__main__":
    main()
