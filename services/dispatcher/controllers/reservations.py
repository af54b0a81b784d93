"""Reservations are released (deleted, with a ``ReservationReleased`` event) when their room is
no longer kept for anyone: their TTL ran out since they were created, their owner job is deleted
(a reservation applied ahead of its job waits for it: only a job seen going releases it), or
their node is lost (deleted, or marked NotReady by the node lifecycle controller). Consumed ones
are the Binder's (deleted in the commit that binds their owner's pod).

A heap of deadlines kept from informer events, each derived from what is stored — creation time
plus TTL — so a restarted dispatcher finds the same deadlines, and reservations whose owner went
while it was down still expire (orphans). Each tick releases at most ``batch`` of them in one
pipelined ``commit_many``, each a compare-and-set on the version judged: one changed meanwhile
(its TTL raised) fails alone and is judged again.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import structlog

from placement.reservations import expires_ms
from protos.godel.v1 import objects_pb2 as pb
from services import events
from services.dispatcher.controllers.ticking import tick_forever
from store import Store
from store.client import Delete, Op
from store.errors import StoreError
from store.informer import Handlers, Informer

log = structlog.get_logger(__name__)

EXPIRED = "expired"
OWNER_DELETED = "owner deleted"
NODE_LOST = "node lost"


@dataclass(frozen=True, slots=True)
class Releasing:
    reservation: str
    why: str  # EXPIRED, OWNER_DELETED or NODE_LOST
    detail: str


class ReservationController:
    def __init__(
        self,
        store: Store,
        informer: Informer,
        recorder: events.EventRecorder | None = None,
        *,
        interval_seconds: float = 1.0,
        batch: int = 500,
    ) -> None:
        self._store = store
        self._informer = informer
        self._events = recorder
        self.interval = interval_seconds
        self.batch = batch
        self._due: list[tuple[int, str]] = []  # (deadline ms, reservation), a heap; stale skipped
        # Reservations to look at again next tick, with why: their owner job or node went.
        self._suspect: dict[str, Releasing] = {}
        self.released: dict[str, int] = {EXPIRED: 0, OWNER_DELETED: 0, NODE_LOST: 0}
        informer.add_handlers(
            Handlers(
                on_add=self._seen,
                on_update=lambda kind, _old, new: self._seen(kind, new),
                on_delete=self._gone,
                kinds=frozenset({"Reservation", "Job", "Node"}),
            )
        )
        for rsv in informer.each("Reservation"):
            self._seen("Reservation", rsv)

    def _seen(self, kind: str, obj: object) -> None:
        if isinstance(obj, pb.Reservation):
            heapq.heappush(self._due, (expires_ms(obj), obj.metadata.name))
            node = obj.status.node or obj.spec.node
            if node:  # on a node already gone (applied as it went, or while we were down)
                self._suspect.setdefault(
                    obj.metadata.name,
                    Releasing(obj.metadata.name, NODE_LOST, f"its node {node!r} is gone"),
                )
            # Its owner marked for deletion before the reservation was cached: the listing
            # hands reservations over after jobs, when the job's own event found none of them.
            owner = self._informer.get("Job", obj.spec.owner.job) if obj.spec.owner.job else None
            if isinstance(owner, pb.Job) and owner.metadata.deletion_timestamp_ms:
                job = obj.spec.owner.job
                self._suspect[obj.metadata.name] = Releasing(
                    obj.metadata.name, OWNER_DELETED, f"its owner job {job!r} went"
                )
        elif isinstance(obj, pb.Job) and obj.metadata.deletion_timestamp_ms:
            self._owner_went(obj.metadata.name)
        elif isinstance(obj, pb.Node) and not obj.status.ready:
            self._node_went(obj.metadata.name, "is not ready")

    def _gone(self, kind: str, obj: object) -> None:
        if isinstance(obj, pb.Job):
            self._owner_went(obj.metadata.name)
        elif isinstance(obj, pb.Node):
            self._node_went(obj.metadata.name, "was deleted")
        elif isinstance(obj, pb.Reservation):
            self._suspect.pop(obj.metadata.name, None)

    def _owner_went(self, job: str) -> None:
        for rsv in self._reservations():
            if rsv.spec.owner.job == job:
                name = rsv.metadata.name
                self._suspect[name] = Releasing(name, OWNER_DELETED, f"its owner job {job!r} went")

    def _node_went(self, node: str, how: str) -> None:
        for rsv in self._reservations():
            if (rsv.status.node or rsv.spec.node) == node:
                name = rsv.metadata.name
                self._suspect[name] = Releasing(name, NODE_LOST, f"its node {node!r} {how}")

    def _reservations(self) -> list[pb.Reservation]:
        return [r for r in self._informer.each("Reservation") if isinstance(r, pb.Reservation)]

    async def run(self) -> None:
        await tick_forever("reservations", self._informer, self.tick, self.interval)

    def due(self, now_ms: int) -> list[tuple[pb.Reservation, Releasing]]:
        """What this tick releases (at most ``batch``), judged on the current view."""
        chosen: dict[str, tuple[pb.Reservation, Releasing]] = {}
        for name, why in list(self._suspect.items()):
            if len(chosen) >= self.batch:
                break
            del self._suspect[name]
            rsv = self._informer.get("Reservation", name)
            if isinstance(rsv, pb.Reservation) and self._still(rsv, why):
                chosen[name] = (rsv, why)
        while self._due and self._due[0][0] <= now_ms and len(chosen) < self.batch:
            _, name = heapq.heappop(self._due)
            rsv = self._informer.get("Reservation", name)
            if not isinstance(rsv, pb.Reservation) or name in chosen:
                continue  # consumed or released already, or a duplicate entry
            deadline = expires_ms(rsv)
            if deadline > now_ms:
                heapq.heappush(self._due, (deadline, name))  # its TTL was raised
                continue
            ttl = rsv.spec.ttl_seconds
            chosen[name] = (rsv, Releasing(name, EXPIRED, f"unused after its TTL of {ttl}s"))
        return list(chosen.values())

    def _still(self, rsv: pb.Reservation, why: Releasing) -> bool:
        """Whether the suspicion holds on the current view: the owner job or the node gone."""
        if why.why == OWNER_DELETED:
            job = self._informer.get("Job", rsv.spec.owner.job)
            return not isinstance(job, pb.Job) or bool(job.metadata.deletion_timestamp_ms)
        node = self._informer.get("Node", rsv.status.node or rsv.spec.node)
        return not isinstance(node, pb.Node) or not node.status.ready

    async def tick(self, now_ms: int | None = None) -> None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        chosen = self.due(now)
        if not chosen:
            return
        commits: list[list[Op]] = [
            [Delete("Reservation", rsv.metadata.name, rsv.metadata.resource_version)]
            for rsv, _ in chosen
        ]
        try:
            results = await self._store.commit_many(commits)
        except StoreError:
            for rsv, why in chosen:  # all of them again next tick
                self._suspect.setdefault(rsv.metadata.name, why)
                heapq.heappush(self._due, (expires_ms(rsv), rsv.metadata.name))
            raise
        for (rsv, why), result in zip(chosen, results, strict=True):
            name = rsv.metadata.name
            if isinstance(result, StoreError):
                # Changed (its update re-queues it) or gone (consumed): judged again if alive.
                log.debug("reservation not released", reservation=name, error=str(result))
                continue
            self.released[why.why] += 1
            log.info("reservation released", reservation=name, why=why.why, node=rsv.status.node)
            if self._events is not None:
                self._events.record(
                    events.ref("Reservation", rsv),
                    events.RESERVATION_RELEASED,
                    f"released ({why.why}): {why.detail}",
                    related=events.ref("Node", name=rsv.status.node) if rsv.status.node else None,
                    owner=rsv.metadata.owner,
                )
