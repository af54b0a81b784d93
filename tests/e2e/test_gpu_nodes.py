"""A mixed GPU cluster from a node list, through real services: two node agents (mutual TLS, each
certificate naming its part of the list) register the list's nodes with their cards and models,
`godel get nodes -o wide`, `godel describe node` and the dashboard (in a real browser) show them,
and a job's GPU fields go through the dispatcher and come back in `godel get -o yaml`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import Cluster, wait_until
from tests.e2e.test_dashboard import browser, text_of

__all__ = ["browser"]  # the fixture, shared with the dashboard's own test

pytestmark = pytest.mark.e2e

NODE_LIST = """sn,cpu_milli,memory_mib,gpu,model
gpu-a,64000,262144,8,V100M32
gpu-b,32000,131072,2,T4
cpu-c,96000,393216,0,
"""

GPU_JOB = """apiVersion: godel/v1
kind: Job
metadata: {name: share}
spec:
  replicas: 1
  template:
    requests: {cpu: 1, memory: 1Gi, gpu: 1}
    gpuMilli: 300
    gpuModels: [T4]
"""


def test_a_node_list_cluster_shows_its_cards(
    make_cluster: Callable[..., Cluster], browser: WebDriver, tmp_path: Path
) -> None:
    node_list = tmp_path / "nodes.csv"
    node_list.write_text(NODE_LIST)
    cluster = make_cluster(
        schedulers=1, binders=1, nodeagents=2, hollow_node_list=str(node_list), dashboard=True
    )

    def nodes() -> dict[str, pb.Node]:
        return {n.metadata.name: n for n in cluster.client.list(pb.Node)}

    registered = wait_until(lambda: len(nodes()) == 3 and nodes(), what="the listed nodes")
    assert {name: n.spec.agent for name, n in registered.items()} == {
        "gpu-a": "nodeagent-0",
        "gpu-b": "nodeagent-0",
        "cpu-c": "nodeagent-1",
    }

    wide = cluster.godel("get", "nodes", "-o", "wide").stdout.splitlines()
    header = wide[0].split()
    gpus, model = header.index("GPUS"), header.index("GPU-MODEL")
    rows = {line.split()[0]: line.split() for line in wide[1:]}
    assert (rows["gpu-a"][gpus], rows["gpu-a"][model]) == ("8", "V100M32")
    assert (rows["gpu-b"][gpus], rows["gpu-b"][model]) == ("2", "T4")
    assert (rows["cpu-c"][gpus], rows["cpu-c"][model]) == ("0", "<none>")

    described = cluster.godel("describe", "node", "gpu-b").stdout
    assert "gpuModel: T4" in described
    cards = described[described.index("gpu cards:") :].splitlines()
    assert cards[0] == "gpu cards: 2 T4, 2 free"
    assert [line.split()[:2] for line in cards[2:4]] == [["0", "0m"], ["1", "0m"]]
    assert "gpu cards:" not in cluster.godel("describe", "node", "cpu-c").stdout

    applied = cluster.godel("apply", "-f", "-", stdin=GPU_JOB)
    assert applied.stdout.strip() == "job/share created"
    template = yaml.safe_load(cluster.godel("get", "job", "share", "-o", "yaml").stdout)["spec"][
        "template"
    ]
    assert (template["requests"]["gpus"], template["gpuMilli"], template["gpuModels"]) == (
        1,
        300,
        ["T4"],
    )
    cluster.godel("delete", "job", "share")

    browser.get(cluster.component("dashboard").web_url)
    wait = WebDriverWait(browser, 60, poll_frequency=0.2)
    wait.until(
        lambda d: text_of(d, "gpus").splitlines()[1:] == ["V100M32 1 8 0 / 8", "T4 1 2 0 / 2"]
    )
    # The GPU fragmentation under the table, live (placement.gpu.gpu_figures): no GPU pod runs.
    wait.until(
        lambda d: (
            text_of(d, "gpu-fragmentation")
            == "fragmentation: expected 0 %, whole-machine 0 % of 10 free GPUs; "
            "2 whole free GPU nodes"
        )
    )
    screenshot = tmp_path / "dashboard-gpus.png"
    browser.save_screenshot(str(screenshot))
    print(f"dashboard screenshot: {screenshot}")
