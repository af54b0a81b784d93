"""Reservations named to a node are committed by the Binder, as bindings are: the dispatcher
stores an applied reservation ``Pending``, and the leader, in its committer's turn (one at a time
with the decision batches, against the same authoritative view), checks it against its node —
the node exists and is ready, and its room fits beside the bound pods and the holds there, by
the fit rule every judge uses — and commits it ``Reserved`` on that node (fenced, compare-and-set).
So a reservation and a bind never both take the last room of a node. One that does not fit waits
``Pending`` with the reason in ``status.message`` and is tried again on each sweep, until it fits
or the dispatcher releases it (its TTL, its owner, its node).

A sweep is queued when a pending reservation appears and every ``SWEEP_SECONDS`` while some wait.

Reservations without a node are placed by the shards like pods and reach the leader in their
decision batches (``UnitDecision.reservation``): ``Reserving.place``, in that batch's turn,
re-checks each (``plan_placed``: by every filter, as the pod it stands for) and commits the
accepted ``Reserved`` the same way. Both choose the NUMA nodes and GPU cards a hold keeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from placement.framework import Framework, PodInfo
from placement.nodeinfo import PORTS_IN_USE, NodeInfo, port_conflict, resource_fit_failures
from placement.plugins import gpucards, numatopology
from placement.reservations import as_pod, awaits_placement, hold_name, hold_request
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services import events
from services.binder.config import BinderConfig
from services.binder.decide import (
    BOUND,
    CONFLICT,
    ERROR,
    NOT_LEADER,
    STALE,
    gpu_cards_for,
    numa_nodes_for,
)
from services.binder.leadership import Leadership
from services.binder.state import ClusterState
from store.client import Fence, Op, Store, Update
from store.errors import CommitError, FencedError, StoreError, StoreUnavailableError
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
                failures = _pin(new, info)
            if not failures:
                info.add_pod(hold_request(new))
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


def _pin(
    rsv: pb.Reservation,
    info: NodeInfo,
    numa_proposed: tuple[int, ...] = (),
    cards_proposed: tuple[int, ...] = (),
) -> list[str]:
    """The NUMA nodes and GPU cards a reservation holds on ``info``, chosen as the Binder
    chooses a pod's and set on its status — so a NUMA-bound reservation keeps its NUMA nodes,
    and a GPU share keeps room on one card its owner's share can take however fragmented the
    others get — or why none can be (empty: set). A shard's proposals are verified, never
    moved."""
    del rsv.status.numa_nodes[:]
    del rsv.status.gpu_cards[:]
    req = hold_request(rsv)
    numa = numa_nodes_for(info, req, numa_proposed)
    if isinstance(numa, str):
        return [f"{numatopology.NAME}: {numa}"]
    rsv.status.numa_nodes.extend(numa)
    if req.requests.gpus:
        cards = gpu_cards_for(info, req.pinned(numa) if numa else req, cards_proposed)
        if isinstance(cards, str):
            return [f"{gpucards.NAME}: {cards}"]
        rsv.status.gpu_cards.extend(cards)
    return []


def plan_placed(
    decisions: Sequence[ipb.UnitDecision],
    stored: Mapping[str, pb.Reservation | None],
    state: ClusterState,
    rules: Framework,
) -> tuple[list[Op], list[ipb.PodVerdict]]:
    """The shards' placements of reservations without a node (no I/O): each re-checked like a
    pod's — the reservation as ``stored`` is still Pending at the version decided, its node
    exists and is ready, and every filter passes there (``as_pod``, as the shard searched it)
    with its NUMA nodes and GPU cards verified or chosen — against the node as bound pods,
    holds and this call's earlier acceptances leave it. Returns (the updates committing the
    accepted ones Reserved, one verdict per placement: BOUND for each update, to be committed)."""
    clones: dict[str, NodeInfo] = {}
    ops: list[Op] = []
    verdicts: list[ipb.PodVerdict] = []
    accepted: set[str] = set()
    for decision in decisions:
        for p in decision.placements:
            verdict = ipb.PodVerdict(pod=p.pod, job=decision.job, node=p.node)
            verdicts.append(verdict)
            name = decision.reservation
            placed = _placed(name, p, stored.get(name))
            if name in accepted:
                placed = f"reservation {name!r} is placed more than once in the batch"
            if isinstance(placed, str):
                verdict.code, verdict.reason = STALE, placed
                continue
            node = state.nodes.get(p.node)
            if node is None or not node.status.ready:
                verdict.code = CONFLICT
                verdict.reason = (
                    f"node {p.node!r} {'not found' if node is None else 'is not ready'}"
                )
                continue
            info = clones.get(p.node)
            if info is None:
                info = clones[p.node] = state.info_for(p.node).clone()
            why = _fits(placed, p, info, rules)
            if why is not None:
                verdict.code, verdict.reason = CONFLICT, f"node {p.node!r}: {why}"
                continue
            info.add_pod(hold_request(placed))
            ops.append(Update(placed))
            accepted.add(name)
            verdict.code = BOUND
    return ops, verdicts


def _placed(name: str, p: ipb.Placement, rsv: pb.Reservation | None) -> pb.Reservation | str:
    """The reservation Reserved on the placement's node, or why the placement is stale."""
    if p.pod != hold_name(name):
        return f"placement {p.pod!r} is not reservation {name!r}'s"
    if rsv is None:
        return f"reservation {name!r} not found"
    if not awaits_placement(rsv):
        where = rsv.status.node or rsv.spec.node
        return f"reservation {name!r} is not waiting for a node (it holds room on {where!r})"
    if rsv.metadata.resource_version != p.pod_resource_version:
        return (
            f"reservation changed: decided at resource_version {p.pod_resource_version}, "
            f"now {rsv.metadata.resource_version}"
        )
    new = pb.Reservation()
    new.CopyFrom(rsv)
    new.status.phase = pb.RESERVATION_RESERVED
    new.status.node = p.node
    new.status.message = ""
    return new


def _fits(new: pb.Reservation, p: ipb.Placement, info: NodeInfo, rules: Framework) -> str | None:
    """Whether ``new`` fits on ``info`` by every filter, its NUMA nodes and GPU cards set on
    it (the placement's, verified, or chosen here); None when it does."""
    pod = PodInfo.from_pod(as_pod(new), keyed=False)
    status = rules.run_filters(pod, info)
    if status is not None:
        return f"{status.plugin}: {', '.join(status.reasons)}"
    failures = _pin(new, info, tuple(p.numa_nodes), tuple(p.gpu_cards))
    return failures[0] if failures else None


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

    def _forget_written(self, written: pb.Reservation, based_on: int) -> None:
        """Drop a pending reservation's copy at version ``based_on``, the one a write was based
        on (a newer one the informer already delivered stays: the commit sets the written
        object's new version on it, and the informer may deliver that version before the
        commit returns — a still pending one, its message written, must be swept again)."""
        name = written.metadata.name
        held = self.state.pending_reservations.get(name)
        if held is not None and held.metadata.resource_version == based_on:
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
            based_on = [_written(op).metadata.resource_version for op in ops]
            try:
                await self.store.commit(ops, fence=fence)
            except FencedError as exc:
                self.leadership.fenced_by = exc
                return
            except CommitError as exc:
                changed = _written(ops[exc.index])
                log.info("reservation changed meanwhile", reservation=changed.metadata.name)
                # Seen again once the informer has it: deleted, or at its new version.
                self._forget_written(changed, based_on[exc.index])
                continue
            for op, version in zip(ops, based_on, strict=True):
                # Back, at its new version, from the informer.
                self._forget_written(_written(op), version)
            if len(ops) >= MAX_SWEEP_WRITES:
                self.wanted.set()  # more wait: the next sweep at once
            for rsv in reserved:
                self._held(rsv)
            return

    def _held(self, rsv: pb.Reservation) -> None:
        """A reservation committed Reserved: its hold counts from now on, and an event says so."""
        self.state.on_add("Reservation", rsv)
        self.events.record(
            events.ref("Reservation", rsv),
            events.RESERVATION_HELD,
            f"holding {rsv.spec.template.requests.milli_cpu}m cpu, "
            f"{rsv.spec.template.requests.memory_bytes} bytes memory on {rsv.status.node}",
            related=events.ref("Node", name=rsv.status.node),
            owner=rsv.metadata.owner,
        )

    async def place(
        self, decisions: Sequence[ipb.UnitDecision], rules: Framework, fence: Fence
    ) -> list[ipb.PodVerdict]:
        """The committer's turn for the shards' placements of reservations without a node (a
        decision batch's ``UnitDecision.reservation`` units): each read fresh, re-checked
        (``plan_placed``) and the accepted committed Reserved in one fenced commit — so a
        reservation placed twice (a resent batch, a shard's retry after a failover) is Reserved
        once and the other answered STALE. Returns one verdict per placement."""
        names = list(dict.fromkeys(d.reservation for d in decisions))
        try:
            read = await self.store.get_many(pb.Reservation, names)
        except StoreUnavailableError as exc:
            return _all(decisions, ERROR, f"store unavailable: {exc}")
        stored: dict[str, pb.Reservation | None] = dict(zip(names, read, strict=True))
        for _ in range(self.config.commit_retries + 1):
            if self.leadership.fence is not fence:
                return _all(decisions, NOT_LEADER, f"binder {self.config.name} is not the leader")
            ops, verdicts = plan_placed(decisions, stored, self.state, rules)
            if not ops:
                return verdicts
            try:
                await self.store.commit(ops, fence=fence)
            except FencedError as exc:
                self.leadership.fenced_by = exc
                return _all(decisions, NOT_LEADER, f"binder {self.config.name} was deposed: {exc}")
            except CommitError as exc:
                # Changed or gone since the read: judged again as it is now (its verdict says).
                name = _written(ops[exc.index]).metadata.name
                try:
                    [stored[name]] = await self.store.get_many(pb.Reservation, [name])
                except StoreUnavailableError as unavailable:
                    return _all(decisions, ERROR, f"store unavailable: {unavailable}")
                continue
            except StoreError as exc:
                return _all(decisions, ERROR, f"store rejected the reservations: {exc}")
            by_name: dict[str, pb.Reservation] = {}
            for op in ops:
                rsv = _written(op)
                by_name[hold_name(rsv.metadata.name)] = rsv
                self._held(rsv)
            for verdict in verdicts:
                written = by_name.get(verdict.pod)
                if written is not None:
                    verdict.resource_version = written.metadata.resource_version
            return verdicts
        return _all(decisions, CONFLICT, f"gave up after {self.config.commit_retries + 1} attempts")


def _written(op: Op) -> pb.Reservation:
    """The reservation an op of a sweep or a placement writes (they write nothing else)."""
    assert isinstance(op, Update) and isinstance(op.obj, pb.Reservation)
    return op.obj


def _all(
    decisions: Sequence[ipb.UnitDecision], code: ipb.VerdictCode.ValueType, reason: str
) -> list[ipb.PodVerdict]:
    return [
        ipb.PodVerdict(pod=p.pod, job=d.job, node=p.node, code=code, reason=reason)
        for d in decisions
        for p in d.placements
    ]
