"""Nodes' measured load (services/nodeagent/load.py): /proc/net/dev parsing and rates, link
speeds from sysfs, the hollow usage model, and the reporter and agent against a real store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from protos.godel.v1 import objects_pb2 as pb
from services import metrics
from services.nodeagent.load import (
    DEFAULT_NETWORK_BANDWIDTH,
    HollowUsage,
    LoadReporter,
    LoadSettings,
    MachineLoad,
    NetworkMeter,
    link_speed,
    network_bytes,
    network_percent,
    parse_net_dev,
)
from services.nodeagent.service import NodeAgentConfig, NodeAgentService
from services.nodeagent.tidal import Usage, UsageCurve
from services.runtime import ConfigError, ServiceHost, load_config
from store import Store
from tests import factories as f
from tests.test_nodeagent import agent_config, eventually, submit_and_bind

# /proc/net/dev as captured on this machine (2026-11-27).
NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 30566983782 10588658    0    0    0     0          0         0 30566983782 10588658    0    0    0     0       0          0
  ifb0:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  ifb1:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  eth0: 1841506620   52716    0    0    0     0          0         0  3504672   31608    0    0    0     0       0          0
"""


def test_parse_net_dev_reads_bytes_received_and_sent_per_interface() -> None:
    assert parse_net_dev(NET_DEV) == {
        "lo": (30566983782, 30566983782),
        "ifb0": (0, 0),
        "ifb1": (0, 0),
        "eth0": (1841506620, 3504672),
    }


def test_network_bytes_leave_loopback_out() -> None:
    assert network_bytes(parse_net_dev(NET_DEV)) == 1841506620 + 3504672


def test_parse_net_dev_names_a_line_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="unexpected line 'eth0: 12 34'"):
        parse_net_dev(NET_DEV + "  eth0: 12 34\n")


def test_the_real_proc_net_dev_parses() -> None:
    path = Path("/proc/net/dev")
    if not path.exists():
        pytest.skip("no /proc/net/dev on this OS")
    counters = parse_net_dev(path.read_text())
    assert "lo" in counters
    assert all(rx >= 0 and tx >= 0 for rx, tx in counters.values())
    meter = NetworkMeter(path)
    assert meter.rate() == 0  # no interval yet
    time.sleep(0.05)
    assert meter.rate() >= 0


def _net_dev_with(eth0_rx: int, eth0_tx: int, lo: int) -> str:
    header = "\n".join(NET_DEV.splitlines()[:2])
    zeros = " ".join(["0"] * 7)
    return (
        f"{header}\n    lo: {lo} {zeros} {lo} {zeros}\n"
        f"  eth0: {eth0_rx} {zeros} {eth0_tx} {zeros}\n"
    )


@pytest.mark.parametrize(
    ("before", "after", "seconds", "rate"),
    [
        pytest.param((1000, 0, 0), (3000, 1000, 10**9), 2.0, 1500, id="rx+tx-per-second-no-lo"),
        pytest.param((5000, 5000, 0), (100, 100, 0), 1.0, 0, id="counters-reset-count-0"),
        pytest.param((0, 0, 0), (0, 0, 10**9), 1.0, 0, id="loopback-only-is-0"),
    ],
)
def test_network_meter_rate_over_the_interval(
    tmp_path: Path,
    before: tuple[int, int, int],
    after: tuple[int, int, int],
    seconds: float,
    rate: int,
) -> None:
    path = tmp_path / "dev"
    now = [100.0]
    meter = NetworkMeter(path, clock=lambda: now[0])
    path.write_text(_net_dev_with(*before))
    assert meter.rate() == 0
    path.write_text(_net_dev_with(*after))
    now[0] += seconds
    assert meter.rate() == rate


def test_link_speed_sums_interfaces_that_report_one(tmp_path: Path) -> None:
    for name, speed in (("eth0", "1000"), ("eth1", "10000"), ("veth", "-1"), ("lo", "100000")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "speed").write_text(speed + "\n")
    (tmp_path / "ifb0").mkdir()  # no speed file: the kernel refuses the read
    assert link_speed(tmp_path) == (1000 + 10000) * 1_000_000 // 8
    assert link_speed(tmp_path / "absent") == 0


def test_machine_load_falls_back_to_the_configured_bandwidth_without_link_speeds() -> None:
    load = MachineLoad(123_456).measure(1, Usage(500, 1000))
    assert load.network_capacity_bytes_per_second in (123_456, link_speed())
    assert load.milli_cpu >= 0 and load.memory_bytes > 0 and load.measured_ms == 1
    # What its pods use, measured apart from the machine's whole load.
    assert (load.pods_milli_cpu, load.pods_memory_bytes) == (500, 1000)


def test_network_percent_is_fixed_per_node_and_within_range() -> None:
    values = [network_percent(f"n-{i}", 50, 100) for i in range(200)]
    assert values == [network_percent(f"n-{i}", 50, 100) for i in range(200)]
    assert all(50 <= v <= 100 for v in values) and len(set(values)) > 10
    assert network_percent("n-1", 70, 70) == 70


def _pod(name: str, node: str, cpu: int, *, qos: int = pb.QOS_GUARANTEED, usage: int = 0) -> pb.Pod:
    p = pb.Pod(metadata=pb.ObjectMeta(name=name))
    p.spec.node_name = node
    p.spec.qos = qos  # type: ignore[assignment]
    p.spec.template.requests.milli_cpu = cpu
    p.spec.template.requests.memory_bytes = cpu * 1000
    p.spec.template.hollow_usage_percent = usage
    p.status.phase = pb.POD_RUNNING
    return p


@pytest.mark.parametrize(
    ("pods", "percent", "expected"),
    [
        pytest.param([_pod("a", "n", 1000)], 50, (500, 500_000), id="guaranteed-follow-the-curve"),
        pytest.param(
            [_pod("a", "n", 1000, qos=pb.QOS_BEST_EFFORT)],
            50,
            (1000, 1_000_000),
            id="best-effort-use-all-they-asked",
        ),
        pytest.param(
            [_pod("a", "n", 1000, usage=250), _pod("b", "n", 1000)],
            40,
            (2500 + 400, 2_500_000 + 400_000),
            id="a-pods-own-usage-percent-over-the-curve",
        ),
        pytest.param([_pod("a", "other", 1000)], 100, (0, 0), id="other-nodes-pods-not-counted"),
    ],
)
def test_hollow_usage(pods: list[pb.Pod], percent: float, expected: tuple[int, int]) -> None:
    usage = HollowUsage()
    for pod in pods:
        usage.on_pod(pod)
    assert usage.used("n", percent) == expected


def test_hollow_usage_follows_pods_that_end_move_or_go() -> None:
    usage = HollowUsage()
    usage.on_pod(_pod("a", "n", 1000))
    usage.on_pod(_pod("a", "n", 1000))  # an update changing nothing counts once
    usage.on_pod(_pod("b", "n", 2000))
    assert usage.used("n", 100)[0] == 3000
    done = _pod("a", "n", 1000)
    done.status.phase = pb.POD_SUCCEEDED
    usage.on_pod(done)
    assert usage.used("n", 100)[0] == 2000
    usage.on_pod(_pod("b", "n", 2000), gone=True)
    assert usage.used("n", 100) == (0, 0)


def test_hollow_usage_holds_one_record_per_node_and_shape() -> None:
    """Pods of one shape on one node share their record (one per pod was 0.1 KiB of an agent's
    memory per pod); each still counts, and goes, on its own."""
    usage = HollowUsage()
    for name in ("a", "b", "c"):
        usage.on_pod(_pod(name, "n", 1000))
    usage.on_pod(_pod("d", "m", 1000))
    held = usage._pods  # what the model keeps per pod
    assert held["a"] is held["b"] is held["c"] and held["d"] is not held["a"]
    assert usage.used("n", 100)[0] == 3000 and usage.used("m", 100)[0] == 1000
    usage.on_pod(_pod("b", "n", 1000), gone=True)
    assert usage.used("n", 100)[0] == 2000


def _node(name: str, cpu: int, mode: str = "hollow") -> pb.Node:
    node = f.node(name, cpu=cpu)
    node.spec.mode = mode
    return node


async def test_reporter_writes_loads_that_moved(store: Store) -> None:
    await store.create_many([_node("a", 4000), _node("b", 4000)])
    nodes = {"a": _node("a", 4000), "b": _node("b", 4000)}
    reporter = LoadReporter(
        store,
        nodes,
        UsageCurve.parse("0=100"),
        LoadSettings(network_bandwidth=1_000_000, hollow_network_percent_min=100),
        lambda: MachineLoad(1),
    )
    reporter.usage.on_pod(_pod("p", "a", 2000))
    assert await reporter.report(now=1000.0) == 2
    loads = await store.node_loads()
    # Half of a's CPU in use: half its bandwidth (its network percent is 100).
    assert (loads["a"].milli_cpu, loads["a"].network_bytes_per_second) == (2000, 500_000)
    assert loads["a"].pods_milli_cpu == 2000  # a hollow node runs nothing but its pods
    assert loads["a"].network_capacity_bytes_per_second == 1_000_000
    assert (loads["b"].milli_cpu, loads["b"].measured_ms) == (0, 1_000_000)
    # Nothing moved: nothing written; a pod on b moves b only.
    assert await reporter.report(now=1001.0) == 0
    reporter.usage.on_pod(_pod("q", "b", 1000))
    assert await reporter.report(now=1002.0) == 1
    assert (await store.node_loads())["b"].milli_cpu == 1000
    # Every report is rewritten once it is REFRESH_SECONDS old.
    assert await reporter.report(now=1031.0) == 1  # a's, last written at 1000
    # A node that is gone loses its load with its heartbeat.
    await store.forget_heartbeats(["a"])
    assert set(await store.node_loads()) == {"b"}


async def test_reporter_without_curve_measures_only_nodes_that_may_have_moved(
    store: Store,
) -> None:
    """Without a usage curve a hollow node's load changes only with its pods or its Node: the
    reporter measures those (and the ones due a refresh), not every node every heartbeat, and
    writes what it wrote before."""
    await store.create_many([_node("a", 4000), _node("b", 4000)])
    nodes = {"a": _node("a", 4000), "b": _node("b", 4000)}
    reporter = LoadReporter(
        store,
        nodes,
        None,
        LoadSettings(network_bandwidth=1_000_000, hollow_network_percent_min=100),
        lambda: MachineLoad(1),
    )
    reporter.usage.on_pod(_pod("p", "a", 2000))
    assert await reporter.report(now=1000.0) == 2
    assert reporter.measured == 2
    # Nothing changed: nothing measured, nothing written.
    assert await reporter.report(now=1001.0) == 0
    assert reporter.measured == 2
    # A pod on b: b alone measured and written.
    reporter.usage.on_pod(_pod("q", "b", 1000))
    assert await reporter.report(now=1002.0) == 1
    assert reporter.measured == 3
    assert (await store.node_loads())["b"].milli_cpu == 1000
    # Below REPORT_CHANGE_PERCENT (1 % of 4000m) nothing is written, but the changes add up
    # against the load last written, as when every node was measured.
    reporter.usage.on_pod(_pod("r", "b", 30))
    assert await reporter.report(now=1003.0) == 0
    reporter.usage.on_pod(_pod("s", "b", 30))
    assert await reporter.report(now=1004.0) == 1
    assert (await store.node_loads())["b"].milli_cpu == 1060
    # A replaced Node (its allocatable halved) is measured again: a's 2000m is now all of it.
    nodes["a"] = _node("a", 2000)
    assert await reporter.report(now=1005.0) == 1
    assert (await store.node_loads())["a"].network_bytes_per_second == 1_000_000
    # Every report is rewritten once it is REFRESH_SECONDS old: b's, last written at 1004.
    before = reporter.measured
    assert await reporter.report(now=1034.0) == 1
    assert reporter.measured == before + 1
    assert (await store.node_loads())["b"].measured_ms == 1_034_000


def test_network_percent_range_is_checked() -> None:
    argv = ["--hollow-network-percent-min", "80", "--hollow-network-percent-max", "20"]
    with pytest.raises(ConfigError, match="hollow_network_percent_max"):
        load_config(NodeAgentConfig, argv, {})


async def test_agent_reports_its_nodes_load(store: Store, store_url: str, tmp_path: Path) -> None:
    """A real agent: its hollow nodes' loads reach the store's load hash, a hot pod's usage
    (hollow_usage_percent) included, and the Node objects (the change feed) are left alone."""
    cfg = agent_config(
        store_url, store.cluster, tmp_path, hollow_nodes=2, node_prefix="ld", hollow_cpu_milli=4000
    )
    async with ServiceHost(NodeAgentService, cfg) as host:
        job = f.job("hot", replicas=1)
        job.spec.template.requests.milli_cpu = 1000
        job.spec.template.hollow_usage_percent = 300
        await submit_and_bind(store, job, ["ld-0"])

        async def reported() -> bool:
            loads = await store.node_loads()
            return set(loads) == {"ld-0", "ld-1"} and loads["ld-0"].milli_cpu == 3000

        await eventually(reported, what="loads reported")
        loads = await store.node_loads()
        assert loads["ld-1"].milli_cpu == 0
        assert {n.network_capacity_bytes_per_second for n in loads.values()} == {
            DEFAULT_NETWORK_BANDWIDTH
        }
        # 75 % of the CPU: 75 % × the node's network percent of the bandwidth.
        percent = network_percent("ld-0", 50, 100)
        expected = DEFAULT_NETWORK_BANDWIDTH * 3000 * percent // (4000 * 100)
        assert loads["ld-0"].network_bytes_per_second == expected
        # The agent's metrics: its nodes' total and highest load.
        agent = host.service
        assert isinstance(agent, NodeAgentService)
        agent.sample_metrics()
        assert metrics.NODEAGENT_LOAD_MILLI_CPU.value("total") == 3000
        assert metrics.NODEAGENT_LOAD_NETWORK.value("max") == expected
        revision = await store.revision()
        await asyncio.sleep(3 * cfg.heartbeat_seconds)
        assert await store.revision() == revision


async def test_the_load_model_shares_the_runners_string_for_each_pod(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """A real agent's load model keys each pod by the runner's own string for its name: one
    string per pod in the agent, not one per holder."""
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=1, node_prefix="sh")
    async with ServiceHost(NodeAgentService, cfg) as host:
        agent = host.service
        assert isinstance(agent, NodeAgentService)
        await submit_and_bind(store, f.job("shared", replicas=3), ["sh-0"] * 3)

        async def running() -> bool:
            return len(agent.loads.usage._pods) == 3 and len(agent.runner.runs) == 3

        await eventually(running, what="the pods run and count")
        for key in agent.loads.usage._pods:
            assert key is agent.runner.runs[key].name


@pytest.mark.parametrize(
    ("hot_percent", "expected"),
    [
        pytest.param(150, {"a": 3000, "b": 1000}, id="hot-node-pods-use-the-hot-percent"),
        pytest.param(300, {"a": 4000, "b": 1000}, id="never-above-the-allocatable"),
    ],
)
async def test_hot_hollow_nodes(store: Store, hot_percent: int, expected: dict[str, int]) -> None:
    nodes = {"a": _node("a", 4000), "b": _node("b", 4000)}
    reporter = LoadReporter(
        store,
        nodes,
        UsageCurve.parse("0=50"),
        LoadSettings(hot_nodes=frozenset({"a"}), hot_percent=hot_percent),
        lambda: MachineLoad(1),
    )
    reporter.usage.on_pod(_pod("p", "a", 2000))
    reporter.usage.on_pod(_pod("q", "b", 2000))
    assert {n: load.milli_cpu for n, load in reporter.measure(0.0).items()} == expected


async def test_process_node_reports_the_machines_load(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """The process node's load comes from the OS: the machine's memory in use, its network
    (from /proc/net/dev) over its link speed or the configured bandwidth, and what its pods use
    apart (none here)."""
    cfg = agent_config(
        store_url,
        store.cluster,
        tmp_path,
        hollow_nodes=0,
        process_node=True,
        network_bandwidth_bytes_per_second=777_000,
    )
    async with ServiceHost(NodeAgentService, cfg):
        [node] = (await store.list_all(pb.Node))[0]
        name = node.metadata.name

        async def reported() -> bool:
            return name in await store.node_loads()

        await eventually(reported, what="the process node's load")
        load = (await store.node_loads())[name]
        assert load.memory_bytes > 0
        assert load.network_capacity_bytes_per_second in (777_000, link_speed())
        assert load.HasField("pods_milli_cpu") and load.pods_milli_cpu == 0
