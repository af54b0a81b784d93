"""Reservations end to end, through the public API against real processes (store server,
dispatcher, a scheduler shard, a binder, a node agent with two hollow nodes of one CPU): a
reservation applied ahead of its job holds a node — another job cannot take it — then the owner
job's pod binds there and the reservation is consumed in that commit; a job that asks its room
kept has a pod drained: its room is kept for its replacement — a job submitted meanwhile cannot
take it — and the replacement lands back on the node once it is uncordoned. The fixture audits the
invariants (reserved room included) afterwards."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from protos.godel.v1 import objects_pb2 as pb
from store.lease import holder_name
from tests.e2e.conftest import Cluster, wait_until
from tests.e2e.test_rescheduler_faults import kill9

pytestmark = pytest.mark.e2e

ONE_CPU_NODES = ("nodeagent", ("--hollow-cpu-milli", "1000", "--hollow-memory-bytes", str(4 << 30)))


def job_yaml(name: str, replicas: int, extra: str = "") -> str:
    return (
        f"apiVersion: godel/v1\nkind: Job\nmetadata: {{name: {name}}}\n"
        f"spec: {{replicas: {replicas}, minMember: 1, {extra}"
        "template: {requests: {cpu: '1', memory: 100Mi}}}\n"
    )


def pods(cluster: Cluster, job: str) -> list[pb.Pod]:
    return cluster.client.list("Pod", job=job)  # type: ignore[return-value]


def test_a_reservation_holds_its_node_for_its_owner_and_is_consumed_by_its_bind(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2, service_args=(ONE_CPU_NODES,))
    nodes = wait_until(
        lambda: sorted(n.metadata.name for n in cluster.client.list("Node")) or None,
        what="nodes registered",
    )
    assert len(nodes) == 2
    reserved, free = nodes
    created = cluster.godel(
        "apply",
        "-f",
        "-",
        stdin=(
            "apiVersion: godel/v1\nkind: Reservation\nmetadata: {name: for-train}\n"
            f"spec: {{node: {reserved}, ttlSeconds: 600, owner: {{job: train}},\n"
            "       template: {requests: {cpu: '1', memory: 100Mi}}}\n"
        ),
    )
    assert created.stdout == "reservation/for-train created\n"

    def committed() -> bool:
        listed = cluster.godel("get", "rsv").stdout.splitlines()
        return listed[1].split()[:4] == ["for-train", "Reserved", reserved, "job=train"]

    wait_until(committed, what="the Binder commits the reservation on its node")

    # Another job takes the free node and nothing of the reserved one.
    cluster.godel("apply", "-f", "-", stdin=job_yaml("web", 2))

    def web_settled() -> bool:
        placed = [p for p in pods(cluster, "web") if p.spec.node_name]
        tried = [p for p in pods(cluster, "web") if p.status.HasField("unschedulable")]
        return len(placed) == 1 and len(tried) == 1

    wait_until(web_settled, timeout=120, what="web: one pod placed, the other found no room")
    assert [p.spec.node_name for p in pods(cluster, "web") if p.spec.node_name] == [free]
    assert cluster.client.get("Reservation", "for-train").status.node == reserved

    # The owner's pod binds into the reserved room; its bind consumes the reservation.
    cluster.godel("apply", "-f", "-", stdin=job_yaml("train", 1))
    wait_until(
        lambda: [p.spec.node_name for p in pods(cluster, "train")] == [reserved],
        timeout=120,
        what="train bound on the reserved node",
    )
    assert [r.metadata.name for r in cluster.client.list("Reservation")] == []
    wait_until(
        lambda: any(
            e.reason == "ReservationConsumed" and e.regarding.name == "for-train"
            for e in cluster.client.list("Event")
        ),
        what="the ReservationConsumed event",
    )
    assert [p.spec.node_name for p in pods(cluster, "web") if p.spec.node_name] == [free]


def test_a_drained_pods_room_is_kept_for_its_replacement(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=1, service_args=(ONE_CPU_NODES,))
    [node] = wait_until(
        lambda: [n.metadata.name for n in cluster.client.list("Node")] or None,
        what="the node registered",
    )
    cluster.godel("apply", "-f", "-", stdin=job_yaml("keep", 1, "reservation: {ttlSeconds: 60}, "))
    wait_until(
        lambda: [p.spec.node_name for p in pods(cluster, "keep")] == [node],
        timeout=120,
        what="keep-0 bound",
    )

    # Drained (cordoned, its pod evicted): the pod's room stays, held for its replacement.
    drained = cluster.godel("drain", node, "--timeout", "0", check=False)
    assert "keep-0" in drained.stdout, drained.stdout + drained.stderr
    [kept] = cluster.client.list("Reservation")
    assert isinstance(kept, pb.Reservation)
    assert kept.metadata.name == "keep-0-r1"
    assert (kept.status.phase, kept.status.node) == (pb.RESERVATION_RESERVED, node)
    assert (kept.spec.owner.job, kept.spec.owner.index, kept.spec.ttl_seconds) == ("keep", 0, 60)

    # Another job submitted meanwhile cannot take the room once the node is schedulable again;
    # the replacement lands there and its bind consumes the reservation.
    cluster.godel("apply", "-f", "-", stdin=job_yaml("other", 1))
    cluster.godel("uncordon", node)
    wait_until(
        lambda: (
            {p.metadata.name: p.spec.node_name for p in pods(cluster, "keep")}
            == {"keep-0": node, "keep-0-r1": node}
        ),
        timeout=120,
        what="the replacement bound on the node its room was kept on",
    )
    assert cluster.client.list("Reservation") == []
    wait_until(
        lambda: all(p.status.HasField("unschedulable") for p in pods(cluster, "other")),
        timeout=120,
        what="other tried and found no room",
    )
    assert [p.spec.node_name for p in pods(cluster, "other")] == [""]


def test_a_reservation_without_a_node_is_placed_by_the_shards_and_committed_by_the_binder(
    make_cluster: Callable[..., Cluster],
) -> None:
    """Applied with no node, a reservation goes through a shard's filters to a node that fits
    (not the one whose CPU a pod holds), the Binder commits it Reserved there, its room is
    counted against a job that does not own it, and its owner's pod consumes it; one that fits
    nowhere stays Pending with the shard's reason in `godel describe`. Applied while the only
    shard and the Binder leader are down (kill -9), it is placed once the shard is back, by the
    new leader: nothing lost."""
    cluster = make_cluster(schedulers=1, binders=2, hollow_nodes=2, service_args=(ONE_CPU_NODES,))
    nodes = wait_until(
        lambda: sorted(n.metadata.name for n in cluster.client.list("Node")) or None,
        what="nodes registered",
    )
    assert len(nodes) == 2
    # A pod first takes one node's CPU: the reservation can only fit on the other.
    cluster.godel("apply", "-f", "-", stdin=job_yaml("first", 1))
    [taken] = wait_until(
        lambda: [p.spec.node_name for p in pods(cluster, "first") if p.spec.node_name] or None,
        timeout=120,
        what="first bound",
    )
    [free] = [n for n in nodes if n != taken]
    leader = cluster.run_store(lambda s: s.get_lease("binder"))
    kill9(cluster.component("scheduler-0").pid)
    kill9(cluster.component(holder_name(leader.holder)).pid)
    created = cluster.godel(
        "apply",
        "-f",
        "-",
        stdin=(
            "apiVersion: godel/v1\nkind: Reservation\nmetadata: {name: anywhere}\n"
            "spec: {ttlSeconds: 600, owner: {job: train},\n"
            "       template: {requests: {cpu: '1', memory: 100Mi}}}\n"
        ),
    )
    assert created.stdout == "reservation/anywhere created\n"
    assert cluster.client.get("Reservation", "anywhere").status.phase == pb.RESERVATION_PENDING
    cluster.start_again("scheduler-0")

    def reserved() -> pb.Reservation | None:
        rsv = cluster.client.get("Reservation", "anywhere")
        assert isinstance(rsv, pb.Reservation)
        return rsv if rsv.status.phase == pb.RESERVATION_RESERVED else None

    rsv = wait_until(reserved, timeout=120, what="the shards place the reservation")
    assert (rsv.spec.node, rsv.status.node) == ("", free)
    now = cluster.run_store(lambda s: s.get_lease("binder"))
    assert now.holder != leader.holder and now.epoch > leader.epoch
    wait_until(
        lambda: any(
            e.reason == "ReservationHeld" and e.regarding.name == "anywhere"
            for e in cluster.client.list("Event")
        ),
        what="the ReservationHeld event",
    )

    # A second nodeless reservation fits nowhere: it waits Pending, saying why.
    cluster.godel(
        "apply",
        "-f",
        "-",
        stdin=(
            "apiVersion: godel/v1\nkind: Reservation\nmetadata: {name: nowhere}\n"
            "spec: {ttlSeconds: 600, owner: {job: later},\n"
            "       template: {requests: {cpu: '1', memory: 100Mi}}}\n"
        ),
    )

    def waiting() -> str | None:
        rsv = cluster.client.get("Reservation", "nowhere")
        assert isinstance(rsv, pb.Reservation)
        return rsv.status.message or None

    message = wait_until(waiting, timeout=120, what="the unplaced reservation says why")
    assert message.startswith("not placed yet: 0/2 nodes"), message
    assert "insufficient cpu" in message, message
    described = cluster.godel("describe", "reservation", "nowhere").stdout
    assert "Pending" in described and "insufficient cpu" in described, described

    # Its room counts: a job that does not own it finds no node.
    cluster.godel("apply", "-f", "-", stdin=job_yaml("web", 1))
    wait_until(
        lambda: all(p.status.HasField("unschedulable") for p in pods(cluster, "web")),
        timeout=120,
        what="web tried and found no room",
    )
    assert [p.spec.node_name for p in pods(cluster, "web")] == [""]

    # The owner's pod binds into the reserved room and consumes the reservation.
    cluster.godel("apply", "-f", "-", stdin=job_yaml("train", 1))
    wait_until(
        lambda: [p.spec.node_name for p in pods(cluster, "train")] == [free],
        timeout=120,
        what="train bound on the reserved node",
    )
    assert [r.metadata.name for r in cluster.client.list("Reservation")] == ["nowhere"]
