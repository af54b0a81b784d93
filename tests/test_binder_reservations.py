"""The Binder and reservations, through real Decide streams to a real binder on a real store: a
reserved node refuses another job's pod that would need the reserved room, takes the owner's pod
into it, and the reservation is consumed — deleted in the same commit that binds the pod, with
an event — so the room left is the node's again. A reservation already gone when its owner binds
costs the bind nothing. The test module's audit (from tests/test_binder.py) checks every bind
once and no node over-committed in the store's accounting."""

from __future__ import annotations

import time

from protos.godel.v1 import objects_pb2 as pb
from services.binder.config import BinderConfig
from services.binder.service import BinderService
from services.runtime.service import ServiceHost
from store import Store
from tests import factories as f
from tests.test_binder import (
    Shard,
    V,
    audit,
    binder,
    config,
    eventually,
    leading,
    shards,
    submit,
    unit,
)

__all__ = ["audit", "binder", "shards"]  # the fixtures, shared with the Binder's tests


async def held(host: ServiceHost[BinderConfig], *names: str) -> bool:
    """Whether the binder's view holds exactly these reservations."""
    service = host.service
    assert isinstance(service, BinderService)
    return set(service.state.reservations.by_name) == set(names)


async def test_a_reserved_node_takes_its_owner_only_and_the_bind_consumes_it(
    store: Store, binder: ServiceHost[BinderConfig], shards: list[Shard]
) -> None:
    await store.create(f.node("n1", cpu=4000))
    await store.create(f.reservation("keep", "n1", job="train", cpu=3000))
    await eventually(lambda: held(binder, "keep"), what="the binder sees the reservation")
    web = f.job("web", cpu=2000)
    web_pods = await submit(store, web)
    refused = await shards[0].decide(unit(web, web_pods, [("web-0", "n1")]))
    assert refused["web-0"].code == V.CONFLICT and "insufficient cpu" in refused["web-0"].reason

    train = f.job("train", cpu=3000)
    train_pods = await submit(store, train)
    before = int(time.time() * 1000)
    bound = await shards[0].decide(unit(train, train_pods, [("train-0", "n1")]))
    assert bound["train-0"].code == V.BOUND
    # Consumed in the bind's commit: the pod's write and the reservation's delete are one.
    assert await store.get_many(pb.Reservation, ["keep"]) == [None]
    assert (await store.get(pb.Pod, "train-0")).spec.node_name == "n1"

    # The room left is the node's: the binder's view no longer counts the hold (at once, not
    # when its informer catches up) — a 1000m pod fits beside the owner, a 2000m one does not.
    assert await held(binder)
    small, big = f.job("small", cpu=1000), f.job("big", cpu=2000)
    small_pods, big_pods = await submit(store, small), await submit(store, big)
    after = await shards[1].decide(
        unit(big, big_pods, [("big-0", "n1")]), unit(small, small_pods, [("small-0", "n1")])
    )
    assert (after["big-0"].code, after["small-0"].code) == (V.CONFLICT, V.BOUND)

    async def consumed_event() -> bool:
        events, _ = await store.list_all(pb.Event)
        return any(
            e.reason == "ReservationConsumed"
            and e.regarding.name == "keep"
            and e.related.name == "train-0"
            and e.event_time_ms >= before
            for e in events
        )

    await eventually(consumed_event, what="the ReservationConsumed event")


async def test_a_hold_owned_by_one_index_is_that_pods_alone(
    store: Store, binder: ServiceHost[BinderConfig], shards: list[Shard]
) -> None:
    await store.create(f.node("n1", cpu=2000))
    await store.create(f.reservation("keep", "n1", job="train", index=1, cpu=2000))
    await eventually(lambda: held(binder, "keep"), what="the binder sees the reservation")
    train = f.job("train", replicas=2, cpu=2000)
    pods = await submit(store, train)
    first = await shards[0].decide(unit(train, pods, [("train-0", "n1")]))
    assert first["train-0"].code == V.CONFLICT
    second = await shards[0].decide(unit(train, pods, [("train-1", "n1")]))
    assert second["train-1"].code == V.BOUND
    assert await store.get_many(pb.Reservation, ["keep"]) == [None]


async def test_a_reservation_gone_before_the_bind_costs_it_nothing(
    store: Store, binder: ServiceHost[BinderConfig], shards: list[Shard]
) -> None:
    """Released (expired) after the binder's view last saw it: its room is free anyway, so the
    owner's pod binds (the commit's delete finds nothing and is dropped, the bind retried)."""
    await store.create(f.node("n1", cpu=2000))
    stale = f.reservation("keep", "n1", job="train", cpu=2000)
    await store.create(stale)
    await eventually(lambda: held(binder, "keep"), what="the binder sees the reservation")
    await store.delete(pb.Reservation, "keep")
    await eventually(lambda: held(binder), what="the binder sees it go")
    # The view lagging behind the store, as it does between a delete and its watch event.
    service = binder.service
    assert isinstance(service, BinderService)
    service.state.on_add("Reservation", stale)
    train = f.job("train", cpu=2000)
    pods = await submit(store, train)
    bound = await shards[0].decide(unit(train, pods, [("train-0", "n1")]))
    assert bound["train-0"].code == V.BOUND
    assert await held(binder)


async def test_a_new_leader_keeps_every_reservation(
    store: Store, store_url: str, cluster_name: str
) -> None:
    """A failover loses none: the reservations live in the store, and the new leader's view
    holds their room (and consumes them) as the old one did."""
    await store.create(f.node("n1", cpu=2000))
    await store.create(f.reservation("keep", "n1", job="train", cpu=2000))
    async with ServiceHost(BinderService, config(store_url, cluster_name, "b1")) as first:
        await eventually(lambda: leading(first), what="b1 leading")
        await eventually(lambda: held(first, "keep"), what="b1 sees the reservation")
    # b1 stopped (its lease released); b2 takes over with nothing but the store to go by.
    async with ServiceHost(BinderService, config(store_url, cluster_name, "b2")) as second:
        await eventually(lambda: leading(second), what="b2 leading")
        assert await held(second, "keep")
        shard = Shard(second.address)
        try:
            web, train = f.job("web", cpu=1000), f.job("train", cpu=2000)
            web_pods, train_pods = await submit(store, web), await submit(store, train)
            refused = await shard.decide(unit(web, web_pods, [("web-0", "n1")]))
            assert refused["web-0"].code == V.CONFLICT
            bound = await shard.decide(unit(train, train_pods, [("train-0", "n1")]))
            assert bound["train-0"].code == V.BOUND
        finally:
            await shard.close()
    assert await store.get_many(pb.Reservation, ["keep"]) == [None]


async def test_a_decision_naming_a_hold_as_its_victim_evicts_nothing(
    store: Store, binder: ServiceHost[BinderConfig], shards: list[Shard]
) -> None:
    """A forged (or confused) decision: a high-priority pod on a fully reserved node, its
    "victim" the reservation's hold. A hold is no pod: nothing is evicted, the room stays
    reserved, and the pod is refused."""
    await store.create(f.node("n1", cpu=2000))
    await store.create(f.reservation("keep", "n1", job="train", cpu=2000))
    await eventually(lambda: held(binder, "keep"), what="the binder sees the reservation")
    boss = f.job("boss", cpu=2000)
    boss.spec.priority = 1000
    pods = await submit(store, boss)
    decision = unit(boss, pods, [("boss-0", "n1")])
    decision.placements[0].victims.append("reservation:keep")
    verdict = await shards[0].decide(decision)
    assert verdict["boss-0"].code == V.CONFLICT
    assert "insufficient cpu" in verdict["boss-0"].reason
    assert (await store.get(pb.Reservation, "keep")).status.node == "n1"


def pending(name: str, node: str, **kw: object) -> pb.Reservation:
    """As the dispatcher stores an applied reservation: Pending, named to ``node``."""
    rsv = f.reservation(name, node, **kw)  # type: ignore[arg-type]
    rsv.status.phase = pb.RESERVATION_PENDING
    rsv.status.node = ""
    return rsv


async def test_the_binder_commits_a_named_reservation_when_it_fits(
    store: Store, binder: ServiceHost[BinderConfig], shards: list[Shard]
) -> None:
    """Committed Reserved on its node in the leader's turn; one the node has no room for waits
    Pending with why, and is committed once the room is there."""
    await store.create(f.node("n1", cpu=4000))
    await store.create(pending("first", "n1", job="train", cpu=3000))
    await store.create(pending("second", "n1", job="train", cpu=3000))

    async def phases() -> dict[str, tuple[int, str, str]]:
        found, _ = await store.list_all(pb.Reservation)
        return {r.metadata.name: (r.status.phase, r.status.node, r.status.message) for r in found}

    async def settled() -> bool:
        now = await phases()
        return now.get("first", (0,))[0] == pb.RESERVATION_RESERVED and bool(
            now.get("second", (0, "", ""))[2]
        )

    await eventually(settled, what="first Reserved, second waiting with why")
    now = await phases()
    assert now["first"] == (pb.RESERVATION_RESERVED, "n1", "")
    assert now["second"] == (
        pb.RESERVATION_PENDING,
        "",
        "waiting: no room on node 'n1' yet: insufficient cpu",
    )
    # A bind now finds the room reserved; the owner's pod consumes "first"; then "second" fits.
    web = f.job("web", cpu=2000)
    web_pods = await submit(store, web)
    refused = await shards[0].decide(unit(web, web_pods, [("web-0", "n1")]))
    assert refused["web-0"].code == V.CONFLICT
    train = f.job("train", cpu=3000)
    train_pods = await submit(store, train)
    bound = await shards[0].decide(unit(train, train_pods, [("train-0", "n1")]))
    assert bound["train-0"].code == V.BOUND
    await store.delete(pb.Pod, "train-0")  # the pod leaves (its claim with it: not bound now)

    async def second_reserved() -> bool:
        return (await phases()).get("second", (0,))[0] == pb.RESERVATION_RESERVED

    await eventually(second_reserved, 60, what="second Reserved once the room is free")


async def test_a_reservation_and_a_bind_never_both_take_the_last_room(
    store: Store, binder: ServiceHost[BinderConfig], shards: list[Shard]
) -> None:
    """The pod's bind and the reservation's commit are decided one after the other by the same
    committer: whichever comes second finds the room taken."""
    await store.create(f.node("n1", cpu=2000))
    web = f.job("web", cpu=2000)
    web_pods = await submit(store, web)
    await store.create(pending("keep", "n1", job="train", cpu=2000))
    verdict = await shards[0].decide(unit(web, web_pods, [("web-0", "n1")]))

    async def decided() -> bool:
        rsv = await store.get(pb.Reservation, "keep")
        return rsv.status.phase == pb.RESERVATION_RESERVED or bool(rsv.status.message)

    await eventually(decided, what="the reservation committed or waiting")
    rsv = await store.get(pb.Reservation, "keep")
    reserved = rsv.status.phase == pb.RESERVATION_RESERVED
    assert reserved != (verdict["web-0"].code == V.BOUND)


async def test_a_batch_takes_each_hold_once_and_consumes_them_all(
    store: Store, binder: ServiceHost[BinderConfig], shards: list[Shard]
) -> None:
    await store.create(f.node("n1", cpu=3000))
    for i in range(3):
        await store.create(f.reservation(f"r{i}", "n1", job="train", cpu=1000))
    await eventually(lambda: held(binder, "r0", "r1", "r2"), what="the binder sees them")
    train = f.job("train", replicas=3, min_member=3, cpu=1000)
    pods = await submit(store, train)
    verdicts = await shards[0].decide(unit(train, pods, [(f"train-{i}", "n1") for i in range(3)]))
    assert {v.code for v in verdicts.values()} == {V.BOUND}
    assert await store.get_many(pb.Reservation, ["r0", "r1", "r2"]) == [None, None, None]
