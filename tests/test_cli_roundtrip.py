"""`godel get -o yaml | godel apply -f -` changes nothing, for every kind a user applies, driven
through the CLI (a real process) against a real dispatcher in-process and a real store; a changed
job is configured where it may change and refused naming the immutable field; -o json prints one
object alone and a listing as a List; `delete -f` removes what a file declares; system kinds are
refused by name; a bad selector is an error."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from protos.godel.v1 import objects_pb2 as pb
from store import Store
from tests.dispatcher_harness import Running, dispatcher_config, eventually, run_dispatcher

ROOT = Path(__file__).resolve().parent.parent

MANIFESTS = """
apiVersion: godel/v1
kind: Node
metadata: {name: n1, labels: {zone: a}}
spec:
  taints: [{key: dedicated, value: ml, effect: PreferNoSchedule}]
status:
  allocatable: {cpu: "8", memory: 32Gi, pods: 110}
  reclaimable: {cpu: "2", memory: 4Gi}
---
apiVersion: godel/v1
kind: Queue
metadata: {name: research}
spec:
  quota: {cpu: "16", memory: 64Gi, example.com/fpga: 2}
  sortPolicy: Priority
  min: {cpu: "4", memory: 16Gi}
  weight: 3
---
apiVersion: godel/v1
kind: DisruptionBudget
metadata: {name: web}
spec:
  selector: [{key: app, operator: In, values: [web]}, {key: canary, operator: DoesNotExist}]
  maxUnavailable: 0
---
apiVersion: godel/v1
kind: Job
metadata: {name: web, labels: {app: web}}
spec:
  replicas: 2
  minMember: 1
  queue: research
  qos: best-effort
  preemptionPolicy: Never
  backoffLimit: 0
  template:
    labels: {app: web}
    requests: {cpu: 500m, memory: 1Gi}
    tolerations: [{key: dedicated, operator: Exists}]
    numaPolicy: Single
"""
OBJECTS = [("node", "n1"), ("queue", "research"), ("disruptionbudget", "web"), ("job", "web")]


@pytest.fixture
async def dispatcher(store_url: str, cluster_name: str, tmp_path: Path) -> AsyncIterator[Running]:
    config = dispatcher_config(store_url, cluster_name, tmp_path, controller_interval_seconds=0.05)
    async with run_dispatcher(config) as running:
        yield running


async def godel(
    dispatcher: Running, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a process of its own (the dispatcher serves from this event loop)."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "godel", *args, "--server", dispatcher.host.address],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "GODEL_INSECURE": "true"},  # the in-process dispatcher is plaintext
    )


async def ok(dispatcher: Running, *args: str, stdin: str | None = None) -> str:
    result = await godel(dispatcher, *args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_get_yaml_applies_back_unchanged_for_every_kind(
    dispatcher: Running, store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "all.yaml"
    path.write_text(MANIFESTS)
    created = await ok(dispatcher, "apply", "-f", str(path))
    assert created.splitlines() == [f"{kind}/{name} created" for kind, name in OBJECTS]

    async def settled() -> bool:  # the job status controller has written the job's status
        return (await store.get(pb.Job, "web")).status.phase == pb.JOB_PENDING

    await eventually(settled, what="the job's status")

    for kind, name in OBJECTS:
        printed = await ok(dispatcher, "get", kind, name, "-o", "yaml")
        assert await ok(dispatcher, "apply", "-f", "-", stdin=printed) == (
            f"{kind}/{name} unchanged\n"
        )
    # The manifest format: camelCase, quantities, enum values as words, numbers as numbers.
    job = yaml.safe_load(await ok(dispatcher, "get", "job", "web", "-o", "yaml"))
    assert job["spec"]["minMember"] == 1 and job["spec"]["qos"] == "BestEffort"
    assert job["spec"]["template"]["requests"] == {"cpu": "500m", "memory": "1Gi"}
    assert job["spec"]["template"]["numaPolicy"] == "Single"
    assert job["status"]["phase"] == "Pending"
    assert isinstance(job["metadata"]["resourceVersion"], int)
    queue = yaml.safe_load(await ok(dispatcher, "get", "queue/research", "-o", "yaml"))
    assert queue["spec"]["quota"] == {"cpu": "16", "memory": "64Gi", "example.com/fpga": 2}
    assert queue["spec"]["sortPolicy"] == "Priority"
    assert queue["spec"]["min"] == {"cpu": "4", "memory": "16Gi"}

    # A listing of several kinds is one List document, and applies back unchanged too.
    listing = await ok(dispatcher, "get", "job,queue,node,pdb", "-o", "yaml")
    assert yaml.safe_load(listing)["kind"] == "List"
    assert sorted((await ok(dispatcher, "apply", "-f", "-", stdin=listing)).splitlines()) == sorted(
        f"{kind}/{name} unchanged" for kind, name in OBJECTS
    )
    # -o json: one object alone, a listing as a List (even of one item), as kubectl prints.
    assert json.loads(await ok(dispatcher, "get", "job", "web", "-o", "json"))["kind"] == "Job"
    as_list = json.loads(await ok(dispatcher, "get", "jobs", "-o", "json"))
    assert as_list["kind"] == "List" and [i["kind"] for i in as_list["items"]] == ["Job"]
    table = (await ok(dispatcher, "get", "job,queue")).splitlines()
    assert table[1].startswith("job/web") and table[-1].startswith("queue/research")


async def test_changed_job_is_configured_or_names_the_immutable_field(
    dispatcher: Running, store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "all.yaml"
    path.write_text(MANIFESTS)
    await ok(dispatcher, "apply", "-f", str(path))
    docs = list(yaml.safe_load_all(MANIFESTS))
    job = docs[3]
    before = await store.get(pb.Job, "web")

    job["spec"]["replicas"] = 3
    job["spec"]["template"]["requests"]["cpu"] = "1"
    refused = await godel(dispatcher, "apply", "-f", "-", stdin=yaml.safe_dump(job))
    assert refused.returncode == 1
    assert "spec.replicas: is immutable" in refused.stderr
    assert "spec.template.requests.milli_cpu: is immutable" in refused.stderr
    assert (await store.get(pb.Job, "web")) == before  # nothing stored was touched

    job["spec"]["replicas"] = 2
    job["spec"]["template"]["requests"]["cpu"] = "500m"
    job["metadata"]["labels"]["team"] = "ml"
    job["spec"]["backoffLimit"] = 4
    configured = await ok(dispatcher, "apply", "-f", "-", stdin=yaml.safe_dump(job))
    assert configured == "job/web configured\n"
    after = await store.get(pb.Job, "web")
    assert after.metadata.labels["team"] == "ml" and after.spec.backoff_limit == 4
    assert await ok(dispatcher, "apply", "-f", "-", stdin=yaml.safe_dump(job)) == (
        "job/web unchanged\n"
    )

    # A pod is the system's: applying one is refused by name, nothing changes.
    pod = await ok(dispatcher, "get", "pod", "web-0", "-o", "yaml")
    refused_pod = await godel(dispatcher, "apply", "-f", "-", stdin=pod)
    assert refused_pod.returncode == 1 and "'Pod' is not one of" in refused_pod.stderr

    deleted = await ok(dispatcher, "delete", "-f", str(path))
    assert deleted.splitlines() == [f"{kind}/{name} deleted" for kind, name in OBJECTS]
    assert await store.get_many(pb.Job, ["web"]) == [None]
    again = await godel(dispatcher, "delete", "-f", str(path))
    assert again.returncode == 1 and "node/n1" in again.stderr  # each missing one is named


async def test_selectors_with_the_full_grammar_and_bad_ones_refused(
    dispatcher: Running, tmp_path: Path
) -> None:
    path = tmp_path / "all.yaml"
    path.write_text(MANIFESTS)
    await ok(dispatcher, "apply", "-f", str(path))
    names = ["get", "pods", "-o", "name", "-l"]
    assert (await ok(dispatcher, *names, "app in (web,api),!canary")).split() == [
        "pod/web-0",
        "pod/web-1",
    ]
    assert await ok(dispatcher, *names, "app!=web") == ""
    bad = await godel(dispatcher, *names, "app in web")
    assert bad.returncode == 1 and "invalid label selector 'app in web'" in bad.stderr


TWO_JOBS = """
apiVersion: godel/v1
kind: Job
metadata: {name: a}
spec: {replicas: 1, template: {requests: {cpu: 100m, memory: 64Mi}}}
---
apiVersion: godel/v1
kind: Job
metadata: {name: b}
spec: {replicas: 2, template: {requests: {cpu: 100m, memory: 64Mi}}}
"""


async def test_delete_takes_several_names_and_reports_each(
    dispatcher: Running, store: Store, tmp_path: Path
) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(TWO_JOBS)
    await ok(dispatcher, "apply", "-f", str(path))

    result = await godel(dispatcher, "delete", "job", "a", "missing", "b")
    # As kubectl: a line per name deleted, the missing one reported without stopping the rest,
    # and the exit status says one failed.
    assert result.stdout.splitlines() == ["job/a deleted", "job/b deleted"]
    assert "job/missing" in result.stderr and result.returncode == 1
    assert await store.get_many(pb.Job, ["a", "b"]) == [None, None]

    await ok(dispatcher, "apply", "-f", str(path))
    both = await ok(dispatcher, "delete", "job/a", "job/b")
    assert both.splitlines() == ["job/a deleted", "job/b deleted"]
    mixed = await godel(dispatcher, "delete", "job", "a", "job/b")
    assert mixed.returncode != 0 and "not both forms" in mixed.stderr
