"""A node agent keeps no bytes of a hollow pod (issue 34: its memory per bound pod), only its
run's record and its usage record, yet runs it as before: the pod goes Running, finishes on
time, stops when deleted, and its node's measured load follows it — after a restart too."""

from __future__ import annotations

from pathlib import Path

from protos.godel.v1 import objects_pb2 as pb
from services.nodeagent.nodes import HOLLOW
from services.nodeagent.runner import PodRunner
from services.nodeagent.service import NodeAgentConfig, NodeAgentService
from services.runtime.service import ServiceHost
from store import Store
from tests import factories as f
from tests.test_nodeagent import agent_config, eventually, phases, submit_and_bind

NODE = "rec-0"


def _agent(host: ServiceHost[NodeAgentConfig]) -> NodeAgentService:
    agent = host.service
    assert isinstance(agent, NodeAgentService)
    return agent


def _keeps_no_bytes_of(agent: NodeAgentService, running: list[str]) -> None:
    informer = agent.informer
    for name in running:
        assert informer.get("Pod", name) is None, f"{name}: the informer keeps its bytes"
        assert informer.encoded("Pod", name) is None
        assert informer.knows("Pod", name), f"{name}: the informer forgot it exists"
        run = agent.runner.runs[name]
        assert getattr(run, "encoded", None) is None, f"{name}: its run keeps its bytes"
    assert informer.count("Pod") == 0


async def _pods_use(store: Store, milli_cpu: int) -> bool:
    load = (await store.node_loads()).get(NODE)
    return load is not None and load.pods_milli_cpu == milli_cpu


async def test_hollow_pods_run_finish_and_count_with_no_bytes_kept(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=1, node_prefix="rec")
    async with ServiceHost(NodeAgentService, cfg) as host:
        agent = _agent(host)
        long = [
            p.metadata.name
            for p in await submit_and_bind(store, f.job("long", replicas=2, cpu=1000), [NODE])
        ]
        short_job = f.job("short", replicas=1, cpu=500)
        short_job.spec.template.duration_ms = 1500
        short = [p.metadata.name for p in await submit_and_bind(store, short_job, [NODE])]

        async def long_running_short_done() -> bool:
            return await phases(store, long) == [pb.POD_RUNNING] * 2 and await phases(
                store, short
            ) == [pb.POD_SUCCEEDED]

        await eventually(long_running_short_done, what="long pods running, the short one done")
        finished = (await store.get(pb.Pod, short[0])).status
        assert finished.reason == "Completed" and finished.started_ms
        assert finished.finished_ms - finished.started_ms >= 1500
        _keeps_no_bytes_of(agent, long)
        await eventually(lambda: _pods_use(store, 2000), what="the node's load: two pods")

        await store.delete(pb.Pod, long[0])

        async def stopped() -> bool:
            return long[0] not in agent.runner.runs and not agent.informer.knows("Pod", long[0])

        await eventually(stopped, what="the deleted pod stopped and forgotten")
        await eventually(lambda: _pods_use(store, 1000), what="the node's load: one pod")
    # A restarted agent resumes the running pod from its listing, keeping no bytes of it.
    async with ServiceHost(NodeAgentService, cfg) as host:
        agent = _agent(host)
        _keeps_no_bytes_of(agent, long[1:])
        await eventually(lambda: _pods_use(store, 1000), what="the resumed pod's load")
        await store.delete(pb.Pod, long[1])
        await eventually(lambda: _pods_use(store, 0), what="no pod left on the node")
        assert await phases(store, long[1:]) == [-1]


async def test_the_tide_counts_online_pods_it_keeps_no_bytes_of(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """With ``--tidal`` too the agent keeps no bytes of a hollow pod; a node's reclaimable pool
    still follows its guaranteed pods (their requests summed from the records): 8 CPUs less the
    10 % reserve less the 6 CPUs an online pod requests, and all of it back once it is gone."""
    cfg = agent_config(
        store_url,
        store.cluster,
        tmp_path,
        hollow_nodes=1,
        node_prefix="rec",
        hollow_cpu_milli=8000,
        tidal=True,
        tidal_interval_seconds=0.1,
        tidal_reserve_percent=10,
    )

    async def pool_is(milli_cpu: int) -> bool:
        node = await store.get(pb.Node, NODE)
        return node.status.reclaimable.milli_cpu == milli_cpu

    async with ServiceHost(NodeAgentService, cfg) as host:
        agent = _agent(host)
        await eventually(lambda: pool_is(7200), what="the empty node's pool")
        online = await submit_and_bind(store, f.job("online", replicas=1, cpu=6000), [NODE])
        name = online[0].metadata.name
        await eventually(lambda: pool_is(1200), what="the pool less the online pod")
        _keeps_no_bytes_of(agent, [name])
        await store.delete(pb.Pod, name)
        await eventually(lambda: pool_is(7200), what="the pool back")


async def test_a_pod_created_again_under_its_name_is_run_afresh(
    store: Store, tmp_path: Path
) -> None:
    """A run keeps its pod's uid as a hash, not the pod: a pod deleted and created again under
    the same name between two events (a relist merges them into one update) still ends the old
    run and starts the new pod's."""
    runner = PodRunner(store, {NODE: HOLLOW}, tmp_path)

    def bound(uid: str, version: int) -> pb.Pod:
        pod = pb.Pod(metadata=pb.ObjectMeta(name="again-0", uid=uid, resource_version=version))
        pod.spec.node_name, pod.status.phase = NODE, pb.POD_BOUND
        pod.spec.template.duration_ms = 60_000
        return pod

    first, second = bound("uid-first", 5), bound("uid-second", 9)
    runner.observe(first)
    old = runner.runs["again-0"]
    assert old.runs(first) and old.timer is not None
    runner.observe(second)
    new = runner.runs["again-0"]
    assert new is not old and new.runs(second) and not new.runs(first)
    assert old.timer is None  # the old run's timer cancelled
    assert runner.pending["again-0"].phase == pb.POD_RUNNING
    if new.timer is not None:
        new.timer.cancel()
