"""Movement objects: one per evicted batch, built from the plan; read back for the failure ratio;
changed with compare-and-set (shards and the Binder write their parts of the status too); and
recycled.

A Movement tells every shard, before anything is evicted, where the replacements of each job
should go: per job (owner), the recommended nodes with a desired count. Shards acknowledge it in
``status.notified_schedulers``; the Binder records which replacements landed on a recommended
node (``actual_pods``) and which did not (``mismatched_tasks``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

import structlog

from protos.godel.v1 import objects_pb2 as pb
from services.movements import ACKNOWLEDGING, FINISHED
from services.rescheduler.framework import ClusterView, Move
from store import Store
from store.errors import NotFoundError, StoreError

log = structlog.get_logger(__name__)

POLICY_LABEL = "godel.io/policy"


def movement_name(policy: str, generation: int, batch: int, part: int = 0) -> str:
    """``<policy>-<round>-<batch>``, and ``-<part>`` for the later parts of a large batch."""
    return f"{policy}-{generation}-{batch}" + (f"-{part}" if part else "")


def build_movement(
    *,
    policy: str,
    creator: str,
    generation: int,
    batch: int,
    moves: Sequence[Move],
    view: ClusterView,
    deadline_ms: int,
    part: int = 0,
) -> pb.Movement:
    """The Movement of one batch: its pods (with uids, so a re-created pod is never taken for
    the planned one) and, per job, the recommended nodes with how many replacements each."""
    movement = pb.Movement(
        metadata=pb.ObjectMeta(name=movement_name(policy, generation, batch, part))
    )
    movement.metadata.labels[POLICY_LABEL] = policy
    spec = movement.spec
    spec.creator, spec.generation, spec.batch, spec.policy = creator, generation, batch, policy
    spec.deadline_ms = deadline_ms
    targets: dict[str, Counter[str]] = defaultdict(Counter)
    for move in moves:
        running = view.pods[move.pod]
        spec.deleted_tasks.add(pod=move.pod, uid=running.pod.metadata.uid, node=move.source)
        targets[move.job][move.target] += 1
    for job in sorted(targets):
        owner = movement.status.owners.add(job=job)
        for node, count in sorted(targets[job].items()):
            owner.recommended_nodes.add(node=node, desired_pod_count=count)
    movement.status.phase = ACKNOWLEDGING
    return movement


def failure_ratio(movements: Sequence[pb.Movement]) -> float:
    """Replacements that did not use their recommendation (bound elsewhere, or beyond a node's
    desired count) over all the recommendations made: the original's measure of a round going
    wrong. 0 before any recommendation."""
    desired = failed = 0
    for movement in movements:
        for owner in movement.status.owners:
            failed += len(owner.mismatched_tasks)
            for rec in owner.recommended_nodes:
                desired += rec.desired_pod_count
                failed += max(0, len(rec.actual_pods) - rec.desired_pod_count)
    return failed / desired if desired else 0.0


class Recycler:
    """Deletes Movements nobody needs: a policy's previous round's when it starts a new one,
    every stale one when the rescheduler starts (a crashed rescheduler's round is over), and
    finished ones once ``retention_seconds`` have passed."""

    def __init__(self, store: Store, retention_seconds: float) -> None:
        self.store = store
        self.retention_ms = int(retention_seconds * 1000)

    async def delete_where(self, doomed: Callable[[pb.Movement], bool]) -> list[str]:
        movements, _ = await self.store.list_all(pb.Movement)
        deleted = []
        for movement in movements:
            if doomed(movement):
                try:
                    await self.store.delete(pb.Movement, movement.metadata.name)
                except NotFoundError:
                    continue
                deleted.append(movement.metadata.name)
        if deleted:
            log.info("movements recycled", movements=deleted)
        return deleted

    async def previous_of(self, policy: str) -> list[str]:
        return await self.delete_where(lambda m: m.spec.policy == policy)

    async def all_stale(self) -> list[str]:
        return await self.delete_where(lambda m: True)

    async def expired(self, now_ms: int | None = None) -> list[str]:
        now = int(time.time() * 1000) if now_ms is None else now_ms

        def done_long_ago(m: pb.Movement) -> bool:
            ended = m.status.finished_ms if m.status.phase in FINISHED else m.spec.deadline_ms
            return ended > 0 and now - ended >= self.retention_ms

        return await self.delete_where(done_long_ago)

    async def run(self, interval_seconds: float) -> None:
        while True:
            await asyncio.sleep(interval_seconds)
            try:
                await self.expired()
            except StoreError as exc:
                log.warning("recycling movements failed", error=str(exc))
