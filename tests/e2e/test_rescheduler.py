"""The rescheduler end to end: a real cluster (every service its own process), policies run over
the Trigger RPC and through `godel reschedule`, and a dry run that simulates without changing
anything stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import yaml

from godel.client import ClientError, ReschedulerClient
from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import Cluster, wait_until
from tests.factories import job as make_job

pytestmark = pytest.mark.e2e

GPU_NODES = ("nodeagent", ("--hollow-gpus", "8", "--hollow-cpu-milli", "64000"))


def gpu_job(name: str, replicas: int) -> pb.Job:
    job = make_job(name, replicas=replicas, cpu=1000)
    job.spec.template.requests.gpus = 1
    return job


def positions(cluster: Cluster) -> dict[str, str]:
    return {p.metadata.name: p.spec.node_name for p in cluster.client.list("Pod")}  # type: ignore[attr-defined]


def versions(cluster: Cluster) -> dict[str, int]:
    """Every pod's, node's and job's resource_version: a round that writes anything changes one.
    (The store's revision itself moves under shard heartbeats, so it cannot tell.)"""
    out = {}
    for kind in ("Pod", "Node", "Job", "Movement"):
        for obj in cluster.client.list(kind):
            out[f"{kind}/{obj.metadata.name}"] = obj.metadata.resource_version  # type: ignore[attr-defined]
    return out


def running(cluster: Cluster) -> bool:
    return all(p.status.phase == pb.POD_RUNNING for p in cluster.client.list("Pod"))  # type: ignore[attr-defined]


def test_dry_run_on_a_fragmented_gpu_cluster_predicts_free_nodes_and_changes_nothing(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=200, service_args=(GPU_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 200, 120, "200 nodes registered")
    # 400 one-GPU pods: least-allocated scoring spreads them, about 2 per node: nearly every
    # node has some GPUs busy and none is whole.
    cluster.client.submit([gpu_job(f"train-{i}", 40) for i in range(10)])
    wait_until(lambda: running(cluster), 180, "every pod running")
    wait_until(lambda: cluster.client.get("Job", "train-9").status.running == 40, 60, "job status")  # type: ignore[attr-defined]
    before = versions(cluster)

    result = cluster.godel("reschedule", "gpu-defrag", "--dry-run", "-o", "json")
    [plan] = json.loads(result.stdout)
    assert plan["outcome"] == "planned", plan
    assert plan["dryRun"] is True and plan["trigger"] == "rpc"
    before_fig, after_fig = plan["before"], plan["after"]
    assert before_fig["gpuFragmentation"] > 0.5
    assert after_fig.get("gpuFragmentation", 0.0) < before_fig["gpuFragmentation"]
    assert after_fig["wholeFreeGpuNodes"] > before_fig.get("wholeFreeGpuNodes", 0) + 50
    assert after_fig.get("unplacedPods", 0) == 0
    assert all(m.get("simulatedNode") for m in plan["moves"])

    # Nothing stored changed: no pod, node or job written, no Movement made.
    assert versions(cluster) == before
    assert not any(key.startswith("Movement/") for key in before)

    table = cluster.godel("reschedule", "gpu-defrag", "--dry-run").stdout
    assert "gpu fragmentation" in table and "SIMULATED" in table
    listing = cluster.godel("get", "policies").stdout
    assert "gpu-defrag" in listing and "planned" in listing


def test_trigger_rpc_runs_exactly_one_round_and_lists_it(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=10)
    wait_until(lambda: len(cluster.client.list("Node")) == 10, 60, "10 nodes")
    cluster.client.submit([make_job("web", replicas=10, cpu=200)])
    wait_until(lambda: all(positions(cluster).values()), 60, "every pod bound")
    with ReschedulerClient(cluster.state.address_of("rescheduler")) as client:
        first = {p.name: p.last_run_ms for p in client.policies()}
        assert set(first) >= {"binpacking", "gpu-defrag", "load-balance", "zone-spread"}
        assert all(ms == 0 for ms in first.values())

        response = client.trigger("binpacking", dry_run=True)
        assert [p.policy for p in response.plans] == ["binpacking"]
        generation = response.generation
        listed = {p.name: p for p in client.policies()}
        assert listed["binpacking"].last_round.generation == generation
        assert listed["binpacking"].last_run_ms > 0
        # Exactly one round ran: no other policy has a round.
        assert all(listed[n].last_run_ms == 0 for n in listed if n != "binpacking")

        with pytest.raises(ClientError) as unknown:
            client.trigger("no-such-policy")
        assert unknown.value.code == grpc.StatusCode.NOT_FOUND
        assert "unknown policy 'no-such-policy'" in str(unknown.value)


def test_an_unknown_check_name_is_a_start_up_error_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "rescheduler.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "policies": [
                    {
                        "name": "pack",
                        "detector": {"name": "BinPacking"},
                        "algorithm": {"name": "BinPacking"},
                        "checks": ["Protection", "NoSuchCheck"],
                    }
                ]
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "services.rescheduler", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GODEL_STORE_URL": "redis://127.0.0.1:1/0"},
    )
    assert result.returncode == 2
    assert "NoSuchCheck" in result.stderr and "pack" in result.stderr
