"""A job's kept room (``spec.reservation``): which leaving pods leave their room as a Reservation
for their replacement (reason × job setting × node alive, on the one eviction path), what that
reservation holds, and — through a real Evict RPC to a real Binder on a real store — that it is
created Reserved in the commit that evicts the pod and counts in the Binder's view at once: a
pod of another job decided right after cannot take the room, the replacement can (and its bind
consumes it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from godel.client import job as sdk_job
from godel.manifest import ManifestError, parse_document
from protos.godel.v1 import api_pb2
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.binder.config import BinderConfig
from services.eviction import (
    DRAINED,
    KEPT_FROM_ANNOTATION,
    NODE_LOST,
    PREEMPTED,
    RECLAIMED,
    RESCHEDULED,
    Eviction,
    EvictionOps,
)
from services.runtime.service import ServiceHost
from store import Store
from store.client import Create, Release
from tests import factories as f
from tests.dispatcher_harness import dispatcher_config, run_dispatcher
from tests.test_binder import Shard, audit, binder, eventually, evict, shard, submit, unit

__all__ = ["audit", "binder", "shard"]  # the fixtures, shared with the Binder's tests

V = ipb.VerdictCode


def _job(keep_ttl: int | None, *, deleting: bool = False) -> pb.Job:
    job = f.job("web", replicas=2, cpu=1500)
    if keep_ttl is not None:
        job.spec.reservation.ttl_seconds = keep_ttl
    if deleting:
        job.metadata.deletion_timestamp_ms = 1
    return job


def _bound_pod(job: pb.Job, index: int = 1) -> pb.Pod:
    pod = f.pods_of(job)[index]
    pod.metadata.owner = "team-a"
    pod.spec.node_name = "n1"
    pod.spec.numa_nodes.append(0)
    pod.status.phase = pb.POD_RUNNING
    return pod


def _ops(job: pb.Job, reason: str, node_ready: bool, *, always_replace: bool = True) -> EvictionOps:
    pod = _bound_pod(job)
    ops = EvictionOps(
        {"web": job}.get,
        lambda _: [pod.metadata.name],
        always_replace=always_replace,
        node_ready=lambda name: name == "n1" and node_ready,
    )
    ops.add(Eviction(pod, reason, "gone"), now_ms=1_000)
    return ops


# (case, reason, job's keep TTL (None: unset), node alive, room kept)
KEEPS = [
    ("drained, asked, node alive", DRAINED, 60, True, True),
    ("a client's eviction, asked", "Evicted", 60, True, True),
    ("drained, not asked", DRAINED, None, True, False),
    ("drained, node not ready", DRAINED, 60, False, False),
    ("preempted: the preemptor takes the room", PREEMPTED, 60, True, False),
    ("reclaimed: the room is for another queue", RECLAIMED, 60, True, False),
    ("rescheduled: the move leaves the node", RESCHEDULED, 60, True, False),
    ("node lost", NODE_LOST, 60, True, False),
]


@pytest.mark.parametrize(
    ("reason", "ttl", "node_ready", "kept"), [c[1:] for c in KEEPS], ids=[c[0] for c in KEEPS]
)
def test_which_leaving_pods_keep_their_room(
    reason: str, ttl: int | None, node_ready: bool, kept: bool
) -> None:
    ops = _ops(_job(ttl), reason, node_ready)
    reservations = [
        op.obj for op in ops.ops if isinstance(op, Create) and isinstance(op.obj, pb.Reservation)
    ]
    assert [r.metadata.name for r in reservations] == (["web-1-r1"] if kept else [])
    assert ops.kept == reservations
    # The pod is evicted and replaced either way.
    assert [type(op).__name__ for op in ops.ops[:2]] == ["Release", "Create"]
    assert isinstance(ops.ops[0], Release) and ops.ops[0].pod.status.reason == reason


def test_a_job_being_deleted_keeps_nothing() -> None:
    ops = _ops(_job(60, deleting=True), DRAINED, True)
    assert ops.kept == [] and [type(op).__name__ for op in ops.ops] == ["Release"]


def test_a_caller_that_cannot_tell_a_live_node_keeps_nothing() -> None:
    job = _job(60)
    pod = _bound_pod(job)
    ops = EvictionOps({"web": job}.get, lambda _: [pod.metadata.name], always_replace=True)
    ops.add(Eviction(pod, DRAINED, "gone"), now_ms=1_000)
    assert ops.kept == []


def test_a_name_already_taken_by_a_reservation_keeps_nothing_rather_than_failing() -> None:
    job = _job(60)
    pod = _bound_pod(job)
    ops = EvictionOps(
        {"web": job}.get,
        lambda _: [pod.metadata.name],
        always_replace=True,
        node_ready=lambda _: True,
        reservation_exists=lambda name: name == "web-1-r1",
    )
    ops.add(Eviction(pod, DRAINED, "gone"), now_ms=1_000)
    assert ops.kept == [] and [type(op).__name__ for op in ops.ops] == ["Release", "Create"]


def test_the_kept_room_is_the_pods_own_room_reserved_for_its_index() -> None:
    [rsv] = _ops(_job(60), DRAINED, True).kept
    assert rsv.metadata.name == "web-1-r1"  # the replacement's name
    assert rsv.metadata.owner == "team-a"  # the pod's tenant
    assert rsv.metadata.annotations[KEPT_FROM_ANNOTATION] == "web-1"
    assert (rsv.spec.owner.job, rsv.spec.owner.index) == ("web", 1)
    assert rsv.spec.owner.HasField("index")
    assert (rsv.spec.node, rsv.spec.ttl_seconds, rsv.spec.qos) == ("n1", 60, pb.QOS_GUARANTEED)
    assert rsv.spec.template.requests.milli_cpu == 1500
    assert (rsv.status.phase, rsv.status.node) == (pb.RESERVATION_RESERVED, "n1")
    assert list(rsv.status.numa_nodes) == [0]


async def test_an_evicted_pods_room_is_kept_in_the_evicting_commit_for_its_replacement(
    store: Store, binder: ServiceHost[BinderConfig], shard: Shard
) -> None:
    await store.create(f.node("n1", cpu=2000))
    web = _job(60)
    web.spec.replicas = 1
    web_pods = await submit(store, web)
    bound = await shard.decide(unit(web, web_pods, [("web-0", "n1")]))
    assert bound["web-0"].code == V.BOUND
    pod = await store.get(pb.Pod, "web-0")

    results = await evict(binder.address, [pod], reason=DRAINED)
    replacement = results["web-0"].replacement
    assert replacement == "web-0-r1"
    rsv = await store.get(pb.Reservation, replacement)
    assert (rsv.status.phase, rsv.status.node) == (pb.RESERVATION_RESERVED, "n1")
    assert (rsv.spec.owner.job, rsv.spec.owner.index, rsv.spec.ttl_seconds) == ("web", 0, 60)

    # Decided right after the eviction answers: another job's pod cannot take the kept room,
    # the replacement takes it and its bind consumes the reservation.
    other = f.job("other", cpu=1500)
    other_pods = await submit(store, other)
    refused = await shard.decide(unit(other, other_pods, [("other-0", "n1")]))
    assert refused["other-0"].code == V.CONFLICT, refused["other-0"].reason
    new = {replacement: await store.get(pb.Pod, replacement)}
    taken = await shard.decide(unit(web, new, [(replacement, "n1")]))
    assert taken[replacement].code == V.BOUND, taken[replacement].reason
    assert await store.get_many(pb.Reservation, [replacement]) == [None]
    assert (await store.get(pb.Pod, replacement)).spec.node_name == "n1"

    async def held_event() -> bool:
        events, _ = await store.list_all(pb.Event)
        return any(
            e.reason == "ReservationHeld"
            and e.regarding.name == replacement
            and "keeping the room of pod 'web-0'" in e.message
            for e in events
        )

    await eventually(held_event, what="the ReservationHeld event of the kept room")


# --------------------------------------------------------------------------------------------
# Validation: through the manifest and the dispatcher's API
# --------------------------------------------------------------------------------------------


def test_a_manifest_asks_its_room_kept_under_spec() -> None:
    spec: dict[str, object] = {
        "replicas": 1,
        "reservation": {"ttlSeconds": 60},
        "template": {"requests": {"cpu": "1"}},
    }
    doc = {"apiVersion": "godel/v1", "kind": "Job", "metadata": {"name": "web"}, "spec": spec}
    job = parse_document(doc, "m.yaml").obj
    assert isinstance(job, pb.Job) and job.spec.reservation.ttl_seconds == 60
    sdk = sdk_job("web", cpu="1", memory="1Gi", keep_room_seconds=60).to_proto()
    assert sdk.spec.reservation.ttl_seconds == 60
    spec["reservation"] = {"ttlSeconds": "soon"}
    with pytest.raises(ManifestError, match="ttlSeconds"):
        parse_document(doc, "m.yaml")


async def test_a_kept_room_ttl_must_be_positive_naming_the_field_and_nothing_is_stored(
    store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    async with run_dispatcher(dispatcher_config(store_url, cluster_name, tmp_path)) as d:
        for bad in (0, -5):
            reply = await d.api.Submit(api_pb2.SubmitRequest(jobs=[_job(bad)]))
            [violation] = reply.results[0].violations
            assert violation.field == "jobs[0].spec.reservation.ttl_seconds"
            assert f"reservation.ttlSeconds must be a positive integer (got {bad})" in (
                violation.description
            )
        assert not (await d.api.List(api_pb2.ListRequest(kind="Job"))).items
        good = await d.api.Submit(api_pb2.SubmitRequest(jobs=[_job(30)]))
        assert not good.results[0].violations
        # Applied over the stored job: refused the same, the stored one unchanged.
        applied = await d.api.Apply(api_pb2.ApplyRequest(objects=[api_pb2.Object(job=_job(-1))]))
        [result] = applied.results
        assert result.action == "invalid"
        assert result.violations[0].field == "objects[0].job.spec.reservation.ttl_seconds"
        got = await d.api.Get(api_pb2.GetRequest(kind="Job", name="web"))
        assert got.job.spec.reservation.ttl_seconds == 30
