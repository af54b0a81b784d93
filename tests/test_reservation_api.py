"""Reservations through the dispatcher's public API (a real grpc.aio client, the service
in-process on a real store): stored holding room on their node, listed, read, re-applied; and
bad input — larger than its node, a TTL that is not positive, an owner that does not parse, a
node that does not exist — refused at Apply naming the field, nothing stored."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from store import Store
from store.client import Fence
from store.kinds import wrap
from tests import factories as f
from tests.dispatcher_harness import Running, dispatcher_config, eventually, run_dispatcher

Mutate = Callable[[pb.Reservation], None]


@pytest.fixture
async def dispatcher(store_url: str, cluster_name: str, tmp_path: Path) -> AsyncIterator[Running]:
    async with run_dispatcher(dispatcher_config(store_url, cluster_name, tmp_path)) as running:
        yield running


def reservation(name: str = "hold", *, node: str = "n1", ttl: int = 60) -> pb.Reservation:
    rsv = pb.Reservation(metadata=pb.ObjectMeta(name=name))
    rsv.spec.template.requests.milli_cpu = 1000
    rsv.spec.template.requests.memory_bytes = f.GiB
    rsv.spec.owner.job = "train"
    rsv.spec.node = node
    rsv.spec.ttl_seconds = ttl
    return rsv


def _apply(*objs: pb.Reservation, dry_run: bool = False) -> api_pb2.ApplyRequest:
    return api_pb2.ApplyRequest(objects=[wrap("Reservation", o) for o in objs], dry_run=dry_run)


async def test_a_reservation_is_stored_for_the_binder_to_commit(
    dispatcher: Running, store: Store
) -> None:
    await store.create(f.node("n1"))
    rsv = reservation()
    rsv.metadata.owner = "someone-else"  # never taken from the request
    rsv.status.phase = pb.RESERVATION_PENDING  # the system's to say
    created = await dispatcher.api.Apply(_apply(rsv))
    assert [(r.kind, r.name, r.action) for r in created.results] == [
        ("Reservation", "hold", "created")
    ]
    stored = await store.get(pb.Reservation, "hold")
    # Pending until the Binder commits it on its node (no Binder runs here).
    assert stored.status.phase == pb.RESERVATION_PENDING and stored.status.node == ""
    assert stored.spec.node == "n1"
    assert stored.metadata.owner == "" and stored.metadata.creation_timestamp_ms > 0
    got = await dispatcher.api.Get(api_pb2.GetRequest(kind="Reservation", name="hold"))
    assert got.reservation == stored
    listed = await dispatcher.api.List(api_pb2.ListRequest(kind="Reservation"))
    assert [o.reservation.metadata.name for o in listed.items] == ["hold"]

    assert (await dispatcher.api.Apply(_apply(reservation()))).results[0].action == "unchanged"
    longer = reservation(ttl=600)
    assert (await dispatcher.api.Apply(_apply(longer))).results[0].action == "configured"
    assert (await store.get(pb.Reservation, "hold")).spec.ttl_seconds == 600

    moved = reservation(ttl=600)
    moved.spec.template.requests.milli_cpu = 2000
    refused = (await dispatcher.api.Apply(_apply(moved))).results[0]
    assert refused.action == "invalid"
    assert [v.field for v in refused.violations] == ["objects[0].reservation.spec.template"]
    assert "immutable" in refused.violations[0].description

    deleted = await dispatcher.api.Delete(api_pb2.DeleteRequest(kind="Reservation", name="hold"))
    assert deleted.deleted == 1 and await store.get_many(pb.Reservation, ["hold"]) == [None]


async def test_a_reservation_without_a_node_waits_for_one(
    dispatcher: Running, store: Store
) -> None:
    response = await dispatcher.api.Apply(_apply(reservation(node="")))
    assert response.results[0].action == "created"
    stored = await store.get(pb.Reservation, "hold")
    assert stored.status.phase == pb.RESERVATION_PENDING and not stored.status.node


def _set(path: str, value: object) -> Mutate:
    def mutate(rsv: pb.Reservation) -> None:
        *parents, last = path.split(".")
        msg = rsv
        for p in parents:
            msg = getattr(msg, p)
        setattr(msg, last, value)

    return mutate


def _owner(**fields: object) -> Mutate:
    def mutate(rsv: pb.Reservation) -> None:
        rsv.spec.ClearField("owner")
        for name, value in fields.items():
            setattr(rsv.spec.owner, name, value)

    return mutate


P = "objects[0].reservation."
# (id, change to a good reservation, the field named)
BAD_RESERVATIONS: list[tuple[str, Mutate, str]] = [
    ("zero-ttl", _set("spec.ttl_seconds", 0), P + "spec.ttl_seconds"),
    ("negative-ttl", _set("spec.ttl_seconds", -5), P + "spec.ttl_seconds"),
    ("owner-missing", _owner(), P + "spec.owner.job"),
    ("owner-job-and-selector", _owner(job="a", selector="app=x"), P + "spec.owner.selector"),
    ("owner-selector-unparsable", _owner(selector="app in (x"), P + "spec.owner.selector"),
    ("owner-selector-everything", _owner(selector=" "), P + "spec.owner.selector"),
    ("owner-job-not-a-name", _owner(job="Not_A_Name"), P + "spec.owner.job"),
    ("owner-negative-index", _owner(job="train", index=-1), P + "spec.owner.index"),
    ("owner-index-with-selector", _owner(selector="app=x", index=0), P + "spec.owner.index"),
    ("node-missing", _set("spec.node", "nowhere"), P + "spec.node"),
    ("node-not-ready", _set("spec.node", "down"), P + "spec.node"),
    (
        "larger-than-its-node-cpu",
        _set("spec.template.requests.milli_cpu", 64000),
        P + "spec.template.requests.milli_cpu",
    ),
    (
        "larger-than-its-node-memory",
        _set("spec.template.requests.memory_bytes", 64 * f.GiB),
        P + "spec.template.requests.memory_bytes",
    ),
    (
        "larger-than-its-node-best-effort-pool",
        _set("spec.qos", pb.QOS_BEST_EFFORT),
        P + "spec.template.requests.milli_cpu",
    ),
    ("no-requests", _set("spec.template.requests.milli_cpu", 0), P + "spec.template.requests"),
    ("bad-name", _set("metadata.name", "Hold!"), P + "metadata.name"),
]


@pytest.mark.parametrize(
    ("mutate", "field"), [c[1:] for c in BAD_RESERVATIONS], ids=[c[0] for c in BAD_RESERVATIONS]
)
async def test_bad_reservations_are_refused_naming_the_field(
    dispatcher: Running, store: Store, mutate: Mutate, field: str
) -> None:
    await store.create(f.node("n1", be_cpu=500, be_mem=f.GiB))
    down = f.node("down")
    down.status.ready = False
    await store.create(down)
    before = await store.revision()
    rsv = reservation()
    mutate(rsv)
    if field.endswith("spec.template.requests"):
        rsv.spec.template.requests.memory_bytes = 0
    response = await dispatcher.api.Apply(_apply(rsv))
    result = response.results[0]
    assert result.action == "invalid"
    assert [v.field for v in result.violations] == [field]
    assert await store.revision() == before
    assert await store.list_all(pb.Reservation) == ([], before)


async def test_a_bad_reservation_refuses_only_itself(dispatcher: Running, store: Store) -> None:
    await store.create(f.node("n1"))
    response = await dispatcher.api.Apply(
        _apply(reservation("good"), reservation("bad", node="nowhere"))
    )
    assert [r.action for r in response.results] == ["created", "invalid"]
    assert await store.get_many(pb.Reservation, ["good", "bad"]) != [None, None]
    assert (await store.get_many(pb.Reservation, ["bad"])) == [None]


async def test_a_missing_reservation_is_not_found(dispatcher: Running, store: Store) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await dispatcher.api.Get(api_pb2.GetRequest(kind="Reservation", name="nope"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reservations_are_watched(dispatcher: Running, store: Store) -> None:
    await store.create(f.node("n1"))
    await dispatcher.api.Apply(_apply(reservation("first")))
    stream = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Reservation"]))
    listed = await stream.read()
    assert (listed.type, listed.object.reservation.metadata.name) == (
        api_pb2.WatchEvent.ADDED,
        "first",
    )
    assert (await stream.read()).type == api_pb2.WatchEvent.BOOKMARK
    await dispatcher.api.Apply(_apply(reservation("second")))
    await dispatcher.api.Delete(api_pb2.DeleteRequest(kind="Reservation", name="first"))
    seen = []
    while len(seen) < 2:
        event = await asyncio.wait_for(stream.read(), 10)
        if event.type != api_pb2.WatchEvent.BOOKMARK:
            seen.append((event.type, event.object.reservation.metadata.name))
    assert seen == [(api_pb2.WatchEvent.ADDED, "second"), (api_pb2.WatchEvent.DELETED, "first")]
    stream.cancel()


async def test_the_sdk_reserves_and_reads_reservations(dispatcher: Running, store: Store) -> None:
    from godel.client import AsyncGodelClient, Invalid, Reservation
    from godel.client import reservation as new_reservation

    await store.create(f.node("n1"))
    async with AsyncGodelClient(dispatcher.host.address, insecure=True) as client:
        made = await client.reserve(
            new_reservation("keep", node="n1", job="train", index=0, cpu="500m", ttl_seconds=90)
        )
        assert isinstance(made, Reservation)
        assert (made.phase, made.node, made.owner) == (
            "Pending",
            "n1",
            {"job": "train", "index": 0},
        )
        assert [r.name for r in await client.reservations()] == ["keep"]
        assert (await client.reservation("keep")).spec["ttlSeconds"] == 90
        with pytest.raises(Invalid) as caught:
            await client.reserve(new_reservation("bad", node="n1", job="train", ttl_seconds=0))
        assert [v.field for v in caught.value.violations] == [
            "objects[0].reservation.spec.ttl_seconds"
        ]
    assert await store.get_many(pb.Reservation, ["bad"]) == [None]


async def test_a_reservation_must_fit_beside_what_its_node_holds_now(
    dispatcher: Running, store: Store
) -> None:
    """The node's bound pods and its reservations (stored, and earlier in the same request)
    leave it no room: refused naming spec.node, nothing stored."""
    await store.create(f.node("n1", cpu=4000))
    job = f.job("web", cpu=2000)
    pods = f.pods_of(job)
    await store.create_unit(job, pods)
    _, lease = await store.acquire_lease("binder", "b", 10_000)
    pods[0].spec.node_name, pods[0].status.phase = "n1", pb.POD_BOUND
    await store.bind(pods, fence=Fence("binder", lease.epoch))
    first = await dispatcher.api.Apply(_apply(reservation("a")))  # 1000m beside 2000m: fits
    assert first.results[0].action == "created"

    async def sees_a() -> bool:
        listed = await dispatcher.api.List(api_pb2.ListRequest(kind="Reservation"))
        return [o.reservation.metadata.name for o in listed.items] == ["a"]

    await eventually(sees_a)
    both = await dispatcher.api.Apply(_apply(reservation("b"), reservation("c")))
    assert [r.action for r in both.results] == ["created", "invalid"]
    [why] = both.results[1].violations
    assert why.field == "objects[1].reservation.spec.node"
    assert "has not the room for it now (insufficient cpu)" in why.description
    assert await store.get_many(pb.Reservation, ["c"]) == [None]
    # Re-applying a stored one is not judged again: its room is its own.
    again = await dispatcher.api.Apply(_apply(reservation("a", ttl=120)))
    assert again.results[0].action == "configured"
