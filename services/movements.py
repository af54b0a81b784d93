"""Movement objects as every service reads and writes them (the rescheduler creates them; shards
acknowledge and follow them; the Binder records where replacements landed): phases, liveness,
compare-and-set changes, and the bookkeeping of recommendations.

A Movement is written by several services at once, each its own part of the status, so every
change is a read-modify-compare-and-set, tried again on a conflict.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from protos.godel.v1 import objects_pb2 as pb
from store import Store
from store.errors import ConflictError, NotFoundError, StoreError

ACKNOWLEDGING = "Acknowledging"
EVICTING = "Evicting"
LANDING = "Landing"
DONE = "Done"
STOPPED = "Stopped"
FINISHED = frozenset({DONE, STOPPED})


def live(movement: pb.Movement, now_ms: int) -> bool:
    """Shards follow a Movement until it is finished or past its deadline."""
    return movement.status.phase not in FINISHED and now_ms < movement.spec.deadline_ms


async def change(
    store: Store, name: str, mutate: Callable[[pb.Movement], bool | None], *, attempts: int = 10
) -> pb.Movement | None:
    """Read, mutate and compare-and-set a Movement, again on a conflict. ``mutate`` returning
    False means "nothing to write". None when the Movement is gone."""
    for _ in range(attempts):
        try:
            movement = await store.get(pb.Movement, name)
        except NotFoundError:
            return None
        if mutate(movement) is False:
            return movement
        try:
            return await store.update(movement)
        except ConflictError:
            continue
        except NotFoundError:
            return None
    raise StoreError(f"movement {name}: gave up after {attempts} conflicting writes")


def finish(phase: str, message: str = "") -> Callable[[pb.Movement], None]:
    def mutate(movement: pb.Movement) -> None:
        movement.status.phase = phase
        movement.status.message = message
        movement.status.finished_ms = int(time.time() * 1000)

    return mutate


def set_phase(phase: str) -> Callable[[pb.Movement], None]:
    def mutate(movement: pb.Movement) -> None:
        movement.status.phase = phase

    return mutate


def acknowledge(shard: str) -> Callable[[pb.Movement], bool]:
    def mutate(movement: pb.Movement) -> bool:
        if shard in movement.status.notified_schedulers:
            return False
        movement.status.notified_schedulers.append(shard)
        return True

    return mutate


def record_landing(pods: list[pb.Pod]) -> Callable[[pb.Movement], bool]:
    """The Binder's part: each bound replacement counts as ``actual`` on its recommended node
    while that node's desired count is not reached, else as ``mismatched`` (up to the total
    desired, as in the original). A pod already recorded is not recorded again."""

    def mutate(movement: pb.Movement) -> bool:
        owners = {o.job: o for o in movement.status.owners}
        changed = False
        for pod in pods:
            owner = owners.get(pod.spec.job)
            if owner is None:
                continue
            name = pod.metadata.name
            recorded = {t.pod for t in owner.mismatched_tasks} | {
                t.pod for rec in owner.recommended_nodes for t in rec.actual_pods
            }
            if name in recorded:
                continue
            ref = pb.TaskRef(pod=name, uid=pod.metadata.uid, node=pod.spec.node_name)
            rec = next(
                (
                    r
                    for r in owner.recommended_nodes
                    if r.node == pod.spec.node_name and len(r.actual_pods) < r.desired_pod_count
                ),
                None,
            )
            desired = sum(r.desired_pod_count for r in owner.recommended_nodes)
            if rec is not None:
                rec.actual_pods.append(ref)
            elif len(owner.mismatched_tasks) < desired:
                owner.mismatched_tasks.append(ref)
            else:
                continue
            changed = True
        return changed

    return mutate
