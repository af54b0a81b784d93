"""docker-compose.yml run the way `docker compose up` runs it, on a machine with no Docker engine.

Every service's ``command`` and ``environment`` are read from the file (yaml resolves the
``x-godel-service`` anchor and its ``<<`` merges) over the image's ``ENV`` lines from the
Dockerfile, and each replica of each service (``deploy.replicas``, or ``--scale``) is started as
its own process, stopped as compose stops it: SIGTERM, then SIGKILL after ``stop_grace_period``.

What stands in for what, precisely:

- **Container network → a loopback block.** Each replica gets its own address in a /24 of
  127.0.0.0/8 chosen at random per run (127.A.B.2, 127.A.B.3, …; so two runs, or a `godel up` on
  127.0.0.1, never collide) and serves on the port the file gives it, as a container does on its
  own IP. There are no network namespaces, so a wildcard bind (``GODEL_HOST: 0.0.0.0``) would
  make every replica fight for one port: it is replaced by the replica's own address, and the
  container's own loopback (``127.0.0.1`` in a healthcheck) means that address too.
- **Names → addresses.** A compose service name in a URL or ``host:port`` (``store`` in
  ``redis://store:6379/0``) is the address of that service's first replica, as Docker's DNS would
  answer. A replica's hostname is its address literal: with the wildcard bind gone, each service
  advertises its bind address, i.e. what its hostname resolves to in a container. The rule that a
  wildcard bind advertises the hostname is unit-tested in tests/test_runtime.py.
- **Published ports → a TCP proxy**, as docker-proxy is one: ``127.0.0.1:50051:50051`` listens
  on the block's 127.A.B.1 (the Docker host's loopback, moved into the block) and forwards to the
  replica.
- **The image → this checkout.** ``python`` is this interpreter with the checkout on
  PYTHONPATH (the image `pip install`s the same tree); the image's ``/home/godel`` is a directory
  per replica (each container has its own filesystem); ``valkey-server`` (run directly or
  through ``store.rejoin``) is the server binary `store.server.find_server_binary` finds, run
  with the file's arguments in a directory standing in for the store's volume.
- **Named volumes → shared directories.** A named volume is a directory of its own under the
  work dir; a path inside a container's mount of it (``/run/godel-store`` or ``/certs`` in an
  argument or an environment value) means that directory. (The store's ``/data`` is its ``--dir``, below.)
- **Users → this user.** Every container runs as the user running the test; an argument giving
  a file's owner uid (``--acl-owner``, ``--secret-owner``) therefore names this user.
- **Readiness.** ``depends_on`` is honoured in order: ``service_completed_successfully`` waits
  for the one-shot ``store-init`` to exit 0, ``service_healthy`` for the dependency's
  healthcheck (the store answers PING as the user its healthcheck names; a godel replica is
  healthy when its healthcheck command, run as the file gives it, exits 0).
- **Profiles and variables.** Services with ``profiles`` (the ``ha`` profile's replica and
  Sentinels) are not started, as compose starts none without ``--profile``; ``${VAR:-default}``
  in an environment value takes this process's ``$VAR`` or the default.
- **Not emulated:** ``restart`` policies (a replica that exits stays down, and the test fails on
  it, unless it is a one-shot that exited 0), ``init``, resource isolation, and Docker's DNS
  round-robin between replicas.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shlex
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from foundation import tls
from foundation.allocator import find_jemalloc
from services.runtime.healthcheck import probe
from store.server import find_server_binary

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
IMAGE_HOME = "/home/godel"
WILDCARDS = ("0.0.0.0", "::")
CONTAINER_LOOPBACK = "127.0.0.1"
OWNER_FLAGS = ("--acl-owner", "--secret-owner")


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict)
    return document


def image_env(dockerfile: Path = DOCKERFILE) -> dict[str, str]:
    """The ``ENV K=V ...`` lines of the Dockerfile (continuations joined), in order."""
    env: dict[str, str] = {}
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    for line in text.splitlines():
        if line.startswith("ENV "):
            for token in shlex.split(line[4:]):
                key, _, value = token.partition("=")
                env[key] = value
    return env


def seconds(duration: str) -> float:
    """A compose duration such as ``20s``, ``1m30s`` or ``500ms``."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(duration))
    assert parts, f"unsupported duration {duration!r}"
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(value) * units[unit] for value, unit in parts)


@dataclass
class Replica:
    service: str
    index: int  # 1-based, as compose numbers containers
    ip: str
    spec: dict[str, Any]
    root: Path  # the container's filesystem: its home and its volumes
    process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"{self.service}-{self.index}"

    @property
    def log(self) -> Path:
        return self.root / "output.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Deployment:
    """A running emulated `docker compose up`; :meth:`down` stops it."""

    emulator: Emulator
    published: dict[int, str]  # a published host port → its address on the emulated "host"
    proxies: list[socketserver.ThreadingTCPServer] = field(default_factory=list)

    @property
    def replicas(self) -> list[Replica]:
        return self.emulator.replicas

    def of(self, service: str) -> list[Replica]:
        return [r for r in self.replicas if r.service == service]

    def exec(self, service: str, *command: str) -> subprocess.CompletedProcess[str]:
        """`docker compose exec SERVICE COMMAND...`: in the first replica's environment and home
        (the image's `godel` script is ``python -m godel``)."""
        replica = self.of(service)[0]
        argv = ["python", "-m", "godel", *command[1:]] if command[0] == "godel" else list(command)
        return subprocess.run(
            self.emulator.argv(argv, replica),
            env=self.emulator.environment(replica),
            cwd=replica.root / "home",
            capture_output=True,
            text=True,
            timeout=120,
        )

    def exited(self) -> list[str]:
        return [
            f"{r.name} exited with {r.process.returncode}:\n{r.log_tail()}"
            for r in self.replicas
            if r.process is not None
            and r.process.poll() is not None
            and not (is_one_shot(r.spec) and r.process.returncode == 0)
        ]

    def volume(self, name: str) -> Path:
        """The directory standing in for the named volume ``name``."""
        return self.emulator.volume(name)

    def down(self) -> None:
        """Dependents first (reverse start order), the store last; each gets SIGTERM, then SIGKILL after its
        ``stop_grace_period`` (10 s when the file gives none, as compose does)."""
        for proxy in self.proxies:
            proxy.shutdown()
            proxy.server_close()
        for group in reversed(_waves(self.replicas)):
            running = [r for r in group if r.process is not None and r.process.poll() is None]
            for replica in running:
                assert replica.process is not None
                replica.process.send_signal(signal.SIGTERM)
            for replica in running:
                assert replica.process is not None
                grace = seconds(replica.spec.get("stop_grace_period", "10s"))
                try:
                    replica.process.wait(grace)
                except subprocess.TimeoutExpired:
                    replica.process.kill()
                    replica.process.wait()


class Emulator:
    """Plans and starts the replicas of a compose file inside one loopback block."""

    def __init__(
        self,
        workdir: Path,
        scale: Mapping[str, int] | None = None,
        document: dict[str, Any] | None = None,
    ) -> None:
        self.workdir = workdir
        self.document = document or load_compose()
        self.services: dict[str, dict[str, Any]] = self.document["services"]
        self.image_env = image_env()
        block = f"127.{random.randint(16, 254)}.{random.randint(0, 254)}"
        self.host_ip = f"{block}.1"  # stands in for the Docker host's 127.0.0.1
        self.replicas: list[Replica] = []
        hosts = iter(range(2, 255))
        for service, spec in self.services.items():
            if spec.get("profiles"):
                continue  # started only with `--profile`, which this emulation never passes
            count = (scale or {}).get(service, spec.get("deploy", {}).get("replicas", 1))
            for index in range(1, count + 1):
                root = workdir / f"{service}-{index}"
                self.replicas.append(Replica(service, index, f"{block}.{next(hosts)}", spec, root))
        self.dns = {r.service: r.ip for r in reversed(self.replicas)}  # first replica wins

    def volume(self, name: str) -> Path:
        path = self.workdir / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def mounts(self, replica: Replica) -> dict[str, Path]:
        """Container path → directory, for the replica's named-volume mounts (not ``/data``: the
        store's data volume is its ``--dir``)."""
        found: dict[str, Path] = {}
        for entry in replica.spec.get("volumes", []):
            name, target = str(entry).split(":")[:2]
            if target != "/data" and name in (self.document.get("volumes") or {}):
                found[target] = self.volume(name)
        return found

    def localise(self, value: str, replica: Replica) -> str:
        """A value of the file or the image as it reads inside ``replica``'s emulated container."""
        if value in WILDCARDS or value == CONTAINER_LOOPBACK:
            return replica.ip
        value = value.replace(f"{CONTAINER_LOOPBACK}:", f"{replica.ip}:")
        # A service name as the host of a URL (scheme://[user@]name:port) or of host:port.
        names = "|".join(re.escape(name) for name in self.dns)
        value = re.sub(rf"(^|//|@)({names})(?=:\d)", lambda m: m[1] + self.dns[m[2]], value)
        if value == IMAGE_HOME or value.startswith(IMAGE_HOME + "/"):
            return str(replica.root / "home") + value[len(IMAGE_HOME) :]
        for target, directory in self.mounts(replica).items():
            if value == target or value.startswith(target + "/"):
                return str(directory) + value[len(target) :]
        return value

    def argv(self, command: list[str], replica: Replica) -> list[str]:
        argv = [self.localise(str(arg), replica) for arg in command]
        for i, arg in enumerate(argv[:-1]):
            if arg in OWNER_FLAGS:
                argv[i + 1] = str(os.getuid())
        if argv[0] == "python":
            argv[0] = sys.executable
        return argv

    def environment(self, replica: Replica) -> dict[str, str]:
        # A container inherits nothing from the host: PATH, the image's ENV, then the file's.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": IMAGE_HOME}
        env.update(self.image_env)
        env.update(
            {k: interpolate(str(v)) for k, v in (replica.spec.get("environment") or {}).items()}
        )
        env = {key: self.localise(value, replica) for key, value in env.items()}
        env["PYTHONPATH"] = str(ROOT)  # the image's `pip install .` of this checkout
        if find_jemalloc() is None:
            # The image installs the allocator it preloads; a host without it would only print
            # the loader's complaint into every log.
            env.pop("LD_PRELOAD", None)
        return env

    def start(self, replica: Replica) -> None:
        home = replica.root / "home"
        home.mkdir(parents=True, exist_ok=True)
        command = list(replica.spec["command"])
        if "valkey-server" in command:  # run directly, or through store.rejoin
            data = replica.root / "data"  # the named volume mounted at /data
            data.mkdir(exist_ok=True)
            server = command.index("valkey-server")
            command[server] = find_server_binary()
            if "--dir" in command:
                command[command.index("--dir") + 1] = str(data)
            else:  # /data is the valkey image's working dir
                command += ["--dir", str(data)]
            command += ["--bind", replica.ip, "--port", "6379"]
        with replica.log.open("ab") as out:
            replica.process = subprocess.Popen(
                self.argv(command, replica),
                env=self.environment(replica),
                cwd=home,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def healthy(self, replica: Replica) -> bool:
        """The replica's healthcheck, as compose runs it (the store's `valkey-cli ping` is a
        PING sent from here: valkey-cli need not be installed)."""
        if is_one_shot(replica.spec):
            return replica.process is not None and replica.process.poll() == 0
        test = replica.spec["healthcheck"]["test"]
        assert test[0] == "CMD", test
        if test[1] == "valkey-cli":
            user, password = test[test.index("--user") + 1], test[test.index("--pass") + 1]
            with contextlib.suppress(OSError), socket.create_connection((replica.ip, 6379), 2) as s:
                s.sendall(f"AUTH {user} {password}\r\nPING\r\n".encode())
                reply = b""
                while reply.count(b"\r\n") < 2 and (chunk := s.recv(64)):
                    reply += chunk
                return reply == b"+OK\r\n+PONG\r\n"
            return False
        argv = self.argv(test[1:], replica)
        # Polling with the command would start a Python process per try (~0.5 s of CPU each,
        # on 2 shared cores): probe the same address in-process until SERVING, then run the
        # command itself once.
        if argv[1:3] == ["-m", "services.runtime.healthcheck"]:
            # With the replica's own credentials (the certs volume), as its command has them.
            credentials = tls.load(Path(self.environment(replica)["GODEL_TLS_DIR"]), tls.SERVICE)
            address = argv[argv.index("--addr") + 1]
            if probe(address, timeout=2, credentials=credentials) != "SERVING":
                return False
        timeout = seconds(replica.spec["healthcheck"].get("timeout", "30s"))
        result = subprocess.run(
            argv,
            env=self.environment(replica),
            cwd=replica.root / "home",
            capture_output=True,
            timeout=timeout + 5,
        )
        return result.returncode == 0

    def publish(
        self, replica: Replica
    ) -> tuple[dict[int, str], list[socketserver.ThreadingTCPServer]]:
        published: dict[int, str] = {}
        proxies = []
        for entry in replica.spec.get("ports", []):
            host_ip, host_port, container_port = str(entry).split(":")
            assert host_ip == CONTAINER_LOOPBACK, entry
            proxy = tcp_proxy((self.host_ip, int(host_port)), (replica.ip, int(container_port)))
            proxies.append(proxy)
            published[int(host_port)] = f"{self.host_ip}:{host_port}"
        return published, proxies


def interpolate(value: str) -> str:
    """``${VAR:-default}`` as compose resolves it from the environment it runs in."""
    return re.sub(
        r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}",
        lambda m: os.environ.get(m[1]) or m[2],
        value,
    )


def is_one_shot(spec: dict[str, Any]) -> bool:
    """A service that runs once and exits (``restart: "no"``), such as ``store-init``."""
    return str(spec.get("restart", "")) == "no"


def _waves(replicas: list[Replica]) -> list[list[Replica]]:
    """Replicas grouped so each group depends only on earlier ones."""
    waves: list[list[Replica]] = []
    placed: set[str] = set()
    remaining = list(replicas)
    while remaining:
        wave = [r for r in remaining if set(r.spec.get("depends_on") or {}) <= placed]
        assert wave, f"depends_on cycle among {[r.name for r in remaining]}"
        waves.append(wave)
        placed |= {r.service for r in wave}
        remaining = [r for r in remaining if r not in wave]
    return waves


def tcp_proxy(listen: tuple[str, int], target: tuple[str, int]) -> socketserver.ThreadingTCPServer:
    """A userland TCP forwarder, as docker-proxy publishes a container port on the host."""

    class Forward(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            try:
                upstream = socket.create_connection(target, timeout=5)
            except OSError:
                return
            upstream.settimeout(None)
            pump = threading.Thread(target=_pump, args=(upstream, self.request), daemon=True)
            pump.start()
            _pump(self.request, upstream)
            pump.join()

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    server = socketserver.ThreadingTCPServer(listen, Forward)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (sink, source):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@contextmanager
def compose_up(
    workdir: Path, scale: Mapping[str, int] | None = None, deadline: float = 180.0
) -> Iterator[Deployment]:
    """`docker compose up --scale ...` until the block exits, then `docker compose down`.
    Returns once every replica passed its healthcheck; any replica that exits fails it."""
    emulator = Emulator(workdir, scale)
    deployment = Deployment(emulator, {})
    try:
        # depends_on: a service starts once what it depends on is healthy (or, for a one-shot,
        # exited 0); the replicas of one wave start at once.
        waves = _waves(emulator.replicas)
        give_up = time.monotonic() + deadline
        for wave in waves:
            for replica in wave:
                emulator.start(replica)
                published, proxies = emulator.publish(replica)
                deployment.published.update(published)
                deployment.proxies += proxies
            waiting = list(wave)
            while waiting:
                if exited := deployment.exited():
                    raise AssertionError("\n".join(exited))
                waiting = [r for r in waiting if not emulator.healthy(r)]
                if waiting and time.monotonic() > give_up:
                    raise AssertionError(
                        "not healthy in time: "
                        + "\n".join(f"{r.name}:\n{r.log_tail()}" for r in waiting)
                    )
                if waiting:
                    time.sleep(0.5)
        yield deployment
    finally:
        deployment.down()
