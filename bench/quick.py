"""A quick end-to-end throughput run: a real local cluster (every service its own process),
hollow nodes, jobs submitted through the Dispatcher's public API, submit -> bound.

    python -m bench.quick [--nodes 5000] [--pods 10000] [--job-size 1000] [--schedulers 1]

Prints pods/s from the first submit until every pod is bound. The full scheduler_perf-style
harness (percentiles, latency, CPU and RSS per component) builds on this.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from godel import local
from godel.client import GodelClient
from protos.godel.v1 import objects_pb2 as pb
from store import Store


def _job(name: str, replicas: int) -> pb.Job:
    job = pb.Job(metadata=pb.ObjectMeta(name=name))
    job.spec.replicas = replicas
    job.spec.min_member = 1
    job.spec.template.requests.milli_cpu = 100
    job.spec.template.requests.memory_bytes = 500 << 20
    return job


async def _bound(url: str) -> int:
    store = await Store.connect(url)
    try:
        return await store.claim_count()
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--job-size", type=int, default=1000)
    parser.add_argument("--schedulers", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600)
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="godel-bench-") as tmp:
        home = local.GodelHome(Path(tmp))
        spec = local.ClusterSpec(
            schedulers=opts.schedulers,
            binders=1,
            hollow_nodes=opts.nodes,
            process_node=False,
            ready_timeout=120,
        )
        state = local.up(home, spec)
        try:
            client = GodelClient(state.address_of("dispatcher"), timeout=120)
            while len(client.list("Node")) < opts.nodes:
                time.sleep(0.5)
            jobs = [_job(f"bench-{i}", opts.job_size) for i in range(opts.pods // opts.job_size)]
            started = time.perf_counter()
            for job in jobs:
                [result] = client.submit([job]).results
                if not result.created:
                    raise SystemExit(f"submit failed: {result.violations}")
            submitted = time.perf_counter() - started
            bound = 0
            while bound < opts.pods:
                if time.perf_counter() - started > opts.timeout:
                    raise SystemExit(f"timed out with {bound}/{opts.pods} bound")
                time.sleep(0.2)
                bound = asyncio.run(_bound(state.store_url))
                sys.stderr.write(f"\r  bound {bound:,}/{opts.pods:,}   ")
            elapsed = time.perf_counter() - started
            sys.stderr.write("\n")
            client.close()
        finally:
            local.down(home)
    print(
        f"{opts.pods:,} pods on {opts.nodes:,} hollow nodes, {opts.schedulers} shard(s): "
        f"submitted in {submitted:.1f}s, all bound in {elapsed:.1f}s -> "
        f"{opts.pods / elapsed:,.0f} pods/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
