"""The scheduling pipeline end to end: real processes (store server, dispatcher, scheduler
shards, binders, node agents) driven through the CLI and the client, with faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from godel.client import ClientError, ProtoClient
from protos.godel.v1 import objects_pb2 as pb
from store.lease import holder_name
from store.server import StoreServer, StoreServerError
from tests.e2e.conftest import Cluster, wait_until
from tests.factories import job as make_job

pytestmark = pytest.mark.e2e

SMALL_NODES = ("nodeagent", ("--hollow-cpu-milli", "1000", "--hollow-memory-bytes", str(4 << 30)))


def pods_of(cluster: Cluster, job: str) -> list[pb.Pod]:
    return cluster.client.list("Pod", job=job)  # type: ignore[return-value]


def bound(cluster: Cluster, job: str) -> int:
    return sum(1 for p in pods_of(cluster, job) if p.spec.node_name)


def job_yaml(
    name: str, replicas: int, min_member: int, cpu: str, *, duration_ms: int = 0, extra: str = ""
) -> str:
    return (
        f"apiVersion: godel/v1\nkind: Job\nmetadata: {{name: {name}}}\n"
        f"spec:\n  replicas: {replicas}\n  minMember: {min_member}\n"
        f"  template:\n    requests: {{cpu: {cpu}, memory: 100Mi}}\n"
        f"    durationMs: {duration_ms}\n{extra}"
    )


def kill9(pid: int | None) -> None:
    assert pid is not None
    os.kill(pid, signal.SIGKILL)


def test_gang_waits_for_room_then_binds_whole(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=49, service_args=(SMALL_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 49, what="49 nodes registered")
    cluster.godel("apply", "-f", "-", stdin=job_yaml("gang", 50, 50, "1"))

    def explained() -> str:
        summary = cluster.client.explain("gang-0").summary
        return summary if "insufficient" in summary or "nodes fit" in summary else ""

    summary = wait_until(explained, what="an explanation for the pending gang")
    assert bound(cluster, "gang") == 0
    out = cluster.godel("explain", "gang-0").stdout
    assert summary in out

    # One more node (a node agent of its own, as an operator would add one, with its own
    # certificate naming its nodes): the gang fits.
    cluster.godel("certs", "issue", "extra-agent", "--role", "nodeagent", "--node", "extra-*")
    extra = subprocess.Popen(
        [sys.executable, "-P", "-m", "services.nodeagent", "--name", "extra-agent",
         "--port", "0", "--store-url", cluster.state.store_url, "--hollow-nodes", "1",
         "--node-prefix", "extra", "--hollow-cpu-milli", "1000", "--process-node", "false",
         "--log-format", "json", "--tls-dir", str(cluster.home.tls_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cluster.home.path,
    )  # fmt: skip
    try:
        wait_until(lambda: bound(cluster, "gang") == 50, timeout=120, what="all 50 bound")
    finally:
        extra.send_signal(signal.SIGTERM)
        try:
            extra.wait(30)
        except subprocess.TimeoutExpired:
            extra.kill()
            extra.wait()


def test_two_shards_conflicts_are_resolved_by_the_binder(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=2, hollow_nodes=10, service_args=(SMALL_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 10, what="nodes registered")
    # 60 single-pod jobs of 300m onto 10 x 1000m: room for 30, so shards must collide.
    jobs = [make_job(f"c{i}", cpu=300, mem=100 << 20) for i in range(60)]
    results = cluster.client.submit(jobs).results
    assert all(r.created for r in results), results

    def settled() -> bool:
        pods = cluster.client.list("Pod")
        placed = [p for p in pods if p.spec.node_name]  # type: ignore[attr-defined]
        waiting = [p for p in pods if not p.spec.node_name]  # type: ignore[attr-defined]
        explained = all(
            any(c.type == "PodScheduled" and c.status == "False" for c in p.status.conditions)  # type: ignore[attr-defined]
            for p in waiting
        )
        return len(placed) == 30 and explained

    wait_until(settled, timeout=120, what="30 bound and the rest explained")


def _stream_jobs(client: ProtoClient, prefix: str, count: int, stop: threading.Event) -> list[str]:
    names = []
    for i in range(count):
        if stop.is_set():
            break
        name = f"{prefix}{i}"
        result = client.submit(
            [make_job(name, replicas=5, min_member=5, cpu=100, mem=100 << 20)]
        ).results[0]
        assert result.created, result
        names.append(name)
    return names


def test_binder_leader_kill9_fails_over_without_loss(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(schedulers=2, binders=2, hollow_nodes=20)
    wait_until(lambda: len(cluster.client.list("Node")) == 20, what="nodes registered")
    leader = wait_until(
        lambda: cluster.run_store(lambda s: s.get_lease("binder")), what="a binder leader"
    )
    leader_record = next(
        c for c in cluster.state.components if c.name == holder_name(leader.holder)
    )
    stop = threading.Event()
    names: list[str] = []
    submitter = threading.Thread(
        target=lambda: names.extend(_stream_jobs(cluster.client, "f", 40, stop)), name="submitter"
    )
    submitter.start()
    try:
        wait_until(lambda: len(names) >= 0 and bound(cluster, "f0") == 5, what="first job bound")
        kill9(leader_record.pid)
    except BaseException:
        stop.set()  # a failure must not leave the submitter running into the cluster's teardown
        raise
    finally:
        submitter.join(120)
    new = wait_until(
        lambda: (
            (lease := cluster.run_store(lambda s: s.get_lease("binder")))
            and lease.holder not in ("", leader.holder)
            and lease
        ),
        timeout=60,
        what="a new leader",
    )
    assert new.epoch > leader.epoch
    for name in names:
        wait_until(lambda n=name: bound(cluster, n) == 5, timeout=120, what=f"{name} bound")


def test_shard_kill9_its_units_go_to_the_other(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(schedulers=2, hollow_nodes=20)
    wait_until(lambda: len(cluster.client.list("Node")) == 20, what="nodes registered")
    kill9(cluster.component("scheduler-0").pid)
    jobs = [make_job(f"s{i}", replicas=4, min_member=4, cpu=100, mem=100 << 20) for i in range(20)]
    assert all(r.created for r in cluster.client.submit(jobs).results)
    for j in jobs:
        wait_until(
            lambda n=j.metadata.name: bound(cluster, n) == 4,
            timeout=120,
            what=f"{j.metadata.name} bound by the surviving shard",
        )


def test_store_restart_mid_run(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=20)
    wait_until(lambda: len(cluster.client.list("Node")) == 20, what="nodes registered")
    first = [make_job(f"a{i}", replicas=3, min_member=3, cpu=100, mem=100 << 20) for i in range(10)]
    assert all(r.created for r in cluster.client.submit(first).results)
    store_record = cluster.component("store")
    port = int(store_record.address.rsplit(":", 1)[1].split("/")[0])
    server = StoreServer.from_pidfile(Path(cluster.home.store_dir), port)
    server.kill()

    def restart() -> StoreServer | None:
        # As an operator would: start it again on its port, again while the port is still
        # held a moment after the kill (it was refused once with "Address already in use").
        try:
            return StoreServer.start(
                Path(cluster.home.store_dir), port=port, fsync="everysec", detach=True
            )
        except StoreServerError as exc:
            if "Address already in use" in str(exc):
                return None
            raise

    restarted = wait_until(restart, timeout=30, what="the store to start again on its port")
    # Record the new server so `godel down` (the fixture's teardown) stops it.
    state = cluster.home.load()
    assert state is not None and restarted.pid is not None
    state.components = [
        replace(c, pid=restarted.pid, create_time=psutil.Process(restarted.pid).create_time())
        if c.name == "store"
        else c
        for c in state.components
    ]
    cluster.home.save(state)

    second = [
        make_job(f"b{i}", replicas=3, min_member=3, cpu=100, mem=100 << 20) for i in range(10)
    ]

    def submitted() -> bool:
        # Retried until the dispatcher has reconnected; a job stored by an earlier try counts.
        try:
            results = cluster.client.submit(second).results
        except ClientError:
            return False
        return all(
            r.created or any("exists" in v.description for v in r.violations) for r in results
        )

    wait_until(submitted, timeout=60, what="the dispatcher to accept jobs again")
    for j in first + second:
        wait_until(
            lambda n=j.metadata.name: bound(cluster, n) == 3,
            timeout=120,
            what=f"{j.metadata.name} bound after the store restart",
        )


def test_process_job_runs_and_logs(make_cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=0, process_node=True)
    manifest = tmp_path / "hello.yaml"
    manifest.write_text(
        job_yaml(
            "hello",
            1,
            1,
            "100m",
            extra="    nodeSelector: {godel.io/mode: process}\n"
            "    command: [sh, -c, 'echo hello']\n",
        )
    )
    assert "job/hello created" in cluster.godel("apply", "-f", str(manifest)).stdout
    wait_until(
        lambda: pods_of(cluster, "hello")[0].status.phase == pb.POD_SUCCEEDED,
        timeout=60,
        what="hello-0 succeeded",
    )
    assert cluster.godel("logs", "hello-0").stdout == "hello\n"


BAD_REQUESTS = [
    # name, manifest text, what stderr must say
    ("not yaml", "kind: [", "not valid YAML"),
    ("unknown kind", "apiVersion: godel/v1\nkind: Widget\nmetadata: {name: w}\n", "Widget"),
    ("missing name", "apiVersion: godel/v1\nkind: Job\nmetadata: {}\n", "metadata.name"),
    ("unknown field", job_yaml("u", 1, 1, "1", extra="    colour: red\n"), "colour"),
    ("bad quantity", job_yaml("q", 1, 1, "lots"), "requests.cpu"),
    ("min above replicas", job_yaml("m", 2, 3, "1"), "min_member"),
    ("zero replicas", job_yaml("z", 0, 1, "1"), "replicas"),
    ("negative cpu", job_yaml("n", 1, 1, "-1"), "cpu"),
    ("not dns name", job_yaml("Bad_Name", 1, 1, "1"), "name"),
    (
        "unknown queue",
        job_yaml("uq", 1, 1, "1").replace("  replicas", "  queue: nope\n  replicas"),
        "queue",
    ),
    ("larger than every node", job_yaml("big", 1, 1, "512"), "no node can ever hold"),
    ("bad enum", job_yaml("e", 1, 1, "1").replace("  replicas", "  qos: turbo\n  replicas"), "qos"),
]


def test_malformed_requests_are_refused_and_nothing_is_stored(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=5)
    wait_until(lambda: len(cluster.client.list("Node")) == 5, what="nodes registered")
    before = cluster.run_store(lambda s: s.revision())
    for name, text, needle in BAD_REQUESTS:
        result = cluster.godel("apply", "-f", "-", stdin=text, check=False)
        assert result.returncode != 0, name
        assert needle in result.stderr, (name, result.stderr)
        assert result.stdout == "", (name, result.stdout)
    jobs = cluster.client.list("Job")
    assert jobs == [], [j.metadata.name for j in jobs]  # type: ignore[attr-defined]
    # Heartbeats advance the revision; no job or pod was written.
    assert not any(p for p in cluster.client.list("Pod"))
    assert cluster.run_store(lambda s: s.revision()) >= before


def test_two_shards_anti_affine_pods_never_share_a_zone(
    make_cluster: Callable[..., Cluster],
) -> None:
    """12 single-pod jobs, each pod anti-affine to every other on zone, submitted at once in
    bulk to two shards: each shard may see a zone empty at the same instant, but the Binder's
    serial cross-node check binds one pod per zone (4 hollow zones) and the rest wait, explained.
    The teardown's audit checks the anti-affinity rule on the live store too."""
    cluster = make_cluster(schedulers=2, hollow_nodes=20)
    wait_until(lambda: len(cluster.client.list("Node")) == 20, what="nodes registered")
    jobs = []
    for i in range(12):
        j = make_job(f"web{i}", cpu=100, mem=100 << 20)
        j.spec.template.labels["app"] = "web"
        term = j.spec.template.affinity.pod_anti_affinity.required.add(topology_key="zone")
        term.label_selector.add(key="app", operator=pb.LabelSelectorRequirement.IN, values=["web"])
        jobs.append(j)
    results = cluster.client.submit(jobs).results
    assert all(r.created for r in results), results
    zone_of = {n.metadata.name: n.metadata.labels["zone"] for n in cluster.client.list("Node")}  # type: ignore[attr-defined]

    def settled() -> list[pb.Pod] | None:
        pods: list[pb.Pod] = cluster.client.list("Pod")  # type: ignore[assignment]
        placed = [p for p in pods if p.spec.node_name]
        waiting = [p for p in pods if not p.spec.node_name]
        explained = all(
            any(c.type == "PodScheduled" and c.status == "False" for c in p.status.conditions)
            for p in waiting
        )
        return placed if len(placed) == len(set(zone_of.values())) and explained else None

    placed = wait_until(settled, timeout=120, what="one pod per zone bound, the rest explained")
    zones = [zone_of[p.spec.node_name] for p in placed]
    assert len(zones) == len(set(zones)) == 4, zones
    waiting: list[pb.Pod] = [p for p in cluster.client.list("Pod") if not p.spec.node_name]  # type: ignore[attr-defined,misc]
    why = [" ".join(c.message for c in p.status.conditions) for p in waiting]
    assert all("anti-affinity" in w for w in why), why
