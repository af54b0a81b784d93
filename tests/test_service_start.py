"""``bench.service_start``: each kind's start over a filled store, in-process."""

from __future__ import annotations

import asyncio
import time

from bench import binder_takeover, memory, service_start
from protos.godel.v1 import objects_pb2 as pb
from services.nodeagent.nodes import Shape, hollow_nodes
from store import Store


async def test_a_dispatcher_start_leaves_the_filled_pods_running(
    store: Store, store_url: str, cluster_name: str
) -> None:
    """Nothing heartbeats the filled nodes: the dispatcher started over them judges none lost
    (it would fail their pods in the store, and every start after it, of any kind, would list
    failed pods instead of the state filled)."""
    stale_ms = int(time.time() * 1000) - 600_000  # heartbeats long past the default grace
    nodes = hollow_nodes(
        4, prefix="hollow", agent="nodeagent-0", shape=Shape(), labels={}, taints=(), now=stale_ms
    )
    await store.create_many([*nodes, *memory._jobs_and_pods(1, 8, 4, stale_ms)])
    result = await service_start.start("dispatcher", store_url, cluster_name, "")
    assert result["cpu_s"] > 0
    pods, _ = await store.list_all(pb.Pod)
    assert len(pods) == 8
    assert {pb.PodPhase.Name(p.status.phase) for p in pods} == {"POD_RUNNING"}


async def test_a_dispatcher_process_is_timed_to_its_first_serving_answer(
    store: Store, store_url: str, cluster_name: str
) -> None:
    """``--process``: the dispatcher started as a process of its own over the filled store,
    timed from its spawn to a health check answering SERVING, with its CPU by then and the
    seconds to each start-up log line (its listing's fetch and build among them); the filled
    pods are left running."""
    now_ms = int(time.time() * 1000)
    nodes = hollow_nodes(
        4, prefix="hollow", agent="nodeagent-0", shape=Shape(), labels={}, taints=(), now=now_ms
    )
    await store.create_many([*nodes, *memory._jobs_and_pods(2, 8, 4, now_ms)])
    result = await asyncio.to_thread(
        service_start.start_process, "dispatcher", store_url, cluster_name
    )
    marks = result["marks"]
    assert set(marks) == set(service_start.MARKS)
    assert 0 < marks["starting"] < marks["informer listed"] <= marks["serving"] <= result["wall_s"]
    assert result["cpu_s"] > 0 and result["fetch_s"] >= 0 and result["build_s"] >= 0
    pods, _ = await store.list_all(pb.Pod)
    assert len(pods) == 16
    assert {pb.PodPhase.Name(p.status.phase) for p in pods} == {"POD_RUNNING"}


async def test_the_binder_takeover_bench_times_a_standby_binding_after_the_leaders_kill(
    store: Store, store_url: str, cluster_name: str
) -> None:
    """``bench.binder_takeover``'s round over a small filled store: two Binder processes, the
    leader killed with SIGKILL, and the standby answering the probe pod's decision BOUND, as
    leader."""
    now_ms = int(time.time() * 1000)
    nodes = hollow_nodes(
        2, prefix="hollow", agent="nodeagent-0", shape=Shape(), labels={}, taints=(), now=now_ms
    )
    await store.create_many([*nodes, *memory._jobs_and_pods(1, 4, 2, now_ms)])
    result = await asyncio.to_thread(binder_takeover.round_once, store_url, cluster_name, 0)
    assert result["verdict"] == "BOUND" and result["leads"] == "SERVING", result
    assert isinstance(result["bound_s"], float) and result["bound_s"] > 0
    pods, _ = await store.list_all(pb.Pod)
    [probe] = [p for p in pods if p.spec.job.startswith("takeover-")]
    assert probe.spec.node_name == "hollow-0"


async def test_a_node_agent_start_resumes_the_filled_pods(
    store: Store, store_url: str, cluster_name: str
) -> None:
    """The node agent starts as the agent of every filled node (``bench.memory``'s), resuming
    their running pods: they stay running, and it keeps a run of each."""
    now_ms = int(time.time() * 1000)
    nodes = hollow_nodes(
        4, prefix="hollow", agent="nodeagent-0", shape=Shape(), labels={}, taints=(), now=now_ms
    )
    await store.create_many([*nodes, *memory._jobs_and_pods(1, 8, 4, now_ms)])
    result = await service_start.start("nodeagent", store_url, cluster_name, "", nodes=4)
    assert result["cpu_s"] > 0
    pods, _ = await store.list_all(pb.Pod)
    assert {pb.PodPhase.Name(p.status.phase) for p in pods} == {"POD_RUNNING"}
    listed, _ = await store.list_all(pb.Node)
    assert {n.spec.agent for n in listed} == {"nodeagent-0"}
