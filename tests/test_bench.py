"""The benchmark harness: workload-file validation (fast, table-driven) and one quick workload
end to end through the real harness. Never a speed assertion: speed is what the harness
reports, not what a test checks."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import (
    bigjob,
    fairness,
    faults,
    gpucluster,
    gpufrag_sim,
    gputrace_replay,
    gputrace_services,
    harness,
    idle,
    memory,
    workload,
)
from bench.gputrace import POD_LISTS, TraceError, TraceNode, load_timed_pods
from bench.load import batches, build_jobs
from bench.workload import PodPhase, WorkloadError
from godel.local import ClusterState, ComponentRecord
from placement.framework import load_profile
from placement.gpufrag import TaskShape, place
from placement.plugins import new_in_tree_registry
from protos.godel.v1 import objects_pb2 as pb
from services.rescheduler.service import ReschedulerConfig
from services.runtime.metrics import MetricsServer
from store.metrics import INFORMER_LAG

ROOT = Path(__file__).resolve().parent.parent
OPENB_NODES = "bench/data/openb/openb_node_list_gpu_node.csv"

VALID: dict[str, Any] = {
    "name": "w",
    "cluster": {"nodes": 10},
    "measured": {"count": 20, "job_size": 10, "template": {"requests": {"cpu": "100m"}}},
}


def _with(path: str, value: Any) -> dict[str, Any]:
    """VALID with one field (dotted path) replaced; value None deletes it."""
    doc: dict[str, Any] = yaml.safe_load(yaml.safe_dump(VALID))
    *parents, last = path.split(".")
    target = doc
    for p in parents:
        target = target.setdefault(p, {})
    if value is None:
        target.pop(last, None)
    else:
        target[last] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("name", "bad name!", "w.yaml: name:"),
        ("name", "other", "must equal the file name"),
        ("cluster.nodes", 0, "cluster.nodes: must be at least 1"),
        ("cluster.nodes", "many", "cluster.nodes: must be an integer"),
        ("cluster.node", {"cpu": "4x"}, "cluster.node.cpu"),
        ("cluster.zones", 3, "cluster.zones: unknown field"),
        ("cluster.scheduler", ["kube"], "cluster.scheduler: must be a mapping"),
        ("measured", None, "measured: must be a mapping"),
        ("measured.count", -1, "measured.count: must be at least 1"),
        ("measured.min_member", 11, "measured.min_member: 11 exceeds job_size 10"),
        ("measured.gang_percent", 101, "measured.gang_percent: must be within 0..100"),
        ("measured.template", {"requests": {"cpu": "x"}}, "measured.template.requests.cpu"),
        ("measured.template", {"bogus": 1}, "measured.template"),
        ("measured.per_node", True, "measured.job_size: per_node jobs have one pod each"),
        ("init", {"count": 11, "per_node": True, "template": {}}, "init.count: per_node pins"),
        ("measured.rate", -5, "measured.rate: must be at least 0"),
        ("measured.job", {"priority": "high"}, "measured.job.priority"),
        ("measured.job", {"replicas": 3}, "measured.job.replicas: set by the phase itself"),
        ("init", {"count": 1, "template": {}, "rate": 3}, "init.rate: unknown field"),
        ("measured.queues", -1, "measured.queues: must be at least 0"),
        ("init", {"count": 1, "template": {}, "queues": 2}, "init.queues: unknown field"),
        ("timeout", 0, "timeout: must be at least 1"),
        ("cluster.node", {"gpus": -1}, "cluster.node.gpus: must be at least 0"),
        ("cluster.standby_shards", -1, "cluster.standby_shards: must be at least 0"),
        ("reschedule", {"dry_run": True}, "reschedule.policy: required"),
        ("reschedule", {"policy": "p", "dry_run": "yes"}, "reschedule.dry_run: must be true"),
        ("reschedule", {"policy": "p", "when": 1}, "reschedule.when: unknown field"),
        ("restart", "yes", "restart: must be true or false"),
        ("baseline", "x", "baseline: only a series"),
        ("variants", [], "variants: must be a non-empty list"),
        ("variants", [{"name": "a"}, {"name": "a"}], "duplicate variant 'a'"),
        ("variants", [{"name": "a", "nodes": 3}], "variants[0].nodes: unknown field"),
        ("cluster.node_list", "no/such.csv", "cluster.node_list: "),
        ("cluster.node_list", 3, "cluster.node_list: must be a path"),
        (
            "cluster",
            {"nodes": 10, "node_list": OPENB_NODES, "node": {"cpu": "4"}},
            "cluster.node: the node list gives each node its shape",
        ),
        (
            "cluster",
            {"nodes": 1214, "node_list": OPENB_NODES},
            "cluster.nodes: the node list has 1213 nodes (got 1214)",
        ),
        ("measured.gpu_shares", "no/such.csv", "measured.gpu_shares: "),
        ("measured.gpu_shares", 1, "measured.gpu_shares: must be a trace name or a path"),
        ("measured.gpu_shares", "multigpu20", ""),  # has shares: valid
    ],
)
def test_invalid_workload_names_file_and_field(path: str, value: Any, message: str) -> None:
    if not message:
        workload.parse(_with(path, value), Path("w.yaml"))
        return
    with pytest.raises(WorkloadError) as err:
        workload.parse(_with(path, value), Path("w.yaml"))
    assert "w.yaml" in str(err.value)
    assert message in str(err.value)


def test_queues_and_a_queue_of_the_job_are_refused_together() -> None:
    doc = _with("measured.queues", 2)
    doc["measured"]["job"] = {"queue": "q"}
    with pytest.raises(WorkloadError, match=r"w.yaml: measured.job.queue: set by the phase"):
        workload.parse(doc, Path("w.yaml"))


def test_jobs_go_round_robin_to_the_tenant_queues() -> None:
    phase = PodPhase(count=5, job_size=1, template={"requests": {"cpu": "1"}}, queues=2)
    assert [j.spec.queue for j in build_jobs("m", phase)] == [
        "tenant-0", "tenant-1", "tenant-0", "tenant-1", "tenant-0",
    ]  # fmt: skip
    assert PodPhase.from_json(phase.to_json()) == phase
    alone = PodPhase(count=2, job_size=1, template={"requests": {"cpu": "1"}})
    assert [j.spec.queue for j in build_jobs("m", alone)] == ["", ""]


def test_node_placeholder_needs_per_node() -> None:
    template = {"nodeSelector": {"hostname": "$node"}, "requests": {"cpu": "1"}}
    with pytest.raises(WorkloadError, match=r"\$node needs per_node"):
        workload.parse(_with("measured.template", template), Path("w.yaml"))


def test_quick_and_variants_merge_in_order() -> None:
    doc = _with("quick", {"cluster": {"nodes": 2}, "measured": {"count": 4}})
    doc["baseline"] = "b"
    doc["variants"] = [
        {"name": "a", "cluster": {"nodes": 50, "scheduler": {"mode": "kube"}}},
        {"name": "b", "quick": {"cluster": {"nodes": 3}}},
    ]
    full = workload.parse(doc, Path("w.yaml"))
    quick = workload.parse(doc, Path("w.yaml"), quick=True)
    assert [(r.variant, r.cluster.nodes) for r in full.runs] == [("a", 50), ("b", 10)]
    assert [(r.cluster.nodes, r.measured.count) for r in quick.runs] == [(2, 4), (3, 4)]
    assert full.runs[0].cluster.service_args == {"scheduler": {"mode": "kube"}}
    assert full.baseline == "b" and full.runs[0].name == "w/a"


def test_select_variants_keeps_the_baseline() -> None:
    suite = workload.load("GodelNodeScaling")
    chosen = workload.select(suite, ["n20000"])
    assert [r.variant for r in chosen.runs] == ["n20000", "kube-5000"]
    assert workload.select(suite, []) is suite
    with pytest.raises(workload.WorkloadError, match=r"no variant 'n3'.*variants: n100"):
        workload.select(suite, ["n3"])
    with pytest.raises(workload.WorkloadError, match="not a series"):
        workload.select(workload.load("SchedulingBasic-500"), ["x"])


def test_a_dead_component_fails_the_run_naming_it(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "print('cannot listen on 127.0.0.1:1')"])
    dead.wait()
    log_file = tmp_path / "binder-0.log"
    log_file.write_text("starting\nstartup failed: cannot listen on 127.0.0.1:1\n")
    live = ComponentRecord(
        "store", "store", "redis://x", os.getpid(), None, [], str(tmp_path / "s.log"), ""
    )
    gone = ComponentRecord(
        "binder-0", "binder", "127.0.0.1:1", dead.pid, None, [], str(log_file), ""
    )
    state = ClusterState("redis://x", "", 5.0, [live])
    harness._check_alive(state)  # all alive: nothing raised
    state.components.append(gone)
    with pytest.raises(
        harness.BenchError, match=r"(?s)binder-0 is no longer running.*cannot listen"
    ):
        harness._check_alive(state)


class _Lagging:
    """An informer as the lag metric sees it (``store.metrics._Lagging``)."""

    def __init__(self, kinds: list[str], seconds: float) -> None:
        self.kinds = kinds
        self.seconds = seconds
        self.changes_read = self.passed_over = self.unread = 0

    def staleness(self) -> float:
        return self.seconds


def test_informer_lag_is_read_from_each_services_metrics_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the harness waits on before measuring: the worst informer lag any service's
    Prometheus endpoint reports (a real scrape over loopback), none for the store (no
    endpoint) and none for a service that does not answer. This process's registry is the
    endpoint's: only this test's informer is tracked (another test's may still be alive)."""
    monkeypatch.setattr(INFORMER_LAG, "_informers", weakref.WeakSet())
    server = MetricsServer.start("127.0.0.1", 0)
    lagging = _Lagging(["Pod"], 0.0)
    INFORMER_LAG.track(lagging)
    try:
        record = ComponentRecord(
            "dispatcher",
            "dispatcher",
            "x",
            None,
            None,
            [],
            str(tmp_path / "d.log"),
            "",
            metrics_address=f"127.0.0.1:{server.port}",
        )
        silent = ComponentRecord(
            "binder-0",
            "binder",
            "x",
            None,
            None,
            [],
            str(tmp_path / "b.log"),
            "",
            metrics_address="127.0.0.1:1",
        )
        store = ComponentRecord("store", "store", "redis://x", None, None, [], "", "")
        state = ClusterState("redis://x", "", 5.0, [store, record, silent])
        assert harness.worst_informer_lag(state) == 0.0
        lagging.seconds = 2.5
        assert harness.worst_informer_lag(state) == 2.5
    finally:
        INFORMER_LAG.forget(lagging)
        server.stop()


@pytest.mark.parametrize("name", workload.available())
def test_shipped_workloads_are_valid(name: str) -> None:
    for quick in (False, True):
        suite = workload.load(name, quick=quick)
        assert suite.runs and suite.name == name


def test_jobs_gangs_and_batches() -> None:
    phase = PodPhase(count=250, job_size=100, template={"requests": {"cpu": "1"}}, gang_percent=50)
    jobs = build_jobs("m", phase)
    assert [j.spec.replicas for j in jobs] == [100, 100, 50]
    assert [j.spec.min_member for j in jobs] == [1, 100, 1]
    grouped = list(batches(jobs * 10, rate=0))
    assert [sum(j.spec.replicas for j in b) for b in grouped] == [1000, 1000, 500]
    assert [len(b) for b in batches(jobs, rate=200)] == [1, 1, 1]  # ~10 pods per request
    per_node = PodPhase(
        count=2,
        job_size=1,
        per_node=True,
        template={"nodeSelector": {"hostname": "$node"}, "requests": {"cpu": "1"}},
    )
    pinned = build_jobs("d", per_node, ["n-0", "n-1"])
    assert [j.spec.template.node_selector["hostname"] for j in pinned] == ["n-0", "n-1"]


def test_gpu_share_jobs_take_the_traces_share_shapes_the_same_every_run() -> None:
    """``gpu_shares``: each job's pods are one share task of the trace (gpu 1, its gpuMilli,
    cpu and memory), drawn at random but seeded, so every run submits the same jobs."""
    phase = PodPhase(
        count=2000, job_size=100, template={"requests": {"cpu": "1"}}, gpu_shares="default"
    )
    jobs = build_jobs("m", phase)
    trace = {(s.cpu_milli, s.memory, s.gpu_milli) for s in workload.share_shapes("default")}
    drawn = [
        (j.spec.template.requests.milli_cpu, j.spec.template.requests.memory_bytes,
         j.spec.template.gpu_milli)
        for j in jobs
    ]  # fmt: skip
    assert all(j.spec.template.requests.gpus == 1 for j in jobs)
    assert set(drawn) <= trace and len(set(drawn)) > 5
    assert drawn == [
        (j.spec.template.requests.milli_cpu, j.spec.template.requests.memory_bytes,
         j.spec.template.gpu_milli)
        for j in build_jobs("m", phase)
    ]  # fmt: skip


def test_a_node_list_cluster_serves_evenly_spaced_rows_of_the_list(tmp_path: Path) -> None:
    """``cluster.node_list``: ``nodes`` rows of the list, evenly spaced, as hollow nodes each of
    its own shape; the harness writes them where the node agents read them."""
    suite = workload.load("GpuShares-1213", quick=True)
    shape = suite.runs[0].cluster
    rows = shape.selected_nodes()
    assert len(rows) == shape.nodes == 100 and len({r.name for r in rows}) == 100
    assert len({r.gpu_model for r in rows}) > 3  # the mix of models kept
    spec = harness._cluster_spec(suite.runs[0], "no", tmp_path)
    assert spec.hollow_node_list and [n.name for n in spec.node_list() or []] == [
        r.name for r in rows
    ]
    assert "--hollow-gpus" not in spec.args_for("nodeagent-0", "nodeagent")


def test_phase_job_fields_and_preempting_workloads() -> None:
    """A phase's ``job`` sets the other Job spec fields; measured pods that outrank the init
    pods make a preempting workload (progress counted by the measured pods' claims)."""
    doc = _with("measured.job", {"priority": 100, "preemptionPolicy": "Never"})
    doc["init"] = {"count": 10, "job_size": 10, "template": {"requests": {"cpu": "1"}},
                   "job": {"priority": 1, "preemptible": True}}  # fmt: skip
    [run] = workload.parse(doc, Path("w.yaml")).runs
    assert run.preempts
    [job] = build_jobs("m", run.measured)[:1]
    assert (job.spec.priority, job.spec.preemption_policy) == (100, pb.NEVER)
    assert job.spec.replicas == 10
    [init] = build_jobs("init", run.init) if run.init else []
    assert init.spec.priority == 1 and init.spec.preemptible
    assert not workload.parse(VALID, Path("w.yaml")).runs[0].preempts


def _run_quick(name: str, out: Path, timeout: float, *args: str) -> str:
    """``python -m bench NAME --quick [ARGS]``; returns its stdout, fails with its stderr."""
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench", name, "--quick", "--out", str(out), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = bench.communicate(timeout=timeout)
    finally:
        # On a timeout, SIGTERM (not run()'s SIGKILL) lets the bench stop the cluster it started.
        if bench.poll() is None:
            bench.terminate()
            try:
                bench.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                bench.kill()
                bench.communicate()
    assert bench.returncode == 0, stderr[-3000:]
    return stdout


@pytest.mark.timeout(120)
def test_quick_workload_end_to_end(tmp_path: Path) -> None:
    stdout = _run_quick("SchedulingBasic-500", tmp_path, 100)
    [report_json] = tmp_path.glob("*.json")
    report = json.loads(report_json.read_text())
    [run] = report["runs"]
    assert run["bound"] == run["measured_pods"] > 0
    assert run["latency_ms"]["count"] == run["measured_pods"]
    assert set(run["resources"]) >= {"store", "dispatcher", "scheduler-0", "binder-0", "load"}
    assert run["throughput"]["samples"]
    assert run["settle"]["quiet"]  # the measured phase began once the init phase was taken in
    md = report_json.with_suffix(".md").read_text()
    assert "| run |" in md and "avg pods/s" in md
    pngs = sorted(tmp_path.glob("*.png"))
    assert len(pngs) == 2
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| SchedulingBasic-500 |" in stdout


@pytest.mark.timeout(180)
def test_gpu_shares_quick_form_binds_every_share_and_reports_cpu_per_pod(tmp_path: Path) -> None:
    """GpuShares-1213's quick form (issue 30's speed target, at 100 of the trace's nodes), its
    godel variant: every share pod bound, and the report gives the CPU per pod."""
    doc = yaml.safe_load((ROOT / "bench/workloads/GpuShares-1213.yaml").read_text())
    doc.pop("baseline")
    doc["variants"] = [v for v in doc["variants"] if v["name"] == "godel"]
    doc["cluster"]["node_list"] = str(ROOT / OPENB_NODES)
    path = tmp_path / "GpuShares-1213.yaml"
    path.write_text(yaml.safe_dump(doc))
    _run_quick(str(path), tmp_path / "out", 150)
    [report_json] = (tmp_path / "out").glob("*.json")
    [run] = json.loads(report_json.read_text())["runs"]
    assert run["bound"] == run["measured_pods"] == 300
    assert run["cluster"]["nodes"] == 100
    md = report_json.with_suffix(".md").read_text()
    assert "CPU ms (user+sys) per measured pod" in md and "| shards |" in md


def _run_singles_only(name: str, tmp_path: Path, timeout: float, **extra: Any) -> dict[str, Any]:
    """A shipped one-pod-jobs workload's quick form with only its ``singles`` variant and no
    baseline (a copy under the same name: each variant is a cluster of its own, and CI's time is
    short), ``extra`` set at its top level; returns its run."""
    doc = yaml.safe_load((ROOT / f"bench/workloads/{name}.yaml").read_text())
    doc.pop("baseline")
    doc["variants"] = [v for v in doc["variants"] if v["name"] == "singles"]
    doc.update(extra)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    _run_quick(str(path), tmp_path / "out", timeout)
    [report_json] = (tmp_path / "out").glob("*.json")
    [run] = json.loads(report_json.read_text())["runs"]
    assert run["variant"] == "singles" and run["job_size"] == 1
    assert run["bound"] == run["measured_pods"] > 0
    return run


@pytest.mark.timeout(180)
def test_one_pod_jobs_workload_binds_every_pod(tmp_path: Path) -> None:
    """SchedulingBasic-5000-Singles' quick form (issue 15), its one-pod-jobs variant: every
    measured pod is its own job, and every one is bound."""
    run = _run_singles_only("SchedulingBasic-5000-Singles", tmp_path, 100)
    assert run["latency_ms"]["count"] == run["measured_pods"]
    assert run["resources"]["dispatcher"]["cpu_seconds"] > 0


@pytest.mark.timeout(180)
def test_one_pod_jobs_with_node_affinity_bind_every_pod(tmp_path: Path) -> None:
    """SchedulingNodeAffinity-5000-Singles' quick form, its one-pod-jobs variant: every measured
    pod, its own job requiring a zone, is bound."""
    _run_singles_only("SchedulingNodeAffinity-5000-Singles", tmp_path, 150)


@pytest.mark.timeout(300)
def test_paper_scale_quick_form_reports_memory_restarts_and_a_steady_leader(tmp_path: Path) -> None:
    """PaperScale-20000's quick form (issue 15, item 3, at 500 nodes and 10,000 pods): two
    shards and two binders, every measured pod bound, every process's peak RSS reported (the
    aim is on their sum), and each kind of service timed to SERVING after a restart."""
    _run_quick("PaperScale-20000", tmp_path, 280)
    [report_json] = tmp_path.glob("*.json")
    [run] = json.loads(report_json.read_text())["runs"]
    assert run["bound"] == run["measured_pods"] > 0
    assert run["init_pods"] >= 10_000
    resources = run["resources"]
    assert {"scheduler-0", "scheduler-1", "binder-0", "binder-1", "store"} <= set(resources)
    assert all(usage["peak_rss_mib"] > 0 for usage in resources.values())
    # Each kind of service (one of each; the store stays up) restarted, timed until it serves.
    restarted = run["restart_seconds"]
    assert set(restarted) == {"dispatcher", "scheduler-0", "binder-0", "rescheduler", "nodeagent-0"}
    assert all(seconds > 0 for seconds in restarted.values())
    # Issue 34 item 2 (RestartScale-2000 is this at a larger size, with the same harness):
    # each restarted kind with the CPU it used until serving again, binding resumed after
    # binder-0's restart, and the Binder leader killed -9 replaced by its standby.
    assert set(run["restart_cpu_seconds"]) == set(run["restart_seconds"])
    assert all(seconds > 0 for seconds in run["restart_cpu_seconds"].values())
    assert set(run["binding_resumed_seconds"]) == {"binder-0"}
    assert run["takeover_seconds"] > 0
    # The spare shard: scheduler-0 served again (by the spare) apart from its restarted
    # process's SERVING, and the spare's takeover of a shard killed -9 (registered, scheduling).
    assert "scheduler-spare-0" in resources
    assert set(run["scheduling_resumed_seconds"]) == {"scheduler-0"}
    takeover = run["shard_takeover_seconds"]
    assert 0 < takeover["registered"] and 0 < takeover["scheduling"]
    md = report_json.with_suffix(".md").read_text()
    assert "## Restarts: seconds until serving again" in md
    assert "| binder takeover (leader killed -9) |" in md
    assert "| shard takeover (scheduler-0's holder killed -9): a standby registered |" in md
    # Issue 34: the Binder's lease never changes hands while the cluster fills and measures
    # (its renewals run on a thread of their own), and the report shows the worst lateness.
    leadership = run["leadership"]
    assert leadership["changes_init"] == leadership["changes_measured"] == 0, leadership
    assert 0 < leadership["worst_renewal_lateness_s"]
    assert "## Binder leadership" in md and "worst renewal lateness" in md


@pytest.mark.timeout(240)
def test_conflicts_workload_reports_each_variants_conflict_rate(tmp_path: Path) -> None:
    """GodelConflicts-10000 runs partitioning off and on in one series, each with the shards'
    counters over the measured phase (pods proposed, conflicts) and how many shards held a
    partition."""
    _run_quick("GodelConflicts-10000", tmp_path, 220)
    [report_json] = tmp_path.glob("*.json")
    runs = {r["variant"]: r for r in json.loads(report_json.read_text())["runs"]}
    assert set(runs) == {"partitions-off", "partitions-on"}
    for run in runs.values():
        assert run["bound"] == run["measured_pods"] > 0
        conflicts = run["conflicts"]
        assert conflicts["proposed"] >= run["measured_pods"]
        assert conflicts["proposed"] - conflicts["conflicted"] >= run["measured_pods"]
    assert runs["partitions-off"]["conflicts"]["partitioned_shards"] == 0
    assert runs["partitions-on"]["conflicts"]["partitioned_shards"] == 2
    md = report_json.with_suffix(".md").read_text()
    assert "| conflicts | partitioned shards |" in md


def test_fault_harness_quick_form_loses_nothing(tmp_path: Path) -> None:
    """bench/faults.py's quick form, as CI runs it: under a steady load, the store primary
    killed (kill -9) twice — started again at once, as a supervisor does, then after 5 s — and
    one fault per other component kind, each process started again, and after every fault the
    invariants checked from outside, every acknowledged pod bound included. It exits 0 only if
    every fault recovered, the store acknowledged writes again after each of its kills, and
    nothing acknowledged was lost or left unbound; the report says so per kind and per restart.
    The cluster is prefilled first (the scale form's path, small): those pods' bindings are
    checked after every fault too, and each restarted service's time to serve is reported."""
    env = {k: v for k, v in os.environ.items() if k != "GODEL_REDIS_URL"}
    scale = ["--prefill-pods", "1500", "--prefill-job-size", "400"]
    result = subprocess.run(
        [sys.executable, "-m", "bench.faults", "--quick", *scale, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    (report_file,) = tmp_path.glob("faults-quick-*.json")
    report = json.loads(report_file.read_text())
    assert report["ok"] and report["final_violations"] == []
    assert report["prefill_pods"] == 1500 and report["prefill_seconds"] > 0
    services = [f for f in report["faults"] if f["kind"] not in ("store", "nodeagent")]
    assert services and all(f["serving_seconds"] is not None for f in services)
    assert report["per_kind"]["dispatcher"]["serving_max_s"] is not None
    assert "serving P50 s" in result.stdout and "holding 1,500 pods" in result.stdout
    assert [f["kind"] for f in report["faults"]] == ["store", *faults.KINDS]
    assert {f["signal"] for f in report["faults"]} == {"SIGKILL", "SIGTERM"}
    store = [f for f in report["faults"] if f["kind"] == "store"]
    assert [(f["signal"], f["restart"]) for f in store] == [
        ("SIGKILL", "at once"),
        ("SIGKILL", "after 5s"),
    ]
    assert all(f["failover_seconds"] is not None and f["failover_to"] for f in store)
    assert list(report["store_failover"]) == ["at once", "after 5s"]
    assert all(
        f["violations"] == [] and f["recovery_seconds"] is not None for f in report["faults"]
    )
    assert report["acknowledged_jobs"] > 0
    assert "nothing lost" in result.stdout


@pytest.mark.parametrize(
    ("replicas", "restarts"),
    [(1, ["at once", "after 5s"]), (2, ["at once", "after 5s", "never"])],
)
def test_the_store_primary_is_started_again_at_once_later_and_with_a_spare_replica_never(
    replicas: int, restarts: list[str]
) -> None:
    """Each restart of the store primary, in the full run, under both signals (one replica must
    have the killed server back before writes resume; "never" needs a second one); the quick
    form kills it once per restart."""
    modes = faults.store_restarts(replicas, 5.0)
    planned = faults.plan(12 * len(modes), modes)
    store = [(f.restart, f.signal.name) for f in planned if f.kind == "store"]
    assert sorted(set(store)) == sorted({(r, s) for r in restarts for s in ("SIGKILL", "SIGTERM")})
    assert [f.kind for f in planned[:6]] == list(faults.KINDS)
    quick = faults.plan(0, modes, quick=True)
    assert [(f.kind, f.restart) for f in quick[: len(restarts)]] == [("store", r) for r in restarts]
    assert [f.kind for f in quick[len(restarts) :]] == list(faults.KINDS[1:])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--store-replicas", "0"], "--store-replicas: must be at least 1"),
        (["--store-restart-delay", "0"], "--store-restart-delay: must be more than 0"),
        (["--prefill-pods", "-1"], "--prefill-pods: must be 0 or more"),
        (["--prefill-job-size", "0"], "--prefill-job-size: must be at least 1"),
        (["--paper-scale", "--quick"], "--paper-scale: not with --quick"),
    ],
)
def test_fault_harness_refuses_a_bad_store_option(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        faults.main(args)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("pods", "job_size", "sizes"),
    [(2500, 1000, [1000, 1000, 500]), (1000, 1000, [1000]), (3, 5, [3]), (0, 1000, [])],
)
def test_the_prefill_is_long_running_pods_in_jobs_of_the_size_asked(
    pods: int, job_size: int, sizes: list[int]
) -> None:
    jobs = faults.prefill_jobs(pods, job_size)
    assert [j.spec.replicas for j in jobs] == sizes
    assert len({j.metadata.name for j in jobs}) == len(jobs)
    assert all(j.spec.template.duration_ms == 0 and j.spec.min_member == 1 for j in jobs)
    assert all(j.spec.template.requests.milli_cpu == 50 for j in jobs)


# (case, weights, light share ‰, heavy share ‰, light pending, heavy pending, counted), on the
# quick contention's 100 one-cpu nodes (one pod = 10 ‰) after its warm-up.
@pytest.mark.parametrize(
    ("weights", "light", "heavy", "light_pending", "heavy_pending", "counted"),
    [
        pytest.param((1, 1), 500, 500, 10, 100, True, id="both want more than half"),
        pytest.param((1, 1), 400, 600, 10, 100, True, id="light short of half but wants it"),
        pytest.param((1, 1), 300, 700, 3, 100, False, id="light wants only 330: not contended"),
        pytest.param((1, 1), 500, 500, 0, 100, False, id="light has nothing pending"),
        pytest.param((1, 3), 200, 750, 5, 100, True, id="light wants its quarter"),
        pytest.param((1, 3), 200, 780, 4, 100, False, id="light wants 240 < its quarter"),
        pytest.param((1, 3), 300, 600, 100, 10, False, id="heavy wants 700 < its three quarters"),
    ],
)
def test_fairness_counts_a_sample_only_when_both_queues_want_their_share(
    weights: tuple[int, int],
    light: int,
    heavy: int,
    light_pending: int,
    heavy_pending: int,
    counted: bool,
) -> None:
    c = fairness.Contention.quick(weights)
    s = fairness.Sample(60.0, light, heavy, light_pending, heavy_pending)
    assert s.contended(c) is counted


def test_queue_micro_runs_both_cases() -> None:
    """The unit-queue micro-benchmark's two cases run and do what they say (their timings are
    for bench/README.md, not asserted)."""
    from bench import queue_micro

    assert "50 units of a sent while b has 50 at a shard" in queue_micro.others_wait(50)
    # Each wake takes up to 64 of one queue's: tenant a's 100 over two (the shares tie).
    assert "200 units backed off, 100 woken by 2 wakes" in queue_micro.freed_room(200, wakes=2)
    assert "300 units pending, 30000m CPU owed" in queue_micro.owed(300, rounds=1)
    assert "turns: 60 units of 6 queues sent" in queue_micro.turns(60, 6)


@pytest.mark.timeout(240)
def test_rescheduler_load_balance_variant_spreads_measured_load(tmp_path: Path) -> None:
    """Rescheduler-5000's load-balance variant, quick form (200 nodes, 10 of them hot machines):
    an executed load-balance round moves pods off the nodes hot by measured load, and the
    spread of the load the node agents measure afterwards is smaller."""
    _run_quick("Rescheduler-5000", tmp_path, 230, "--variant", "load-balance")
    [report_json] = tmp_path.glob("*.json")
    [run] = json.loads(report_json.read_text())["runs"]
    x = run["reschedule"]
    assert (x["policy"], x["dry_run"], x["outcome"]) == ("load-balance", False, "planned")
    assert x["evicted"] > 0
    before, after = x["measured_load"]["before"], x["measured_load"]["after"]
    assert before["nodes"] == after["nodes"] == 200
    assert before["cpu"]["max"] > 80  # it starts from hot nodes
    for dimension in ("cpu", "network"):
        assert after[dimension]["stddev"] < before[dimension]["stddev"]
        assert after[dimension]["max"] < before[dimension]["max"]
    assert "CPU sd before → after" in report_json.with_suffix(".md").read_text()


@pytest.mark.timeout(600)
def test_big_job_quick_form_binds_every_pod_and_reports_the_dispatchers_stalls(
    tmp_path: Path,
) -> None:
    """``python -m bench.bigjob --quick``: one 10,000-pod job through the public API on 200
    hollow nodes; every pod binds, and the report has the submit's time, the times until every
    pod is stored and bound, what the job's status said meanwhile and the loop-lag probes'
    readings."""
    assert bigjob.main(["--quick", "--fsync", "everysec", "--out", str(tmp_path)]) == 0
    [report_json] = tmp_path.glob("bigjob-10000-quick-*.json")
    report = json.loads(report_json.read_text())
    assert report["bigjob"]["pods"] == report["pods"] == 10_000
    assert report["bound"] == report["pods"]
    assert report["submit_error"] == ""
    for key in ("submit_seconds", "created_seconds", "bound_seconds", "status_bound_seconds"):
        assert report[key] is not None and report[key] >= 0, key
    assert report["created_seconds"] <= report["bound_seconds"]
    samples = report["status_samples"]
    assert samples and all(0 <= created <= 10_000 for _, created, _ in samples)
    assert [c for _, c, _ in samples] == sorted(c for _, c, _ in samples)  # never goes back
    assert samples[-1][2] == 10_000  # the status counts every pod placed at the end
    lag = report["dispatcher_loop_lag"]
    assert set(lag) >= {"max_before_s", "max_after_s", "samples", "over_50ms", "over_1000ms"}
    assert lag["samples"] > 0 and lag["max_after_s"] >= lag["max_before_s"]
    # The collector's share: long pauses per generation and the longest in CPU time (a service
    # runs a full collection at least once, when it starts serving).
    assert {"gc_gen0_over_50ms", "gc_gen2_over_50ms", "gc_gen1_cpu_max_s"} <= set(lag)
    assert lag["gc_gen2_cpu_max_s"] > 0
    assert {"dispatcher", "scheduler-0", "binder-0"} <= set(report["loop_lag_max"])


@pytest.mark.timeout(300)
def test_gpu_trace_through_the_services_writes_monotone_curves_per_profile(
    tmp_path: Path,
) -> None:
    """The openb protocol through real services (bench.gputrace_services) on 12 of the default
    trace's GPU nodes and their share of tasks, one seed, the default profile and random (the
    select step's seeded random tie-break): a curve per profile with arrived % rising to at
    most 130 %, every task placed or counted unplaced, the allocation read from the stored pods
    (the run fails if it differs from the one read as tasks were decided), a row per run with
    its rate and the shards' CPU per task, a median row per profile, and the plot."""
    out = tmp_path / "out"
    argv = ["--node-count", "12", "--trace", "default", "--seeds", "1"]
    argv += ["--policy", "default", "--policy", "random"]
    assert gputrace_services.main([*argv, "--out", str(out)]) == 0
    [curves] = out.glob("gputrace-services-*[0-9].csv")
    rows = list(csv.DictReader(curves.open()))
    by_policy: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_policy.setdefault(row["policy"], []).append(row)
    assert set(by_policy) == {"default", "random"}
    for policy_rows in by_policy.values():
        arrived = [float(r["arrived_pct"]) for r in policy_rows]
        assert arrived == sorted(arrived)  # the last row may repeat it: a CPU-only task
        assert 100 <= arrived[-1] <= 130
        tasks = [int(r["tasks"]) for r in policy_rows]
        assert all(int(r["placed"]) + int(r["unplaced"]) == int(r["tasks"]) for r in policy_rows)
        assert tasks == sorted(tasks) and len(set(tasks)) == len(tasks)
        assert all(0 <= float(r["unallocated_pct"]) <= 100 for r in policy_rows)
    [per_run] = out.glob("gputrace-services-*-runs.csv")
    runs = {r["policy"]: r for r in csv.DictReader(per_run.open())}
    assert set(runs) == {"default", "random"}
    assert all(
        float(r["arrived_pct"]) == 100
        and float(r["tasks_per_second"]) > 0
        and float(r["scheduler_cpu_ms_per_task"]) > 0
        for r in runs.values()
    )
    [summary] = out.glob("gputrace-services-*-summary.csv")
    medians = {r["policy"]: r for r in csv.DictReader(summary.open())}
    assert set(medians) == {"default", "random"}
    for policy, row in medians.items():
        assert (row["trace"], row["seeds"]) == ("default", "1")
        # One seed: its median is its run's figure.
        assert float(row["unallocated_pct_median"]) == float(runs[policy]["unallocated_pct"])
    [png] = out.glob("gputrace-services-*.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gpu_trace_medians_are_per_trace_and_profile_over_seeds() -> None:
    """The summary's row per trace and profile is the median over its seeds at 100 % arrived."""

    def run(
        trace: str, policy: str, seed: int, unallocated: float
    ) -> gputrace_services.ServicesRun:
        at = gpufrag_sim.Point(10, 100.0, unallocated, unallocated, 9, 1)
        return gputrace_services.ServicesRun(
            gpufrag_sim.Run(trace, policy, seed, (at,), at), 1.0, 10, 0.5, 2.0
        )

    runs = [run("default", "random", s, u) for s, u in enumerate((9.0, 3.0, 5.0))]
    runs.append(run("multigpu20", "random", 0, 7.0))
    rows = gputrace_services.medians(runs)
    assert [(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows] == [
        ("default", "random", 3, "5.000", "3.000", "9.000"),
        ("multigpu20", "random", 1, "7.000", "7.000", "7.000"),
    ]


def test_gpu_trace_random_profile_is_seeded_per_run(tmp_path: Path) -> None:
    """The random profile loads with the run's seed as its tie-break seed; others unchanged."""
    seeded = gputrace_services.seeded_profile("random.yaml", 4, tmp_path)
    profile = load_profile(seeded, new_in_tree_registry())
    assert (profile.scores, profile.tie_break, profile.tie_break_seed) == ((), "random", 4)
    plain = gputrace_services.seeded_profile("least-allocated.yaml", 4, tmp_path)
    assert plain == gputrace_services.PROFILES_DIR / "least-allocated.yaml"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nodes", "n.csv"], "--nodes and --pods go together"),
        (["--seeds", "0"], "--seeds: must be at least 1"),
        (["--node-count", "-1"], "--node-count: must not be negative"),
    ],
)
def test_gpu_trace_bad_arguments_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        gputrace_services.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_gpu_trace_pair_by_path_is_refused_when_malformed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,lots,1024,1,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,100,1024,1,1000\n")
    with pytest.raises(SystemExit):
        gputrace_services.main(["--nodes", str(nodes), "--pods", str(pods)])
    assert "nodes.csv:2: cpu_milli" in capsys.readouterr().err


def test_gpu_trace_profiles_load_and_the_gpufrag_ones_wait_for_their_plugin(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every shipped profile the registry can serve loads; the GpuFragmentation ones are skipped
    with a note exactly while that plugin is not registered."""
    registry = new_in_tree_registry()
    has_plugin = gputrace_services.GPU_FRAGMENTATION_PLUGIN in registry
    for name, file in gputrace_services.PROFILES.items():
        why = gputrace_services.profile_available(name)
        assert bool(why) == (name.startswith("gpufrag-") and not has_plugin)
        if file and not why:
            load_profile(gputrace_services.PROFILES_DIR / file, registry)
    kept = list(gputrace_services._profiles(["most-allocated", "gpufrag-fgd"]))
    assert kept == (["most-allocated", "gpufrag-fgd"] if has_plugin else ["most-allocated"])
    if not has_plugin:
        assert "skipping profile gpufrag-fgd: the GpuFragmentation" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_gpu_trace_replay_quick_form_writes_samples_summary_and_plot_for_both_runs(
    tmp_path: Path,
) -> None:
    """The time replay through real services (bench.gputrace_replay --quick, on 8 nodes): a
    sample row per sampled hour of the trace's day for each run (defrag off, then on with its
    period), every figure a percentage of capacity, a summary row per run with the
    time-weighted averages and the services' CPU time, and the three-panel plot."""
    out = tmp_path / "out"
    argv = ["--quick", "--node-count", "8", "--shards", "1", "--nodeagents", "1"]
    assert gputrace_replay.main([*argv, "--out", str(out)]) == 0
    [samples] = out.glob("gputrace-replay-*[0-9].csv")
    rows = list(csv.DictReader(samples.open()))
    assert tuple(rows[0]) == gputrace_replay.SAMPLE_COLUMNS
    by_run: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_run.setdefault(row["run"], []).append(row)
    assert tuple(by_run) == gputrace_replay.RUNS
    for run_rows in by_run.values():
        times = [float(r["trace_seconds"]) for r in run_rows]
        assert times[0] == 0 and times == sorted(times)
        assert times[-1] == gputrace_replay.QUICK_WINDOW
        for r in run_rows:
            for column in ("allocated_pct", "fragmentation_pct", "pending_gpu_pct"):
                assert 0 <= float(r[column]) <= 100, column
    [summary] = out.glob("gputrace-replay-*-summary.csv")
    runs = {r["run"]: r for r in csv.DictReader(summary.open())}
    assert tuple(runs) == gputrace_replay.RUNS
    assert runs["defrag-off"]["defrag_period_trace_seconds"] == "0"
    assert int(runs["defrag-on"]["defrag_period_trace_seconds"]) > 0
    for r in runs.values():
        assert int(r["submitted"]) > 0 and int(r["samples"]) == len(by_run[r["run"]])
        assert all(0 <= float(r[f"avg_{name}"]) <= 100 for name in gputrace_replay.AVERAGED)
        assert float(r["services_cpu_seconds"]) > 0  # read from the cluster's processes
    [png] = out.glob("gputrace-replay-*.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gpu_trace_replay_runs_the_built_in_policy_on_a_period_only_when_on() -> None:
    """The replay's rescheduler config: the named built-in policy as the defaults define it, a
    period (in milliseconds) in the "on" run and no trigger in the "off" one; the config loads
    as the rescheduler loads it; an unknown policy is refused naming --policy."""
    defaults = yaml.safe_load(
        (ROOT / "services" / "rescheduler" / "default_policies.yaml").read_text()
    )
    [builtin] = [p for p in defaults["policies"] if p["name"] == "gpu-defrag"]
    on = gputrace_replay.rescheduler_config("gpu-defrag", 2.16)
    off = gputrace_replay.rescheduler_config("gpu-defrag", None)
    [on_policy], [off_policy] = on["policies"], off["policies"]
    assert on_policy["trigger"] == {"period": "2160ms"} and "trigger" not in off_policy
    assert on_policy["detector"] == builtin["detector"] == off_policy["detector"]
    assert on_policy["algorithm"] == builtin["algorithm"]
    [loaded] = ReschedulerConfig(policies=on["policies"]).policy_configs()
    assert loaded.name == "gpu-defrag" and loaded.trigger.period_seconds == pytest.approx(2.16)
    with pytest.raises(gpucluster.TraceRunError, match="--policy: no built-in"):
        gputrace_replay.rescheduler_config("no-such-policy", None)


def test_time_weighted_average_weighs_each_value_by_how_long_it_lasted() -> None:
    average = gputrace_replay.time_weighted_average
    assert average([(0, 0.0), (10, 10.0), (30, 10.0)]) == pytest.approx((50 + 200) / 30)
    assert average([(5, 3.0)]) == 3.0 and average([]) == 0.0


def test_replay_fragmentation_is_the_free_gpu_the_running_shapes_cannot_use() -> None:
    """The bench's fragmentation (bench.gpucluster.expected_fragmentation_milli): with only
    whole-card pods running, a half-used card's free half is fragmented and an empty node's
    cards are not; with no GPU pod running, one whole card is the shape."""
    node = TraceNode("n", 64_000, 1 << 36, 2, "V100M32")
    share = TaskShape(1000, 1 << 30, 1, 500)
    whole = TaskShape(1000, 1 << 30, 1, 1000)
    half_used = place(node.initial_state(), share, [0])
    fragmented = gpucluster.expected_fragmentation_milli
    assert fragmented([half_used, node.initial_state()], [whole]) == 500
    assert fragmented([half_used], []) == 500
    assert fragmented([half_used], [share]) == 0


def test_timed_pod_files_without_times_or_deleted_before_creation_are_refused(
    tmp_path: Path,
) -> None:
    with pytest.raises(TraceError, match=r"missing column.*creation_time"):
        load_timed_pods(POD_LISTS["multigpu20"])
    path = tmp_path / "pods.csv"
    path.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
        "p0,1000,1024,1,500,100,50\n"
    )
    with pytest.raises(TraceError, match=r"pods.csv:2: deletion_time: must not be before"):
        load_timed_pods(path)


def test_memory_fill_is_paperscales_shape_bound_and_running() -> None:
    """``bench.memory`` measures against pods as the paper's scale holds them: bound, running,
    spread evenly over the nodes, 50m / 200 MiB in jobs."""
    objs = memory._jobs_and_pods(jobs=2, pods=6, nodes=4, now_ms=1_000)
    jobs = [o for o in objs if isinstance(o, pb.Job)]
    pods = [o for o in objs if isinstance(o, pb.Pod)]
    assert [j.metadata.name for j in jobs] == ["job-0", "job-1"] and len(pods) == 12
    assert {p.status.phase for p in pods} == {pb.POD_RUNNING}
    assert Counter(p.spec.node_name for p in pods) == {f"hollow-{i}": 3 for i in range(4)}
    asked = {
        (p.spec.template.requests.milli_cpu, p.spec.template.requests.memory_bytes) for p in pods
    }
    assert asked == {(50, 200 << 20)}


@pytest.mark.e2e
def test_memory_reports_bytes_per_pod_of_a_kind() -> None:
    """A tiny run end to end: each kind asked for is measured against both clusters, and its
    figure at a million pods is its empty resident set plus a million times its bytes a pod."""
    report = memory.run(nodes=4, jobs=1, pods=200, kinds=["rescheduler"], top=0)
    assert report["pods"] == 200 and list(report["kinds"]) == ["rescheduler"]
    figures = report["kinds"]["rescheduler"]
    assert figures["rss_empty_mib"] > 0 and figures["rss_full_mib"] > 0
    at_1m = figures["rss_empty_mib"] + figures["bytes_per_pod"] * 1_000_000 / 2**20
    assert abs(figures["at_1m_pods_mib"] - at_1m) <= 1


@pytest.mark.timeout(300)
def test_idle_quick_form_reports_each_services_cpu_per_second(tmp_path: Path) -> None:
    """``python -m bench.idle --quick``: the workload's cluster started, its init pods bound
    and settled, then each process's CPU sampled with nothing submitted: the report gives each
    kind of service's millicores and the sum, nothing written to the feed meanwhile but what
    the services do by themselves."""
    argv = ["SchedulingBasic-5000-Singles", "--quick", "--seconds", "2", "--out", str(tmp_path)]
    assert idle.main(argv) == 0
    [report_json] = tmp_path.glob("idle-SchedulingBasic-5000-Singles-singles-*.json")
    report = json.loads(report_json.read_text())
    assert report["nodes"] == 200 and report["seconds"] == 2
    kinds = {"store", "dispatcher", "scheduler", "binder", "rescheduler", "nodeagent"}
    assert set(report["millicores"]) == kinds
    assert all(value >= 0 for value in report["millicores"].values())
    services = sum(v for k, v in report["millicores"].items() if k != "store")
    assert report["millicores_all_services"] == pytest.approx(services, abs=0.5)
    assert report["command"].startswith("python -m bench.idle SchedulingBasic-5000-Singles")
