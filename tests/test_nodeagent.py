"""The node agent: node shapes (table-driven), registration, heartbeats, hollow and process pods,
batched status writes, the Logs RPC, and a graceful stop. Real store, real gRPC on loopback, real
child processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.godel.v1 import api_pb2, api_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services.eviction import PREEMPTED, evicted
from services.nodeagent.isolation import V2, Cgroups, PodCgroup, cgroup_name, parse_pids
from services.nodeagent.nodes import (
    GiB,
    MachineNuma,
    Shape,
    hollow_nodes,
    machine_numa,
    machine_topology,
    parse_cpulist,
    parse_labels,
    parse_taints,
)
from services.nodeagent.runner import KILL_GRACE_SECONDS, ProcessRun, RunAs, launcher
from services.nodeagent.service import NodeAgentConfig, NodeAgentService
from services.runtime import ConfigError, ServiceHost, load_config
from store import Store
from store.client import Fence, Release
from tests import factories as f

# --------------------------------------------------------------------------------------------
# Pure builders
# --------------------------------------------------------------------------------------------

LABEL_CASES: list[tuple[str, str, dict[str, str] | str]] = [
    ("empty", "", {}),
    ("two", "zone=a,disk=ssd", {"zone": "a", "disk": "ssd"}),
    ("spaces and empty items", " a = 1 ,, b=2 ", {"a": "1", "b": "2"}),
    ("empty value", "gpu=", {"gpu": ""}),
    ("no equals", "zone", "is not KEY=VALUE"),
    ("no key", "=a", "is not KEY=VALUE"),
    ("key with spaces", "has spaces!=a", "'has spaces!' is not a valid label key"),
    ("key with two slashes", "a/b/c=x", "prefix 'a/b' is not a DNS-1123 subdomain"),
    ("value too long", "zone=" + "v" * 70, "at most 63 characters"),
]


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in LABEL_CASES], ids=[c[0] for c in LABEL_CASES]
)
def test_parse_labels(text: str, expected: dict[str, str] | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            parse_labels(text)
    else:
        assert parse_labels(text) == expected


TAINT_CASES: list[tuple[str, str, list[tuple[str, str, int]] | str]] = [
    ("empty", "", []),
    ("key value effect", "gpu=true:NoSchedule", [("gpu", "true", pb.NO_SCHEDULE)]),
    ("key only, any case", "spot:noexecute", [("spot", "", pb.NO_EXECUTE)]),
    ("two", "a=1:PreferNoSchedule,b:NoSchedule",
     [("a", "1", pb.PREFER_NO_SCHEDULE), ("b", "", pb.NO_SCHEDULE)]),
    ("no effect", "gpu=true", "is not KEY"),
    ("unknown effect", "gpu=true:Sometimes", "is not KEY"),
    ("no key", "=x:NoSchedule", "has no key"),
    ("key not a label key", "x y=1:NoSchedule", "'x y' is not a valid label key"),
    ("value not a label value", "gpu=-x:NoSchedule", "'-x' is not a valid label value"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in TAINT_CASES], ids=[c[0] for c in TAINT_CASES]
)
def test_parse_taints(text: str, expected: list[tuple[str, str, int]] | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            parse_taints(text)
    else:
        assert [(t.key, t.value, t.effect) for t in parse_taints(text)] == expected


def test_hollow_node_shape_labels_and_topology() -> None:
    shape = Shape(milli_cpu=4001, memory_bytes=32 * GiB, max_pods=110, gpus=3)
    nodes = hollow_nodes(
        6, prefix="ha", agent="a", shape=shape, labels={"disk": "ssd"}, taints=(), now=1
    )
    assert [n.metadata.name for n in nodes] == [f"ha-{i}" for i in range(6)]
    assert [n.metadata.labels["zone"] for n in nodes] == [f"zone-{i % 4}" for i in range(6)]
    n = nodes[5]
    assert dict(n.metadata.labels) == {
        "disk": "ssd",
        "hostname": "ha-5",
        "zone": "zone-1",
        "godel.io/mode": "hollow",
    }
    assert (n.spec.agent, n.spec.mode) == ("a", "hollow")
    alloc, rec = n.status.allocatable, n.status.reclaimable
    assert (alloc.milli_cpu, alloc.memory_bytes, alloc.pods, alloc.gpus) == (4001, 32 * GiB, 110, 3)
    assert (rec.milli_cpu, rec.memory_bytes, rec.gpus) == (2000, 16 * GiB, 0)
    topo = n.status.topology
    assert topo.sockets == 2
    assert [(m.id, m.socket) for m in topo.numa_nodes] == [(0, 0), (1, 1)]
    # The split adds up exactly (odd remainders go to the last NUMA node).
    assert sum(m.capacity.milli_cpu for m in topo.numa_nodes) == 4001
    assert sum(m.capacity.gpus for m in topo.numa_nodes) == 3
    assert n.status.ready and n.status.heartbeat_ms == 1
    # A zone given in the labels wins over the cycle.
    fixed = hollow_nodes(
        2, prefix="h", agent="a", shape=shape, labels={"zone": "z"}, taints=(), now=1
    )
    assert {m.metadata.labels["zone"] for m in fixed} == {"z"}


def test_hollow_shape_declares_sockets_and_numa_nodes() -> None:
    shape = Shape(milli_cpu=16000, memory_bytes=64 * GiB, gpus=8, sockets=2, numa_per_socket=2)
    [n] = hollow_nodes(1, prefix="h", agent="a", shape=shape, labels={}, taints=(), now=1)
    topo = n.status.topology
    assert topo.sockets == 2
    assert [(z.id, z.socket) for z in topo.numa_nodes] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert [(z.capacity.milli_cpu, z.capacity.memory_bytes, z.capacity.gpus)
            for z in topo.numa_nodes] == [(4000, 16 * GiB, 2)] * 4  # fmt: skip


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]), ("5", [5]), ("", []), ("0-1\n", [0, 1])],
)
def test_parse_cpulist(text: str, cpus: list[int]) -> None:
    assert parse_cpulist(text) == cpus


def test_machine_numa_from_sysfs(tmp_path: Path) -> None:
    """A sysfs tree as the kernel lays it out (files written here): two NUMA nodes on two
    sockets, a memory-only one skipped; only CPUs this process may use count."""
    allowed = sorted(os.sched_getaffinity(0))
    for node, cpus, socket in (("node0", allowed[:1], 0), ("node1", allowed[1:], 1)):
        (tmp_path / "node" / node).mkdir(parents=True)
        (tmp_path / "node" / node / "cpulist").write_text(",".join(map(str, cpus)) + "\n")
        for cpu in cpus:
            top = tmp_path / "cpu" / f"cpu{cpu}" / "topology"
            top.mkdir(parents=True)
            (top / "physical_package_id").write_text(f"{socket}\n")
    (tmp_path / "node" / "node2").mkdir()
    (tmp_path / "node" / "node2" / "cpulist").write_text("\n")
    found = machine_numa(tmp_path)
    expected = [MachineNuma(0, 0, tuple(allowed[:1]))]
    if allowed[1:]:
        expected.append(MachineNuma(1, 1, tuple(allowed[1:])))
    assert found == expected
    topo = machine_topology(found, 10 * GiB)
    assert sum(z.capacity.milli_cpu for z in topo.numa_nodes) == 1000 * len(allowed)
    assert sum(z.capacity.memory_bytes for z in topo.numa_nodes) == 10 * GiB
    # Without sysfs: one NUMA node of every allowed CPU.
    assert machine_numa(tmp_path / "absent") == [MachineNuma(0, 0, tuple(allowed))]


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--hollow-labels", "zone"], "hollow_labels: label 'zone' is not KEY=VALUE"),
        (["--hollow-taints", "a=b"], "hollow_taints: taint 'a=b'"),
        (["--hollow-reclaimable-percent", "150"], "above the maximum 100"),
        (["--hollow-nodes", "-1"], "below the minimum 0"),
        (["--run-as", "nobody", "--pod-uid-range", "300000-300009"], "pod_uid_range: give run_as"),
    ],
)
def test_config_errors(argv: list[str], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        load_config(NodeAgentConfig, argv, {})


# --------------------------------------------------------------------------------------------
# Against a real store
# --------------------------------------------------------------------------------------------


def agent_config(store_url: str, cluster: str, tmp_path: Path, **kw: Any) -> NodeAgentConfig:
    defaults: dict[str, Any] = dict(
        store_url=store_url,
        cluster=cluster,
        name="agent-a",
        hollow_nodes=3,
        heartbeat_seconds=0.2,
        work_dir=str(tmp_path / "pods"),
        home=tmp_path,
        grace_seconds=0.5,
        insecure=True,  # plaintext in-process; tests/test_tls.py covers TLS
    )
    defaults.update(kw)
    return NodeAgentConfig(**defaults)


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def submit_and_bind(
    store: Store, job: pb.Job, nodes: list[str], *, fence: Fence | None = None
) -> list[pb.Pod]:
    """Create the job's pods and bind them round-robin to ``nodes``, as the Binder would."""
    pods = f.pods_of(job)
    await store.create_unit(job, pods)
    if fence is None:
        ok, lease = await store.acquire_lease("binder", "test-binder", 60_000)
        assert ok
        fence = Fence("binder", lease.epoch)
    for i, p in enumerate(pods):
        p.spec.node_name = nodes[i % len(nodes)]
        p.status.phase = pb.POD_BOUND
        p.status.bound_ms = int(time.time() * 1000)
    await store.bind(pods, fence=fence)
    return pods


def process_task(agent: NodeAgentService, pod: str) -> asyncio.Task[None] | None:
    """The task that runs a process pod's child (a process pod's run has one)."""
    run = agent.runner.runs[pod]
    assert isinstance(run, ProcessRun), f"{pod}: not run as a process"
    return run.task


async def phases(store: Store, names: list[str]) -> list[int]:
    return [p.status.phase if p else -1 for p in await store.get_many(pb.Pod, names)]


async def test_hollow_agent_registers_nodes(store: Store, store_url: str, tmp_path: Path) -> None:
    cfg = agent_config(
        store_url,
        store.cluster,
        tmp_path,
        hollow_nodes=5,
        hollow_cpu_milli=8000,
        hollow_memory_bytes=16 * GiB,
        hollow_max_pods=20,
        hollow_gpus=2,
        hollow_reclaimable_percent=25,
        hollow_labels="disk=ssd",
        hollow_taints="dedicated=batch:NoSchedule",
        node_prefix="hn",
    )
    async with ServiceHost(NodeAgentService, cfg) as host:
        started = time.monotonic()
        nodes, _ = await store.list_all(pb.Node)
        by_name = {n.metadata.name: n for n in nodes}
        assert sorted(by_name) == [f"hn-{i}" for i in range(5)]
        n = by_name["hn-2"]
        assert dict(n.metadata.labels) == {
            "disk": "ssd",
            "hostname": "hn-2",
            "zone": "zone-2",
            "godel.io/mode": "hollow",
        }
        assert [(t.key, t.value, t.effect) for t in n.spec.taints] == [
            ("dedicated", "batch", pb.NO_SCHEDULE)
        ]
        assert (n.spec.agent, n.spec.mode) == ("agent-a", "hollow")
        assert n.spec.agent_address == host.address  # bound to 127.0.0.1: published as bound
        a, r = n.status.allocatable, n.status.reclaimable
        assert (a.milli_cpu, a.memory_bytes, a.pods, a.gpus) == (8000, 16 * GiB, 20, 2)
        assert (r.milli_cpu, r.memory_bytes) == (2000, 4 * GiB)
        assert n.status.ready and n.status.heartbeat_ms > 0
        assert [c.type for c in n.status.conditions] == ["Ready"]
        assert len(n.status.topology.numa_nodes) == 2
        usage = await store.node_usage("hn-2")
        assert usage is not None and usage.capacity["g.cpu"] == 8000

        # Heartbeats advance in the heartbeat hash, all nodes per round trip, and leave the Node
        # objects (and so the change feed) alone.
        first = await store.heartbeats()
        assert set(first.last_ms) == set(by_name)
        revision = await store.revision()

        async def advanced() -> bool:
            beats = (await store.heartbeats()).last_ms
            return all(beats[name] > first.last_ms[name] for name in by_name)

        await eventually(advanced, what="heartbeats")
        assert await store.revision() == revision
        agent = host.service
        assert isinstance(agent, NodeAgentService)
        ticks = (time.monotonic() - started) / cfg.heartbeat_seconds
        assert 1 <= agent.nodes.heartbeats <= ticks + 1


async def test_restart_updates_existing_nodes(store: Store, store_url: str, tmp_path: Path) -> None:
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=2, node_prefix="rn")
    async with ServiceHost(NodeAgentService, cfg):
        pass
    # An operator cordons a node and labels it while the agent is down; it was also marked
    # NotReady by the node lifecycle controller.
    node = await store.get(pb.Node, "rn-0")
    node.spec.unschedulable = True
    node.metadata.labels["team"] = "x"
    node.status.ready = False
    node.status.conditions[0].status = "False"
    await store.update(node)
    cfg2 = agent_config(
        store_url, store.cluster, tmp_path, hollow_nodes=2, node_prefix="rn",
        hollow_cpu_milli=2000, name="agent-b",
    )  # fmt: skip
    async with ServiceHost(NodeAgentService, cfg2) as host:
        node = await store.get(pb.Node, "rn-0")
        assert node.spec.unschedulable and node.metadata.labels["team"] == "x"
        assert (node.spec.agent, node.spec.agent_address) == ("agent-b", host.address)
        assert node.status.allocatable.milli_cpu == 2000
        assert node.status.ready and node.status.conditions[0].status == "True"
        # A node deleted behind the agent's back is registered again by the next heartbeat.
        await store.delete(pb.Node, "rn-1")

        async def back() -> bool:
            nodes = await store.get_many(pb.Node, ["rn-1"])
            return nodes[0] is not None and nodes[0].spec.agent == "agent-b"

        await eventually(back, what="deleted node registered again")
        before = (await store.heartbeats()).last_ms["rn-1"]

        async def beat() -> bool:
            return (await store.heartbeats()).last_ms["rn-1"] > before

        await eventually(beat, what="heartbeat of the re-registered node")


async def test_hollow_pods_run_and_succeed(store: Store, store_url: str, tmp_path: Path) -> None:
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=4, node_prefix="hp")
    nodes = [f"hp-{i}" for i in range(4)]
    async with ServiceHost(NodeAgentService, cfg) as host:
        agent = host.service
        assert isinstance(agent, NodeAgentService)
        job = f.job("short", replicas=40, min_member=40)
        job.spec.template.duration_ms = 700
        forever = f.job("forever", replicas=2)
        pods = await submit_and_bind(store, job, nodes)
        _, lease = await store.acquire_lease("binder", "test-binder", 60_000)
        stay = await submit_and_bind(store, forever, nodes[:1], fence=Fence("binder", lease.epoch))
        names = [p.metadata.name for p in pods]

        async def running() -> bool:
            return set(await phases(store, names)) == {pb.POD_RUNNING}

        await eventually(running, what="pods running")
        usage = await store.node_usage("hp-0")
        assert usage is not None and usage.used["pods"] == 12

        async def succeeded() -> bool:
            return set(await phases(store, names)) == {pb.POD_SUCCEEDED}

        await eventually(succeeded, what="pods succeeded")
        for p in await store.get_many(pb.Pod, names):
            assert p is not None
            assert p.status.finished_ms - p.status.started_ms >= 650
            assert p.status.reason == "Completed"
        # The claims came back; only the two run-forever pods still hold theirs.
        for node in nodes:
            usage = await store.node_usage(node)
            assert usage is not None
            assert usage.used["pods"] == (2 if node == "hp-0" else 0)
        assert set(await phases(store, [p.metadata.name for p in stay])) == {pb.POD_RUNNING}
        # 84 transitions (40 x RUNNING, SUCCEEDED; 2 x RUNNING), a handful of round trips.
        assert agent.runner.pods_written == 82
        assert agent.runner.commit_calls <= 10

        # Deleting a run-forever pod forgets it.
        await store.delete(pb.Pod, stay[0].metadata.name)

        async def forgotten() -> bool:
            return stay[0].metadata.name not in agent.runner.runs

        await eventually(forgotten, what="deleted pod forgotten")


async def test_hollow_pods_resume_after_restart(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=1, node_prefix="rs")
    async with ServiceHost(NodeAgentService, cfg):
        job = f.job("resume", replicas=3)
        job.spec.template.duration_ms = 1500
        pods = await submit_and_bind(store, job, ["rs-0"])
        names = [p.metadata.name for p in pods]

        async def running() -> bool:
            return set(await phases(store, names)) == {pb.POD_RUNNING}

        await eventually(running, what="pods running")
    # Stopped: hollow pods are not failed; a new agent finishes them on time.
    assert set(await phases(store, names)) == {pb.POD_RUNNING}
    async with ServiceHost(NodeAgentService, cfg):

        async def succeeded() -> bool:
            return set(await phases(store, names)) == {pb.POD_SUCCEEDED}

        await eventually(succeeded, what="resumed pods succeeded")


def process_job(name: str, command: list[str], replicas: int = 1) -> pb.Job:
    job = f.job(name, replicas=replicas, cpu=100)
    job.spec.template.command.extend(command)
    job.spec.template.env["GREETING"] = "hello"
    return job


async def read_logs(address: str, pod: str, **kw: Any) -> bytes:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_pb2_grpc.NodeAgentStub(channel)
        out = b""
        async for chunk in stub.Logs(api_pb2.LogsRequest(pod=pod, **kw), timeout=15):
            out += chunk.data
        return out


async def test_process_mode(store: Store, store_url: str, tmp_path: Path) -> None:
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=0, process_node=True)
    async with ServiceHost(NodeAgentService, cfg) as host:
        nodes, _ = await store.list_all(pb.Node)
        assert len(nodes) == 1 and nodes[0].spec.mode == "process"
        node = nodes[0].metadata.name
        assert nodes[0].status.allocatable.milli_cpu % 1000 == 0
        assert nodes[0].status.allocatable.memory_bytes > 0

        _, lease = await store.acquire_lease("binder", "test-binder", 60_000)
        fence = Fence("binder", lease.epoch)
        ok = await submit_and_bind(
            store, process_job("ok", ["sh", "-c", 'echo $GREETING; echo "pod=$GODEL_POD"']),
            [node], fence=fence,
        )  # fmt: skip
        bad = await submit_and_bind(
            store, process_job("bad", ["sh", "-c", "exit 3"]), [node], fence=fence
        )
        missing = await submit_and_bind(
            store, process_job("missing", ["/nonexistent/binary"]), [node], fence=fence
        )
        slow = await submit_and_bind(
            store,
            process_job("slow", ["sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.3; done"]),
            [node],
            fence=fence,
        )
        names = [p.metadata.name for p in (*ok, *bad, *missing, *slow)]

        async def done() -> bool:
            return all(ph in (pb.POD_SUCCEEDED, pb.POD_FAILED) for ph in await phases(store, names))

        async def slow_started() -> bool:
            return (await phases(store, ["slow-0"]))[0] in (pb.POD_RUNNING, pb.POD_SUCCEEDED)

        # The agent learns of a bound pod through its informer; logs exist once it has started.
        await eventually(slow_started, what="slow pod started")
        # Follow the slow pod's log while it runs: the stream ends when the process exits.
        followed = await read_logs(host.address, "slow-0", follow=True)
        assert followed == b"line1\nline2\nline3\n"
        await eventually(done, what="process pods finished")

        got = {p.metadata.name: p for p in await store.get_many(pb.Pod, names) if p}
        assert got["ok-0"].status.phase == pb.POD_SUCCEEDED
        assert got["ok-0"].status.exit_code == 0
        assert got["bad-0"].status.phase == pb.POD_FAILED
        assert (got["bad-0"].status.exit_code, got["bad-0"].status.reason) == (3, "Error")
        assert got["missing-0"].status.phase == pb.POD_FAILED
        assert got["missing-0"].status.reason == "StartError"
        usage = await store.node_usage(node)
        assert usage is not None and usage.used["pods"] == 0

        assert await read_logs(host.address, "ok-0") == b"hello\npod=ok-0\n"
        assert await read_logs(host.address, "slow-0", tail_lines=2) == b"line2\nline3\n"
        assert (tmp_path / "pods" / "ok-0.log").read_bytes() == b"hello\npod=ok-0\n"

        for pod in ("nope", ""):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await read_logs(host.address, pod)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert "is not run by node agent 'agent-a'" in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await read_logs(host.address, "ok-0", tail_lines=-1)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def tenant_job(job: pb.Job, owner: str) -> pb.Job:
    job.metadata.owner = owner
    return job


def ids_of(pid: int, which: str = "Uid:") -> list[int]:
    """A process's real, effective, saved and file-system uids (or ``Gid:``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith(which))
    return [int(u) for u in line.split()[1:]]


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid per pod needs the agent to run as root")
async def test_process_pods_of_two_tenants_cannot_reach_each_other(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """Each process pod runs as a uid of its own (the default range of a root agent), in a
    private work dir under a private agent dir: Bob's pod cannot read, list or write Alice's
    files through /proc/<her pid>/cwd, kill her process, list the agent's pod dir or read her
    log. Her uid goes back when she is deleted."""
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=0, process_node=True)
    work = tmp_path / "pods"
    async with ServiceHost(NodeAgentService, cfg) as host:
        agent = host.service
        assert isinstance(agent, NodeAgentService)
        [node] = [n.metadata.name for n in (await store.list_all(pb.Node))[0]]
        _, lease = await store.acquire_lease("binder", "test-binder", 60_000)
        fence = Fence("binder", lease.epoch)
        victim = tenant_job(
            process_job("victim", ["sh", "-c", "echo secret > secret; echo up; exec sleep 60"]),
            "alice",
        )
        await submit_and_bind(store, victim, [node], fence=fence)

        async def victim_up() -> bool:
            log = work / "victim-0.log"
            return log.exists() and b"up" in log.read_bytes()

        await eventually(victim_up, what="the victim pod up")
        pid = agent.runner.pid_of("victim-0")
        assert pid is not None
        victim_uid = ids_of(pid)[0]

        attacker = tenant_job(process_job("attacker", ["sh", "-c", f.POD_ATTACK]), "bob")
        attacker.spec.template.env.update(
            TARGET=str(pid), AGENT_DIR=str(work), VICTIM_LOG=str(work / "victim-0.log")
        )
        await submit_and_bind(store, attacker, [node], fence=fence)

        async def attack_over() -> bool:
            return (await phases(store, ["attacker-0"]))[0] in (pb.POD_SUCCEEDED, pb.POD_FAILED)

        await eventually(attack_over, what="the attack over")
        said = (work / "attacker-0.log").read_text().splitlines()
        assert said[-1] == "attack over", said
        assert [line for line in said if line.startswith("ATTACK-")] == []
        attacker_uid = int(said[0])

        # Alice's pod runs on, its file as it wrote it.
        assert (await phases(store, ["victim-0"]))[0] == pb.POD_RUNNING
        assert agent.runner.pid_of("victim-0") == pid
        os.kill(pid, 0)
        assert (work / "victim-0" / "secret").read_text() == "secret\n"
        # Each its own uid, from the range, neither root nor the other's; its group its own.
        uids = agent.runner.pod_uids
        assert uids is not None
        assert victim_uid != attacker_uid and {victim_uid, attacker_uid} <= set(uids.uids)
        assert ids_of(pid) == [victim_uid] * 4
        assert ids_of(pid, "Gid:") == [victim_uid] * 4
        mine = (work / "victim-0").stat()
        assert (mine.st_uid, mine.st_mode & 0o777) == (victim_uid, 0o700)
        assert work.stat().st_mode & 0o777 == 0o700
        assert (work / "victim-0.log").stat().st_mode & 0o777 == 0o600
        # The attacker ended: its uid is no longer held, its dir is the agent's again.
        assert uids.held == {victim_uid}
        assert (work / "attacker-0").stat().st_uid == os.geteuid()

        task = process_task(agent, "victim-0")
        assert task is not None
        await store.delete(pb.Pod, "victim-0")
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 20)
        assert uids.held == frozenset()


def usable_cgroups() -> bool:
    return os.geteuid() == 0 and Cgroups.detect() is not None


@pytest.mark.skipif(
    not usable_cgroups(),
    reason="no usable cgroups here: neither v2 with cpu and memory nor writable v1 cpu and "
    "memory hierarchies (or not root)",
)
async def test_process_pod_runs_in_a_cgroup_holding_its_requests(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """The pod's process is in a cgroup of its own whose CPU and memory limits are the pod's
    requests; the cgroup goes when the pod's process does."""
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=0, process_node=True)
    async with ServiceHost(NodeAgentService, cfg) as host:
        agent = host.service
        assert isinstance(agent, NodeAgentService)
        cgroups = agent.runner.cgroups
        assert cgroups is not None
        [node] = [n.metadata.name for n in (await store.list_all(pb.Node))[0]]
        job = process_job("limited", ["sh", "-c", "echo up; exec sleep 60"])
        job.spec.template.requests.milli_cpu = 250
        job.spec.template.requests.memory_bytes = 96 * 1024 * 1024  # whole pages
        [pod] = await submit_and_bind(store, job, [node])

        async def running() -> bool:
            return agent.runner.pid_of("limited-0") is not None

        await eventually(running, what="the limited pod running")
        pid = agent.runner.pid_of("limited-0")
        stored = await store.get(pb.Pod, "limited-0")
        cgroup = cgroups.existing(cgroup_name(stored.metadata.uid))
        assert cgroup is not None

        # The process joins its cgroup itself, in the isolated interpreter it starts as (before
        # it execs the pod's command): a moment after its pid is known.
        async def joined() -> bool:
            return all(
                pid in parse_pids((directory / "cgroup.procs").read_text())
                for directory in cgroup.dirs
            )

        await eventually(joined, what="the pod's process in its cgroup")
        values = cgroup.limits()
        if cgroups.version == V2:
            assert values == {"cpu.max": "25000 100000", "memory.max": str(96 * 1024 * 1024)}
        else:
            assert values == {
                "cpu.cfs_quota_us": "25000",
                "cpu.cfs_period_us": "100000",
                "memory.limit_in_bytes": str(96 * 1024 * 1024),
            }
        task = process_task(agent, "limited-0")
        assert task is not None
        await store.delete(pb.Pod, pod.metadata.name)
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 20)
        assert not any(d.exists() for d in cgroup.dirs)


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="pinning needs os.sched_setaffinity and two CPUs",
)
async def test_process_pod_is_pinned_to_its_numa_nodes_cpus(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """A process pod holding NUMA nodes runs on their CPUs only (os.sched_setaffinity before
    its command starts); a pod holding none runs on every CPU. The machine's NUMA layout is set
    on the real runner as two one-CPU NUMA nodes, so the test does not need a NUMA machine."""
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=0, process_node=True)
    first, second = sorted(os.sched_getaffinity(0))[:2]
    async with ServiceHost(NodeAgentService, cfg) as host:
        agent = host.service
        assert isinstance(agent, NodeAgentService)
        agent.runner.numa_cpus = {0: (first,), 1: (second,)}
        [node] = [n.metadata.name for n in (await store.list_all(pb.Node))[0]]
        # /proc, not a python3: the pod runs unprivileged (a uid of its own, the agent being root),
        # and may not read the test runner's own interpreter.
        show = ["sh", "-c", "grep Cpus_allowed_list /proc/self/status"]
        _, lease = await store.acquire_lease("binder", "test-binder", 60_000)
        fence = Fence("binder", lease.epoch)
        pods = []
        for name, numa in (("on0", [0]), ("on1", [1]), ("free", [])):
            job = f.numa_job(process_job(name, show), pb.NUMA_POLICY_SINGLE if numa else 0)
            pod = f.pods_of(job)[0]
            await store.create_unit(job, [pod])
            pod.spec.node_name = node
            pod.spec.numa_nodes.extend(numa)
            pod.status.phase = pb.POD_BOUND
            await store.bind([pod], fence=fence)
            pods.append(pod.metadata.name)

        async def done() -> bool:
            return all(ph == pb.POD_SUCCEEDED for ph in await phases(store, pods))

        await eventually(done, what="pinned pods finished")
        assert await read_logs(host.address, "on0-0") == f"Cpus_allowed_list:\t{first}\n".encode()
        assert await read_logs(host.address, "on1-0") == f"Cpus_allowed_list:\t{second}\n".encode()
        ours = await asyncio.to_thread(Path("/proc/self/status").read_text)
        everything = next(x for x in ours.splitlines() if x.startswith("Cpus_allowed_list:"))
        assert await read_logs(host.address, "free-0") == f"{everything}\n".encode()


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="pinning needs os.sched_setaffinity and two CPUs",
)
@pytest.mark.parametrize(
    ("cpus", "exit_code"),
    [
        ((0,), 0),  # pinned, the agent's own user (no run-as: an unprivileged agent)
        ((), 0),  # unpinned
        ((10_000,), 127),  # a CPU that does not exist: the command never starts
    ],
)
def test_launcher_pins_before_the_command_starts(cpus: tuple[int, ...], exit_code: int) -> None:
    """The launcher interpreter sets the CPUs itself, then execs the command (same pid), so what
    the command sees in /proc is the pinned set; a pin the OS refuses is a start error (127)."""
    allowed = sorted(os.sched_getaffinity(0))
    want = [allowed[c] for c in cpus if c < len(allowed)] or cpus
    show = ["sh", "-c", "grep Cpus_allowed_list /proc/self/status"]
    argv = launcher(show, None, tuple(want), os.environ.get("PATH", os.defpath))
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == exit_code
    if exit_code:
        assert "cannot start" in done.stderr
    elif want:
        assert done.stdout == f"Cpus_allowed_list:\t{want[0]}\n"
    else:
        ours = Path("/proc/self/status").read_text()
        assert (
            done.stdout
            == next(x for x in ours.splitlines() if x.startswith("Cpus_allowed_list")) + "\n"
        )


async def test_process_pods_killed_on_delete_and_stop(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=0, process_node=True)
    host = ServiceHost(NodeAgentService, cfg)
    async with host:
        node = (await store.list_all(pb.Node))[0][0].metadata.name
        pods = await submit_and_bind(
            store, process_job("sleepy", ["sleep", "60"], replicas=2), [node]
        )
        names = [p.metadata.name for p in pods]

        async def running() -> bool:
            return set(await phases(store, names)) == {pb.POD_RUNNING}

        await eventually(running, what="sleepers running")
        agent = host.service
        assert isinstance(agent, NodeAgentService)
        procs = {n: process_task(agent, n) for n in names}
        work = tmp_path / "pods"
        assert (work / "sleepy-0").is_dir() and (work / "sleepy-0.log").exists()
        await store.delete(pb.Pod, "sleepy-0")
        task = procs["sleepy-0"]
        assert task is not None
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)

        # A deleted pod's work dir and log go with it; the other pod's stay.
        async def cleaned() -> bool:
            return not (work / "sleepy-0").exists() and not (work / "sleepy-0.log").exists()

        await eventually(cleaned, what="deleted pod's files removed")
        assert (work / "sleepy-1").is_dir() and (work / "sleepy-1.log").exists()
    # Graceful stop: the remaining child was killed and its pod failed, reason AgentStopped.
    pod = await store.get(pb.Pod, "sleepy-1")
    assert pod.status.phase == pb.POD_FAILED
    assert pod.status.reason == "AgentStopped"
    usage = await store.node_usage(node)
    assert usage is not None and usage.used["pods"] == 0
    # The node stays ready: a restart must not look like a lost node.
    assert (await store.get(pb.Node, node)).status.ready


async def test_process_pod_of_a_crashed_agent_fails(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=0, process_node=True)
    async with ServiceHost(NodeAgentService, cfg):
        node = (await store.list_all(pb.Node))[0][0].metadata.name
    # As if the agent had started it and then died with kill -9: RUNNING, no process behind it.
    pods = await submit_and_bind(store, process_job("orphan", ["sleep", "60"]), [node])
    pods[0].status.phase = pb.POD_RUNNING
    await store.update(pods[0])
    async with ServiceHost(NodeAgentService, cfg):

        async def failed() -> bool:
            pod = await store.get(pb.Pod, "orphan-0")
            return (pod.status.phase, pod.status.reason) == (pb.POD_FAILED, "AgentRestarted")

        await eventually(failed, what="orphaned pod failed")
    usage = await store.node_usage(node)
    assert usage is not None and usage.used["pods"] == 0


def previous_agents_pod(cwd: Path, uid: int, cgroup: PodCgroup | None) -> subprocess.Popen[bytes]:
    """What an agent killed with -9 leaves of a running pod: its process, as the agent started
    it (the launcher: into its cgroup, down to its uid, in its work dir), still running."""
    cwd.mkdir(parents=True)
    os.chown(cwd, uid, uid)
    joins = cgroup.procs_files if cgroup is not None else ()
    argv = launcher(["sleep", "60"], RunAs.own_uid(uid), (), os.defpath, joins)
    proc = subprocess.Popen(argv, cwd=cwd, start_new_session=True)
    deadline = time.monotonic() + 20
    while ids_of(proc.pid)[0] != uid:  # in its cgroup and down to its uid (the launcher's order)
        assert proc.poll() is None and time.monotonic() < deadline, "the pod did not start"
        time.sleep(0.01)
    return proc


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid per pod needs the agent to run as root")
async def test_a_restarted_agent_kills_what_a_dead_agents_pod_left(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """The previous agent died with its pod's process running: the restarted one fails the pod
    (AgentRestarted) and finds what is left from the work dir's owner (the pod's uid) and the
    cgroup named after the pod: the process is killed, the cgroup removed, the dir handed back
    to the agent, and the uid is free again."""
    cfg = agent_config(
        store_url, store.cluster, tmp_path, hollow_nodes=0, process_node=True,
        pod_uid_range="290300-290303",
    )  # fmt: skip
    async with ServiceHost(NodeAgentService, cfg):
        node = (await store.list_all(pb.Node))[0][0].metadata.name
    [pod] = await submit_and_bind(store, process_job("orphan", ["sleep", "60"]), [node])
    pod.status.phase = pb.POD_RUNNING
    await store.update(pod)
    stored = await store.get(pb.Pod, "orphan-0")
    cgroups = Cgroups.detect()
    cgroup = cgroups.create(cgroup_name(stored.metadata.uid), 100, 0) if cgroups else None
    work = tmp_path / "pods" / "orphan-0"
    left = await asyncio.to_thread(previous_agents_pod, work, 290_300, cgroup)
    try:
        async with ServiceHost(NodeAgentService, cfg) as host:
            agent = host.service
            assert isinstance(agent, NodeAgentService)

            async def failed() -> bool:
                pod = await store.get(pb.Pod, "orphan-0")
                return (pod.status.phase, pod.status.reason) == (pb.POD_FAILED, "AgentRestarted")

            await eventually(failed, what="orphaned pod failed")
            assert await asyncio.to_thread(left.wait, 20) == -9
            task = process_task(agent, "orphan-0")
            assert task is not None
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 20)
            assert cgroup is None or not any(d.exists() for d in cgroup.dirs)
            assert work.stat().st_uid == os.geteuid()
            assert agent.runner.pod_uids is not None and agent.runner.pod_uids.held == frozenset()
    finally:
        if left.poll() is None:
            left.kill()
            left.wait()
        if cgroups is not None and cgroup is not None:
            await cgroups.remove(cgroup)


async def test_evicted_process_pod_gets_sigterm_then_sigkill_after_its_grace(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """A preemption victim in process mode: the agent sees it Failed by someone else, sends
    SIGTERM, waits the pod's termination grace (longer than the agent's default here), then
    SIGKILLs the process it ignores TERM in; the evicted record is left as the Binder wrote it."""
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=0, process_node=True)
    async with ServiceHost(NodeAgentService, cfg) as host:
        node = (await store.list_all(pb.Node))[0][0].metadata.name
        job = process_job("victim", ["sh", "-c", 'trap "echo term" TERM; echo up; '
                                     "while true; do sleep 0.1; done"])  # fmt: skip
        grace = int(KILL_GRACE_SECONDS) + 2
        job.spec.template.termination_grace_seconds = grace
        await submit_and_bind(store, job, [node])

        async def started() -> bool:
            p = await store.get(pb.Pod, "victim-0")
            return p.status.phase == pb.POD_RUNNING and b"up" in await read_logs(
                host.address, "victim-0"
            )

        await eventually(started, what="victim running")
        agent = host.service
        assert isinstance(agent, NodeAgentService)
        task = process_task(agent, "victim-0")
        assert task is not None
        current = await store.get(pb.Pod, "victim-0")
        gone = evicted(current, PREEMPTED, "preempted by pod 'p-0'", int(time.time() * 1000), "p-0")
        began = time.monotonic()
        await store.commit([Release(gone)])
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), grace + 20)
        assert time.monotonic() - began >= grace - 0.5  # TERM ignored: KILL only after the grace
        assert (tmp_path / "pods" / "victim-0.log").read_bytes().count(b"term") == 1
        await asyncio.sleep(0.5)  # a write the agent would (wrongly) make
    after = await store.get(pb.Pod, "victim-0")
    assert (after.status.phase, after.status.reason) == (pb.POD_FAILED, PREEMPTED)
    assert after.status.preempted_by == "p-0"
