"""Watching and node maintenance end to end, through the CLI against real processes: cordon keeps
a pod pending, `get -w` shows it pending, then bound once uncordoned; a drain evicts through the Binder only what
the disruption budget allows, says which pods it waits for and why, and each eviction is an event
shown by `get events`."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import Cluster, wait_until

pytestmark = pytest.mark.e2e


def pinned_job(name: str, replicas: int, node: str) -> str:
    """A job whose pods may run on ``node`` only: a drained pod's replacement stays pending, so
    the budget does not heal while the test looks."""
    return (
        f"apiVersion: godel/v1\nkind: Job\nmetadata: {{name: {name}}}\n"
        f"spec:\n  replicas: {replicas}\n  minMember: 1\n  template:\n"
        f"    labels: {{app: {name}}}\n"
        f"    nodeSelector: {{hostname: {node}}}\n"
        "    requests: {cpu: 100m, memory: 100Mi}\n"
    )


def pods(cluster: Cluster, job: str) -> list[pb.Pod]:
    return cluster.client.list("Pod", job=job)  # type: ignore[return-value]


def test_watch_cordon_drain_within_a_budget(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=3)
    wait_until(lambda: len(cluster.client.list("Node")) == 3, what="nodes registered")
    node = sorted(n.metadata.name for n in cluster.client.list("Node"))[0]  # type: ignore[attr-defined]

    # Cordon: no new pod goes there, the node says so.
    assert cluster.godel("cordon", node).stdout.strip() == f"node/{node} cordoned"
    assert cluster.client.get("Node", node).spec.unschedulable  # type: ignore[attr-defined]
    listed = cluster.godel("get", "nodes").stdout
    assert any(x.split()[:2] == [node, "Ready,SchedulingDisabled"] for x in listed.splitlines())
    assert cluster.godel("cordon", node).stdout.strip() == f"node/{node} already cordoned"
    # A pod that may run only there waits...
    cluster.godel("apply", "-f", "-", stdin=pinned_job("solo", 1, node))

    # ... and `get pods -w` shows it pending, then bound once the node is uncordoned.
    watch = subprocess.Popen(
        [sys.executable, "-m", "godel", "get", "pods", "-w", "-l", "app=solo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GODEL_HOME": str(cluster.home.path)},
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(watch.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:

        def seen(phase: str) -> bool:
            return any(x.split()[:2] == ["solo-0", "solo"] and phase in x for x in list(lines))

        wait_until(lambda: seen("Pending"), what="the watch shows the pod pending")
        assert cluster.godel("uncordon", node).stdout.strip() == f"node/{node} uncordoned"
        assert not cluster.client.get("Node", node).spec.unschedulable  # type: ignore[attr-defined]
        wait_until(lambda: seen("Bound") or seen("Running"), what="the watch shows it bound")
        bound = next(x for x in lines if "Bound" in x or "Running" in x)
        assert node in bound.split()
    finally:
        watch.terminate()
        watch.wait(timeout=30)
        reader.join(timeout=30)
    cluster.godel("delete", "job", "solo")

    # Three pods under `minAvailable: 2` and one unprotected pod, all on the node.
    budget = (
        "apiVersion: godel/v1\nkind: DisruptionBudget\nmetadata: {name: keep-db}\n"
        "spec:\n  selector: [{key: app, operator: In, values: [db]}]\n  minAvailable: 2\n"
    )
    cluster.godel(
        "apply", "-f", "-", stdin=budget + "---\n" + pinned_job("db", 3, node)
        + "---\n" + pinned_job("free", 1, node),
    )  # fmt: skip
    for job, count in (("db", 3), ("free", 1)):
        wait_until(
            lambda j=job, c=count: (
                sum(p.status.phase == pb.POD_RUNNING for p in pods(cluster, j)) == c
            ),
            timeout=120,
            what=f"{job} running",
        )

    def allowed() -> int:
        return cluster.client.get("DisruptionBudget", "keep-db").status.disruptions_allowed  # type: ignore[attr-defined, no-any-return]

    wait_until(lambda: allowed() == 1, what="the budget allows one disruption")

    # One pass: cordons, evicts the free pod and one db pod, waits for the other two.
    drained = cluster.godel("drain", node, "--timeout", "0", check=False)
    assert drained.returncode == 1
    out = drained.stdout.splitlines()
    assert out[0] == f"node/{node} cordoned"
    evicted = [x.split()[0] for x in out if " evicted" in x]
    waiting = [x.split()[0] for x in out if " waiting: " in x]
    assert "pod/free-0" in evicted and len(evicted) == 2
    assert len(waiting) == 2 and all(w.startswith("pod/db-") for w in waiting)
    assert all("keep-db" in x for x in out if " waiting: " in x)
    assert "still waiting for" in drained.stderr
    failed = [p for p in pods(cluster, "db") if p.status.phase == pb.POD_FAILED]
    assert len(failed) == 1 and failed[0].status.reason == "Drained"
    # The replacement waits: the node is cordoned and the only one its pods may use.
    assert all(not p.spec.node_name for p in pods(cluster, "db") if p.metadata.name.endswith("-r1"))
    # Nothing more is allowed: a second pass evicts nothing and waits for the same two.
    again = cluster.godel("drain", node, "--timeout", "0", check=False)
    assert again.returncode == 1 and " evicted" not in again.stdout

    def drained_events() -> set[str]:
        listed = [e for e in cluster.client.list("Event") if isinstance(e, pb.Event)]
        return {e.regarding.name for e in listed if e.reason == "Drained"}

    wait_until(lambda: drained_events() == {"free-0", failed[0].metadata.name}, what="events")
    events = cluster.godel("get", "events").stdout
    assert any(
        "Drained" in x and f"pod/{failed[0].metadata.name}" in x for x in events.splitlines()
    )
