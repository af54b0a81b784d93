"""Store throughput from one Python process against a real server started for the run.

    python -m bench.store [--fsync always|everysec] [--writes 100000] [--units 300]
                          [--events 100000] [--batch 500] [--json PATH]

Prints (and optionally writes as JSON):
  * pipelined compare-and-set writes/s (update_many of Pod objects, batches of --batch);
  * atomic unit commits/s (one job + 100 pods, all or nothing) and the pods/s they carry;
  * watch events/s delivered to one informer catching up on --events changes.
Numbers are for this machine and this run; compare them to each other, not to a constant.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

from protos.godel.v1 import objects_pb2 as pb
from store import Store
from store.informer import Handlers, Informer
from store.server import StoreServer

UNIT_SIZE = 100


def _pod(name: str, job: str, index: int) -> pb.Pod:
    p = pb.Pod(metadata=pb.ObjectMeta(name=name))
    p.spec.job = job
    p.spec.index = index
    p.spec.qos = pb.QOS_GUARANTEED
    p.spec.template.requests.milli_cpu = 100
    p.spec.template.requests.memory_bytes = 500 << 20
    p.status.phase = pb.POD_PENDING
    return p


_last_progress = 0.0


def _progress(label: str, done: int, total: int, started: float) -> None:
    """A progress line, redrawn at most twice a second (on a terminal; a line per 5 s otherwise)."""
    global _last_progress
    now = time.perf_counter()
    tty = sys.stderr.isatty()
    if done < total and now - _last_progress < (0.5 if tty else 5.0):
        return
    _last_progress = now
    rate = done / max(now - started, 1e-9)
    line = f"  {label}: {done:,}/{total:,} ({rate:,.0f}/s)"
    sys.stderr.write(f"\r{line}   " if tty else f"{line}\n")
    sys.stderr.flush()


async def _timed(label: str, total: int, step: Callable[[int], Awaitable[int]]) -> float:
    """Run ``step(done)`` (returning how many it did) until ``total``; returns items/s."""
    done = 0
    started = time.perf_counter()
    while done < total:
        done += await step(done)
        _progress(label, done, total, started)
    elapsed = time.perf_counter() - started
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    return total / elapsed


async def bench_cas_writes(store: Store, writes: int, batch: int) -> float:
    pods = [_pod(f"cas-{i}", "cas", i) for i in range(batch)]
    for chunk in range(0, batch, 500):
        await store.create_many(pods[chunk : chunk + 500])

    async def step(done: int) -> int:
        for p in pods:
            p.status.attempts += 1
        results = await store.update_many(pods)  # CAS on each pod's current version
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            raise RuntimeError(f"unexpected CAS failure: {failures[0]}")
        return len(pods)

    return await _timed("pipelined CAS writes", writes, step)


async def bench_unit_commits(store: Store, units: int) -> float:
    async def step(done: int) -> int:
        job = pb.Job(metadata=pb.ObjectMeta(name=f"unit-{done}"))
        job.spec.replicas = job.spec.min_member = UNIT_SIZE
        await store.create_unit(
            job, [_pod(f"unit-{done}-{i}", f"unit-{done}", i) for i in range(UNIT_SIZE)]
        )
        return 1

    return await _timed(f"atomic {UNIT_SIZE}-pod unit commits", units, step)


async def bench_watch(store: Store, events: int, batch: int) -> float:
    informer = Informer(store, ["Pod"], block_ms=200)
    delivered = 0

    def count(*_: Any) -> None:
        nonlocal delivered
        delivered += 1

    informer.add_handlers(Handlers(on_add=count, on_update=count, on_delete=count))
    informer.start()
    await informer.wait_synced(30)
    await informer.stop()  # fall behind on purpose, then measure the catch-up
    delivered = 0
    sys.stderr.write(f"  writing {events:,} changes for the watch test...\n")
    pods = [_pod(f"watch-{i}", "watch", i) for i in range(events)]
    for chunk in range(0, events, batch):
        await store.create_many(pods[chunk : chunk + batch])
    target = await store.revision()
    started = time.perf_counter()
    informer.start()
    while informer.revision < target:
        await asyncio.sleep(0.05)
        _progress("watch events delivered", delivered, events, started)
    elapsed = time.perf_counter() - started
    _progress("watch events delivered", delivered, events, started)
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    await informer.stop()
    if delivered != events:
        raise RuntimeError(f"informer delivered {delivered} events, expected {events}")
    return events / elapsed


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="godel-bench-store-") as tmp:
        server = StoreServer.start(Path(tmp), fsync=opts.fsync)
        try:
            store = await Store.connect(server.url, cluster="bench")
            try:
                results = {
                    "cas_writes_per_s": await bench_cas_writes(store, opts.writes, opts.batch),
                    "unit_commits_per_s": await bench_unit_commits(store, opts.units),
                    "watch_events_per_s": await bench_watch(store, opts.events, opts.batch),
                }
            finally:
                await store.close()
        finally:
            server.stop()
    results["unit_pods_per_s"] = results["unit_commits_per_s"] * UNIT_SIZE
    return {
        "benchmark": "store",
        "machine": {
            "python": platform.python_version(),
            "cpus": _cpus(),
            "platform": platform.platform(),
        },
        "server": {"binary": server.binary, "fsync": opts.fsync},
        "params": {
            "writes": opts.writes,
            "units": opts.units,
            "events": opts.events,
            "batch": opts.batch,
        },
        "results": results,
    }


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Store throughput benchmark")
    parser.add_argument("--fsync", choices=["always", "everysec", "no"], default="always")
    parser.add_argument("--writes", type=int, default=100_000)
    parser.add_argument("--units", type=int, default=300)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--json", type=Path, help="also write the report here")
    opts = parser.parse_args(argv)
    report = uvloop.run(run(opts))
    r = report["results"]
    print(f"\nstore benchmark (fsync={opts.fsync}, {report['machine']['cpus']} cpus)")
    print(f"  pipelined CAS writes/s      {r['cas_writes_per_s']:>12,.0f}")
    print(
        f"  atomic unit commits/s       {r['unit_commits_per_s']:>12,.0f}"
        f"   ({r['unit_pods_per_s']:,.0f} pods/s in {UNIT_SIZE}-pod units)"
    )
    print(f"  watch events/s (informer)   {r['watch_events_per_s']:>12,.0f}")
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
