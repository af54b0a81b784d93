"""GPU cards as the node agent reports and hands them out: model names, nvidia-smi's answer (sample
outputs, a real executable, and this machine's none), node lists from CSV (table-driven, bad rows
included), a mixed cluster registered through a real store, and the cards a real process pod is
shown in its environment."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from protos.godel.v1 import objects_pb2 as pb
from services.nodeagent.gpus import (
    NO_GPUS,
    MachineGpus,
    gpu_env,
    machine_gpus,
    model_of,
    model_problem,
    parse_nvidia_smi,
)
from services.nodeagent.nodelist import (
    ListedNode,
    load_node_list,
    node_list_part,
    parse_node_list,
    parse_part,
)
from services.nodeagent.nodes import GiB, Shape, agent_nodes, listed_nodes
from services.nodeagent.service import NodeAgentConfig, NodeAgentService
from services.runtime import ConfigError, ServiceHost, load_config
from store import Store
from store.client import Fence
from tests import factories as f
from tests.test_nodeagent import agent_config, eventually, phases, process_job, read_logs

MiB = 1 << 20
OPENB_NODES = Path("/work/shared/data/openb/openb_node_list_gpu_node.csv")

# --------------------------------------------------------------------------------------------
# Model names and nvidia-smi
# --------------------------------------------------------------------------------------------

MODEL_CASES = [
    ("Tesla V100-SXM2-32GB", "V100M32"),
    ("Tesla V100-SXM2-16GB", "V100M16"),
    ("Tesla V100-PCIE-16GB", "V100M16"),
    ("Tesla P100-PCIE-16GB", "P100"),
    ("Tesla T4", "T4"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA A100-SXM4-80GB", "A100M80"),
    ("NVIDIA H100 80GB HBM3", "H100M80"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA GeForce RTX 3090", "RTX-3090"),  # the normalised fallback
    ("NVIDIA RTX A6000", "RTX-A6000"),
    ("NVIDIA", "UNKNOWN"),
]


@pytest.mark.parametrize(("name", "model"), MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_model_of_an_nvidia_smi_name(name: str, model: str) -> None:
    assert model_of(name) == model
    assert model_problem(model) is None  # every answer is a model name a node may carry


@pytest.mark.parametrize(
    ("model", "ok"),
    [("V100M32", True), ("T4", True), ("rtx-3090", True), ("", False), ("V100 M32", False),
     ("-T4", False), ("x" * 64, False)],
)  # fmt: skip
def test_model_problem(model: str, ok: bool) -> None:
    assert (model_problem(model) is None) == ok


EIGHT_V100 = "".join(f"{i}, Tesla V100-SXM2-32GB\n" for i in range(8))
NVIDIA_SMI_CASES = [
    ("eight V100 32GB", EIGHT_V100, MachineGpus(8, "V100M32")),
    ("one T4", "0, Tesla T4\n", MachineGpus(1, "T4")),
    # A machine of mixed cards reports the most common model for all (logged).
    ("mixed", "0, Tesla T4\n1, Tesla T4\n2, NVIDIA A10\n", MachineGpus(3, "T4")),
    # Blank lines and nvidia-smi's own warnings are not cards.
    ("noise", "\nWARNING: infoROM is corrupted at gpu 0000:00:04.0\n0, NVIDIA A10\n",
     MachineGpus(1, "A10")),
    ("no devices", "No devices were found\n", NO_GPUS),
    ("empty", "", NO_GPUS),
]  # fmt: skip


@pytest.mark.parametrize(
    ("output", "expected"), [c[1:] for c in NVIDIA_SMI_CASES], ids=[c[0] for c in NVIDIA_SMI_CASES]
)
def test_parse_nvidia_smi(output: str, expected: MachineGpus) -> None:
    assert parse_nvidia_smi(output) == expected


def fake_nvidia_smi(tmp_path: Path, body: str) -> str:
    """An executable that answers as nvidia-smi does (a real subprocess, a captured output)."""
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_machine_gpus_asks_nvidia_smi(tmp_path: Path) -> None:
    args = tmp_path / "args"
    answer = fake_nvidia_smi(
        tmp_path,
        f'echo "$@" > {args}\nprintf "0, Tesla V100-SXM2-16GB\\n1, Tesla V100-SXM2-16GB\\n"',
    )
    assert machine_gpus(answer) == MachineGpus(2, "V100M16")
    assert args.read_text().split() == ["--query-gpu=index,name", "--format=csv,noheader"]
    # A driver that fails (exit 9, as without a device) reports no cards; so does no nvidia-smi.
    assert (
        machine_gpus(fake_nvidia_smi(tmp_path, "echo NVIDIA-SMI has failed >&2; exit 9")) == NO_GPUS
    )
    assert machine_gpus(str(tmp_path / "absent")) == NO_GPUS


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_machine_without_nvidia_smi_has_no_gpus() -> None:
    assert machine_gpus() == NO_GPUS


# --------------------------------------------------------------------------------------------
# Node lists (CSV)
# --------------------------------------------------------------------------------------------

HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
GOOD = HEADER + "gpu-a,64000,262144,8,V100M32\ngpu-b,32000,131072,2,T4\ncpu-c,96000,393216,0,\n"
GOOD_NODES = [
    ListedNode("gpu-a", 64000, 262144 * MiB, 8, "V100M32"),
    ListedNode("gpu-b", 32000, 131072 * MiB, 2, "T4"),
    ListedNode("cpu-c", 96000, 393216 * MiB, 0, ""),
]
NODE_LIST_CASES: list[tuple[str, str, list[ListedNode] | str]] = [
    ("mixed cluster", GOOD, GOOD_NODES),
    ("columns in another order, one extra, blank lines",
     "model,gpu,sn,memory_mib,cpu_milli,rack\nA10,1,n-1,1024,1000,r1\n\n", [
         ListedNode("n-1", 1000, 1024 * MiB, 1, "A10")]),
    ("empty file", "", "nodes.csv: empty"),
    ("header only", HEADER, "nodes.csv: lists no node"),
    ("header lacks model", "sn,cpu_milli,memory_mib,gpu\nn,1,1,0\n",
     "nodes.csv line 1: header lacks column\\(s\\) model"),
    ("cards without a model", HEADER + "ok,1,1,0,\nbad,1000,1024,4,\n",
     "nodes.csv line 3 \\(bad\\): model: 4 GPU cards need their model"),
    ("a model of no cards", HEADER + "bad,1000,1024,0,T4\n",
     "nodes.csv line 2 \\(bad\\): gpu: model 'T4' given to a node of 0 cards"),
    ("negative cards", HEADER + "bad,1000,1024,-2,T4\n",
     "nodes.csv line 2 \\(bad\\): gpu: must not be negative \\(got -2\\)"),
    ("negative cpu", HEADER + "bad,-1,1024,0,\n",
     "nodes.csv line 2 \\(bad\\): cpu_milli: must not be negative"),
    ("memory not an integer", HEADER + "bad,1000,1.5Gi,0,\n",
     "nodes.csv line 2 \\(bad\\): memory_mib: '1.5Gi' is not an integer"),
    ("a model name with a space", HEADER + "bad,1000,1024,1,V100 M32\n",
     "nodes.csv line 2 \\(bad\\): model: 'V100 M32' is not a GPU model name"),
    ("a name that is not a node name", HEADER + "Bad_Node,1000,1024,0,\n",
     "nodes.csv line 2: sn: 'Bad_Node' is not a node name"),
    ("a short row", HEADER + "bad,1000,1024\n", "nodes.csv line 2: 3 fields, the header has 5"),
    ("a duplicate name", HEADER + "n,1,1,0,\nm,1,1,0,\nn,1,1,0,\n",
     "nodes.csv line 4 \\(n\\): sn: duplicate of line 2"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in NODE_LIST_CASES], ids=[c[0] for c in NODE_LIST_CASES]
)
def test_parse_node_list(text: str, expected: list[ListedNode] | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=f"^{expected}") as err:
            parse_node_list(text, "nodes.csv")
        assert "\n" not in str(err.value)
    else:
        assert parse_node_list(text, "nodes.csv") == expected


@pytest.mark.skipif(not OPENB_NODES.exists(), reason="the openb trace is not in shared/")
def test_the_openb_node_list_loads() -> None:
    nodes = load_node_list(OPENB_NODES)
    assert len(nodes) == 1213
    assert sum(n.gpus for n in nodes) == 6212
    assert nodes[0] == ListedNode("openb-node-0000", 64000, 262144 * MiB, 2, "P100")


def test_load_node_list_names_an_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"absent\.csv: cannot read"):
        load_node_list(tmp_path / "absent.csv")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"sn\xff\n")
    with pytest.raises(ValueError, match=r"binary\.csv: not UTF-8 text"):
        load_node_list(binary)


@pytest.mark.parametrize(
    ("rows", "count", "sizes"), [(7, 1, [7]), (7, 3, [3, 2, 2]), (2, 3, [1, 1, 0]), (6, 2, [3, 3])]
)
def test_node_list_parts_cover_the_list_once(rows: int, count: int, sizes: list[int]) -> None:
    nodes = [ListedNode(f"n-{i}", 1, 1, 0, "") for i in range(rows)]
    parts = [node_list_part(nodes, i, count) for i in range(count)]
    assert [len(p) for p in parts] == sizes
    assert [n for p in parts for n in p] == nodes


@pytest.mark.parametrize("text", ["1/1", "-1/2", "a/b", "2", "0/0"])
def test_parse_part_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="is not INDEX/COUNT"):
        parse_part(text)


def test_listed_nodes_carry_their_rows_shape() -> None:
    shape = Shape(max_pods=50, reclaimable_percent=20, gpus=99, gpu_model="ignored")
    nodes = listed_nodes(
        GOOD_NODES, agent="a", shape=shape, labels={"rack": "r1"}, taints=(), now=1
    )
    by_name = {n.metadata.name: n for n in nodes}
    a = by_name["gpu-a"].status
    assert (a.allocatable.milli_cpu, a.allocatable.memory_bytes) == (64000, 256 * GiB)
    assert (a.allocatable.gpus, a.gpu_model, a.allocatable.pods) == (8, "V100M32", 50)
    assert a.reclaimable.milli_cpu == 64000 * 20 // 100
    assert sum(z.capacity.gpus for z in a.topology.numa_nodes) == 8
    c = by_name["cpu-c"]
    assert (c.status.allocatable.gpus, c.status.gpu_model) == (0, "")
    assert dict(c.metadata.labels) == {
        "rack": "r1",
        "hostname": "cpu-c",
        "zone": "zone-2",
        "godel.io/mode": "hollow",
    }
    # An agent serving a list names its nodes one by one in its certificate.
    assert agent_nodes("agent-a", "", ["gpu-a", "cpu-c"]) == ["gpu-a", "cpu-c"]
    assert agent_nodes("agent-a", "host") == ["agent-a-*", "host"]


# --------------------------------------------------------------------------------------------
# The agent's options, and registration against a real store
# --------------------------------------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "nodes.csv") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_config_errors_name_the_gpu_option_and_the_row(tmp_path: Path) -> None:
    bad_row = write(tmp_path, HEADER + "gpu-a,64000,262144,8,\n")
    cases = [
        (["--hollow-gpu-model", "V100M32"], "hollow_gpu_model: given to hollow nodes of 0 cards"),
        (["--hollow-gpus", "2", "--hollow-gpu-model", "V100 M32"],
         "hollow_gpu_model: 'V100 M32' is not a GPU model name"),
        (["--hollow-node-list", bad_row],
         f"hollow_node_list: {bad_row} line 2 \\(gpu-a\\): model: 8 GPU cards need their model"),
        (["--hollow-node-list", str(tmp_path / "none.csv")], "hollow_node_list: .*cannot read"),
        (["--hollow-node-list-part", "3/3"], "hollow_node_list_part: '3/3' is not INDEX/COUNT"),
    ]  # fmt: skip
    for argv, error in cases:
        with pytest.raises(ConfigError, match=error):
            load_config(NodeAgentConfig, argv, {})


async def test_agent_registers_a_mixed_cluster_from_a_node_list(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """The node list's nodes, each its own cpu, memory, cards and model, are what the agent
    registers (hollow_nodes is not used); its second of two parts is the list's second half."""
    path = write(tmp_path, GOOD + "gpu-d,8000,16384,1,A10\n")
    cfg = agent_config(
        store_url,
        store.cluster,
        tmp_path,
        hollow_nodes=5,
        hollow_node_list=path,
        hollow_node_list_part="1/2",
        hollow_max_pods=30,
    )
    async with ServiceHost(NodeAgentService, cfg):
        nodes, _ = await store.list_all(pb.Node)
        shapes = {
            n.metadata.name: (
                n.status.allocatable.milli_cpu,
                n.status.allocatable.memory_bytes,
                n.status.allocatable.gpus,
                n.status.gpu_model,
                n.status.allocatable.pods,
                n.spec.agent,
            )
            for n in nodes
        }
        assert shapes == {
            "cpu-c": (96000, 384 * GiB, 0, "", 30, "agent-a"),
            "gpu-d": (8000, 16 * GiB, 1, "A10", 30, "agent-a"),
        }
        usage = await store.node_usage("gpu-d")
        assert usage is not None and usage.capacity["g.cpu"] == 8000


async def test_hollow_nodes_carry_their_gpu_model(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    argv = ["--hollow-nodes", "2", "--hollow-gpus", "8", "--hollow-gpu-model", "V100M32"]
    cfg = load_config(NodeAgentConfig, argv, {})
    assert (cfg.hollow_gpus, cfg.hollow_gpu_model) == (8, "V100M32")
    cfg = agent_config(
        store_url, store.cluster, tmp_path, hollow_nodes=2, hollow_gpus=8, hollow_gpu_model="T4"
    )
    async with ServiceHost(NodeAgentService, cfg):
        nodes, _ = await store.list_all(pb.Node)
        assert [(n.status.allocatable.gpus, n.status.gpu_model) for n in nodes] == [(8, "T4")] * 2


async def test_a_bad_node_list_registers_nothing(store: Store, tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "bad,1000,1024,0,T4\n")
    with pytest.raises(ConfigError, match=r"line 5 \(bad\): gpu: model 'T4'"):
        load_config(NodeAgentConfig, ["--hollow-node-list", path], {})
    assert (await store.list_all(pb.Node))[0] == []


async def test_process_node_reports_this_machines_gpus(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """What nvidia-smi says of this machine (here, where it is absent: no cards, no model)."""
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=0, process_node=True)
    expected = machine_gpus()
    async with ServiceHost(NodeAgentService, cfg):
        [node] = (await store.list_all(pb.Node))[0]
        assert node.status.allocatable.gpus == expected.cards
        assert node.status.gpu_model == expected.model


# --------------------------------------------------------------------------------------------
# A process pod's cards
# --------------------------------------------------------------------------------------------


def test_gpu_env_of_whole_cards_a_share_and_none() -> None:
    pod = pb.Pod()
    assert gpu_env(pod) == {"CUDA_VISIBLE_DEVICES": "", "GODEL_GPU_MILLI": "0"}
    pod.spec.gpu_cards.extend([0, 3])
    assert gpu_env(pod) == {"CUDA_VISIBLE_DEVICES": "0,3", "GODEL_GPU_MILLI": "1000"}
    del pod.spec.gpu_cards[:]
    pod.spec.gpu_cards.append(2)
    pod.spec.template.gpu_milli = 300
    assert gpu_env(pod) == {"CUDA_VISIBLE_DEVICES": "2", "GODEL_GPU_MILLI": "300"}


async def test_process_pods_see_the_cards_they_were_given(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """A real process pod prints its environment: CUDA_VISIBLE_DEVICES is the cards the Binder
    wrote into spec.gpu_cards (empty for a pod of none, so it sees none) and GODEL_GPU_MILLI its
    share; a template that sets CUDA_VISIBLE_DEVICES itself does not widen what it sees."""
    cfg = agent_config(store_url, store.cluster, tmp_path, hollow_nodes=0, process_node=True)
    show = ["sh", "-c", 'echo "cuda=[${CUDA_VISIBLE_DEVICES-unset}] milli=$GODEL_GPU_MILLI"']
    async with ServiceHost(NodeAgentService, cfg) as host:
        [node] = [n.metadata.name for n in (await store.list_all(pb.Node))[0]]
        _, lease = await store.acquire_lease("binder", "test-binder", 60_000)
        fence = Fence("binder", lease.epoch)
        cases = {
            "whole": ([0, 1], 0, {}),
            "share": ([2], 300, {}),
            "none": ([], 0, {}),
            "widens": ([1], 0, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}),
        }
        for name, (cards, milli, env) in cases.items():
            job = process_job(name, show)
            job.spec.template.gpu_milli = milli
            job.spec.template.env.update(env)
            pod = f.pods_of(job)[0]
            await store.create_unit(job, [pod])
            pod.spec.node_name = node
            pod.spec.gpu_cards.extend(cards)
            pod.status.phase = pb.POD_BOUND
            await store.bind([pod], fence=fence)
        pods = [f"{name}-0" for name in cases]

        async def done() -> bool:
            return all(ph == pb.POD_SUCCEEDED for ph in await phases(store, pods))

        await eventually(done, timeout=30, what="GPU pods finished")
        logs = {name: await read_logs(host.address, f"{name}-0") for name in cases}
        assert logs == {
            "whole": b"cuda=[0,1] milli=1000\n",
            "share": b"cuda=[2] milli=300\n",
            "none": b"cuda=[] milli=0\n",
            "widens": b"cuda=[1] milli=1000\n",
        }
