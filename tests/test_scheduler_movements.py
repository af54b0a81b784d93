"""The shard's side of the Movement handshake (services/scheduler/movements.py): which
recommendations a job's replacements still get while proposals are out."""

from __future__ import annotations

import time

from protos.godel.v1 import objects_pb2 as pb
from services.scheduler.movements import MovementTracker
from store import Store


def movement(name: str, job: str, node: str, count: int = 1) -> pb.Movement:
    now_ms = int(time.time() * 1000)
    out = pb.Movement(metadata=pb.ObjectMeta(name=name, creation_timestamp_ms=now_ms))
    out.spec.deadline_ms = now_ms + 600_000
    out.status.phase = "Acknowledging"
    out.status.owners.add(job=job).recommended_nodes.add(node=node, desired_pod_count=count)
    return out


async def test_a_proposal_holds_its_recommendation_but_not_against_its_own_pod(
    store: Store,
) -> None:
    tracker = MovementTracker(store, "scheduler-0", holds=lambda pod, node: False)
    tracker.on_add("Movement", movement("m", "web", "n1"))
    assert tracker.preferences("web") == [("n1", "m")]

    tracker.proposed("web-0-r1", "m", "web", "n1")
    # While the proposal is out, another replacement of the job does not get the same slot.
    assert tracker.preferences("web") == []
    assert tracker.preferences("web", placing=["web-1-r1"]) == []
    # The Binder refused the proposal (a conflict) and the same pod is placed again: its own
    # earlier proposal must not keep it from its recommended node.
    assert tracker.preferences("web", placing=["web-0-r1"]) == [("n1", "m")]
