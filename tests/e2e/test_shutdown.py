"""Issue 16 item 7: every service shuts down within its grace. A real cluster — each service kind
its own process, started with ``--grace-seconds`` as `godel up` starts it — with work in flight;
every service gets SIGTERM and must exit 0, without its shutdown overrunning the grace (the
runtime logs ``on_stop overran the grace`` when it cancels a shutdown step that did). The
deadline for the exits is generous: this checks that nothing hangs, not how fast it goes."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import Cluster, wait_until

pytestmark = pytest.mark.e2e

GRACE_SECONDS = 2.0
# Beyond the grace: interpreter exit and a busy shared machine (a hang would be minutes).
MARGIN_SECONDS = 30.0
KINDS = ("dispatcher", "scheduler", "binder", "rescheduler", "nodeagent", "dashboard")
OVERRAN = "on_stop overran the grace; its work was cancelled"


def _events(log: Path) -> list[str]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            out.append(str(json.loads(line).get("event", "")))
        except ValueError:
            continue
    return out


def test_every_service_kind_exits_within_its_grace_on_sigterm(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(
        schedulers=1, binders=2, hollow_nodes=4, dashboard=True, grace_seconds=GRACE_SECONDS
    )
    wait_until(lambda: len(cluster.client.list("Node")) == 4, what="nodes registered")
    # Work in flight as the signals land: pods being scheduled, bound and run.
    jobs = []
    for i in range(20):
        job = pb.Job(metadata=pb.ObjectMeta(name=f"busy-{i}"))
        job.spec.replicas, job.spec.min_member = 3, 1
        job.spec.template.requests.milli_cpu = 10
        job.spec.template.requests.memory_bytes = 1 << 20
        job.spec.template.duration_ms = 60_000
        jobs.append(job)
    assert all(r.created for r in cluster.client.submit(jobs).results)
    services = [c for c in cluster.state.components if c.kind in KINDS]
    assert sorted({c.kind for c in services}) == sorted(KINDS)  # the table covers every kind
    stop_within_grace(cluster, GRACE_SECONDS)


def stop_within_grace(cluster: Cluster, grace_seconds: float) -> None:
    """SIGTERM every service of ``cluster`` at once; each must exit 0 without its shutdown
    overrunning the grace (also used under load: tests/e2e/test_liveness.py)."""
    services = [c for c in cluster.state.components if c.kind in KINDS]
    procs = {c.name: psutil.Process(c.pid) for c in services}
    for proc in procs.values():
        proc.send_signal(signal.SIGTERM)
    codes = {
        name: proc.wait(timeout=grace_seconds + MARGIN_SECONDS) for name, proc in procs.items()
    }
    assert codes == {name: 0 for name in procs}
    overran = {c.name for c in services if OVERRAN in _events(Path(c.log))}
    assert overran == set(), f"shutdown overran the grace: {overran}"
