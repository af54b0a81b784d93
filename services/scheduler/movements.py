"""The shard's side of the rescheduling handshake (Gödel's Movement controller and Rescheduling
plugin).

- **Acknowledge**: a live Movement this shard has not acknowledged gets the shard's name added to
  ``status.notified_schedulers``; the rescheduler evicts a batch only once every live shard has.
- **Prefer**: while a Movement is live, the replacements of a listed job try its recommended
  nodes first, up to each node's desired count (a preference: when none fits, the pod is placed
  as usual). A placement that used a recommendation, or any placement of a listed job, carries the
  Movement's name so the Binder can record it as ``actual`` or ``mismatched``.
- **Wait**: when a recommended node still holds one of the Movement's own evicted pods (a swap:
  the room is coming), the unit waits for it rather than going elsewhere, for at most
  ``max_wait_seconds`` after the Movement was created.

Recommendations this shard proposed count against the desired counts until the Binder records
them (or ``PROPOSAL_TTL_SECONDS`` pass, for a proposal the Binder refused), except against the
pod that made them: placed again after a refusal, it may take its recommendation again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog
from google.protobuf.message import Message

from protos.godel.v1 import objects_pb2 as pb
from services import movements as shared
from store import Store
from store.errors import StoreError

log = structlog.get_logger(__name__)

PROPOSAL_TTL_SECONDS = 10.0
KIND = "Movement"


@dataclass(frozen=True, slots=True)
class _Proposal:
    movement: str
    job: str
    node: str
    at: float


class MovementTracker:
    def __init__(
        self,
        store: Store,
        shard: str,
        holds: Callable[[str, str], bool],
        *,
        max_wait_seconds: float = 30.0,
    ) -> None:
        """``holds(pod, node)``: whether the shard's view still has ``pod`` bound on ``node``."""
        self.store = store
        self.shard = shard
        self.holds = holds
        self.max_wait_ms = int(max_wait_seconds * 1000)
        self.movements: dict[str, pb.Movement] = {}
        self._by_job: dict[str, set[str]] = {}
        self._proposals: dict[str, _Proposal] = {}  # pod -> what it was proposed for
        self._to_ack: set[str] = set()
        self._wake = asyncio.Event()

    # -- informer handlers -------------------------------------------------------------------

    def on_add(self, kind: str, obj: Message) -> None:
        if kind != KIND:
            return
        assert isinstance(obj, pb.Movement)
        name = obj.metadata.name
        self._forget(name)
        self.movements[name] = obj
        for owner in obj.status.owners:
            self._by_job.setdefault(owner.job, set()).add(name)
        if shared.live(obj, _now_ms()) and self.shard not in obj.status.notified_schedulers:
            self._to_ack.add(name)
            self._wake.set()

    def on_update(self, kind: str, old: Message, new: Message) -> None:
        self.on_add(kind, new)

    def on_delete(self, kind: str, obj: Message) -> None:
        if isinstance(obj, pb.Movement):
            self._forget(obj.metadata.name)

    def _forget(self, name: str) -> None:
        old = self.movements.pop(name, None)
        if old is None:
            return
        for owner in old.status.owners:
            names = self._by_job.get(owner.job)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_job[owner.job]

    # -- acknowledging -----------------------------------------------------------------------

    async def ack_loop(self) -> None:
        """Acknowledge what the informer brings, for the life of the shard."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            for name in sorted(self._to_ack):
                try:
                    await shared.change(self.store, name, shared.acknowledge(self.shard))
                except StoreError as exc:
                    log.warning("acknowledging a movement failed", movement=name, error=str(exc))
                    continue  # the next update of the Movement brings it back
                self._to_ack.discard(name)

    # -- scheduling --------------------------------------------------------------------------

    def _live_for(self, job: str, now_ms: int) -> list[pb.Movement]:
        names = self._by_job.get(job)
        if not names:
            return []
        found = [self.movements[n] for n in sorted(names) if n in self.movements]
        return [m for m in found if shared.live(m, now_ms)]

    def lists(self, job: str) -> bool:
        """Whether any Movement (live or not) lists ``job`` among its owners."""
        return job in self._by_job

    def preferences(self, job: str, placing: Iterable[str] = ()) -> list[tuple[str, str]]:
        """(node, movement) per recommendation still open for ``job``'s replacements, a node
        repeated once per replacement it should still take; oldest Movement first. ``placing``:
        the pods about to be placed; an earlier proposal of theirs is void (the Binder refused
        it, or they would not be placed again) and no longer holds its recommendation."""
        if job not in self._by_job:
            return []  # every unit of every job asks: the common answer costs a lookup
        movements = self._live_for(job, _now_ms())
        if not movements:
            return []
        now = time.monotonic()
        again = set(placing)
        self._proposals = {
            pod: p
            for pod, p in self._proposals.items()
            if now - p.at < PROPOSAL_TTL_SECONDS and pod not in again
        }
        # A proposal is recorded, once bound, as actual on the node it proposed: until then it
        # holds its recommendation's slot.
        recorded = {
            t.pod
            for movement in movements
            for owner in movement.status.owners
            if owner.job == job
            for rec in owner.recommended_nodes
            for t in rec.actual_pods
        }
        pending = Counter(
            (p.movement, p.node)
            for pod, p in self._proposals.items()
            if p.job == job and pod not in recorded
        )
        out: list[tuple[str, str]] = []
        for movement in sorted(movements, key=lambda m: m.metadata.creation_timestamp_ms):
            name = movement.metadata.name
            for owner in movement.status.owners:
                if owner.job != job:
                    continue
                for rec in owner.recommended_nodes:
                    open_ = rec.desired_pod_count - len(rec.actual_pods) - pending[name, rec.node]
                    out += [(rec.node, name)] * max(0, open_)
        return out

    def movement_of(self, job: str) -> str:
        """A live Movement listing ``job`` (its replacements are recorded against it), or ""."""
        if job not in self._by_job:
            return ""
        movements = self._live_for(job, _now_ms())
        return movements[0].metadata.name if movements else ""

    def waiting_for(self, job: str) -> str:
        """Why ``job``'s replacements should wait (a recommended node still holds the
        Movement's own evicted pod, and the Movement is young), or "" to go ahead."""
        if job not in self._by_job:
            return ""  # asked of every unit: a job no Movement lists costs one lookup
        now_ms = _now_ms()
        for movement in self._live_for(job, now_ms):
            if now_ms - movement.metadata.creation_timestamp_ms >= self.max_wait_ms:
                continue
            recommended = {
                rec.node
                for owner in movement.status.owners
                if owner.job == job
                for rec in owner.recommended_nodes
                if len(rec.actual_pods) < rec.desired_pod_count
            }
            for task in movement.spec.deleted_tasks:
                if task.node in recommended and self.holds(task.pod, task.node):
                    return (
                        f"waiting for node {task.node} to be vacated by movement "
                        f"{movement.metadata.name}"
                    )
        return ""

    def proposed(self, pod: str, movement: str, job: str, node: str) -> None:
        """A placement on a recommended node went to the Binder."""
        self._proposals[pod] = _Proposal(movement, job, node, time.monotonic())


def _now_ms() -> int:
    return int(time.time() * 1000)
