"""The dispatcher's record of preemptors in flight: a unit's latest decision replaces its
nominations, an empty one or the unit's end clears them."""

from __future__ import annotations

import pytest

from protos.godel.v1 import internal_pb2 as ipb
from services.dispatcher.dispatching.nominations import Nominations


def noms(job: str, *pods: tuple[str, str, list[str]]) -> ipb.Nominations:
    return ipb.Nominations(
        job=job, pods=[ipb.Nomination(pod=p, node=n, victims=v) for p, n, v in pods]
    )


@pytest.mark.parametrize(
    ("messages", "cleared", "expected"),
    [
        ([noms("a", ("a-0", "n1", ["v1"]))], [], {"a-0": ("n1", ["v1"])}),
        # A later decision of the unit replaces the earlier one, pod by pod.
        (
            [
                noms("a", ("a-0", "n1", ["v1"]), ("a-1", "n2", ["v2"])),
                noms("a", ("a-1", "n3", ["v3"])),
            ],
            [],
            {"a-1": ("n3", ["v3"])},
        ),
        # A decision without preemption clears the unit's nominations.
        ([noms("a", ("a-0", "n1", ["v1"])), noms("a")], [], {}),
        # The unit's outcome (or its shard's loss, or its revocation) clears them.
        (
            [noms("a", ("a-0", "n1", ["v1"])), noms("b", ("b-0", "n2", ["v2"]))],
            ["a"],
            {"b-0": ("n2", ["v2"])},
        ),
    ],
)
def test_nominations(
    messages: list[ipb.Nominations], cleared: list[str], expected: dict[str, tuple[str, list[str]]]
) -> None:
    board = Nominations()
    for m in messages:
        board.record(m)
    for job in cleared:
        board.clear(job)
    found = {}
    for job in ("a", "b"):
        for pod in (f"{job}-0", f"{job}-1"):
            n = board.of(job, pod)
            if n is not None:
                found[pod] = (n.node, list(n.victims))
    assert found == expected
    assert len(board) == len(expected)
    assert board.of("b", "a-0") is None  # looked up by the pod's own job
