"""`godel up / status / down` end to end: real store server, real service processes, driven
through the CLI as a user would (`python -m godel.cli.main`)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
import redis

from foundation import pki, tls
from godel import local
from tests.redis_probe import outsider

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
            # A shell's usual umask: what the cluster keeps private, it does so itself.
            umask=0o022,
        )

    yield run
    run("down")


def _status(godel: Godel) -> tuple[int, dict[str, dict[str, Any]]]:
    result = godel("status", "-o", "json")
    return result.returncode, {c["name"]: c for c in json.loads(result.stdout)}


def _fetch(url: str, tls_dir: Path, identity: str | None) -> bytes:
    """GET ``url`` trusting the cluster's CA, presenting ``identity``'s certificate (None:
    none)."""
    if identity is None:
        context = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    else:
        context = tls.https_client_context(tls.files(tls_dir, identity))
    context.check_hostname = False  # dialled at 127.0.0.1; the CA is what matters
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        body: bytes = response.read()
        return body


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

    # Process-mode pods run on this machine (the default): loopback is no boundary, so every
    # metrics endpoint and the dashboard require a certificate of the cluster even there, and
    # the dashboard the admin's.
    assert "require a client certificate" in started.stdout
    tls_dir = home / "tls"
    pki.issue(tls_dir, "alice", "tenant", queues=["default"])
    for name, c in components.items():
        if c["metrics_address"]:
            assert c["metrics_url"].startswith("https://127.0.0.1:"), name
            with pytest.raises(OSError):  # no certificate: the handshake is refused
                _fetch(c["metrics_url"], tls_dir, None)
            with pytest.raises(OSError):
                _fetch(c["metrics_url"].replace("https://", "http://"), tls_dir, None)
            assert b"process_cpu_seconds_total" in _fetch(c["metrics_url"], tls_dir, "alice")
    dashboard = components["dashboard"]["web_url"]
    assert dashboard.startswith("https://127.0.0.1:")
    with pytest.raises(OSError):
        _fetch(dashboard + "api/summary", tls_dir, None)
    with pytest.raises(urllib.error.HTTPError) as refused:
        _fetch(dashboard + "api/summary", tls_dir, "alice")
    assert refused.value.code == 403
    summary = json.loads(_fetch(dashboard + "api/summary", tls_dir, tls.ADMIN))
    assert summary["nodes"]["total"] >= 1

    table = godel("status")
    assert table.returncode == 0
    assert components["dispatcher"]["metrics_url"] in table.stdout
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
    anonymous = outsider(host=url.hostname, port=url.port)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    services = redis.Redis.from_url(store["address"], socket_timeout=5)
    assert services.ping()
    for command in (("FLUSHALL",), ("CONFIG", "SET", "appendfsync", "no"), ("KEYS", "*")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            services.execute_command(*command)

    # Every file under the home is its owner's alone; the secret is printed nowhere.
    assert _exposed(home) == []
    for printed in (started.stdout, godel("status").stdout, godel("status", "-o", "json").stdout):
        assert url.password not in printed


def _exposed(home: Path) -> list[str]:
    """What under ``home`` its owner's group or others may use at all (mode & 0o077)."""
    return [
        f"{path} is {oct(path.stat().st_mode & 0o777)}"
        for path in [home, *home.rglob("*")]
        if not path.is_symlink() and path.exists() and path.stat().st_mode & 0o077
    ]


def test_up_with_store_replicas_runs_a_replica_and_three_sentinels(
    godel: Godel, home: Path
) -> None:
    """`godel up --store-replicas 1`: a primary, a replica and three Sentinels beside the
    services, all healthy; the services get a Sentinel URL; no secret in any process's argv or
    in what is printed. Through `godel scale` and the restart of a dead component, from a
    shell whose umask lets everyone read, every file of the home stays its owner's alone.
    `godel down --purge` stops them all and removes the whole home: replicas and Sentinels
    (whose config holds the admin's password) too."""
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
    assert _exposed(home) == []

    # `godel scale` and a restart write cluster.json, new logs and what the new processes
    # write: all private, though the shell's umask is 022.
    scaled = godel("scale", "scheduler=2")
    assert scaled.returncode == 0, scaled.stderr
    os.kill(components["scheduler-0"]["pid"], signal.SIGKILL)
    _wait_until(lambda: _gone(components["scheduler-0"]["pid"]))
    restarted = subprocess.run(
        [sys.executable, "-c", "import sys; from godel import local; "
         "local.start_again(local.GodelHome(local.default_home()), sys.argv[1])", "scheduler-0"],
        env={**os.environ, "GODEL_HOME": str(home)}, umask=0o022, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert restarted.returncode == 0, restarted.stderr
    # The restarted shard (and the one scale added) answer their health checks once they have
    # caught up with the store: on a loaded machine that takes a few seconds.
    seen: list[tuple[int, dict[str, dict[str, Any]]]] = []
    _wait_until(lambda: seen.append(_status(godel)) or seen[-1][0] == 0, timeout=60)
    code, components = seen[-1]
    assert code == 0 and {"scheduler-0", "scheduler-1"} <= set(components), components
    assert (home / "logs" / "scheduler-1.log").is_file()
    assert _exposed(home) == []

    pids = [c["pid"] for c in components.values()]
    store_side = ["store", "store-replica-0", "sentinel-0", "sentinel-1", "sentinel-2"]
    assert all((home / name).is_dir() for name in store_side)
    with pytest.raises(local.StateError, match="a cluster is running"):
        local.GodelHome(home).purge()  # never from under a running cluster
    assert all((home / name).is_dir() for name in store_side)
    purged = godel("down", "--purge")
    assert purged.returncode == 0, purged.stderr
    assert all(_gone(pid) for pid in pids)
    assert f"removed {home.resolve() / 'sentinel-0'}" in purged.stdout.splitlines()
    assert not home.exists(), sorted(home.rglob("*"))


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


def test_purge_removes_only_a_homes_own_and_refuses_other_directories(
    godel: Godel, home: Path, tmp_path: Path
) -> None:
    """`godel down --purge` pointed at a directory `godel up` did not make (its own `store/`
    and `logs/` notwithstanding) refuses, one line, and removes nothing. In a home it removes
    what a cluster keeps, and follows no symlink out of it."""
    home.mkdir()
    (home / "store").mkdir()
    (home / "store" / "data.db").write_text("mine")
    (home / "logs").mkdir()
    (home / "notes.txt").write_text("mine")
    refused = godel("down", "--purge")
    assert refused.returncode != 0
    assert "does not look like a godel home" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert (home / "store" / "data.db").read_text() == "mine"
    assert (home / "logs").is_dir() and (home / "notes.txt").is_file()

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    (home / ".godel-home").write_text("")  # as `godel up` marks a home
    (home / "sentinel-0").symlink_to(outside)
    (home / "store-replica-0").mkdir()
    (home / "store-replica-0" / "link").symlink_to(outside / "keep")
    (home / "store-replica-0" / "dir-link").symlink_to(outside)
    purged = godel("down", "--purge")
    assert purged.returncode == 0, purged.stderr
    assert (outside / "keep").read_text() == "keep"
    assert not (home / "store").exists() and not (home / "store-replica-0").exists()
    assert not (home / "logs").exists() and not (home / ".godel-home").exists()
    # Not the cluster's: the symlink (a cluster makes none) and the user's own file stay.
    assert (home / "sentinel-0").is_symlink() and (home / "notes.txt").is_file()
