"""One big job through the public API: how long its submit takes, how long until all its pods
exist and are bound, and how long the dispatcher's event loop stalled meanwhile.

    python -m bench.bigjob                  # 100,000 pods on 2,000 hollow nodes (50 each)
    python -m bench.bigjob --quick          # 10,000 pods on 200 nodes (what tests/test_bench.py runs)
    python -m bench.bigjob --pods 50000 --nodes 1000

It starts a local cluster (``godel.local.up``: the store and every service as processes of their
own, hollow nodes of 4 CPUs with room for the job: pods of 50 milli-CPU and 64 MiB), waits for
the nodes, then submits one job of ``--pods`` replicas (``min_member`` 1) with
``ProtoClient.submit`` at the client's default deadline, as a user's script would, and follows
it until every pod is bound:

- ``submit_seconds``: the submit call, client side; ``submit_error`` if it failed (a deadline
  exceeded: the job may still have been stored, and is followed all the same);
- ``created_seconds``: from the submit until every pod is stored (the job no longer carries
  ``godel.io/pods-created``, which its last chunk of pods clears in the same commit);
- ``bound_seconds``: until every pod is bound (the store's claims);
- ``status_bound_seconds``: until the job's status, as ``godel get jobs`` reads it, counts every
  pod bound or running; ``status_samples``: what the status said while the job was followed
  (each sample: seconds, pods created as the status says, bound + running);
- ``dispatcher_loop_lag``: the dispatcher's loop-lag probe (``services/runtime/looplag.py``)
  scraped before the submit and at the end: the greatest stall since the process started at
  each, and how many stalls over 50 ms, 100 ms and 1 s happened in between (its histogram);
  ``max_after`` greater than ``max_before`` is the longest stall the big job caused; the
  ``held_`` readings count only the loop thread's own CPU time (on a machine with more runnable
  processes than cores, a process also waits for a core: that is not the service's doing);
  ``loop_lag_max``: every service's greatest stall at the end (the shards' and the Binder's
  loops carry the big unit too), and ``loop_held_max`` the same in CPU time.

A report goes to ``--out`` as JSON; the summary is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from bench.harness import _StoreProbe
from godel import local
from godel.client import ClientError, ProtoClient
from protos.godel.v1 import objects_pb2 as pb

JOB = "big"
PODS_CREATED_ANNOTATION = "godel.io/pods-created"
LAG_MAX_METRIC = "godel_event_loop_lag_max_seconds"
HELD_MAX_METRIC = "godel_event_loop_held_max_seconds"
LAG_HISTOGRAM = "godel_event_loop_lag_seconds"
GC_PAUSE_HISTOGRAM = "godel_gc_pause_seconds"
GC_CPU_MAX_METRIC = "godel_gc_pause_cpu_max_seconds"
# Stalls counted from the histogram: its bucket bounds (seconds) that the report names.
STALL_BOUNDS = ("0.05", "0.1", "1.0")
_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class BigJob:
    pods: int = 100_000
    nodes: int = 2_000
    shards: int = 2
    # Per pod: 50 pods fill 2.5 of a hollow node's 4 CPUs and 3.2 of its 32 GiB.
    milli_cpu: int = 50
    memory_bytes: int = 64 << 20
    timeout_seconds: float = 1800.0
    # The store's fsync policy: every write on disk before it is acknowledged, as production.
    fsync: Literal["always", "everysec", "no"] = "always"
    # Extra command-line arguments of the dispatcher (e.g. a smaller creation chunk in tests).
    dispatcher_args: tuple[str, ...] = ()

    @classmethod
    def quick(cls) -> BigJob:
        return cls(pods=10_000, nodes=200, timeout_seconds=600.0)


@dataclass
class Report:
    pods: int
    nodes: int
    submit_seconds: float = 0.0
    submit_error: str = ""
    created_seconds: float | None = None
    bound_seconds: float | None = None
    status_bound_seconds: float | None = None
    bound: int = 0
    dispatcher_loop_lag: dict[str, Any] = field(default_factory=dict)
    loop_lag_max: dict[str, float] = field(default_factory=dict)
    loop_held_max: dict[str, float] = field(default_factory=dict)
    # (seconds since the submit, pods created as the status reads, bound + running)
    status_samples: list[tuple[float, int, int]] = field(default_factory=list)


def job(c: BigJob) -> pb.Job:
    out = pb.Job(metadata=pb.ObjectMeta(name=JOB))
    out.spec.replicas = c.pods
    out.spec.min_member = 1
    out.spec.template.requests.milli_cpu = c.milli_cpu
    out.spec.template.requests.memory_bytes = c.memory_bytes
    return out


def loop_lag(metrics_address: str) -> dict[str, float]:
    """The loop-lag probe's greatest stall and its histogram's cumulative counts at
    ``STALL_BOUNDS`` (and ``+Inf``), from one scrape of a service's Prometheus endpoint."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == LAG_MAX_METRIC:
            out["max"] = max(s.value for s in family.samples)
        elif family.name == HELD_MAX_METRIC:
            out["held"] = max(s.value for s in family.samples)
        elif family.name == LAG_HISTOGRAM:
            for s in family.samples:
                if s.name.endswith("_bucket") and s.labels["le"] in (*STALL_BOUNDS, "+Inf"):
                    out[s.labels["le"]] = s.value
        elif family.name == GC_CPU_MAX_METRIC:
            for s in family.samples:
                out[f"gc{s.labels['generation']}:cpu_max"] = s.value
        elif family.name == GC_PAUSE_HISTOGRAM:
            for s in family.samples:
                if s.name.endswith("_bucket") and s.labels["le"] in (STALL_BOUNDS[0], "+Inf"):
                    out[f"gc{s.labels['generation']}:{s.labels['le']}"] = s.value
    return out


def stalls(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The probe's readings before and after, as the report gives them."""
    total = after.get("+Inf", 0.0) - before.get("+Inf", 0.0)
    over: dict[str, float] = {
        f"over_{float(b) * 1000:g}ms": int(
            total - (after.get(b, 0.0) - before.get(b, 0.0))  # samples above the bound
        )
        for b in STALL_BOUNDS
    }
    # The collector's own pauses over 50 ms by generation (``services/runtime/gcpolicy.py``):
    # a collection is one step that cannot be sliced, so a stall it made shows here too.
    for generation in range(3):
        key, bound = f"gc{generation}:", STALL_BOUNDS[0]
        pauses = after.get(key + "+Inf", 0.0) - before.get(key + "+Inf", 0.0)
        under = after.get(key + bound, 0.0) - before.get(key + bound, 0.0)
        over[f"gc_gen{generation}_over_50ms"] = int(pauses - under)
        over[f"gc_gen{generation}_cpu_max_s"] = round(after.get(key + "cpu_max", 0.0), 4)
    return {
        "max_before_s": round(before.get("max", 0.0), 4),
        "max_after_s": round(after.get("max", 0.0), 4),
        "held_max_before_s": round(before.get("held", 0.0), 4),
        "held_max_after_s": round(after.get("held", 0.0), 4),
        "samples": int(total),
        **over,
    }


def follow(
    client: ProtoClient, probe: _StoreProbe, c: BigJob, submitted: float, report: Report
) -> None:
    """Poll the job (as ``godel get jobs`` reads it) and the store's claims until every pod is
    bound and the status says so, or the timeout."""
    deadline = submitted + c.timeout_seconds
    while time.monotonic() < deadline:
        now = time.monotonic() - submitted
        with contextlib.suppress(ClientError):
            stored = client.get(pb.Job, JOB)
            if report.created_seconds is None and (
                PODS_CREATED_ANNOTATION not in stored.metadata.annotations
            ):
                report.created_seconds = round(now, 2)
            created = _created(stored)
            placed = stored.status.bound + stored.status.running
            report.status_samples.append((round(now, 2), created, placed))
            if report.status_bound_seconds is None and placed >= c.pods:
                report.status_bound_seconds = round(now, 2)
        report.bound = probe.claims()
        if report.bound_seconds is None and report.bound >= c.pods:
            report.bound_seconds = round(time.monotonic() - submitted, 2)
        if report.bound_seconds is not None and report.status_bound_seconds is not None:
            return
        time.sleep(_POLL_SECONDS)


def _created(job: pb.Job) -> int:
    """How many of the job's pods are stored, as read: its creation mark while it has one."""
    mark = job.metadata.annotations.get(PODS_CREATED_ANNOTATION)
    if mark is None:
        return job.spec.replicas
    return int(mark) if mark.isdigit() else 0


def run(c: BigJob) -> Report:
    """A whole run on a fresh local cluster (stopped in every case)."""
    home = local.GodelHome(Path(tempfile.mkdtemp(prefix="godel-bigjob-")))
    spec = local.ClusterSpec(
        schedulers=c.shards,
        binders=1,
        hollow_nodes=c.nodes,
        nodeagents=max(1, c.nodes // 5000),
        process_node=False,
        fsync=c.fsync,
        ready_timeout=120.0,
        dashboard=False,
        service_args=(("dispatcher", c.dispatcher_args),) if c.dispatcher_args else (),
    )
    report = Report(c.pods, c.nodes)
    state = local.up(home, spec)
    try:
        dispatcher = next(r for r in state.components if r.kind == "dispatcher")
        with ProtoClient(state.address_of("dispatcher"), home=home.path) as client:
            deadline = time.monotonic() + 180 + c.nodes / 50
            while sum(1 for n in client.list(pb.Node) if n.status.ready) < c.nodes:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {c.nodes} hollow nodes were not ready in time")
                time.sleep(1.0)
            probe = _StoreProbe(state.store_url)
            try:
                before = loop_lag(dispatcher.metrics_address)
                submitted = time.monotonic()
                try:
                    response = client.submit([job(c)])  # the client's default deadline
                    bad = [r for r in response.results if r.violations]
                    if bad:
                        raise RuntimeError(f"the job was refused: {bad[0].violations}")
                except ClientError as exc:
                    report.submit_error = f"{type(exc).__name__}: {exc}"
                report.submit_seconds = round(time.monotonic() - submitted, 2)
                follow(client, probe, c, submitted, report)
            finally:
                probe.close()
            report.dispatcher_loop_lag = stalls(before, loop_lag(dispatcher.metrics_address))
            for component in state.components:
                if component.metrics_address:
                    with contextlib.suppress(OSError):
                        probe_now = loop_lag(component.metrics_address)
                        report.loop_lag_max[component.name] = round(probe_now.get("max", 0.0), 4)
                        held = probe_now.get("held", 0.0)
                        report.loop_held_max[component.name] = round(held, 4)
        return report
    finally:
        with contextlib.suppress(Exception):
            local.down(home)
        shutil.rmtree(home.path, ignore_errors=True)


def summary(report: Report) -> str:
    lag = report.dispatcher_loop_lag
    return (
        f"big job: {report.pods} pods on {report.nodes} nodes\n"
        f"submit call {report.submit_seconds:.2f}s"
        f"{' (' + report.submit_error + ')' if report.submit_error else ''}; "
        f"every pod stored {report.created_seconds}s, bound {report.bound_seconds}s "
        f"({report.bound}/{report.pods}), status shows them bound {report.status_bound_seconds}s\n"
        f"dispatcher loop: longest stall {lag.get('max_before_s')}s before the submit, "
        f"{lag.get('max_after_s')}s after; stalls over 50 ms / 100 ms / 1 s meanwhile: "
        f"{lag.get('over_50ms')} / {lag.get('over_100ms')} / {lag.get('over_1000ms')}; "
        f"collector pauses over 50 ms (generations 0 / 1 / 2): {lag.get('gc_gen0_over_50ms')} / "
        f"{lag.get('gc_gen1_over_50ms')} / {lag.get('gc_gen2_over_50ms')}, the longest in its "
        f"own CPU time {lag.get('gc_gen0_cpu_max_s')} / {lag.get('gc_gen1_cpu_max_s')} / "
        f"{lag.get('gc_gen2_cpu_max_s')}s\n"
        f"dispatcher loop, its own CPU time only: longest stall "
        f"{lag.get('held_max_before_s')}s before the submit, {lag.get('held_max_after_s')}s after\n"
        f"every service's longest stall: {report.loop_lag_max}\n"
        f"the same in the loop's own CPU time: {report.loop_held_max}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bigjob", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10,000 pods on 200 nodes")
    parser.add_argument("--pods", type=int, help="replicas of the job")
    parser.add_argument("--nodes", type=int, help="hollow nodes")
    parser.add_argument("--fsync", choices=("always", "everysec", "no"), default="always")
    parser.add_argument("--timeout", type=float, help="seconds to wait for every pod bound")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    c = BigJob.quick() if args.quick else BigJob()
    c = BigJob(
        **{
            **asdict(c),
            "pods": args.pods or c.pods,
            "nodes": args.nodes or c.nodes,
            "fsync": args.fsync,
            "timeout_seconds": args.timeout or c.timeout_seconds,
        }
    )
    report = run(c)
    print(summary(report))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = f"bigjob-{c.pods}{'-quick' if args.quick else ''}-{stamp}.json"
    (args.out / name).write_text(json.dumps({"bigjob": asdict(c), **asdict(report)}, indent=1))
    return 0 if report.bound == c.pods else 1


if __name__ == "__main__":
    sys.exit(main())
