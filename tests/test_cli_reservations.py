"""`godel apply|get|describe` of Reservations, with tenants' certificates: a tenant's reservation
is its own (stored with it as owner, listed only to it), another tenant can neither apply over
it nor delete it; `godel get rsv` and `describe` show where the room is held and for whom. The
CLI runs as real processes against a real dispatcher serving mutual TLS on a real store."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from protos.godel.v1 import objects_pb2 as pb
from store import Store
from tests import factories as f
from tests.dispatcher_harness import Running
from tests.test_cli_tenants import ROOT, apply_as, dispatcher, tls_dir

__all__ = ["dispatcher", "tls_dir"]  # the fixtures, shared with the tenants' CLI test

RESERVATION = (
    "apiVersion: godel/v1\nkind: Reservation\nmetadata: {name: keep}\n"
    "spec: {node: n1, ttlSeconds: 300, owner: {job: train, index: 2},\n"
    "       template: {requests: {cpu: '1', memory: 1Gi}}}\n"
)


async def godel_as(
    identity: str, dispatcher: Running, tls_dir: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GODEL_INSECURE"}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "godel", *args, "--server", dispatcher.host.address],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**env, "GODEL_TLS_DIR": str(tls_dir), "GODEL_IDENTITY": identity},
    )


async def test_a_tenants_reservation_is_its_own(
    dispatcher: Running, tls_dir: Path, store: Store
) -> None:
    await store.create(f.node("n1"))
    created = await apply_as("alice", dispatcher, tls_dir, RESERVATION)
    assert (created.returncode, created.stdout) == (0, "reservation/keep created\n"), created.stderr
    stored = await store.get(pb.Reservation, "keep")
    assert stored.metadata.owner == "alice" and stored.spec.node == "n1"

    listed = await godel_as("alice", dispatcher, tls_dir, "get", "rsv")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:6] == ["NAME", "PHASE", "NODE", "OWNER", "CPU", "MEMORY"]
    # Pending: no Binder runs here to commit it on n1.
    assert row.split()[:6] == ["keep", "Pending", "n1", "job=train/2", "1", "1Gi"]
    described = await godel_as("alice", dispatcher, tls_dir, "describe", "reservation/keep")
    assert described.returncode == 0, described.stderr
    assert (
        "reservation: Pending on n1 once the Binder commits it, for job=train/2, released unused"
        in described.stdout
    )

    # What `get -o yaml` prints applies back unchanged.
    printed = await godel_as("alice", dispatcher, tls_dir, "get", "rsv", "keep", "-o", "yaml")
    again = await apply_as("alice", dispatcher, tls_dir, printed.stdout)
    assert (again.returncode, again.stdout) == (0, "reservation/keep unchanged\n"), again.stderr

    # Bob sees none of it, and may neither apply over it nor delete it.
    assert (await godel_as("bob", dispatcher, tls_dir, "get", "reservations")).stdout == ""
    over = await apply_as("bob", dispatcher, tls_dir, RESERVATION)
    assert over.returncode != 0 and "rule own-jobs-only" in over.stderr
    gone = await godel_as("bob", dispatcher, tls_dir, "delete", "rsv", "keep")
    assert gone.returncode != 0 and "rule own-jobs-only" in gone.stderr
    assert (await store.get(pb.Reservation, "keep")) == stored
