"""The replicated store (store/server.py's ReplicatedStore: a primary, a replica, three
Sentinels, all real valkey processes) through the Store client: the primary found through
Sentinel, writes acknowledged only once the replica has them, and a kill -9 of the primary that
loses no acknowledged write and keeps the fencing epochs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from foundation.netutil import stable_free_port
from protos.godel.v1 import objects_pb2 as pb
from store import FencedError, ReplicationError, Store, StoreUnavailableError, redact_url
from store.client import Bind, Fence, SentinelTarget
from store.rejoin import PrimaryView, await_role, choose, resolve
from store.server import (
    ADMIN_USER,
    HOST,
    SENTINEL_SERVICE,
    STORE_SERVER_USER,
    ReplicatedStore,
    SentinelServer,
    StoreServer,
)
from tests.factories import job, node, pods_of


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[ReplicatedStore]:
    ha = ReplicatedStore.start(
        tmp_path, password="pw/with:odd@chars", fsync="everysec", replica_timeout_ms=1000
    )
    try:
        yield ha
    finally:
        ha.kill()


async def _until(condition: object, what: str, timeout: float = 60.0) -> None:
    assert callable(condition)
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def test_sentinel_urls_parse_and_redact() -> None:
    url = "redis+sentinel://godel:s%2Fecret@127.0.0.1:1,127.0.0.1:2/godel?replicas=2"
    target = SentinelTarget.parse(url)
    assert target.sentinels == [("127.0.0.1", 1), ("127.0.0.1", 2)]
    assert (target.service, target.username, target.password) == ("godel", "godel", "s/ecret")
    assert (target.replicas, target.replica_timeout_ms) == (2, 2000)
    assert redact_url(url) == url.replace("s%2Fecret", "***")
    for bad in ("redis+sentinel://h:1/", "redis+sentinel://h/godel", "redis://h:1/0"):
        with pytest.raises(ValueError):
            SentinelTarget.parse(bad)


async def _commit_until_stopped(store: Store, acknowledged: list[str], stop: asyncio.Event) -> None:
    """Submit jobs one atomic commit each, recording those the store acknowledged; errors while
    the primary is away are expected (the caller would retry)."""
    i = 0
    while not stop.is_set():
        j = job(f"j{i}", replicas=2)
        i += 1
        try:
            await store.create_unit(j, pods_of(j))
        except StoreUnavailableError:
            await asyncio.sleep(0.05)
            continue
        acknowledged.append(j.metadata.name)


async def test_kill_9_of_the_primary_loses_no_acknowledged_write_and_keeps_epochs(
    replicated: ReplicatedStore,
) -> None:
    store = await Store.connect(replicated.url, cluster="ha")
    try:
        assert store.replicas == 1
        await store.create(node("n0"))
        ok, lease = await store.acquire_lease("binder", "b0", 60_000)
        assert ok and lease.epoch == 1
        pod = pods_of(job("bound", replicas=1))[0]
        await store.create(pod)
        pod.spec.node_name = "n0"
        await store.commit([Bind(pod)], fence=Fence("binder", lease.epoch))

        acknowledged: list[str] = []
        stop = asyncio.Event()
        writer = asyncio.create_task(_commit_until_stopped(store, acknowledged, stop))
        await _until(lambda: _async_true(len(acknowledged) >= 20), "writes before the kill")
        old = replicated.primary
        old.kill()  # kill -9 under load

        async def failed_over() -> bool:
            return replicated.current_primary() not in (None, old)

        await _until(failed_over, "Sentinel to promote the replica")
        # As an operator (or a supervisor) would: start the dead server again; Sentinel turns it
        # into a replica of the new primary, so writes find a replica to wait for again.
        old.restart()
        before = len(acknowledged)
        await _until(lambda: _async_true(len(acknowledged) > before + 20), "writes after")
        stop.set()
        await writer

        jobs, _ = await store.list_all(pb.Job)
        pods, _ = await store.list_all(pb.Pod)
        names = {j.metadata.name for j in jobs}
        missing = [name for name in acknowledged if name not in names]
        assert not missing, f"acknowledged jobs lost in the failover: {missing}"
        pod_names = {p.metadata.name for p in pods}
        assert all(f"{name}-{i}" in pod_names for name in acknowledged for i in range(2))
        # The binding and the fencing epoch survived: the same epoch still commits, a new holder
        # (after the lease is released) gets the next epoch, and the old one is fenced off.
        assert (await store.get(pb.Pod, "bound-0")).spec.node_name == "n0"
        assert (await store.get_lease("binder")).epoch == 1  # type: ignore[union-attr]
        assert await store.release_lease("binder", "b0", 1)
        ok, lease = await store.acquire_lease("binder", "b1", 60_000)
        assert ok and lease.epoch == 2
        late = await store.create(pods_of(job("late"))[0])
        late.spec.node_name = "n0"
        with pytest.raises(FencedError):
            await store.commit([Bind(late)], fence=Fence("binder", 1))
    finally:
        await store.close()


async def _async_true(value: bool) -> bool:
    return value


async def test_a_write_no_replica_confirms_fails_with_a_clear_error(
    replicated: ReplicatedStore,
) -> None:
    store = await Store.connect(replicated.url, cluster="ha")
    try:
        await store.create(node("n0"))
        replica: StoreServer = replicated.replicas[0]
        replica.kill()
        with pytest.raises(ReplicationError, match="0 of 1 replica"):
            await store.create(node("n1"))
        with pytest.raises(ReplicationError):
            await store.acquire_lease("binder", "b0", 5000)
        # A retry that finds its write there cannot report it stored until a replica has it.
        with pytest.raises(ReplicationError):
            await store.replication_barrier()
        # Not acknowledged is not undone: like a lost reply, the write may be there.
        replica.restart()
        attempts = iter(range(1_000_000))

        async def writable() -> bool:
            try:
                await store.create(node(f"again-{next(attempts)}"))
            except ReplicationError:
                return False
            return True

        await _until(writable, "the replica to catch up")
        await store.replication_barrier()  # the replica has everything now
    finally:
        await store.close()


async def test_a_primary_killed_and_started_at_once_rejoins_as_a_replica_and_loses_nothing(
    replicated: ReplicatedStore,
) -> None:
    """kill -9 of the primary and a start again at once, as a supervisor does: the server waits
    for the Sentinels' failover and comes back as the new primary's replica (not as a second
    primary, which Sentinel would demote only after its own wait of 8-10 s while no write could
    be acknowledged), writes go on, and no acknowledged write is lost."""
    store = await Store.connect(replicated.url, cluster="ha")
    try:
        acknowledged: list[str] = []
        stop = asyncio.Event()
        writer = asyncio.create_task(_commit_until_stopped(store, acknowledged, stop))
        await _until(lambda: _async_true(len(acknowledged) >= 20), "writes before the kill")
        old = replicated.primary
        old.kill()
        await asyncio.to_thread(old.restart, 60.0)  # returns once the server serves

        promoted = replicated.current_primary()
        assert promoted is not None and promoted is not old, "the Sentinels promoted the replica"
        client = redis.Redis(
            port=old.port, username=ADMIN_USER, password=old.admin_password, socket_timeout=5
        )
        try:
            replication = client.info("replication")
        finally:
            client.close()
        assert (replication["role"], replication["master_port"]) == ("slave", promoted.port)

        before = len(acknowledged)
        await _until(lambda: _async_true(len(acknowledged) > before + 20), "writes after")
        stop.set()
        await writer
        jobs, _ = await store.list_all(pb.Job)
        pods, _ = await store.list_all(pb.Pod)
        names = {j.metadata.name for j in jobs}
        missing = [name for name in acknowledged if name not in names]
        assert not missing, f"acknowledged jobs lost in the failover: {missing}"
        pod_names = {p.metadata.name for p in pods}
        assert all(f"{name}-{i}" in pod_names for name in acknowledged for i in range(2))
    finally:
        await store.close()


def _view(port: int, epoch: int = 0, flags: str = "master") -> PrimaryView:
    return PrimaryView(HOST, port, epoch, frozenset(flags.split(",")), 1000, 3000)


ME = (HOST, 7000)


# The command a compose replica starts with: as configured, its primary is `store`.
COMMAND = ["valkey-server", "server.conf", "--replicaof", "store", "6379", "--save", ""]


@pytest.mark.parametrize(
    ("views", "command"),
    [
        pytest.param([], COMMAND, id="no Sentinel answers: as configured"),
        pytest.param(
            [_view(7001)] * 3,
            ["valkey-server", "server.conf", "--save", "", "--replicaof", HOST, "7001"],
            id="another is the primary: its replica",
        ),
        pytest.param(
            [_view(7000), _view(7001, epoch=1), _view(7000)],
            ["valkey-server", "server.conf", "--save", "", "--replicaof", HOST, "7001"],
            id="the newest configuration wins",
        ),
        pytest.param(
            [_view(7000)] * 3,
            ["valkey-server", "server.conf", "--save", ""],
            id="named and seen well: the primary, whatever the command said",
        ),
        pytest.param(
            [_view(7000, flags="master,disconnected"), _view(7000)], None, id="link lost: wait"
        ),
        pytest.param([_view(7000, flags="master,s_down")], None, id="deemed down: wait"),
        pytest.param(
            [_view(7000, flags="master,s_down,o_down,failover_in_progress")],
            None,
            id="failing over: wait",
        ),
    ],
)
def test_a_starting_server_takes_the_role_the_sentinels_give(
    views: list[PrimaryView], command: list[str] | None
) -> None:
    role = choose(views, ME)
    if command is None:
        assert role is None
    else:
        assert role is not None and role.server_command(COMMAND) == command


def test_sentinels_named_by_a_name_are_asked_at_every_address_it_has() -> None:
    """Compose's Sentinels are three replicas of one service, `sentinel`: its name resolves to
    each one's address, and each is asked; a name that resolves nowhere (a project without the
    `ha` profile) is no Sentinel."""
    addresses = resolve([("localhost", 26379), ("127.0.0.1", 26380)])
    assert ("127.0.0.1", 26379) in addresses and addresses[-1] == ("127.0.0.1", 26380)
    assert {port for _, port in addresses[:-1]} == {26379}, "each of localhost's addresses"
    assert len(addresses) == len(set(addresses)), "an address asked once"
    assert resolve([("no-such-sentinel.invalid", 26379)]) == []


@pytest.fixture
def lone_sentinel(tmp_path: Path) -> Iterator[tuple[SentinelServer, int]]:
    """A Sentinel watching a primary that is not running (a port nothing serves)."""
    dead_port = stable_free_port(HOST)
    sentinel = SentinelServer.start(
        tmp_path / "sentinel",
        primary_port=dead_port,
        password="service-pw",
        admin_password="admin-pw",
        quorum=1,
        down_after_ms=100,
        failover_timeout_ms=100,
    )
    try:
        yield sentinel, dead_port
    finally:
        sentinel.kill()


def test_a_server_the_sentinels_cannot_replace_starts_as_the_primary_after_a_failover_time(
    lone_sentinel: tuple[SentinelServer, int],
) -> None:
    """No replica to promote (both servers died): once a failover's time has passed, the
    primary the Sentinels name starts as the primary rather than waiting for ever."""
    sentinel, dead_port = lone_sentinel
    role = await_role([(HOST, sentinel.port)], "admin-pw", (HOST, dead_port))
    assert role.replica_of is None
    assert "no failover within 0.4s" in role.reason


def test_the_servers_login_to_the_sentinels_may_only_ask_where_the_primary_is(
    lone_sentinel: tuple[SentinelServer, int],
) -> None:
    sentinel, _ = lone_sentinel
    client = redis.Redis(port=sentinel.port, username=STORE_SERVER_USER, password="admin-pw")
    try:
        assert client.sentinel_master(SENTINEL_SERVICE, return_responses=True)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.sentinel_failover(SENTINEL_SERVICE)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.sentinel_set(SENTINEL_SERVICE, "down-after-milliseconds", 1)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.sentinel_remove(SENTINEL_SERVICE)
    finally:
        client.close()
