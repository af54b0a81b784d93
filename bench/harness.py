"""The benchmark harness: one real local cluster per run, measured submit -> bound.

For each run of a workload file it starts the store and every service as separate processes
(``godel.local.up`` in a temporary GODEL_HOME), waits for every hollow node to be ready, submits
and waits for the init pods (not measured), then starts the load process (``python -m
bench.load``) and samples the number of bound pods (``Store.claim_count``) and every process's
CPU and RSS once a second until every measured pod is bound. The cluster is stopped in every
case (``godel.local.down`` in ``finally``), Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import functools
import json
import os
import platform
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import psutil
import structlog
from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.load import build_jobs
from bench.workload import SERVICE_KINDS, PodPhase, Reservations, Suite, Workload
from foundation.allocator import allocator_in, jemalloc_env
from godel import local
from godel.client import ProtoClient, ReschedulerClient
from godel.local.cluster import SPARE_PREFIX, probe_credentials
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.eviction import replacement_number
from services.nodeagent.nodelist import COLUMNS as NODE_LIST_COLUMNS
from services.nodeagent.nodelist import ListedNode
from services.runtime.healthcheck import probe
from services.scheduler.shardlease import shard_lease
from store import NotFoundError, Store
from store.server import allocator_of, find_server_binary

log = structlog.get_logger(__name__)

Fsync = Literal["always", "everysec", "no"]
INIT_PREFIX = "init"
# Init pods submitted and not yet bound, at most (half the default queue's admission limit).
INIT_IN_FLIGHT = 100_000
MEASURED_PREFIX = "m"
_SAMPLE_SECONDS = 1.0
# Shards write their counters into their records every status_seconds (5 s by default), when
# they changed. The bench asks for one second (a write a second per shard costs nothing worth
# measuring) unless the workload sets its own, and waits a little longer than that before
# reading them, so the reading covers everything up to now.
_SHARD_STATUS_SECONDS = "1"
_COUNTERS_FLUSH_MARGIN_SECONDS = 0.5
# A restarted service (``restart: true``): its graceful stop, then its start to SERVING.
_RESTART_STOP_SECONDS = 30.0
_RESTART_SERVING_SECONDS = 600.0
# The health entry only the Binder leader reports SERVING (services/binder/leadership.py).
BINDER_SERVICE = ipb.DESCRIPTOR.services_by_name["Binder"].full_name
# The health entry only a process serving as a shard reports SERVING (a standby shard does not).
SCHEDULER_SERVICE = ipb.DESCRIPTOR.services_by_name["Scheduler"].full_name
# After the init pods are bound, their node agents still report them running and every
# informer decodes those reports: the measured phase waits until the change feed is quiet (at
# most _SETTLE_QUIET_CHANGES changes in a poll) and no service's informer is behind, or until
# _SETTLE_MAX_SECONDS have passed (then it measures anyway, and says so).
_SETTLE_POLL_SECONDS = 0.5
_SETTLE_QUIET_CHANGES = 50
_SETTLE_MAX_SECONDS = 300.0
_INFORMER_LAG_METRIC = "godel_store_informer_lag_seconds"
_LEASE_LATENESS_METRIC = "godel_lease_renewal_lateness_max_seconds"
_MIN_PARTIAL_SAMPLE = 0.2
"""The interval holding the last bind counts as a sample only if at least this long (unless
it is the only one)."""


class BenchError(Exception):
    """A run could not complete; the message says why (and where the logs were kept)."""


@dataclass
class ProcessUsage:
    """CPU and memory of one process over the measured phase."""

    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0
    _proc: psutil.Process | None = field(default=None, repr=False)
    _cpu_start: float = field(default=0.0, repr=False)

    def sample(self) -> None:
        if self._proc is None:
            return
        try:
            with self._proc.oneshot():
                times = self._proc.cpu_times()
                rss = self._proc.memory_info().rss
        except psutil.Error:
            self._proc = None  # exited: keep what was last seen
            return
        self.cpu_seconds = times.user + times.system - self._cpu_start
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)

    @classmethod
    def start(cls, pid: int | None) -> ProcessUsage:
        usage = cls()
        if pid is None:
            return usage
        try:
            usage._proc = psutil.Process(pid)
            times = usage._proc.cpu_times()
            usage._cpu_start = times.user + times.system
        except psutil.Error:
            usage._proc = None
        usage.sample()
        return usage

    def to_json(self) -> dict[str, float]:
        return {
            "cpu_seconds": round(self.cpu_seconds, 2),
            "peak_rss_mib": round(self.peak_rss_bytes / (1 << 20), 1),
        }


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (what scheduler_perf reports for its samples)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[min(len(ordered), int(rank)) - 1]


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "store_allocator": allocator_of(find_server_binary()),
        "services_allocator": allocator_in(jemalloc_env()),
    }


@contextmanager
def _terminate_on_sigterm() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the `finally` blocks stop the cluster."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _StoreProbe:
    """A store connection on a private event loop, for sync sampling."""

    def __init__(self, url: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._store = self._loop.run_until_complete(Store.connect(url))

    def claims(self) -> int:
        return self._loop.run_until_complete(self._store.claim_count())

    def revision(self) -> int:
        return self._loop.run_until_complete(self._store.revision())

    def claims_of(self, prefix: str) -> int:
        """Claims held by pods of jobs named ``<prefix>-…`` (one HGETALL: only for workloads
        where the total does not show progress, e.g. preemption keeps it constant)."""
        claims = self._loop.run_until_complete(self._store.claims())
        return sum(1 for pod in claims if pod.startswith(f"{prefix}-"))

    def shard_counters(self) -> tuple[int, int, int, int]:
        """(pods proposed, bound, conflicted, shards holding a partition) summed over the
        shards' SchedulerInstance records, as their last status write left them."""
        instances, _ = self._loop.run_until_complete(self._store.list_all(pb.SchedulerInstance))
        proposed = sum(i.status.proposed_pods for i in instances)
        bound = sum(i.status.bound_pods for i in instances)
        conflicted = sum(i.status.conflicted_pods for i in instances)
        return proposed, bound, conflicted, sum(1 for i in instances if i.spec.partition)

    def binder_epoch(self) -> int:
        """The Binder lease's epoch: each change of leader (or re-election) adds one."""
        lease = self._loop.run_until_complete(self._store.get_lease("binder"))
        return lease.epoch if lease is not None else 0

    def shard_holder_address(self, shard: str) -> str:
        """The address of the process holding shard ``shard``'s name ("" when none does)."""
        lease = self._loop.run_until_complete(self._store.get_lease(shard_lease(shard)))
        return lease.holder_address if lease is not None and lease.holder else ""

    def shard_record_address(self, shard: str) -> str:
        """The address shard ``shard``'s record names ("" without a record)."""
        try:
            inst = self._loop.run_until_complete(self._store.get(pb.SchedulerInstance, shard))
        except NotFoundError:
            return ""
        return str(inst.spec.address)

    def serves_as_shard(self, shard: str, credentials: Any) -> bool:
        """Whether a process holds ``shard``'s name and says SERVING for the Scheduler service
        (which a shard says only once registered; a standby never)."""
        address = self.shard_holder_address(shard)
        return bool(address) and probe(address, SCHEDULER_SERVICE, 1, credentials) == "SERVING"

    def close(self) -> None:
        self._loop.run_until_complete(self._store.close())
        self._loop.close()


def run_suite(
    suite: Suite,
    *,
    quick: bool,
    fsync: Fsync = "always",
    rate: float | None = None,
    keep_logs: Path | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run every variant of a workload file in order; return the report (see bench/README.md)."""
    console = console or Console(stderr=True)
    started = time.time()
    runs = []
    with _terminate_on_sigterm():
        for workload in suite.runs:
            runs.append(
                run_one(workload, fsync=fsync, rate=rate, keep_logs=keep_logs, console=console)
            )
    report: dict[str, Any] = {
        "workload": suite.name,
        "description": suite.description,
        "file": str(suite.path),
        "quick": quick,
        "fsync": fsync,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "command": " ".join(["python -m bench", *sys.argv[1:]]) if sys.argv else "",
        "machine": machine(),
        "baseline": suite.baseline,
        "runs": runs,
    }
    if suite.baseline:
        base = next(r for r in runs if r["variant"] == suite.baseline)
        for r in runs:
            r["ratio_to_baseline"] = _ratios(r, base)
    return report


def _ratios(run: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 2) if b else None

    return {
        "average": ratio(run["throughput"]["average"], base["throughput"]["average"]),
        "overall": ratio(run["throughput"]["overall"], base["throughput"]["overall"]),
        "latency_p50": ratio(run["latency_ms"]["p50"], base["latency_ms"]["p50"]),
    }


def run_one(
    workload: Workload,
    *,
    fsync: Fsync = "always",
    rate: float | None = None,
    keep_logs: Path | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """One run on a fresh cluster; the cluster is gone when this returns or raises."""
    console = console or Console(stderr=True)
    shape = workload.cluster
    log.info("starting cluster", workload=workload.name, nodes=shape.nodes, shards=shape.shards)
    with _fresh_cluster(workload, fsync, "godel-bench-", keep_logs) as (state, home):
        if shape.pin_shards:
            pin_shards(state)
        with _progress(console) as progress:
            result = _run_workload(workload, state, home, rate, progress, console)
        if result["bound"] != workload.measured.count:
            raise BenchError(
                f"{workload.name}: only {result['bound']}/{workload.measured.count} measured pods"
                f" bound within {workload.timeout:g}s"
            )
        return result


@contextlib.contextmanager
def _fresh_cluster(
    workload: Workload, fsync: Fsync, prefix: str, keep_logs: Path | None = None
) -> Iterator[tuple[local.ClusterState, local.GodelHome]]:
    """A cluster of the workload's shape on a store of its own (an external one would mix in
    other data), gone when the block ends; its service logs copied to ``keep_logs`` if the
    block (or the start) failed."""
    os.environ.pop("GODEL_REDIS_URL", None)
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    home = local.GodelHome(tmp)
    failed = True
    try:
        yield local.up(home, _cluster_spec(workload, fsync, tmp)), home
        failed = False
    finally:
        _tear_down(workload, home, keep_logs if failed else None)
        shutil.rmtree(tmp, ignore_errors=True)


def _cluster_spec(workload: Workload, fsync: Fsync, tmp: Path) -> local.ClusterSpec:
    """What ``godel up`` starts for the workload; a node list's selected rows are written to
    ``tmp`` (the node agents read them from there)."""
    shape = workload.cluster
    node_list = ""
    if shape.node_list:
        node_list = str(tmp / "nodes.csv")
        write_node_list(shape.selected_nodes(), node_list)
    scheduler_args = _scheduler_args(workload)
    service_args = [
        ("nodeagent", _nodeagent_flags(workload)),
        ("scheduler", _flags(scheduler_args)),
        *(
            (kind, _flags(args))
            for kind, args in shape.service_args.items()
            if kind not in ("nodeagent", "scheduler")
        ),
    ]
    return local.ClusterSpec(
        schedulers=shape.shards,
        standby_shards=shape.standby_shards,
        binders=shape.binders,
        nodeagents=shape.nodeagents,
        hollow_nodes=shape.nodes,
        hollow_node_list=node_list,
        process_node=False,
        fsync=fsync,
        ready_timeout=120.0,
        service_args=tuple(service_args),
        dashboard=False,  # a watcher of every pod would take CPU from what is measured
    )


def _run_workload(
    workload: Workload,
    state: local.ClusterState,
    home: local.GodelHome,
    rate: float | None,
    progress: Progress,
    console: Console,
) -> dict[str, Any]:
    """The workload on a started cluster: nodes up, the init pods, the measured phase, then
    latencies, rescheduling and restarts as the workload asks. The load process is gone when
    this returns or raises."""
    shape = workload.cluster
    client = ProtoClient(state.address_of("dispatcher"), timeout=120, home=home.path)
    load: subprocess.Popen[bytes] | None = None
    try:
        alive = functools.partial(_check_alive, state)
        _wait_nodes(client, shape.nodes, progress, 180 + shape.nodes / 100, alive)
        if workload.reservations is not None:
            _reserve(client, workload.reservations, progress, workload.timeout)
        probe = _StoreProbe(state.store_url)
        try:
            epochs = [probe.binder_epoch()]
            init = _init_pods(client, probe, workload, progress, alive)
            settle = _settle(probe, state, progress, alive)
            counters_flush = _counters_flush_seconds(workload)
            time.sleep(counters_flush)  # the shards' counters after init
            before = probe.shard_counters()
            epochs.append(probe.binder_epoch())
            load, result = _measure(workload, state, probe, home, rate, progress, init)
            result["settle"] = settle
            time.sleep(counters_flush)
            result["conflicts"] = _conflicts(before, probe.shard_counters())
            epochs.append(probe.binder_epoch())
            result["leadership"] = _leadership(state, epochs)
        finally:
            probe.close()
        result["latency_ms"], result["bound"], last_bound_ms = _latencies(client)
        _finish_times(result, last_bound_ms)
        if workload.reschedule is not None:
            result["reschedule"] = _reschedule(workload, state, home, console)
        if workload.restart:
            result["restart_cpu_seconds"] = {}
            result["binding_resumed_seconds"] = {}
            result["scheduling_resumed_seconds"] = {}
            result["restart_seconds"] = _restart_each(
                state,
                home,
                console,
                result["restart_cpu_seconds"],
                result["binding_resumed_seconds"],
                result["scheduling_resumed_seconds"],
            )
            takeover = _binder_takeover(state, home, console)
            if takeover is not None:
                result["takeover_seconds"] = takeover
            shard_takeover = _shard_takeover(state, home, console)
            if shard_takeover is not None:
                result["shard_takeover_seconds"] = shard_takeover
        return result
    finally:
        client.close()
        if load is not None and load.poll() is None:
            load.kill()
            load.wait()


def _scheduler_args(workload: Workload) -> dict[str, str]:
    """The shards' flags: the workload's, over the bench's status period."""
    own = workload.cluster.service_args.get("scheduler", {})
    return {"status-seconds": _SHARD_STATUS_SECONDS} | {
        key.replace("_", "-"): value for key, value in own.items()
    }


def _counters_flush_seconds(workload: Workload) -> float:
    """How long until every shard has written its counters as they stand now."""
    return float(_scheduler_args(workload)["status-seconds"]) + _COUNTERS_FLUSH_MARGIN_SECONDS


def _tear_down(workload: Workload, home: local.GodelHome, keep_logs: Path | None) -> None:
    """Stop the cluster; with ``keep_logs`` (a failed run), copy its service logs there."""
    outcomes = local.down(home)
    killed = [name for name, outcome in outcomes if outcome == "killed"]
    if killed:
        log.warning("components had to be killed", components=killed)
    if keep_logs is not None and home.logs_dir.exists():
        dest = keep_logs / f"{workload.name.replace('/', '-')}-logs-{int(time.time())}"
        shutil.copytree(home.logs_dir, dest, dirs_exist_ok=True)
        log.warning("run failed; service logs kept", logs=str(dest))


def _restart_each(
    state: local.ClusterState,
    home: local.GodelHome,
    console: Console,
    cpu_seconds: dict[str, float] | None = None,
    binding_resumed: dict[str, float] | None = None,
    scheduling_resumed: dict[str, float] | None = None,
) -> dict[str, float]:
    """Each service (one of every kind; the store stays up) stopped with SIGTERM, started again
    with its recorded command, and timed until its health check says SERVING — which a service
    says only once its informer has synced with the store: the time to start against the
    cluster's state as it stands. One at a time, each waited for, so the cluster keeps going.
    ``cpu_seconds`` gets the CPU each new process had used by then (user + system): on a
    machine shared with other work, the figure that extrapolates, wall time being its CPU
    time stretched by whatever else ran. ``binding_resumed`` gets, for the binder, the seconds
    from its SIGTERM until a binder leads again — with a standby, the lease is released as the
    stop begins and the standby (its view already built) takes over: binding stops for that
    long, not for the restarted process's start. ``scheduling_resumed`` gets, for the shard,
    the seconds from its SIGTERM until a process serves as that shard again (holds its name's
    lease and says SERVING for the Scheduler service): with a spare (``standby_shards``) that is
    the spare, at once; without, the restarted process once it has listed."""
    credentials = probe_credentials(home, state)
    shard_probe = _StoreProbe(state.store_url)
    seen: set[str] = set()
    out: dict[str, float] = {}
    # The records as they stand: a component started again since `up` has a new process.
    current = home.load() or state
    for record in current.components:
        if record.kind not in SERVICE_KINDS or record.kind in seen:
            continue
        process = record.process()
        if process is None:
            continue
        seen.add(record.kind)
        started = time.monotonic()
        process.terminate()
        try:
            process.wait(_RESTART_STOP_SECONDS)
        except psutil.TimeoutExpired:
            process.kill()
            process.wait(_RESTART_STOP_SECONDS)
        stopped = time.monotonic()
        again = local.start_again(home, record.name)
        deadline = stopped + _RESTART_SERVING_SECONDS
        binders = [
            r.address
            for r in current.components
            if r.kind == "binder" and r.name != record.name and r.process() is not None
        ]
        leading_again = None if record.kind == "binder" else started
        scheduling_again = None if record.kind == "scheduler" else started
        served_at = None
        while served_at is None or leading_again is None or scheduling_again is None:
            if time.monotonic() > deadline or again.process() is None:
                raise BenchError(f"{record.name} did not serve again after a restart")
            if served_at is None and probe(again.address, timeout=1, credentials=credentials) == (
                "SERVING"
            ):
                served_at = time.monotonic()
            if leading_again is None and any(
                probe(address, BINDER_SERVICE, 1, credentials) == "SERVING"
                for address in [*binders, again.address]
            ):
                leading_again = time.monotonic()
            if scheduling_again is None and shard_probe.serves_as_shard(record.name, credentials):
                scheduling_again = time.monotonic()
            if served_at is None or leading_again is None or scheduling_again is None:
                time.sleep(0.05)
        out[record.name] = round(served_at - stopped, 2)
        if binding_resumed is not None and record.kind == "binder":
            binding_resumed[record.name] = round(leading_again - started, 2)
        if scheduling_resumed is not None and record.kind == "scheduler":
            scheduling_resumed[record.name] = round(scheduling_again - started, 2)
        serving = again.process()
        if cpu_seconds is not None and serving is not None:
            with contextlib.suppress(psutil.Error):
                used = serving.cpu_times()
                cpu_seconds[record.name] = round(used.user + used.system, 2)
        console.print(
            f"restart: {record.name} stopped in {stopped - started:.1f}s, "
            f"serving again {out[record.name]:.1f}s later"
        )
    shard_probe.close()
    return out


def _shard_takeover(
    state: local.ClusterState, home: local.GodelHome, console: Console
) -> dict[str, float] | None:
    """With a spare shard (``standby_shards``): scheduler-0's holder killed with SIGKILL — no
    release of its name's lease —, timed until another process has registered as scheduler-0
    (its record names that process's address: ``registered``) and serves as it (holds the
    lease, says SERVING for the Scheduler service: ``scheduling``). The lease's expiry, then the
    registration: no listing, the standby's view being built already. After the restarts
    before, the holder is the spare and the standby scheduler-0's restarted process (each waits
    warm for the name): either way a standby takes over. The killed process is started again (a
    standby now) before returning. None without a spare."""
    current = home.load() or state
    if not any(c.name.startswith(SPARE_PREFIX) for c in current.components):
        return None
    credentials = probe_credentials(home, state)
    probe_store = _StoreProbe(state.store_url)
    try:
        shard = "scheduler-0"
        holder_address = probe_store.shard_holder_address(shard)
        holder = next((c for c in current.components if c.address == holder_address), None)
        process = holder.process() if holder is not None else None
        if holder is None or process is None:
            raise BenchError(f"no process serves as {shard} before the takeover")
        process.kill()
        killed = time.monotonic()
        process.wait(_RESTART_STOP_SECONDS)
        deadline = killed + _RESTART_SERVING_SECONDS
        registered = scheduling = None
        while registered is None or scheduling is None:
            if time.monotonic() > deadline:
                raise BenchError(f"no spare took {shard} over after its holder's kill -9")
            address = probe_store.shard_record_address(shard)
            if registered is None and address not in ("", holder_address):
                registered = time.monotonic()
            if scheduling is None and probe_store.serves_as_shard(shard, credentials):
                scheduling = time.monotonic()
            if registered is None or scheduling is None:
                time.sleep(0.05)
        took = {
            "registered": round(registered - killed, 2),
            "scheduling": round(scheduling - killed, 2),
        }
        console.print(
            f"shard takeover: {holder.name} (serving as {shard}) killed (-9), a standby "
            f"registered as {shard} {took['registered']:.1f}s later, serving as it "
            f"{took['scheduling']:.1f}s later"
        )
        again = local.start_again(home, holder.name)
        while probe(again.address, timeout=1, credentials=credentials) != "SERVING":
            if time.monotonic() > deadline or again.process() is None:
                raise BenchError(f"{holder.name} did not serve again after the takeover")
            time.sleep(0.1)
        return took
    finally:
        probe_store.close()


def _binder_takeover(
    state: local.ClusterState, home: local.GodelHome, console: Console
) -> float | None:
    """With a standby (two binders or more): the leader killed with SIGKILL — no release of
    its lease —, timed until another binder says SERVING for the Binder service, which only
    the leader does once caught up (services/binder/leadership.py): the lease's expiry plus
    the catch-up. The killed one is started again (as a standby) before returning. None with
    a single binder."""
    credentials = probe_credentials(home, state)
    current = home.load() or state  # binder-0 was started again by the restarts before
    binders = [r for r in current.components if r.kind == "binder" and r.process() is not None]
    if len(binders) < 2:
        return None
    leader = next(
        (r for r in binders if probe(r.address, BINDER_SERVICE, 1, credentials) == "SERVING"),
        None,
    )
    if leader is None:
        raise BenchError("no binder leads before the takeover")
    standbys = [r for r in binders if r is not leader]
    process = leader.process()
    assert process is not None
    process.kill()
    killed = time.monotonic()
    process.wait(_RESTART_STOP_SECONDS)
    deadline = killed + _RESTART_SERVING_SECONDS
    while not any(probe(r.address, BINDER_SERVICE, 1, credentials) == "SERVING" for r in standbys):
        if time.monotonic() > deadline:
            raise BenchError("no standby binder took over after the leader's kill -9")
        time.sleep(0.05)
    took = round(time.monotonic() - killed, 2)
    console.print(f"takeover: {leader.name} killed (-9), a standby leads {took:.1f}s later")
    again = local.start_again(home, leader.name)
    while probe(again.address, timeout=1, credentials=credentials) != "SERVING":
        if time.monotonic() > deadline or again.process() is None:
            raise BenchError(f"{leader.name} did not serve again after the takeover")
        time.sleep(0.1)
    return took


def _conflicts(
    before: tuple[int, int, int, int], after: tuple[int, int, int, int]
) -> dict[str, Any]:
    """The Binder's conflict rate over the measured phase: pods it rejected as conflicts
    (CONFLICT, GANG_REJECTED) per pod the shards proposed, from the shards' counters."""
    proposed, bound, conflicted = (a - b for a, b in zip(after[:3], before[:3], strict=True))
    return {
        "proposed": proposed,
        "bound": bound,
        "conflicted": conflicted,
        "rate_percent": round(100 * conflicted / proposed, 3) if proposed else 0.0,
        "partitioned_shards": after[3],
    }


def _reschedule(
    workload: Workload, state: local.ClusterState, home: local.GodelHome, console: Console
) -> dict[str, Any]:
    """One round of the workload's policy once every measured pod is bound: how long it took
    (the rescheduler's own planning time and the RPC's wall time) and what it predicts. An
    executed round returns once its last batch's replacements run, so its wall time is the time
    from the trigger to the rescheduled cluster; a dry run afterwards measures that cluster with
    the same figures (its "before")."""
    assert workload.reschedule is not None
    policy, dry_run = workload.reschedule.policy, workload.reschedule.dry_run
    console.print(f"rescheduling: policy {policy}{' (dry run)' if dry_run else ''} ...")
    measured: dict[str, Any] = {}
    nodes = ProtoClient(state.address_of("dispatcher"), timeout=120, home=home.path)
    try:
        load_before = _load_spread(_settled_loads(nodes))
        with ReschedulerClient(
            state.address_of("rescheduler"), timeout=1800, home=home.path
        ) as client:
            started = time.perf_counter()
            response = client.trigger(policy, dry_run=dry_run)
            wall = time.perf_counter() - started
            if not dry_run:
                measured = _figures(client.trigger(policy, dry_run=True).plans[0].before)
        load_after = _load_spread(_settled_loads(nodes)) if not dry_run else load_before
    finally:
        nodes.close()
    plan = response.plans[0]
    figures = {when: _figures(getattr(plan, when)) for when in ("before", "after")}
    executed: dict[str, Any] = {}
    if not dry_run:
        executed = {
            "evicted": plan.evicted,
            "movements": len(plan.movements),
            "moves_per_second": round(plan.evicted / wall, 1) if wall else 0.0,
            "measured_after": measured,
            "gangs": _gang_moves(state, home, plan),
            "landing": _landing(state, home, plan),
        }
    return {
        "policy": policy,
        "dry_run": dry_run,
        "outcome": plan.outcome,
        "message": plan.message,
        "plan_seconds": round(plan.duration_ms / 1000, 3),
        "rpc_seconds": round(wall, 3),
        "moves": len(plan.moves),
        "batches": plan.batches,
        "rejected": len(plan.rejected),
        **figures,
        **executed,
        # What the node agents measure (executed rounds: after the replacements run).
        "measured_load": {"before": load_before, "after": load_after},
    }


def _gang_moves(state: local.ClusterState, home: local.GodelHome, plan: Any) -> dict[str, int]:
    """What an executed round did to running gangs (jobs of min_member > 1), from the pods
    stored afterwards: a replacement (``<job>-<index>-r<n>``) per evicted pod, so a gang is
    moved whole when every index has one, partly evicted when some but not all do (the aim:
    never), and left whole when the plan said so."""
    client = ProtoClient(state.address_of("dispatcher"), timeout=120, home=home.path)
    try:
        jobs = {j.metadata.name: j.spec for j in client.list(pb.Job) if j.spec.min_member > 1}
        replaced: dict[str, set[int]] = {}
        for pod in client.list(pb.Pod):
            if pod.spec.job in jobs and replacement_number(pod):
                replaced.setdefault(pod.spec.job, set()).add(pod.spec.index)
    finally:
        client.close()
    whole = sum(1 for job, idx in replaced.items() if len(idx) >= jobs[job].replicas)
    return {
        "gangs": len(jobs),
        "moved_whole": whole,
        "partly_evicted": len(replaced) - whole,
        "left_whole": len(plan.left_whole),
    }


def _landing(state: local.ClusterState, home: local.GodelHome, plan: Any) -> dict[str, int]:
    """Where an executed round's replacements landed, from its Movements as the Binder recorded
    them: on their recommended node (``actual``) or off it (``mismatched``: bound elsewhere, or
    beyond a node's desired count)."""
    client = ProtoClient(state.address_of("dispatcher"), timeout=120, home=home.path)
    try:
        names = set(plan.movements)
        movements = [m for m in client.list(pb.Movement) if m.metadata.name in names]
    finally:
        client.close()
    actual = mismatched = 0
    for movement in movements:
        for owner in movement.status.owners:
            mismatched += len(owner.mismatched_tasks)
            for rec in owner.recommended_nodes:
                actual += min(len(rec.actual_pods), rec.desired_pod_count)
                mismatched += max(0, len(rec.actual_pods) - rec.desired_pod_count)
    return {"actual": actual, "mismatched": mismatched}


# The node agents' default heartbeat, when they report their nodes' load.
_LOAD_REPORT_SECONDS = 2.0


def _settled_loads(client: ProtoClient, timeout: float = 60.0) -> dict[str, tuple[float, float]]:
    """Every node's measured CPU and network load (fractions of its allocatable CPU and of its
    bandwidth), once two readings more than a report interval apart agree: the agents have
    reported what their pods do now."""
    deadline = time.monotonic() + timeout
    last: dict[str, tuple[float, float]] | None = None
    while True:
        now: dict[str, tuple[float, float]] = {}
        for node in client.list(pb.Node):
            assert isinstance(node, pb.Node)
            if not node.status.HasField("load"):
                continue
            load, alloc = node.status.load, node.status.allocatable.milli_cpu
            cap = load.network_capacity_bytes_per_second
            now[node.metadata.name] = (
                load.milli_cpu / alloc if alloc else 0.0,
                load.network_bytes_per_second / cap if cap else 0.0,
            )
        if (now and now == last) or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(_LOAD_REPORT_SECONDS * 1.25)


def _load_spread(loads: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Mean, population standard deviation and maximum of the nodes' measured CPU and network
    load, in percent."""
    out: dict[str, Any] = {"nodes": len(loads)}
    for i, dimension in enumerate(("cpu", "network")):
        values = [100 * v[i] for v in loads.values()] or [0.0]
        out[dimension] = {
            "mean": round(statistics.fmean(values), 2),
            "stddev": round(statistics.pstdev(values), 2),
            "max": round(max(values), 2),
        }
    return out


def _figures(figures: Any) -> dict[str, Any]:
    return json_format.MessageToDict(
        figures, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def write_node_list(nodes: list[ListedNode], path: str) -> None:
    """Rows of a node list, written back in its format (what ``--hollow-node-list`` reads)."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(NODE_LIST_COLUMNS)
        for n in nodes:
            out.writerow([n.name, n.milli_cpu, n.memory_bytes >> 20, n.gpus, n.gpu_model])


def _nodeagent_flags(workload: Workload) -> tuple[str, ...]:
    shape = workload.cluster
    flags = {
        "hollow-cpu-milli": str(shape.cpu_milli),
        "hollow-memory-bytes": str(shape.memory_bytes),
        "hollow-max-pods": str(shape.max_pods),
        "hollow-gpus": str(shape.gpus),
    }
    if shape.node_list:  # each listed node has its own shape
        flags = {}
    if shape.labels:
        flags["hollow-labels"] = ",".join(f"{k}={v}" for k, v in shape.labels.items())
    flags.update(shape.service_args.get("nodeagent", {}))
    return _flags(flags)


def _flags(args: dict[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    for key, value in args.items():
        out += [f"--{key.replace('_', '-')}", value]
    return tuple(out)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _check_alive(state: local.ClusterState) -> None:
    """Fail the run at once, naming the component and its last log lines, when a process of the
    cluster has died (rather than waiting out the timeout for pods that cannot bind)."""
    for component in state.components:
        if component.pid is not None and component.process() is None:
            tail = ""
            with contextlib.suppress(OSError):
                tail = "\n".join(Path(component.log).read_text().splitlines()[-5:])
            raise BenchError(f"{component.name} is no longer running; its log ends:\n{tail}")


def _wait_nodes(
    client: ProtoClient,
    nodes: int,
    progress: Progress,
    timeout: float,
    check_alive: Callable[[], None],
) -> None:
    task = progress.add_task("nodes ready", total=nodes, info="")
    deadline = time.monotonic() + timeout
    while True:
        check_alive()
        ready = sum(1 for n in client.list(pb.Node) if n.status.ready)
        progress.update(task, completed=ready)
        if ready >= nodes:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"only {ready}/{nodes} nodes ready after {timeout:g}s")
        time.sleep(1.0)


def _settle(
    probe: _StoreProbe,
    state: local.ClusterState,
    progress: Progress,
    check_alive: Callable[[], None],
) -> dict[str, Any]:
    """Wait until the cluster has taken in the init phase: the store's change feed quiet (the
    node agents have reported the init pods running) and every service's informer holding all
    of it. Returns the seconds waited and whether it got there. Without it the measured phase
    of PaperScale-20000 began under the last of a million pods' running reports, and the
    dispatcher's CPU in that phase varied from 1 to 4 s between runs of the same build."""
    task = progress.add_task("cluster settling after init", total=None, info="")
    started = time.monotonic()
    last = probe.revision()
    quiet = False
    while not quiet and time.monotonic() - started < _SETTLE_MAX_SECONDS:
        time.sleep(_SETTLE_POLL_SECONDS)
        check_alive()
        now = probe.revision()
        changes, last = now - last, now
        behind = worst_informer_lag(state)
        progress.update(task, info=f"{changes} changes; informers {behind:.1f}s behind")
        quiet = changes <= _SETTLE_QUIET_CHANGES and behind == 0
    waited = round(time.monotonic() - started, 2)
    progress.remove_task(task)
    if not quiet:
        log.warning("the cluster did not settle after the init phase; measuring anyway", s=waited)
    return {"seconds": waited, "quiet": quiet}


def _leadership(state: local.ClusterState, epochs: list[int]) -> dict[str, Any]:
    """How steady the Binder's leadership was: the lease's changes of hands during the init
    phase and the measured phase (``epochs`` read before init, before and after the measured
    phase) and the worst lateness of a renewal any Binder saw (its metrics)."""
    start, measured, end = epochs
    return {
        "epoch": end,
        "changes_init": measured - start,
        "changes_measured": end - measured,
        "worst_renewal_lateness_s": round(
            worst_metric(state, _LEASE_LATENESS_METRIC, kinds=("binder",)), 4
        ),
    }


def worst_informer_lag(state: local.ClusterState) -> float:
    """The most any service's informer is behind the store, in seconds (0: every one holds
    all of it), from each service's Prometheus endpoint; a service that does not answer counts
    as not behind (its liveness is checked apart)."""
    return worst_metric(state, _INFORMER_LAG_METRIC)


def worst_metric(
    state: local.ClusterState, metric: str, kinds: tuple[str, ...] | None = None
) -> float:
    """The greatest value of ``metric`` over the services' Prometheus endpoints (of ``kinds``
    only, if given); a service that does not answer is left out, 0 if none has it."""
    worst = 0.0
    for component in state.components:
        if kinds is not None and component.kind not in kinds:
            continue
        if not component.metrics_address:
            continue
        url = f"http://{component.metrics_address}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            if family.name == metric:
                worst = max([worst, *(sample.value for sample in family.samples)])
    return worst


def _reserve(client: ProtoClient, wanted: Reservations, progress: Progress, timeout: float) -> None:
    """Apply the workload's reservations (each held the whole run), 200 per request, and wait
    until the Binder has committed every one on its node."""
    task = progress.add_task("reservations held", total=wanted.count, info="")
    nodes = sorted(n.metadata.name for n in client.list(pb.Node))
    reservations = wanted.manifests(nodes)
    for i in range(0, len(reservations), 200):
        batch = reservations[i : i + 200]
        response = client.apply([("Reservation", r) for r in batch])
        bad = [v for r in response.results for v in r.violations]
        if bad:
            raise BenchError(f"reservations refused: {bad[0].field}: {bad[0].description}")
    deadline = time.monotonic() + timeout
    while True:
        held = sum(
            1 for r in client.list(pb.Reservation) if r.status.phase == pb.RESERVATION_RESERVED
        )
        progress.update(task, completed=held)
        if held >= len(reservations):
            return
        if time.monotonic() > deadline:
            raise BenchError(f"only {held}/{len(reservations)} reservations held")
        time.sleep(0.25)


def _init_pods(
    client: ProtoClient,
    probe: _StoreProbe,
    workload: Workload,
    progress: Progress,
    check_alive: Callable[[], None],
) -> int:
    """Submit the init pods and wait until they are bound; returns the claims afterwards."""
    phase = workload.init
    if phase is None or phase.count == 0:
        return probe.claims()
    task = progress.add_task("init pods bound", total=phase.count, info="")
    nodes: list[str] = []
    if phase.per_node:  # one pod pinned to each node, as the measured phase does it
        nodes = sorted(n.metadata.name for n in client.list(pb.Node))
    jobs = build_jobs(INIT_PREFIX, phase, nodes)
    deadline = time.monotonic() + workload.timeout
    submitted = 0
    for i in range(0, len(jobs), 50):
        # Paced: no more than INIT_IN_FLIGHT pods submitted and not yet bound, under the
        # queue's admission limit (max_pending_pods) and with progress shown on the way.
        while submitted - (bound := probe.claims()) > INIT_IN_FLIGHT:
            check_alive()
            progress.update(task, completed=bound)
            if time.monotonic() > deadline:
                raise BenchError(f"only {bound}/{phase.count} init pods bound")
            time.sleep(0.25)
        batch = jobs[i : i + 50]
        for job, result in zip(batch, client.submit(batch).results, strict=True):
            if not (result.created or result.existing):  # existing: a retried call
                raise BenchError(f"init job {job.metadata.name} refused: {result.violations}")
        submitted += sum(job.spec.replicas for job in batch)
    while (bound := probe.claims()) < phase.count:
        check_alive()
        progress.update(task, completed=bound)
        if time.monotonic() > deadline:
            raise BenchError(f"only {bound}/{phase.count} init pods bound")
        time.sleep(0.25)
    progress.update(task, completed=bound)
    return bound


def pin_shards(state: local.ClusterState) -> dict[str, set[int]]:
    """Shard i runs on CPU i mod cores only, every thread of it (what ``taskset -a -p`` does;
    threads started later inherit it). The other processes keep every CPU. Returns each
    shard's CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    pinned: dict[str, set[int]] = {}
    shards = sorted(
        (
            c
            for c in state.components
            if c.kind == "scheduler" and c.pid and not c.name.startswith(SPARE_PREFIX)
        ),
        key=lambda c: int(c.name.rsplit("-", 1)[-1]),
    )
    for i, shard in enumerate(shards):
        assert shard.pid is not None
        cpu = {cpus[i % len(cpus)]}
        for tid in os.listdir(f"/proc/{shard.pid}/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                os.sched_setaffinity(int(tid), cpu)
        pinned[shard.name] = cpu
    log.info("shards pinned", cpus={k: sorted(v) for k, v in pinned.items()})
    return pinned


def _measure(
    workload: Workload,
    state: local.ClusterState,
    probe: _StoreProbe,
    home: local.GodelHome,
    rate: float | None,
    progress: Progress,
    baseline: int,
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    phase = workload.measured
    if rate is not None:
        phase = type(phase)(**{**phase.to_json(), "rate": rate})
    load = _start_load(phase, state, home)
    events: queue.Queue[dict[str, Any]] = queue.Queue()
    threading.Thread(target=_read_events, args=(load, events), daemon=True).start()
    task = progress.add_task("measured pods bound", total=phase.count, info="")

    started = _wait_event(events, load, "started", timeout=300)
    # CPU is counted over the window throughput is: from the first submit, not from when the
    # load process began importing and building its jobs (building 15,000 jobs with their own
    # node affinity was a tenth of Daemonset-15000's CPU per pod).
    usage = {c.name: ProcessUsage.start(c.pid) for c in state.components}
    usage["load"] = ProcessUsage.start(load.pid)
    timeline: list[tuple[float, int]] = [(0.0, 0)]

    def bound_now() -> int:
        return probe.claims_of(MEASURED_PREFIX) if workload.preempts else probe.claims() - baseline

    def show(bound: int, rate_now: float) -> None:
        progress.update(task, completed=min(bound, phase.count), info=f"{rate_now:,.0f} pods/s")

    load_done = _sample_until_bound(
        workload, state, phase.count, load, events, usage, timeline, bound_now, show
    )
    if load.wait(timeout=60) != 0:
        raise BenchError(f"load process exited with code {load.returncode}")
    load_done = load_done or _wait_event(events, load, "done", timeout=10)
    for u in usage.values():
        u.sample()
    result: dict[str, Any] = {
        "name": workload.name,
        "variant": workload.variant,
        "cluster": asdict(workload.cluster),
        "init_pods": baseline,
        "measured_pods": phase.count,
        "job_size": phase.job_size,
        "gang_percent": phase.gang_percent,
        "offered_rate": phase.rate,
        "submit_seconds": round(float(load_done.get("seconds", 0.0)), 2),
        "submit_requests": load_done.get("requests"),
        "load_started_wall": started["wall"],
        "timeline": timeline,
        "resources": {name: u.to_json() for name, u in usage.items()},
    }
    return load, result


def _start_load(
    phase: PodPhase, state: local.ClusterState, home: local.GodelHome
) -> subprocess.Popen[bytes]:
    """The load process (``bench.load``) submitting ``phase``'s measured pods."""
    plan = home.path / "load-plan.json"
    plan.write_text(
        json.dumps(
            {
                "dispatcher": state.address_of("dispatcher"),
                "home": str(home.path),  # where the cluster's credentials are
                "prefix": MEASURED_PREFIX,
                "phase": phase.to_json(),
            }
        )
    )
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "bench.load", "--plan", str(plan)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parent.parent,
    )


def _sample_until_bound(
    workload: Workload,
    state: local.ClusterState,
    count: int,
    load: subprocess.Popen[bytes],
    events: queue.Queue[dict[str, Any]],
    usage: dict[str, ProcessUsage],
    timeline: list[tuple[float, int]],
    bound_now: Callable[[], int],
    show: Callable[[int, float], None],
) -> dict[str, Any] | None:
    """Every ``_SAMPLE_SECONDS`` until ``count`` measured pods are bound (or the workload's
    timeout): the bound count onto ``timeline``, a CPU sample of each process, the load's and
    the cluster's health. Returns the load's last event if it arrived (its "done")."""
    t0 = time.monotonic()
    load_done: dict[str, Any] | None = None
    while True:
        next_tick = t0 + (len(timeline)) * _SAMPLE_SECONDS
        time.sleep(max(0.0, next_tick - time.monotonic()))
        now = time.monotonic() - t0
        bound = bound_now()
        for u in usage.values():
            u.sample()
        rate_now = (bound - timeline[-1][1]) / max(now - timeline[-1][0], 1e-3)
        timeline.append((round(now, 3), bound))
        done = bound >= count
        show(bound, rate_now)
        load_done = load_done or _poll_event(events)
        if load_done is not None and load_done["event"] == "failed":
            raise BenchError(f"load process failed: {load_done.get('error')}")
        if load.poll() not in (None, 0):
            raise BenchError(f"load process exited with code {load.returncode}")
        _check_alive(state)
        if done or now > workload.timeout:
            return load_done


def _read_events(load: subprocess.Popen[bytes], events: queue.Queue[dict[str, Any]]) -> None:
    assert load.stdout is not None
    for line in load.stdout:
        try:
            events.put(json.loads(line))
        except json.JSONDecodeError:
            continue


def _poll_event(events: queue.Queue[dict[str, Any]]) -> dict[str, Any] | None:
    try:
        return events.get_nowait()
    except queue.Empty:
        return None


def _wait_event(
    events: queue.Queue[dict[str, Any]], load: subprocess.Popen[bytes], name: str, timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            event = events.get(timeout=0.1)
        except queue.Empty:
            if load.poll() not in (None, 0):
                raise BenchError(f"load process exited with code {load.returncode}") from None
            continue
        if event["event"] == "failed":
            raise BenchError(f"load process failed: {event.get('error')}")
        if event["event"] == name:
            return event
    raise BenchError(f"load process did not report {name!r} within {timeout:g}s")


def _finish_times(result: dict[str, Any], last_bound_ms: int) -> None:
    """Total time and throughput. Total = first submit to the last bind, from the pods' own
    timestamps (the 1 s samples only bound it to within a second); the sample that contains
    the last bind is cut there, so a run shorter than a second is not reported as N pods/s."""
    timeline: list[tuple[float, int]] = result["timeline"]
    total = timeline[-1][0]
    if last_bound_ms > 0:
        total = min(total, max(0.001, last_bound_ms / 1000 - result["load_started_wall"]))
    samples: list[float] = []
    for (t0, b0), (t1, b1) in pairwise(timeline):
        end = min(t1, total)
        if t0 >= total or (end - t0 < _MIN_PARTIAL_SAMPLE and samples):
            break
        samples.append((b1 - b0) / max(end - t0, 1e-3))
    result["total_seconds"] = round(total, 2)
    result["throughput"] = {
        "average": round(sum(samples) / len(samples), 1) if samples else 0.0,
        "p50": round(percentile(samples, 50), 1),
        "p90": round(percentile(samples, 90), 1),
        "p99": round(percentile(samples, 99), 1),
        "overall": round(min(timeline[-1][1], result["measured_pods"]) / total, 1),
        "samples": [round(x, 1) for x in samples],
    }


def _latencies(client: ProtoClient) -> tuple[dict[str, Any], int, int]:
    """Submit -> bound latency of every measured pod (creation_timestamp_ms to bound_ms), from
    one list at the end; returns (distribution, bound pod count, last bound_ms)."""
    latencies: list[float] = []
    last_bound_ms = 0
    for pod in client.list(pb.Pod, page_size=5000):
        if not pod.spec.job.startswith(f"{MEASURED_PREFIX}-") or not pod.spec.node_name:
            continue
        latencies.append(float(pod.status.bound_ms - pod.metadata.creation_timestamp_ms))
        last_bound_ms = max(last_bound_ms, pod.status.bound_ms)
    latencies.sort()
    dist = {
        "count": len(latencies),
        "mean": round(sum(latencies) / len(latencies), 1) if latencies else 0.0,
        "p50": percentile(latencies, 50),
        "p90": percentile(latencies, 90),
        "p99": percentile(latencies, 99),
        "max": latencies[-1] if latencies else 0.0,
        # Enough points for a CDF plot without storing every pod.
        "cdf": [latencies[int(i * (len(latencies) - 1) / 200)] for i in range(201)]
        if latencies
        else [],
    }
    return dist, len(latencies), last_bound_ms


def measure_idle(
    workload: Workload,
    *,
    seconds: float,
    fsync: Fsync = "always",
    console: Console | None = None,
) -> dict[str, Any]:
    """What the workload's cluster spends per second with nothing flowing: its nodes ready, its
    init pods bound and the change feed settled, then each process's CPU over ``seconds`` with
    nothing submitted (node heartbeats, ticks, probes, resyncs: the per-second work a measured
    phase pays for on top of its pods). The cluster is gone when this returns or raises."""
    console = console or Console(stderr=True)
    with _fresh_cluster(workload, fsync, "godel-idle-") as (state, home):
        client = ProtoClient(state.address_of("dispatcher"), timeout=120, home=home.path)
        try:
            with _progress(console) as progress:
                alive = functools.partial(_check_alive, state)
                nodes = workload.cluster.nodes
                _wait_nodes(client, nodes, progress, 180 + nodes / 100, alive)
                probe = _StoreProbe(state.store_url)
                try:
                    _init_pods(client, probe, workload, progress, alive)
                    settle = _settle(probe, state, progress, alive)
                    usage = {c.name: ProcessUsage.start(c.pid) for c in state.components}
                    revision = probe.revision()
                    time.sleep(seconds)
                    for u in usage.values():
                        u.sample()
                    changes = probe.revision() - revision
                    _check_alive(state)
                finally:
                    probe.close()
        finally:
            client.close()
        kinds = {c.name: c.kind for c in state.components}
        per_kind: dict[str, float] = {}
        for name, u in usage.items():
            per_kind[kinds[name]] = per_kind.get(kinds[name], 0.0) + u.cpu_seconds
        return {
            "workload": workload.name,
            "nodes": workload.cluster.nodes,
            "seconds": seconds,
            "settle": settle,
            "feed_changes": changes,
            "cpu_seconds": {name: round(u.cpu_seconds, 3) for name, u in usage.items()},
            "millicores": {k: round(v * 1000 / seconds, 1) for k, v in sorted(per_kind.items())},
            "millicores_all_services": round(
                sum(v for k, v in per_kind.items() if k != "store") * 1000 / seconds, 1
            ),
            "millicores_all": round(sum(per_kind.values()) * 1000 / seconds, 1),
            "machine": machine(),
        }
