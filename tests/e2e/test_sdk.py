"""The SDK (godel.client.GodelClient / AsyncGodelClient) against real clusters: submit and wait
on process and hollow nodes, idempotent retries, watch through a dispatcher kill -9, each typed
error, discovery, and the quickstart example."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import psutil
import pytest

from foundation import tls
from foundation.netutil import free_ports
from godel.client import (
    AlreadyExists,
    AsyncGodelClient,
    ClientError,
    ClusterNotFound,
    Conflict,
    Event,
    GodelClient,
    Invalid,
    Job,
    NotFound,
    Pod,
    Unavailable,
    job,
)
from services.runtime.healthcheck import probe
from tests.e2e.conftest import ROOT, Cluster, wait_until

pytestmark = pytest.mark.e2e

PROCESS = {"godel.io/mode": "process"}


def hello(name: str, text: str) -> Job:
    """A one-pod job that really runs ``echo`` on the process-mode node."""
    return job(
        name, cpu="100m", memory="64Mi", node_selector=PROCESS, command=["sh", "-c", f"echo {text}"]
    )


def test_sync_client_submits_waits_and_cleans_up(
    make_cluster: Callable[..., Cluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=4, process_node=True)
    wait_until(lambda: len(cluster.client.list("Node")) == 5, what="nodes registered")
    # Discovery as a program run after `godel up` sees it: nothing but $GODEL_HOME.
    monkeypatch.delenv("GODEL_ADDRESS", raising=False)
    monkeypatch.delenv("GODEL_SERVER", raising=False)
    monkeypatch.setenv("GODEL_HOME", str(cluster.home.path))
    with GodelClient() as client:
        assert client.address == cluster.state.address_of("dispatcher")
        done = client.submit(hello("sync-hello", "hi"))
        gang = client.submit(job("sync-gang", replicas=3, cpu="1", memory="1Gi"))
        assert not done.existing
        finished = done.wait("Succeeded", timeout=90)
        assert finished.phase == "Succeeded" and finished.name == "sync-hello"
        assert [p.phase for p in done.pods()] == ["Succeeded"]
        running = gang.wait("Running", timeout=90)
        assert running.phase in ("Running", "Succeeded")
        pods = gang.pods()
        assert len(pods) == 3 and all(isinstance(p, Pod) and p.node for p in pods)
        assert all(e.node and "bound to" in e.summary for e in gang.explain())
        # Manifest-shaped: what `godel get -o yaml` prints.
        status = gang.status()
        assert status.manifest["kind"] == "Job" and status.spec["replicas"] == 3
        assert "kind: Job" in status.to_yaml()
        assert gang.delete() == 4
        with pytest.raises(NotFound):
            gang.status()
        # A multi-document manifest, as `godel apply -f` takes it.
        queue = (ROOT / "examples" / "queue.yaml").read_text()
        manifest = (
            queue + "---\napiVersion: godel/v1\nkind: Job\nmetadata: {name: queued}\n"
            "spec: {replicas: 1, minMember: 1, queue: research,"
            " template: {requests: {cpu: 100m, memory: 64Mi}}}\n"
        )
        applied = client.apply_manifest(manifest)
        assert [(a.kind, a.name, a.action) for a in applied] == [
            ("Queue", "research", "created"),
            ("Job", "queued", "created"),
        ]
        again = client.apply_manifest(manifest)  # declarative: applying again changes nothing
        assert [a.action for a in again] == ["unchanged", "unchanged"]
        queued = client.job("queued").wait("Running", timeout=90)
        assert queued.spec["queue"] == "research"
        client.job("queued").delete()


def test_async_client_submits_waits_and_retries_idempotently(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=4, process_node=True)
    wait_until(lambda: len(cluster.client.list("Node")) == 5, what="nodes registered")
    address = cluster.state.address_of("dispatcher")

    async def scenario() -> None:
        async with AsyncGodelClient(address) as client:
            manifest = (
                "apiVersion: godel/v1\nkind: Job\nmetadata: {name: async-web, labels: {t: a}}\n"
                "spec:\n  replicas: 2\n  minMember: 1\n"
                "  template: {requests: {cpu: 500m, memory: 1Gi}}\n"
            )
            web, done = await client.submit(
                [Job.from_manifest(manifest), hello("async-hello", "there")]
            )
            assert (await done.wait("Succeeded", timeout=90)).phase == "Succeeded"
            assert (await web.wait("Running", timeout=90)).phase == "Running"
            assert all(p.node for p in await web.pods())
            assert [j.name for j in await client.list("Job", labels={"t": "a"})] == ["async-web"]
            # A retry of a submission whose reply was lost (same request id): the job the first
            # attempt stored is reported, not stored again and not refused.
            gang = job("async-gang", replicas=2, cpu="1", memory="1Gi")
            first = await client.submit(gang, request_id="req-1")
            again = await client.submit(gang, request_id="req-1")
            assert not first.existing and again.existing and again.name == "async-gang"
            assert len(await again.pods()) == 2
            # Another submission of the same name is a clash.
            with pytest.raises(AlreadyExists):
                await client.submit(gang, request_id="req-2")
            # Same request id, different job: the client's bug, also a clash.
            with pytest.raises(AlreadyExists):
                await client.submit(
                    job("async-gang", replicas=3, cpu="1", memory="1Gi"), request_id="req-1"
                )
            for handle in (web, done, first):
                await handle.delete()

    asyncio.run(asyncio.wait_for(scenario(), 240))


def _restart(cluster: Cluster, name: str) -> None:
    """kill -9 a service and start it again at its address, as `godel up` started it."""
    record = cluster.component(name)
    assert record.pid is not None
    proc = psutil.Process(record.pid)
    proc.kill()
    proc.wait(10)
    cluster.start_again(name)
    # Serving again before the test carries on: on a loaded machine a Python service takes
    # longer to start than the client's retries last (about 3 s), which is not what is tested.
    admin = tls.load(cluster.home.tls_dir, tls.ADMIN)
    wait_until(
        lambda: probe(record.address, timeout=2, credentials=admin) == "SERVING",
        what=f"{name} serving again",
    )


def test_watch_resumes_through_a_dispatcher_kill9(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=4)
    wait_until(lambda: len(cluster.client.list("Node")) == 4, what="nodes registered")
    start = cluster.run_store(lambda s: s.revision())
    seen: list[Event] = []
    stop = threading.Event()

    def follow() -> None:
        with GodelClient(cluster.state.address_of("dispatcher")) as client:
            for event in client.watch(["Job", "Pod"], selector={"suite": "w"}, from_revision=start):
                seen.append(event)
                if stop.is_set():
                    return

    watcher = threading.Thread(target=follow, name="watcher", daemon=True)
    watcher.start()
    labels = {"suite": "w"}
    with GodelClient(cluster.state.address_of("dispatcher")) as client:
        before = [
            client.submit(job(f"w{i}", replicas=2, labels=labels, pod_labels=labels))
            for i in range(3)
        ]
        client.submit(job("unlabelled", replicas=1))  # filtered out by the selector
        wait_until(lambda: sum(e.object.kind == "Job" for e in seen) >= 3, what="first events")
        _restart(cluster, "dispatcher")
        # Written after the restart; the watcher has to resume to see them.
        after = [
            client.submit(job(f"w{i}", replicas=2, labels=labels, pod_labels=labels))
            for i in range(3, 6)
        ]
        for handle in before + after:
            handle.wait("Running", timeout=120)
        before[0].delete()
        last = cluster.run_store(lambda s: s.revision())
        wait_until(
            lambda: any(e.type == "DELETED" and e.object.name == "w0" for e in seen),
            timeout=90,
            what="the deletion of w0 seen by the resumed watch",
        )
    # The truth: one uninterrupted watch of the same range, now that the dispatcher is up.
    truth: list[Event] = []
    with GodelClient(cluster.state.address_of("dispatcher")) as client:
        for event in client.watch(["Job", "Pod"], selector={"suite": "w"}, from_revision=start):
            truth.append(event)
            if event.revision >= max(e.revision for e in seen):
                break

    # One more labelled change wakes the watcher, which then sees `stop` and returns.
    stop.set()
    with GodelClient(cluster.state.address_of("dispatcher")) as client:
        client.job("w1").delete()
    watcher.join(60)
    assert not watcher.is_alive()

    def key(e: Event) -> tuple[str, str, str, int]:
        return (e.type, e.object.kind, e.object.name, e.revision)

    got = [key(e) for e in seen if e.revision <= truth[-1].revision]
    assert got == [key(e) for e in truth]
    assert len({e.revision for e in seen}) == len(seen), "an event was delivered twice"
    assert all(e.object.labels == labels for e in seen)
    assert {e.object.name for e in seen if e.object.kind == "Job"} == {f"w{i}" for i in range(6)}
    assert last <= cluster.run_store(lambda s: s.revision())


def test_typed_errors(make_cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=2)
    wait_until(lambda: len(cluster.client.list("Node")) == 2, what="nodes registered")
    client = GodelClient(cluster.state.address_of("dispatcher"), timeout=10)
    kept = client.submit(job("kept", replicas=1))
    bad_cpu = "apiVersion: godel/v1\nkind: Job\nmetadata: {name: q}\nspec:\n  replicas: 1\n"
    bad_cpu += "  minMember: 1\n  template: {requests: {cpu: lots}}\n"
    (dead_port,) = free_ports(1, "127.0.0.1")
    cases: list[tuple[str, Callable[[], object], type[ClientError], str]] = [
        ("get a missing job", lambda: client.get("Job", "nope"), NotFound, "nope"),
        ("status of a missing job", lambda: client.job("nope").status(), NotFound, "nope"),
        ("delete a missing job", lambda: client.delete("Job", "nope"), NotFound, "nope"),
        ("explain a missing pod", lambda: client.explain("nope-0"), NotFound, "nope"),
        ("wait for a missing job", lambda: client.job("nope").wait("Running", 30), NotFound, ""),
        ("name taken", lambda: client.submit(job("kept", replicas=1)), AlreadyExists, "kept"),
        ("min above replicas", lambda: client.submit(job("m", replicas=2, min_member=3)),
         Invalid, "min_member"),
        ("bad name", lambda: client.submit(job("Bad_Name")), Invalid, "name"),
        ("unknown queue", lambda: client.submit(job("uq", queue="nope")), Invalid, "queue"),
        ("larger than every node", lambda: client.submit(job("big", cpu="512")), Invalid,
         "no node can ever hold"),
        ("bad quantity", lambda: Job.from_manifest(bad_cpu), Invalid, "requests.cpu"),
        ("unknown kind", lambda: client.list("Widget"), Invalid, "Widget"),
        ("job filter on nodes", lambda: next(client.watch("Node", job="kept")), Invalid, "job"),
        ("stale version", lambda: client.delete("Job", "kept", resource_version=1), Conflict, ""),
        ("nobody there", lambda: GodelClient(f"127.0.0.1:{dead_port}", timeout=5).list("Job"),
         Unavailable, "cannot reach"),
    ]  # fmt: skip
    try:
        for what, call, error, text in cases:
            with pytest.raises(error) as caught:
                call()
            assert isinstance(caught.value, ClientError), what
            assert text in str(caught.value), f"{what}: {caught.value}"
        # Invalid carries the offending fields.
        with pytest.raises(Invalid) as invalid:
            client.submit(job("m", replicas=2, min_member=3))
        assert any("min_member" in v.field for v in invalid.value.violations)
        # Nothing to discover: no address and no cluster in $GODEL_HOME.
        env = {"GODEL_HOME": str(tmp_path / "empty"), "GODEL_ADDRESS": "", "GODEL_SERVER": ""}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with pytest.raises(ClusterNotFound, match="godel up"):
                GodelClient()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        kept.delete()
    finally:
        client.close()


def test_quickstart_example_runs(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(schedulers=1, hollow_nodes=4)
    wait_until(lambda: len(cluster.client.list("Node")) == 4, what="nodes registered")
    began = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("GODEL_ADDRESS", "GODEL_SERVER")}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "sdk_quickstart.py")],
        capture_output=True,
        text=True,
        timeout=240,
        env={**env, "GODEL_HOME": str(cluster.home.path), "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "job/quickstart-train: Running" in out and "job/quickstart-web: Running" in out
    assert out.count("pod/quickstart-train-") == 4 and " on " in out
    assert "job/quickstart-web deleted" in out
    assert not cluster.client.list("Job"), "the example cleaned up"
    assert time.monotonic() - began < 240


def test_grpcurl_walkthrough_in_the_reference_works(make_cluster: Callable[..., Cluster]) -> None:
    """The reference's grpcurl requests, as grpcurl sends them: the service found through
    reflection, each JSON body parsed against the reflected descriptors and called."""
    from google.protobuf import descriptor_pool, json_format, message_factory
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    cluster = make_cluster(schedulers=1, hollow_nodes=2)
    wait_until(lambda: len(cluster.client.list("Node")) == 2, what="nodes registered")
    text = (ROOT / "godel" / "README.md").read_text()
    calls = re.findall(r"-d '(.*?)' \\?\s*\$A godel\.v1\.Dispatcher/(\w+)", text, re.DOTALL)
    assert [method for _, method in calls] == ["Submit", "Get", "Watch", "Delete"]
    assert 'G="grpcurl -cacert $T/ca.crt -cert $T/admin.crt -key $T/admin.key"' in text
    address = cluster.state.address_of("dispatcher")
    # What those flags present: the cluster CA and the admin identity from $GODEL_HOME/tls.
    admin = tls.load(cluster.home.tls_dir, tls.ADMIN)
    with grpc.secure_channel(address, admin.channel()) as channel:
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        service = pool.FindServiceByName("godel.v1.Dispatcher")
        for body, name in calls:
            method = service.methods_by_name[name]
            request = json_format.Parse(body, message_factory.GetMessageClass(method.input_type)())
            reply_class = message_factory.GetMessageClass(method.output_type)
            path = f"/godel.v1.Dispatcher/{name}"
            if method.server_streaming:
                stream = channel.unary_stream(
                    path,
                    request_serializer=type(request).SerializeToString,
                    response_deserializer=reply_class.FromString,
                )(request, timeout=30)
                first = next(iter(stream))
                assert first.object.pod.spec.job == "hello"
                stream.cancel()
                continue
            reply = channel.unary_unary(
                path,
                request_serializer=type(request).SerializeToString,
                response_deserializer=reply_class.FromString,
            )(request, timeout=30)
            if name == "Submit":
                assert reply.results[0].created, reply
            elif name == "Get":
                assert reply.job.metadata.name == "hello"
            else:
                assert reply.deleted == 2
