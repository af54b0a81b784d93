"""Micro-benchmark of a scheduler shard alone: a real store server, a real Binder (in a process
of its own, so its CPU is not counted here), one shard in this process (on loopback gRPC) and
this process playing the dispatcher — every unit sent as the shard's credits allow:

    PYTHONPATH=. python -m bench.shard_micro [--nodes 2000] [--pods 10000] [--unit-size 1]
        [--profile FILE]

Units are jobs of ``--unit-size`` pods (1: one-pod jobs, which share a search; 1000: jobs of
1,000) of 100m / 500 MiB each. Prints pods/s from the first unit sent to the last outcome read,
and this process's CPU seconds per pod (the shard and the driver; the driver's part is building
and sending the units and reading the outcomes, the same for every tree). ``--profile`` writes
a cProfile of the measured phase to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import sys
import time
from typing import Any

import grpc

from bench.binder_micro import micro_node, run_on_private_store
from bench.shard_takeover import unit_of
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services.runtime import ServiceHost
from services.scheduler.service import SchedulerConfig, SchedulerService
from store import Store
from store.client import Create


def _job(name: str, replicas: int) -> tuple[pb.Job, list[pb.Pod]]:
    j = pb.Job(metadata=pb.ObjectMeta(name=name))
    j.spec.replicas, j.spec.min_member = replicas, 1
    j.spec.queue, j.spec.qos = "default", pb.QOS_GUARANTEED
    t = j.spec.template
    t.requests.milli_cpu, t.requests.memory_bytes = 100, 500 << 20
    pods = []
    for i in range(replicas):
        p = pb.Pod(metadata=pb.ObjectMeta(name=f"{name}-{i}"))
        p.spec.job, p.spec.index, p.spec.qos, p.spec.queue = name, i, pb.QOS_GUARANTEED, "default"
        p.spec.template.CopyFrom(t)
        p.status.phase = pb.POD_PENDING
        pods.append(p)
    return j, pods


async def _binder_address(store: Store) -> str:
    while True:
        lease = await store.get_lease("binder")
        if lease is not None and lease.holder_address:
            return lease.holder_address
        await asyncio.sleep(0.1)


async def run(args: argparse.Namespace, url: str) -> None:
    store = await Store.connect(url, cluster="shard-micro")
    await store.create_many([micro_node(i) for i in range(args.nodes)])
    units: list[ipb.Unit] = []
    made = [_job(f"j{k}", args.unit_size) for k in range(args.pods // args.unit_size)]
    for start in range(0, len(made), 200):
        chunk = made[start : start + 200]
        await store.commit_many([[Create(job), *(Create(p) for p in pods)] for job, pods in chunk])
    units.extend(unit_of(job, pods) for job, pods in made)
    binder = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.binder", "--store-url", url, "--cluster", "shard-micro",
        "--name", "b1", "--port", "0", "--insecure", "true", "--log-level", "warning",
        env=os.environ.copy(),
    )  # fmt: skip
    try:
        await _binder_address(store)
        cfg = SchedulerConfig(
            name="s1", store_url=url, cluster="shard-micro", port=0, insecure=True,
            log_level="warning",
        )  # fmt: skip
        async with ServiceHost(SchedulerService, cfg) as host:
            await _drive(args, host.address, units)
    finally:
        binder.terminate()
        await binder.wait()
        await store.close()


async def _drive(args: argparse.Namespace, address: str, units: list[ipb.Unit]) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        call: Any = internal_pb2_grpc.SchedulerStub(channel).Dispatch()
        credits = 0
        outcomes = 0
        done_pods = 0
        total = sum(len(u.pods) for u in units)
        profile = cProfile.Profile() if args.profile else None
        start = cpu = 0.0
        sent = 0
        while done_pods < total:
            msg = await call.read()
            if msg.HasField("credit"):
                credits += msg.credit.pods
            elif msg.HasField("outcomes"):
                for o in msg.outcomes.outcomes:
                    outcomes += 1
                    done_pods += len(o.pods)
            elif msg.HasField("outcome"):
                outcomes += 1
                done_pods += len(msg.outcome.pods)
            batch = []
            while sent < len(units) and credits >= len(units[sent].pods):
                credits -= len(units[sent].pods)
                batch.append(units[sent])
                sent += 1
            if batch:
                if not start:
                    start, cpu = time.perf_counter(), time.process_time()
                    if profile is not None:
                        profile.enable()
                for i in range(0, len(batch), 500):
                    await call.write(
                        ipb.DispatchMessage(units=ipb.UnitBatch(units=batch[i : i + 500]))
                    )
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)
        await call.done_writing()
    print(
        f"shard: {done_pods}/{total} pods in {elapsed:.2f} s = {done_pods / elapsed:,.0f} pods/s "
        f"(this process: CPU {cpu:.2f} s = {cpu * 1000 / max(done_pods, 1):.3f} ms/pod)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--unit-size", type=int, default=1)
    ap.add_argument("--profile", default="")
    run_on_private_store(run, ap.parse_args())


if __name__ == "__main__":
    main()
