"""Reservations named to a node are committed by the Binder, as bindings are: the dispatcher
stores an applied reservation ``Pending``, and the leader, in its committer's turn (one at a time
with the decision batches, against the same authoritative view), checks it against its node —
the node exists and is ready, and its room fits beside the bound pods and the holds there, by
the fit rule every judge uses — and commits it ``Reserved`` on that node (fenced, compare-and-set).
So a reservation and a bind never both take the last room of a node. One that does not fit waits
``Pending`` with the reason in ``status.message`` and is tried again on each sweep, until it fits
or the dispatcher releases it (its TTL, its owner, its node).

A sweep is queued when a pending reservation appears and every ``SWEEP_SECONDS`` while some wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from placement.nodeinfo import PORTS_IN_USE, NodeInfo, port_conflict, resource_fit_failures
from placement.reservations import hold_request
from protos.godel.v1 import objects_pb2 as pb
from services import events
from services.binder.config import BinderConfig
from services.binder.leadership import Leadership
from services.binder.state import ClusterState
from store.client import Op, Store, Update
from store.errors import CommitError, FencedError
from store.informer import Informer

log = structlog.get_logger(__name__)

SWEEP_SECONDS = 1.0
# Writes of one sweep's commit at most (one store script holds the server while it runs); the
# rest go in the next sweep, queued at once.
MAX_SWEEP_WRITES = 500


@dataclass(slots=True)
class ReserveWork:
    """A sweep of the pending reservations, in the committer's turn."""


def plan(
    state: ClusterState, limit: int = MAX_SWEEP_WRITES
) -> tuple[list[Op], list[pb.Reservation]]:
    """The writes of one sweep (no I/O): each pending reservation that fits its node Reserved
    there (each counted before the next on the same node), each that does not with why in its
    message (written only when the reason changed). Returns (ops, the reservations reserved)."""
    clones: dict[str, NodeInfo] = {}
    ops: list[Op] = []
    reserved: list[pb.Reservation] = []
    pending = sorted(
        state.pending_reservations.values(),
        key=lambda r: (r.metadata.creation_timestamp_ms, r.metadata.name),
    )
    for rsv in pending:
        if len(ops) >= limit:
            break
        name = rsv.spec.node
        node = state.nodes.get(name)
        new = pb.Reservation()
        new.CopyFrom(rsv)
        if node is None or not node.status.ready:
            why = f"node {name!r} {'does not exist' if node is None else 'is not ready'}"
        else:
            info = clones.get(name)
            if info is None:
                info = clones[name] = state.info_for(name).clone()
            new.status.phase = pb.RESERVATION_RESERVED
            new.status.node = name
            new.status.message = ""
            hold = hold_request(new)
            failures = resource_fit_failures(info, hold)
            if port_conflict(info, hold):
                failures.append(PORTS_IN_USE)
            if not failures:
                info.add_pod(hold)
                ops.append(Update(new))
                reserved.append(new)
                continue
            why = f"no room on node {name!r} yet: {', '.join(failures)}"
            new.CopyFrom(rsv)
        message = f"waiting: {why}"
        if rsv.status.message != message:
            new.status.message = message
            ops.append(Update(new))
    return ops, reserved


class Reserving:
    def __init__(
        self,
        config: BinderConfig,
        store: Store,
        informer: Informer,
        state: ClusterState,
        leadership: Leadership,
        recorder: events.EventRecorder,
        enqueue: Callable[[ReserveWork], Awaitable[None]],
    ) -> None:
        self.config = config
        self.store = store
        self.informer = informer
        self.state = state
        self.leadership = leadership
        self.events = recorder
        self.enqueue = enqueue
        self.wanted = asyncio.Event()  # set when a pending reservation appears
        self._queued = False

    async def sweep_forever(self) -> None:
        """Queue a sweep when a pending reservation appears, and again every SWEEP_SECONDS
        while some wait (their node may have room by then); only the leader sweeps."""
        while True:
            try:
                await asyncio.wait_for(self.wanted.wait(), SWEEP_SECONDS)
            except TimeoutError:
                pass
            self.wanted.clear()
            if self.state.pending_reservations and self.leadership.fence and not self._queued:
                self._queued = True
                await self.enqueue(ReserveWork())

    def _forget_written(self, written: pb.Reservation) -> None:
        """Drop a pending reservation's copy at the version a write was based on (a newer one
        the informer already delivered stays)."""
        name = written.metadata.name
        held = self.state.pending_reservations.get(name)
        if held is not None and (
            held.metadata.resource_version == written.metadata.resource_version
        ):
            del self.state.pending_reservations[name]

    async def run(self, work: ReserveWork) -> None:
        """The committer's turn: one fenced commit of the sweep's writes; a reservation that
        changed or went meanwhile is left out and the rest committed."""
        self._queued = False
        for _ in range(self.config.commit_retries + 1):
            fence = self.leadership.fence
            if fence is None:
                return
            ops, reserved = plan(self.state)
            if not ops:
                return
            try:
                await self.store.commit(ops, fence=fence)
            except FencedError as exc:
                self.leadership.fenced_by = exc
                return
            except CommitError as exc:
                op = ops[exc.index]
                assert isinstance(op, Update) and isinstance(op.obj, pb.Reservation)
                log.info("reservation changed meanwhile", reservation=op.obj.metadata.name)
                # Seen again once the informer has it: deleted, or at its new version.
                self._forget_written(op.obj)
                continue
            for op in ops:
                assert isinstance(op, Update) and isinstance(op.obj, pb.Reservation)
                self._forget_written(op.obj)  # back, at its new version, from the informer
            if len(ops) >= MAX_SWEEP_WRITES:
                self.wanted.set()  # more wait: the next sweep at once
            for rsv in reserved:
                self.state.on_add("Reservation", rsv)  # its hold counts from now on
                self.events.record(
                    events.ref("Reservation", rsv),
                    events.RESERVATION_HELD,
                    f"holding {rsv.spec.template.requests.milli_cpu}m cpu, "
                    f"{rsv.spec.template.requests.memory_bytes} bytes memory on "
                    f"{rsv.status.node}",
                    related=events.ref("Node", name=rsv.status.node),
                    owner=rsv.metadata.owner,
                )
            return
