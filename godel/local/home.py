"""``$GODEL_HOME``: where a local cluster keeps its state.

    $GODEL_HOME/
      store/              data dir of the store server (AOF, server.log, server.pid)
      store-replica-<i>/  data dirs of its replicas (`godel up --store-replicas N`)
      sentinel-<i>/       the Sentinels watching them (config, log)
      logs/<name>.log     one log per service process
      tls/                the cluster CA and certificates (foundation.tls); absent with --insecure
      pods/               process-mode pods' work dirs and logs (node agents started with it)
      cluster.json        what is running: one record per component
      .lock               held while `godel up`/`down`/`scale`/`restore` change the cluster
      .godel-home         written by `godel up`: tells `godel down --purge` this is a home

One home is one cluster; several homes are several clusters side by side.

All of it is its owner's alone (files 0600, directories 0700), whichever command wrote it: each
file is created with that mode (``foundation.privatefiles``), and while a command holds the lock
its umask — which every process it spawns inherits: services, store servers, Sentinels, and what
they write in turn — is ``PRIVATE_UMASK``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foundation import privatefiles

if TYPE_CHECKING:
    import psutil


STATE_VERSION = 1
STORE = "store"
SENTINEL = "sentinel"
MARKER = ".godel-home"
LOCK = ".lock"
# The data dirs of a replicated store's replicas and Sentinels (store.server.ReplicatedStore).
_STORE_SIDE_DIR = re.compile(r"(store-replica|sentinel)-\d+")


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
    https_on_loopback: bool = False
    """The services' metrics and the dashboard require a client certificate of the cluster
    even on loopback (HTTPS): process-mode pods run on this machine and can reach loopback."""

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
        """The home and what it already holds (from before files were created private),
        readable by its owner only (0700 / 0600)."""
        privatefiles.make_dir(self.path)
        for path in [self.path, *self.path.rglob("*")]:
            if path.is_symlink():
                continue
            mode = privatefiles.DIR_MODE if path.is_dir() else privatefiles.FILE_MODE
            path.chmod(mode)

    def mark(self) -> None:
        """Mark this directory as a godel home (what `godel down --purge` asks for)."""
        privatefiles.write(
            self.path / MARKER,
            "A godel home: `godel down --purge` removes what the cluster keeps here.\n",
        )

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive while changing the cluster, so two `godel up` on one home cannot race;
        what is written and spawned meanwhile is private (``PRIVATE_UMASK``)."""
        with privatefiles.private_umask():
            privatefiles.make_dir(self.path)
            with privatefiles.open_append(self.path / LOCK) as handle:
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
        # It holds the store's password: 0600 from the start, whatever the umask.
        privatefiles.make_dir(self.path)
        partial = self.state_file.with_suffix(".json.tmp")
        privatefiles.write(partial, json.dumps(asdict(state), indent=2) + "\n")
        partial.replace(self.state_file)

    def clear(self) -> None:
        self.state_file.unlink(missing_ok=True)

    def looks_like_home(self) -> bool:
        """Whether `godel up` made this directory (its marker), or it holds nothing but the lock
        a command took."""
        if (self.path / MARKER).is_file():
            return True
        return {entry.name for entry in self.path.iterdir()} <= {LOCK}

    def purge(self) -> list[Path]:
        """Remove everything a cluster keeps here — the store's data and its replicas', the
        Sentinels' configs, logs, pods' work, the CA and certificates, state, lock, marker —
        and the directory once empty. What else it holds is not ours and stays, and so does any
        symlink (a cluster makes none): nothing outside the home is touched. Refused (StateError)
        for a directory that does not look like a home, or while a cluster runs in it. Returns
        what was removed."""
        if not self.path.is_dir():
            return []
        if not self.looks_like_home():
            raise StateError(
                f"{self} does not look like a godel home (no {MARKER}, which `godel up` writes): "
                "not purging it"
            )
        removed: list[Path] = []
        with self.lock():
            state = self.load()
            if state is not None and any(c.process() is not None for c in state.components):
                raise StateError(f"a cluster is running in {self}: stop it with `godel down`")
            for entry in sorted(self.path.iterdir()):
                if entry.is_symlink() or not self._made_by_a_cluster(entry.name):
                    continue
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
                removed.append(entry)
        with contextlib.suppress(OSError):  # not empty: someone else's files stay
            self.path.rmdir()
            removed.append(self.path)
        return removed

    def _made_by_a_cluster(self, name: str) -> bool:
        kept = (self.store_dir, self.logs_dir, self.pods_dir, self.tls_dir, self.state_file)
        return (
            name in {path.name for path in kept}
            or name in {self.state_file.with_suffix(".json.tmp").name, LOCK, MARKER}
            or _STORE_SIDE_DIR.fullmatch(name) is not None
        )


class StateError(Exception):
    """cluster.json cannot be used, or the home cannot be purged; the message says why."""


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
