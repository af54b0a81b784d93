"""The room accumulator (placement.room), table-driven: node and pod events in, free room per
pool out; per node and per group it agrees with the totals and with a sum from scratch."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from placement.claims import holds_claim
from placement.nodeinfo import BEST_EFFORT, GUARANTEED, POOLS
from placement.resources import Quantities
from placement.room import NodeRoom, PoolRoom, RoomClaim, usable_offer
from protos.godel.v1 import objects_pb2 as pb
from tests import factories as f


@dataclass(frozen=True)
class Node:
    """A node event: its state, or ``gone``."""

    name: str
    cpu: int = 1000
    be_cpu: int = 500
    ready: bool = True
    cordoned: bool = False
    gone: bool = False


@dataclass(frozen=True)
class Pod:
    """A pod event: its state, or ``gone`` (deleted)."""

    name: str
    node: str = ""
    cpu: int = 300
    phase: int = pb.POD_BOUND
    best_effort: bool = False
    gone: bool = False


def node_of(e: Node) -> pb.Node | None:
    if e.gone:
        return None
    n = f.node(e.name, cpu=e.cpu, mem=0, pods=10, be_cpu=e.be_cpu)
    n.status.ready = e.ready
    n.spec.unschedulable = e.cordoned
    return n


def pod_of(e: Pod) -> pb.Pod | None:
    if e.gone:
        return None
    pod = pb.Pod(metadata=pb.ObjectMeta(name=e.name))
    pod.spec.node_name = e.node
    pod.spec.qos = pb.QOS_BEST_EFFORT if e.best_effort else pb.QOS_GUARANTEED
    pod.spec.template.requests.milli_cpu = e.cpu
    pod.status.phase = e.phase  # type: ignore[assignment]  # a plain int in the tables
    return pod


N1, N2 = Node("n1"), Node("n2")
BOUND = Pod("p", "n1")

# (case, events, expected free room: (guaranteed cpu, guaranteed pod slots, best-effort cpu))
CASES: list[tuple[str, list[Node | Pod], tuple[int, int, int]]] = [
    ("no nodes", [], (0, 0, 0)),
    ("node added", [N1], (1000, 10, 500)),
    ("two nodes", [N1, N2], (2000, 20, 1000)),
    ("node resized", [N1, Node("n1", cpu=3000, be_cpu=0)], (3000, 10, 0)),
    ("node made unschedulable", [N1, N2, Node("n1", cordoned=True)], (1000, 10, 500)),
    ("node not ready", [N1, N2, Node("n1", ready=False)], (1000, 10, 500)),
    ("node ready again", [N1, Node("n1", ready=False), N1], (1000, 10, 500)),
    ("node removed", [N1, N2, Node("n1", gone=True)], (1000, 10, 500)),
    ("node removed twice", [N1, Node("n1", gone=True), Node("n1", gone=True)], (0, 0, 0)),
    ("pod pending: no claim", [N1, Pod("p")], (1000, 10, 500)),
    ("pod bound", [N1, BOUND], (700, 9, 500)),
    ("bound then running", [N1, BOUND, Pod("p", "n1", phase=pb.POD_RUNNING)], (700, 9, 500)),
    ("pod finished", [N1, BOUND, Pod("p", "n1", phase=pb.POD_SUCCEEDED)], (1000, 10, 500)),
    ("pod failed", [N1, BOUND, Pod("p", "n1", phase=pb.POD_FAILED)], (1000, 10, 500)),
    ("pod evicted (deleted)", [N1, BOUND, Pod("p", gone=True)], (1000, 10, 500)),
    ("double release", [N1, BOUND, Pod("p", gone=True), Pod("p", gone=True)], (1000, 10, 500)),
    (
        "finished then deleted",
        [N1, BOUND, Pod("p", "n1", phase=pb.POD_FAILED), Pod("p", gone=True)],
        (1000, 10, 500),
    ),
    # A best-effort pod takes its pod slot from its own pool too.
    ("best-effort pod", [N1, Pod("q", "n1", cpu=200, best_effort=True)], (1000, 10, 300)),
    ("both pools", [N1, BOUND, Pod("q", "n1", cpu=200, best_effort=True)], (700, 9, 300)),
    # A claim counts wherever its node is: the pod holds its room before the node is seen...
    ("bound to an unknown node", [N1, Pod("p", "n2")], (700, 9, 500)),
    ("then the node arrives", [N1, Pod("p", "n2"), N2], (1700, 19, 1000)),
    # ... and on a node that offers nothing now.
    ("pod on a cordoned node", [N1, BOUND, Node("n1", cordoned=True)], (-300, -1, 0)),
    (
        "cordoned node's pod ends",
        [N1, BOUND, Node("n1", cordoned=True), Pod("p", gone=True)],
        (0, 0, 0),
    ),
    (
        "pod resized on rebind",
        [N1, N2, BOUND, Pod("p", gone=True), Pod("p", "n2", cpu=100)],
        (1900, 19, 1000),
    ),
]


def play(room: NodeRoom, events: list[Node | Pod]) -> None:
    for e in events:
        if isinstance(e, Node):
            room.on_node(e.name, node_of(e))
        else:
            room.on_pod(e.name, pod_of(e))


def play_totals(room: PoolRoom[RoomClaim], events: list[Node | Pod]) -> None:
    """The events as a caller of the totals alone feeds them (the dispatcher's queue)."""
    for e in events:
        if isinstance(e, Node):
            room.set_node(e.name, usable_offer(node_of(e)))
        elif (pod := pod_of(e)) is not None and holds_claim(pod):
            room.claim(e.name, RoomClaim.of(pod))
        else:
            room.release(e.name)


def figures(free: dict[str, Quantities]) -> tuple[int, int, int]:
    return free[GUARANTEED].cpu, free[GUARANTEED].pods, free[BEST_EFFORT].cpu


@pytest.mark.parametrize(("case", "events", "expected"), CASES, ids=[c[0] for c in CASES])
def test_free_room(case: str, events: list[Node | Pod], expected: tuple[int, int, int]) -> None:
    totals: PoolRoom[RoomClaim] = PoolRoom()
    play_totals(totals, events)
    assert figures({p: totals.free(p) for p in POOLS}) == expected
    per_node = NodeRoom()
    play(per_node, events)
    assert figures({p: per_node.free(p) for p in POOLS}) == expected

    # Per node and per group (all nodes in one, grouped before the events) it agrees.
    names = {e.name for e in events if isinstance(e, Node)} | {
        e.node for e in events if isinstance(e, Pod) and e.node
    }
    grouped = NodeRoom()
    grouped.regroup(dict.fromkeys(names, "all"), ["all", "empty"])
    play(grouped, events)
    by_node = {pool: Quantities() for pool in POOLS}
    for name in names:
        for pool in POOLS:
            by_node[pool].add(grouped.node_offer(name, pool) or Quantities())
            by_node[pool].add(grouped.node_claimed(name, pool) or Quantities(), -1)
    assert figures(by_node) == expected
    assert figures({p: grouped.group_free("all", p) or Quantities() for p in POOLS}) == expected
    assert grouped.group_free("empty", GUARANTEED) == Quantities()
    assert grouped.group_free("other", GUARANTEED) is None
    # ... and with a sum from scratch.
    grouped.regroup(dict.fromkeys(names, "all"), ["all"])
    assert figures({p: grouped.group_free("all", p) or Quantities() for p in POOLS}) == expected


def test_groups_follow_their_nodes_only() -> None:
    room = NodeRoom()
    for name in ("n1", "n2", "n3"):
        room.on_node(name, node_of(Node(name)))
    owner = {"n1": "a", "n2": "a", "n3": "b"}
    room.regroup(owner, ["a", "b"])
    room.on_pod("p", pod_of(Pod("p", "n3")))
    room.on_pod("q", pod_of(Pod("q", "n4")))  # a node no group holds: the totals only
    assert room.group_free("a", GUARANTEED) == Quantities(cpu=2000, pods=20)
    assert room.group_free("b", GUARANTEED) == Quantities(cpu=700, pods=9)
    assert room.free(GUARANTEED) == Quantities(cpu=2400, pods=28)
    owner["n3"] = "a"  # the caller's map moved a node: it counts from the next regroup
    room.regroup(owner, ["a", "b"])
    assert room.group_free("a", GUARANTEED) == Quantities(cpu=2700, pods=29)
    assert room.group_free("b", GUARANTEED) == Quantities()
    room.regroup(None)
    assert room.group_free("a", GUARANTEED) is None


def test_holds_count_in_the_totals_only() -> None:
    room: PoolRoom[RoomClaim] = PoolRoom()
    room.set_node("n1", {GUARANTEED: Quantities(cpu=1000, pods=10)})
    unit = Quantities(cpu=400, pods=2)
    room.hold(GUARANTEED, unit)
    assert room.free(GUARANTEED) == Quantities(cpu=600, pods=8)
    assert room.capacity(GUARANTEED) == Quantities(cpu=1000, pods=10)
    room.hold(GUARANTEED, unit, -1)
    assert room.free(GUARANTEED) == Quantities(cpu=1000, pods=10)
    assert room.claimed(GUARANTEED).is_zero()


def test_claims_are_kept_per_pod() -> None:
    room = NodeRoom()
    pod = pod_of(Pod("p", "n1", cpu=250))
    assert pod is not None
    room.on_pod("p", pod)
    held = room.claim_of("p")
    assert held == RoomClaim("n1", GUARANTEED, Quantities(cpu=250, pods=1))
    assert room.holds("p") and list(room.claims()) == [held]
    assert room.release("p") == held
    assert room.release("p") is None and not room.holds("p")
    assert room.free(GUARANTEED) == Quantities()


def test_a_claim_restated_keeps_the_sums_as_a_release_and_claim_leave_them() -> None:
    """``restate``: the record replaced by one taking the same pool, shared requests and node;
    the sums are those a release and a claim of it would leave, without their two passes."""
    requests = Quantities(cpu=250, pods=1)
    restated: PoolRoom[RoomClaim] = PoolRoom()
    claimed: PoolRoom[RoomClaim] = PoolRoom()
    for room in (restated, claimed):
        room.set_node("n1", {GUARANTEED: Quantities(cpu=1000, pods=10)})
        room.claim("p", RoomClaim("n1", GUARANTEED, requests))
    again = RoomClaim("n1", GUARANTEED, requests)
    restated.restate("p", again)
    claimed.release("p")
    claimed.claim("p", again)
    assert restated.claim_of("p") is again
    assert restated.free(GUARANTEED) == claimed.free(GUARANTEED) == Quantities(cpu=750, pods=9)
    assert restated.claimed(GUARANTEED) == claimed.claimed(GUARANTEED)


@pytest.mark.parametrize(
    ("ready", "cordoned", "usable"),
    [(True, False, True), (False, False, False), (True, True, False)],
)
def test_usable_offer(ready: bool, cordoned: bool, usable: bool) -> None:
    node = node_of(Node("n", ready=ready, cordoned=cordoned))
    assert node is not None
    offer = usable_offer(node)
    assert (offer is not None) == usable
    if offer is not None:
        assert offer[GUARANTEED] == Quantities(cpu=1000, pods=10)
        assert offer[BEST_EFFORT] == Quantities(cpu=500)
    assert usable_offer(None) is None
