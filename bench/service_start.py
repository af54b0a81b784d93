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

from bench.memory import AGENT, fill  # the same PaperScale-shaped state the memory bench holds
from bench.memory import own_settings as memory_settings
from services.binder.config import BinderConfig
from services.binder.service import BinderService
from services.dispatcher.service import DispatcherConfig, DispatcherService
from services.nodeagent.service import NodeAgentConfig, NodeAgentService
from services.runtime import ServiceHost
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
    result = asyncio.run(start(args.kind, args.store_url, args.cluster, args.profile, args.nodes))
    print(json.dumps({"kind": args.kind, **result}))


if __name__ == "__main__":
    main()
