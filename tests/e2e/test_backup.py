"""`godel backup` of a running cluster and `godel restore` into the stopped cluster: the round
trip through the real CLI and the real services."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from godel import local
from godel.client import ProtoClient
from tests.e2e.conftest import Cluster, wait_until
from tests.e2e.test_pipeline import job_yaml

pytestmark = pytest.mark.e2e


def _bound(client: ProtoClient, job: str, replicas: int) -> dict[str, str] | None:
    pods = client.list("Pod", job=job)
    placed = {p.metadata.name: p.spec.node_name for p in pods}  # type: ignore[attr-defined]
    return placed if len(placed) == replicas and all(placed.values()) else None


@pytest.mark.parametrize("store_replicas", [0, 1], ids=["one server", "replicated"])
def test_backup_of_a_running_cluster_restores_into_the_stopped_cluster(
    make_cluster: Callable[..., Cluster], store_replicas: int
) -> None:
    """With a replicated store the backup is read through Sentinel from the primary, and the
    restore goes into the primary's data dir; the replica copies it when the cluster starts."""
    spec = {"schedulers": 1, "binders": 1, "hollow_nodes": 10, "store_replicas": store_replicas}
    cluster = make_cluster(**spec)
    cluster.godel("apply", "-f", "-", stdin=job_yaml("before", 6, 6, "500m"))
    placed = wait_until(lambda: _bound(cluster.client, "before", 6), what="before bound")

    backup = cluster.home.path.parent / "cluster.backup"
    out = cluster.godel("backup", str(backup)).stdout
    assert out.startswith("backed up ") and str(backup) in out
    cluster.godel("apply", "-f", "-", stdin=job_yaml("after", 2, 2, "500m"))
    wait_until(lambda: _bound(cluster.client, "after", 2), what="after bound")

    refused = cluster.godel("restore", str(backup), check=False)
    assert refused.returncode != 0 and "is running" in refused.stderr
    cluster.godel("down")
    assert "restored " in cluster.godel("restore", str(backup)).stdout

    state = local.up(
        cluster.home,
        local.ClusterSpec(grace_seconds=2.0, fsync="everysec", process_node=False, **spec),
    )
    cluster.reload()
    cluster.client.close()
    cluster.client = ProtoClient(state.address_of("dispatcher"))
    # The cluster is back where the backup was taken: the job from before it, bound where it
    # was; nothing from after it.
    assert _bound(cluster.client, "before", 6) == placed
    assert cluster.client.list("Pod", job="after") == []
    names = {j.metadata.name for j in cluster.client.list("Job")}  # type: ignore[attr-defined]
    assert names == {"before"}
    # And it schedules on from there (the audit at teardown checks the invariants).
    cluster.godel("apply", "-f", "-", stdin=job_yaml("later", 2, 2, "500m"))
    wait_until(lambda: _bound(cluster.client, "later", 2), what="later bound")
