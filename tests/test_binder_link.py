"""The shard's link to the Binder: a big unit's verdicts applied in slices, the loop served
between, the unit settled once, after all of them."""

from __future__ import annotations

import asyncio
import time

import grpc

from protos.godel.v1 import internal_pb2 as ipb
from services.scheduler.binder_link import BinderLink
from store import Store

PODS = 3000


class Handler:
    """Records each verdict with how many turns another task had had by then; each takes
    0.1 ms of CPU (the shard's bookkeeping per pod), 0.3 s for the whole unit."""

    def __init__(self, turns: list[int]) -> None:
        self.turns = turns
        self.bound_pods: list[tuple[int, str]] = []
        self.settled_units: list[tuple[int, str]] = []

    def bound(self, unit: str, pod: str) -> None:
        end = time.thread_time() + 0.0001
        while time.thread_time() < end:
            pass
        self.bound_pods.append((self.turns[0], pod))

    def rejected(
        self, unit: str, pod: str, why: str, conflict: bool, resource_version: int
    ) -> None:
        raise AssertionError(f"{pod} rejected: {why}")

    def settled(self, unit: str) -> None:
        self.settled_units.append((self.turns[0], unit))


async def test_a_big_units_verdicts_are_applied_in_slices_and_the_unit_settled_after_all(
    store: Store,
) -> None:
    turns = [0]
    handler = Handler(turns)
    link: BinderLink[str] = BinderLink(store, grpc.aio.insecure_channel, handler, 30.0)
    batch = ipb.DecisionBatch(shard="s")
    decision = batch.units.add(job="big", min_member=1)
    for i in range(PODS):
        decision.placements.add(pod=f"big-{i}", node="n")
    link.send(batch, ["big"])
    verdicts = ipb.VerdictBatch(
        batch_id=batch.batch_id,
        verdicts=[ipb.PodVerdict(pod=f"big-{i}", job="big", code=ipb.BOUND) for i in range(PODS)],
    )

    async def another_task() -> None:
        while True:
            turns[0] += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(another_task())
    await asyncio.sleep(0)
    try:
        assert await link.receive_in_slices(verdicts) is False
    finally:
        ticker.cancel()
    assert [pod for _, pod in handler.bound_pods] == [f"big-{i}" for i in range(PODS)]
    # Another task ran while the verdicts were applied (0.3 s of them: slices of 20 ms).
    assert handler.bound_pods[-1][0] > handler.bound_pods[0][0]
    # Settled once, after every verdict.
    assert [unit for _, unit in handler.settled_units] == ["big"]
    assert handler.settled_units[0][0] >= handler.bound_pods[-1][0]
    # Answered: a duplicate of the verdicts changes nothing.
    assert await link.receive_in_slices(verdicts) is False
    assert len(handler.bound_pods) == PODS
