"""`godel apply / get pdb / describe pdb` for disruption budgets, driven through the CLI (a real
process) against a real dispatcher in-process and a real store: budgets with 0 round-trip, the
table reads like `kubectl get pdb`, and the status the dispatcher's controller keeps shows."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protos.godel.v1 import objects_pb2 as pb
from store import Store
from tests import factories as f
from tests.dispatcher_harness import Running, dispatcher_config, eventually, run_dispatcher
from tests.test_dispatcher_controllers import bind, binder_fence

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "disruption-budget.yaml"


@pytest.fixture
async def dispatcher(store_url: str, cluster_name: str, tmp_path: Path) -> AsyncIterator[Running]:
    config = dispatcher_config(store_url, cluster_name, tmp_path, controller_interval_seconds=0.05)
    async with run_dispatcher(config) as running:
        yield running


async def godel(dispatcher: Running, *args: str) -> str:
    """Run the CLI in a process of its own (the dispatcher serves from this event loop)."""
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "godel.cli.main", *args, "--server", dispatcher.host.address],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "GODEL_INSECURE": "true"},  # the in-process dispatcher is plaintext
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_apply_get_describe_budgets(dispatcher: Running, store: Store) -> None:
    applied = await godel(dispatcher, "apply", "-f", str(EXAMPLE))
    assert applied.splitlines() == [
        "disruptionbudget/web created",
        "disruptionbudget/databases created",
    ]
    # Six running web pods under `minAvailable: 5`: one disruption allowed.
    await store.create(f.node("n1"))
    web = f.job("web", replicas=6)
    pods = f.pods_of(web)
    await store.create_unit(web, pods)
    await bind(store, pods, "n1", await binder_fence(store))

    async def computed() -> bool:
        budget = await store.get(pb.DisruptionBudget, "web")
        return budget.status.current_healthy == 6

    await eventually(computed, what="the budget status controller counted the web pods")

    table = [line.split() for line in (await godel(dispatcher, "get", "pdb")).splitlines()]
    assert table[0] == ["NAME", "MIN-AVAILABLE", "MAX-UNAVAILABLE", "ALLOWED-DISRUPTIONS", "AGE"]
    assert sorted(row[:4] for row in table[1:]) == [
        ["databases", "<none>", "0", "0"],
        ["web", "5", "<none>", "1"],
    ]
    wide = (await godel(dispatcher, "get", "pdb", "databases", "-o", "wide")).splitlines()
    assert wide[0].split()[4:8] == ["SELECTOR", "HEALTHY", "DESIRED", "EXPECTED"]
    assert wide[1].split()[4] == "tier=db"  # the selector in kubectl's grammar

    # `maxUnavailable: 0` survives apply and comes back from `get -o yaml`.
    yaml_out = await godel(dispatcher, "get", "pdb/databases", "-o", "yaml")
    assert "  maxUnavailable: 0\n" in yaml_out
    assert "minAvailable" not in yaml_out
    assert "  disruptionsAllowed: 0\n" in yaml_out

    described = await godel(dispatcher, "describe", "pdb", "web")
    assert "  minAvailable: 5\n" in described
    assert "budget: 1 disruption allowed now (6 healthy, 5 desired, 6 expected)" in described
    assert sum(line.startswith("web-") for line in described.splitlines()) == 6
