"""The standing fault harness: a real local cluster under a steady mixed load, its components
killed (SIGKILL) and stopped (SIGTERM) in turn, each started again as an operator would, and the
invariants checked from outside after every fault.

    python -m bench.faults                  # 100 faults (default), report in bench/results/
    python -m bench.faults --quick          # one fault per kind and store restart (what CI runs)
    python -m bench.faults --faults 12 --out /tmp/r
    python -m bench.faults --store-replicas 2   # the store primary also never started again
    python -m bench.faults --paper-scale    # 20,000 nodes holding 1,000,000 pods, 2 faults a kind
    python -m bench.faults --hollow-nodes 2000 --prefill-pods 100000 --faults 12   # a tenth of it
    python -m bench.faults --quick --standby-shards 1   # a spare takes a killed shard's name

The cluster is `godel up --store-replicas 1` (a primary, a replica, three Sentinels; see
``--store-replicas``), two scheduler shards, two binders, the rescheduler and one node agent of
hollow nodes. The load thread submits a job every ``--interval`` seconds through the
Dispatcher's public API (gangs, min-member-1 services; pods that run a few seconds, so capacity
keeps turning over), retrying each Submit with its request id until the Dispatcher acknowledges
it, as a careful client does.

Fault *i* hits kind ``KINDS[i % 6]`` (the store primary as Sentinel names it, the dispatcher, a
scheduler shard, the Binder leader, the rescheduler, the node agent) with SIGKILL or SIGTERM,
alternating so that every kind gets both. The harness waits until the process is gone, starts it
again with the command `godel up` recorded (``godel.local.start_again``), then submits a probe
gang and measures **recovery**: from the signal until that probe is bound whole.

The store primary is started again in turn at once (as a supervisor does), after
``--store-restart-delay`` seconds, and — with two replicas or more, which can go on without it —
never (only once the fault is over, so the next finds a whole store). For it the harness also
measures **failover**: from the signal until the store first acknowledges a write (a
replication barrier: a write ``WAIT`` confirms on a replica), and which server took it.

After every fault it checks, from outside, through the store:

- every job the Dispatcher acknowledged exists with a pod for each of its indexes, and every one
  of those pods is bound (waiting for that up to ``_BIND_DEADLINE`` seconds): acknowledged work
  is not only kept but scheduled;
- every binding seen before is still there, on the same node (no acknowledged binding lost);
- ``godel audit``'s invariants: no node over-committed, no pod bound twice, no gang split.

**At scale** (``--prefill-pods``, ``--paper-scale``): before the first fault the cluster is
filled through the Dispatcher's public API with pods that run until deleted (PaperScale's
shape: 50 milli-CPU and 200 MiB, jobs of ``--prefill-job-size``), and the harness waits until
the store holds a claim for each. Every check above then covers them too (no binding of the
million lost), and **serving** per fault is what a restart costs at that size: from the signal
until the restarted component answers its health check SERVING again (its informer has listed
the whole state).

**Standby shards** (``--standby-shards N``): N spare scheduler processes stand by for both
shards' names (``services/scheduler/README.md``, "Standby shards"). A shard's fault then hits
the process serving as that shard (the holder of its name's lease: a spare or a restarted
process after an earlier fault), and **scheduling** is timed separately from serving: from the
signal until a process serves as that shard again — the spare taking the name after the lease
(no listing) rather than the restarted process after its listing.

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
import contextlib
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

from bench.harness import INIT_IN_FLIGHT, _StoreProbe, machine, percentile
from foundation.retry import Backoff, Retry
from godel import local
from godel.audit import audit
from godel.client import ClientError, ProtoClient
from godel.local.cluster import SPARE_PREFIX, probe_credentials
from protos.godel.v1 import objects_pb2 as pb
from services.runtime.healthcheck import probe
from services.scheduler.shardlease import shard_lease
from store import Store, StoreError
from store.client import SentinelTarget
from store.lease import holder_name
from store.server import primary_port_named_by

KINDS = ("store", "dispatcher", "scheduler", "binder", "rescheduler", "nodeagent")
DEFAULT_STORE_RESTART_DELAY = 5.0
DEFAULT_OUT = Path("bench/results")
PROBE_PREFIX = "probe"
LOAD_PREFIX = "load"
PREFILL_PREFIX = "fill"
# PaperScale-20000's cluster and pods (bench/workloads/PaperScale-20000.yaml).
PAPER_SCALE_NODES = 20_000
PAPER_SCALE_PODS = 1_000_000
PAPER_SCALE_FAULTS = 2 * 6  # two of each kind: a SIGKILL and a SIGTERM
NODES_PER_AGENT = 5_000
_PREFILL_MILLI_CPU = 50
_PREFILL_MEMORY = 200 << 20
# Prefill jobs per Submit call, and the tries of each call.
_PREFILL_JOBS_PER_CALL = 10
_PREFILL_ATTEMPTS = 10
_GONE_SECONDS = 30.0
_RECOVERY_DEADLINE = 180.0
_REVIVE_EVERY_SECONDS = 2.0
# How long the acknowledged pods may take to be bound after a fault before the check fails.
_BIND_DEADLINE = 120.0
_FAILOVER_POLL_SECONDS = 0.05
# At scale: how long filling may take per pod (the cluster fills at ~1,000 pods/s on two
# cores), and how much longer a service may take to serve again per pod the store holds
# (a restart lists the whole state: ~40 s at a million pods on two cores).
_PREFILL_SECONDS_PER_POD = 0.005
_START_SECONDS_PER_POD = 0.0002
# The checker's store connections ride out a failover: every half second, 60 tries in all.
_STORE_RETRY = Backoff(0.5)
_STORE_ATTEMPTS = 60


@dataclass(frozen=True)
class Fault:
    """One fault to inject: ``kind``'s target gets ``signal`` and is started again
    ``restart_after`` seconds later (None: not before the fault is over)."""

    kind: str
    signal: signal.Signals
    restart_after: float | None = 0.0

    @property
    def restart(self) -> str:
        if self.restart_after is None:
            return "never"
        return "at once" if self.restart_after == 0 else f"after {self.restart_after:g}s"


def store_restarts(store_replicas: int, delay: float) -> tuple[float | None, ...]:
    """When the killed store primary is started again: at once, after ``delay``, and — when a
    replica is left to confirm writes without it — never."""
    return (0.0, delay, None) if store_replicas >= 2 else (0.0, delay)


def plan(faults: int, restarts: tuple[float | None, ...], *, quick: bool = False) -> list[Fault]:
    """The faults in order. The full run: kind ``KINDS[i % 6]``, the signal alternating per kind
    and round, the store's restart changing every second round (so each gets both signals).
    The quick form: the store primary killed once per restart, then every other kind once."""
    if quick:
        return [Fault("store", signal.SIGKILL, after) for after in restarts] + [
            Fault(kind, signal_for(i)) for i, kind in enumerate(KINDS) if kind != "store"
        ]
    planned: list[Fault] = []
    for i in range(faults):
        kind = KINDS[i % len(KINDS)]
        after = restarts[(i // len(KINDS) // 2) % len(restarts)] if kind == "store" else 0.0
        planned.append(Fault(kind, signal_for(i), after))
    return planned


@dataclass
class FaultResult:
    index: int
    kind: str
    component: str
    signal: str
    recovery_seconds: float | None
    """Signal → the probe gang bound whole; None if it never was within the deadline."""
    restart_seconds: float | None
    """Signal → the process started again (waiting for the old one to be gone included)."""
    restart: str = "at once"
    """When the process was started again: "at once", "after 5s", or "never" (during the
    fault; it was started again once the fault was over)."""
    serving_seconds: float | None = None
    """A service only: signal → the restarted process answered its health check SERVING (its
    informer synced): what a restart costs at the cluster's size. None: not a service, or it
    did not within the deadline."""
    scheduling_seconds: float | None = None
    """A scheduler shard only: signal → a process serves as that shard again (holds its name's
    lease, says SERVING for the Scheduler service): with ``--standby-shards``, the spare that
    took the name, without any listing; else the restarted process once it listed. None: not
    a shard, or not within the deadline."""
    failover_seconds: float | None = None
    """The store primary only: signal → the first write the store acknowledged (None: none
    within the deadline)."""
    failover_to: str = ""
    """The store server that acknowledged that write (the new primary, or the old one back)."""
    violations: list[str] = field(default_factory=list)
    revived: list[str] = field(default_factory=list)
    """Other components found dead after this fault and started again, as a supervisor
    (systemd, compose's restart policy) would: e.g. a service whose startup failed because
    the store was failing over. Reported; not a violation."""

    @property
    def ok(self) -> bool:
        failed_over = self.kind != "store" or self.failover_seconds is not None
        return self.recovery_seconds is not None and failed_over and not self.violations


class _ShardClock(threading.Thread):
    """Times, from ``since``, until a process serves as ``shard`` again (after its holder got
    the signal and is gone: it is polled from then)."""

    def __init__(self, store_url: str, shard: str, since: float, credentials: Any) -> None:
        super().__init__(name=f"shard-clock-{shard}", daemon=True)
        self.store_url, self.shard, self.since = store_url, shard, since
        self.credentials = credentials
        self.seconds: float | None = None

    def run(self) -> None:
        probe_store = _StoreProbe(self.store_url)
        try:
            while time.monotonic() < self.since + _RECOVERY_DEADLINE:
                with contextlib.suppress(StoreError):
                    if probe_store.serves_as_shard(self.shard, self.credentials):
                        self.seconds = round(time.monotonic() - self.since, 2)
                        return
                time.sleep(0.05)
        finally:
            probe_store.close()


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


class FailoverClock(threading.Thread):
    """Started right after the store primary's signal: writes through the Sentinels (a
    replication barrier, acknowledged only once a replica has it) until the store acknowledges
    one, and keeps the time that took and the port of the server that took it."""

    def __init__(self, store_url: str, since: float) -> None:
        super().__init__(name="failover-clock", daemon=True)
        self._url = store_url
        self._since = since
        self.seconds: float | None = None
        self.primary_port: int | None = None

    def run(self) -> None:
        asyncio.run(self._measure())

    async def _measure(self) -> None:
        deadline = self._since + _RECOVERY_DEADLINE
        store: Store | None = None
        try:
            while time.monotonic() < deadline:
                try:
                    if store is None:
                        store = await Store.connect(self._url)
                    await store.replication_barrier()
                except StoreError:
                    await asyncio.sleep(_FAILOVER_POLL_SECONDS)
                    continue
                self.seconds = round(time.monotonic() - self._since, 2)
                with contextlib.suppress(StoreError):
                    self.primary_port = int((await store.server_info())["tcp_port"])
                return
        finally:
            if store is not None:
                await store.close()


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
    def __init__(
        self, home: local.GodelHome, state: local.ClusterState, start_allowance: float = 0.0
    ) -> None:
        self.home = home
        self.state = state
        # Seconds more a service may take to serve again than a small cluster's deadline: its
        # informer lists the whole state (a minute or so at a million pods).
        self.start_allowance = start_allowance
        self.client = ProtoClient(state.address_of("dispatcher"), timeout=10, home=home.path)
        self.credentials = probe_credentials(home, state)  # health checks speak TLS too
        self.bindings: dict[str, str] = {}
        self._probes = 0
        # A component whose restart is deferred (the store primary started again later, or
        # never during its fault): left down, not revived as a casualty.
        self._held_down: str | None = None
        self._restarted_at = 0.0
        self._starting = threading.Lock()

    # --- choosing and hitting the target -------------------------------------------------

    def target(self, kind: str, index: int) -> str:
        """The component of ``kind`` to hit: the store's current primary, the Binder leader,
        the shards in turn."""
        if kind == "store":
            return self._primary()
        if kind == "binder":
            lease = self._run(lambda s: s.get_lease("binder"))
            if lease is not None and lease.holder:
                holder = holder_name(lease.holder)
                if self.state.component(holder) is not None:
                    return holder
        if kind == "scheduler":
            return self._shard_holder(self.shard_named(index))
        names = [c.name for c in self.state.components if c.kind == kind]
        return names[index % len(names)]

    def shard_named(self, index: int) -> str:
        """The shard the ``index``-th fault hits (the shards' names in turn; spares are none)."""
        names = [
            c.name
            for c in self.state.components
            if c.kind == "scheduler" and not c.name.startswith(SPARE_PREFIX)
        ]
        return names[index % len(names)]

    def _shard_holder(self, shard: str) -> str:
        """The process serving as ``shard``: the holder of its name's lease (its holder is
        ``<process name>/<token>``), which after a takeover is a spare or a restarted process."""
        lease = self._run(lambda s: s.get_lease(shard_lease(shard)))
        if lease is not None and lease.holder:
            holder = holder_name(lease.holder)
            if self.state.component(holder) is not None:
                return holder
        return shard

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

    def hit(self, index: int, fault: Fault) -> FaultResult:
        self.state = self.home.load() or self.state
        name = self.target(fault.kind, index)
        record = self.state.component(name)
        assert record is not None and record.pid is not None
        process = record.process()
        started = time.monotonic()
        if process is not None:
            process.send_signal(fault.signal)
            try:
                process.wait(_GONE_SECONDS)
            except psutil.TimeoutExpired:
                process.kill()  # an operator's next step too
                process.wait(_GONE_SECONDS)
        # Timed from the signal, writing from when the old primary is gone (a SIGTERMed one
        # may still take a write on its way out).
        clock = FailoverClock(self.state.store_url, started) if fault.kind == "store" else None
        if clock is not None:
            clock.start()
        self._held_down = name
        shard_clock = (
            _ShardClock(self.state.store_url, self.shard_named(index), started, self.credentials)
            if fault.kind == "scheduler"
            else None
        )
        if shard_clock is not None:
            shard_clock.start()
        # At its time, on a timer of its own: the probe below may block in a call for seconds.
        timer: threading.Timer | None = None
        if fault.restart_after is not None:
            due = max(0.0, started + fault.restart_after - time.monotonic())
            timer = threading.Timer(due, self._start_held_down)
            timer.start()
        revived: list[str] = []
        recovery = self._probe_bound(started, revived)
        if timer is not None:
            timer.join()
        # Never during the fault: now it is over, so the next finds the whole cluster. (Also a
        # start the timer could not make: this one raises.)
        if self._held_down is not None:
            self._start_held_down()
        self.state = self.home.load() or self.state
        restarted = self._restarted_at - started
        serving = self._wait_serving(name, revived)
        result = FaultResult(
            index, fault.kind, name, fault.signal.name, recovery,
            round(restarted, 2) if fault.restart_after is not None else None, fault.restart,
        )  # fmt: skip
        result.revived = revived
        if serving is not None:
            result.serving_seconds = round(serving - started, 2)
        if shard_clock is not None:
            shard_clock.join(_RECOVERY_DEADLINE + self.start_allowance)
            result.scheduling_seconds = shard_clock.seconds
        if clock is not None:
            clock.join(_RECOVERY_DEADLINE)
            result.failover_seconds = clock.seconds
            result.failover_to = self._store_named(clock.primary_port)
        return result

    def _start_held_down(self) -> None:
        with self._starting:
            assert self._held_down is not None
            local.start_again(self.home, self._held_down)
            self._restarted_at = time.monotonic()
            self._held_down = None

    def _store_named(self, port: int | None) -> str:
        for component in self.state.components:
            if component.kind == "store" and component.address.endswith(f":{port}/0"):
                return component.name
        return ""

    def _wait_serving(self, name: str, revived: list[str]) -> float | None:
        """As an operator confirms a restart: wait until the component serves again (a service
        answers its health check SERVING), so the next fault does not land mid-startup. The
        monotonic time it first answered SERVING; None for the store, or past the deadline."""
        record = self.state.component(name)
        if record is None or record.kind in ("store", "sentinel"):
            return None
        deadline = time.monotonic() + _RECOVERY_DEADLINE + self.start_allowance
        while time.monotonic() < deadline:
            record = self.state.component(name)
            if (
                record is not None
                and probe(record.address, timeout=1, credentials=self.credentials) == "SERVING"
            ):
                return time.monotonic()
            revived += self.revive()
            self.state = self.home.load() or self.state  # its new address, once it has one
            time.sleep(0.2)
        return None

    def revive(self) -> list[str]:
        """Start again every component that is not running (but the one held down)."""
        with self._starting:  # not while the held-down one is being started on its timer
            self.state = self.home.load() or self.state
            dead = [
                c.name
                for c in self.state.components
                if c.pid and c.name != self._held_down and c.process() is None
            ]
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
        deadline = since + _RECOVERY_DEADLINE + self.start_allowance
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
        return violations + self.await_bound(acknowledged)

    def await_bound(self, acknowledged: dict[str, int]) -> list[str]:
        """Wait until every pod of every acknowledged job is bound (each index has a pod with a
        node): what was acknowledged is scheduled, not only kept. A violation names the pods
        still unbound after ``_BIND_DEADLINE`` seconds."""

        async def read(store: Store) -> list[pb.Pod]:
            pods, _ = await store.list_all(pb.Pod)
            return pods

        deadline = time.monotonic() + _BIND_DEADLINE
        while True:
            bound: dict[str, set[int]] = defaultdict(set)
            for pod in self._run(read):
                if pod.spec.node_name:
                    bound[pod.spec.job].add(pod.spec.index)
            unbound = [
                f"{name}[{index}]"
                for name, replicas in acknowledged.items()
                for index in range(replicas)
                if index not in bound[name]
            ]
            if not unbound:
                return []
            if time.monotonic() >= deadline:
                shown = ", ".join(unbound[:10]) + (", ..." if len(unbound) > 10 else "")
                return [
                    f"{len(unbound)} acknowledged pod(s) not bound after {_BIND_DEADLINE:g}s: "
                    f"{shown}"
                ]
            time.sleep(0.2)

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


def prefill_jobs(pods: int, job_size: int) -> list[pb.Job]:
    """``pods`` pods that run until deleted, in jobs of ``job_size`` (the last one smaller)."""
    jobs = []
    for i, first in enumerate(range(0, pods, job_size)):
        job = _job(f"{PREFILL_PREFIX}-{i}", min(job_size, pods - first), 1, 0)
        job.spec.template.requests.milli_cpu = _PREFILL_MILLI_CPU
        job.spec.template.requests.memory_bytes = _PREFILL_MEMORY
        jobs.append(job)
    return jobs


def prefill(client: ProtoClient, store_url: str, pods: int, job_size: int) -> float:
    """Fill the cluster with ``pods`` long-running pods through the public API and wait until
    the store holds a claim for each; the seconds it took. Progress on stderr. Paced as the
    bench's init phase is: no more than ``INIT_IN_FLIGHT`` pods submitted and not yet bound, under
    the queue's admission limit (``max_pending_pods``, 200,000 by default). A call that fails (a
    deadline on a busy machine) is sent again under its request id, as a careful client does:
    the Dispatcher answers a repeat with what the first did."""
    started = time.monotonic()
    deadline = started + _PREFILL_SECONDS_PER_POD * pods + 300
    jobs = prefill_jobs(pods, job_size)
    probe = _StoreProbe(store_url)
    reported = 0.0

    def wait_for_claims(at_least: int) -> None:
        nonlocal reported
        while (bound := probe.claims()) < at_least:
            if time.monotonic() > deadline:
                raise RuntimeError(f"prefill: only {bound:,} of {pods:,} pods bound in time")
            if time.monotonic() - reported > 10:
                reported = time.monotonic()
                sys.stderr.write(
                    f"prefill: {bound:,} of {pods:,} pods bound "
                    f"({time.monotonic() - started:.0f}s)\n"
                )
            time.sleep(0.5)

    try:
        submitted = 0
        for first in range(0, len(jobs), _PREFILL_JOBS_PER_CALL):
            wait_for_claims(submitted - INIT_IN_FLIGHT)
            batch = jobs[first : first + _PREFILL_JOBS_PER_CALL]
            request_id = f"prefill-{batch[0].metadata.name}"
            for attempt in range(_PREFILL_ATTEMPTS):
                try:
                    results = client.submit(batch, request_id=request_id).results
                    break
                except ClientError:
                    if attempt == _PREFILL_ATTEMPTS - 1:
                        raise
                    time.sleep(1.0)
            for result in results:
                if not (result.created or result.existing):
                    violations = "; ".join(f"{v.field}: {v.description}" for v in result.violations)
                    raise RuntimeError(f"a prefill job was refused: {violations}")
            submitted += sum(job.spec.replicas for job in batch)
        wait_for_claims(pods)
    finally:
        probe.close()
    return round(time.monotonic() - started, 1)


def run(
    faults: int,
    *,
    quick: bool = False,
    hollow_nodes: int = 40,
    interval: float = 0.3,
    store_replicas: int = 1,
    store_restart_delay: float = DEFAULT_STORE_RESTART_DELAY,
    prefill_pods: int = 0,
    prefill_job_size: int = 1000,
    standby_shards: int = 0,
) -> dict[str, Any]:
    planned = plan(faults, store_restarts(store_replicas, store_restart_delay), quick=quick)
    os.environ.pop("GODEL_REDIS_URL", None)
    tmp = Path(tempfile.mkdtemp(prefix="godel-faults-"))
    home = local.GodelHome(tmp)
    spec = local.ClusterSpec(
        schedulers=2, standby_shards=standby_shards, binders=2, hollow_nodes=hollow_nodes,
        process_node=False,
        nodeagents=max(1, -(-hollow_nodes // NODES_PER_AGENT)),
        store_replicas=store_replicas, grace_seconds=2.0, ready_timeout=120.0,
        dashboard=not prefill_pods,  # a watcher of every pod: not at scale
    )  # fmt: skip
    started = time.time()
    results: list[FaultResult] = []
    load: Load | None = None
    harness: Harness | None = None
    fill_seconds = 0.0
    try:
        state = local.up(home, spec)
        harness = Harness(home, state, start_allowance=_START_SECONDS_PER_POD * prefill_pods)
        wait_nodes(harness.client, hollow_nodes, timeout=120.0 + hollow_nodes / 50)
        if prefill_pods:
            fill_seconds = prefill(harness.client, state.store_url, prefill_pods, prefill_job_size)
        load = Load(state.address_of("dispatcher"), interval, home.path)
        load.start()
        for index, fault in enumerate(planned):
            result = harness.hit(index, fault)
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
    report = _report(
        results, final, load, started, len(planned), hollow_nodes, interval, store_replicas
    )
    report["prefill_pods"] = prefill_pods
    report["standby_shards"] = standby_shards
    report["prefill_seconds"] = fill_seconds
    return report


def wait_nodes(client: ProtoClient, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len([n for n in client.list(pb.Node) if n.status.ready]) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} hollow nodes not ready after {timeout:g}s")
        time.sleep(0.5)


def _progress(result: FaultResult) -> None:
    recovery = "NOT RECOVERED" if result.recovery_seconds is None else f"{result.recovery_seconds}s"
    revived = f" (revived: {', '.join(result.revived)})" if result.revived else ""
    failover = ""
    if result.kind == "store":
        took = "none" if result.failover_seconds is None else f"{result.failover_seconds}s"
        failover = f" (restarted {result.restart}; first write acknowledged: {took}"
        failover += f" on {result.failover_to})" if result.failover_to else ")"
    sys.stderr.write(
        f"fault {result.index + 1}: {result.signal} {result.component}{failover}: recovered in "
        f"{recovery}{revived}{'; ' + '; '.join(result.violations) if result.violations else ''}\n"
    )


def _report(
    results: list[FaultResult],
    final: list[str],
    load: Load | None,
    started: float,
    faults: int,
    hollow_nodes: int,
    interval: float,
    store_replicas: int,
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
            "serving_p50_s": percentile(serving, 50) if (serving := _serving(mine)) else None,
            "serving_max_s": max(serving) if serving else None,
            "scheduling_p50_s": percentile(sched, 50) if (sched := _scheduling(mine)) else None,
            "scheduling_max_s": max(sched) if sched else None,
            "revived_after": sum(len(r.revived) for r in mine),
        }
    store_failover: dict[str, Any] = {}
    for restart in dict.fromkeys(r.restart for r in results if r.kind == "store"):
        mine = [r for r in results if r.kind == "store" and r.restart == restart]
        times = [r.failover_seconds for r in mine if r.failover_seconds is not None]
        recovered = [r.recovery_seconds for r in mine if r.recovery_seconds is not None]
        store_failover[restart] = {
            "faults": len(mine),
            "no_write_acknowledged": len(mine) - len(times),
            "failover_p50_s": percentile(times, 50) if times else None,
            "failover_max_s": max(times) if times else None,
            "recovery_p50_s": percentile(recovered, 50) if recovered else None,
            "recovery_max_s": max(recovered) if recovered else None,
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
        "store_replicas": store_replicas,
        "submit_interval_s": interval,
        "acknowledged_jobs": len(acknowledged),
        "acknowledged_pods": sum(acknowledged.values()),
        "submit_retries": load.retries if load is not None else 0,
        "ok": len(results) == faults and all(r.ok for r in results) and not final,
        "final_violations": final,
        "per_kind": per_kind,
        "store_failover": store_failover,
        "faults": [r.__dict__ | {"ok": r.ok} for r in results],
    }


def _scheduling(results: list[FaultResult]) -> list[float]:
    return [r.scheduling_seconds for r in results if r.scheduling_seconds is not None]


def _serving(results: list[FaultResult]) -> list[float]:
    return [r.serving_seconds for r in results if r.serving_seconds is not None]


def summary_table(report: dict[str, Any]) -> str:
    lines = []
    if report.get("prefill_pods"):
        lines += [
            f"At scale: {report['hollow_nodes']:,} nodes holding {report['prefill_pods']:,} "
            f"pods before the first fault (filled in {report['prefill_seconds']} s). Serving = "
            "signal → the restarted service answers SERVING (its informer synced).",
            "",
        ]
    lines += [
        "| kind | faults | SIGKILL | SIGTERM | not recovered | recovery P50 s | recovery max s "
        "| serving P50 s | serving max s | others revived |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, row in report["per_kind"].items():
        lines.append(
            f"| {kind} | {row['faults']} | {row['sigkill']} | {row['sigterm']} | "
            f"{row['not_recovered']} | {row['recovery_p50_s']} | {row['recovery_max_s']} | "
            f"{row.get('serving_p50_s')} | {row.get('serving_max_s')} | {row['revived_after']} |"
        )
    shard = report["per_kind"].get("scheduler", {})
    if shard.get("scheduling_p50_s") is not None:
        lines += [
            "",
            f"Scheduler shard, signal → a process serves as that shard again "
            f"({report.get('standby_shards', 0)} spare(s)): P50 {shard['scheduling_p50_s']} s, "
            f"max {shard['scheduling_max_s']} s.",
        ]
    lines += [
        "",
        f"Store primary, by when it was started again ({report['store_replicas']} replica(s)): "
        "failover = signal → the first write the store acknowledged; recovery = signal → a "
        "probe gang bound whole.",
        "",
        "| restart | faults | no write acknowledged | failover P50 s | failover max s "
        "| recovery P50 s | recovery max s |",
        "|---|---|---|---|---|---|---|",
    ]
    for restart, row in report["store_failover"].items():
        lines.append(
            f"| {restart} | {row['faults']} | {row['no_write_acknowledged']} | "
            f"{row['failover_p50_s']} | {row['failover_max_s']} | {row['recovery_p50_s']} | "
            f"{row['recovery_max_s']} |"
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
    parser.add_argument(
        "--faults",
        type=int,
        help=f"faults to inject (default 100; {PAPER_SCALE_FAULTS} with --paper-scale)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one fault per component kind, the store primary's once per restart",
    )
    parser.add_argument("--hollow-nodes", type=int, default=40)
    parser.add_argument("--interval", type=float, default=0.3, help="seconds between load jobs")
    parser.add_argument(
        "--store-replicas",
        type=int,
        default=1,
        help="the store's replicas (default 1; with 2 or more the killed primary is also "
        "never started again during its fault)",
    )
    parser.add_argument(
        "--store-restart-delay",
        type=float,
        default=DEFAULT_STORE_RESTART_DELAY,
        help="seconds after its signal the store primary is started again in its delayed turn "
        f"(default {DEFAULT_STORE_RESTART_DELAY:g})",
    )
    parser.add_argument(
        "--prefill-pods",
        type=int,
        default=0,
        help="pods (running until deleted) the cluster holds before the first fault (default 0)",
    )
    parser.add_argument(
        "--prefill-job-size", type=int, default=1000, help="pods per prefill job (default 1000)"
    )
    parser.add_argument(
        "--paper-scale",
        action="store_true",
        help=f"the paper's scale: {PAPER_SCALE_NODES:,} hollow nodes holding "
        f"{PAPER_SCALE_PODS:,} pods, {PAPER_SCALE_FAULTS} faults (each kind twice) unless "
        "--faults says otherwise; about 19 GiB of memory",
    )
    parser.add_argument(
        "--standby-shards",
        type=int,
        default=0,
        help="spare scheduler processes standing by for both shards (default 0): a shard's "
        "fault is then survived by a spare taking its name",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report directory")
    opts = parser.parse_args(argv)
    if opts.paper_scale:
        if opts.quick:
            parser.error("--paper-scale: not with --quick (it has two faults of each kind)")
        opts.hollow_nodes, opts.prefill_pods = PAPER_SCALE_NODES, PAPER_SCALE_PODS
    if opts.faults is None:
        opts.faults = PAPER_SCALE_FAULTS if opts.paper_scale else 100
    if opts.prefill_pods < 0:
        parser.error("--prefill-pods: must be 0 or more")
    if opts.prefill_job_size < 1:
        parser.error("--prefill-job-size: must be at least 1")
    if opts.standby_shards < 0:
        parser.error("--standby-shards: must be 0 or more")
    if opts.store_replicas < 1:
        parser.error("--store-replicas: must be at least 1")
    if opts.store_restart_delay <= 0:
        parser.error("--store-restart-delay: must be more than 0 (the other turn is at once)")
    report = run(
        opts.faults,
        quick=opts.quick,
        hollow_nodes=opts.hollow_nodes,
        interval=opts.interval,
        store_replicas=opts.store_replicas,
        store_restart_delay=opts.store_restart_delay,
        prefill_pods=opts.prefill_pods,
        prefill_job_size=opts.prefill_job_size,
        standby_shards=opts.standby_shards,
    )
    opts.out.mkdir(parents=True, exist_ok=True)
    # Named as the other reports in bench/results/: <workload>-<UTC yyyymmdd-hhmmss>.
    when = report["started"].replace("-", "").replace(":", "").replace("T", "-").rstrip("Z")
    form = "-quick" if opts.quick else f"-{opts.prefill_pods}pods" if opts.prefill_pods else ""
    stem = opts.out / f"faults{form}-{when}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    table = summary_table(report)
    stem.with_suffix(".md").write_text(table + "\n")
    sys.stdout.write(table + f"\n\nreport: {stem.with_suffix('.json')}\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
