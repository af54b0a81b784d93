"""Other languages: the minimal JavaScript client of examples/node, built from protos/ by
@grpc/proto-loader at run time, submits, reads, watches and deletes a job on a real cluster with
the cluster's credentials (mutual TLS) — the protos are the public contract."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster, wait_until

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node"


@pytest.fixture(scope="module")
def node_client() -> Path:
    """The example with its dependencies installed (`npm ci`, from its package-lock.json)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the example is documented, not run")
    if not (EXAMPLE / "node_modules" / "@grpc" / "grpc-js").is_dir():
        installed = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=EXAMPLE, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if installed.returncode != 0:
            pytest.skip(f"npm ci could not install the example's packages:\n{installed.stderr}")
    return EXAMPLE / "client.js"


def test_node_client_submits_gets_watches_and_deletes(
    node_client: Path, make_cluster: Callable[..., Cluster]
) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2)
    wait_until(lambda: len(cluster.client.list("Node")) == 2, what="nodes registered")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GODEL_")}
    result = subprocess.run(
        ["node", str(node_client), "from-node"],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **env,
            "GODEL_ADDRESS": cluster.state.address_of("dispatcher"),
            "GODEL_TLS_DIR": str(cluster.home.tls_dir),
        },
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "submitted job/from-node"
    assert lines[1].startswith("job/from-node: replicas 2, resource_version ")
    assert sorted(line.split(" on ")[0] for line in lines[2:4]) == [
        "pod/from-node-0",
        "pod/from-node-1",
    ]
    assert lines[4] == "deleted job/from-node (3 objects)"
    assert cluster.client.list("Job") == []
    # Without the cluster's credentials, the same program is refused.
    refused = subprocess.run(
        ["node", str(node_client), "refused"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "GODEL_ADDRESS": cluster.state.address_of("dispatcher"),
             "GODEL_INSECURE": "true"},
    )  # fmt: skip
    assert refused.returncode == 1 and refused.stderr.startswith("error: ")
