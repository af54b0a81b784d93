"""Backups (store/backup.py) against real servers: a snapshot taken under concurrent writes is a
state the store really was in, restores exactly, and bad files are refused with a clear error."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from protos.godel.v1 import objects_pb2 as pb
from store import Store
from store import backup as store_backup
from store.server import StoreServer
from tests.factories import job, node, pods_of


async def _write_until(store: Store, busy: asyncio.Event, stop: asyncio.Event) -> int:
    """Create jobs with their pods (one atomic commit each) until ``stop``, setting ``busy``
    after the first 50; returns how many."""
    written = 0
    while not stop.is_set():
        j = job(f"j{written}", replicas=3)
        await store.create_unit(j, pods_of(j))
        written += 1
        if written == 50:
            busy.set()
    return written


async def test_a_snapshot_under_concurrent_commits_restores_a_state_the_store_was_in(
    store: Store, private_server: StoreServer, cluster_name: str
) -> None:
    await store.create(node("n0"))
    busy, stop = asyncio.Event(), asyncio.Event()
    writer = asyncio.create_task(_write_until(store, busy, stop))
    await busy.wait()
    snapshot = await store_backup.take(store)  # while commits keep landing
    stop.set()
    written = await writer
    assert snapshot.revision < await store.revision(), "the writes went on after the snapshot"

    restored = await Store.connect(private_server.url, cluster=cluster_name)
    try:
        assert await store_backup.restore(private_server.url, snapshot) == len(snapshot.entries)
        revision = await restored.revision()
        assert revision == snapshot.revision
        jobs, _ = await restored.list_all(pb.Job)
        pods, _ = await restored.list_all(pb.Pod)
        # Consistent: whole commits only (every job with its 3 pods), each revision once: the
        # node, then 4 objects per job — nothing after the snapshot's revision.
        assert len(pods) == 3 * len(jobs)
        assert {p.spec.job for p in pods} == {j.metadata.name for j in jobs}
        assert 1 + 4 * len(jobs) == revision
        assert 0 < len(jobs) < written
        # The change feed came back whole: a watch from 0 replays every revision, in order.
        seen: list[int] = []
        async for batch in restored.watch(0, block_ms=50):
            seen += [e.revision for e in batch.events]
            if batch.revision >= revision:
                break
        assert seen == list(range(1, revision + 1))
        # And the restored store takes writes on from there.
        extra = job("after-restore")
        first, *_ = await restored.create_unit(extra, pods_of(extra))
        assert first == revision + 1
    finally:
        await restored.close()


async def test_restore_replaces_the_cluster_and_leaves_others_alone(
    private_server: StoreServer, tmp_path: Path
) -> None:
    mine = await Store.connect(private_server.url, cluster="mine")
    other = await Store.connect(private_server.url, cluster="other")
    try:
        await mine.create(node("kept"))
        path = tmp_path / "backup.godel"
        store_backup.write(await store_backup.take(mine), path)
        assert path.stat().st_mode & 0o077 == 0
        await mine.create(node("after-backup"))
        await other.create(node("theirs"))

        await store_backup.restore(private_server.url, store_backup.read(path))
        nodes, _ = await mine.list_all(pb.Node)
        assert [n.metadata.name for n in nodes] == ["kept"]
        assert [n.metadata.name for n in (await other.list_all(pb.Node))[0]] == ["theirs"]
    finally:
        await mine.close()
        await other.close()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not a godel store backup"),
        (b"PK\x03\x04 a zip file", "not a godel store backup"),
        (store_backup.MAGIC + b"{not json\n", "malformed header"),
        (store_backup.MAGIC + b'{"cluster": "c", "revision": 1, "keys": 2}\n\x00\x00', "truncated"),
    ],
    ids=["empty", "another format", "bad header", "truncated"],
)
def test_bad_backup_files_are_refused(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad"
    path.write_bytes(content)
    with pytest.raises(store_backup.BackupError, match=message):
        store_backup.read(path)


def test_a_missing_backup_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(store_backup.BackupError, match="cannot read backup"):
        store_backup.read(tmp_path / "nope")
