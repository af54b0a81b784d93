"""Reservations in the placement library, table-driven: whose pods an owner admits, how an owner
that does not parse is named, what a node looks like to an owner's pod (``lent``), the
Reservation locating plugin's preferences; then the shard's search over a cache fed a
reservation: the reserved node refuses every other pod and takes the owner's."""

from __future__ import annotations

import pytest

from placement.framework import Framework, PodInfo, Profile, UnitInfo
from placement.nodeinfo import NodeInfo, PodRequest
from placement.plugins import new_in_tree_registry
from placement.plugins.reservation import Reservation
from placement.preemption import LowerPriorityTotals
from placement.reservations import (
    HOLD_PRIORITY,
    OwnerError,
    Reservations,
    hold_for,
    hold_name,
    hold_request,
    lent,
    parse_owner,
)
from placement.search import SearchConfig, UnitScheduler
from placement.snapshot import Snapshot
from protos.godel.v1 import objects_pb2 as pb
from services.scheduler.cache import SchedulerCache
from tests import factories as f

REGISTRY = new_in_tree_registry()


def pod(job: str, index: int = 0, *, tenant: str = "", **labels: str) -> pb.Pod:
    p = f.pods_of(f.job(job, replicas=index + 1, cpu=1000, mem=f.GiB))[index]
    p.metadata.owner = tenant
    p.metadata.labels.update(labels)
    return p


# ---------------------------------------------------------------------------------------------
# Owners
# ---------------------------------------------------------------------------------------------

OWNER_CASES = [
    # (id, owner fields, the pod, admitted)
    ("job-any-index", {"job": "train"}, pod("train", 3), True),
    ("job-other-job", {"job": "train"}, pod("web"), False),
    ("job-index-match", {"job": "train", "index": 2}, pod("train", 2), True),
    ("job-index-other", {"job": "train", "index": 2}, pod("train", 1), False),
    ("job-index-zero-is-an-index", {"job": "train", "index": 0}, pod("train", 1), False),
    ("selector-match", {"selector": "app in (web,api)"}, pod("x", app="api"), True),
    ("selector-no-match", {"selector": "app=web"}, pod("web"), False),
    ("other-tenant", {"job": "train"}, pod("train", tenant="bob"), False),
]


@pytest.mark.parametrize(
    ("fields", "candidate", "admitted"),
    [c[1:] for c in OWNER_CASES],
    ids=[c[0] for c in OWNER_CASES],
)
def test_an_owner_admits_its_pods_only(
    fields: dict[str, object], candidate: pb.Pod, admitted: bool
) -> None:
    owner = parse_owner(pb.ReservationOwner(**fields), tenant="")  # type: ignore[arg-type]
    assert owner.admits_pod(candidate) is admitted


BAD_OWNERS = [
    # (id, owner fields, the field named)
    ("empty", {}, "job"),
    ("both", {"job": "a", "selector": "x=y"}, "selector"),
    ("unparsable-selector", {"selector": "a in (b"}, "selector"),
    ("empty-selector", {"selector": "  "}, "selector"),
    ("not-a-job-name", {"job": "Train_1"}, "job"),
    ("too-long-job-name", {"job": "a" * 64}, "job"),
    ("negative-index", {"job": "a", "index": -2}, "index"),
    ("index-with-selector", {"selector": "x=y", "index": 1}, "index"),
]


@pytest.mark.parametrize(
    ("fields", "field"), [c[1:] for c in BAD_OWNERS], ids=[c[0] for c in BAD_OWNERS]
)
def test_an_owner_that_does_not_parse_is_named(fields: dict[str, object], field: str) -> None:
    with pytest.raises(OwnerError) as caught:
        parse_owner(pb.ReservationOwner(**fields))  # type: ignore[arg-type]
    assert caught.value.field == field


# ---------------------------------------------------------------------------------------------
# The room held, and lent to its owner
# ---------------------------------------------------------------------------------------------


def reserved_node(*holds: pb.Reservation, cpu: int = 4000) -> NodeInfo:
    info = NodeInfo.from_node(f.node("n1", cpu=cpu, pods=3))
    for rsv in holds:
        info.add_pod(hold_request(rsv))
    return info


def test_a_hold_counts_as_a_pod_of_its_room_never_below_a_preemptor() -> None:
    info = reserved_node(f.reservation("r", "n1", job="train", cpu=3000, ports=(8080,)))
    assert info.requested["g"][:2] == [3000, f.GiB]
    assert ("TCP", 8080) in info.used_ports and len(info.pods) == 1
    # Preemption's quick check sums what lower-priority pods hold: never a hold.
    assert info.pods[hold_name("r")].priority == HOLD_PRIORITY
    assert LowerPriorityTotals().lower_than(info, "g", 1_000_000_000)[0] == 0


LENT_CASES = [
    # (id, holds on the node, holds the pod may take, the hold lent (None: the node itself))
    ("no-holds-of-its-own", ["a"], {}, None),
    ("its-hold", ["a"], {hold_name("a"): "n1"}, hold_name("a")),
    ("its-hold-elsewhere", ["a"], {hold_name("b"): "n2"}, None),
    ("one-of-two-first-by-name", ["b", "a"], {hold_name("a"): "n1", hold_name("b"): "n1"}, hold_name("a")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("on_node", "owned", "taken"), [c[1:] for c in LENT_CASES], ids=[c[0] for c in LENT_CASES]
)
def test_an_owner_sees_the_node_without_exactly_one_of_its_holds(
    on_node: list[str], owned: dict[str, str], taken: str | None
) -> None:
    info = reserved_node(*(f.reservation(n, "n1", job="train") for n in on_node))
    view = lent(owned, info)
    assert hold_for(owned, info) == taken
    if taken is None:
        assert view is info
    else:
        assert set(view.pods) == set(info.pods) - {taken}
        assert taken in info.pods  # the node itself keeps it: only the pod's view lacks it


def test_the_hard_rules_judge_an_owner_on_its_lent_node() -> None:
    rules = Framework(Profile(), REGISTRY)
    info = reserved_node(f.reservation("r", "n1", job="train", cpu=3500, ports=(8080,)))
    other = PodInfo.from_pod(pod("web"))
    owner = PodInfo.from_pod(pod("train"))
    owner.reservations = {hold_name("r"): "n1"}
    status = rules.run_filters(other, info)
    assert status is not None and "insufficient cpu" in status.reasons
    assert rules.run_filters(owner, info) is None
    assert all(fn(owner, info) is None for fn in rules.filters_for(owner))
    # Its port is held too: only the owner may bind it.
    ported = pod("train")
    ported.spec.template.ports.add(container_port=8080, host_port=8080)
    ported_info = PodInfo.from_pod(ported)
    assert rules.run_filters(ported_info, reserved_node(f.reservation("q", "n1", job="x", cpu=1, ports=(8080,)))) is not None  # fmt: skip


LOCATING_CASES = [
    # (id, each pod's holds, the unit's preferred nodes before, after)
    ("none", [{}, {}], [], []),
    ("one-hold", [{"reservation:a": "n3"}, {}], [], [("n3", "")]),
    ("shared-hold-once", [{"reservation:a": "n3"}, {"reservation:a": "n3"}], [], [("n3", "")]),
    ("two-holds", [{"reservation:b": "n2", "reservation:a": "n1"}], [], [("n1", ""), ("n2", "")]),
    ("ahead-of-a-movement", [{"reservation:a": "n1"}], [("n5", "mv-1")], [("n1", ""), ("n5", "mv-1")]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("holds", "before", "after"),
    [c[1:] for c in LOCATING_CASES],
    ids=[c[0] for c in LOCATING_CASES],
)
def test_the_reservation_plugin_prefers_the_reserved_nodes(
    holds: list[dict[str, str]], before: list[tuple[str, str]], after: list[tuple[str, str]]
) -> None:
    pods = []
    for i, h in enumerate(holds):
        info = PodInfo.from_pod(pod("train", i))
        info.reservations = h
        pods.append(info)
    unit = UnitInfo("train", 1, 0, 0, pods, preferred=list(before))
    assert Reservation().locate(unit, []) is None  # no narrowing
    assert unit.preferred == after


# ---------------------------------------------------------------------------------------------
# The shard's search over its cache
# ---------------------------------------------------------------------------------------------


def shard_view(*reservations: pb.Reservation, nodes: int = 3) -> tuple[SchedulerCache, Snapshot]:
    cache = SchedulerCache()
    for i in range(nodes):
        cache.set_node(f.node(f"n{i}", cpu=4000, mem=16 * f.GiB))
    for rsv in reservations:
        cache.on_add("Reservation", rsv)
    snap = Snapshot()
    snap.update(cache)
    return cache, snap


def unit(cache: SchedulerCache, job: str, replicas: int, cpu: int) -> UnitInfo:
    pods = f.pods_of(f.job(job, replicas=replicas, min_member=1, cpu=cpu, mem=f.GiB))
    return UnitInfo(job, 1, 0, 0, [cache.reservations.own(PodInfo.from_pod(p), p) for p in pods])


def search() -> UnitScheduler:
    return UnitScheduler(Framework(Profile(), REGISTRY), SearchConfig())


def test_a_reserved_node_refuses_other_pods() -> None:
    cache, snap = shard_view(f.reservation("keep", "n1", job="train", cpu=4000))
    result = search().schedule(unit(cache, "web", 3, 4000), snap)
    assert sorted(p.node for p in result.placements) == ["n0", "n2"]
    assert "insufficient cpu" in result.unplaced["web-2"]


def test_the_owner_takes_its_reserved_room_first() -> None:
    cache, snap = shard_view(f.reservation("keep", "n2", job="train", cpu=2000))
    # n2 is the last node the scan would reach; the plugin sends the owner there first.
    result = search().schedule(unit(cache, "train", 1, 2000), snap)
    assert [(p.pod, p.node) for p in result.placements] == [("train-0", "n2")]


def test_a_full_reserved_node_takes_its_owner_only() -> None:
    cache, snap = shard_view(f.reservation("keep", "n0", job="train", cpu=4000), nodes=1)
    assert search().schedule(unit(cache, "web", 1, 1000), snap).placements == []
    placed = search().schedule(unit(cache, "train", 2, 4000), snap)
    # One hold: one of the owner's pods takes it, the other finds no room.
    assert [(p.pod, p.node) for p in placed.placements] == [("train-0", "n0")]


def test_an_index_owned_hold_is_lent_to_that_pod_only() -> None:
    cache, snap = shard_view(f.reservation("keep", "n0", job="train", index=1, cpu=4000), nodes=1)
    placed = search().schedule(unit(cache, "train", 2, 4000), snap)
    assert [(p.pod, p.node) for p in placed.placements] == [("train-1", "n0")]


def test_the_cache_moves_a_hold_with_its_reservation() -> None:
    cache, _ = shard_view(f.reservation("keep", "n0", job="train", cpu=3000))
    assert cache.nodes["n0"].requested["g"][0] == 3000
    cache.on_update("Reservation", pb.Reservation(), f.reservation("keep", "n1", job="train", cpu=3000))  # fmt: skip
    assert (cache.nodes["n0"].requested["g"][0], cache.nodes["n1"].requested["g"][0]) == (0, 3000)
    cache.on_delete("Reservation", f.reservation("keep", "n1", job="train"))
    assert cache.nodes["n1"].requested["g"][0] == 0 and not cache.nodes["n1"].pods
    assert len(cache.reservations) == 0


def test_owners_are_found_by_job_selector_and_tenant() -> None:
    held = Reservations()
    held.set(f.reservation("a", "n1", job="train"))
    held.set(f.reservation("b", "n2", selector="app=web"))
    held.set(f.reservation("c", "n3", job="train", tenant="alice"))
    held.set(f.reservation("pending", "", job="train"))  # holds nothing yet
    assert held.owned(pod("train")) == {hold_name("a"): "n1"}
    assert held.owned(pod("x", app="web")) == {hold_name("b"): "n2"}
    assert held.owned(pod("train", tenant="alice")) == {hold_name("c"): "n3"}
    owner = PodInfo.from_pod(pod("train"))
    plain_key = owner.template_key
    held.own(owner, pod("train"))
    assert owner.template_key != plain_key  # no template cache shared with non-owners


def test_a_hold_is_a_pod_request() -> None:
    req = hold_request(f.reservation("r", "n1", job="t", cpu=1500, mem=2 * f.GiB))
    assert isinstance(req, PodRequest)
    assert (req.name, req.pool, req.cpu, req.mem) == ("reservation:r", "g", 1500, 2 * f.GiB)


# ---------------------------------------------------------------------------------------------
# The rescheduler's simulation
# ---------------------------------------------------------------------------------------------


def test_the_reschedulers_view_never_moves_a_pod_into_reserved_room() -> None:
    from services.rescheduler.view import build_view

    web = f.pods_of(f.job("web", cpu=2000, mem=f.GiB))[0]
    web.spec.node_name, web.status.phase = "n0", pb.POD_BOUND
    nodes = [f.node("n0", cpu=4000), f.node("n1", cpu=4000), f.node("n2", cpu=4000)]
    view = build_view(
        nodes,
        [web],
        [],
        [],
        Framework(Profile(), REGISTRY),
        reservations=[
            f.reservation("keep", "n1", job="train", cpu=3000),
            f.reservation("later", "", job="train", cpu=4000),  # pending: holds nothing
        ],
    )
    assert view.nodes["n1"].requested["g"][0] == 3000
    assert view.nodes["n2"].requested["g"][0] == 0
    refused = view.fits("web-0", "n1")
    assert refused is not None and "insufficient cpu" in refused.reasons
    assert view.fits("web-0", "n2") is None
    assert [p.name for p in view.pods_on("n1")] == []  # a hold is room, never a pod to move


# ---------------------------------------------------------------------------------------------
# Preemption: a hold is never a victim
# ---------------------------------------------------------------------------------------------


def test_a_preemptor_evicts_pods_never_a_hold() -> None:
    """Node a: a hold of 2000m and a low-priority pod of 2000m; node b: a hold of 4000m. A
    high-priority pod of 4000m finds no node: evicting the pod frees only half of a, and
    nothing on b may go. One of 2000m evicts the pod on a, and the hold stays."""
    from tests.test_scheduler_preemption import build, preemptor_unit, running

    def setup() -> tuple[SchedulerCache, Snapshot, UnitScheduler]:
        cache, _, sched, _ = build(
            [f.node("a", cpu=4000, mem=64 * f.GiB), f.node("b", cpu=4000, mem=64 * f.GiB)],
            [running("l0", "a", cpu=2000)],
            Profile(),
            "godel",
        )
        cache.on_add("Reservation", f.reservation("ra", "a", job="train", cpu=2000, mem=f.GiB))
        cache.on_add("Reservation", f.reservation("rb", "b", job="train", cpu=4000, mem=f.GiB))
        snap = Snapshot()
        snap.update(cache)
        return cache, snap, sched

    _, snap, sched = setup()
    big = sched.schedule(preemptor_unit("p", 1, 4000), snap)
    assert big.placements == [] and not big.success
    _, snap, sched = setup()
    small = sched.schedule(preemptor_unit("q", 1, 2000), snap)
    assert [(p.pod, p.node, list(p.victims)) for p in small.placements] == [("q-0", "a", ["l0"])]
    assert hold_name("ra") in snap.infos["a"].pods


# ---------------------------------------------------------------------------------------------
# The Binder's sweep of pending reservations (services/binder/reserve.py), as a plan
# ---------------------------------------------------------------------------------------------


def _pending(name: str, node: str, cpu: int, created: int, message: str = "") -> pb.Reservation:
    rsv = f.reservation(name, node, job="train", cpu=cpu)
    rsv.status.phase, rsv.status.node, rsv.status.message = pb.RESERVATION_PENDING, "", message
    rsv.metadata.creation_timestamp_ms = created
    return rsv


SWEEP_CASES = [
    # (id, pending reservations, reserved after the sweep, waiting messages written)
    ("fits", [_pending("a", "n1", 1000, 1)], ["a"], {}),
    ("oldest first, then no room", [_pending("b", "n1", 3000, 2), _pending("a", "n1", 2000, 1)],
     ["a"], {"b": "waiting: no room on node 'n1' yet: insufficient cpu"}),
    ("beside the bound pod", [_pending("a", "n1", 3500, 1)], [],
     {"a": "waiting: no room on node 'n1' yet: insufficient cpu"}),
    ("missing node", [_pending("a", "gone", 100, 1)], [],
     {"a": "waiting: node 'gone' does not exist"}),
    ("not ready", [_pending("a", "down", 100, 1)], [], {"a": "waiting: node 'down' is not ready"}),
    ("reason unchanged: no write",
     [_pending("a", "gone", 100, 1, "waiting: node 'gone' does not exist")], [], {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("waiting", "reserved", "messages"),
    [c[1:] for c in SWEEP_CASES],
    ids=[c[0] for c in SWEEP_CASES],
)
def test_the_binders_sweep_reserves_what_fits_and_says_why_the_rest_waits(
    waiting: list[pb.Reservation], reserved: list[str], messages: dict[str, str]
) -> None:
    from services.binder.reserve import plan
    from services.binder.state import ClusterState
    from store.client import Update

    state = ClusterState()
    down = f.node("down")
    down.status.ready = False
    for nd in (f.node("n1", cpu=4000), down):
        state.on_add("Node", nd)
    bound = pod("web")  # 1000m on n1
    bound.spec.node_name, bound.status.phase = "n1", pb.POD_BOUND
    state.on_add("Pod", bound)
    for rsv in waiting:
        state.on_add("Reservation", rsv)
    ops, done = plan(state)
    assert [r.metadata.name for r in done] == reserved
    assert all(r.status.node == r.spec.node for r in done)
    written = {
        op.obj.metadata.name: op.obj.status.message
        for op in ops
        if isinstance(op, Update)
        and isinstance(op.obj, pb.Reservation)
        and op.obj.status.phase == pb.RESERVATION_PENDING
    }
    assert written == messages


def test_a_job_takes_each_of_its_holds_on_one_node_once() -> None:
    """Four holds of 1 CPU for the job on a 4-CPU node: its four pods take one each, in one
    search (each pod's filters lent the hold it takes, which the ones after it no longer see)."""
    holds = [f.reservation(f"r{i}", "n1", job="train", cpu=1000) for i in range(4)]
    cache, snap = shard_view(*holds, nodes=3)
    placed = search().schedule(unit(cache, "train", 4, 1000), snap)
    assert sorted((p.pod, p.node) for p in placed.placements) == [
        (f"train-{i}", "n1") for i in range(4)
    ]
    info = snap.infos["n1"]
    assert info.requested["g"][0] == 4000 and not [n for n in info.pods if n.startswith("r")]
    assert not any(name.startswith("reservation:") for name in info.pods)


def test_a_gang_that_fails_gives_its_holds_back() -> None:
    """A gang of five on that node and nowhere else (the rest full): four fit their holds, the
    fifth nothing, so none is placed and every hold is back on the node."""
    holds = [f.reservation(f"r{i}", "n0", job="train", cpu=1000) for i in range(4)]
    cache, snap = shard_view(*holds, nodes=1)
    pods = f.pods_of(f.job("train", replicas=5, min_member=5, cpu=1000, mem=f.GiB))
    gang = UnitInfo(
        "train", 5, 0, 0, [cache.reservations.own(PodInfo.from_pod(p), p) for p in pods]
    )
    result = search().schedule(gang, snap)
    assert result.placements == [] and not result.success
    assert sorted(snap.infos["n0"].pods) == [hold_name(f"r{i}") for i in range(4)]


def test_the_shards_cache_takes_a_hold_off_its_node_while_its_owner_is_assumed_there() -> None:
    """A placement that took a hold is assumed in the shard's cache until the Binder's commit
    (the bind, consuming the reservation) comes back: meanwhile the node counts the pod, not
    the pod and its room twice, so the next unit sees the room the plan left. A refusal gives
    the hold back (still live: its owner's next pod may take it)."""
    holds = [f.reservation(f"r{i}", "n0", job="train", cpu=1000) for i in range(2)]
    cache, snap = shard_view(*holds, nodes=1)
    [first] = search().schedule(unit(cache, "train", 1, 1000), snap).placements
    assert first.hold == hold_name("r0")
    req = PodRequest.from_pod(pod("train"))
    assert cache.assume(req, "n0", hold=first.hold)
    info = cache.nodes["n0"]
    assert info.requested["g"][0] == 2000  # the pod and the other hold, not 3000
    assert sorted(info.pods) == [hold_name("r1"), "train-0"]
    cache.forget("train-0")  # the Binder refused it
    assert sorted(info.pods) == [hold_name("r0"), hold_name("r1")]
    assert info.requested["g"][0] == 2000


def test_each_pod_tries_its_own_holds_node_before_a_siblings() -> None:
    """A Movement recommends n2 and n1 for the job, and each pod of it has a hold of its own
    (train-0 on n2, train-1 on n1). The unit's preferred nodes list n2 first, and n2 has room to
    spare once train-0 took its hold: still train-1 goes to its own hold on n1, not to n2 (which
    would leave n1's hold unused and put more of the job on n2 than recommended)."""
    holds = [
        f.reservation("r0", "n2", job="train", index=0, cpu=1000),
        f.reservation("r1", "n1", job="train", index=1, cpu=1000),
    ]
    cache, snap = shard_view(*holds, nodes=3)
    job = unit(cache, "train", 2, 1000)
    job.preferred[:] = [("n2", "mv"), ("n1", "mv")]
    placed = search().schedule(job, snap).placements
    assert sorted((p.pod, p.node, p.hold) for p in placed) == [
        ("train-0", "n2", hold_name("r0")),
        ("train-1", "n1", hold_name("r1")),
    ]
