"""A service's restart cost in-process: CPU seconds until a dispatcher, a scheduler shard, a
Binder or a node agent answers SERVING over a store filled by ``bench.dispatcher_start fill``
(bench/README.md, "Restart at scale").

    python -m bench.dispatcher_start fill --store-url URL --cluster C --nodes 2000 --jobs 100 --pods 1000
    python -m bench.service_start fill --store-url URL --cluster C --nodes 2000 --jobs 100 --pods 1000
    python -m bench.service_start scheduler --store-url URL --cluster C [--profile out.prof]
    python -m bench.service_start nodeagent --store-url URL --cluster C --nodes 2000

The node agent is started as ``bench.memory`` starts it: the agent of every filled node
(``--nodes``, the fill's), which resumes every pod (registration included in its start).

Its ``fill`` (``bench.memory``'s) writes PaperScale-20000's shape instead: hollow nodes as the node agent
registers them, and jobs of running pods as the dispatcher makes them (``pods_for``) and the
Binder and the agent leave them (bound to a node by a shard, started, PodScheduled).

Prints one JSON line: ``cpu_s`` (``time.process_time`` from before the service is built to
SERVING; the interpreter and imports excluded, paid before) and ``wall_s``. ``--profile``
writes a cProfile of the start (its CPU then inflated by the profiler).

``--process`` starts the kind as the cluster does instead — a process of its own (``python -P
-m services.<kind>``, jemalloc preloaded when installed, JSON logs, metrics served) over the
filled store, plaintext — and times it as the harness's restarts do: from the spawn until a
health check (``probe``, a new connection each, 1 s timeout, every 20 ms) answers SERVING,
``cpu_s`` being the process's user + system CPU by then. It adds ``marks``: seconds from the
spawn to each start-up log line (``starting``: the interpreter and imports paid; ``informer
listed`` with its ``fetch_s`` and ``build_s``; ``serving``), so the gap between ``serving``
and ``wall_s`` is what the process did before it answered (bench/README.md, "Restart at
scale").

    python -m bench.service_start dispatcher --process --store-url URL --cluster C"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from bench.memory import AGENT, fill  # the same PaperScale-shaped state the memory bench holds
from bench.memory import own_settings as memory_settings
from foundation.allocator import jemalloc_env
from foundation.netutil import free_ports
from services.binder.config import BinderConfig
from services.binder.service import BinderService
from services.dispatcher.service import DispatcherConfig, DispatcherService
from services.nodeagent.service import NodeAgentConfig, NodeAgentService
from services.runtime import ServiceHost
from services.runtime.healthcheck import SERVING, probe
from services.scheduler.service import SchedulerConfig, SchedulerService

KINDS: dict[str, tuple[Any, Any]] = {
    "dispatcher": (DispatcherService, DispatcherConfig),
    "scheduler": (SchedulerService, SchedulerConfig),
    "binder": (BinderService, BinderConfig),
    "nodeagent": (NodeAgentService, NodeAgentConfig),
}

# No agent heartbeats the filled nodes: a dispatcher judging them lost would fail their pods
# in the store, and every later start would list a different state.
OWN_SETTINGS: dict[str, dict[str, Any]] = {"dispatcher": {"node_grace_seconds": 1e9}}


async def start(
    kind: str, url: str, cluster: str, profile: str, nodes: int = 2000
) -> dict[str, float]:
    """``nodes``: the fill's (the node agent serves them all)."""
    service_cls, config_cls = KINDS[kind]
    own = memory_settings(kind, nodes) if kind == "nodeagent" else OWN_SETTINGS.get(kind, {})
    with tempfile.TemporaryDirectory() as home:
        config = config_cls(
            name=AGENT if kind == "nodeagent" else f"{kind}-bench",
            port=0,
            store_url=url,
            cluster=cluster,
            home=Path(home),
            insecure=True,
            **own,
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


# The start-up log lines ``--process`` reports the time of (seconds from the spawn).
MARKS = ("starting", "listening", "informer listed", "serving")
PROCESS_SERVING_SECONDS = 600.0


def start_process(kind: str, url: str, cluster: str) -> dict[str, Any]:
    """The kind started as a process of its own, timed to its first SERVING answer (module)."""
    settings = {
        f"--{key.replace('_', '-')}": str(value)
        for key, value in OWN_SETTINGS.get(kind, {}).items()
    }
    with tempfile.TemporaryDirectory() as home:
        port, metrics_port = free_ports(2)
        command = [
            sys.executable, "-P", "-m", f"services.{kind}",
            "--name", f"{kind}-bench",
            "--host", "127.0.0.1",
            "--port", str(port),
            "--home", home,
            "--cluster", cluster,
            "--log-format", "json",
            "--insecure", "true",
            "--metrics-host", "127.0.0.1",
            "--metrics-port", str(metrics_port),
            *(part for pair in settings.items() for part in pair),
        ]  # fmt: skip
        log_path = Path(home) / "service.log"
        env = jemalloc_env({**os.environ, "PYTHONUNBUFFERED": "1", "GODEL_STORE_URL": url})
        with log_path.open("w") as log:
            spawned_at, spawned_wall = time.monotonic(), time.time()
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=home
            )
        try:
            while probe(f"127.0.0.1:{port}", timeout=1) != SERVING:
                if process.poll() is not None or (
                    time.monotonic() - spawned_at > PROCESS_SERVING_SECONDS
                ):
                    raise RuntimeError(f"{kind} did not serve:\n{log_path.read_text()[-4000:]}")
                time.sleep(0.02)
            wall = time.monotonic() - spawned_at
            used = psutil.Process(process.pid).cpu_times()
        finally:
            process.terminate()
            process.wait(60)
        marks: dict[str, float] = {}
        listed: dict[str, float] = {}
        for line in log_path.read_text().splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            name = event.get("event")
            if name in MARKS and name not in marks:
                at = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
                marks[name] = round(at.timestamp() - spawned_wall, 3)
                if name == "informer listed":
                    listed = {k: event[k] for k in ("fetch_s", "build_s")}
        return {
            "cpu_s": round(used.user + used.system, 3),
            "wall_s": round(wall, 3),
            "marks": marks,
            **listed,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("kind", choices=[*sorted(KINDS), "fill"])
    parser.add_argument("--store-url", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--profile", default="", help="write a cProfile of the start here")
    parser.add_argument(
        "--process",
        action="store_true",
        help="start the kind as a process of its own and time it to its first SERVING answer",
    )
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--pods", type=int, default=1000)
    args = parser.parse_args()
    if args.process and args.kind == "nodeagent":
        parser.error("--process: the node agent is timed in-process only (its own settings)")
    if args.kind == "fill":
        asyncio.run(fill(args.store_url, args.cluster, args.nodes, args.jobs, args.pods))
        return
    if args.process:
        result = start_process(args.kind, args.store_url, args.cluster)
    else:
        result = asyncio.run(
            start(args.kind, args.store_url, args.cluster, args.profile, args.nodes)
        )
    print(json.dumps({"kind": args.kind, **result}))


if __name__ == "__main__":
    main()
