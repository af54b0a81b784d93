"""Memory per bound pod, per kind of service, in-process (bench/README.md, "Memory per bound
pod").

    python -m bench.memory [--nodes 2000 --jobs 100 --pods 1000] [--kinds scheduler,binder,...]
    python -m bench.memory --trace 25 --kinds scheduler     # where a shard's bytes are held
    python -m bench.memory --idle [--kinds ...] [--insecure]  # each kind's resident set at idle

It starts a store of its own and fills two clusters in it: one of ``nodes`` hollow nodes
alone, and one of the same nodes holding ``jobs`` × ``pods`` bound, running pods of
PaperScale-20000's shape (50m / 200 MiB, jobs of 1,000, 50 a node; each pod written as the
Binder and a node agent leave it). Then each kind of service is started in a fresh interpreter
against each cluster (jemalloc preloaded, as ``godel up`` does, returning freed pages at once),
and its resident set is read once it is SERVING (its informer synced; a shard's snapshot taken,
as its first cycle would) and collected: the bytes per pod are the difference between the two,
divided by the pods. ``--trace N`` starts the services under ``tracemalloc`` instead and
prints the N source lines holding the most of what the pods added (the full cluster's snapshot
minus the empty one's), with the bytes per pod of each.

``--idle`` measures what each kind costs before it holds anything: each is started as ``godel
up`` starts it (``python -P -m services.<kind>``, jemalloc preloaded, with TLS and a metrics
endpoint unless ``--insecure``) against an empty cluster, and once it is SERVING and has
settled its resident set is read from ``/proc/PID/smaps_rollup``: the whole (``rss``), what is
its own (``private_dirty``: the heap of its imports and state) and the pages of shared libraries
(``shared_clean``, counted in every process's RSS), with its threads and the modules it
imported (``-X importtime``'s lines, the heavy ones named).

A kind's bytes per pod times the pods it holds at the paper's scale, plus its resident set
over the empty cluster, is what it holds there before what churn adds (the allocator's
fragmentation, transient copies); PaperScale-20000's peak RSS is the figure with those.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from foundation.allocator import jemalloc_env
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.pods import normalise_job, pods_for
from services.nodeagent.nodes import Shape, hollow_nodes
from store import Store
from store.ops import MAX_OPS_PER_CALL
from store.server import StoreServer

KINDS = ("scheduler", "binder", "dispatcher", "rescheduler", "nodeagent")
IDLE_KINDS = (*KINDS, "dashboard")
# Packages no service needs at idle (each imported only on the rare path that uses it, or not
# at all); an idle service that imports one pays for it in every process.
HEAVY_PACKAGES = (
    *("rich", "pygments", "attr", "cryptography.hazmat", "networkx", "croniter", "yaml"),
    *("godel", "jsonschema", "bench"),
)
_SHARD = "scheduler-0"
AGENT = "nodeagent-0"
_PREFIX = "hollow"


def _jobs_and_pods(jobs: int, pods: int, nodes: int, now_ms: int) -> list[pb.Job | pb.Pod]:
    """Jobs of ``pods`` bound, running pods, spread ``pods * jobs / nodes`` a node."""
    out: list[pb.Job | pb.Pod] = []
    for j in range(jobs):
        job = pb.Job(metadata=pb.ObjectMeta(name=f"job-{j}"))
        job.spec.replicas = job.spec.min_member = pods
        job.spec.template.requests.milli_cpu = 50
        job.spec.template.requests.memory_bytes = 200 << 20
        job = normalise_job(job)
        job.status.phase = pb.JOB_RUNNING
        job.status.running = pods
        out.append(job)
        for i, pod in enumerate(pods_for(job)):
            pod.spec.node_name = f"{_PREFIX}-{(j * pods + i) % nodes}"
            pod.status.scheduler = _SHARD
            pod.status.phase = pb.POD_RUNNING
            pod.status.bound_ms = now_ms
            pod.status.started_ms = now_ms
            pod.status.conditions.add(type="PodScheduled", status="True", last_transition_ms=now_ms)
            out.append(pod)
    return out


async def fill(url: str, cluster: str, nodes: int, jobs: int, pods: int) -> None:
    now_ms = int(time.time() * 1000)
    store = await Store.connect(url, cluster=cluster)
    try:
        objs: list[Any] = hollow_nodes(
            nodes, prefix=_PREFIX, agent=AGENT, shape=Shape(), labels={}, taints=(), now=now_ms
        )
        objs.extend(_jobs_and_pods(jobs, pods, nodes, now_ms))
        for at in range(0, len(objs), MAX_OPS_PER_CALL):
            await store.create_many(objs[at : at + MAX_OPS_PER_CALL])
    finally:
        await store.close()


def own_settings(kind: str, nodes: int) -> dict[str, Any]:
    if kind == "dispatcher":  # no agent heartbeats these nodes: none is judged lost meanwhile
        return {"node_grace_seconds": 1e9}
    if kind == "nodeagent":  # the agent of every node, which runs every pod
        return {"hollow_nodes": nodes, "node_prefix": _PREFIX, "process_node": False}
    return {}


def _service(kind: str) -> tuple[type[Any], type[Any]]:
    if kind == "scheduler":
        from services.scheduler.service import SchedulerConfig, SchedulerService

        return SchedulerService, SchedulerConfig
    if kind == "binder":
        from services.binder.config import BinderConfig
        from services.binder.service import BinderService

        return BinderService, BinderConfig
    if kind == "dispatcher":
        from services.dispatcher.service import DispatcherConfig, DispatcherService

        return DispatcherService, DispatcherConfig
    if kind == "rescheduler":
        from services.rescheduler.service import ReschedulerConfig, ReschedulerService

        return ReschedulerService, ReschedulerConfig
    if kind == "nodeagent":
        from services.nodeagent.service import NodeAgentConfig, NodeAgentService

        return NodeAgentService, NodeAgentConfig
    raise SystemExit(f"error: kind must be one of {', '.join(KINDS)}, not {kind!r}")


async def measure(kind: str, url: str, cluster: str, nodes: int, trace: bool) -> dict[str, Any]:
    """Start one service against ``cluster``, wait until it serves, collect; its RSS (and with
    ``trace``, a tracemalloc snapshot written beside)."""
    from services.runtime import ServiceHost

    service_cls, config_cls = _service(kind)
    with tempfile.TemporaryDirectory() as home:
        config = config_cls(
            name={"scheduler": _SHARD, "nodeagent": AGENT}.get(kind, f"{kind}-0"),
            port=0,
            metrics_port=-1,
            store_url=url,
            cluster=cluster,
            home=Path(home),
            insecure=True,
            **own_settings(kind, nodes),
        )
        async with ServiceHost(service_cls, config) as host:
            await asyncio.sleep(2.0)  # what on_start left running settles
            if kind == "scheduler":
                # What the first cycle after the fill does: its snapshot takes every node.
                shard: Any = host.service
                shard.snapshot.update(shard.cache)
            gc.collect()
            out: dict[str, Any] = {"rss": psutil.Process().memory_info().rss}
            if trace:
                path = Path(home).parent / f"godel-memory-{kind}-{cluster}-{os.getpid()}.trace"
                tracemalloc.take_snapshot().dump(str(path))
                out["trace"] = str(path)
            return out


def _measure_in_child(kind: str, url: str, cluster: str, nodes: int, trace: bool) -> dict[str, Any]:
    env = jemalloc_env()
    # Freed pages go back at once: the resident set is what is held, not the high-water mark
    # of the start's listing (jemalloc keeps dirty pages ~10 s by default).
    env["MALLOC_CONF"] = "dirty_decay_ms:0,muzzy_decay_ms:0"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    args = [sys.executable]
    if trace:
        args += ["-X", "tracemalloc=1"]
    args += ["-m", "bench.memory", "--measure", kind, "--store-url", url, "--cluster", cluster]
    args += ["--nodes", str(nodes)]
    if trace:
        args.append("--trace=1")
    done = subprocess.run(args, env=env, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _top_lines(empty: str, full: str, pods: int, top: int) -> list[str]:
    before = tracemalloc.Snapshot.load(empty)
    after = tracemalloc.Snapshot.load(full)
    stats = after.compare_to(before, "lineno")
    total = sum(s.size_diff for s in stats)
    lines = [f"  traced: {total / pods:7.1f} B/pod in all"]
    for s in stats[:top]:
        frame = s.traceback[0]
        lines.append(
            f"  {s.size_diff / pods:7.1f} B/pod {s.count_diff / pods:6.2f} obj/pod"
            f"  {frame.filename.removeprefix(os.getcwd() + '/')}:{frame.lineno}"
        )
    return lines


def run(nodes: int, jobs: int, pods: int, kinds: list[str], top: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="godel-memory-") as tmp:
        server = StoreServer.start(Path(tmp) / "store", fsync="no")
        try:
            asyncio.run(fill(server.url, "empty", nodes, 0, 0))
            asyncio.run(fill(server.url, "full", nodes, jobs, pods))
            total = jobs * pods
            report: dict[str, Any] = {"nodes": nodes, "pods": total, "kinds": {}}
            for kind in kinds:
                empty = _measure_in_child(kind, server.url, "empty", nodes, top > 0)
                full = _measure_in_child(kind, server.url, "full", nodes, top > 0)
                per_pod = (full["rss"] - empty["rss"]) / total
                report["kinds"][kind] = {
                    "rss_empty_mib": round(empty["rss"] / 2**20, 1),
                    "rss_full_mib": round(full["rss"] / 2**20, 1),
                    "bytes_per_pod": round(per_pod),
                    "at_1m_pods_mib": round((empty["rss"] + per_pod * 1_000_000) / 2**20),
                }
                sys.stderr.write(f"{kind}: {json.dumps(report['kinds'][kind])}\n")
                if top:
                    for line in _top_lines(empty["trace"], full["trace"], total, top):
                        sys.stderr.write(line + "\n")
                    os.unlink(empty["trace"])
                    os.unlink(full["trace"])
            return report
        finally:
            server.stop()


def _smaps_rollup(pid: int) -> dict[str, int]:
    """``/proc/PID/smaps_rollup``'s figures, in bytes."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def imported_modules(importtime_log: str) -> list[str]:
    """The modules ``-X importtime`` says a process imported (an attempt that failed, as an
    optional dependency's that is not installed, is listed too)."""
    names = []
    for line in importtime_log.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                names.append(name)
    return names


def loaded_packages(modules: list[str], packages: Iterable[str]) -> set[str]:
    """Those of ``packages`` of which some submodule was loaded: a package really imported
    loads its parts, an attempt that was refused lists the bare name alone. (A package may be
    named with its parent: ``cryptography.x509``, where redis tries the bare ``cryptography``
    for its version alone.)"""
    return {p for p in packages if any(m.startswith(p + ".") for m in modules)}


def start_idle_service(
    kind: str,
    url: str,
    home: Path,
    insecure: bool,
    ports: list[int],
    stderr: Any,
    cluster: str = "idle",
) -> subprocess.Popen[bytes]:
    """One service of ``kind`` as ``godel up`` starts it (its own process, ``-X importtime``
    writing every import to ``stderr``), serving nothing yet; ``ports``: gRPC, metrics, web."""
    env = jemalloc_env()
    env["GODEL_STORE_URL"] = url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    name = AGENT if kind == "nodeagent" else f"{kind}-0"
    args = [sys.executable, "-P", "-X", "importtime", "-m", f"services.{kind}"]
    args += ["--name", name, "--host", "127.0.0.1", "--port", str(ports[0]), "--home", str(home)]
    args += ["--metrics-port", str(ports[1]), "--log-format", "json", "--cluster", cluster]
    if insecure:
        args += ["--insecure", "true"]
    if kind == "dashboard":
        args += ["--web-port", str(ports[2])]
    if kind == "nodeagent":  # one hollow node its certificate names, not this machine
        args += ["--hollow-nodes", "1", "--node-prefix", _PREFIX, "--process-node", "false"]
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def wait_serving(process: subprocess.Popen[bytes], port: int, home: Path, insecure: bool) -> None:
    """Until the service answers SERVING (asked as the admin, with TLS unless ``insecure``);
    a TimeoutError if it exits or takes two minutes."""
    from foundation import tls
    from services.runtime.healthcheck import SERVING, probe

    credentials = None if insecure else tls.load(home / "tls", tls.ADMIN)
    deadline = time.monotonic() + 120
    while probe(f"127.0.0.1:{port}", timeout=2.0, credentials=credentials) != SERVING:
        if process.poll() is not None or time.monotonic() > deadline:
            raise TimeoutError(
                f"the service on port {port} did not come up (exit {process.poll()})"
            )
        time.sleep(0.2)


def idle(kinds: list[str], insecure: bool, settle: float) -> dict[str, Any]:
    """Each kind's resident set at idle (``--idle``), one process at a time."""
    from foundation import pki
    from foundation.netutil import free_ports

    with tempfile.TemporaryDirectory(prefix="godel-memory-idle-") as tmp:
        home = Path(tmp)
        if not insecure:
            pki.init_cluster(home / "tls", agents={AGENT: [f"{_PREFIX}-0"]})
        server = StoreServer.start(home / "store", fsync="no")
        report: dict[str, Any] = {"tls": not insecure, "kinds": {}}
        try:
            for kind in kinds:
                ports = free_ports(3)
                log = home / f"{kind}.stderr"
                with log.open("wb") as stderr:
                    process = start_idle_service(kind, server.url, home, insecure, ports, stderr)
                    try:
                        wait_serving(process, ports[0], home, insecure)
                        time.sleep(settle)
                        smaps = _smaps_rollup(process.pid)
                        threads = len(os.listdir(f"/proc/{process.pid}/task"))
                    finally:
                        process.terminate()
                        process.wait(30)
                modules = imported_modules(log.read_text(errors="replace"))
                report["kinds"][kind] = {
                    "rss_mib": round(smaps["Rss"] / 2**20, 1),
                    "private_dirty_mib": round(smaps["Private_Dirty"] / 2**20, 1),
                    "shared_clean_mib": round(smaps["Shared_Clean"] / 2**20, 1),
                    "threads": threads,
                    "modules": len(modules),
                    "heavy_packages": sorted(loaded_packages(modules, HEAVY_PACKAGES)),
                }
                sys.stderr.write(f"{kind}: {json.dumps(report['kinds'][kind])}\n")
        finally:
            server.stop()
        return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--pods", type=int, default=1000, help="pods a job")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument(
        "--trace", type=int, default=0, metavar="N", help="print the N top lines by bytes"
    )
    parser.add_argument(
        "--idle", action="store_true", help="each kind's resident set at idle, started alone"
    )
    parser.add_argument("--insecure", action="store_true", help="--idle: services without TLS")
    parser.add_argument(
        "--settle", type=float, default=5.0, help="--idle: seconds after SERVING before reading"
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # a child's: one kind
    parser.add_argument("--store-url", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(
            json.dumps(
                asyncio.run(
                    measure(
                        args.measure, args.store_url, args.cluster, args.nodes, bool(args.trace)
                    )
                )
            )
        )
        return
    kinds = [k for k in args.kinds.split(",") if k]
    if args.idle:
        wanted = kinds if args.kinds != ",".join(KINDS) else list(IDLE_KINDS)
        print(json.dumps(idle(wanted, args.insecure, args.settle)))
        return
    print(json.dumps(run(args.nodes, args.jobs, args.pods, kinds, args.trace)))


if __name__ == "__main__":
    main()
