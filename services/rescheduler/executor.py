"""Executing a plan batch by batch: Movement, acknowledgement by every live shard, eviction
through the Binder, replacements landing.

Per batch, in order:

1. stop if paused, or if the round's Movements so far show too many replacements landing off
   their recommendation (``failure_ratio_threshold``);
2. wait (bounded) until the batch fits the disruption budgets as they stand now — the previous
   batch's replacements must be healthy again before more pods of the same job go;
3. reserve each move's room on its target for the pod's replacement (``reserving.py``: one
   commit of the batch's reservations, then a bounded wait until the Binder has committed them
   ``Reserved``); a move whose room could not be reserved is dropped before anything is
   evicted (with what counted on it: a gang's other moves, a cycle's), counted in the plan;
4. create the batch's Movement and wait until every live shard has acknowledged it (a shard
   whose heartbeat lapses is dropped from the set, so a dead shard cannot block the round);
5. ask the Binder to evict the batch (``Binder.Evict``: one eviction path, all or nothing,
   budgets re-checked, each pod replaced in the same commit);
6. wait (bounded) until the replacements run (each consumes its reservation as it binds on it),
   then mark the Movement done and release the reservations of replacements no longer pending
   (one that landed elsewhere, a cycle's never needed).

A round stopped at any step marks its current Movement ``Stopped`` with the reason and releases
its batch's reservations. Nothing is evicted without a replacement (the Binder's commit carries
both), so a rescheduler killed at any point leaves at most a Movement, which shards ignore past
its deadline and the next start deletes, and a batch's reservations, which the dispatcher's
reservation controller releases once their TTL runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from foundation.retry import Backoff, Retry
from placement.budgets import BudgetTracker
from placement.reservations import holds_room
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services import movements as shared
from services.events import (
    MOVEMENT_DONE,
    MOVEMENT_PLANNED,
    MOVEMENT_STOPPED,
    NORMAL,
    WARNING,
    EventRecorder,
    ref,
)
from services.eviction import RESCHEDULED
from services.peers.binder import BinderEvictor, EvictError
from services.rescheduler import movements as mv
from services.rescheduler import reserving
from services.rescheduler.framework import ClusterView, Move
from services.rescheduler.round import Policy, RoundPlan
from store import Store
from store.errors import CommitError, NotFoundError, StoreError
from store.ops import Create, Delete
from store.pulse import last_beat_ms

log = structlog.get_logger(__name__)

# Waiting on budgets, acknowledgements and replacements: a constant poll within a deadline.
_POLL = Backoff(0.2)


@dataclass(frozen=True)
class ExecutionConfig:
    ack_timeout_seconds: float = 30.0
    budget_wait_seconds: float = 60.0
    landing_timeout_seconds: float = 60.0
    # How long a Movement stays live (shards prefer its nodes) after it is created.
    movement_ttl_seconds: float = 600.0
    # A shard is live while its heartbeat is younger than this.
    shard_grace_seconds: float = 10.0
    # Moves per Movement: a large batch (tens of thousands of moves when no budget splits it)
    # goes as several Movements, each within the store's object size limit and evicted in one
    # Binder.Evict request within the Binder's batch limit. Parts of a budget-safe batch are
    # budget-safe; a cycle cut at a part's edge waits for its room (bounded) like a swap.
    moves_per_movement: int = 1000
    # How long a batch waits for the Binder to commit its reservations Reserved.
    reserve_timeout_seconds: float = 10.0
    # The batch's reservations' TTL; 0: derived, a little above everything the batch may wait
    # for (reserving, acknowledgements, landing).
    reservation_ttl_seconds: int = 0


class StopRound(Exception):
    """The round evicts no further batch; the message says why."""


class RoundExecutor:
    def __init__(
        self,
        store: Store,
        evictor: BinderEvictor,
        paused: Callable[[], bool],
        config: ExecutionConfig | None = None,
        *,
        events: EventRecorder | None = None,
    ) -> None:
        self.store = store
        self.evictor = evictor
        self.paused = paused
        self.config = config or ExecutionConfig()
        self.events = events

    async def execute(self, policy: Policy, plan: RoundPlan, view: ClusterView) -> None:
        """Evict ``plan`` batch by batch; records the Movements and the evictions on the plan."""
        created: list[str] = []
        size = self.config.moves_per_movement
        for index, batch in enumerate(plan.batches):
            parts = [batch[i : i + size] for i in range(0, len(batch), size)]
            for part, moves in enumerate(parts):
                try:
                    await self._batch(policy, plan, view, index, part, moves, created)
                except (StopRound, StoreError) as exc:
                    where = f"batch {index + 1} of {len(plan.batches)}"
                    if len(parts) > 1:
                        where += f" (part {part + 1} of {len(parts)})"
                    plan.message += f"; stopped at {where}: {exc}"
                    log.warning("round stopped", policy=policy.name, batch=index, reason=str(exc))
                    return
        plan.message += (
            f"; {plan.evicted} pod(s) evicted in {len(plan.batches)} batch(es), "
            f"{len(created)} movement(s)"
        )

    async def _batch(
        self,
        policy: Policy,
        plan: RoundPlan,
        view: ClusterView,
        index: int,
        part: int,
        batch: Sequence[Move],
        created: list[str],
    ) -> None:
        if self.paused():
            raise StopRound("the rescheduler is paused")
        if created:
            ratio = mv.failure_ratio(await self._movements(created))
            if ratio > policy.failure_ratio_threshold:
                raise StopRound(
                    f"failure ratio {ratio:.2f} > {policy.failure_ratio_threshold:g}: too many "
                    "replacements landed off their recommended nodes"
                )
        await self._wait_for_budgets(batch, view)
        batch, reservations = await self._reserve(policy, plan, view, index, part, batch)
        try:
            replacements = await self._movement(policy, plan, view, index, part, batch, created)
        except (StopRound, StoreError):
            await self._release(list(reservations.values()))
            raise
        await self._release(await self._unneeded(reservations, replacements))

    async def _movement(
        self,
        policy: Policy,
        plan: RoundPlan,
        view: ClusterView,
        index: int,
        part: int,
        batch: Sequence[Move],
        created: list[str],
    ) -> list[str]:
        """The batch's Movement, acknowledgements, eviction and landing. Returns the
        replacements' names."""
        if not batch:
            return []
        now_ms = int(time.time() * 1000)
        movement = mv.build_movement(
            policy=policy.name,
            creator=policy.algorithm.NAME,
            generation=plan.generation,
            batch=index,
            part=part,
            moves=batch,
            view=view,
            deadline_ms=now_ms + int(self.config.movement_ttl_seconds * 1000),
        )
        name = movement.metadata.name
        await self.store.create(movement)
        created.append(name)
        plan.movements.append(name)
        self._event(
            movement,
            MOVEMENT_PLANNED,
            f"batch {index + 1} of {len(plan.batches)} of round {plan.generation} of policy "
            f"{policy.name}: {len(batch)} pod(s) to move from "
            f"{', '.join(sorted({m.source for m in batch}))}",
        )
        try:
            await self._wait_for_acks(name)
            await shared.change(self.store, name, shared.set_phase(shared.EVICTING))
            replacements = await self._evict(batch, view, name, policy)
            plan.evicted += len(replacements)
            await shared.change(self.store, name, shared.set_phase(shared.LANDING))
            await self._wait_for_landing(replacements)
        except StopRound as exc:
            await shared.change(self.store, name, shared.finish(shared.STOPPED, str(exc)))
            self._event(movement, MOVEMENT_STOPPED, str(exc), type_=WARNING)
            raise
        await shared.change(self.store, name, shared.finish(shared.DONE))
        self._event(movement, MOVEMENT_DONE, f"{len(replacements)} replacement(s) placed")
        return replacements

    async def _reserve(
        self,
        policy: Policy,
        plan: RoundPlan,
        view: ClusterView,
        index: int,
        part: int,
        batch: Sequence[Move],
    ) -> tuple[list[Move], dict[str, str]]:
        """Reserve each move's room on its target (one commit), wait (bounded) for the Binder
        to commit them, and drop the moves ``reserving.kept_moves`` does not keep (their
        reservations released, each in ``plan.rejected`` and counted in ``plan.unreserved``).
        Returns the moves kept and their reservations (pod -> reservation)."""
        cfg = self.config
        ttl = cfg.reservation_ttl_seconds or reserving.ttl_seconds(
            cfg.reserve_timeout_seconds, cfg.ack_timeout_seconds, cfg.landing_timeout_seconds
        )
        labels = {mv.POLICY_LABEL: policy.name}
        names: dict[str, str] = {}  # pod -> its replacement's reservation
        wanted: list[pb.Reservation] = []
        for number, move in enumerate(batch):
            running = view.pods.get(move.pod)
            if running is None:
                continue  # not in the view: nothing to evict, nothing to reserve
            name = reserving.reservation_name(plan.generation, index, part, number)
            names[move.pod] = name
            wanted.append(reserving.build_reservation(move, running.pod, name, ttl, labels))
        if wanted:
            await self.store.commit([Create(r) for r in wanted])
        pod_of = {name: pod for pod, name in names.items()}
        reserved: set[str] = set()
        waiting: dict[str, str] = {}  # pod -> why the Binder has not reserved its room
        retry = Retry(_POLL, deadline_seconds=cfg.reserve_timeout_seconds)
        while True:
            found = [
                r for r in await self.store.get_many(pb.Reservation, list(names.values())) if r
            ]
            reserved = {pod_of[r.metadata.name] for r in found if holds_room(r)}
            waiting = {
                pod_of[r.metadata.name]: r.status.message for r in found if not holds_room(r)
            }
            # Every one judged by the Binder: reserved, or waiting with why (no room now).
            if retry.expired or all(waiting.values()):
                break
            await retry.sleep()
        kept, dropped = reserving.kept_moves(view, batch, reserved)
        if dropped:
            await self._release([names[m.pod] for m in dropped if m.pod in names])
            sources = {m.source for m in batch}
            for move in dropped:
                if move.pod in reserved or move.target in sources:
                    why = (
                        "dropped with a move it went with (its gang's, or the one freeing its room)"
                    )
                else:
                    detail = waiting.get(move.pod) or "not reserved"
                    why = f"its room on {move.target} could not be reserved: {detail}"
                plan.rejected.append((move, why))
            plan.unreserved += len(dropped)
            log.info(
                "moves dropped before eviction: room not reserved",
                policy=policy.name,
                batch=index,
                dropped=len(dropped),
            )
        return kept, {m.pod: names[m.pod] for m in kept}

    async def _unneeded(
        self, reservations: dict[str, str], replacements: Sequence[str]
    ) -> list[str]:
        """The batch's reservations no replacement still waits for: every one, unless the
        landing wait ended with some replacements pending (theirs, by job and index, are kept
        for them; their TTL bounds them)."""
        if not reservations:
            return []
        try:
            pods = await self.store.get_many(pb.Pod, list(replacements))
        except StoreError:
            return list(reservations.values())
        pending = {
            (p.spec.job, p.spec.index)
            for p in pods
            if p is not None and p.status.phase == pb.POD_PENDING
        }
        if not pending:
            return list(reservations.values())
        found = await self.store.get_many(pb.Reservation, list(reservations.values()))
        return [
            r.metadata.name
            for r in found
            if r is not None and (r.spec.owner.job, r.spec.owner.index) not in pending
        ]

    async def _release(self, names: Sequence[str]) -> None:
        """Delete reservations (consumed ones are gone already); best effort: what is left
        expires by its TTL."""
        if not names:
            return
        try:
            results = await self.store.commit_many([[Delete("Reservation", n)] for n in names])
        except StoreError as exc:
            log.warning("releasing reservations failed; their TTL will", error=str(exc))
            return
        for name, result in zip(names, results, strict=True):
            if isinstance(result, StoreError) and not _gone(result):
                log.warning("releasing a reservation failed", reservation=name, error=str(result))

    def _event(
        self, movement: pb.Movement, reason: str, message: str, *, type_: str = NORMAL
    ) -> None:
        if self.events is not None:
            self.events.record(ref("Movement", movement), reason, message, type_=type_)

    async def _movements(self, names: Sequence[str]) -> list[pb.Movement]:
        found = await self.store.get_many(pb.Movement, names)
        return [m for m in found if m is not None]

    async def _wait_for_budgets(self, batch: Sequence[Move], view: ClusterView) -> None:
        """Until the batch fits the budgets' current allowances (the status controller keeps
        them; the previous batch's replacements count once healthy)."""
        pods = [view.pods[m.pod].pod for m in batch if m.pod in view.pods]
        retry = Retry(_POLL, deadline_seconds=self.config.budget_wait_seconds)
        while True:
            budgets, _ = await self.store.list_all(pb.DisruptionBudget)
            broken = BudgetTracker(budgets).violations(pods)
            if not broken:
                return
            if retry.expired:
                raise StopRound(
                    f"disruption budgets still forbid the batch after "
                    f"{self.config.budget_wait_seconds:g}s: {'; '.join(broken)}"
                )
            await retry.sleep()

    async def _wait_for_acks(self, name: str) -> None:
        retry = Retry(_POLL, deadline_seconds=self.config.ack_timeout_seconds)
        while True:
            movement = await self.store.get(pb.Movement, name)
            missing = sorted(await self._live_shards() - set(movement.status.notified_schedulers))
            if not missing:
                return
            if retry.expired:
                raise StopRound(
                    f"shard(s) {', '.join(missing)} did not acknowledge movement {name} within "
                    f"{self.config.ack_timeout_seconds:g}s"
                )
            await retry.sleep()

    async def _live_shards(self) -> set[str]:
        """The shards that must acknowledge a Movement: registered, ready, and stamping
        (``store.pulse``: a shard busy for a while still stamps; a dead one has stopped)."""
        instances, _ = await self.store.list_all(pb.SchedulerInstance)
        beats = await self.store.shard_heartbeats()
        grace_ms = self.config.shard_grace_seconds * 1000
        return {
            s.metadata.name
            for s in instances
            if s.status.ready
            and beats.now_ms - last_beat_ms(beats, s.metadata.name, s.status.heartbeat_ms)
            < grace_ms
        }

    async def _evict(
        self, batch: Sequence[Move], view: ClusterView, movement: str, policy: Policy
    ) -> list[str]:
        """Evict the batch in one request (all or nothing); a refusal stops the round. Returns
        the replacements' names."""
        request = ipb.EvictRequest(
            reason=RESCHEDULED,
            movement=movement,
            message=f"rescheduled by policy {policy.name} (movement {movement})",
        )
        for move in batch:
            uid = view.pods[move.pod].pod.metadata.uid if move.pod in view.pods else ""
            request.pods.add(name=move.pod, uid=uid)
        try:
            response = await self.evictor.evict(request)
        except EvictError as exc:
            raise StopRound(str(exc)) from exc
        refused = [r for r in response.results if r.outcome == ipb.EvictResult.REFUSED]
        if refused:
            reasons = "; ".join(f"{r.pod}: {r.reason}" for r in refused[:3])
            raise StopRound(f"the Binder refused the batch: {reasons}")
        return [r.replacement for r in response.results if r.replacement]

    async def _wait_for_landing(self, replacements: Sequence[str]) -> None:
        """Until every replacement runs (or finished, or is gone), or the timeout: the next batch
        should not take more of a job before it has recovered."""
        if not replacements:
            return
        retry = Retry(_POLL, deadline_seconds=self.config.landing_timeout_seconds)
        while not retry.expired:
            try:
                pods = await self.store.get_many(pb.Pod, replacements)
            except StoreError as exc:
                log.warning("reading replacements failed", error=str(exc))
                pods = []
            waiting = [
                p
                for p in pods
                if p is not None and p.status.phase in (pb.POD_PENDING, pb.POD_BOUND)
            ]
            if pods and not waiting:
                return
            await retry.sleep()
        log.info("replacements still landing; going on", count=len(replacements))


def _gone(error: StoreError) -> bool:
    """Whether a delete failed only because the object is gone already (consumed, released)."""
    cause = error.cause if isinstance(error, CommitError) else error
    return isinstance(cause, NotFoundError)
