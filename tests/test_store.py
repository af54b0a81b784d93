"""The store contract (ARCHITECTURE §4) against a real server: CRUD, compare-and-set, atomic
commits, node accounting, fencing and malformed input."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from protos.godel.v1 import objects_pb2 as pb
from store import (
    AlreadyBoundError,
    AlreadyExistsError,
    CommitError,
    ConflictError,
    FencedError,
    InsufficientCapacityError,
    InvalidObjectError,
    NotFoundError,
    ObjectTooLargeError,
    Store,
)
from store.client import Bind, Create, Delete, Fence, Release, Update
from store.lease import holder_name, incarnation
from tests.factories import gpu_job, gpu_node, job, node, pods_of


async def snapshot(store: Store) -> tuple[int, int, dict[str, list[Any]]]:
    """Everything observable about a cluster's state, to prove a failed write changed nothing."""
    listing = await store.list_kinds(["Job", "Pod", "Node", "Queue"])
    items = {k: sorted(o.SerializeToString() for o in v) for k, v in listing.items.items()}
    feed_len = await store._redis.xlen(store.keys.feed)
    return listing.revision, feed_len, items


# ---------------------------------------------------------------------------------------------
# CRUD and compare-and-set
# ---------------------------------------------------------------------------------------------


async def test_create_get_list_update_delete(store: Store) -> None:
    n = await store.create(node("n1"))
    assert n.metadata.resource_version == 1
    assert n.metadata.uid and n.metadata.creation_timestamp_ms > 0

    got = await store.get(pb.Node, "n1")
    assert got == n

    got.spec.unschedulable = True
    await store.update(got)
    assert got.metadata.resource_version == 2
    items, rev = await store.list_all(pb.Node)
    assert [i.spec.unschedulable for i in items] == [True] and rev == 2

    assert await store.delete(pb.Node, "n1", expected_version=2) == 3
    with pytest.raises(NotFoundError):
        await store.get(pb.Node, "n1")
    assert await store.get_many(pb.Node, ["n1"]) == [None]


async def test_create_twice_is_already_exists(store: Store) -> None:
    await store.create(node("n1"))
    with pytest.raises(AlreadyExistsError):
        await store.create(node("n1"))


async def test_stale_update_conflicts_and_changes_nothing(store: Store) -> None:
    first = await store.create(node("n1"))
    stale = pb.Node()
    stale.CopyFrom(first)
    first.spec.unschedulable = True
    await store.update(first)
    before = await snapshot(store)
    stale.status.allocatable.milli_cpu = 1
    with pytest.raises(ConflictError) as err:
        await store.update(stale)
    assert (err.value.expected, err.value.actual) == (1, 2)
    assert await snapshot(store) == before


async def test_stale_delete_conflicts(store: Store) -> None:
    n = await store.create(node("n1"))
    await store.update(n)
    with pytest.raises(ConflictError):
        await store.delete(pb.Node, "n1", expected_version=1)
    assert (await store.get(pb.Node, "n1")).metadata.resource_version == 2


async def test_concurrent_cas_writers_exactly_one_wins_per_version(
    store_url: str, cluster_name: str
) -> None:
    writers = [await Store.connect(store_url, cluster=cluster_name) for _ in range(8)]
    try:
        await writers[0].create(node("hot"))
        wins: list[int] = []
        for _round in range(5):
            current = await writers[0].get(pb.Node, "hot")

            async def attempt(i: int, s: Store, base: pb.Node = current) -> int | None:
                mine = pb.Node()
                mine.CopyFrom(base)
                mine.metadata.labels["writer"] = str(i)
                try:
                    await s.update(mine)
                    return base.metadata.resource_version
                except ConflictError:
                    return None

            results = await asyncio.gather(*(attempt(i, s) for i, s in enumerate(writers)))
            winners = [r for r in results if r is not None]
            assert len(winners) == 1, results
            wins.extend(winners)
        assert len(set(wins)) == len(wins)
    finally:
        for s in writers:
            await s.close()


async def test_pipelined_updates_report_each_result(store: Store) -> None:
    nodes = [await store.create(node(f"n{i}")) for i in range(4)]
    nodes[2].metadata.resource_version = 99  # stale on purpose; a rejected write takes no revision
    results = await store.update_many(nodes)
    assert [type(r).__name__ for r in results] == ["Node", "Node", "ConflictError", "Node"]
    assert [
        n.metadata.resource_version for n in await store.get_many(pb.Node, ["n0", "n1", "n2", "n3"])
    ] == [5, 6, 3, 7]  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------
# Atomic commits: a commit that fails one check writes nothing
# ---------------------------------------------------------------------------------------------


async def test_unit_commit_is_all_or_nothing(store: Store) -> None:
    j = job("train", replicas=5)
    pods = pods_of(j)
    await store.create(pods[3])
    before = await snapshot(store)
    with pytest.raises(CommitError) as err:
        await store.create_unit(j, pods)
    assert err.value.index == 4 and isinstance(err.value.cause, AlreadyExistsError)
    assert await snapshot(store) == before


async def _bound_setup(store: Store) -> tuple[Fence, list[pb.Pod]]:
    await store.create(node("n1", cpu=1000, pods=10))
    j = job("web", replicas=3, cpu=400)
    pods = pods_of(j)
    await store.create_unit(j, pods)
    _, lease = await store.acquire_lease("binder", "b1", 10_000)
    return Fence("binder", lease.epoch), pods


def _on(pods: list[pb.Pod], node_name: str) -> list[pb.Pod]:
    for p in pods:
        p.spec.node_name = node_name
        p.status.phase = pb.POD_BOUND
    return pods


FAILING_COMMITS: list[
    tuple[str, Callable[[list[pb.Pod], Fence], tuple[list[Any], Fence]], type]
] = [
    # name, build(pods, fence) -> (ops, fence), expected cause
    (
        "over-commits cpu",
        lambda p, f: ([Bind(x) for x in _on(p, "n1")], f),
        InsufficientCapacityError,
    ),
    ("unknown node", lambda p, f: ([Bind(x) for x in _on(p[:1], "nope")], f), NotFoundError),
    (
        "stale pod version",
        lambda p, f: ([Bind(_on(p[:1], "n1")[0]), Update(_stale(p[1]))], f),
        ConflictError,
    ),
    (
        "missing object",
        lambda p, f: ([Bind(_on(p[:1], "n1")[0]), Delete("Pod", "ghost")], f),
        NotFoundError,
    ),
    (
        "same object twice",
        lambda p, f: ([Bind(_on(p[:1], "n1")[0]), Update(p[0])], f),
        InvalidObjectError,
    ),
    (
        "existing object",
        lambda p, f: ([Bind(_on(p[:1], "n1")[0]), Create(job("web"))], f),
        AlreadyExistsError,
    ),
]


def _stale(p: pb.Pod) -> pb.Pod:
    q = pb.Pod()
    q.CopyFrom(p)
    q.metadata.resource_version -= 1
    return q


@pytest.mark.parametrize(
    ("name", "build", "cause"), FAILING_COMMITS, ids=[c[0] for c in FAILING_COMMITS]
)
async def test_failed_commit_writes_nothing(
    store: Store, name: str, build: Callable[..., Any], cause: type
) -> None:
    fence, pods = await _bound_setup(store)
    before = await snapshot(store)
    usage_before = await store.node_usage("n1")
    ops, f = build(pods, fence)
    with pytest.raises(CommitError) as err:
        await store.commit(ops, fence=f)
    assert isinstance(err.value.cause, cause), err.value
    assert await snapshot(store) == before
    assert await store.node_usage("n1") == usage_before
    assert await store.claims() == {}


async def test_bind_accounts_and_release_returns(store: Store) -> None:
    fence, pods = await _bound_setup(store)
    await store.bind(_on(pods[:2], "n1"), fence=fence)
    usage = await store.node_usage("n1")
    assert usage is not None and usage.used["g.cpu"] == 800 and usage.used["pods"] == 2
    # Binding an already-bound pod again is refused (a pod binds once).
    with pytest.raises(CommitError) as err:
        await store.bind(pods[:1], fence=fence)
    assert isinstance(err.value.cause, AlreadyBoundError)
    # A finished pod returns its claim; deleting a bound pod does too.
    pods[0].status.phase = pb.POD_SUCCEEDED
    await store.commit([Release(pods[0])])
    await store.delete(pb.Pod, pods[1].metadata.name)
    usage = await store.node_usage("n1")
    assert usage is not None and usage.used["g.cpu"] == 0 and usage.used["pods"] == 0
    assert await store.claims() == {}


async def test_release_frees_room_for_a_bind_later_in_the_same_commit(store: Store) -> None:
    """An eviction and its preemptor's bind commit together: the released claim is room for
    the bind after it, and the node is never counted with both (nor with neither)."""
    fence, pods = await _bound_setup(store)  # n1: 1000m; pods of 400m
    bound = await store.bind(_on(pods[:2], "n1"), fence=fence)
    victim = (await store.get_many(pb.Pod, [pods[0].metadata.name]))[0]
    assert victim is not None and bound
    victim.status.phase = pb.POD_FAILED
    # A bind before the release does not see the room; after it, it does.
    with pytest.raises(CommitError) as err:
        await store.commit([Bind(_on(pods[2:], "n1")[0]), Release(victim)], fence=fence)
    assert isinstance(err.value.cause, InsufficientCapacityError)
    await store.commit([Release(victim), Bind(pods[2])], fence=fence)
    usage = await store.node_usage("n1")
    assert usage is not None and usage.used["g.cpu"] == 800 and usage.used["pods"] == 2
    assert sorted(await store.claims()) == [pods[1].metadata.name, pods[2].metadata.name]


_Fixed = TypeVar("_Fixed", pb.Node, pb.Job, pb.Pod)


def _one_call_commits() -> list[tuple[list[Any], type | None]]:
    """Commits whose checks depend on earlier commits of the same call, each with the outcome
    it gets when the commits are applied one by one (None: applied). The versions they expect
    are those the commits before them give, from a new cluster's revision 0."""

    def fixed(obj: _Fixed) -> _Fixed:
        obj.metadata.uid = f"uid-{obj.metadata.name}"  # the same objects in both clusters
        obj.metadata.creation_timestamp_ms = 1
        return obj

    def pod(i: int, rv: int, node_name: str = "", phase: Any = pb.POD_PENDING) -> pb.Pod:
        p = fixed(pods_of(job("j1", replicas=6, cpu=400))[i])
        p.metadata.resource_version = rv
        p.spec.node_name = node_name
        p.status.phase = phase
        return p

    def running_job() -> pb.Job:
        j = fixed(job("j1", replicas=6, cpu=400))
        j.status.phase = pb.JOB_RUNNING
        return j

    return [
        ([Create(fixed(node("n1", cpu=1000, pods=3)))], None),  # rev 1
        (
            [Create(fixed(job("j1", replicas=6, cpu=400))), *(Create(pod(i, 0)) for i in range(6))],
            None,
        ),  # j1: 2, j1-0..j1-5: 3..8
        ([Bind(pod(0, 3, "n1"))], None),  # 9
        ([Bind(pod(0, 9, "n1"))], AlreadyBoundError),
        ([Bind(pod(1, 4, "n1"))], None),  # 10
        ([Bind(pod(2, 5, "n1"))], InsufficientCapacityError),  # 400m over 800m of 1000m
        ([Release(pod(0, 9, "n1", pb.POD_SUCCEEDED)), Bind(pod(2, 5, "n1"))], None),  # 11, 12
        ([Update(pod(3, 5))], ConflictError),
        ([Create(pod(1, 0))], AlreadyExistsError),
        ([Delete("Pod", "j1-1", expected_version=10)], None),  # 13: its claim returns
        ([Bind(pod(3, 6, "n2"))], NotFoundError),  # no node n2
        ([Create(fixed(node("n2"))), Bind(pod(3, 6, "n2"))], NotFoundError),  # not before it
        ([Create(fixed(node("n2")))], None),  # 14
        ([Bind(pod(3, 6, "n2"))], None),  # 15
        ([Bind(pod(4, 7, "n1"))], None),  # 16: j1-1's room
        ([Bind(pod(5, 8, "n1"))], InsufficientCapacityError),  # j1-0 released: cpu full again
        ([Delete("Node", "n1", expected_version=1)], None),  # 17: its capacity goes
        ([Bind(pod(5, 8, "n1"))], NotFoundError),
        (
            [Update(running_job(), force=True), Update(running_job(), force=True)],
            InvalidObjectError,
        ),  # the same object twice in one commit
        ([Delete("Pod", "nobody")], NotFoundError),
        ([Update(pod(3, 15, "n2", pb.POD_RUNNING))], None),  # 18
        ([Create(fixed(node("n3")))], None),  # 19
        ([Delete("Node", "n3", expected_version=19)], None),  # 20: created in this call
    ]


async def _everything(store: Store) -> dict[str, Any]:
    """Every key of a cluster, read raw: objects, versions, the feed, accounting and claims."""
    r, keys = store._redis, store.keys
    state: dict[str, Any] = {
        "revision": await r.get(keys.revision),
        "feed": await r.xrange(keys.feed),
        "acct": await r.hgetall(keys.accounting),
        "claims": await r.hgetall(keys.claims),
    }
    for kind in ("Node", "Job", "Pod"):
        state[kind] = (await r.hgetall(keys.data(kind)), await r.hgetall(keys.versions(kind)))
    return state


async def test_commits_of_one_call_see_each_other_as_if_applied_one_by_one(
    store_url: str, cluster_name: str
) -> None:
    """One script call checks each commit against the writes of the commits before it in the
    call (it writes the server's hashes once, at its end): the stored state, the feed and every
    commit's outcome are those of the same commits sent one call each."""
    one_call = await Store.connect(store_url, cluster=f"{cluster_name}-a")
    one_by_one = await Store.connect(store_url, cluster=f"{cluster_name}-b")
    try:
        table = _one_call_commits()
        together = await one_call.commit_many([ops for ops, _ in _one_call_commits()])
        apart = [(await one_by_one.commit_many([ops]))[0] for ops, _ in table]
        for i, ((_, expected), a, b) in enumerate(zip(table, together, apart, strict=True)):
            if expected is None:
                assert a == b and not isinstance(b, Exception), (i, a, b)
            else:
                assert isinstance(a, CommitError) and isinstance(a.cause, expected), (i, a)
                assert isinstance(b, CommitError) and str(a) == str(b), (i, a, b)
        state = await _everything(one_call)
        assert state == await _everything(one_by_one)
        assert int(state["revision"]) == 20 and len(state["feed"]) == 20
        assert [e[0] for e in state["feed"]] == [f"{r}-0".encode() for r in range(1, 21)]
        deleted = state["feed"][12][1]  # j1-1 deleted: the entry carries its last bytes
        assert deleted[b"t"] == b"D" and deleted[b"d"] == state["feed"][9][1][b"d"]
        node_deleted = state["feed"][19][1]  # n3, created and deleted in the call
        assert node_deleted[b"t"] == b"D" and node_deleted[b"d"] == state["feed"][18][1][b"d"]
        usage = await one_call.node_usage("n2")
        assert usage is not None and usage.used["pods"] == 1 and usage.used["g.cpu"] == 400
        assert await one_call.node_usage("n1") is None and await one_call.node_usage("n3") is None
        assert sorted(await one_call.claims()) == ["j1-2", "j1-3", "j1-4"]
    finally:
        await one_call.close()
        await one_by_one.close()


async def test_best_effort_pods_use_the_reclaimable_pool(store: Store) -> None:
    await store.create(node("n1", cpu=1000, be_cpu=500, be_mem=8 << 30))
    j = job("batch", replicas=2, cpu=300, qos=pb.QOS_BEST_EFFORT)
    pods = pods_of(j)
    await store.create_unit(j, pods)
    _, lease = await store.acquire_lease("binder", "b1", 10_000)
    fence = Fence("binder", lease.epoch)
    await store.bind(_on(pods[:1], "n1"), fence=fence)
    with pytest.raises(CommitError) as err:  # 600m > 500m reclaimable, despite 1000m guaranteed
        await store.bind(_on(pods[1:], "n1"), fence=fence)
    assert isinstance(err.value.cause, InsufficientCapacityError)
    assert err.value.cause.pool == "be"
    usage = await store.node_usage("n1")
    assert usage is not None and usage.used["be.cpu"] == 300 and usage.used["g.cpu"] == 0


async def test_gpu_shares_are_claimed_in_milli_gpu(store: Store) -> None:
    """Shares of one card claim their milli-GPU, not a whole card each: 600 and 400 fill the
    node's one card; one milli more is refused."""
    await store.create(gpu_node("n1", 1))
    jobs = [gpu_job(job(name), milli=m) for name, m in (("a", 600), ("b", 400), ("c", 1))]
    pods = []
    for j in jobs:
        pods += pods_of(j)
        await store.create_unit(j, pods[-1:])
    _, lease = await store.acquire_lease("binder", "b1", 10_000)
    fence = Fence("binder", lease.epoch)
    await store.bind(_on(pods[:2], "n1"), fence=fence)
    with pytest.raises(CommitError) as err:
        await store.bind(_on(pods[2:], "n1"), fence=fence)
    assert isinstance(err.value.cause, InsufficientCapacityError)
    usage = await store.node_usage("n1")
    assert usage is not None and (usage.capacity["g.gpu"], usage.used["g.gpu"]) == (1000, 1000)


# ---------------------------------------------------------------------------------------------
# Node heartbeats
# ---------------------------------------------------------------------------------------------


async def test_heartbeats_stamp_existing_nodes_outside_the_feed(store: Store) -> None:
    names = [f"n{i}" for i in range(1200)]  # more than one HSET chunk in the script
    await store.create_many([node(n) for n in names])
    before = await snapshot(store)
    missing = await store.record_heartbeats([*names, "ghost", "n5"])
    assert missing == ["ghost"]
    beats = await store.heartbeats()
    assert set(beats.last_ms) == set(names)
    assert all(0 < ms <= beats.now_ms for ms in beats.last_ms.values())
    # No object, revision or feed entry changed: watchers are not woken by heartbeats.
    assert await snapshot(store) == before

    await asyncio.sleep(0.01)
    await store.record_heartbeats(["n1"])
    again = await store.heartbeats()
    assert again.last_ms["n1"] > beats.last_ms["n1"]
    assert again.last_ms["n2"] == beats.last_ms["n2"]

    await store.forget_heartbeats(names[:1100])
    assert set((await store.heartbeats()).last_ms) == set(names[1100:])
    # A deleted node is missing from then on: its stamp is not renewed.
    await store.delete(pb.Node, "n1150")
    stamped = (await store.heartbeats()).last_ms["n1150"]
    assert await store.record_heartbeats(["n1149", "n1150"]) == ["n1150"]
    assert (await store.heartbeats()).last_ms["n1150"] == stamped
    assert await store.record_heartbeats([]) == []
    await store.forget_heartbeats([])


# ---------------------------------------------------------------------------------------------
# Leases and fencing
# ---------------------------------------------------------------------------------------------


async def test_lease_failover_rejects_the_old_epoch(store: Store) -> None:
    ok, a = await store.acquire_lease("binder", "a", 300, "a:1")
    assert ok and a.epoch == 1
    ok, seen = await store.acquire_lease("binder", "b", 300)
    assert not ok and seen.holder == "a"
    await asyncio.sleep(0.4)  # "a" stops renewing; its lease lapses
    ok, b = await store.acquire_lease("binder", "b", 10_000, "b:1")
    assert ok and b.epoch == 2 and b.holder == "b"
    ok, _ = await store.renew_lease("binder", "a", 1, 300)
    assert not ok

    before = await snapshot(store)
    with pytest.raises(FencedError) as err:
        await store.commit([Create(node("n1"))], fence=Fence("binder", a.epoch))
    assert (err.value.epoch, err.value.current) == (1, 2)
    assert await snapshot(store) == before
    await store.commit([Create(node("n1"))], fence=Fence("binder", b.epoch))


async def test_a_holder_asking_again_keeps_its_epoch_and_gets_its_new_address(
    store: Store,
) -> None:
    """The same holder acquiring a lease it holds (its renewal's reply lost) is a renewal: the
    epoch stays, and the address it gives now is the one published (it was the first one)."""
    ok, first = await store.acquire_lease("binder", "a", 10_000, "10.0.0.1:1")
    assert ok and first.holder_address == "10.0.0.1:1"
    ok, again = await store.acquire_lease("binder", "a", 10_000, "10.0.0.2:2")
    assert ok and again.epoch == first.epoch and again.holder_address == "10.0.0.2:2"
    observed = await store.get_lease("binder")
    assert observed is not None and observed.holder_address == "10.0.0.2:2"


def test_incarnations_of_one_name_are_different_holders_of_that_name() -> None:
    one, other = incarnation("binder-0"), incarnation("binder-0")
    assert one != other
    assert holder_name(one) == holder_name(other) == "binder-0"
    assert holder_name("binder-0") == "binder-0"  # a holder id without a token


async def test_expired_lease_fences_even_its_own_holder(store: Store) -> None:
    _, a = await store.acquire_lease("binder", "a", 200)
    await asyncio.sleep(0.3)
    with pytest.raises(FencedError):
        await store.commit([Create(node("n1"))], fence=Fence("binder", a.epoch))


async def test_released_lease_is_free_and_epochs_only_grow(store: Store) -> None:
    _, a = await store.acquire_lease("binder", "a", 10_000)
    assert await store.release_lease("binder", "a", a.epoch)
    observed = await store.get_lease("binder")
    assert observed is not None and observed.holder == "" and observed.epoch == 1
    ok, again = await store.acquire_lease("binder", "a", 10_000)
    assert ok and again.epoch == 2
    assert await store.get_lease("nobody") is None


async def test_leader_elector_failover(store_url: str, cluster_name: str) -> None:
    from store.lease import LeaderElector

    stores = [await Store.connect(store_url, cluster=cluster_name) for _ in range(2)]
    electors = [
        LeaderElector(s, "binder", f"b{i}", lease_ms=400, renew_every_ms=100, retry_every_ms=50)
        for i, s in enumerate(stores)
    ]
    try:
        electors[0].start()
        await asyncio.wait_for(electors[0].elected.wait(), 5)
        electors[1].start()
        await asyncio.sleep(0.5)
        assert not electors[1].is_leader  # the holder keeps renewing
        old = electors[0].fence
        assert old is not None
        await electors[0].stop(release=False)  # a crash: no release, the lease must lapse
        await asyncio.wait_for(electors[1].elected.wait(), 5)
        new = electors[1].fence
        assert new is not None and new.epoch > old.epoch
        with pytest.raises(FencedError):
            await stores[0].commit([Create(node("n1"))], fence=old)
    finally:
        for e in electors:
            await e.stop()
        for s in stores:
            await s.close()


async def test_a_lease_kept_on_its_own_thread_outlives_a_blocked_event_loop(
    store_url: str, cluster_name: str
) -> None:
    """The owner's event loop blocked for three lease durations (a Binder deciding a huge
    batch): a LeaseKeeper renews from its own thread and keeps the lease (a standby campaigning
    meanwhile never gets it); the same block costs a plain LeaderElector in that loop its lease.
    Callbacks reach the owner's loop in order; a stop releases the lease for the standby."""
    from store.lease import LeaseKeeper, Leases
    from store.metrics import LEASE_RENEWAL_LATENESS_MAX

    lease_ms, renew_ms = 600, 100
    seen: list[tuple[str, int, bool]] = []
    owner = asyncio.get_running_loop()

    async def elected(fence: Fence) -> None:
        seen.append(("elected", fence.epoch, asyncio.get_running_loop() is owner))

    async def deposed(fence: Fence) -> None:
        seen.append(("deposed", fence.epoch, asyncio.get_running_loop() is owner))

    keeper = LeaseKeeper(
        lambda: Leases.connect(store_url, cluster=cluster_name),
        "kept",
        "keeper",
        lease_ms=lease_ms,
        renew_every_ms=renew_ms,
        retry_every_ms=50,
        on_elected=elected,
        on_deposed=deposed,
    )
    standby_store = await Store.connect(store_url, cluster=cluster_name)
    standby = _Standby(store_url, cluster_name, "kept", lease_ms)
    running = asyncio.create_task(keeper.run())
    try:
        await wait_for(lambda: keeper.fence is not None, what="the keeper elected")
        held = keeper.fence
        assert held is not None
        standby.start()  # campaigns from its own thread while our loop is blocked
        time.sleep(3 * lease_ms / 1000)  # noqa: ASYNC251  # the owner's loop blocked: the point
        assert not standby.join(), "the standby took the lease from a busy owner"
        assert keeper.fence == held
        lease = await standby_store.get_lease("kept")
        assert lease is not None and lease.holder == "keeper" and lease.epoch == held.epoch
        await wait_for(lambda: seen == [("elected", held.epoch, True)], what="elected callback")
        assert keeper.max_lateness_s < lease_ms / 1000
        assert LEASE_RENEWAL_LATENESS_MAX.labels("kept")._value.get() == keeper.max_lateness_s

        await keeper.step_down("fenced elsewhere")
        await wait_for(lambda: ("deposed", held.epoch, True) in seen, what="deposed callback")
        # Campaigning afresh, it takes the lease back (its own: the same epoch).
        await wait_for(lambda: keeper.fence is not None, what="re-elected")
        again = keeper.fence
        assert again is not None and again.epoch >= held.epoch
        await wait_for(lambda: seen[-1][0] == "elected", what="the second elected callback")
        await keeper.stop()  # releases: the standby may take it at once
        ok, taken = await standby_store.acquire_lease("kept", "standby", lease_ms)
        assert ok and taken.epoch > again.epoch
        await running
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await standby_store.close()


async def test_a_plain_elector_in_a_blocked_loop_loses_its_lease(
    store_url: str, cluster_name: str
) -> None:
    """The control of the test above: renewals in the owner's own loop wait behind its work,
    and the standby takes the lease."""
    from store.lease import LeaderElector

    lease_ms = 600
    owner_store = await Store.connect(store_url, cluster=cluster_name)
    owner = LeaderElector(owner_store, "plain", "owner", lease_ms=lease_ms, renew_every_ms=100)
    standby = _Standby(store_url, cluster_name, "plain", lease_ms)
    try:
        owner.start()
        await asyncio.wait_for(owner.elected.wait(), 5)
        standby.start()
        time.sleep(3 * lease_ms / 1000)  # noqa: ASYNC251  # the owner's loop blocked: the point
        assert standby.join(), "the standby should have taken the lapsed lease"
    finally:
        await owner.stop(release=False)
        await owner_store.close()


class _Standby:
    """A LeaderElector campaigning from a thread and loop of its own for two seconds (while the
    test blocks its own loop); ``join`` says whether it ended up leading."""

    def __init__(self, url: str, cluster: str, lease: str, lease_ms: int) -> None:
        self._args = (url, cluster, lease, lease_ms)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._campaign()))
        self.leading = False

    def start(self) -> None:
        self._thread.start()

    def join(self) -> bool:
        self._thread.join()
        return self.leading

    async def _campaign(self) -> None:
        from store.lease import LeaderElector

        url, cluster, lease, lease_ms = self._args
        store = await Store.connect(url, cluster=cluster)
        elector = LeaderElector(
            store, lease, "standby", lease_ms=lease_ms, renew_every_ms=100, retry_every_ms=50
        )
        elector.start()
        await asyncio.sleep(2)
        self.leading = elector.is_leader
        await elector.stop(release=False)
        await store.close()


async def wait_for(condition: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------------------------------------
# Malformed input: a clear typed error naming the problem, and nothing written
# ---------------------------------------------------------------------------------------------


def _neg_pod() -> pb.Pod:
    p = pods_of(job("neg"))[0]
    p.spec.template.requests.milli_cpu = -100
    return p


def _neg_numa() -> pb.Node:
    n = node("numa")
    n.status.topology.numa_nodes.add(id=0).capacity.milli_cpu = -1
    return n


def _neg_extended() -> pb.Node:
    n = node("ext")
    n.status.allocatable.extended["example.com/fpga"] = -2
    return n


def _huge() -> pb.Node:
    n = node("huge")
    n.metadata.annotations["blob"] = "x" * (2 << 20)
    return n


MALFORMED: list[tuple[str, Callable[[Store], Any], type, str]] = [
    # name, write, error type, text the message must contain
    (
        "garbage bytes",
        lambda s: s.create_raw("Pod", b"\xff\xfe\x00garbage\x01\x02"),
        InvalidObjectError,
        "not a valid Pod",
    ),
    (
        "another kind's bytes",
        lambda s: s.create_raw("Pod", node("n1").SerializeToString()),
        InvalidObjectError,
        "not a valid Pod",
    ),
    ("unknown kind", lambda s: s.create_raw("Widget", b""), InvalidObjectError, "unknown kind"),
    (
        "not a stored message",
        lambda s: s.create(pb.Resources()),
        InvalidObjectError,
        "not a stored kind",
    ),
    ("oversized object", lambda s: s.create(_huge()), ObjectTooLargeError, "byte limit"),
    (
        "negative request",
        lambda s: s.create(_neg_pod()),
        InvalidObjectError,
        "spec.template.requests.milli_cpu",
    ),
    (
        "negative numa capacity",
        lambda s: s.create(_neg_numa()),
        InvalidObjectError,
        "status.topology.numa_nodes[0].capacity.milli_cpu",
    ),
    (
        "negative extended resource",
        lambda s: s.create(_neg_extended()),
        InvalidObjectError,
        "extended[example.com/fpga]",
    ),
    ("missing name", lambda s: s.create(pb.Node()), InvalidObjectError, "metadata.name"),
    ("invalid name", lambda s: s.create(node("Bad_Name")), InvalidObjectError, "DNS-1123"),
    (
        "update without version",
        lambda s: s.update(node("n9")),
        InvalidObjectError,
        "metadata.resource_version",
    ),
    (
        "bind without node",
        lambda s: s.commit([Bind(pods_of(job("x"))[0])]),
        InvalidObjectError,
        "spec.node_name",
    ),
    ("empty commit", lambda s: s.commit([]), InvalidObjectError, "at least one"),
]


@pytest.mark.parametrize(
    ("name", "write", "error", "text"), MALFORMED, ids=[m[0] for m in MALFORMED]
)
async def test_malformed_input_is_rejected_and_nothing_written(
    store: Store, name: str, write: Callable[[Store], Any], error: type, text: str
) -> None:
    await store.create(node("existing"))
    before = await snapshot(store)
    with pytest.raises(error) as err:
        await write(store)
    assert text in str(err.value)
    assert await snapshot(store) == before


async def test_garbage_in_the_store_is_reported_not_fatal(store: Store) -> None:
    await store.create(node("good"))
    await store._redis.hset(store.keys.data("Node"), "bad", b"\xff\xff\xff")
    await store._redis.hset(store.keys.versions("Node"), "bad", 99)
    listing = await store.list_kinds(["Node"])
    assert [n.metadata.name for n in listing.items["Node"]] == ["good"]  # type: ignore[attr-defined]
    assert [(k, n) for k, n, _ in listing.errors] == [("Node", "bad")]


async def test_a_stored_listing_decodes_one_object_at_a_time_and_reports_garbage(
    store: Store,
) -> None:
    for name in ("a", "b"):
        await store.create(node(name))
    await store._redis.hset(store.keys.data("Node"), "bad", b"\xff\xff\xff")
    await store._redis.hset(store.keys.versions("Node"), "bad", 99)
    listing = await store.list_stored(["Node", "Pod"])
    assert listing.kinds() == ["Node", "Pod"] and listing.revision == await store.revision()
    objects = listing.objects("Node")
    first = next(objects)
    assert first.metadata.name in ("a", "b") and not listing.errors  # type: ignore[attr-defined]
    rest = [n.metadata.name for n in objects]  # type: ignore[attr-defined]
    assert sorted([first.metadata.name, *rest]) == ["a", "b"]  # type: ignore[attr-defined]
    assert [(k, n) for k, n, _ in listing.errors] == [("Node", "bad")]
    assert list(listing.objects("Node")) == [] and listing.kinds() == ["Pod"]  # let go of
