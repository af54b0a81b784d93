"""How the CLI renders a pending pod's explanation from the shard's counts (a table of
diagnoses and the sentence each reads as); without counts it shows the server's summary."""

from __future__ import annotations

import pytest

from godel.cli.resources import _columns, _row, render_explanation
from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb


def _diagnosis(total: int, *reasons: tuple[str, int], **extra: object) -> pb.SchedulingDiagnosis:
    return pb.SchedulingDiagnosis(
        total_nodes=total,
        reasons=[pb.ReasonCount(reason=r, nodes=n) for r, n in reasons],
        **extra,  # type: ignore[arg-type]
    )


CASES = [
    (
        "counts",
        _diagnosis(5, ("insufficient cpu", 4), ("untolerated taint", 1)),
        "0/5 nodes fit: 4 insufficient cpu, 1 untolerated taint",
    ),
    (
        "a gang short of min_member",
        _diagnosis(200, ("insufficient cpu", 200), gang_needed=500, gang_placed=195),
        "0/200 nodes fit: 200 insufficient cpu; min_member needs 500 pod(s) placed, 195 fit",
    ),
    (
        "a gang, preemption tried",
        _diagnosis(4, ("insufficient cpu", 4), gang_needed=5, gang_placed=4, note="no victims"),
        "0/4 nodes fit: 4 insufficient cpu; no victims; min_member needs 5 pod(s) placed, 4 fit",
    ),
    (
        "preemption tried",
        _diagnosis(3, ("insufficient cpu", 3), note="no lower-priority victims"),
        "0/3 nodes fit: 3 insufficient cpu; no lower-priority victims",
    ),
    ("no nodes", _diagnosis(0), "0/0 nodes fit"),
    (
        "preemption cannot help: nodes per reason",
        _diagnosis(
            8,
            ("insufficient cpu", 8),
            preemption_reasons=[
                pb.ReasonCount(reason="not preemptible", nodes=5),
                pb.ReasonCount(reason="priority", nodes=2),
                pb.ReasonCount(reason="budget web-pdb", nodes=1),
            ],
            priority=100,
        ),
        "0/8 nodes fit: 8 insufficient cpu; preemption cannot help: on 5 nodes the pods that "
        "would have to go are not preemptible (mark their job `preemptible: true` or set their "
        "queue's `preemptibleDefault`); on 2 nodes they have equal or higher priority (100 or "
        "more); on 1 node budget web-pdb allows no more evictions",
    ),
    (
        "a gang whose preemption cannot help",
        _diagnosis(
            2,
            ("insufficient cpu", 2),
            preemption_reasons=[pb.ReasonCount(reason="claimed", nodes=2)],
            gang_needed=3,
            gang_placed=0,
        ),
        "0/2 nodes fit: 2 insufficient cpu; preemption cannot help: on 2 nodes they are already "
        "being evicted for other pods; min_member needs 3 pod(s) placed, 0 fit",
    ),
    (
        "preemptionPolicy Never",
        _diagnosis(1, ("insufficient cpu", 1), preemption_never=True),
        "0/1 nodes fit: 1 insufficient cpu; preemption cannot help: this pod's "
        "`preemptionPolicy` is Never (it evicts no other pod and waits for room)",
    ),
]


@pytest.mark.parametrize(("name", "diagnosis", "text"), CASES, ids=[c[0] for c in CASES])
def test_rendered_from_counts(name: str, diagnosis: pb.SchedulingDiagnosis, text: str) -> None:
    response = api_pb2.ExplainResponse(pod="p", summary="ignored", diagnosis=diagnosis)
    assert render_explanation(response) == text


def test_without_counts_the_summary_is_shown() -> None:
    response = api_pb2.ExplainResponse(pod="p", summary="bound to n1", node="n1")
    assert render_explanation(response) == "bound to n1"


@pytest.mark.parametrize(
    ("pods_created", "phase"),
    [
        (4000, "Pending (4000/100000 pods created)"),  # a big job's pods being created
        (0, "Pending"),  # all of them stored
    ],
)
def test_a_job_whose_pods_are_being_created_shows_how_many_are(
    pods_created: int, phase: str
) -> None:
    job = pb.Job(metadata=pb.ObjectMeta(name="big"))
    job.spec.replicas = 100_000
    job.status.phase = pb.JOB_PENDING
    job.status.pods_created = pods_created
    columns = _columns("Job", "")
    row = _row("Job", job, columns, False)
    assert row[[header for header, _, _ in columns].index("PHASE")] == phase
