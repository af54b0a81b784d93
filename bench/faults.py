"""The standing fault harness: a real local cluster under a steady mixed load, its components
killed (SIGKILL) and stopped (SIGTERM) in turn, each started again as an operator would, and the
invariants checked from outside after every fault.

    python -m bench.faults                  # 100 faults (default), report in bench/results/
    python -m bench.faults --quick          # one fault per component kind (what CI runs)
    python -m bench.faults --faults 12 --out /tmp/r

The cluster is `godel up --store-replicas 1` (a primary, a replica, three Sentinels), two
scheduler shards, two binders, the rescheduler and one node agent of hollow nodes. The load
thread submits a job every ``--interval`` seconds through the Dispatcher's public API (gangs,
min-member-1 services; pods that run a few seconds, so capacity keeps turning over), retrying
each Submit with its request id until the Dispatcher acknowledges it, as a careful client does.

Fault *i* hits kind ``KINDS[i % 6]`` (the store primary as Sentinel names it, the dispatcher, a
scheduler shard, the Binder leader, the rescheduler, the node agent) with SIGKILL or SIGTERM,
alternating so that every kind gets both. The harness waits until the process is gone, starts it
again with the command `godel up` recorded (``godel.local.start_again``), then submits a probe
gang and measures **recovery**: from the signal until that probe is bound whole. Then it checks,
from outside, through the store:

- every job the Dispatcher acknowledged exists with a pod for each of its indexes;
- every binding seen before is still there, on the same node (no acknowledged binding lost);
- ``godel audit``'s invariants: no node over-committed, no pod bound twice, no gang split.

The harness waits until the restarted component serves again before the next fault, as an
operator confirms a restart. A component that dies *because of* a fault (a service whose
startup fails while the store fails over exits, as it should) is started again too, as a
supervisor would (every 2 s), and named in the report ("others revived"). Exit code 0 when every fault recovered and every check held; 1
otherwise. The report (JSON and
a Markdown table of recovery time per kind) goes to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis

from bench.harness import machine, percentile
from foundation.retry import Backoff, Retry
from godel import local
from godel.audit import audit
from godel.client import ClientError, ProtoClient
from godel.local.cluster import probe_credentials
from protos.godel.v1 import objects_pb2 as pb
from services.runtime.healthcheck import probe
from store import Store, StoreError
from store.client import SentinelTarget
from store.server import primary_port_named_by

KINDS = ("store", "dispatcher", "scheduler", "binder", "rescheduler", "nodeagent")
DEFAULT_OUT = Path("bench/results")
PROBE_PREFIX = "probe"
LOAD_PREFIX = "load"
_GONE_SECONDS = 30.0
_RECOVERY_DEADLINE = 180.0
_REVIVE_EVERY_SECONDS = 2.0
# The checker's store connections ride out a failover: every half second, 60 tries in all.
_STORE_RETRY = Backoff(0.5)
_STORE_ATTEMPTS = 60


@dataclass
class FaultResult:
    index: int
    kind: str
    component: str
    signal: str
    recovery_seconds: float | None
    """Signal → the probe gang bound whole; None if it never was within the deadline."""
    restart_seconds: float
    """Signal → the process started again (waiting for the old one to be gone included)."""
    violations: list[str] = field(default_factory=list)
    revived: list[str] = field(default_factory=list)
    """Other components found dead after this fault and started again, as a supervisor
    (systemd, compose's restart policy) would: e.g. a service whose startup failed because
    the store was failing over. Reported; not a violation."""

    @property
    def ok(self) -> bool:
        return self.recovery_seconds is not None and not self.violations


class Load(threading.Thread):
    """Submits a job every ``interval`` seconds; remembers every job the Dispatcher acknowledged
    (created, or found as this request's own on a retry)."""

    def __init__(self, dispatcher: str, interval: float, home: Path) -> None:
        super().__init__(name="fault-load", daemon=True)
        self._client = ProtoClient(dispatcher, timeout=10, home=home)  # the cluster's credentials
        self._interval = interval
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.acknowledged: dict[str, int] = {}
        self.retries = 0

    def run(self) -> None:
        i = 0
        while not self._halt.is_set():
            job = _load_job(i)
            i += 1
            while not self._halt.is_set():
                if self._submit(job):
                    break
                self.retries += 1
                self._halt.wait(0.5)
            self._halt.wait(self._interval)

    def _submit(self, job: pb.Job) -> bool:
        try:
            result = self._client.submit([job], request_id=job.metadata.name).results[0]
        except ClientError:
            return False  # the Dispatcher or the store is away: retry the same request
        if result.created or result.existing:
            with self._lock:
                self.acknowledged[job.metadata.name] = job.spec.replicas
            return True
        violations = "; ".join(f"{v.field}: {v.description}" for v in result.violations)
        raise RuntimeError(f"load job {job.metadata.name} refused: {violations}")

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.acknowledged)

    def stop(self) -> None:
        if self._halt.is_set():
            return
        self._halt.set()
        self.join(30)
        self._client.close()


def _job(name: str, replicas: int, min_member: int, duration_ms: int) -> pb.Job:
    job = pb.Job(metadata=pb.ObjectMeta(name=name))
    job.spec.replicas = replicas
    job.spec.min_member = min_member
    job.spec.template.requests.milli_cpu = 200
    job.spec.template.requests.memory_bytes = 128 << 20
    job.spec.template.duration_ms = duration_ms
    return job


def _load_job(i: int) -> pb.Job:
    """The mix: every third job a gang of 4, the others services of 3 that may run alone."""
    if i % 3 == 0:
        return _job(f"{LOAD_PREFIX}-{i}", 4, 4, 3000 + 500 * (i % 5))
    return _job(f"{LOAD_PREFIX}-{i}", 3, 1, 2000 + 700 * (i % 7))


class Harness:
    def __init__(self, home: local.GodelHome, state: local.ClusterState) -> None:
        self.home = home
        self.state = state
        self.client = ProtoClient(state.address_of("dispatcher"), timeout=10, home=home.path)
        self.credentials = probe_credentials(home, state)  # health checks speak TLS too
        self.bindings: dict[str, str] = {}
        self._probes = 0

    # --- choosing and hitting the target -------------------------------------------------

    def target(self, kind: str, index: int) -> str:
        """The component of ``kind`` to hit: the store's current primary, the Binder leader,
        the shards in turn."""
        if kind == "store":
            return self._primary()
        if kind == "binder":
            lease = self._run(lambda s: s.get_lease("binder"))
            if lease is not None and lease.holder and self.state.component(lease.holder):
                return str(lease.holder)
        names = [c.name for c in self.state.components if c.kind == kind]
        return names[index % len(names)]

    def _primary(self) -> str:
        target = SentinelTarget.parse(self.state.store_url)
        for host, port in target.sentinels:
            primary_port = primary_port_named_by(
                redis.Redis(host=host, port=port, password=target.password, socket_timeout=2)
            )
            if primary_port is None:
                continue
            for component in self.state.components:
                if component.kind == "store" and component.address.endswith(f":{primary_port}/0"):
                    return component.name
        raise RuntimeError("no Sentinel names a primary")

    def hit(self, index: int, kind: str, sig: signal.Signals) -> FaultResult:
        self.state = self.home.load() or self.state
        name = self.target(kind, index)
        record = self.state.component(name)
        assert record is not None and record.pid is not None
        process = record.process()
        started = time.monotonic()
        if process is not None:
            process.send_signal(sig)
            try:
                process.wait(_GONE_SECONDS)
            except psutil.TimeoutExpired:
                process.kill()  # an operator's next step too
                process.wait(_GONE_SECONDS)
        local.start_again(self.home, name)
        restarted = time.monotonic() - started
        self.state = self.home.load() or self.state
        revived: list[str] = []
        recovery = self._probe_bound(started, revived)
        self._wait_serving(name, revived)
        result = FaultResult(index, kind, name, sig.name, recovery, round(restarted, 2))
        result.revived = revived
        return result

    def _wait_serving(self, name: str, revived: list[str]) -> None:
        """As an operator confirms a restart: wait until the component serves again (a service
        answers its health check SERVING), so the next fault does not land mid-startup."""
        record = self.state.component(name)
        if record is None or record.kind in ("store", "sentinel"):
            return
        deadline = time.monotonic() + _RECOVERY_DEADLINE
        while time.monotonic() < deadline:
            record = self.state.component(name)
            if (
                record is not None
                and probe(record.address, timeout=1, credentials=self.credentials) == "SERVING"
            ):
                return
            revived += self.revive()
            time.sleep(0.2)

    def revive(self) -> list[str]:
        """Start again every component that is not running."""
        self.state = self.home.load() or self.state
        dead = [c.name for c in self.state.components if c.pid and c.process() is None]
        for name in dead:
            local.start_again(self.home, name)
        self.state = self.home.load() or self.state
        return dead

    def _probe_bound(self, since: float, revived: list[str]) -> float | None:
        """Submit a probe gang (retrying until acknowledged) and wait until it is bound whole;
        seconds from ``since``, or None after the deadline. Meanwhile, as a supervisor would,
        start again any component that died (appended to ``revived``)."""
        self._probes += 1
        gang = _job(f"{PROBE_PREFIX}-{self._probes}", 2, 2, 1000)
        deadline = since + _RECOVERY_DEADLINE
        submitted = False
        next_revive = time.monotonic() + _REVIVE_EVERY_SECONDS
        while time.monotonic() < deadline:
            if time.monotonic() >= next_revive:
                revived += self.revive()
                next_revive = time.monotonic() + _REVIVE_EVERY_SECONDS
            try:
                if not submitted:
                    result = self.client.submit([gang], request_id=gang.metadata.name)
                    submitted = result.results[0].created or result.results[0].existing
                if submitted:
                    pods = self.client.list(pb.Pod, job=gang.metadata.name)
                    if len(pods) == 2 and all(p.spec.node_name for p in pods):
                        return round(time.monotonic() - since, 2)
            except ClientError:
                pass
            time.sleep(0.1)
        return None

    # --- checks from outside ---------------------------------------------------------------

    def check(self, acknowledged: dict[str, int]) -> list[str]:
        async def read(store: Store) -> tuple[list[pb.Pod], set[str], list[str]]:
            listing = await store.list_kinds(["Job", "Pod"])
            report = await audit(store)
            jobs = {j.metadata.name for j in listing.items_of(pb.Job)}
            return listing.items_of(pb.Pod), jobs, report.violations

        pods: list[pb.Pod]
        jobs: set[str]
        violations: list[str]
        pods, jobs, violations = self._run(read)
        indexes: dict[str, set[int]] = defaultdict(set)
        for pod in pods:
            indexes[pod.spec.job].add(pod.spec.index)
        for name, replicas in acknowledged.items():
            if name not in jobs:
                violations.append(f"acknowledged job {name} is gone")
            elif len(indexes[name]) < replicas:
                violations.append(
                    f"acknowledged job {name} has pods for {len(indexes[name])}/{replicas} indexes"
                )
        now = {p.metadata.name: p.spec.node_name for p in pods}
        for pod_name, node in self.bindings.items():
            if now.get(pod_name) != node:
                violations.append(
                    f"binding lost: pod {pod_name} was bound to {node}, now "
                    f"{now.get(pod_name, 'gone')!r}"
                )
        self.bindings.update({name: node for name, node in now.items() if node})
        return violations

    def _run(self, fn: Any) -> Any:
        async def go() -> Any:
            retry = Retry(_STORE_RETRY)
            while True:
                try:
                    store = await Store.connect(self.state.store_url)
                    try:
                        return await fn(store)
                    finally:
                        await store.close()
                except StoreError:
                    if retry.attempt == _STORE_ATTEMPTS - 1:
                        raise
                    await retry.sleep()

        return asyncio.run(go())

    def close(self) -> None:
        self.client.close()


def signal_for(index: int) -> signal.Signals:
    """SIGKILL and SIGTERM alternate per kind and per round, so each kind gets both."""
    return signal.SIGKILL if (index + index // len(KINDS)) % 2 == 0 else signal.SIGTERM


def run(faults: int, *, hollow_nodes: int = 40, interval: float = 0.3) -> dict[str, Any]:
    os.environ.pop("GODEL_REDIS_URL", None)
    tmp = Path(tempfile.mkdtemp(prefix="godel-faults-"))
    home = local.GodelHome(tmp)
    spec = local.ClusterSpec(
        schedulers=2, binders=2, hollow_nodes=hollow_nodes, process_node=False,
        store_replicas=1, grace_seconds=2.0, ready_timeout=120.0,
    )  # fmt: skip
    started = time.time()
    results: list[FaultResult] = []
    load: Load | None = None
    harness: Harness | None = None
    try:
        state = local.up(home, spec)
        harness = Harness(home, state)
        wait_nodes(harness.client, hollow_nodes)
        load = Load(state.address_of("dispatcher"), interval, home.path)
        load.start()
        for index in range(faults):
            kind = KINDS[index % len(KINDS)]
            result = harness.hit(index, kind, signal_for(index))
            result.violations = harness.check(load.snapshot())
            results.append(result)
            _progress(result)
            if not load.is_alive():
                raise RuntimeError("the load thread stopped (a job was refused)")
        load.stop()
        final = harness.check(load.snapshot())
    finally:
        if load is not None:
            load.stop()
        if harness is not None:
            harness.close()
        local.down(home)
        shutil.rmtree(tmp, ignore_errors=True)
    return _report(results, final, load, started, faults, hollow_nodes, interval)


def wait_nodes(client: ProtoClient, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len([n for n in client.list(pb.Node) if n.status.ready]) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} hollow nodes not ready after {timeout:g}s")
        time.sleep(0.5)


def _progress(result: FaultResult) -> None:
    recovery = "NOT RECOVERED" if result.recovery_seconds is None else f"{result.recovery_seconds}s"
    revived = f" (revived: {', '.join(result.revived)})" if result.revived else ""
    sys.stderr.write(
        f"fault {result.index + 1}: {result.signal} {result.component}: recovered in {recovery}"
        f"{revived}{'; ' + '; '.join(result.violations) if result.violations else ''}\n"
    )


def _report(
    results: list[FaultResult],
    final: list[str],
    load: Load | None,
    started: float,
    faults: int,
    hollow_nodes: int,
    interval: float,
) -> dict[str, Any]:
    per_kind: dict[str, Any] = {}
    for kind in KINDS:
        mine = [r for r in results if r.kind == kind]
        times = [r.recovery_seconds for r in mine if r.recovery_seconds is not None]
        per_kind[kind] = {
            "faults": len(mine),
            "sigkill": sum(r.signal == "SIGKILL" for r in mine),
            "sigterm": sum(r.signal == "SIGTERM" for r in mine),
            "not_recovered": len(mine) - len(times),
            "recovery_p50_s": percentile(times, 50) if times else None,
            "recovery_max_s": max(times) if times else None,
            "revived_after": sum(len(r.revived) for r in mine),
        }
    acknowledged = load.snapshot() if load is not None else {}
    return {
        "workload": "faults",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "command": " ".join(["python -m bench.faults", *sys.argv[1:]]),
        "machine": machine(),
        "faults_planned": faults,
        "hollow_nodes": hollow_nodes,
        "submit_interval_s": interval,
        "acknowledged_jobs": len(acknowledged),
        "acknowledged_pods": sum(acknowledged.values()),
        "submit_retries": load.retries if load is not None else 0,
        "ok": len(results) == faults and all(r.ok for r in results) and not final,
        "final_violations": final,
        "per_kind": per_kind,
        "faults": [r.__dict__ | {"ok": r.ok} for r in results],
    }


def summary_table(report: dict[str, Any]) -> str:
    lines = [
        "| kind | faults | SIGKILL | SIGTERM | not recovered | recovery P50 s | recovery max s "
        "| others revived |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, row in report["per_kind"].items():
        lines.append(
            f"| {kind} | {row['faults']} | {row['sigkill']} | {row['sigterm']} | "
            f"{row['not_recovered']} | {row['recovery_p50_s']} | {row['recovery_max_s']} | "
            f"{row['revived_after']} |"
        )
    violations = sum(len(f["violations"]) for f in report["faults"]) + len(
        report["final_violations"]
    )
    lines.append("")
    lines.append(
        f"{len(report['faults'])} faults, {report['acknowledged_jobs']} acknowledged jobs "
        f"({report['acknowledged_pods']} pods), {violations} invariant violations: "
        f"{'nothing lost' if report['ok'] else 'FAILED'}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--faults", type=int, default=100, help="faults to inject (default 100)")
    parser.add_argument("--quick", action="store_true", help="one fault per component kind")
    parser.add_argument("--hollow-nodes", type=int, default=40)
    parser.add_argument("--interval", type=float, default=0.3, help="seconds between load jobs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report directory")
    opts = parser.parse_args(argv)
    faults = len(KINDS) if opts.quick else opts.faults
    report = run(faults, hollow_nodes=opts.hollow_nodes, interval=opts.interval)
    opts.out.mkdir(parents=True, exist_ok=True)
    # Named as the other reports in bench/results/: <workload>-<UTC yyyymmdd-hhmmss>.
    when = report["started"].replace("-", "").replace(":", "").replace("T", "-").rstrip("Z")
    stem = opts.out / f"faults{'-quick' if opts.quick else ''}-{when}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    table = summary_table(report)
    stem.with_suffix(".md").write_text(table + "\n")
    sys.stdout.write(table + f"\n\nreport: {stem.with_suffix('.json')}\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
