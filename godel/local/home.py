"""``$GODEL_HOME``: where a local cluster keeps its state.

    $GODEL_HOME/
      store/              data dir of the store server (AOF, server.log, server.pid)
      store-replica-<i>/  data dirs of its replicas (`godel up --store-replicas N`)
      sentinel-<i>/       the Sentinels watching them (config, log)
      logs/<name>.log     one log per service process
      tls/                the cluster CA and certificates (foundation.tls); absent with --insecure
      cluster.json        what is running: one record per component
      .lock               held while `godel up`/`down` change the cluster

One home is one cluster; several homes are several clusters side by side.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psutil


STATE_VERSION = 1
STORE = "store"
SENTINEL = "sentinel"


def default_home() -> Path:
    return Path(os.environ.get("GODEL_HOME") or Path.home() / ".godel").expanduser()


@dataclass(frozen=True)
class ComponentRecord:
    """One process of the cluster as `godel up` started it."""

    name: str
    """Unique in the cluster: ``dispatcher``, ``scheduler-0``, ``store``, ..."""
    kind: str
    """``store`` (the primary and any replica), ``sentinel``, or a service package name
    (``python -m services.<kind>``)."""
    address: str
    """``host:port`` of its gRPC server (of the store: its URL)."""
    pid: int | None
    """None for a store that `godel up` did not start ($GODEL_REDIS_URL)."""
    create_time: float | None
    """The process's start time as the OS reports it: tells our pid from a later reused one."""
    command: list[str]
    log: str
    started: str
    """ISO-8601 UTC."""
    metrics_address: str = ""
    """``host:port`` of its Prometheus endpoint (``/metrics``); empty for the store."""
    web_url: str = ""
    """The dashboard's page, for the component that serves it."""

    def process(self) -> psutil.Process | None:
        """The live process this record describes, or None if it has exited."""
        # Imported here: reading the cluster's addresses (every `godel get`) needs no psutil.
        import psutil

        if self.pid is None:
            return None
        try:
            proc = psutil.Process(self.pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            if self.create_time is not None and abs(proc.create_time() - self.create_time) > 0.1:
                return None  # the pid now belongs to another process
            return proc
        except psutil.NoSuchProcess:
            return None


@dataclass
class ClusterState:
    """The content of ``cluster.json``."""

    store_url: str
    started: str
    grace_seconds: float
    """The services' shutdown grace: `godel down` waits a little longer before SIGKILL."""
    components: list[ComponentRecord] = field(default_factory=list)
    version: int = STATE_VERSION
    insecure: bool = False
    """Started with --insecure: plaintext gRPC, no authentication (clients must not use TLS)."""

    def component(self, name: str) -> ComponentRecord | None:
        return next((c for c in self.components if c.name == name), None)

    def address_of(self, kind: str) -> str:
        """The address of the first component of ``kind`` (e.g. the dispatcher for the CLI)."""
        for component in self.components:
            if component.kind == kind:
                return component.address
        raise KeyError(f"no {kind} in this cluster")


class GodelHome:
    def __init__(self, path: Path) -> None:
        self.path = path.expanduser().resolve()
        self.store_dir = self.path / "store"
        self.logs_dir = self.path / "logs"
        # Where node agents started with this home run process-mode pods (their work dir).
        self.pods_dir = self.path / "pods"
        self.state_file = self.path / "cluster.json"
        self.tls_dir = self.path / "tls"

    def __str__(self) -> str:
        return str(self.path)

    def log_file(self, component: str) -> Path:
        return self.logs_dir / f"{component}.log"

    def make_private(self) -> None:
        """The home and what it already holds, readable by its owner only (0700 / 0600)."""
        self.path.mkdir(parents=True, exist_ok=True)
        for path in [self.path, *self.path.rglob("*")]:
            if path.is_symlink():
                continue
            path.chmod(0o700 if path.is_dir() else 0o600)

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive while changing the cluster, so two `godel up` on one home cannot race."""
        self.path.mkdir(parents=True, exist_ok=True)
        with (self.path / ".lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def load(self) -> ClusterState | None:
        try:
            document: dict[str, Any] = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StateError(f"{self.state_file} is unreadable: {exc}") from exc
        if document.get("version") != STATE_VERSION:
            raise StateError(
                f"{self.state_file} has version {document.get('version')!r}, "
                f"this godel understands {STATE_VERSION}"
            )
        try:
            components = [ComponentRecord(**c) for c in document.pop("components")]
            return ClusterState(components=components, **document)
        except (KeyError, TypeError) as exc:
            raise StateError(f"{self.state_file} is malformed: {exc}") from exc

    def save(self, state: ClusterState) -> None:
        # Write-then-rename: a crash mid-write never leaves a truncated cluster.json behind.
        self.path.mkdir(parents=True, exist_ok=True)
        partial = self.state_file.with_suffix(".json.tmp")
        partial.write_text(json.dumps(asdict(state), indent=2) + "\n")
        partial.replace(self.state_file)

    def clear(self) -> None:
        self.state_file.unlink(missing_ok=True)

    def purge(self) -> list[Path]:
        """Remove what a cluster keeps here (store data, logs, pods' work, its CA and
        certificates, state, lock) and the directory once empty; what else it holds is not ours
        and stays. Returns what was removed."""
        removed: list[Path] = []
        for path in (self.store_dir, self.logs_dir, self.pods_dir, self.tls_dir):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
                removed.append(path)
        for path in (
            self.state_file,
            self.state_file.with_suffix(".json.tmp"),
            self.path / ".lock",
        ):
            if path.exists() or path.is_symlink():
                path.unlink()
                removed.append(path)
        with contextlib.suppress(OSError):  # not empty: someone else's files stay
            self.path.rmdir()
            removed.append(self.path)
        return removed


class StateError(Exception):
    """cluster.json cannot be used."""


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
