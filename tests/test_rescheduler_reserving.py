"""Reserve-first rescheduling (``services/rescheduler/reserving.py``): which of a batch's moves go
ahead once the Binder has (or has not) reserved their rooms, and the reservation each move asks
for."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from placement.reservations import owner_of
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.api.reservations import validate
from services.rescheduler.framework import Move
from services.rescheduler.reserving import (
    build_reservation,
    kept_moves,
    reservation_name,
    ttl_seconds,
)
from tests.test_rescheduler_round import Spec, view_of


def mv(pod: str, source: str, target: str, job: str = "") -> Move:
    return Move(pod, job or pod.rsplit("-", 1)[0], source, target)


@dataclass(frozen=True)
class Case:
    name: str
    moves: list[Move]
    reserved: set[str]  # pods whose room the Binder reserved
    kept: list[str]
    gangs: tuple[str, ...] = ()  # jobs that are running gangs


CASES = [
    Case(
        "every room reserved: all kept",
        [mv("web-0", "a", "c"), mv("web-1", "b", "c")],
        {"web-0", "web-1"},
        ["web-0", "web-1"],
    ),
    Case(
        "a room not reserved: that move dropped, the others kept",
        [mv("web-0", "a", "c"), mv("web-1", "b", "d")],
        {"web-0"},
        ["web-0"],
    ),
    Case(
        "nothing reserved: nothing kept",
        [mv("web-0", "a", "c")],
        set(),
        [],
    ),
    Case(
        "a swap: each room comes free only with the batch's eviction, both kept unreserved",
        [mv("a-0", "n1", "n2"), mv("b-0", "n2", "n1")],
        set(),
        ["a-0", "b-0"],
    ),
    Case(
        "a move into a source whose own move is dropped: dropped with it",
        [mv("a-0", "n1", "n2"), mv("b-0", "n2", "n3")],
        set(),
        [],
    ),
    Case(
        "a chain whose last room is reserved: kept whole",
        [mv("a-0", "n1", "n2"), mv("b-0", "n2", "n3")],
        {"b-0"},
        ["a-0", "b-0"],
    ),
    Case(
        "a gang with one room not reserved: the whole gang dropped, other jobs kept",
        [mv("train-0", "a", "c"), mv("train-1", "b", "d"), mv("web-0", "e", "c")],
        {"train-0", "web-0"},
        ["web-0"],
        ("train",),
    ),
    Case(
        "a gang with every room reserved: kept whole",
        [mv("train-0", "a", "c"), mv("train-1", "b", "d")],
        {"train-0", "train-1"},
        ["train-0", "train-1"],
        ("train",),
    ),
    Case(
        "a gang's move dropped frees nothing a kept move needs: the move into its source dropped",
        [mv("train-0", "a", "c"), mv("train-1", "b", "d"), mv("web-0", "e", "a")],
        {"train-0"},
        [],
        ("train",),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_which_moves_a_batch_keeps_once_their_rooms_are_reserved(case: Case) -> None:
    nodes: dict[str, list[tuple[str, str, int, int]]] = {}
    for m in case.moves:
        nodes.setdefault(m.source, []).append((m.pod, m.job, 1000, 0))
        nodes.setdefault(m.target, [])
    view = view_of(Spec(nodes, min_members=dict.fromkeys(case.gangs, 2)))
    kept, dropped = kept_moves(view, case.moves, case.reserved)
    assert [m.pod for m in kept] == case.kept
    assert [m.pod for m in dropped] == [m.pod for m in case.moves if m.pod not in case.kept]


def test_a_moves_reservation_is_for_its_replacement_on_its_target() -> None:
    pod = pb.Pod(metadata=pb.ObjectMeta(name="web-3", owner="team-a"))
    pod.spec.job, pod.spec.index, pod.spec.qos = "web", 3, pb.QOS_BEST_EFFORT
    pod.spec.template.requests.milli_cpu = 1500
    pod.spec.template.requests.gpus = 1
    name = reservation_name(1764285000123, 2, 1, 17)
    ttl = ttl_seconds(10, 30, 60)
    rsv = build_reservation(
        Move("web-3", "web", "n1", "n7"), pod, name, ttl, {"godel.io/policy": "gpu-defrag"}
    )

    assert validate(rsv, "reservation") == []  # what the dispatcher would accept
    assert (rsv.spec.node, rsv.spec.ttl_seconds, rsv.status.phase) == (
        "n7",
        110,
        pb.RESERVATION_PENDING,
    )
    assert rsv.spec.template.requests == pod.spec.template.requests
    assert rsv.spec.qos == pb.QOS_BEST_EFFORT
    owner = owner_of(rsv)
    assert owner is not None
    # Its replacement (same tenant, job and index, a new name) may take it; nobody else.
    replacement = pb.Pod(metadata=pb.ObjectMeta(name="web-3-r1", owner="team-a"))
    replacement.spec.job, replacement.spec.index = "web", 3
    assert owner.admits_pod(replacement)
    sibling = pb.Pod(metadata=pb.ObjectMeta(name="web-4", owner="team-a"))
    sibling.spec.job, sibling.spec.index = "web", 4
    assert not owner.admits_pod(sibling)
    other_tenant = pb.Pod(metadata=pb.ObjectMeta(name="web-3-r1", owner="team-b"))
    other_tenant.spec.job, other_tenant.spec.index = "web", 3
    assert not owner.admits_pod(other_tenant)
