"""The SDK's objects without a cluster: the job() helper and Job.from_manifest produce what the
manifest converter does, mistakes are Invalid with their field, read-back objects expose phases,
and discovery follows GODEL_ADDRESS / GODEL_SERVER / GODEL_HOME."""

from __future__ import annotations

from pathlib import Path

import pytest

from godel.client import AsyncGodelClient, ClusterNotFound, Invalid, Job, discover, job
from godel.client.objects import Pod, from_proto
from godel.manifest import load
from protos.godel.v1 import objects_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent


def test_job_helper_matches_the_manifest_converter() -> None:
    built = job(
        "train", replicas=8, min_member=8, cpu="2", memory="4Gi", queue="research",
        labels={"team": "ml"}, command=["sh", "-c", "true"], node_selector={"zone": "a"},
    )  # fmt: skip
    (doc,) = load(
        "apiVersion: godel/v1\nkind: Job\nmetadata: {name: train, labels: {team: ml}}\n"
        "spec:\n  replicas: 8\n  minMember: 8\n  queue: research\n  template:\n"
        "    requests: {cpu: '2', memory: 4Gi}\n    nodeSelector: {zone: a}\n"
        "    command: [sh, -c, 'true']\n"
    )
    assert built.to_proto() == doc.obj
    assert built.to_proto().spec.template.requests.milli_cpu == 2000
    assert job("svc", replicas=3, min_member=1).to_proto().spec.min_member == 1
    assert Job.from_manifest(built.manifest).to_proto() == doc.obj  # a round trip


@pytest.mark.parametrize(
    ("manifest", "field"),
    [
        ({"apiVersion": "godel/v1", "kind": "Job", "metadata": {}}, "metadata.name"),
        ("apiVersion: godel/v1\nkind: Job\nmetadata: {name: a}\nspec: {colour: red}\n", "colour"),
        ("apiVersion: godel/v1\nkind: Queue\nmetadata: {name: q}\n", ""),
    ],
)
def test_bad_manifests_are_invalid_with_their_field(manifest: object, field: str) -> None:
    with pytest.raises(Invalid) as caught:
        Job.from_manifest(manifest)  # type: ignore[arg-type]
    assert field in caught.value.violations[0].field + str(caught.value)
    with pytest.raises(Invalid, match=r"requests\.cpu"):
        job("x", cpu="lots")


def test_read_back_objects_are_manifest_shaped() -> None:
    pod = pb.Pod(metadata=pb.ObjectMeta(name="a-0", resource_version=7))
    pod.spec.job, pod.spec.node_name, pod.status.phase = "a", "n1", pb.POD_RUNNING
    got = from_proto("Pod", pod)
    assert isinstance(got, Pod) and (got.phase, got.node, got.job) == ("Running", "n1", "a")
    assert got.manifest["apiVersion"] == "godel/v1" and got.kind == "Pod"
    assert got.resource_version == 7 and str(got) == "Pod/a-0"
    assert len({got, from_proto("Pod", pod)}) == 1  # usable in sets, e.g. of seen events
    stored = pb.Job(metadata=pb.ObjectMeta(name="a"))
    stored.status.phase = pb.JOB_SUCCEEDED
    assert from_proto("Job", stored).phase == "Succeeded"  # type: ignore[attr-defined]
    assert from_proto("Queue", pb.Queue(metadata=pb.ObjectMeta(name="q"))).kind == "Queue"


def test_discovery_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GODEL_HOME", str(tmp_path))
    monkeypatch.delenv("GODEL_ADDRESS", raising=False)
    monkeypatch.delenv("GODEL_SERVER", raising=False)
    with pytest.raises(ClusterNotFound, match="godel up"):
        discover()
    monkeypatch.setenv("GODEL_SERVER", "server:1")
    assert discover() == "server:1"
    monkeypatch.setenv("GODEL_ADDRESS", "address:2")
    assert discover() == "address:2"
    assert discover("given:3") == "given:3"


async def test_apply_manifest_refuses_a_bad_manifest_before_any_call() -> None:
    async with AsyncGodelClient(
        "127.0.0.1:9", insecure=True
    ) as client:  # nothing listens: no call is made
        with pytest.raises(Invalid, match="not valid YAML"):
            await client.apply_manifest("kind: [")
        with pytest.raises(Invalid) as caught:
            await client.apply_manifest({"apiVersion": "godel/v1", "kind": "Widget"})
        assert caught.value.violations[0].field == "kind"
        # The bytes of a file, as read: not UTF-8 text is one line naming the first bad byte.
        with pytest.raises(Invalid) as caught:
            await client.apply_manifest((ROOT / "examples" / "queue.yaml").read_bytes() + b"\xff")
        assert str(caught.value).startswith("<manifest>: not UTF-8 text (byte 0xff at offset ")
        assert "\n" not in str(caught.value)
        with pytest.raises(Invalid) as caught:
            await client.apply_manifest(_LABELLED)
        assert caught.value.violations[0].field == "metadata.labels['has spaces!']"


_LABELLED = "apiVersion: godel/v1\nkind: Job\nmetadata: {name: a, labels: {'has spaces!': x}}\n"


def test_a_job_from_bytes_reads_utf8_and_refuses_the_rest_on_one_line() -> None:
    text = "apiVersion: godel/v1\nkind: Job\nmetadata: {name: a, annotations: {note: café}}\n"
    assert Job.from_manifest(text.encode()).manifest["metadata"]["annotations"] == {"note": "café"}
    with pytest.raises(Invalid) as caught:
        Job.from_manifest(text.encode("latin-1"))
    assert str(caught.value) == "<manifest>: not UTF-8 text (byte 0xe9 at offset 74, line 3)"
    with pytest.raises(Invalid) as caught:
        Job.from_manifest(_LABELLED)
    assert str(caught.value).startswith(
        "<manifest>[0] metadata.labels['has spaces!']: 'has spaces!' is not a valid label key"
    )


async def test_a_malformed_selector_is_invalid_before_any_call() -> None:
    # Nothing listens (no call is made); plaintext, so no credentials are looked for either.
    async with AsyncGodelClient("127.0.0.1:9", insecure=True) as client:
        with pytest.raises(Invalid, match="invalid label selector 'app in web'"):
            await client.list("Pod", labels="app in web")
        with pytest.raises(Invalid) as caught:
            async for _ in client.watch("Pod", selector="!"):
                pass
        assert caught.value.violations[0].field == "selector"
