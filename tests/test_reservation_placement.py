"""Reservations without a node, placed like a pod (issue 31, item 1): the pod a reservation is
placed as (``as_pod``) and which reservations await a node; the shard's search placing one
through the same filters and scores; its assumed placement becoming its hold in the shard's
cache; the Binder's re-check of a shard's placement (``reserve.plan_placed``), table-driven; the
dispatcher's queue of them (``ReservationQueue``: dispatch, backoff with the shard's reason, a
shard lost); and the Binder over a real Decide stream on a real store: a placed reservation is
committed Reserved once — a resent decision (a shard's retry, a Binder failover) is STALE — and
a pod in the same batch that needs its room is refused. Last, holds name their GPU cards and
NUMA nodes, so a GPU owner's card is kept however the others fragment."""

from __future__ import annotations

import pytest

from placement.framework import Framework, PodInfo, Profile, UnitInfo
from placement.plugins import new_in_tree_registry
from placement.reservations import as_pod, awaits_placement, hold_name
from placement.search import SearchConfig, UnitScheduler
from placement.snapshot import Snapshot
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.binder.config import BinderConfig
from services.binder.reserve import plan_placed
from services.binder.state import ClusterState
from services.dispatcher.dispatching.entries import BackoffSettings
from services.dispatcher.dispatching.reserving import ReservationQueue, Waiting
from services.runtime.service import ServiceHost
from services.scheduler.cache import SchedulerCache
from store import Store
from store.client import Update
from tests import factories as f
from tests.test_binder import Shard, V, audit, binder, shards, submit, unit

__all__ = ["audit", "binder", "shards"]  # the Binder's test fixtures

REGISTRY = new_in_tree_registry()


def nodeless(
    name: str = "r", *, cpu: int = 1000, rv: int = 7, tenant: str = "", ports: tuple[int, ...] = ()
) -> pb.Reservation:
    rsv = f.reservation(name, "", job="train", cpu=cpu, tenant=tenant, ports=ports)
    rsv.status.phase, rsv.status.node = pb.RESERVATION_PENDING, ""
    rsv.metadata.resource_version = rv
    return rsv


# ---------------------------------------------------------------------------------------------
# What is placed, and which
# ---------------------------------------------------------------------------------------------


def test_a_reservation_is_placed_as_the_pod_it_stands_for() -> None:
    rsv = nodeless(tenant="alice", ports=(8080,))
    rsv.spec.qos = pb.QOS_BEST_EFFORT
    rsv.spec.template.node_selector["zone"] = "a"
    rsv.spec.template.gpu_milli = 300
    pod = as_pod(rsv)
    assert (pod.metadata.name, pod.metadata.owner) == (hold_name("r"), "alice")
    assert pod.metadata.resource_version == 7
    assert pod.spec.template == rsv.spec.template
    assert pod.spec.qos == pb.QOS_BEST_EFFORT
    assert pod.spec.job == "" and pod.spec.node_name == ""
    assert pod.spec.preemption_policy == pb.NEVER  # room is reserved from what is free
    assert pod.status.phase == pb.POD_PENDING


def _changed(phase: int = pb.RESERVATION_PENDING, node: str = "", held_on: str = "",
             deleting: bool = False) -> pb.Reservation:  # fmt: skip
    rsv = nodeless()
    rsv.status.phase = pb.ReservationPhase.ValueType(phase)
    rsv.spec.node, rsv.status.node = node, held_on
    rsv.metadata.deletion_timestamp_ms = 5 if deleting else 0
    return rsv


AWAITS_CASES = [
    ("pending without a node", nodeless(), True),
    ("phase unset (as stored before phases)", _changed(phase=0), True),
    ("named to a node", _changed(node="n1"), False),
    ("reserved", _changed(phase=pb.RESERVATION_RESERVED, held_on="n1"), False),
    ("being deleted", _changed(deleting=True), False),
]


@pytest.mark.parametrize(
    ("rsv", "awaits"), [c[1:] for c in AWAITS_CASES], ids=[c[0] for c in AWAITS_CASES]
)
def test_which_reservations_await_a_node(rsv: pb.Reservation, awaits: bool) -> None:
    assert awaits_placement(rsv) is awaits


# ---------------------------------------------------------------------------------------------
# The shard: the same search, then the cache
# ---------------------------------------------------------------------------------------------


def shard(*nodes: pb.Node) -> tuple[SchedulerCache, Snapshot]:
    cache = SchedulerCache()
    for node in nodes:
        cache.set_node(node)
    snap = Snapshot()
    snap.update(cache)
    return cache, snap


def place(rsv: pb.Reservation, snap: Snapshot) -> list[tuple[str, str]]:
    info = UnitInfo(hold_name(rsv.metadata.name), 1, 0, 0, [PodInfo.from_pod(as_pod(rsv))])
    result = UnitScheduler(Framework(Profile(), REGISTRY), SearchConfig()).schedule(info, snap)
    return [(p.pod, p.node) for p in result.placements]


def test_the_shards_search_places_a_reservation_by_its_templates_rules() -> None:
    zoned = f.node("n2", cpu=4000, mem=16 * f.GiB)
    zoned.metadata.labels["zone"] = "b"
    tainted = f.node("n0", cpu=4000, mem=16 * f.GiB)
    tainted.spec.taints.add(key="gpu", value="yes", effect=pb.NO_SCHEDULE)
    small = f.node("n1", cpu=1000, mem=16 * f.GiB)
    _, snap = shard(tainted, small, zoned)
    # Too big for n1, n0's taint not tolerated: only n2 fits.
    assert place(nodeless(cpu=2000), snap) == [(hold_name("r"), "n2")]
    # Its node selector is honoured: zone a exists nowhere.
    confined = nodeless(cpu=100)
    confined.spec.template.node_selector["zone"] = "a"
    assert place(confined, snap) == []


def test_a_reservation_never_preempts() -> None:
    node = f.node("n0", cpu=1000, mem=16 * f.GiB)
    cache, _ = shard(node)
    low = f.pods_of(f.job("low", cpu=1000))[0]
    low.spec.node_name, low.status.phase, low.spec.preemptible = "n0", pb.POD_RUNNING, True
    cache.on_add("Pod", low)
    snap = Snapshot()
    snap.update(cache)
    assert place(nodeless(cpu=1000), snap) == []


def test_its_assumed_placement_becomes_its_hold_when_the_binder_commits_it() -> None:
    cache, snap = shard(f.node("n0", cpu=4000, mem=16 * f.GiB))
    rsv = nodeless(cpu=3000)
    [(name, node)] = place(rsv, snap)
    assert cache.assume(PodInfo.from_pod(as_pod(rsv)).req, node)
    info = cache.nodes["n0"]
    assert info.requested["g"][0] == 3000
    reserved = pb.Reservation()
    reserved.CopyFrom(rsv)
    reserved.status.phase, reserved.status.node = pb.RESERVATION_RESERVED, "n0"
    cache.on_update("Reservation", rsv, reserved)
    assert name not in cache.assumed
    assert list(info.pods) == [hold_name("r")] and info.requested["g"][0] == 3000
    cache.confirm(name, 0)  # a BOUND verdict arriving after the watch: nothing to drop
    cache.expire()
    assert list(info.pods) == [hold_name("r")] and info.requested["g"][0] == 3000


# ---------------------------------------------------------------------------------------------
# The Binder's re-check (no I/O)
# ---------------------------------------------------------------------------------------------


def decision(*placements: tuple[str, str, int]) -> list[ipb.UnitDecision]:
    out = []
    for name, node, rv in placements:
        d = ipb.UnitDecision(job=hold_name(name), min_member=1, reservation=name)
        d.placements.add(pod=hold_name(name), node=node, pod_resource_version=rv)
        out.append(d)
    return out


def binder_state() -> ClusterState:
    state = ClusterState()
    down = f.node("down")
    down.status.ready = False
    zoned = f.node("n2", cpu=4000)
    zoned.metadata.labels["zone"] = "b"
    for node in (f.node("n1", cpu=4000), zoned, down):
        state.on_add("Node", node)
    bound = f.pods_of(f.job("web", cpu=1000))[0]
    bound.spec.node_name, bound.status.phase = "n1", pb.POD_BOUND
    state.on_add("Pod", bound)
    return state


def _zoned(rsv: pb.Reservation) -> pb.Reservation:
    rsv.spec.template.node_selector["zone"] = "a"
    return rsv


def _reserved(rsv: pb.Reservation) -> pb.Reservation:
    rsv.status.phase, rsv.status.node = pb.RESERVATION_RESERVED, "n2"
    return rsv


PLACED_CASES = [
    # (id, stored reservations, placements (name, node, rv), verdict codes, reason fragments)
    ("fits", [nodeless("a")], [("a", "n1", 7)], [V.BOUND], [""]),
    ("changed since the decision", [nodeless("a", rv=9)], [("a", "n1", 7)], [V.STALE],
     ["decided at resource_version 7, now 9"]),
    ("already reserved (a resent decision)", [_reserved(nodeless("a"))], [("a", "n1", 7)],
     [V.STALE], ["not waiting for a node"]),
    ("deleted", [], [("a", "n1", 7)], [V.STALE], ["not found"]),
    ("node gone", [nodeless("a")], [("a", "gone", 7)], [V.CONFLICT], ["node 'gone' not found"]),
    ("node not ready", [nodeless("a")], [("a", "down", 7)], [V.CONFLICT], ["is not ready"]),
    ("placed twice in one batch", [nodeless("a")], [("a", "n1", 7), ("a", "n2", 7)],
     [V.BOUND, V.STALE], ["", "more than once"]),
    ("beside the bound pod: no room", [nodeless("a", cpu=3500)], [("a", "n1", 7)],
     [V.CONFLICT], ["insufficient cpu"]),
    ("its node selector", [_zoned(nodeless("a"))], [("a", "n2", 7)], [V.CONFLICT],
     ["NodeAffinity"]),
    ("two on one node: the second finds the first's hold",
     [nodeless("a", cpu=2000), nodeless("b", cpu=2000)], [("a", "n1", 7), ("b", "n1", 7)],
     [V.BOUND, V.CONFLICT], ["", "insufficient cpu"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("stored", "placements", "codes", "reasons"),
    [c[1:] for c in PLACED_CASES],
    ids=[c[0] for c in PLACED_CASES],
)
def test_the_binder_rechecks_a_placed_reservation(
    stored: list[pb.Reservation],
    placements: list[tuple[str, str, int]],
    codes: list[int],
    reasons: list[str],
) -> None:
    by_name: dict[str, pb.Reservation | None] = {r.metadata.name: r for r in stored}
    ops, verdicts = plan_placed(
        decision(*placements), by_name, binder_state(), Framework(Profile(), REGISTRY)
    )
    assert [v.code for v in verdicts] == codes
    for verdict, fragment in zip(verdicts, reasons, strict=True):
        assert fragment in verdict.reason, verdict.reason
    committed = [
        op.obj for op in ops if isinstance(op, Update) and isinstance(op.obj, pb.Reservation)
    ]
    assert [hold_name(r.metadata.name) for r in committed] == [
        v.pod for v in verdicts if v.code == V.BOUND
    ]
    for rsv in committed:
        node = next(v.node for v in verdicts if v.pod == hold_name(rsv.metadata.name))
        assert (rsv.status.phase, rsv.status.node, rsv.spec.node) == (
            pb.RESERVATION_RESERVED,
            node,
            "",
        )


def test_the_binder_chooses_a_gpu_share_its_card() -> None:
    state = ClusterState()
    state.on_add("Node", f.node("g1", cpu=8000, gpus=2))
    rsv = nodeless("share")
    rsv.spec.template.requests.gpus = 1
    rsv.spec.template.gpu_milli = 400
    ops, [verdict] = plan_placed(
        decision(("share", "g1", 7)), {"share": rsv}, state, Framework(Profile(), REGISTRY)
    )
    assert verdict.code == V.BOUND
    [op] = ops
    assert isinstance(op, Update) and isinstance(op.obj, pb.Reservation)
    assert len(op.obj.status.gpu_cards) == 1


# ---------------------------------------------------------------------------------------------
# The dispatcher's queue of them (pure: time comes in as an argument)
# ---------------------------------------------------------------------------------------------


def outcome(name: str, code: ipb.UnitOutcomeCode.ValueType, reason: str = "") -> ipb.UnitOutcome:
    return ipb.UnitOutcome(job=hold_name(name), code=code, reason=reason)


def test_the_dispatcher_hands_a_reservation_to_one_shard_and_backs_it_off_with_its_reason() -> None:
    queue = ReservationQueue(BackoffSettings(initial_seconds=1.0, max_seconds=4.0))
    assert queue.seen(nodeless("a", rv=3)) is None
    assert queue.seen(f.reservation("named", "n1", job="x")) is None  # the Binder's, not ours
    [entry] = queue.ready(0.0)
    unit = queue.dispatched(entry, "s1")
    assert (unit.reservation, [(p.name, p.resource_version) for p in unit.pods]) == (
        "a",
        [(hold_name("a"), 3)],
    )
    assert queue.ready(0.0) == []  # one shard at a time
    # Another shard's answer is not this one's.
    assert queue.outcome("s2", outcome("a", ipb.UNIT_UNSCHEDULABLE, "x"), 0.0) is None
    why = "0/2 nodes fit: 2 insufficient cpu"
    waits = queue.outcome("s1", outcome("a", ipb.UNIT_UNSCHEDULABLE, why), 0.0)
    assert waits is entry and entry.reason == why  # the caller writes it on the reservation
    assert queue.ready(0.5) == [] and queue.next_wake(0.5) == 0.5
    assert queue.ready(1.0) == [entry]
    queue.dispatched(entry, "s1")
    # The same reason again: nothing to write; the backoff doubles.
    assert queue.outcome("s1", outcome("a", ipb.UNIT_INFEASIBLE, why), 1.0) is None
    assert queue.ready(2.5) == []
    # A node joining wakes it at once (as an infeasible unit); backing off again, it waits.
    assert queue.wake() == 1 and queue.ready(1.5) == [entry]
    queue.dispatched(entry, "s1")
    queue.outcome("s1", outcome("a", ipb.UNIT_UNSCHEDULABLE, why), 1.0)
    assert queue.ready(2.5) == [] and queue.ready(5.0) == [entry]
    # Its shard lost: in line again at once.
    queue.dispatched(entry, "s1")
    assert queue.shard_lost("s1") == 1 and queue.ready(3.0) == [entry]
    # Placed: it waits for the watch to show it Reserved, and is then forgotten (its entry
    # returned, for the caller to revoke were it still at a shard).
    queue.dispatched(entry, "s2")
    assert queue.outcome("s2", outcome("a", ipb.UNIT_DONE), 3.0) is None
    assert entry.state == Waiting.PLACED and queue.ready(3.5) == []
    reserved = nodeless("a", rv=4)
    reserved.status.phase, reserved.status.node = pb.RESERVATION_RESERVED, "n1"
    assert queue.seen(reserved) is entry
    assert len(queue) == 0 and queue.entry_of_key(hold_name("a")) is None


# ---------------------------------------------------------------------------------------------
# The Binder over a real Decide stream
# ---------------------------------------------------------------------------------------------


async def test_the_binder_commits_a_placed_reservation_once_and_counts_its_room(
    store: Store, binder: ServiceHost[BinderConfig], shards: list[Shard]
) -> None:
    await store.create(f.node("n1", cpu=4000))
    rsv = nodeless("anywhere", cpu=3000)
    rsv.metadata.resource_version = 0
    created = await store.create(rsv)
    rv = created.metadata.resource_version
    web = f.job("web", cpu=2000)
    web_pods = await submit(store, web)
    # One batch: the reservation's placement and another job's pod that needs its room.
    verdicts = await shards[0].decide(
        *decision(("anywhere", "n1", rv)), unit(web, web_pods, [("web-0", "n1")])
    )
    assert verdicts[hold_name("anywhere")].code == V.BOUND
    assert verdicts["web-0"].code == V.CONFLICT, verdicts["web-0"].reason
    assert "insufficient cpu" in verdicts["web-0"].reason
    stored = await store.get(pb.Reservation, "anywhere")
    assert (stored.status.phase, stored.status.node) == (pb.RESERVATION_RESERVED, "n1")
    assert verdicts[hold_name("anywhere")].resource_version == stored.metadata.resource_version
    # The same decision again (a shard's resend after a failover, or a second shard's): it
    # is already Reserved, so nothing is placed twice.
    again = await shards[1].decide(*decision(("anywhere", "n1", rv)))
    assert again[hold_name("anywhere")].code == V.STALE
    assert (await store.get(pb.Reservation, "anywhere")).status.node == "n1"


# ---------------------------------------------------------------------------------------------
# GPU holds name their cards
# ---------------------------------------------------------------------------------------------


def test_a_gpu_reservation_holds_its_card_so_its_owner_still_fits_when_the_others_fragment() -> (
    None
):
    """A node of two cards, card 0 a third used by a share; a reservation of one whole card
    for "train" is committed holding card 1 by name. A non-owner's share proposed on card 1 is
    then refused (card 0 it may have), and the owner's whole card is card 1, lent to it.
    Before, a hold counted the node's GPU total only: the share took card 1 and the owner's
    whole card fit nowhere, its room held in vain."""
    from placement import gpu
    from placement.reservations import Reservations, lent
    from services.binder.reserve import plan

    state = ClusterState()
    state.on_add("Node", f.gpu_node("g1", 2, cpu=8000))
    share = f.pods_of(f.gpu_job(f.job("small", cpu=100), milli=300))[0]
    share.spec.node_name, share.status.phase = "g1", pb.POD_BOUND
    share.spec.gpu_cards.append(0)
    state.on_add("Pod", share)
    rsv = f.reservation("card", "g1", job="train", cpu=100)
    rsv.spec.template.requests.gpus = 1
    rsv.status.phase, rsv.status.node = pb.RESERVATION_PENDING, ""
    state.on_add("Reservation", rsv)
    _, [reserved] = plan(state)
    assert list(reserved.status.gpu_cards) == [1]
    state.on_add("Reservation", reserved)
    info = state.info_for("g1")
    other = PodInfo.from_pod(f.pods_of(f.gpu_job(f.job("other", cpu=100), milli=300))[0]).req
    assert gpu.verify_cards(info, other, (1,)) is not None
    assert gpu.verify_cards(info, other, (0,)) is None
    owner_pod = f.pods_of(f.gpu_job(f.job("train", cpu=100)))[0]
    holds = Reservations()
    holds.set(reserved)
    view = lent(holds.owned(owner_pod), info)
    assert gpu.choose_cards(view, PodInfo.from_pod(owner_pod).req) == (1,)


def test_a_numa_bound_reservation_holds_its_numa_node() -> None:
    """Named to a node with two NUMA nodes, a single-NUMA reservation is committed holding
    one of them (before: its pool's room only, any NUMA node free to anyone)."""
    from services.binder.reserve import plan

    node = f.with_numa(f.node("n1", cpu=8000, mem=16 * f.GiB))
    state = ClusterState()
    state.on_add("Node", node)
    rsv = f.reservation("pinned", "n1", job="train", cpu=3000)
    rsv.spec.template.numa_policy = pb.NUMA_POLICY_SINGLE
    rsv.status.phase, rsv.status.node = pb.RESERVATION_PENDING, ""
    state.on_add("Reservation", rsv)
    _, [reserved] = plan(state)
    assert len(reserved.status.numa_nodes) == 1
    state.on_add("Reservation", reserved)
    assert state.info_for("n1").numa_used.get(reserved.status.numa_nodes[0], [0])[0] == 3000
