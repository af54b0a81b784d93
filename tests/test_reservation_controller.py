"""The dispatcher's reservation controller against a real store and informer: a reservation is
released (deleted, with a ReservationReleased event) once its TTL has run since it was created,
when its owner job goes, and when its node is lost (deleted or NotReady); a reservation applied
ahead of its job stays; a raised TTL is honoured; and a restarted controller derives the same
deadlines from what is stored (orphans still expire)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from protos.godel.v1 import objects_pb2 as pb
from services import events
from services.dispatcher.controllers.reservations import (
    EXPIRED,
    NODE_LOST,
    OWNER_DELETED,
    ReservationController,
)
from store import Store
from store.informer import Informer
from tests import factories as f

KINDS = ["Job", "Node", "Reservation"]


@pytest.fixture
async def informer(store: Store) -> AsyncIterator[Informer]:
    inf = Informer(store, KINDS, block_ms=100)
    inf.start()
    await inf.wait_synced(10)
    try:
        yield inf
    finally:
        await inf.stop()


async def caught_up(store: Store, informer: Informer) -> None:
    await informer.wait_for_revision(await store.revision(), timeout=10)


async def left(store: Store) -> list[str]:
    return sorted(r.metadata.name for r in (await store.list_all(pb.Reservation))[0])


async def released_events(store: Store, recorder: events.EventRecorder) -> dict[str, str]:
    await recorder.flush()
    found, _ = await store.list_all(pb.Event)
    return {
        e.regarding.name: e.message
        for e in found
        if e.reason == events.RESERVATION_RELEASED and e.regarding.kind == "Reservation"
    }


async def test_expiry_owner_deletion_and_node_loss_release(
    store: Store, informer: Informer
) -> None:
    for name in ("n1", "n2", "n3"):
        await store.create(f.node(name))
    await store.create_unit(f.job("train"), f.pods_of(f.job("train")))
    for rsv in (
        f.reservation("short", "n1", job="later", ttl=10),
        f.reservation("long", "n1", job="later", ttl=3600),
        f.reservation("for-train", "n1", job="train", ttl=3600),
        f.reservation("on-n2", "n2", job="later", ttl=3600),
        f.reservation("on-n3", "n3", job="later", ttl=3600),
    ):
        await store.create(rsv)
    recorder = events.EventRecorder(store, "dispatcher-test")
    ctl = ReservationController(store, informer, recorder)
    await caught_up(store, informer)
    created = (await store.get(pb.Reservation, "short")).metadata.creation_timestamp_ms

    await ctl.tick(now_ms=created + 9_999)  # nothing due yet; nothing lost
    assert await left(store) == ["for-train", "long", "on-n2", "on-n3", "short"]
    await ctl.tick(now_ms=created + 10_000)
    assert await left(store) == ["for-train", "long", "on-n2", "on-n3"]

    await store.delete(pb.Job, "train")
    await store.delete(pb.Node, "n2")
    lost = await store.get(pb.Node, "n3")
    lost.status.ready = False
    await store.update(lost)
    await caught_up(store, informer)
    await ctl.tick(now_ms=created + 10_000)
    # "long" waits for a job that was never there: applied ahead of it, it stays.
    assert await left(store) == ["long"]
    assert ctl.released == {EXPIRED: 1, OWNER_DELETED: 1, NODE_LOST: 2}
    assert await released_events(store, recorder) == {
        "short": "released (expired): unused after its TTL of 10s",
        "for-train": "released (owner deleted): its owner job 'train' went",
        "on-n2": "released (node lost): its node 'n2' was deleted",
        "on-n3": "released (node lost): its node 'n3' is not ready",
    }


async def test_a_raised_ttl_is_honoured_and_a_restart_keeps_the_deadlines(
    store: Store, informer: Informer
) -> None:
    await store.create(f.node("n1"))
    await store.create(f.reservation("keep", "n1", job="later", ttl=10))
    ctl = ReservationController(store, informer)
    await caught_up(store, informer)
    rsv = await store.get(pb.Reservation, "keep")
    created = rsv.metadata.creation_timestamp_ms
    rsv.spec.ttl_seconds = 100
    await store.update(rsv)
    await caught_up(store, informer)
    await ctl.tick(now_ms=created + 50_000)
    assert await left(store) == ["keep"]
    # A new controller (a restarted dispatcher) over the same stored reservation: the same
    # deadline, from its creation time and TTL.
    again = ReservationController(store, informer)
    await again.tick(now_ms=created + 99_999)
    assert await left(store) == ["keep"]
    await again.tick(now_ms=created + 100_000)
    assert await left(store) == []
    assert again.released[EXPIRED] == 1


async def test_registered_before_the_listing_it_finds_an_owner_marked_for_deletion(
    store: Store,
) -> None:
    """The dispatcher registers the controller before its informer lists (each object handed
    over once): reservations come after jobs in that listing, so the job's deletion mark
    found none of them; the reservation's own arrival finds the mark instead."""
    await store.create(f.node("n1"))
    await store.create_unit(f.job("train"), f.pods_of(f.job("train")))
    await store.create(f.reservation("for-train", "n1", job="train", ttl=3600))
    job = await store.get(pb.Job, "train")
    job.metadata.deletion_timestamp_ms = 1
    await store.update(job)
    informer = Informer(store, ["Pod", "Job", "Node", "Reservation"], block_ms=100)
    ctl = ReservationController(store, informer)
    informer.start()
    try:
        await informer.wait_synced(10)
        await ctl.tick()
        assert await left(store) == []
        assert ctl.released[OWNER_DELETED] == 1
    finally:
        await informer.stop()
