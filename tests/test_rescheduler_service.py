"""The rescheduler in-process against a real store: what its informer keeps of the pods (those
of GPU nodes, for the GPU figures) and what a round's view reads (every pod, listed from the
store when the round starts)."""

from __future__ import annotations

from pathlib import Path

from protos.godel.v1 import objects_pb2 as pb
from services.rescheduler.service import ReschedulerConfig, ReschedulerService
from services.runtime import ServiceHost
from store import Store
from tests.factories import GiB, gpu_job, gpu_node, job, node, pods_of


async def bind(store: Store, j: pb.Job, node_name: str) -> list[str]:
    pods = pods_of(j)
    for p in pods:
        p.spec.node_name, p.status.phase = node_name, pb.POD_RUNNING
    await store.create_unit(j, pods)
    return [p.metadata.name for p in pods]


def _config(store_url: str, cluster_name: str, tmp_path: Path) -> ReschedulerConfig:
    return ReschedulerConfig(
        name="rescheduler-0",
        port=0,
        metrics_port=-1,
        store_url=store_url,
        cluster=cluster_name,
        home=tmp_path,
        insecure=True,
    )


async def test_a_rescheduler_keeps_gpu_nodes_pods_only_and_a_round_reads_every_pod(
    store: Store, store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    await store.create(gpu_node("g0", cards=2, cpu=16000, mem=64 * GiB))
    await store.create(node("c0", cpu=16000, mem=64 * GiB))
    on_gpu = await bind(store, gpu_job(job("trainer", replicas=2, cpu=1000, mem=GiB)), "g0")
    on_cpu = await bind(store, job("web", replicas=3, cpu=1000, mem=GiB), "c0")
    config = _config(store_url, cluster_name, tmp_path)
    async with ServiceHost(ReschedulerService, config) as host:
        rescheduler = host.service
        assert isinstance(rescheduler, ReschedulerService)
        assert set(rescheduler.informer.names("Pod")) == set(on_gpu)  # not the CPU node's
        view = await rescheduler._fresh_view({})
        assert set(view.pods) == {*on_gpu, *on_cpu}
        later = await bind(store, job("late", cpu=1000, mem=GiB), "c0")
        view = await rescheduler._fresh_view({})  # the next round lists again
        assert set(view.pods) == {*on_gpu, *on_cpu, *later}
        assert len(view.nodes["c0"].pods) == 4  # accounted on its node
        figures = await rescheduler.refresh_gpu_figures()  # from the pods it keeps
        assert figures.whole_free_nodes == 0
        assert set(rescheduler.informer.names("Pod")) == set(on_gpu)


async def test_a_rescheduler_decodes_no_pod_change_while_no_node_has_gpus(
    store: Store, store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    """Between rounds the informer skips every pod change, before decoding it, while no node
    has GPUs; a GPU node and the pods bound to it read in the same batch of the feed are still
    kept, and counted in the GPU figures; a pod kept is followed to its deletion even once no
    node has GPUs; a round still reads every pod."""
    await store.create(node("c0", cpu=16000, mem=64 * GiB))
    async with ServiceHost(ReschedulerService, _config(store_url, cluster_name, tmp_path)) as host:
        rescheduler = host.service
        assert isinstance(rescheduler, ReschedulerService)
        informer = rescheduler.informer

        async def caught_up() -> None:
            await informer.wait_for_revision(await store.revision(), 30)

        unread = informer.unread
        on_cpu = await bind(store, job("web", replicas=3, cpu=1000, mem=GiB), "c0")
        await caught_up()
        assert informer.unread == unread + 3  # the three pods' creations, never decoded
        assert informer.names("Pod") == ()
        view = await rescheduler._fresh_view({})
        assert set(view.pods) == set(on_cpu)

        # The GPU node and its pod in one read of the feed: the informer stopped meanwhile
        # resumes where it stopped.
        await informer.stop()
        await store.create(gpu_node("g0", cards=2, cpu=16000, mem=64 * GiB))
        on_gpu = await bind(store, gpu_job(job("trainer", cpu=1000, mem=GiB)), "g0")
        more_on_cpu = await bind(store, job("api", cpu=1000, mem=GiB), "c0")
        unread = informer.unread
        informer.start()
        await caught_up()
        assert informer.unread == unread
        assert set(informer.names("Pod")) == set(on_gpu)  # not the CPU node's
        figures = await rescheduler.refresh_gpu_figures()
        assert (figures.whole_free_nodes, figures.free_milli) == (0, 1000)  # one card in use
        view = await rescheduler._fresh_view({})
        assert set(view.pods) == {*on_cpu, *more_on_cpu, *on_gpu}

        await store.delete(pb.Node, "g0")
        await caught_up()
        unread = informer.unread
        await store.delete(pb.Pod, on_cpu[0])  # not kept: skipped
        await store.delete(pb.Pod, on_gpu[0])  # kept: followed to its deletion
        await caught_up()
        assert informer.unread == unread + 1
        assert informer.names("Pod") == ()
