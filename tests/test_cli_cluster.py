"""`godel up / status / down` end to end: real store server, real service processes, driven
through the CLI as a user would (`python -m godel.cli.main`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
import redis

pytestmark = pytest.mark.e2e

Godel = Callable[..., subprocess.CompletedProcess[str]]

DEFAULT_COMPONENTS = {
    "store", "dispatcher", "scheduler-0", "scheduler-1", "binder-0", "binder-1", "rescheduler",
    "nodeagent-0", "dashboard",
}  # fmt: skip


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "godel-home"


@pytest.fixture
def godel(home: Path) -> Iterator[Godel]:
    """Run the CLI against ``home`` with its own store server; `godel down` at teardown."""
    env = {k: v for k, v in os.environ.items() if k != "GODEL_REDIS_URL"}
    env["GODEL_HOME"] = str(home)

    def run(
        *args: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "godel.cli.main", *args],
            env={**env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=90,
        )

    yield run
    run("down")


def _status(godel: Godel) -> tuple[int, dict[str, dict[str, Any]]]:
    result = godel("status", "-o", "json")
    return result.returncode, {c["name"]: c for c in json.loads(result.stdout)}


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_up_status_down(godel: Godel, home: Path) -> None:
    started = godel("up", "--grace", "1")
    assert started.returncode == 0, started.stderr
    assert {line.split()[0] for line in started.stdout.splitlines()[1:] if line.strip()} >= (
        DEFAULT_COMPONENTS
    )
    assert (home / "cluster.json").is_file()
    assert (home / "logs" / "dispatcher.log").is_file()

    code, components = _status(godel)
    assert code == 0
    assert set(components) == DEFAULT_COMPONENTS
    assert all(c["alive"] and c["health"] == "SERVING" for c in components.values())
    pids = [c["pid"] for c in components.values()]
    assert all(not _gone(pid) for pid in pids)
    # The store URL reaches the services through their environment, never their argv (which
    # `ps` shows to everyone).
    url = components["store"]["address"]
    for name, c in components.items():
        if name != "store":
            assert not any(url in arg for arg in psutil.Process(c["pid"]).cmdline()), name

    table = godel("status")
    assert table.returncode == 0
    assert table.stdout.split()[:7] == [
        "NAME", "PID", "ADDRESS", "METRICS", "ALIVE", "HEALTH", "AGE",
    ]  # fmt: skip

    again = godel("up")
    assert again.returncode != 0
    assert "already running" in again.stderr

    stopped = godel("down")
    assert stopped.returncode == 0, stopped.stderr
    assert {line.split()[0] for line in stopped.stdout.splitlines()} == DEFAULT_COMPONENTS
    assert all(_gone(pid) for pid in pids)
    assert not (home / "cluster.json").exists()

    twice = godel("down")
    assert twice.returncode == 0 and "no cluster running" in twice.stdout
    after = godel("status")
    assert after.returncode != 0 and "no cluster" in after.stderr

    # `--purge` removes what the cluster kept (store data, logs) and the home once empty.
    assert (home / "store").is_dir()
    purged = godel("down", "--purge")
    assert purged.returncode == 0, purged.stderr
    assert f"removed {home.resolve()}" in purged.stdout.splitlines()
    assert not home.exists()


def test_up_prints_the_down_that_stops_it(godel: Godel, home: Path) -> None:
    started = godel("up", "--grace", "1", "--hollow-nodes", "1", "--no-process-node")
    assert started.returncode == 0, started.stderr
    # GODEL_HOME names the home here, as --home would: the printed command names it too.
    assert started.stdout.rstrip().endswith(f"stop it with `godel down --home {home}`")


def test_up_locks_the_store_and_keeps_the_home_private(godel: Godel, home: Path) -> None:
    started = godel("up", "--grace", "1", "--hollow-nodes", "2", "--no-process-node")
    assert started.returncode == 0, started.stderr
    state = json.loads((home / "cluster.json").read_text())
    [store] = [c for c in state["components"] if c["name"] == "store"]
    url = urlsplit(store["address"])
    assert url.username == "godel" and url.password, "the services' URL carries the secret"

    # Nobody gets in without it; the services' user cannot harm the whole server.
    anonymous = redis.Redis(host=url.hostname, port=url.port, socket_timeout=5)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    services = redis.Redis.from_url(store["address"], socket_timeout=5)
    assert services.ping()
    for command in (("FLUSHALL",), ("CONFIG", "SET", "appendfsync", "no"), ("KEYS", "*")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            services.execute_command(*command)

    # Every file under the home is its owner's alone; the secret is printed nowhere.
    for path in [home, *home.rglob("*")]:
        if path.is_symlink() or not path.exists():
            continue
        mode = path.stat().st_mode & 0o777
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
    for printed in (started.stdout, godel("status").stdout, godel("status", "-o", "json").stdout):
        assert url.password not in printed


def test_up_with_store_replicas_runs_a_replica_and_three_sentinels(
    godel: Godel, home: Path
) -> None:
    """`godel up --store-replicas 1`: a primary, a replica and three Sentinels beside the
    services, all healthy; the services get a Sentinel URL; no secret in any process's argv or
    in what is printed; `godel down` stops them all."""
    started = godel(
        "up", "--store-replicas", "1", "--grace", "1", "--hollow-nodes", "2",
        "--no-process-node", "--schedulers", "1", "--binders", "1",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    code, components = _status(godel)
    assert code == 0, components
    store_side = {"store", "store-replica-0", "sentinel-0", "sentinel-1", "sentinel-2"}
    assert store_side <= set(components)
    assert all(c["alive"] and c["health"] == "SERVING" for c in components.values())
    state = json.loads((home / "cluster.json").read_text())
    url = urlsplit(state["store_url"])
    assert url.scheme == "redis+sentinel" and url.password
    for printed in (started.stdout, godel("status").stdout, godel("status", "-o", "json").stdout):
        assert url.password not in printed
    admin = (home / "store" / "admin.secret").read_text().strip()
    for name, c in components.items():
        argv = " ".join(psutil.Process(c["pid"]).cmdline())
        assert url.password not in argv and admin not in argv, f"a secret in {name}'s argv"
    # A store server is started (and started again) through store.rejoin: it asks the
    # Sentinels for its role first, so a killed primary started again comes back as a replica.
    for record in state["components"]:
        if record["kind"] == "store":
            assert record["command"][1:4] == ["-P", "-m", "store.rejoin"], record["command"]
    [replica_url] = [c["address"] for c in state["components"] if c["name"] == "store-replica-0"]
    replica = redis.Redis.from_url(replica_url, socket_timeout=5)
    assert replica.info("replication")["role"] == "slave"
    pids = [c["pid"] for c in components.values()]
    assert godel("down").returncode == 0
    assert all(_gone(pid) for pid in pids)


def test_status_reports_a_killed_component(godel: Godel) -> None:
    assert godel("up", "--schedulers", "1", "--binders", "1", "--grace", "1").returncode == 0
    _, components = _status(godel)
    victim = components["scheduler-0"]["pid"]
    os.kill(victim, signal.SIGKILL)
    _wait_until(lambda: _gone(victim))

    code, components = _status(godel)
    assert code != 0
    assert components["scheduler-0"]["alive"] is False
    assert components["scheduler-0"]["health"] == "UNREACHABLE"
    assert all(c["healthy"] for name, c in components.items() if name != "scheduler-0")
    assert "scheduler-0" in godel("status").stderr

    stopped = godel("down")
    assert "scheduler-0 not running" in stopped.stdout
    assert all(_gone(c["pid"]) for c in components.values())


def test_up_names_the_failing_component_and_stops_the_rest(godel: Godel, home: Path) -> None:
    # Every service rejects this setting at startup (exit 2): `up` must report it and clean up.
    failed = godel("up", extra_env={"GODEL_LOG_LEVEL": "loud"})
    assert failed.returncode != 0
    assert "exited with code 2 during startup" in failed.stderr
    assert "GODEL_LOG_LEVEL" in failed.stderr  # the tail of the failing component's log
    assert not (home / "cluster.json").exists()
    assert not (home / "store" / "server.pid").exists()  # the store server was stopped too
    leftovers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(home) in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []
