"""One scheduling cycle of the shard: ready units through the search, decisions into one batch.

The only code that touches the snapshot. A cycle refreshes the snapshot from the cache, takes
ready units from the queue for up to ``cycle_budget_ms``, searches each (one-pod units of loose
jobs together, Gödel mode), assumes the placements in the cache and hands the batch to the
Binder link. The search yields to the event loop every ``YIELD_SECONDS``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

import structlog
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from placement.framework import PodInfo, UnitInfo
from placement.nodeinfo import PodRequest
from placement.reservations import as_pod, awaits_placement
from placement.search import Placement, UnitResult, UnitScheduler, run_steps
from placement.snapshot import Snapshot
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services import metrics
from services.scheduler.binder_link import BinderLink
from services.scheduler.cache import SchedulerCache
from services.scheduler.movements import MovementTracker
from services.scheduler.units import Unit, UnitBook
from services.scheduler.victims import ShardVictims
from store.informer import Informer

log = structlog.get_logger(__name__)

# How long a unit search runs before letting the event loop serve streams and heartbeats.
YIELD_SECONDS = 0.02
# Placements written into a decision between two looks at the clock (``ShardCycle._propose``).
_PLACEMENTS_PER_CHECK = 256
# One-pod units searched together at most (Gödel mode): a stream of one-pod jobs paid the
# search's set-up, a coroutine and a timing sample per pod. Bounded so one search stays short.
MAX_LOOSE_GROUP = 256
# How often a unit waiting for a Movement's recommended node (a swap) looks again.
MOVEMENT_WAIT_POLL_SECONDS = 0.2


class _NotYet:
    """A pending pod the shard's view has not caught up with (``_pending_pod``)."""


_NOT_YET = _NotYet()


@dataclass(frozen=True)
class CycleSettings:
    shard: str
    grouping: bool  # Gödel mode: one-pod units of loose jobs share a search
    max_batch_pods: int
    cycle_budget_ms: int


class ShardCycle:
    def __init__(
        self,
        settings: CycleSettings,
        book: UnitBook,
        link: BinderLink[Unit],
        scheduler: UnitScheduler,
        cache: SchedulerCache,
        informer: Informer,
        movements: MovementTracker,
        victims: ShardVictims,
        stats: dict[str, int],
    ) -> None:
        self.settings = settings
        self.book = book
        self.link = link
        self.scheduler = scheduler
        self.cache = cache
        self.snapshot = Snapshot()
        self.informer = informer
        self.movements = movements
        self.victims = victims
        self._stats = stats
        # The rest of a unit's decision too big for one batch (``_propose``), each in a batch
        # of its own, sent after the cycle's batch.
        self._overflow: list[tuple[ipb.DecisionBatch, Unit]] = []

    async def run(self) -> None:
        """One scheduling cycle: refresh the snapshot, schedule ready units for up to the cycle
        budget, send their decisions as one DecisionBatch."""
        self.cache.expire()
        self.snapshot.update(self.cache)
        settings, queue = self.settings, self.book.queue
        deadline = time.monotonic() + settings.cycle_budget_ms / 1000
        # Decisions are written into the batch as they are made: built apart, each (with its
        # placements) would be copied whole into the batch.
        batch = ipb.DecisionBatch(shard=settings.shard)
        units: list[Unit] = []
        pods = 0
        while pods < settings.max_batch_pods and (unit := queue.pop()) is not None:
            if settings.grouping and self._is_loose(unit):
                group = self._take_loose(unit, settings.max_batch_pods - pods)
                for decided in await self._attempt_loose(group, batch):
                    units.append(decided)
                    pods += 1
            else:
                decision = await self._attempt(unit, batch)
                if decision is not None:
                    units.append(unit)
                    pods += len(decision.placements)
            if time.monotonic() >= deadline:
                break
        if units:
            metrics.SCHEDULER_PODS_SCHEDULED.inc(pods)  # once a cycle: one-pod units are many
            self.link.send(batch, units)
        for extra, unit in self._overflow:
            metrics.SCHEDULER_PODS_SCHEDULED.inc(len(extra.units[0].placements))
            self.link.send(extra, [unit])
        self._overflow.clear()

    async def _attempt(self, unit: Unit, batch: ipb.DecisionBatch) -> ipb.UnitDecision | None:
        """Place the unit's pending pods; on success its decision is appended to ``batch``
        and returned."""
        infos = await self._read_pending(unit)
        if infos is None:
            return None
        if not infos:
            self.book.maybe_finish(unit)
            return None
        waiting = self.movements.waiting_for(unit.name)
        if waiting:
            # A swap: the recommended room is being vacated; wait for it instead of going
            # elsewhere (bounded by the Movement's age).
            log.debug("unit waits for a recommended node", job=unit.name, reason=waiting)
            self.book.defer(unit, MOVEMENT_WAIT_POLL_SECONDS)
            return None
        spec = unit.job.spec
        affinity = unit.affinity
        info = UnitInfo(
            unit.name,
            spec.min_member,
            unit.already_bound,
            spec.priority,
            infos,
            preferred=self.movements.preferences(unit.name, [p.name for p in infos]),
            affinity=affinity,
            placed_nodes=self._placed_nodes(unit) if affinity is not None else (),
        )
        with metrics.SCHEDULER_SCHEDULING_DURATION.time():
            result = await self._search(info)
        unit.pending.clear()
        if unit.revoked:
            return None  # revoked while being placed: its placements die with the snapshot
        unit.infeasible = result.infeasible
        if not result.success:
            self.book.hand_back(unit, result.unplaced, result.diagnoses, result.reason)
            return None
        unit.handed_back.update(result.unplaced)
        unit.diagnoses.update(result.diagnoses)
        requests = {p.name: p.req for p in infos}
        return await self._propose(unit, result.placements, requests, batch)

    async def _read_pending(self, unit: Unit) -> list[PodInfo] | None:
        """The unit's pending pods as the search takes them; None when the unit is revoked
        meanwhile or the view has not caught up with one of them (the unit is deferred)."""
        infos: list[PodInfo] = []
        revision = self.informer.revision
        until = time.monotonic() + YIELD_SECONDS
        for name, rv in list(unit.pending.items()):
            if time.monotonic() >= until:
                # A 100,000-pod unit takes seconds to read: heartbeats and streams run between
                # (its pods are read one by one anyway, each as the view has it then).
                await asyncio.sleep(0)
                until = time.monotonic() + YIELD_SECONDS
                if unit.revoked:
                    return None
            pod = self._pending_pod(unit, name, rv, revision)
            if isinstance(pod, _NotYet):
                return None
            if pod is not None:
                infos.append(pod)
        return infos

    def _pending_pod(
        self, unit: Unit, name: str, rv: int, revision: int
    ) -> PodInfo | _NotYet | None:
        """A pending pod of ``unit`` as the search takes it; None when it needs no placing
        any more (deleted by its owner, or bound meanwhile: counted here); ``_NOT_YET`` when
        the view has not caught up with the dispatcher (the unit is deferred)."""
        if unit.reservation:
            return self._pending_reservation(unit, name, rv, revision)
        pod = self.informer.get("Pod", name)
        if pod is None and self.informer.knows("Pod", name):
            # Bound, as the view has it: the informer keeps nothing of a bound pod.
            if revision < rv:  # the view has not caught up with the dispatcher yet
                self.book.defer(unit, 0.02)
                return _NOT_YET
            del unit.pending[name]  # bound meanwhile (e.g. an earlier decision of ours)
            unit.bound.append(name)
            unit.already_bound += 1
            self.book.finish_pods(unit, 1)
            return None
        if not isinstance(pod, pb.Pod) or pod.metadata.resource_version < rv:
            if revision < rv:  # the view has not caught up with the dispatcher yet
                self.book.defer(unit, 0.02)
                return _NOT_YET
            del unit.pending[name]  # deleted by its owner
            self.book.finish_pods(unit, 1)
            return None
        if pod.spec.node_name or pod.status.phase != pb.POD_PENDING:
            del unit.pending[name]  # bound meanwhile (e.g. an earlier decision of ours)
            if pod.spec.node_name:
                unit.bound.append(name)
                unit.already_bound += 1
            self.book.finish_pods(unit, 1)
            return None
        # With the reservations' holds it may take: its filters judge their nodes without them.
        return self.cache.reservations.own(PodInfo.from_pod(pod), pod)

    def _pending_reservation(
        self, unit: Unit, name: str, rv: int, revision: int
    ) -> PodInfo | _NotYet | None:
        """A reservation without a node as the search takes it: as the pod it is placed as
        (``placement.reservations.as_pod``); None once it needs no placing (deleted, or
        Reserved meanwhile)."""
        rsv = self.informer.get("Reservation", unit.reservation)
        if not isinstance(rsv, pb.Reservation) or rsv.metadata.resource_version < rv:
            if revision < rv:
                self.book.defer(unit, 0.02)
                return _NOT_YET
            rsv = None
        if rsv is None or not awaits_placement(rsv):
            del unit.pending[name]
            if rsv is not None and rsv.status.node:
                unit.bound.append(name)
            self.book.finish_pods(unit, 1)
            return None
        return PodInfo.from_pod(as_pod(rsv))

    # -- one-pod units of loose jobs: one search ---------------------------------------------

    def _is_loose(self, unit: Unit) -> bool:
        """Whether the unit's search may be shared: one pod to place, placed on its own, and
        no Movement's recommendations or waits to honour."""
        return unit.loose and len(unit.pending) == 1 and not self.movements.lists(unit.name)

    def _take_loose(self, first: Unit, room: int) -> list[Unit]:
        """``first`` and the loose units next in line after it (the ready order is kept: they
        are searched in it), at most ``MAX_LOOSE_GROUP`` and ``room`` pods."""
        group = [first]
        limit = min(MAX_LOOSE_GROUP, max(1, room))
        queue = self.book.queue
        while len(group) < limit:
            unit = queue.peek()
            if unit is None or not self._is_loose(unit):
                break
            queue.pop()
            group.append(unit)
        return group

    async def _attempt_loose(self, group: list[Unit], batch: ipb.DecisionBatch) -> list[Unit]:
        """Place the one pending pod of each of ``group``'s units in one search (pods placed
        independently: ``UnitInfo.independent``); each unit then ends, or sends its decision
        into ``batch``, as alone. Returns the units that sent one."""
        revision = self.informer.revision
        owners: list[tuple[Unit, PodInfo]] = []
        for unit in group:
            name, rv = next(iter(unit.pending.items()))
            pod = self._pending_pod(unit, name, rv, revision)
            if pod is None:
                self.book.maybe_finish(unit)
            elif not isinstance(pod, _NotYet):
                owners.append((unit, pod))
        if not owners:
            return []
        search = UnitInfo("", 1, 0, 0, [info for _, info in owners], independent=True)
        with metrics.SCHEDULER_SCHEDULING_DURATION.time():
            result = await self._search(search)
        placed = {p.pod: p for p in result.placements}
        decided: list[Unit] = []
        for unit, info in owners:
            unit.pending.clear()
            if unit.revoked:
                continue  # revoked while being placed: its placement dies with the snapshot
            placement = placed.get(info.name)
            if placement is None:
                unit.infeasible = info.name in result.infeasible_pods
                reason = result.unplaced.get(info.name, result.reason)
                self.book.hand_back(unit, {info.name: reason}, result.diagnoses, reason)
                continue
            self._propose_one(unit, placement, info.req, batch)
            decided.append(unit)
        return decided

    # -- decisions ---------------------------------------------------------------------------

    async def _propose(
        self,
        unit: Unit,
        placements: list[Placement],
        requests: dict[str, PodRequest],
        batch: ipb.DecisionBatch,
    ) -> ipb.UnitDecision:
        """Append the unit's decision to ``batch``, its placements assumed in the cache, letting
        the event loop run every ``YIELD_SECONDS`` (100,000 placements written and assumed at
        once held the loop for seconds, past the shard's heartbeat grace). Meanwhile the cache
        takes in events as ever (pods assumed and not yet bound are its usual state); no
        verdict on this decision can come before the cycle sends it."""
        spec = unit.job.spec
        decision = batch.units.add(
            job=unit.name, min_member=spec.min_member, already_bound=unit.already_bound
        )
        if unit.reservation:
            decision.reservation = unit.reservation
        out = decision.placements
        # A decision of more placements than a batch carries (the Binder refuses a batch of
        # more than its own limit: a 100,000-pod unit could never bind) goes in several, each
        # a decision of the unit with enough placements to reach its min_member on its own;
        # a gang that needs more in one goes whole, as ever.
        cap = self.settings.max_batch_pods
        needed = max(1, spec.min_member - unit.already_bound)
        split = len(placements) > cap and needed <= cap // 2
        # Any replacement of a job a live Movement lists is recorded against it (actual when it
        # used a recommendation, mismatched when not).
        movement = self.movements.movement_of(unit.name)
        until = time.monotonic() + YIELD_SECONDS
        for i, p in enumerate(placements, 1):
            if i % _PLACEMENTS_PER_CHECK == 0 and time.monotonic() >= until:
                await asyncio.sleep(0)
                until = time.monotonic() + YIELD_SECONDS
            if split and len(out) >= cap and len(placements) - i + 1 >= needed:
                extra = ipb.DecisionBatch(shard=batch.shard)
                self._overflow.append((extra, unit))
                out = extra.units.add(
                    job=unit.name, min_member=spec.min_member, already_bound=unit.already_bound
                ).placements
            self._write(unit, p, requests[p.pod], out, movement)
        self._stats["decided_pods"] += len(placements)
        _nominate(unit, placements)
        return decision

    def _propose_one(
        self, unit: Unit, p: Placement, req: PodRequest, batch: ipb.DecisionBatch
    ) -> None:
        """``_propose`` of a one-pod unit's placement (a loose unit of a shared search), without
        what only a big decision needs (a coroutine, a look at the clock, the split): one of
        these runs per pod of a stream of one-pod jobs."""
        decision = batch.units.add(
            job=unit.name, min_member=unit.job.spec.min_member, already_bound=unit.already_bound
        )
        if unit.reservation:
            decision.reservation = unit.reservation
        self._write(unit, p, req, decision.placements, self.movements.movement_of(unit.name))
        self._stats["decided_pods"] += 1
        if p.victims or unit.nominated:
            _nominate(unit, (p,))

    def _write(
        self,
        unit: Unit,
        p: Placement,
        req: PodRequest,
        out: RepeatedCompositeFieldContainer[ipb.Placement],
        movement: str,
    ) -> None:
        """Assume placement ``p`` of ``unit`` (its request ``req``) in the cache and append it
        to the decision's placements ``out``."""
        if p.recommendation:
            self.movements.proposed(p.pod, p.recommendation, unit.name, p.node)
        if p.numa_nodes:
            req = req.pinned(p.numa_nodes)
        if p.gpu_cards:  # the cache's node holds the cards, as the search assumed them
            req = req.with_cards(p.gpu_cards)
        self.cache.assume(req, p.node, p.victims, p.hold)
        self.victims.admit(p.victims)
        unit.inflight[p.pod] = p.node
        placed = out.add(pod=p.pod, pod_resource_version=p.resource_version, node=p.node)
        # The rest only when set: an empty list or string given to ``add`` costs as much as the
        # placement itself, and most placements evict nothing, hold no NUMA node or card.
        if p.victims:
            placed.victims.extend(p.victims)
        if p.recommendation or movement:
            placed.movement = p.recommendation or movement
        if p.numa_nodes:
            placed.numa_nodes.extend(p.numa_nodes)
        if p.gpu_cards:
            placed.gpu_cards.extend(p.gpu_cards)

    def _placed_nodes(self, unit: Unit) -> tuple[str, ...]:
        """Nodes of the job's pods bound (as this shard's cache knows them) or in flight: the
        domain a job-level affinity confines the rest to."""
        nodes = list(unit.inflight.values())
        if unit.already_bound:
            nodes += self.cache.bound_nodes_of(unit.name)
        return tuple(nodes)

    async def _search(self, info: UnitInfo) -> UnitResult:
        """The unit search, letting the event loop run every ``YIELD_SECONDS``: a large unit
        (a 10,000-pod gang, or kube mode's per-pod scans) takes seconds, and heartbeats, streams
        and SIGTERM must not wait for it. Only this loop touches the snapshot meanwhile."""
        steps = self.scheduler.steps(info, self.snapshot)
        while True:
            result = run_steps(steps, time.monotonic() + YIELD_SECONDS)
            if result is not None:
                return result
            await asyncio.sleep(0)  # a turn for the event loop, then the search goes on


def _nominate(unit: Unit, placements: Iterable[Placement]) -> None:
    """Tell the dispatcher which pods of this decision preempt, and where, while the Binder has
    it (one message per unit, and only for units that preempt or did). Read from the search's
    placements, which the decision's carry field for field (not read back from the messages:
    a wrapper and a field read per placement)."""
    nominations = [
        ipb.Nomination(pod=p.pod, node=p.node, victims=p.victims) for p in placements if p.victims
    ]
    if nominations or unit.nominated:
        unit.nominated = bool(nominations)
        unit.stream.send(
            ipb.ShardMessage(nominations=ipb.Nominations(job=unit.name, pods=nominations))
        )
