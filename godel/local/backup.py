"""`godel backup` and `godel restore` for a local cluster (the file format is store/backup.py's).

A backup reads the running cluster's store through the services' credentials; a restore needs
the server's admin, which only the home's store data dir holds, and the cluster stopped: it
starts the home's store server on its own, replaces the cluster's keys, and stops it again, so
the next `godel up` starts from the backup.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import quote

from foundation import privatefiles
from godel.local.cluster import ClusterError
from godel.local.home import GodelHome
from store import Store
from store import backup as store_backup
from store.server import ADMIN_USER, CONFIG_FILE, HOST, StoreServer, StoreServerError


def backup(url: str, path: Path, cluster: str = "default") -> store_backup.Snapshot:
    """Write a consistent snapshot of the store at ``url`` to ``path``."""

    async def take() -> store_backup.Snapshot:
        store = await Store.connect(url, cluster=cluster)
        try:
            return await store_backup.take(store)
        finally:
            await store.close()

    snapshot = asyncio.run(take())
    store_backup.write(snapshot, path)
    return snapshot


def _make_primary(config: Path) -> None:
    """Drop the ``replicaof`` that Sentinel may have written into the primary's config after a
    failover: the restore writes there, and `godel up` makes it the primary again anyway (its
    replicas then copy the restored state from it)."""
    if config.exists():
        lines = config.read_text().splitlines()
        kept = [line for line in lines if not line.startswith(("replicaof ", "slaveof "))]
        if kept != lines:
            privatefiles.write(config, "\n".join(kept) + "\n")  # it holds the admin's secret


def restore(home: GodelHome, path: Path) -> store_backup.Snapshot:
    """Bring the stopped cluster in ``home`` back to the backup at ``path``."""
    snapshot = store_backup.read(path)
    with home.lock():
        state = home.load()
        if state is not None and any(c.process() is not None for c in state.components):
            raise ClusterError(
                f"the cluster in {home} is running: stop it with `godel down` before a restore"
            )
        home.make_private()
        _make_primary(home.store_dir / CONFIG_FILE)
        try:
            server = StoreServer.start(home.store_dir)
        except StoreServerError as exc:
            raise ClusterError(f"store: {exc}") from exc
        try:
            admin_url = server.url
            if server.admin_password is not None:
                secret = quote(server.admin_password, safe="")
                admin_url = f"redis://{ADMIN_USER}:{secret}@{HOST}:{server.port}/0"
            asyncio.run(store_backup.restore(admin_url, snapshot))
        finally:
            server.stop()
    return snapshot
