"""`godel audit` counts reservations' holds: a node is over-committed when its pods and the live
reservations on it do not fit together (room, pod slots, host ports), and a reservation holding
room on a node that does not exist is reported; a consistent state passes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from godel.audit import audit
from protos.godel.v1 import objects_pb2 as pb
from store import Store
from store.client import Fence
from tests import factories as f


async def _setup(store: Store) -> list[pb.Pod]:
    """n1 (1000m) with two 300m pods bound on it."""
    await store.create(f.node("n1", cpu=1000, pods=10))
    j = f.job("g", replicas=2, min_member=2, cpu=300)
    pods = f.pods_of(j)
    await store.create_unit(j, pods)
    _, lease = await store.acquire_lease("binder", "b", 10_000)
    for p in pods:
        p.spec.node_name = "n1"
        p.status.phase = pb.POD_BOUND
    await store.bind(pods, fence=Fence("binder", lease.epoch))
    return pods


async def fits(store: Store) -> None:
    await store.create(f.reservation("keep", "n1", job="train", cpu=400))


async def too_big(store: Store) -> None:
    await store.create(f.reservation("keep", "n1", job="train", cpu=500))


async def two_too_many(store: Store) -> None:
    await store.create(f.reservation("a", "n1", job="train", cpu=300))
    await store.create(f.reservation("b", "n1", job="train", cpu=300))


async def same_port(store: Store) -> None:
    await store.create(f.reservation("a", "n1", job="x", cpu=1, mem=1, ports=(80,)))
    await store.create(f.reservation("b", "n1", job="y", cpu=1, mem=1, ports=(80,)))


async def on_a_lost_node(store: Store) -> None:
    await store.create(f.reservation("orphan", "gone", job="train", cpu=100))


async def pending(store: Store) -> None:
    """A reservation waiting for a node holds nothing."""
    await store.create(f.reservation("later", "", job="train", cpu=5000))


CASES: list[tuple[str, Callable[[Store], Awaitable[None]], list[str]]] = [
    ("fits beside the pods", fits, []),
    ("pending holds nothing", pending, []),
    ("larger than the room left", too_big, ["node n1 over-committed by reservation keep: insufficient cpu"]),
    ("two that do not fit together", two_too_many, ["node n1 over-committed by reservation b: insufficient cpu"]),
    ("one host port held twice", same_port, ["node n1 over-committed by reservation b: host port in use"]),
    ("on a node that does not exist", on_a_lost_node, ["reservation orphan holds room on unknown node gone"]),
]  # fmt: skip


@pytest.mark.parametrize(("make", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_audit_counts_reserved_room(
    store: Store, make: Callable[[Store], Awaitable[None]], expected: list[str]
) -> None:
    await _setup(store)
    await make(store)
    report = await audit(store)
    assert report.violations == expected
