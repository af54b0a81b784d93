"""Micro-benchmark of the Binder alone: a real store server, a real Binder (in this process,
on loopback gRPC) and one shard's Decide stream sending every batch at once, so the committer
always has the next batch queued (what pipelining it can overlap with a commit in flight):

    PYTHONPATH=. python -m bench.binder_micro [--nodes 2000] [--batches 40] [--batch 250]
        [--unit-size N]

Each batch is one unit of ``--batch`` placements spread over the nodes (no topology rules: the
per-node checks, the reads and the commit); with ``--unit-size``, units (jobs) of that many pods
each, so ``--unit-size 1`` is a batch of one-pod jobs, what the Binder gets from one-pod
traffic. Prints pods/s from the first batch sent to the last verdict read, and this process's
CPU seconds (the Binder and the driver; the store server's work runs in its own process, which
is what overlaps).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc

from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services.binder.service import BinderConfig, BinderService
from services.runtime import ServiceHost
from store import Store
from store.client import Create
from store.server import StoreServer


def micro_node(i: int) -> pb.Node:
    """Node ``i`` of the micro-benchmarks' clusters: 4 CPUs, 32 GiB, 110 pods, four zones."""
    n = pb.Node(metadata=pb.ObjectMeta(name=f"node-{i:05d}"))
    n.metadata.labels.update({"hostname": n.metadata.name, "zone": f"zone-{i % 4}"})
    a = n.status.allocatable
    a.milli_cpu, a.memory_bytes, a.pods = 4000, 32 << 30, 110
    n.status.ready = True
    return n


def _job(name: str, replicas: int) -> tuple[pb.Job, list[pb.Pod]]:
    j = pb.Job(metadata=pb.ObjectMeta(name=name))
    j.spec.replicas, j.spec.min_member = replicas, 1
    t = j.spec.template
    t.requests.milli_cpu, t.requests.memory_bytes = 100, 500 << 20
    pods = []
    for i in range(replicas):
        p = pb.Pod(metadata=pb.ObjectMeta(name=f"{name}-{i}"))
        p.spec.job, p.spec.index = name, i
        p.spec.template.CopyFrom(t)
        p.status.phase = pb.POD_PENDING
        pods.append(p)
    return j, pods


async def run(args: argparse.Namespace, url: str) -> None:
    store = await Store.connect(url, cluster="binder-micro")
    await store.create_many([micro_node(i) for i in range(args.nodes)])
    batches: list[list[ipb.UnitDecision]] = []
    size = args.unit_size or args.batch
    for k in range(args.batches):
        made = [_job(f"j{k}-{u}", size) for u in range(args.batch // size)]
        await store.commit_many([[Create(job), *(Create(p) for p in pods)] for job, pods in made])
        batch = []
        for u, (job, pods) in enumerate(made):
            decision = ipb.UnitDecision(job=job.metadata.name, min_member=1)
            for i, p in enumerate(pods):
                node = f"node-{(k * args.batch + u * size + i) % args.nodes:05d}"
                decision.placements.add(
                    pod=p.metadata.name, node=node, pod_resource_version=p.metadata.resource_version
                )
            batch.append(decision)
        batches.append(batch)
    cfg = BinderConfig(store_url=url, cluster="binder-micro", name="b1", insecure=True)
    async with ServiceHost(BinderService, cfg) as host:
        while not (isinstance(host.service, BinderService) and host.service.is_leader):  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # the service offers no event for it
        async with grpc.aio.insecure_channel(host.address) as channel:
            call = internal_pb2_grpc.BinderStub(channel).Decide()
            start, cpu = time.perf_counter(), time.process_time()
            for k, batch in enumerate(batches):
                await call.write(ipb.DecisionBatch(shard="s", batch_id=k + 1, units=batch))
            bound = 0
            for _ in batches:
                answer: ipb.VerdictBatch = await call.read()
                bound += sum(v.code == ipb.BOUND for v in answer.verdicts)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            await call.done_writing()
    await store.close()
    total = args.batches * (args.batch // size) * size
    print(
        f"binder: {bound}/{total} pods bound in {elapsed:.2f} s = {bound / elapsed:,.0f} pods/s "
        f"(this process: CPU {cpu:.2f} s = {bound / cpu:,.0f} pods/CPU-s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--batch", type=int, default=250)
    ap.add_argument("--unit-size", type=int, default=0, help="pods per unit (0: the batch)")
    run_on_private_store(run, ap.parse_args())


def run_on_private_store(
    run: Callable[[argparse.Namespace, str], Coroutine[Any, Any, None]], args: argparse.Namespace
) -> None:
    """``run(args, store_url)`` against a store server of its own, stopped afterwards (the
    micro-benchmarks' cluster)."""
    with tempfile.TemporaryDirectory() as tmp:
        server = StoreServer.start(Path(tmp), fsync="everysec")
        try:
            asyncio.run(run(args, server.url))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
