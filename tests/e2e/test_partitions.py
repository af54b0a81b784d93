"""Node partitions and the reconciler with the real processes: three shards share 30 nodes in
partitions of 10 (`godel status` says so); a shard whose event loop is blocked for three times
the grace (the scheduler's fault drill) keeps its partition and its units, its liveness stamps
going on from their own thread (issue 34 item 1); a shard killed with -9 right after a burst of
submissions loses its partition to the other two and its undecided units to them, the
reconciler deletes the record it left, every pod is bound once, and the teardown's audit finds
nothing corrupted."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import psutil

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.partitions import rebalance_move
from tests import factories as f
from tests.e2e.conftest import Cluster, wait_until

NODES = 30
DISPATCHER_ARGS = (
    "--partitioning",
    "on",
    "--shard-grace-seconds",
    "2",
    "--dead-shard-seconds",
    "4",
    "--reconcile-interval-seconds",
    "1",
)
GRACE_SECONDS = 2
# The shards' fault drill: SIGUSR1 blocks a shard's event loop this long.
STALL_SECONDS = 3 * GRACE_SECONDS
SCHEDULER_ARGS = ("--drill-stall-seconds", str(STALL_SECONDS))


def partitions(cluster: Cluster) -> dict[str, int]:
    shards = cluster.client.list("SchedulerInstance")
    return {s.metadata.name: len(s.spec.partition) for s in shards}  # type: ignore[attr-defined]


def test_shard_killed_mid_decision_loses_its_nodes_and_work_to_the_others(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(
        schedulers=3,
        binders=1,
        hollow_nodes=NODES,
        service_args=(("dispatcher", DISPATCHER_ARGS), ("scheduler", SCHEDULER_ARGS)),
    )
    names = ["scheduler-0", "scheduler-1", "scheduler-2"]

    def three_partitions() -> dict[str, int] | None:
        # 10/10/10 when the shards register before the nodes; a shard that registers after
        # them gets its share by the shuffler's rule (e.g. 8/11/11), which moves no more nodes
        # than it must.
        sizes = partitions(cluster)
        balanced = sorted(sizes) == names and sum(sizes.values()) == NODES
        return sizes if balanced and min(sizes.values()) > 0 and not rebalance_move(sizes) else None

    sizes = wait_until(three_partitions, 60, "three partitions covering the 30 nodes")
    # `godel get schedulers`: each shard's last liveness stamp, seconds ago.
    table = cluster.godel("get", "schedulers").stdout.splitlines()
    assert table[0].split()[:4] == ["NAME", "ADDRESS", "LAST-BEAT", "UNDECIDED"], table
    assert sorted(row.split()[0] for row in table[1:]) == names
    assert all(row.split()[2].endswith("s") for row in table[1:]), table
    status = cluster.godel("status").stdout
    assert "partitioning: on" in status
    for name in names:
        assert any(line.split() == [name, str(sizes[name])] for line in status.splitlines()), status

    _busy_shard_keeps_its_partition_and_units(cluster, sizes)

    jobs = [f.job(f"burst-{i}", replicas=20, min_member=20) for i in range(20)]
    assert all(r.created for r in cluster.client.submit(jobs).results)
    victim = cluster.component("scheduler-0").pid
    assert victim is not None
    os.kill(victim, signal.SIGKILL)  # mid-decision: the burst is being placed
    wait_until(lambda: not psutil.pid_exists(victim) or _zombie(victim), 30, "shard gone")

    def all_bound() -> bool:
        pods = [p for p in cluster.client.list(pb.Pod) if p.metadata.name.startswith("burst-")]
        return len(pods) == 400 and all(p.spec.node_name for p in pods)

    wait_until(all_bound, 120, "every pod bound by the surviving shards")
    # The kill -9'd shard, and only it, was judged dead.
    lost = {e["shard"] for e in _log_events(cluster, "dispatcher", "shard lost")}
    assert lost == {"scheduler-0"}, lost
    # The dead shard's nodes went to the others, and the reconciler deleted its record.
    wait_until(
        lambda: partitions(cluster) == {"scheduler-1": 15, "scheduler-2": 15},
        60,
        "the dead shard's partition shared out and its record gone",
    )
    shards = cluster.client.list("SchedulerInstance")
    covered = [n for s in shards for n in s.spec.partition]  # type: ignore[attr-defined]
    nodes = [n.metadata.name for n in cluster.client.list("Node")]  # type: ignore[attr-defined]
    assert sorted(covered) == sorted(nodes)
    log = Path(cluster.component("dispatcher").log).read_text()
    assert "reconciler repaired" in log and "dead_shard" in log
    # Job status agrees with the pods (nothing stuck there either).
    wait_until(
        lambda: all(
            j.status.phase in (pb.JOB_SCHEDULED, pb.JOB_RUNNING)  # type: ignore[attr-defined]
            for j in cluster.client.list("Job")
        ),
        60,
        "every job scheduled",
    )
    # The teardown audits the invariants: no node over-committed, every pod bound once, gangs
    # whole.


def _busy_shard_keeps_its_partition_and_units(cluster: Cluster, sizes: dict[str, int]) -> None:
    """scheduler-1's event loop blocks for three times the grace while units are dispatched to
    it: the dispatcher judges it alive all along (its stamps go on from their own thread), so
    it keeps its partition and its units, and places them once its loop runs again."""
    busy = cluster.component("scheduler-1").pid
    assert busy is not None
    os.kill(busy, signal.SIGUSR1)
    wait_until(
        lambda: _log_events(cluster, "scheduler-1", "fault drill: blocking the event loop"),
        30,
        "the drill began",
    )
    jobs = [f.job(f"during-{i}", replicas=5, min_member=5) for i in range(9)]
    assert all(r.created for r in cluster.client.submit(jobs).results)
    wait_until(
        lambda: _log_events(cluster, "scheduler-1", "fault drill: event loop released"),
        STALL_SECONDS + 60,
        "the drill ended",
    )

    def during_bound() -> bool:
        pods = [p for p in cluster.client.list(pb.Pod) if p.metadata.name.startswith("during-")]
        return len(pods) == 45 and all(p.spec.node_name for p in pods)

    wait_until(during_bound, 120, "the pods submitted during the drill bound")
    assert _log_events(cluster, "dispatcher", "shard lost") == [], "a busy shard was judged lost"
    assert partitions(cluster) == sizes
    by_shard = {p.status.scheduler for p in cluster.client.list(pb.Pod)}
    assert "scheduler-1" in by_shard, "no unit went to the busy shard: the drill proved nothing"


def _log_events(cluster: Cluster, component: str, event: str) -> list[dict[str, object]]:
    found = []
    for line in Path(cluster.component(component).log).read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            found.append(record)
    return found


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
