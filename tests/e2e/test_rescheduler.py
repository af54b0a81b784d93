"""The rescheduler end to end: a real cluster (every service its own process), policies run over
the Trigger RPC and through `godel reschedule`, and a dry run that simulates without changing
anything stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from godel.client import ClientError, ReschedulerClient
from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import Cluster, wait_until
from tests.factories import job as make_job

pytestmark = pytest.mark.e2e

GPU_NODES = ("nodeagent", ("--hollow-gpus", "8", "--hollow-cpu-milli", "64000"))


def spread_gpu_pods(tmp_path: Path) -> tuple[str, tuple[str, ...]]:
    """The shards' arguments for a profile that spreads GPU pods (LeastAllocated, GPUs counted,
    as kube-scheduler does): the default profile's GpuFragmentation score packs one-GPU pods
    onto few nodes, which leaves nothing for a GPU defragmentation to do."""
    profile = tmp_path / "spread-gpu-pods.yaml"
    profile.write_text(
        "scores:\n  - {name: LeastAllocated, weight: 1}\n"
        "args:\n  LeastAllocated: {cpu: 1, memory: 1, gpu: 1}\n"
    )
    return ("scheduler", ("--profile", str(profile)))


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
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(
        schedulers=1,
        binders=1,
        hollow_nodes=200,
        service_args=(GPU_NODES, spread_gpu_pods(tmp_path)),
    )
    wait_until(lambda: len(cluster.client.list("Node")) == 200, 120, "200 nodes registered")
    # 400 one-GPU pods: least-allocated scoring spreads them, about 2 per node: nearly every
    # node has some GPUs busy and none is whole.
    jobs = [gpu_job(f"train-{i}", 40) for i in range(10)]
    jobs[0].spec.min_member = 40  # a running gang: moved whole or not at all
    cluster.client.submit(jobs)
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
    # The gang (train-0) is moved whole, in one batch, or not at all.
    gang = [m for m in plan["moves"] if m["job"] == "train-0"]
    assert len(gang) in (0, 40), gang
    assert len({m.get("batch", 0) for m in gang}) <= 1, gang

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


# --------------------------------------------------------------------------------------------
# Executed rounds: Movements, acknowledgement, eviction through the Binder, replacements
# --------------------------------------------------------------------------------------------

TWO_NODES = ("nodeagent", ("--hollow-cpu-milli", "4000"))


def cordon(cluster: Cluster, node: str, unschedulable: bool) -> None:
    obj = cluster.client.get("Node", node)
    assert isinstance(obj, pb.Node)
    obj.spec.unschedulable = unschedulable
    result = cluster.client.apply([("Node", obj)])
    assert result.results[0].action in ("configured", "unchanged"), result


def pods_on(cluster: Cluster, node: str) -> list[pb.Pod]:
    return [
        p
        for p in cluster.client.list("Pod")
        if isinstance(p, pb.Pod) and p.spec.node_name == node and p.status.phase == pb.POD_RUNNING
    ]


def original_case(cluster: Cluster) -> tuple[str, str]:
    """The original rescheduler's case: two 4-CPU nodes, three 1-CPU pods on the first, one
    1-CPU pod of a job `web` on the second. Returns (the busy node, the lone pod's node)."""
    wait_until(lambda: len(cluster.client.list("Node")) == 2, 60, "2 nodes")
    n1, n2 = sorted(n.metadata.name for n in cluster.client.list("Node"))  # type: ignore[attr-defined]
    cordon(cluster, n2, True)
    cluster.client.submit([make_job("base", replicas=3, cpu=1000)])
    wait_until(lambda: len(pods_on(cluster, n1)) == 3, 60, "3 pods running on the first node")
    cordon(cluster, n2, False)
    cordon(cluster, n1, True)
    cluster.client.submit([make_job("web", cpu=1000)])
    wait_until(lambda: len(pods_on(cluster, n2)) == 1, 60, "web-0 running on the second node")
    cordon(cluster, n1, False)
    return n1, n2


def test_binpacking_round_moves_the_lone_pod_through_one_movement(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=2, binders=1, hollow_nodes=2, service_args=(TWO_NODES,))
    n1, n2 = original_case(cluster)
    with ReschedulerClient(cluster.state.address_of("rescheduler")) as client:
        [plan] = client.trigger("binpacking").plans
    assert plan.outcome == "planned", plan.message
    assert [(m.pod, m.from_node, m.to_node) for m in plan.moves] == [("web-0", n2, n1)]
    assert plan.evicted == 1 and len(plan.movements) == 1

    [movement] = cluster.client.list("Movement")
    assert isinstance(movement, pb.Movement)
    assert [(o.job, [(r.node, r.desired_pod_count) for r in o.recommended_nodes])
            for o in movement.status.owners] == [("web", [(n1, 1)])]  # fmt: skip
    assert [t.pod for t in movement.spec.deleted_tasks] == ["web-0"]
    # Both shards acknowledged before anything was evicted.
    assert len(movement.status.notified_schedulers) == 2

    evicted = cluster.client.get("Pod", "web-0")
    assert isinstance(evicted, pb.Pod)
    assert (evicted.status.phase, evicted.status.reason) == (pb.POD_FAILED, "Rescheduled")
    wait_until(lambda: not pods_on(cluster, n2) and len(pods_on(cluster, n1)) == 4, 60,
               "the second node empty, the replacement running on the first")  # fmt: skip

    def recorded() -> pb.Movement | None:
        m = cluster.client.get("Movement", movement.metadata.name)
        assert isinstance(m, pb.Movement)
        actual = [t.pod for r in m.status.owners[0].recommended_nodes for t in r.actual_pods]
        return m if actual and m.status.phase == "Done" else None

    done = wait_until(recorded, 60, "the replacement recorded as actual")
    [landed] = done.status.owners[0].recommended_nodes[0].actual_pods
    assert landed.node == n1 and landed.pod.startswith("web-0-r")
    assert not done.status.owners[0].mismatched_tasks
    listing = cluster.godel("get", "movements").stdout
    assert movement.metadata.name in listing and "Done" in listing
    described = cluster.godel("describe", "movement", movement.metadata.name).stdout
    assert "acknowledged by" in described and landed.pod in described
    # The movement and the eviction it made are events: planned and done on the Movement (the
    # end of its describe), Rescheduled on the pod, related to the node it left.

    def events() -> dict[tuple[str, str], pb.Event]:
        listed = [e for e in cluster.client.list("Event") if isinstance(e, pb.Event)]
        return {(e.reason, e.regarding.name): e for e in listed}

    name = movement.metadata.name
    wanted = {("MovementPlanned", name), ("MovementDone", name), ("Rescheduled", "web-0")}
    seen = wait_until(lambda: (found := events()).keys() >= wanted and found, what="events")
    assert seen["Rescheduled", "web-0"].related.name == n2
    tail = cluster.godel("describe", "movement", name).stdout.split("events:")[-1]
    assert "MovementPlanned" in tail and "MovementDone" in tail


def test_a_budget_of_zero_keeps_the_pod_and_makes_no_movement(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2, service_args=(TWO_NODES,))
    _, n2 = original_case(cluster)
    budget = pb.DisruptionBudget(metadata=pb.ObjectMeta(name="web"))
    budget.spec.job = "web"
    budget.spec.max_unavailable = 0
    assert cluster.client.apply([("DisruptionBudget", budget)]).results[0].action == "created"
    with ReschedulerClient(cluster.state.address_of("rescheduler")) as client:
        [plan] = client.trigger("binpacking").plans
    assert plan.moves == [] and plan.evicted == 0 and plan.outcome != "planned"
    assert cluster.client.list("Movement") == []
    assert [p.metadata.name for p in pods_on(cluster, n2)] == ["web-0"]


def test_pause_stops_rounds_until_resumed(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2, service_args=(TWO_NODES,))
    _, n2 = original_case(cluster)
    assert "paused" in cluster.godel("reschedule", "--pause").stdout
    refused = cluster.godel("reschedule", "binpacking", check=False)
    assert refused.returncode != 0 and "paused" in refused.stderr
    # A dry run changes nothing, so it still works.
    assert (
        '"outcome": "planned"'
        in cluster.godel("reschedule", "binpacking", "--dry-run", "-o", "json").stdout
    )
    assert "PAUSED" in cluster.godel("get", "policies").stderr
    assert [p.metadata.name for p in pods_on(cluster, n2)] == ["web-0"]
    assert "resumed" in cluster.godel("reschedule", "--resume").stdout
    cluster.godel("reschedule", "binpacking")
    wait_until(lambda: not pods_on(cluster, n2), 60, "the second node emptied after resuming")


SHARE_NODES = ("nodeagent", ("--hollow-gpus", "2", "--hollow-cpu-milli", "64000"))
# The GPU gauges recomputed every second, so the test sees them follow the cluster.
FIGURES_EVERY_SECOND = ("rescheduler", ("--gpu-figures-seconds", "1"))


def share_job(name: str, milli: int, cpu: int = 2000) -> pb.Job:
    job = make_job(name, replicas=1, cpu=cpu)
    job.spec.template.requests.gpus = 1
    job.spec.template.gpu_milli = milli
    return job


def rescheduler_gauge(cluster: Cluster, name: str) -> float | None:
    [rescheduler] = [c for c in cluster.state.components if c.kind == "rescheduler"]
    with urllib.request.urlopen(f"http://{rescheduler.metrics_address}/metrics", timeout=10) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


def dashboard_gpu_fragmentation(cluster: Cluster) -> dict[str, float]:
    url = cluster.component("dashboard").web_url.rstrip("/") + "/api/summary"
    with urllib.request.urlopen(url, timeout=10) as response:
        summary: dict[str, dict[str, float]] = json.loads(response.read())
    return summary["gpu_fragmentation"]


def test_gpu_defrag_moves_a_share_and_expected_fragmentation_falls_live(
    make_cluster: Callable[..., Cluster],
) -> None:
    """Three 2-card hollow nodes: a 2-card pod on one, a 300 share on each of the others (a
    CPU blocker keeps the second share off the first's node while it is placed). Mix {300 ×2,
    2 cards}: both share nodes strand all their free GPU for the 2-card task, 3,400 of 3,400
    free milli: expected fragmentation 1/3. gpu-defrag puts one share beside the other (the
    dry run says so, and the rescheduler's metrics and the dashboard say so before and after
    it runs): 1,400 stranded, and a node comes whole."""
    cluster = make_cluster(
        schedulers=1,
        binders=1,
        hollow_nodes=3,
        dashboard=True,
        service_args=(SHARE_NODES, FIGURES_EVERY_SECOND),
    )
    wait_until(lambda: len(cluster.client.list("Node")) == 3, 60, "3 nodes registered")
    wide = make_job("wide", replicas=1, cpu=1000)
    wide.spec.template.requests.gpus = 2
    cluster.client.submit([wide])
    wait_until(lambda: running(cluster) and positions(cluster).get("wide-0"), 60, "wide running")
    cluster.client.submit([share_job("share-a", 300)])
    wait_until(lambda: running(cluster) and positions(cluster).get("share-a-0"), 60, "share-a")
    first = positions(cluster)["share-a-0"]
    blocker = make_job("blocker", replicas=1, cpu=61_000)
    blocker.spec.template.node_selector["hostname"] = first
    cluster.client.submit([blocker])
    wait_until(lambda: running(cluster) and positions(cluster).get("blocker-0"), 60, "blocker")
    cluster.client.submit([share_job("share-b", 300)])
    wait_until(lambda: running(cluster) and positions(cluster).get("share-b-0"), 60, "share-b")
    cluster.godel("delete", "job", "blocker")
    wait_until(lambda: "blocker-0" not in positions(cluster), 60, "the blocker gone")
    where = positions(cluster)
    assert len({where["wide-0"], where["share-a-0"], where["share-b-0"]}) == 3, where

    third = 1 / 3
    expected = "godel_rescheduler_gpu_expected_fragmentation_ratio"
    wait_until(
        lambda: abs((rescheduler_gauge(cluster, expected) or 0) - third) < 1e-6,
        60,
        "the rescheduler's expected fragmentation gauge at 1/3",
    )
    assert rescheduler_gauge(cluster, "godel_rescheduler_whole_free_gpu_nodes") == 0
    wait_until(
        lambda: dashboard_gpu_fragmentation(cluster)["expected_percent"] == 33.3,
        60,
        "the dashboard's expected fragmentation at 33.3 %",
    )

    [dry] = json.loads(cluster.godel("reschedule", "gpu-defrag", "--dry-run", "-o", "json").stdout)
    assert dry["outcome"] == "planned", dry
    assert [m["pod"] for m in dry["moves"]] in (["share-a-0"], ["share-b-0"]), dry
    assert dry["before"]["expectedGpuFragmentation"] == pytest.approx(third)
    after = 1400 / (3 * 3400)
    assert dry["after"]["expectedGpuFragmentation"] == pytest.approx(after)
    table = cluster.godel("reschedule", "gpu-defrag", "--dry-run").stdout
    assert "expected gpu fragmentation" in table, table

    with ReschedulerClient(cluster.state.address_of("rescheduler"), timeout=300) as client:
        [plan] = client.trigger("gpu-defrag").plans
    assert plan.outcome == "planned" and plan.evicted == 1, plan.message
    [move] = plan.moves

    def replaced() -> bool:
        pods = [p for p in cluster.client.list("Pod") if isinstance(p, pb.Pod)]
        live = [p for p in pods if p.spec.job == move.job and p.status.phase == pb.POD_RUNNING]
        return len(live) == 1 and live[0].spec.node_name == move.to_node

    wait_until(replaced, 120, "the moved share running on its target")
    # Live, without another round: the gauges and the dashboard follow the cluster.
    wait_until(
        lambda: abs((rescheduler_gauge(cluster, expected) or 0) - after) < 1e-6,
        60,
        "the rescheduler's expected fragmentation gauge lowered",
    )
    assert rescheduler_gauge(cluster, "godel_rescheduler_whole_free_gpu_nodes") == 1
    wait_until(
        lambda: (
            dashboard_gpu_fragmentation(cluster)
            == {
                "expected_percent": round(100 * after, 1),
                "fragmentation_percent": round(100 * 1400 / 3400, 1),
                "whole_free_nodes": 1,
                "free_gpus": 3.4,
            }
        ),
        60,
        "the dashboard's figures lowered",
    )
