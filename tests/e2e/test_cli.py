"""The `godel` CLI against a real local cluster: the README's walk-through, output formats,
describe/delete, and scaling scheduler shards."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import Cluster, wait_until

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_walkthrough_outputs_describe_delete(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=20, process_node=True)
    wait_until(lambda: len(cluster.client.list("Node")) == 21, what="nodes registered")
    out = cluster.godel(
        "apply",
        "-f",
        str(EXAMPLES / "queue.yaml"),
        "-f",
        str(EXAMPLES / "gang-batch-job.yaml"),
        "-f",
        str(EXAMPLES / "online-service.yaml"),
    ).stdout
    assert out.splitlines() == ["queue/research created", "job/train created", "job/web created"]
    wait_until(
        lambda: all(p.spec.node_name for p in cluster.client.list("Pod", job="train")),
        what="the gang bound",
    )
    # First, while the pod runs: the example's pods live 30 s, and on a loaded machine the
    # calls below have outlasted them (a finished pod's scheduling line says it completed).
    assert "bound to" in cluster.godel("describe", "pod", "train-0").stdout

    table = cluster.godel("get", "jobs").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "QUEUE", "QOS"] and len(table) == 3
    wide = cluster.godel("get", "pods", "--job", "train", "-o", "wide").stdout.splitlines()
    assert "SCHEDULER" in wide[0] and len(wide) == 9
    as_json = json.loads(cluster.godel("get", "job", "train", "-o", "json").stdout)
    assert as_json["kind"] == "Job" and as_json["spec"]["minMember"] == 8
    as_yaml = yaml.safe_load(cluster.godel("get", "nodes", "-o", "yaml").stdout)
    assert as_yaml["kind"] == "List"
    assert len(as_yaml["items"]) == 21 and {d["kind"] for d in as_yaml["items"]} == {"Node"}
    assert cluster.godel("get", "pods", "-o", "name").stdout.startswith("pod/")

    described = cluster.godel("describe", "job/train").stdout
    assert "minMember: 8" in described and "train-7" in described

    assert cluster.godel("delete", "job", "train").stdout.strip() == "job/train deleted"
    assert cluster.client.list("Pod", job="train") == []
    missing = cluster.godel("get", "job", "train", check=False)
    assert missing.returncode != 0 and "not found" in missing.stderr.lower()
    unknown = cluster.godel("get", "widgets", check=False)
    assert unknown.returncode != 0 and "unknown resource type" in unknown.stderr


def test_scale_scheduler_shards(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=5)

    def shards() -> int:
        return len(cluster.client.list("SchedulerInstance"))

    wait_until(lambda: shards() == 1, what="one shard registered")
    out = cluster.godel("scale", "scheduler=3").stdout
    assert out.count("started") == 2
    wait_until(lambda: shards() == 3, what="three shards registered")
    cluster.godel("scale", "scheduler=1")
    wait_until(lambda: shards() == 1, what="back to one shard")
    bad = cluster.godel("scale", "dispatcher=2", check=False)
    assert bad.returncode != 0 and "cannot scale" in bad.stderr
