"""A gang's schedule timeout end to end (real processes, the CLI and the SDK): a gang that cannot
fit goes Timeout after its short ``scheduleTimeoutSeconds``, `godel get jobs`, `godel explain`
and an Event say so with its last attempt's diagnosis, its pods are held (not dispatched even
once room is made), applying the same manifest and `godel retry` / the SDK's retry start it
again, and with room made it schedules."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from godel.client import GodelClient, JobFailed
from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import Cluster, wait_until

pytestmark = pytest.mark.e2e

SMALL_NODES = ("nodeagent", ("--hollow-cpu-milli", "1000", "--hollow-memory-bytes", str(4 << 30)))
# Long enough for a gang with room to be dispatched, scheduled and bound on a loaded machine.
TIMEOUT_SECONDS = 6

BLOCKER = (
    "apiVersion: godel/v1\nkind: Job\nmetadata: {name: blocker}\n"
    "spec: {replicas: 2, minMember: 1, template: {requests: {cpu: 600m, memory: 100Mi}}}\n"
)
GANG = (
    "apiVersion: godel/v1\nkind: Job\nmetadata: {name: gang}\n"
    f"spec: {{replicas: 2, minMember: 2, scheduleTimeoutSeconds: {TIMEOUT_SECONDS},"
    " template: {requests: {cpu: 500m, memory: 100Mi}}}\n"
)


def _phase(cluster: Cluster, name: str) -> int:
    job = cluster.client.get(pb.Job, name)
    return job.status.phase


def test_a_gang_that_cannot_fit_times_out_and_is_retried(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=2, service_args=(SMALL_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 2, what="nodes registered")
    cluster.godel("apply", "-f", "-", stdin=BLOCKER)
    wait_until(
        lambda: sum(1 for p in cluster.client.list(pb.Pod, job="blocker") if p.spec.node_name) == 2,
        what="the blocker placed",
    )
    # 400m free per node: the gang's two 500m pods never fit together.
    cluster.godel("apply", "-f", "-", stdin=GANG)
    with GodelClient() as client:
        gang = client.job("gang")
        gang.wait("PreScheduling", timeout=60)
        timed_out = gang.wait("Timeout", timeout=120)
        assert timed_out.phase == "Timeout"
        with pytest.raises(JobFailed, match="is Timeout"):
            gang.wait("Scheduled", timeout=60)

        listed = cluster.godel("get", "jobs").stdout
        [row] = [line for line in listed.splitlines() if line.startswith("gang ")]
        assert "Timeout" in row and "ScheduleTimeout" in row
        assert f"not scheduled within {TIMEOUT_SECONDS}s" in row
        assert "insufficient cpu" in row  # the last attempt's diagnosis
        explained = cluster.godel("explain", "gang-0").stdout
        assert "Timeout: gang not scheduled within" in explained
        assert "insufficient cpu" in explained
        # Events are written a moment after the change they tell of (services/events.py).
        wait_until(
            lambda: any(
                e.reason == "ScheduleTimeout" and e.regarding.name == "gang"
                for e in cluster.client.list(pb.Event)
            ),
            what="the ScheduleTimeout event",
        )

        # Applying the same manifest starts it again: its timer restarts, and with no room it
        # times out again.
        first_timeout = cluster.client.get(pb.Job, "gang").status.conditions[0].last_transition_ms
        assert "configured" in cluster.godel("apply", "-f", "-", stdin=GANG).stdout
        restarted = cluster.client.get(pb.Job, "gang")
        assert restarted.status.phase in (pb.JOB_PENDING, pb.JOB_PRESCHEDULING)
        assert restarted.status.schedule_started_ms >= first_timeout
        wait_until(
            lambda: _phase(cluster, "gang") == pb.JOB_TIMEOUT, timeout=120, what="timed out again"
        )

        # Room is made; the timed-out gang's pods are held all the same.
        cluster.godel("delete", "job/blocker")
        wait_until(lambda: not cluster.client.list(pb.Pod, job="blocker"), what="the blocker gone")
        time.sleep(3)  # a few dispatch rounds: the held gang is not sent
        assert _phase(cluster, "gang") == pb.JOB_TIMEOUT
        assert not any(p.spec.node_name for p in cluster.client.list(pb.Pod, job="gang"))

        retried = cluster.godel("retry", "job/gang").stdout
        assert "job/gang retried (Pending)" in retried
        scheduled = gang.wait("Scheduled", timeout=120)
        assert scheduled.phase in ("Scheduled", "Running", "Succeeded")
        assert all(p.spec.node_name for p in cluster.client.list(pb.Pod, job="gang"))
        assert not any(
            c.type == "Timeout" for c in cluster.client.get(pb.Job, "gang").status.conditions
        )

        # Only a timed-out job is retried; the SDK says why.
        from godel.client import Conflict

        with pytest.raises(Conflict, match="only a job whose scheduling timed out"):
            gang.retry()
