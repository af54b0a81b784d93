"""The dispatcher keeps no bytes of a pod on a node (issue 34: its memory per bound pod), only a
record of it — its claim in the quota ledger while bound or running, a record in the pod index
once finished — yet everything that reads pods answers as before: Get and List of pods (read
from the store, whole), job status, queue usage, a lost node's pods failed."""

from __future__ import annotations

import time
from pathlib import Path

from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from store import Store
from store.client import Bind
from tests import factories as f
from tests.dispatcher_harness import dispatcher_config, eventually, run_dispatcher


async def _bound(
    store: Store, job: pb.Job, node: str, phase: pb.PodPhase.ValueType, owner: str = ""
) -> None:
    """The job stored with its pods bound to ``node`` (by the Binder's commit), then in
    ``phase`` (as the node agent writes it)."""
    pods = f.pods_of(job)
    for p in pods:
        p.spec.queue = job.spec.queue
        p.metadata.owner = owner
    await store.create_unit(job, pods)
    for p in pods:
        bound = await store.get(pb.Pod, p.metadata.name)
        bound.spec.node_name, bound.status.phase = node, pb.POD_BOUND
        await store.commit([Bind(bound)])
        if phase != pb.POD_BOUND:
            now = await store.get(pb.Pod, p.metadata.name)
            now.status.phase = phase
            now.status.started_ms = int(time.time() * 1000)
            if phase in (pb.POD_SUCCEEDED, pb.POD_FAILED):
                now.status.finished_ms = now.status.started_ms
            await store.update(now)


async def test_the_dispatcher_keeps_no_bytes_of_pods_on_nodes_yet_answers_as_before(
    store: Store, store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    now = int(time.time() * 1000)
    managed = f.node("n1")  # an agent's node: stamped now, lost once its stamps stop
    managed.spec.agent = "agent-0"
    managed.status.heartbeat_ms = now - 60_000
    await store.create(managed)
    await store.record_heartbeats(["n1"])
    await store.create(f.node("n2"))  # no agent, never heartbeated: not under management
    team = pb.Queue(metadata=pb.ObjectMeta(name="team"))
    team.spec.quota.milli_cpu = 2000
    await store.create(team)
    web = f.job("web", replicas=2, cpu=400)
    web.spec.queue = "team"
    web.spec.template.labels["app"] = "web"
    await _bound(store, web, "n1", pb.POD_RUNNING, owner="alice")
    solo = f.job("solo", cpu=100)
    solo.spec.queue = "team"
    await _bound(store, solo, "n2", pb.POD_SUCCEEDED, owner="alice")
    flaky = f.job("flaky", cpu=100)
    flaky.spec.backoff_limit = 3
    await _bound(store, flaky, "n2", pb.POD_FAILED)

    config = dispatcher_config(store_url, cluster_name, tmp_path, controller_interval_seconds=0.1)
    async with run_dispatcher(config) as running:
        service, api = running.service, running.api
        # Listed at its start: no bytes of a pod on a node, running or finished; known all
        # the same (its claim, its record).
        for name in ("web-0", "web-1", "solo-0", "flaky-0"):
            assert service.informer.get("Pod", name) is None
            assert service.informer.knows("Pod", name)
        # What the listing's pods counted for, from their records: a tenant's live pods (its
        # two running, not its finished one), a failed pod's job to retry.
        assert service.api.submitting.tenant_pods.of("alice") == 2
        assert "flaky" in service.job_retry.failing
        await api.Submit(api_pb2.SubmitRequest(jobs=[_in_team(f.job("more", cpu=400))]))
        await eventually(lambda: service.informer.get("Pod", "more-0") is not None)  # pending

        # Get and List give pods whole (from the store), a job's pods by the index.
        got = await api.Get(api_pb2.GetRequest(kind="Pod", name="web-0"))
        assert got.pod.spec.template.requests.milli_cpu == 400
        assert got.pod.metadata.labels["app"] == "web"
        listed = await api.List(api_pb2.ListRequest(kind="Pod", job="web"))
        assert [
            (o.pod.metadata.name, o.pod.spec.template.requests.milli_cpu) for o in listed.items
        ] == [
            ("web-0", 400),
            ("web-1", 400),
        ]
        every = await api.List(api_pb2.ListRequest(kind="Pod"))
        assert [o.pod.metadata.name for o in every.items] == [
            "flaky-0",
            "more-0",
            "solo-0",
            "web-0",
            "web-1",
        ]
        assert all(o.pod.spec.template.requests.milli_cpu for o in every.items)

        # Job status from the records: the job status controller's and a one-pod job's.
        async def phases() -> tuple[int, int, int]:
            web_now = (await api.Get(api_pb2.GetRequest(kind="Job", name="web"))).job.status
            solo_now = (await api.Get(api_pb2.GetRequest(kind="Job", name="solo"))).job.status
            return web_now.phase, web_now.running, solo_now.phase

        async def running_and_done() -> bool:
            return await phases() == (pb.JOB_RUNNING, 2, pb.JOB_SUCCEEDED)

        await eventually(running_and_done, what="web running, solo succeeded")

        # The queue's usage: its bound pods' claims.
        async def used(cpu: int) -> bool:
            queue = (await api.Get(api_pb2.GetRequest(kind="Queue", name="team"))).queue
            return queue.status.used.milli_cpu == cpu

        await eventually(lambda: used(800), what="team using its two running pods")

        # The node stops heartbeating: its pods fail, read whole from the store and written
        # back whole (NodeLost), and the job fails with them.
        await store.forget_heartbeats(["n1"])

        async def lost() -> bool:
            pods = await store.get_many(pb.Pod, ["web-0", "web-1"])
            return all(p is not None and p.status.reason == "NodeLost" for p in pods)

        await eventually(lost, what="the lost node's pods failed")
        for name in ("web-0", "web-1"):
            pod = await store.get(pb.Pod, name)
            assert pod.status.phase == pb.POD_FAILED
            assert pod.spec.template.requests.milli_cpu == 400  # written back whole
            assert pod.metadata.labels["app"] == "web"
            assert service.informer.get("Pod", name) is None  # failed on its node: a record

        async def failed() -> bool:
            web_now = (await api.Get(api_pb2.GetRequest(kind="Job", name="web"))).job.status
            return (web_now.phase, web_now.failed) == (pb.JOB_FAILED, 2)

        await eventually(failed, what="web failed with its pods")
        await eventually(lambda: used(0), what="team's claims returned")


def _in_team(job: pb.Job) -> pb.Job:
    job.spec.queue = "team"
    return job


async def test_a_pods_record_follows_it_from_bind_to_deletion(
    store: Store, store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    """What the dispatcher counts of a pod it keeps as a record — its job's bound pods, its
    tenant's live pods, its queue's usage — follows the pod bound, running, succeeded and
    deleted: each update's pod as it was is the record's outline (``Informer(recall=...)``)."""
    await store.create(f.node("n1"))
    web = f.job("web", replicas=2, cpu=300)
    pods = f.pods_of(web)
    for p in pods:
        p.metadata.owner = "alice"
    await store.create_unit(web, pods)
    config = dispatcher_config(store_url, cluster_name, tmp_path)
    async with run_dispatcher(config) as running:
        service = running.service
        tenants = service.api.submitting.tenant_pods
        feed, queue = service.core.feed, service.core.queue

        async def counted(bound: int, live: int, cpu: int) -> bool:
            await service.informer.wait_for_revision(await store.revision())
            used = queue.bound_usage("default").cpu
            return (feed.bound_pods("web"), tenants.of("alice"), used) == (bound, live, cpu)

        await eventually(lambda: counted(0, 2, 0), what="two pending pods")
        for phase in (pb.POD_BOUND, pb.POD_RUNNING):
            for name in ("web-0", "web-1"):
                pod = await store.get(pb.Pod, name)
                pod.status.phase = phase
                if phase == pb.POD_BOUND:
                    pod.spec.node_name = "n1"
                    await store.commit([Bind(pod)])
                else:
                    await store.update(pod)
            await eventually(lambda: counted(2, 2, 600), what=f"both pods {phase}")
            assert service.informer.get("Pod", "web-0") is None  # its record, not its bytes
        pod = await store.get(pb.Pod, "web-0")
        pod.status.phase = pb.POD_SUCCEEDED
        await store.update(pod)
        await eventually(lambda: counted(2, 1, 300), what="one succeeded: bound, not live")
        await store.delete(pb.Pod, "web-0")
        await eventually(lambda: counted(1, 1, 300), what="the succeeded pod deleted")
        assert service.pods.outlines_of("web")[0].metadata.name == "web-1"
        await store.delete(pb.Pod, "web-1")
        await eventually(lambda: counted(0, 0, 0), what="the running pod deleted")
        assert not service.informer.knows("Pod", "web-1")
