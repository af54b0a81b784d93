"""End-to-end fixtures: a real local cluster (store server + every service as its own process,
as `godel up` starts it) per test, driven through the CLI and the client, and audited against
the invariants after every test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from godel import local
from godel.audit import audit
from godel.client import ProtoClient
from store import Store

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    home: local.GodelHome
    state: local.ClusterState
    client: ProtoClient

    def godel(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run the real `godel` CLI against this cluster."""
        result = subprocess.run(
            [sys.executable, "-m", "godel", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "GODEL_HOME": str(self.home.path)},
        )
        if check and result.returncode != 0:
            raise AssertionError(f"godel {' '.join(args)} failed:\n{result.stderr}")
        return result

    def component(self, name: str) -> local.ComponentRecord:
        record = self.state.component(name)
        assert record is not None, name
        return record

    def reload(self) -> None:
        state = self.home.load()
        assert state is not None
        self.state = state

    def start_again(self, name: str) -> None:
        """Start a (dead) component with the command `godel up` recorded for it, as an operator
        would, and record the new process so that `godel down` (the teardown) stops it."""
        record = self.component(name)
        assert record.process() is None, f"{name} still runs"
        with open(record.log, "ab") as out:
            proc = subprocess.Popen(
                record.command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.home.path,
                env={
                    **os.environ,
                    "PYTHONUNBUFFERED": "1",
                    "GODEL_STORE_URL": self.state.store_url,
                },
            )
        state = self.home.load()
        assert state is not None
        state.components = [
            replace(c, pid=proc.pid, create_time=psutil.Process(proc.pid).create_time())
            if c.name == name
            else c
            for c in state.components
        ]
        self.home.save(state)
        self.reload()

    def run_store(self, fn: Callable[[Store], Any]) -> Any:
        async def go() -> Any:
            store = await Store.connect(self.state.store_url)
            try:
                return await fn(store)
            finally:
                await store.close()

        return asyncio.run(go())


def wait_until(condition: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    """Poll until ``condition()`` is truthy; fail after ``timeout`` (generous: machines are
    shared, and this measures correctness, not speed)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or condition}")
        time.sleep(0.2)


# `godel up` picks its services' ports as free and each service binds its own a moment later.
# The ports come from below the kernel's ephemeral range (foundation.netutil.free_ports), so no
# outgoing connection takes one; another program binding the same port by number in between
# still could, and this retry is the backstop for that.
_PORT_TAKEN = "Address already in use"
_UP_ATTEMPTS = 3


def _up(home: local.GodelHome, spec: local.ClusterSpec) -> local.ClusterState:
    """`godel up`, again (on fresh ports) when a service found its port taken at start-up: the
    harness lost a race for a port, the cluster under test did nothing wrong. A failed `up` has
    stopped what it started."""
    for attempt in range(1, _UP_ATTEMPTS + 1):
        try:
            return local.up(home, spec)
        except local.ClusterError as exc:
            if _PORT_TAKEN not in str(exc) or attempt == _UP_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


@pytest.fixture
def make_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Cluster]]:
    monkeypatch.delenv("GODEL_REDIS_URL", raising=False)
    clusters: list[Cluster] = []

    def make(**spec_args: Any) -> Cluster:
        spec_args.setdefault("grace_seconds", 2.0)
        spec_args.setdefault("fsync", "everysec")
        spec_args.setdefault("process_node", False)
        # One process fewer on a shared machine; the dashboard's and metrics' tests ask for it.
        spec_args.setdefault("dashboard", False)
        home = local.GodelHome(tmp_path / f"home{len(clusters)}")
        state = _up(home, local.ClusterSpec(**spec_args))
        # As for a program run after `godel up`: the SDK and the CLI find the cluster and its
        # credentials (mutual TLS, the admin identity) in $GODEL_HOME.
        monkeypatch.setenv("GODEL_HOME", str(home.path))
        cluster = Cluster(home, state, ProtoClient(state.address_of("dispatcher")))
        clusters.append(cluster)
        return cluster

    yield make
    # Every cluster goes down, even when an earlier one fails its audit.
    with contextlib.ExitStack() as teardown:
        for cluster in clusters:
            teardown.callback(local.down, cluster.home)
            teardown.callback(cluster.client.close)
        for cluster in clusters:
            cluster.reload()
            report = cluster.run_store(audit)
            assert report.ok, "invariants violated:\n" + "\n".join(report.violations)
