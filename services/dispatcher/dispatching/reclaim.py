"""Quota reclaim: which borrowed pods go so a queue below its min gets its guaranteed capacity.

A queue may borrow idle capacity beyond its min up to its max. When a queue below its min has
pending work the cluster has no room for (``UnitQueue.reclaim_needs``), the dispatcher takes
back borrowed capacity: pods of other queues, any priority, but only pods running on what their
queue holds beyond its own min — lowest priority first, the newest first among equals (the
least work lost), within disruption budgets. The victims are evicted through the one eviction
path, ``Binder.Evict`` with reason ``Reclaimed`` (``services/eviction.py``), which re-checks the
budgets against its own view and gives each victim a replacement in its queue.

``choose_victims`` is pure; ``Reclaimer`` is the dispatcher's loop that asks the ``UnitQueue``
what is needed, chooses, and sends one ``Binder.Evict`` per starving queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from placement.budgets import BudgetTracker
from placement.nodeinfo import GUARANTEED
from placement.resources import Quantities
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.entries import Claim
from services.dispatcher.dispatching.queueing import borrowed, within_borrowed
from services.dispatcher.dispatching.unitqueue import UnitQueue
from services.eviction import RECLAIMED
from services.peers.binder import BinderEvictor, EvictError
from store.client import Store
from store.informer import Informer

log = structlog.get_logger(__name__)

# How long a reclaim waits for its victims to leave the dispatcher's view before it may choose
# again (they still count as the lender's usage until then).
SETTLE_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Victim:
    pod: pb.Pod
    # The queue whose min the eviction serves.
    for_queue: str


def _victim_order(claim: Claim) -> tuple[int, int, str]:
    return (claim.priority, -claim.started_ms, claim.name)


def _helps(requests: Quantities, remaining: Quantities) -> bool:
    have = dict(requests.items())
    return any(amount > 0 and have.get(name, 0) > 0 for name, amount in remaining.items())


def choose_victims(
    needs: Mapping[str, Quantities],
    claims: Iterable[Claim],
    read_pod: Callable[[str], pb.Pod | None],
    bound_usage: Callable[[str], Quantities],
    mins: Callable[[str], Quantities],
    budgets: BudgetTracker,
    *,
    exclude: frozenset[str] = frozenset(),
    limit: int = 1000,
    ordered: Sequence[Claim] | None = None,
) -> list[Victim]:
    """Borrowed pods to evict so each queue of ``needs`` gets what it lacks (guaranteed pool).

    A pod is taken only if it fits within what its queue holds beyond its min (so what remains
    of that queue stays at or above its min), it reduces something still needed, and evicting it
    keeps every disruption budget. Queues that need capacity lose nothing. Fewer pods than needed
    when not enough is borrowed; at most ``limit`` pods. ``ordered``: the candidates as
    :func:`victim_candidates` orders them, if already known (``claims`` is then not read).
    """
    candidates = victim_candidates(needs, claims, exclude) if ordered is None else ordered
    floors = {q: mins(q) for q in {c.queue for c in candidates}}
    lent = {q: borrowed(bound_usage(q), floor) for q, floor in floors.items()}
    taken: set[str] = set()
    out: list[Victim] = []
    for queue, need in sorted(needs.items()):
        remaining = need.copy()
        for claim in candidates:
            if len(out) >= limit or remaining.beyond(Quantities()).is_zero():
                break
            name = claim.name
            if name in taken or not _helps(claim.requests, remaining):
                continue
            if not within_borrowed(claim.requests, lent[claim.queue], floors[claim.queue]):
                continue  # it runs (at least partly) on its queue's own min
            pod = read_pod(name)
            if pod is None:
                continue  # gone from the view since
            if budgets.try_admit([pod]):
                continue  # a disruption budget forbids it
            taken.add(name)
            lent[claim.queue].add(claim.requests, -1)
            remaining.add(claim.requests, -1)
            out.append(Victim(pod, queue))
    return out


def victim_candidates(
    needs: Mapping[str, Quantities], claims: Iterable[Claim], exclude: frozenset[str]
) -> list[Claim]:
    """The claims that may be taken for ``needs``, in the order they are weighed: by the
    claims alone, so only the pods actually weighed are read."""
    return sorted(
        (
            c
            for c in claims
            if c.pool == GUARANTEED
            and c.queue not in needs
            and c.name not in exclude
            and not c.deleting
        ),
        key=_victim_order,
    )


class _NotRead(Exception):
    """A candidate weighed whose pod was not read yet (``Reclaimer``)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


# Candidates' pods read from the store at a time by the reclaimer, doubling per read.
_FIRST_READ = 64


class Reclaimer:
    """Every ``interval_seconds``: the queues below their min that need room
    (``UnitQueue.reclaim_needs``), their victims (``choose_victims``, budgets from the informer's
    stored statuses), one ``Binder.Evict`` per such queue with reason Reclaimed. Wakes the
    queue's backed-off units and kicks the dispatch round when pods were evicted."""

    def __init__(
        self,
        queue: UnitQueue,
        informer: Informer,
        evictor: BinderEvictor,
        kick: asyncio.Event,
        interval_seconds: float = 1.0,
        *,
        store: Store | None = None,
    ) -> None:
        self.queue = queue
        self.store = store  # where the pods weighed are read (None: the informer keeps them)
        self.informer = informer
        self.evictor = evictor
        self.kick = kick
        self.interval = interval_seconds
        # The last reclaim's victims: no new reclaim while our view still shows them holding
        # their claim (or SETTLE_SECONDS pass), so none is counted twice.
        self._victims: frozenset[str] = frozenset()
        self._not_before = 0.0

    async def run(self, view_is_current: Callable[[], bool]) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if view_is_current():
                await self.reclaim()

    async def reclaim(self) -> int:
        """One pass; returns how many pods were evicted."""
        # Looked up per victim, not by listing every claim: a pass runs every second, and with
        # nothing to reclaim (the common case) it must not cost O(bound pods).
        still_held = {name for name in self._victims if self.queue.holds_claim(name)}
        if still_held and time.monotonic() < self._not_before:
            return 0  # the last reclaim's victims are not yet gone from our view
        needs = self.queue.reclaim_needs()
        if not needs:
            return 0
        exclude = frozenset(still_held)
        candidates = victim_candidates(needs, self.queue.claims(), exclude)
        budgets = [
            b for b in self.informer.list("DisruptionBudget") if isinstance(b, pb.DisruptionBudget)
        ]
        # The pods weighed are read whole from the store (the view keeps a claim of a bound
        # pod, not the pod), in reads of doubling size from the first candidate not read yet:
        # a weighing that reaches one starts again with it read (it is deterministic).
        read: dict[str, pb.Pod | None] = {}
        position = {c.name: i for i, c in enumerate(candidates)}
        chunk = _FIRST_READ

        def read_pod(name: str) -> pb.Pod | None:
            if name not in read:
                raise _NotRead(name)
            return read[name]

        while True:
            try:
                victims = choose_victims(
                    needs,
                    (),
                    read_pod,
                    self.queue.bound_usage,
                    self.queue.min,
                    BudgetTracker(budgets),
                    exclude=exclude,
                    ordered=candidates,
                )
                break
            except _NotRead as missing:
                at = position[missing.name]
                names = [c.name for c in candidates[at : at + chunk]]
                for name, pod in zip(names, await self._read_pods(names), strict=True):
                    read[name] = pod
                chunk *= 2
        if not victims:
            return 0
        self._victims = frozenset(v.pod.metadata.name for v in victims)
        self._not_before = time.monotonic() + SETTLE_SECONDS
        evicted = 0
        for queue in sorted({v.for_queue for v in victims}):
            mine = [v.pod for v in victims if v.for_queue == queue]
            evicted += await self._evict(queue, mine)
        return evicted

    async def _read_pods(self, names: list[str]) -> list[pb.Pod | None]:
        """The pods whole: the store's (one read), or the informer's when it keeps them."""
        cached = [self.informer.get("Pod", name) for name in names]
        if self.store is None or all(isinstance(pod, pb.Pod) for pod in cached):
            return [pod if isinstance(pod, pb.Pod) else None for pod in cached]
        return await self.store.get_many(pb.Pod, names)

    async def _evict(self, queue: str, pods: list[pb.Pod]) -> int:
        request = ipb.EvictRequest(
            reason=RECLAIMED,
            message=f"reclaimed for queue {queue}, below its min",
            pods=[ipb.PodRef(name=p.metadata.name, uid=p.metadata.uid) for p in pods],
        )
        try:
            response = await self.evictor.evict(request)
        except EvictError as exc:
            log.warning("reclaim failed", queue=queue, error=str(exc))
            return 0
        done = [r for r in response.results if r.outcome == ipb.EvictResult.EVICTED]
        refused = [r for r in response.results if r.outcome == ipb.EvictResult.REFUSED]
        if done:
            self.queue.wake_queue(queue)
            self.kick.set()
        log.info(
            "reclaimed borrowed capacity",
            queue=queue,
            evicted=len(done),
            refused=len(refused),
            reason=refused[0].reason if refused else "",
        )
        return len(done)
