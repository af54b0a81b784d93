"""GPU fields of manifests: whole cards in requests, a share (gpuMilli) and the accepted models
(gpuModels) beside them, read and written back by `get -o yaml`; type errors one line naming
the field."""

from __future__ import annotations

import pytest

from godel.manifest import ManifestError, dump_yaml, load, to_manifest
from protos.godel.v1 import objects_pb2 as pb


def job_with(template: str) -> str:
    return (
        "apiVersion: godel/v1\nkind: Job\nmetadata: {name: train}\n"
        f"spec:\n  replicas: 2\n  template: {template}\n"
    )


READ_CASES = [
    # name, template, (requests.gpus, gpu_milli, gpu_models)
    ("whole cards as gpu", "{requests: {gpu: 4}}", (4, 0, [])),
    ("whole cards as nvidia.com/gpu", "{requests: {nvidia.com/gpu: 2}}", (2, 0, [])),
    ("a share of one card", "{requests: {gpu: 1}, gpuMilli: 300}", (1, 300, [])),
    ("snake_case share", "{requests: {gpus: 1}, gpu_milli: 999}", (1, 999, [])),
    ("accepted models", "{requests: {gpu: 8}, gpuModels: [V100M16, V100M32]}",
     (8, 0, ["V100M16", "V100M32"])),
    ("everything", "{requests: {cpu: 4, gpu: 1}, gpuMilli: 500, gpuModels: [T4]}",
     (1, 500, ["T4"])),
]  # fmt: skip


@pytest.mark.parametrize(
    ("template", "expected"), [c[1:] for c in READ_CASES], ids=[c[0] for c in READ_CASES]
)
def test_gpu_fields_read_and_write_back(
    template: str, expected: tuple[int, int, list[str]]
) -> None:
    [m] = load(job_with(template), "job.yaml")
    assert isinstance(m.obj, pb.Job)
    t = m.obj.spec.template
    assert (t.requests.gpus, t.gpu_milli, list(t.gpu_models)) == expected
    assert not t.requests.extended  # nothing of it became an extended resource
    # `godel get job train -o yaml` prints them where they were read, and reads back the same.
    printed = to_manifest("Job", m.obj)
    written = printed["spec"]["template"]
    assert written.get("gpuMilli", 0) == expected[1]
    assert written.get("gpuModels", []) == expected[2]
    assert written.get("requests", {}).get("gpus", 0) == expected[0]
    [again] = load(dump_yaml([printed]), "printed.yaml")
    assert again.obj == m.obj


def test_a_node_declares_its_gpu_model_and_cards() -> None:
    text = (
        "apiVersion: godel/v1\nkind: Node\nmetadata: {name: n1}\n"
        "status: {allocatable: {cpu: 64, memory: 256Gi, gpu: 8}, gpuModel: V100M32}\n"
    )
    [m] = load(text, "node.yaml")
    assert isinstance(m.obj, pb.Node)
    assert (m.obj.status.allocatable.gpus, m.obj.status.gpu_model) == (8, "V100M32")
    printed = to_manifest("Node", m.obj)
    assert printed["status"]["gpuModel"] == "V100M32"
    assert load(dump_yaml([printed]), "again.yaml")[0].obj == m.obj


ERROR_CASES = [
    ("gpuMilli not an integer", "{requests: {gpu: 1}, gpuMilli: 300m}",
     "spec.template.gpuMilli: expected an integer, got '300m'"),
    ("gpuMilli a fraction", "{requests: {gpu: 1}, gpuMilli: 0.5}",
     "spec.template.gpuMilli: expected an integer, got 0.5"),
    ("gpuMilli a boolean", "{requests: {gpu: 1}, gpuMilli: true}",
     "spec.template.gpuMilli: expected an integer, got True"),
    ("gpuMilli among the quantities", "{requests: {gpu: 1, gpuMilli: 300}}",
     "spec.template.requests.gpuMilli: not a quantity: a share of one card is gpu: 1 in "
     "requests and gpuMilli: 1..999 beside requests (template.gpuMilli)"),
    ("gpu-milli among the quantities", "{requests: {gpu-milli: 300}}",
     "spec.template.requests.gpu-milli: not a quantity"),
    ("half a card", "{requests: {gpu: 0.5}}",
     "spec.template.requests.gpu: 0.5 is not a count of whole cards; a share of one card is "
     "gpu: 1 in requests and gpuMilli: 1..999 beside requests"),
    ("milli cards", "{requests: {nvidia.com/gpu: 500m}}",
     "spec.template.requests.nvidia.com/gpu: '500m' is not a count of whole cards"),
    ("gpuModels a string", "{gpuModels: V100M32}",
     "spec.template.gpuModels: expected a list, got str"),
    ("gpuModels a mapping", "{gpuModels: {V100M32: 1}}",
     "spec.template.gpuModels: expected a list, got dict"),
    ("a model a number", "{gpuModels: [V100M32, 3090]}",
     "spec.template.gpuModels[1]: expected a GPU model name as a string (e.g. V100M32), got 3090"),
    ("a model a boolean", "{gpuModels: [true]}",
     "spec.template.gpuModels[0]: expected a GPU model name as a string (e.g. V100M32), got True"),
    ("a model a list", "{gpuModels: [[T4]]}",
     "spec.template.gpuModels[0]: expected a GPU model name as a string"),
    ("a model missing", "{gpuModels: [null]}",
     "spec.template.gpuModels[0]: expected a GPU model name as a string (e.g. V100M32), got None"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("template", "error"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES]
)
def test_gpu_field_errors_are_one_line_naming_the_field(template: str, error: str) -> None:
    with pytest.raises(ManifestError) as err:
        load(job_with(template), "job.yaml")
    message = str(err.value)
    assert message == f"job.yaml[0] {error}" or message.startswith(f"job.yaml[0] {error}")
    assert "\n" not in message


def test_the_sdk_job_helper_asks_a_share_of_a_model() -> None:
    from godel.client import job

    shared = job("infer", gpus=1, gpu_milli=250, gpu_models=["T4", "A10"])
    template = shared.manifest["spec"]["template"]
    assert (template["requests"]["gpus"], template["gpuMilli"], template["gpuModels"]) == (
        1,
        250,
        ["T4", "A10"],
    )
    assert "gpuMilli" not in job("plain").manifest["spec"]["template"]
