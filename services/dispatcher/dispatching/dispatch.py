"""The dispatch core: the queue of pending units (``unitqueue.UnitQueue``: ordering, quota,
backoff; fed from the informer by ``feed.ViewFeed``), and the streams to the scheduler shards.

State is rebuilt from the informer alone (a pod in POD_PENDING without a node belongs to its
job's pending unit), so a dispatcher restart loses nothing: which shard holds a unit lives only
here, and the Binder answers a duplicate decision with STALE.

Everything below runs on one event loop: informer handlers, shard readers and the dispatch round
mutate the state synchronously, never across an ``await``, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog
from google.protobuf.message import Message

from placement.nodeinfo import GUARANTEED
from placement.reservations import is_hold
from placement.resources import Quantities
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.encoding import (
    OutgoingUnit,
    encoded_messages,
    to_wire,
)
from services.dispatcher.dispatching.entries import (
    BackoffSettings,
    UnitEntry,
    UnitState,
)
from services.dispatcher.dispatching.feed import ViewFeed
from services.dispatcher.dispatching.liveness import ShardLiveness
from services.dispatcher.dispatching.nominations import Nominations
from services.dispatcher.dispatching.queueing import FAIRNESS, PendingUnit
from services.dispatcher.dispatching.reclaim import Reclaimer
from services.dispatcher.dispatching.reserving import (
    ReservationEntry,
    ReservationQueue,
    Waiting,
    waiting_message,
)
from services.dispatcher.dispatching.settling import Settler
from services.dispatcher.dispatching.unitqueue import UnitQueue
from services.dispatcher.objects import NodeShape
from services.events import SHARD_LOST, WARNING, EventRecorder, ref
from services.peers.binder import BinderEvictor
from services.runtime import Dial, cancel_and_wait
from services.runtime.streams import messages
from store import Store, StoreError
from store.informer import Handlers, Informer

log = structlog.get_logger(__name__)

_new_tuple = tuple.__new__

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_DISPATCH_METHOD = "/godel.v1.Scheduler/Dispatch"
RECONNECT_SECONDS = 1.0
POD_SCHEDULED = "PodScheduled"
UNSCHEDULABLE = "Unschedulable"
# Pods of an infeasible unit marked Unschedulable per store round trip (``mark_unschedulable``).
MARK_SLICE_PODS = 500

# (shard, pool) -> the room left in the shard's node partition (None: it has none; see
# ``partitions.PartitionRoom``).
PartitionRoomOf = Callable[[str, str], Quantities | None]


@dataclass(frozen=True, slots=True)
class DispatchSettings:
    shard_grace_seconds: float = 5.0
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 60.0
    infeasible_recheck_seconds: float = 300.0
    max_batch_pods: int = 5000
    # Which queue dispatches next: a name of queueing.FAIRNESS.
    queue_fairness: str = "drf"
    # How often queues below their min are checked for capacity to reclaim.
    reclaim_interval_seconds: float = 1.0


@dataclass(slots=True, eq=False)
class ShardLink:
    """The dispatcher's end of one shard's Dispatch stream."""

    name: str
    address: str
    credits: int = 0
    capacity: int = 0
    ready: bool = False
    # Undecided pods per unit sent to this shard, and their sum (read once per unit placed).
    undecided: dict[str, int] = field(default_factory=dict)
    load: int = 0
    # What the undecided units ask, per unit (pool, requests) and summed per pool: room in the
    # shard's partition that the partition's bound pods do not show yet.
    asks: dict[str, tuple[str, Quantities]] = field(default_factory=dict)
    reserved: dict[str, Quantities] = field(default_factory=dict)
    # What the writer sends, in order: messages, and units it encodes a slice at a time.
    outbox: asyncio.Queue[ipb.DispatchMessage | list[OutgoingUnit]] = field(
        default_factory=asyncio.Queue
    )
    task: asyncio.Task[None] | None = None

    def hold(
        self, job: str, pods: int, pool: str = GUARANTEED, requests: Quantities | None = None
    ) -> None:
        self.settle(job)
        self.undecided[job] = pods
        self.load += pods
        if requests is not None:
            self.asks[job] = (pool, requests)
            held = self.reserved.get(pool)
            if held is None:  # not setdefault: a Quantities made per unit, kept for none
                held = self.reserved[pool] = Quantities()
            held.add(requests)

    def settle(self, job: str) -> None:
        self.load -= self.undecided.pop(job, 0)
        ask = self.asks.pop(job, None)
        if ask is not None:
            self.reserved[ask[0]].add(ask[1], -1)

    def clear(self) -> None:
        self.undecided.clear()
        self.load = 0
        self.asks.clear()
        self.reserved.clear()

    def has_room(self, need: Quantities, pool: str, room: Quantities | None) -> bool:
        """Whether ``room`` (left in this shard's partition), less what its undecided units
        ask, still holds ``need``."""
        if room is None:
            return False
        left = room.copy()
        asked = self.reserved.get(pool)
        if asked is not None:
            left.add(asked, -1)
        return need.fits_in(left)


def choose_shard(
    links: Sequence[ShardLink],
    pods: int,
    need: Quantities | None = None,
    pool: str = GUARANTEED,
    room: PartitionRoomOf | None = None,
) -> ShardLink | None:
    """The shard a unit of ``pods`` pods asking ``need`` of ``pool`` goes to, or None.

    Candidates hold credits for the whole unit (a unit larger than a shard's capacity goes to
    an empty shard, so a stream of small units never starves it). With node partitions
    (``room``), the least-loaded candidate whose partition has room left for the unit goes
    first: a shard scans its own partition first and another's only when its own has no
    feasible node, so a unit sent where its partition is full lands on the other shards'
    nodes, where their decisions conflict with its own. Without partitions, or when no
    partition has the room, the least-loaded candidate. Ties go to the first."""
    best: ShardLink | None = None
    roomy: ShardLink | None = None
    for link in links:
        fits = link.credits >= pods or (
            pods > link.capacity and link.load == 0 and link.credits > 0
        )
        if not fits:
            continue
        if best is None or link.load < best.load:
            best = link
        if (
            room is not None
            and need is not None
            and (roomy is None or link.load < roomy.load)
            and link.has_room(need, pool, room(link.name, pool))
        ):
            roomy = link
    return roomy or best


def _unschedulable_condition(pod: pb.Pod) -> pb.Condition | None:
    for c in pod.status.conditions:
        if c.type == POD_SCHEDULED and c.status == "False":
            return c
    return None


async def mark_unschedulable(
    store: Store, informer: Informer, entry: UnitEntry, reason: str
) -> None:
    """Record why on the pods that do not say so yet: a round trip per ``MARK_SLICE_PODS``
    pods, the loop served between (a 100,000-pod unit's pods copied at once held it for
    seconds), conflicts ignored (the shard may have written its own, more detailed condition
    meanwhile)."""
    now_ms = int(time.time() * 1000)
    names = list(entry.pods)
    for first in range(0, len(names), MARK_SLICE_PODS):
        updates = []
        for name in names[first : first + MARK_SLICE_PODS]:
            pod = informer.get("Pod", name)
            if not isinstance(pod, pb.Pod) or _unschedulable_condition(pod) is not None:
                continue
            copy = pb.Pod()
            copy.CopyFrom(pod)
            copy.status.conditions.append(
                pb.Condition(
                    type=POD_SCHEDULED,
                    status="False",
                    reason=UNSCHEDULABLE,
                    message=reason or "the unit can never fit as specified",
                    last_transition_ms=now_ms,
                )
            )
            updates.append(copy)
        if not updates:
            await asyncio.sleep(0)
            continue
        try:
            await store.update_many(updates)
        except StoreError as exc:
            log.warning("could not mark pods unschedulable", job=entry.job, error=str(exc))
            return


def describe_unit(entry: UnitEntry, queue: UnitQueue, shards_ready: bool) -> str:
    """Where a tracked unit stands, in words (Explain's summary)."""
    if entry.state == UnitState.DISPATCHED:
        return f"dispatched to {entry.shard}"
    if entry.state == UnitState.TIMED_OUT:
        return "its gang timed out (phase Timeout): not dispatched until the job is retried"
    if entry.state == UnitState.SETTLING:
        return "its last scheduling attempt ended; queueing again"
    if entry.state == UnitState.INFEASIBLE:
        left = max(0.0, entry.not_before - time.monotonic())
        return (
            f"can never fit as specified ({entry.reason}); waiting for the cluster to change"
            f" (rechecked in {left:.0f}s)"
        )
    if entry.state == UnitState.BACKOFF:
        left = max(0.0, entry.not_before - time.monotonic())
        return (
            f"unschedulable after {entry.attempts} attempt(s) ({entry.reason}); "
            f"retrying in {left:.1f}s"
        )
    text = f"waiting in queue {entry.queue} (position {queue.position(entry)})"
    if entry.blocked:
        text += f": queue quota exceeded ({entry.blocked})"
    elif entry.waiting_for_room:
        text += (
            ": waiting for free room in the cluster (queues share it by "
            f"{queue.fairness.name}; this queue goes next)"
        )
    elif not shards_ready:
        text += ": no live scheduler shard"
    return text


class UnitDispatcher:
    """Pending units → queues → shards. Feed it an informer over Pod, Job, Node, Queue and
    SchedulerInstance, then ``await run()``.

    The round, the shard links and their stream callbacks stay in this one class: they change
    one state (which unit is with which shard, credits) that keeps "a unit never splits across
    shards" true; split, that invariant would span classes. The settle wait (``Settler``),
    Explain's words (``describe_unit``) and the Unschedulable write (``mark_unschedulable``)
    live apart."""

    KINDS = ("Pod", "Job", "Node", "Queue", "SchedulerInstance", "DisruptionBudget")

    def __init__(
        self,
        store: Store,
        informer: Informer,
        settings: DispatchSettings,
        evictor: BinderEvictor | None = None,
        *,
        dial: Dial,
    ) -> None:
        self.store = store
        self.dial = dial
        self.informer = informer
        # Where a lost shard is recorded as an event (the service sets it).
        self.events: EventRecorder | None = None
        self.settings = settings
        self.queue = UnitQueue(
            self._job,
            self._queue_object,
            BackoffSettings(
                settings.backoff_initial_seconds,
                settings.backoff_max_seconds,
                settings.infeasible_recheck_seconds,
            ),
            FAIRNESS[settings.queue_fairness],
            encoded_jobs=self._encoded_job,
        )
        # Every tracked unit, whatever its state (the queue's table, shared).
        self.units = self.queue.units
        self.links: dict[str, ShardLink] = {}
        self.nominations = Nominations()
        # The room left per node partition (the service wires in the node shuffler's); None:
        # the shard choice is load balance alone.
        self.partition_room: PartitionRoomOf | None = None
        self._retry_at: dict[str, float] = {}
        # Whether shard liveness is judged (our view is current and the shards' stamps read in
        # continuous contact with the store: ShardLiveness).
        self._judging = True
        # Who is alive, from the shards' stamps (read once per shard-loop tick; the node
        # shuffler and the reconciler judge by the same read).
        self.liveness = ShardLiveness(store, informer, settings.shard_grace_seconds)
        self._kick = asyncio.Event()
        self._shards_changed = asyncio.Event()
        # Quota reclaim and drains, through the Binder's one eviction path (None: none, e.g. in a
        # test without a Binder).
        self.evictor = evictor
        self.reclaimer = (
            Reclaimer(
                self.queue,
                informer,
                evictor,
                self._kick,
                settings.reclaim_interval_seconds,
                store=store,
            )
            if evictor is not None
            else None
        )
        self.settler = Settler(store, informer, self.queue, self._kick)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        # The informer's events into the queue, the node shapes and the bound counts.
        self.feed = ViewFeed(
            self.queue,
            self._kick,
            self._shards_changed,
            self.revoke,
            self.take_back,
            listing_under_way=lambda: informer.delivering_listing,
        )
        informer.add_handlers(
            Handlers(
                self.feed.on_add,
                self.feed.on_update,
                self.feed.on_delete,
                on_listed=self.feed.on_listed,
                on_listed_refused=self.feed.on_listed_refused,
            )
        )
        # Reservations without a node, dispatched as one-pod units (``reserving.py``); fed only
        # when the informer watches Reservations (the service's does).
        self.reservations = ReservationQueue(
            BackoffSettings(settings.backoff_initial_seconds, settings.backoff_max_seconds)
        )
        informer.add_handlers(
            Handlers(
                self._on_reservation,
                lambda kind, old, new: self._on_reservation(kind, new),
                self._on_reservation_gone,
                kinds=frozenset({"Reservation"}),
            )
        )
        informer.add_handlers(Handlers(self._on_node_added, kinds=frozenset({"Node"})))

    def _job(self, name: str) -> pb.Job | None:
        job = self.informer.get("Job", name)
        return job if isinstance(job, pb.Job) else None

    def _encoded_job(self, name: str) -> bytes | None:
        return self.informer.encoded("Job", name)

    def _queue_object(self, name: str) -> pb.Queue | None:
        queue = self.informer.get("Queue", name)
        return queue if isinstance(queue, pb.Queue) else None

    def _on_reservation(self, kind: str, obj: Message) -> None:
        assert isinstance(obj, pb.Reservation)
        done = self.reservations.seen(obj)
        if done is not None:
            self._revoke_reservation(done)
        elif obj.metadata.name in self.reservations.entries:
            self._kick.set()

    def _on_reservation_gone(self, kind: str, obj: Message) -> None:
        assert isinstance(obj, pb.Reservation)
        done = self.reservations.forget(obj.metadata.name)
        if done is not None:
            self._revoke_reservation(done)

    def _on_node_added(self, kind: str, obj: Message) -> None:
        if self.reservations.wake():
            self._kick.set()

    def _revoke_reservation(self, entry: ReservationEntry) -> None:
        """A reservation no longer awaiting a node: its shard, if one holds it, drops it."""
        if entry.state != Waiting.DISPATCHED:
            return
        link = self.links.get(entry.shard)
        if link is not None:
            link.settle(entry.key)
            link.outbox.put_nowait(ipb.DispatchMessage(revoke=ipb.RevokeUnits(jobs=[entry.key])))

    async def _write_reason(self, name: str, reason: str) -> None:
        """Why no node fits a reservation, in its ``status.message`` (compare-and-set: one
        changed meanwhile is left alone; the next outcome writes again)."""
        rsv = self.informer.get("Reservation", name)
        message = waiting_message(reason)
        if not isinstance(rsv, pb.Reservation) or rsv.status.message == message:
            return
        new = pb.Reservation()
        new.CopyFrom(rsv)
        new.status.message = message
        try:
            await self.store.update(new)
        except StoreError as exc:
            log.info("could not record why a reservation waits", reservation=name, error=str(exc))

    def queue_statuses(self) -> dict[str, pb.QueueStatus]:
        """Per queue, what its bound pods hold and what waits in it (``UnitQueue.statuses``)."""
        return self.queue.statuses()

    def node_shapes(self) -> dict[str, frozenset[NodeShape]]:
        """Distinct node capacities per pool (for "no node can ever hold this pod")."""
        return self.feed.shapes.distinct()

    # -----------------------------------------------------------------------------------------
    # Loops
    # -----------------------------------------------------------------------------------------

    async def run(self) -> None:
        """The dispatch loop, the shard watcher and the settler; returns only by cancellation."""
        loops = [
            asyncio.create_task(self._dispatch_loop(), name="dispatch"),
            asyncio.create_task(self._shard_loop(), name="shards"),
            asyncio.create_task(self.settler.run(lambda: self._closing), name="settle"),
        ]
        if self.reclaimer is not None:
            loops.append(
                asyncio.create_task(self.reclaimer.run(lambda: self._judging), name="reclaim")
            )
        try:
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            await self.close()
            await cancel_and_wait(loops)

    async def close(self) -> None:
        self._closing = True
        tasks = [link.task for link in self.links.values() if link.task is not None]
        await cancel_and_wait([*tasks, *self._tasks])

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dispatch_loop(self) -> None:
        while not self._closing:
            timeout = self._next_deadline()
            try:
                await asyncio.wait_for(self._kick.wait(), timeout)
            except TimeoutError:
                pass
            # Never between two slices of one read of the feed: a job's pods come in one
            # commit, and a round there would send its unit with part of them.
            await self.informer.read_applied()
            self._kick.clear()
            self.dispatch_round()

    def _next_deadline(self) -> float:
        now = time.monotonic()
        waits = [
            left
            for left in (self.queue.next_wake(now), self.reservations.next_wake(now))
            if left is not None
        ]
        return max(0.01, min(waits)) if waits else 1.0

    def _to_settle(self, entry: UnitEntry) -> None:
        """The attempt ended: queue it again once the informer has caught up with the store."""
        self.queue.settle(entry)
        self.settler.add(entry)

    async def _shard_loop(self) -> None:
        interval = min(1.0, self.settings.shard_grace_seconds / 4)
        while not self._closing:
            await self.liveness.read()
            self.check_shards()
            try:
                await asyncio.wait_for(self._shards_changed.wait(), interval)
            except TimeoutError:
                pass
            self._shards_changed.clear()

    def check_shards(self) -> None:
        """Open streams to live shards; drop the ones whose liveness stamps lapsed or that
        vanished (only while in continuous contact with the store: ``ShardLiveness``)."""
        live = {name: inst.spec.address for name, inst in self.liveness.live().items()}
        stale = self.informer.staleness()
        judging = stale <= self.settings.shard_grace_seconds / 2 and self.liveness.judging
        if judging != self._judging:
            # Out of touch with the store (it took no writes for a while, or our loop was
            # blocked: the view lags too), the stamps are old through no fault of the shards:
            # declaring live shards dead would requeue their units and add to the overload.
            # Judge nobody until contact is continuous again.
            if judging:
                log.info("in touch with the store; judging shard liveness")
            else:
                log.warning(
                    "view of the store is behind or shard stamps unread; not judging shard "
                    "liveness",
                    behind_s=stale,
                )
            self._judging = judging
        if judging:
            for name, link in list(self.links.items()):
                if live.get(name) != link.address:
                    self._drop_link(link, "liveness stamps lapsed or instance gone")
                    if link.task is not None:
                        link.task.cancel()
        now = time.monotonic()
        for name, address in live.items():
            if name not in self.links and self._retry_at.get(name, 0.0) <= now:
                link = self.links[name] = ShardLink(name, address)
                link.task = asyncio.create_task(self._run_link(link), name=f"shard-{name}")
                log.info("connecting to shard", shard=name, address=address)

    # -----------------------------------------------------------------------------------------
    # Shard streams
    # -----------------------------------------------------------------------------------------

    async def _run_link(self, link: ShardLink) -> None:
        reason = "stream ended"
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ]
        try:
            async with self.dial(link.address, options) as channel:
                # The stub's own serializer, but taking bytes encoded already (``_write``).
                dispatch = channel.stream_stream(
                    _DISPATCH_METHOD,
                    request_serializer=to_wire,
                    response_deserializer=ipb.ShardMessage.FromString,
                )
                call = dispatch()
                writer = asyncio.create_task(self._write(link, call))
                try:
                    async for msg in messages(call.read, ipb.ShardMessage):
                        self._on_shard_message(link, msg)
                finally:
                    writer.cancel()
                    await asyncio.gather(writer, return_exceptions=True)
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            reason = "closed"
            raise
        finally:
            self._drop_link(link, reason)

    async def _write(self, link: ShardLink, call: Any) -> None:
        """Send the link's outbox in order. Units are encoded here, a slice of pods at a time
        with the loop served between (``encoding.py``): a 100,000-pod unit in one piece held it
        for most of a second."""
        while True:
            item = await link.outbox.get()
            try:
                if isinstance(item, ipb.DispatchMessage):
                    await call.write(item)
                    continue
                for wire in encoded_messages(item, self.settings.max_batch_pods):
                    if wire is None:
                        await asyncio.sleep(0)  # the others' turn
                    else:
                        await call.write(wire)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                log.info("shard stream write failed", shard=link.name, error=str(exc))
                return

    def _on_shard_message(self, link: ShardLink, msg: ipb.ShardMessage) -> None:
        if self.links.get(link.name) is not link:
            return
        body = msg.WhichOneof("body")
        if body == "credit":
            link.credits += msg.credit.pods
            if not link.ready:
                link.ready = True
                link.capacity = msg.credit.pods
                log.info("shard ready", shard=link.name, capacity=link.capacity)
            self._kick.set()
        elif body == "outcomes":
            for outcome in msg.outcomes.outcomes:
                self._on_outcome(link, outcome)
        elif body == "outcome":  # a shard of the version before UnitOutcomes
            self._on_outcome(link, msg.outcome)
        elif body == "nominations":
            entry = self.units.get(msg.nominations.job)
            if (
                entry is not None
                and entry.state == UnitState.DISPATCHED
                and entry.shard == link.name
            ):
                self.nominations.record(msg.nominations)

    def _on_outcome(self, link: ShardLink, outcome: ipb.UnitOutcome) -> None:
        job = outcome.job  # read once: a message's string field is a new str per read
        link.settle(job)
        if is_hold(job):  # a reservation's unit
            waits = self.reservations.outcome(link.name, outcome, time.monotonic())
            if waits is not None:
                self._spawn(self._write_reason(waits.name, waits.reason), f"why-{waits.name}")
            self._kick.set()
            return
        self.nominations.clear(job)
        entry = self.units.get(job)
        if entry is None or entry.state != UnitState.DISPATCHED or entry.shard != link.name:
            return
        self.queue.release(entry)
        entry.reason = outcome.reason
        code = outcome.code
        if code == ipb.UNIT_UNSCHEDULABLE:
            delay = self.queue.back_off(entry, time.monotonic())
            log.info("unit unschedulable; backing off", job=entry.job, delay_s=delay)
        elif code == ipb.UNIT_INFEASIBLE:
            self.queue.park_infeasible(entry, time.monotonic())
            log.info("unit infeasible", job=entry.job, reason=outcome.reason)
            self._spawn(
                mark_unschedulable(self.store, self.informer, entry, outcome.reason),
                f"mark-{entry.job}",
            )
        else:
            self.queue.succeeded(entry)
            if entry.pods:
                # Pods still pending in our view: they wait for it to catch up (a store read
                # per batch). None (its binds seen already, most one-pod units): nothing to
                # settle, and the unit is dropped below.
                self.settler.add(entry)
        self.queue.drop_if_empty(entry.job)
        self._kick.set()

    def _drop_link(self, link: ShardLink, reason: str) -> None:
        """The shard is gone: its undecided units go back to the queue for the other shards."""
        if self.links.get(link.name) is not link or self._closing:
            return
        del self.links[link.name]
        self._retry_at[link.name] = time.monotonic() + RECONNECT_SECONDS
        requeued = 0
        for job in link.undecided:
            entry = self.units.get(job)
            if entry is not None and entry.state == UnitState.DISPATCHED:
                if entry.shard == link.name:
                    self.nominations.clear(job)
                    self.queue.release(entry)
                    self._to_settle(entry)
                    requeued += 1
        link.clear()
        requeued += self.reservations.shard_lost(link.name)
        log.warning("shard lost", shard=link.name, reason=reason, requeued_units=requeued)
        if self.events is not None:
            self.events.record(
                ref("SchedulerInstance", name=link.name),
                SHARD_LOST,
                f"{reason}; {requeued} undecided unit(s) dispatched again",
                type_=WARNING,
            )

    def requeue(self, entry: UnitEntry) -> None:
        """Take a dispatched unit back from its shard and queue it again (the reconciler's
        repair of a unit whose outcome can never come)."""
        link = self.links.get(entry.shard)
        if link is not None:
            link.settle(entry.job)
            link.outbox.put_nowait(ipb.DispatchMessage(revoke=ipb.RevokeUnits(jobs=[entry.job])))
        self.nominations.clear(entry.job)
        self.queue.release(entry)
        self._to_settle(entry)

    def revoke(self, job: str) -> None:
        """Forget a unit (its job was deleted); a shard holding it is told to drop it."""
        entry = self.units.get(job)
        self.nominations.clear(job)
        if entry is None:
            return
        link = self.links.get(entry.shard) if entry.state == UnitState.DISPATCHED else None
        if link is not None:
            link.settle(job)
            link.outbox.put_nowait(ipb.DispatchMessage(revoke=ipb.RevokeUnits(jobs=[job])))
        self.queue.forget(job)

    def take_back(self, job: str) -> None:
        """Take a unit back from the shard holding it (a gang timed out): the shard drops it,
        and the queue holds it (``UnitQueue.enqueue``). A decision already on its way to the
        Binder may still bind it: the job then moves on to Scheduled."""
        entry = self.units.get(job)
        if entry is None or entry.state != UnitState.DISPATCHED:
            return
        self.nominations.clear(job)
        link = self.links.get(entry.shard)
        if link is not None:
            link.settle(job)
            link.outbox.put_nowait(ipb.DispatchMessage(revoke=ipb.RevokeUnits(jobs=[job])))
        self.queue.release(entry)
        self.queue.enqueue(entry)

    # -----------------------------------------------------------------------------------------
    # The dispatch round
    # -----------------------------------------------------------------------------------------

    def dispatch_round(self) -> None:
        """Hand ready units to shards in the queue's order (``UnitQueue.round``), each to the
        least-loaded shard with credits for the whole unit (preferring one whose partition has
        room for it: ``choose_shard``); one ``UnitBatch`` per shard."""
        links = sorted((lk for lk in self.links.values() if lk.ready), key=lambda lk: lk.name)
        if not links:
            self.queue.wake(time.monotonic())
            return
        self._dispatch_reservations(links)
        batches: dict[str, list[OutgoingUnit]] = {}

        def place(entry: UnitEntry, unit: PendingUnit) -> bool:
            link = choose_shard(links, unit.pods, unit.requests, unit.pool, self.partition_room)
            if link is None:
                return False
            batches.setdefault(link.name, []).append(self._send(entry, unit, link))
            return True

        self.queue.round(time.monotonic(), place, lambda: any(lk.credits > 0 for lk in links))
        for name, units in batches.items():
            self._flush(self.links[name], units)

    def _dispatch_reservations(self, links: list[ShardLink]) -> None:
        """Reservations awaiting a node first (few, and room held is what jobs wait for), each
        as a one-pod unit to the least-loaded shard with a credit; one ``UnitBatch`` per shard."""
        ready = self.reservations.ready(time.monotonic())
        if not ready:
            return
        batches: dict[str, ipb.UnitBatch] = {}
        for entry in ready:
            link = choose_shard(links, 1)
            if link is None:
                break
            link.credits -= 1
            link.hold(entry.key, 1)
            batch = batches.setdefault(link.name, ipb.UnitBatch())
            batch.units.append(self.reservations.dispatched(entry, link.name))
        for name, batch in batches.items():
            self.links[name].outbox.put_nowait(ipb.DispatchMessage(units=batch))

    def _send(self, entry: UnitEntry, unit: PendingUnit, link: ShardLink) -> OutgoingUnit:
        """Count the unit as the shard's and return what its message carries."""
        # Its stored bytes, laid into the shard's message undecoded (``encoding.py``).
        job: pb.Job | bytes | None = self.informer.encoded("Job", entry.job)
        if job is None:  # an informer that holds jobs decoded
            job = self._job(entry.job)
            assert job is not None
        pods = list(entry.pods.items())  # as they are now; ordered when encoded
        link.credits -= len(pods)
        link.hold(entry.job, len(pods), unit.pool, unit.requests)
        self.queue.dispatched(entry, link.name, unit)
        # tuple.__new__ straight: the NamedTuple's __new__ binds its arguments in Python.
        return _new_tuple(
            OutgoingUnit, (job, pods, self.feed.bound_pods(entry.job), entry.enqueued_ms)
        )

    def _flush(self, link: ShardLink, units: list[OutgoingUnit]) -> None:
        link.outbox.put_nowait(units)  # encoded by the link's writer, in slices
        log.debug("dispatched", shard=link.name, units=len(units), credits=link.credits)

    # -----------------------------------------------------------------------------------------
    # Introspection (Explain)
    # -----------------------------------------------------------------------------------------

    def describe(self, job: str) -> str:
        """Where a pending unit stands, in words (``describe_unit``)."""
        entry = self.units.get(job)
        if entry is None:
            return "not yet seen by the dispatcher"
        shards = any(link.ready for link in self.links.values())
        return describe_unit(entry, self.queue, shards)
