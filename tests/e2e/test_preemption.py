"""Preemption end to end: real processes (store server, dispatcher, two scheduler shards, two
binders, a node agent with hollow nodes) driven through the CLI and the client; the fixture
audits the invariants afterwards."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import Cluster, wait_until

pytestmark = pytest.mark.e2e

NODES = 100
SMALL_NODES = ("nodeagent", ("--hollow-cpu-milli", "1000", "--hollow-memory-bytes", str(4 << 30)))


def job_yaml(name: str, replicas: int, cpu: str, spec: str) -> str:
    return (
        f"apiVersion: godel/v1\nkind: Job\nmetadata: {{name: {name}}}\n"
        f"spec:\n  replicas: {replicas}\n  minMember: 1\n{spec}"
        f"  template:\n    requests: {{cpu: {cpu}, memory: 100Mi}}\n"
    )


def pods(cluster: Cluster, job: str) -> list[pb.Pod]:
    return cluster.client.list("Pod", job=job)  # type: ignore[return-value]


def placed(cluster: Cluster, job: str) -> int:
    return sum(1 for p in pods(cluster, job) if p.spec.node_name)


def test_high_priority_job_preempts_only_lower_priority_same_pool_pods(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=2, hollow_nodes=NODES, service_args=(SMALL_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == NODES, what="nodes registered")
    # Every node full in both pools: half the guaranteed room is preemptible, replaced when
    # lost; the other half is not preemptible; best-effort work fills the reclaimable pools.
    fill = (
        job_yaml("svc", NODES // 2, "1", "  priority: 1\n  preemptible: true\n"
                 "  replaceLostPods: true\n")
        + "---\n"
        + job_yaml("fixed", NODES // 2, "1", "  priority: 1\n  preemptible: false\n")
        + "---\n"
        + job_yaml("be", NODES, "500m", "  priority: 0\n  preemptible: true\n"
                   "  qos: best-effort\n")
    )  # fmt: skip
    cluster.godel("apply", "-f", "-", stdin=fill)
    for job, want in (("svc", NODES // 2), ("fixed", NODES // 2), ("be", NODES)):
        wait_until(lambda j=job, w=want: placed(cluster, j) == w, timeout=120, what=f"{job} placed")

    cluster.godel("apply", "-f", "-", stdin=job_yaml("online", 3, "1", "  priority: 100\n"))
    wait_until(
        lambda: (
            all(p.status.phase == pb.POD_RUNNING for p in pods(cluster, "online"))
            and len(pods(cluster, "online")) == 3
        ),
        timeout=120,
        what="the high-priority job running",
    )

    everyone = cluster.client.list("Pod")
    evicted = [p for p in everyone if isinstance(p, pb.Pod) and p.status.phase == pb.POD_FAILED]
    assert len(evicted) == 3
    online = {p.metadata.name: p for p in pods(cluster, "online")}
    for victim in evicted:
        # Only lower-priority, preemptible, same-pool pods; each names its preemptor.
        assert victim.spec.job == "svc", victim.metadata.name
        assert victim.status.reason == "Preempted"
        assert victim.status.preempted_by in online
        assert online[victim.status.preempted_by].spec.node_name == victim.spec.node_name
    assert placed(cluster, "fixed") == NODES // 2
    assert all(p.status.phase != pb.POD_FAILED for p in pods(cluster, "be"))
    # Every victim of the replacing job has its replacement (pending: the cluster is full).
    by_name = {p.metadata.name: p for p in pods(cluster, "svc")}
    for victim in evicted:
        replacement = by_name.get(f"{victim.metadata.name}-r1")
        assert replacement is not None, victim.metadata.name
        assert replacement.status.phase in (pb.POD_PENDING, pb.POD_BOUND, pb.POD_RUNNING)
        assert replacement.spec.index == victim.spec.index
    # What a user sees of a victim.
    out = cluster.godel("get", "pods", "-o", "wide").stdout
    line = next(x for x in out.splitlines() if x.startswith(evicted[0].metadata.name + " "))
    assert "Failed" in line and "Preempted" in line and evicted[0].status.preempted_by in line
    assert "PREEMPTED-BY" in out.splitlines()[0]
    why = cluster.godel("explain", evicted[0].metadata.name).stdout
    assert f"preempted by pod '{evicted[0].status.preempted_by}'" in why
    # Each preemption is an event (recorded by the Binder, written in its next batch), listed
    # by `get events` and at the end of the victim's `describe`.
    victims = {v.metadata.name: v for v in evicted}

    def preempted_events() -> list[pb.Event]:
        listed = [e for e in cluster.client.list("Event") if isinstance(e, pb.Event)]
        return [e for e in listed if e.reason == "Preempted" and e.regarding.name in victims]

    wait_until(lambda: len(preempted_events()) == 3, what="an event per preemption")
    for event in preempted_events():
        assert event.regarding.kind == "Pod" and event.type == "Warning"
        assert event.related.name == victims[event.regarding.name].status.preempted_by
    events = cluster.godel("get", "events").stdout.splitlines()
    assert events[0].split()[:4] == ["LAST-SEEN", "TYPE", "REASON", "OBJECT"]
    assert any("Preempted" in x and f"pod/{evicted[0].metadata.name}" in x for x in events)
    described = cluster.godel("describe", "pod", evicted[0].metadata.name).stdout
    tail = described.split("events:")[-1]
    assert "Preempted" in tail and evicted[0].status.preempted_by in tail


def budget_yaml(min_available: int) -> str:
    return (
        "apiVersion: godel/v1\nkind: DisruptionBudget\nmetadata: {name: keep-low}\n"
        f"spec:\n  job: low\n  minAvailable: {min_available}\n"
    )


def test_disruption_budget_blocks_then_allows_exactly_one_eviction(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=2, hollow_nodes=3, service_args=(SMALL_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 3, what="nodes registered")
    cluster.godel("apply", "-f", "-", stdin=budget_yaml(3))
    low = job_yaml("low", 3, "1", "  priority: 1\n  preemptible: true\n")
    cluster.godel("apply", "-f", "-", stdin=low)
    wait_until(lambda: placed(cluster, "low") == 3, timeout=120, what="low placed")

    # Three victims under minAvailable 3: the preemptor waits, and says why.
    cluster.godel("apply", "-f", "-", stdin=job_yaml("online", 1, "1", "  priority: 100\n"))

    def explained() -> str:
        out = cluster.godel("explain", "online-0").stdout
        return out if "on 3 nodes budget keep-low allows no more evictions" in out else ""

    wait_until(explained, timeout=120, what="explain names the disruption budget")
    assert placed(cluster, "online") == 0
    assert all(p.status.phase != pb.POD_FAILED for p in pods(cluster, "low"))

    # minAvailable 2: exactly one victim, and the preemptor runs.
    cluster.godel("apply", "-f", "-", stdin=budget_yaml(2))
    wait_until(
        lambda: [p.status.phase for p in pods(cluster, "online")] == [pb.POD_RUNNING],
        timeout=180,
        what="the preemptor running",
    )
    failed = [p for p in pods(cluster, "low") if p.status.phase == pb.POD_FAILED]
    assert [(p.status.reason, p.status.preempted_by) for p in failed] == [("Preempted", "online-0")]
    assert placed(cluster, "low") == 3  # the victim keeps its record (and its node name)


def test_explain_says_preemption_cannot_evict_pods_that_are_not_preemptible(
    make_cluster: Callable[..., Cluster],
) -> None:
    """Two nodes full of non-preemptible pods: a high-priority pod stays pending, and `godel
    explain` (and the API's data under it) says on how many nodes which rule blocked it."""
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2, service_args=(SMALL_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 2, what="nodes registered")
    fixed = job_yaml("fixed", 2, "1", "  priority: 1\n  preemptible: false\n")
    cluster.godel("apply", "-f", "-", stdin=fixed)
    wait_until(lambda: placed(cluster, "fixed") == 2, timeout=120, what="fixed placed")

    cluster.godel("apply", "-f", "-", stdin=job_yaml("online", 1, "1", "  priority: 100\n"))

    def explained() -> str:
        out = cluster.godel("explain", "online-0").stdout
        return out if "preemption cannot help" in out else ""

    out = wait_until(explained, timeout=120, what="explain says why preemption cannot help")
    assert (
        "preemption cannot help: on 2 nodes the pods that would have to go are not preemptible "
        "(mark their job `preemptible: true` or set their queue's `preemptibleDefault`)"
    ) in out
    data = cluster.client.explain("online-0").diagnosis
    assert [(r.reason, r.nodes) for r in data.preemption_reasons] == [("not preemptible", 2)]
    assert data.priority == 100 and not data.preemption_never
    assert placed(cluster, "online") == 0
    assert all(p.status.phase == pb.POD_RUNNING for p in pods(cluster, "fixed"))


def test_a_preemptor_in_flight_shows_where_it_preempts(
    make_cluster: Callable[..., Cluster],
) -> None:
    """While the Binder has a preemptor's decision, `explain` says what it is preempting where
    and `get pods -o wide` shows the nominated node; once bound, the nomination is gone. The
    Binder is held mid-flight by stopping its processes (SIGSTOP), then let go."""
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2, service_args=(SMALL_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 2, what="nodes registered")
    cluster.godel(
        "apply", "-f", "-", stdin=job_yaml("low", 2, "1", "  priority: 1\n  preemptible: true\n")
    )
    wait_until(lambda: placed(cluster, "low") == 2, timeout=120, what="low placed")

    binders = [c for c in cluster.state.components if c.kind == "binder"]
    assert binders
    for binder in binders:
        assert binder.pid is not None
        os.kill(binder.pid, signal.SIGSTOP)
    try:
        cluster.godel("apply", "-f", "-", stdin=job_yaml("online", 1, "1", "  priority: 100\n"))

        def explained() -> str:
            out = cluster.godel("explain", "online-0").stdout
            return out if "preempting 1 pod on " in out else ""

        why = wait_until(explained, timeout=120, what="explain shows the preemption in flight")
        victim = why.strip().rsplit(": ", 1)[1]
        assert victim in {p.metadata.name for p in pods(cluster, "low")}
        node = next(p.spec.node_name for p in pods(cluster, "low") if p.metadata.name == victim)
        assert f"on {node}:" in why
        table = cluster.godel("get", "pods", "-o", "wide").stdout.splitlines()
        header = table[0]
        row = next(line for line in table if line.startswith("online-0 "))
        assert row[header.index("NOMINATED") :].split()[0] == node
        assert row[header.index("NODE ") :].split()[0] == "<none>"  # not bound yet
    finally:
        for binder in binders:
            assert binder.pid is not None
            os.kill(binder.pid, signal.SIGCONT)

    wait_until(
        lambda: [p.status.phase for p in pods(cluster, "online")] == [pb.POD_RUNNING],
        timeout=120,
        what="the preemptor running",
    )
    (online,) = pods(cluster, "online")
    assert online.spec.node_name == node and online.status.nominated_node == ""
    assert "preempting" not in cluster.godel("explain", "online-0").stdout
