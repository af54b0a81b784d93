"""How the CLI shows GPU cards: a pod's cards in `get pods -o wide`, a node's model and cards in
`get nodes -o wide`, each card's use in `describe node`; and the `godel up` options that give
simulated nodes their cards (what each node agent is started with, and what is refused before
anything starts)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from godel import local
from godel.cli.resources import _describe_gpu_cards, _print
from protos.godel.v1 import objects_pb2 as pb


def pod(
    name: str, cards: list[int], milli: int = 0, phase: pb.PodPhase.ValueType = pb.POD_RUNNING
) -> pb.Pod:
    p = pb.Pod(metadata=pb.ObjectMeta(name=name))
    p.spec.job, p.spec.node_name = "j", "gpu-a"
    p.spec.gpu_cards.extend(cards)
    p.spec.template.gpu_milli = milli
    p.status.phase = phase
    return p


def table(text: str) -> list[dict[str, str]]:
    """A printed table's rows by header, each cell read at its column's position."""
    lines = text.splitlines()
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    rows = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(header.split(), cells, strict=True)))
    return rows


def test_get_pods_wide_shows_their_cards(capsys: pytest.CaptureFixture[str]) -> None:
    pods = [pod("whole-0", [0, 1]), pod("share-0", [2], milli=300), pod("none-0", [])]
    _print("Pod", pods, "wide")
    rows = {r["NAME"]: r["GPU"] for r in table(capsys.readouterr().out)}
    assert rows == {"whole-0": "0,1", "share-0": "2 (300m)", "none-0": "<none>"}
    _print("Pod", pods, "table")
    assert "GPU" not in capsys.readouterr().out  # wide only


def test_get_nodes_wide_shows_model_and_cards(capsys: pytest.CaptureFixture[str]) -> None:
    gpu = pb.Node(metadata=pb.ObjectMeta(name="gpu-a"))
    gpu.status.allocatable.gpus, gpu.status.gpu_model = 8, "V100M32"
    cpu = pb.Node(metadata=pb.ObjectMeta(name="cpu-c"))
    _print("Node", [gpu, cpu], "wide")
    rows = {r["NAME"]: (r["GPUS"], r["GPU-MODEL"]) for r in table(capsys.readouterr().out)}
    assert rows == {"gpu-a": ("8", "V100M32"), "cpu-c": ("0", "<none>")}


def test_describe_node_lists_each_card(capsys: pytest.CaptureFixture[str]) -> None:
    node = pb.Node(metadata=pb.ObjectMeta(name="gpu-a"))
    node.status.allocatable.gpus, node.status.gpu_model = 4, "T4"
    pods = [
        pod("whole-0", [0, 1]),
        pod("share-0", [2], milli=300),
        pod("share-1", [2], milli=500),
        pod("done-0", [3], phase=pb.POD_SUCCEEDED),  # finished: its card is free again
    ]
    _describe_gpu_cards(node, pods)
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "gpu cards: 4 T4, 1 free"
    rows = [(r["CARD"], r["USED"], r["PODS"]) for r in table("\n".join(out.splitlines()[1:]))]
    assert rows == [
        ("0", "1000m", "whole-0"),
        ("1", "1000m", "whole-0"),
        ("2", "800m", "share-0,share-1"),
        ("3", "0m", "<none>"),
    ]


def test_up_passes_each_agent_its_cards_and_part_of_the_node_list(tmp_path: Path) -> None:
    spec = local.ClusterSpec(nodeagents=2, hollow_nodes=5, hollow_gpus=8, hollow_gpu_model="T4")
    assert spec.args_for("nodeagent-1", "nodeagent")[:2] == ["--hollow-nodes", "2"]
    assert spec.args_for("nodeagent-1", "nodeagent")[2:6] == [
        "--hollow-gpus", "8", "--hollow-gpu-model", "T4",
    ]  # fmt: skip
    csv = tmp_path / "nodes.csv"
    csv.write_text("sn,cpu_milli,memory_mib,gpu,model\na,1000,1024,2,T4\nb,1000,1024,0,\n")
    listed = local.ClusterSpec(nodeagents=2, hollow_node_list=str(csv), process_node=False)
    assert listed.args_for("nodeagent-1", "nodeagent")[:4] == [
        "--hollow-node-list", str(csv.resolve()), "--hollow-node-list-part", "1/2",
    ]  # fmt: skip
    # Each agent's certificate names its own part of the list, node by node.
    assert listed.agents() == {"nodeagent-0": ["a"], "nodeagent-1": ["b"]}


def godel_up(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GODEL_REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "godel", "up", *args],
        env={**env, "GODEL_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--hollow-gpu-model", "V100M32"], "--hollow-gpu-model: give --hollow-gpus too"),
        (["--hollow-gpus", "2", "--hollow-gpu-model", "V100 M32"],
         "--hollow-gpu-model: 'V100 M32' is not a GPU model name"),
        (["--hollow-node-list", "{bad}"],
         "--hollow-node-list: {bad} line 3 (cpu-c): gpu: model 'T4' given to a node of 0 cards"),
        (["--hollow-node-list", "{bad}", "--hollow-nodes", "3"],
         "--hollow-node-list names the simulated nodes: no --hollow-nodes with it"),
        (["--hollow-node-list", "{good}", "--hollow-gpus", "2"],
         "--hollow-node-list gives each node its cards and model"),
    ],
)  # fmt: skip
def test_up_refuses_bad_gpu_options_before_starting_anything(
    tmp_path: Path, args: list[str], error: str
) -> None:
    bad, good = tmp_path / "bad.csv", tmp_path / "good.csv"
    bad.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\ngpu-a,1000,1024,2,T4\ncpu-c,1000,1024,0,T4\n"
    )
    good.write_text("sn,cpu_milli,memory_mib,gpu,model\ngpu-a,1000,1024,2,T4\n")
    home = tmp_path / "home"
    paths = {"bad": str(bad), "good": str(good)}
    result = godel_up(home, *(a.format(**paths) for a in args))
    assert result.returncode != 0
    message = result.stderr.strip()
    assert error.format(**paths) in message
    assert "\n" not in message, "one line"
    assert not (home / "cluster.json").exists()
