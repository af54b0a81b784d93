"""Node partitions between scheduler shards (Gödel's node shuffler).

When shards contend — a nearly full cluster, a high bind rate, or many Binder conflicts — each
live shard gets a partition of the nodes: it scans its own first and the others' only when its
own has no feasible node (``placement/search.py``), so two shards rarely propose the same
room. The partitions are published in ``SchedulerInstance.spec.partition``, which every shard
already watches (its status write is a compare-and-set, so it never overwrites one). Which shards
are alive is ``ShardLiveness``'s judgement (their liveness stamps), the dispatcher's own.

The algorithm is plain functions and one plain class (``Partitions``); ``NodeShuffler`` is the
I/O shell the dispatcher runs: it measures, decides on/off, keeps the partitions in step with
the live shards and the nodes, and writes the ones that changed.

- ``rebalance_move(loads)``: the original's rule over node counts per shard — when the largest
  partition holds more than twice the smallest (and more than one node), move
  ``(most + least) // 2 - least`` nodes from it to the smallest: loads {10, 3} move 3.
- A new node goes to the shard with the fewest nodes; a dead shard's nodes go one by one to the
  shard with the fewest; a new shard starts empty and the rule fills it. A lone live shard gets
  no partition (nobody to conflict with).
- Triggers (``Figures.triggers``): guaranteed-pool allocation above ``allocation_percent``,
  throughput (pods bound per second) above ``throughput_pods_per_second``, or a conflict rate
  (Binder CONFLICT/GANG_REJECTED verdicts per pod proposed) above ``conflict_percent``, over the
  last ``window_seconds``. Partitioning goes on at once when one fires and off when none has
  for ``off_after_seconds`` (a short lull must not undo it, since partitioning itself lowers the
  conflict rate).
- ``PartitionRoom``: the room left in each partition per pool (what its nodes offer minus the
  claims of the pods bound there), built from the claims the dispatcher's ledger keeps when
  partitions first exist, then kept per informer event and re-summed only when the
  partitions change, so the dispatcher can send a unit to a shard whose partition holds it
  (``dispatch.choose_shard``) without a pass over the nodes per unit.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

import structlog

from placement.claims import holds_claim
from placement.nodeinfo import GUARANTEED
from placement.resources import Quantities
from placement.room import NodeRoom, PoolRoom, RoomClaim
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.liveness import ShardLiveness
from store import ConflictError, NotFoundError, Store, StoreError
from store.informer import Handlers, Informer

log = structlog.get_logger(__name__)

Mode = Literal["auto", "on", "off"]


# ---------------------------------------------------------------------------------------------
# The algorithm (pure)
# ---------------------------------------------------------------------------------------------


def rebalance_move(loads: Mapping[str, int]) -> tuple[str, str, int] | None:
    """(from shard, to shard, nodes to move) by the original node shuffler's rule, or None when
    the partitions are balanced enough. Ties go to the first name, so the result is stable."""
    if len(loads) < 2:
        return None
    most = max(sorted(loads), key=lambda s: loads[s])
    least = min(sorted(loads), key=lambda s: loads[s])
    high, low = loads[most], loads[least]
    if high > 2 * low and high > 1:
        return most, least, (high + low) // 2 - low
    return None


def smallest(sizes: Mapping[str, int]) -> str:
    """The shard with the fewest nodes (first name on a tie)."""
    return min(sorted(sizes), key=lambda s: sizes[s])


@dataclass
class Partitions:
    """Which shard owns which node. Plain state, no I/O: ``sync`` it with the live shards and
    the nodes, then read ``of(shard)``."""

    members: dict[str, set[str]] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)
    # Bumped by every change of membership: what a reader compares instead of the sets.
    version: int = 0
    _sorted: dict[str, tuple[int, list[str]]] = field(default_factory=dict, repr=False)

    @classmethod
    def seeded(
        cls, stored: Mapping[str, Iterable[str]], shards: Iterable[str], nodes: Iterable[str]
    ) -> Partitions:
        """Rebuilt from partitions stored earlier (a dispatcher restart keeps them): a node
        claimed twice stays with the first shard by name, unknown nodes and shards are dropped."""
        out = cls()
        existing = set(nodes)
        for shard in sorted(shards):
            out.members[shard] = set()
            for node in stored.get(shard, ()):
                if node in existing and node not in out.owner:
                    out._give(node, shard)
        return out

    def sizes(self) -> dict[str, int]:
        return {shard: len(nodes) for shard, nodes in self.members.items()}

    def of(self, shard: str) -> list[str]:
        """The shard's nodes, sorted (kept until the partitions change)."""
        cached = self._sorted.get(shard)
        if cached is None or cached[0] != self.version:
            cached = self._sorted[shard] = (self.version, sorted(self.members.get(shard, ())))
        return cached[1]

    def _give(self, node: str, shard: str) -> None:
        previous = self.owner.get(node)
        if previous is not None:
            self.members[previous].discard(node)
        self.owner[node] = shard
        self.members[shard].add(node)
        self.version += 1

    def add_shard(self, shard: str) -> None:
        if shard not in self.members:
            self.members[shard] = set()
            self.version += 1

    def remove_shard(self, shard: str) -> list[str]:
        """A dead shard's nodes go, one by one, to the shard with the fewest; returns them."""
        nodes = sorted(self.members.pop(shard, set()))
        self.version += 1
        for node in nodes:
            del self.owner[node]
            if self.members:
                self._give(node, smallest(self.sizes()))
        return nodes

    def add_node(self, node: str) -> str | None:
        """A new node goes to the shard with the fewest nodes; returns it (None: no shard)."""
        if node in self.owner or not self.members:
            return self.owner.get(node)
        shard = smallest(self.sizes())
        self._give(node, shard)
        return shard

    def remove_node(self, node: str) -> None:
        shard = self.owner.pop(node, None)
        if shard is not None:
            self.members[shard].discard(node)
            self.version += 1

    def rebalance(self) -> list[tuple[str, str, int]]:
        """Apply ``rebalance_move`` until it holds no more; returns the moves. Each move takes
        the largest names of the giver's nodes, so repeated runs move the same nodes."""
        moves = []
        while (move := rebalance_move(self.sizes())) is not None:
            giver, taker, count = move
            for node in sorted(self.members[giver])[-count:]:
                self._give(node, taker)
            moves.append(move)
        return moves

    def sync(self, shards: Iterable[str], nodes: Iterable[str]) -> bool:
        """Follow the live shards and the existing nodes, then rebalance; True if anything
        changed."""
        live, existing = set(shards), set(nodes)
        before = self.version
        for shard in sorted(set(self.members) - live):
            self.remove_shard(shard)
        for shard in sorted(live):
            self.add_shard(shard)
        for node in sorted(self.owner.keys() - existing):
            self.remove_node(node)
        for node in sorted(existing - self.owner.keys()):
            self.add_node(node)
        self.rebalance()
        return self.version != before


# ---------------------------------------------------------------------------------------------
# Measurements and triggers (pure)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionSettings:
    mode: Mode = "auto"
    allocation_percent: float = 90.0
    throughput_pods_per_second: float = 2000.0
    conflict_percent: float = 1.0
    window_seconds: float = 10.0
    off_after_seconds: float = 30.0
    interval_seconds: float = 1.0


@dataclass(frozen=True)
class Figures:
    """What the shuffler measured: guaranteed-pool allocation, pods bound per second and the
    Binder's conflict rate over the window (percent of pods proposed)."""

    allocation_percent: float = 0.0
    throughput: float = 0.0
    conflict_percent: float = 0.0

    def triggers(self, settings: PartitionSettings) -> list[str]:
        """The thresholds exceeded, in words (empty: none)."""
        out = []
        if self.allocation_percent > settings.allocation_percent:
            out.append(f"allocation {self.allocation_percent:.1f}%")
        if self.throughput > settings.throughput_pods_per_second:
            out.append(f"throughput {self.throughput:.0f} pods/s")
        if self.conflict_percent > settings.conflict_percent:
            out.append(f"conflicts {self.conflict_percent:.2f}%")
        return out


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    proposed: int
    bound: int
    conflicted: int


class ShardCounters:
    """Sums the shards' cumulative counters (``SchedulerInstance.status``) into totals that only
    grow, from the first sight of each shard on: a counter that went down means its shard
    restarted, and counts from 0 again."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int, int]] = {}
        self.proposed = 0
        self.bound = 0
        self.conflicted = 0

    def observe(self, shard: str, proposed: int, bound: int, conflicted: int) -> None:
        now = (proposed, bound, conflicted)
        last = self._last.get(shard)
        if last is None:
            # First sight (this dispatcher just started, or the shard did): a baseline, or a
            # dispatcher restart would count a long-running shard's whole history as one burst.
            self._last[shard] = now
            return
        if any(n < old for n, old in zip(now, last, strict=True)):
            last = (0, 0, 0)
        self.proposed += proposed - last[0]
        self.bound += bound - last[1]
        self.conflicted += conflicted - last[2]
        self._last[shard] = now


class Meter:
    """Throughput and conflict rate over a sliding window of samples of ``ShardCounters``."""

    def __init__(self, window_seconds: float) -> None:
        self.window = window_seconds
        self._samples: deque[_Sample] = deque()

    def sample(self, at: float, counters: ShardCounters) -> tuple[float, float]:
        """Record the totals at ``at``; returns (pods bound per second, conflict percent)."""
        self._samples.append(_Sample(at, counters.proposed, counters.bound, counters.conflicted))
        while len(self._samples) > 2 and self._samples[1].at <= at - self.window:
            self._samples.popleft()
        first, last = self._samples[0], self._samples[-1]
        elapsed = last.at - first.at
        throughput = (last.bound - first.bound) / elapsed if elapsed > 0 else 0.0
        proposed = last.proposed - first.proposed
        conflicts = 100.0 * (last.conflicted - first.conflicted) / proposed if proposed else 0.0
        return throughput, conflicts


class BoundClaims(Protocol):
    """The pods holding a claim (``placement.claims``), kept by someone who follows every pod
    anyway: the dispatcher's quota ledger (``QuotaLedger``), or ``PodClaims`` for a shuffler
    on its own. The allocation trigger reads their sum; the partitions' room is built from
    them when partitions first come into being, rather than from every pod at every start."""

    def bound_claimed(self, pool: str) -> Quantities:
        """What they take of ``pool`` in all."""
        ...

    def bound_claims(self) -> Iterable[tuple[str, RoomClaim]]:
        """Each pod holding a claim, with its claim."""
        ...


class PodClaims:
    """``BoundClaims`` followed from pod events (``on_pod``; from an informer's, if given),
    for a shuffler without a dispatcher's ledger (a test's, a tool's)."""

    def __init__(self, informer: Informer | None = None) -> None:
        self._claims: PoolRoom[RoomClaim] = PoolRoom()
        if informer is not None:
            informer.add_handlers(
                Handlers.of(
                    pb.Pod,
                    on_add=lambda _kind, pod: self.on_pod(pod.metadata.name, pod),
                    on_update=lambda _kind, _old, pod: self.on_pod(pod.metadata.name, pod),
                    on_delete=lambda _kind, pod: self.on_pod(pod.metadata.name, None),
                )
            )

    def on_pod(self, name: str, pod: pb.Pod | None) -> None:
        """A pod holds a claim while bound or running, as ``NodeRoom.on_pod`` counts it."""
        if pod is None or not holds_claim(pod):
            self._claims.release(name)
            return
        old = self._claims.claim_of(name)
        if old is None or old.node != pod.spec.node_name:
            self._claims.claim(name, RoomClaim.of(pod))

    def bound_claimed(self, pool: str) -> Quantities:
        return self._claims.claimed(pool)

    def bound_claims(self) -> Iterable[tuple[str, RoomClaim]]:
        return self._claims.claims_by_pod()


class Allocation:
    """Guaranteed-pool requests of the pods holding a claim against every node's allocatable:
    the allocation trigger's input. The claims are summed by whoever keeps them
    (``BoundClaims``); the capacity here, because it deliberately counts every node, ready or
    not (the room counts only the nodes new pods may use), kept per node event."""

    def __init__(self, claims: BoundClaims) -> None:
        self._claims = claims
        # Every node's allocatable cpu and memory (whatever its state), in the same accumulator.
        self._nodes: PoolRoom[RoomClaim] = PoolRoom()

    def percent(self) -> float:
        """The dominant resource's share: max over CPU and memory."""
        capacity = self._nodes.capacity(GUARANTEED)
        requested = self._claims.bound_claimed(GUARANTEED)
        shares = [
            100.0 * req / cap
            for req, cap in ((requested.cpu, capacity.cpu), (requested.mem, capacity.mem))
            if cap
        ]
        return max(shares, default=0.0)

    def on_node(self, name: str, node: pb.Node | None) -> None:
        offer = None
        if node is not None:
            alloc = node.status.allocatable
            offer = {GUARANTEED: Quantities(alloc.milli_cpu, alloc.memory_bytes)}
        self._nodes.set_node(name, offer)


class PartitionRoom:
    """Per shard and pool, the room left in its partition: the capacity its nodes offer (ready,
    schedulable) minus the requests of the pods holding a claim on them. Fragmentation aside,
    as the dispatcher's other room figures (``UnitQueue.free``): the shards judge the nodes.

    The accumulator (``placement.room.NodeRoom``) kept per node and grouped by the shard whose
    partition holds the node, rather than summed over the cluster as the queue's: per informer
    event a claim or an offer that changes moves its owner's sum by the difference, so a
    question costs O(1); ``regroup`` re-sums from the nodes, O(nodes), when the partitions
    themselves change (rare).

    Claims per node only once partitions first exist: until then nothing reads them, and
    following every pod into them was two fifths of the dispatcher's restart (100,000 bound
    pods; bench/README.md). Then they are taken from ``BoundClaims`` (no pod decoded again)
    and followed per pod event from there on, partitions on or off again."""

    def __init__(self, claims: BoundClaims, informer: Informer | None = None) -> None:
        """``informer``: whose pod events it follows once partitions exist (None: the caller
        hands them to ``on_pod``)."""
        self.room = NodeRoom()  # offers from the start (nodes are few), claims once following
        self.grouped: tuple[int, int] | None = None  # what ``regroup`` last summed
        self._claims = claims
        self._informer = informer
        self.following_pods = False

    def of(self, shard: str, pool: str) -> Quantities | None:
        """The room left in ``shard``'s partition (None: no partitions, or not its)."""
        return self.room.group_free(shard, pool)

    def regroup(self, partitions: Partitions | None, token: tuple[int, int] | None) -> None:
        """Sum the room per partition again, when ``token`` (which partitions, which version)
        differs from the last sum's; None: partitioning is off."""
        if token == self.grouped:
            return
        self.grouped = token
        if partitions is None:
            self.room.regroup(None)
        else:
            self._follow_pods()
            self.room.regroup(partitions.owner, partitions.members)

    def _follow_pods(self) -> None:
        if self.following_pods:
            return
        self.following_pods = True
        claim = self.room.claim
        for pod, held in self._claims.bound_claims():
            claim(pod, held)
        if self._informer is not None:
            # From now on; what the cache holds is in the claims just taken (between two of
            # the informer's events: each applied whole, to every handler, before we run).
            self._informer.add_handlers(
                Handlers.of(
                    pb.Pod,
                    on_add=lambda _kind, pod: self.on_pod(pod.metadata.name, pod),
                    on_update=lambda _kind, _old, pod: self.on_pod(pod.metadata.name, pod),
                    on_delete=lambda _kind, pod: self.on_pod(pod.metadata.name, None),
                ),
                replay=False,
            )

    def on_node(self, name: str, node: pb.Node | None) -> None:
        """A node's offer per pool (gone, not ready or cordoned: none)."""
        self.room.on_node(name, node)

    def on_pod(self, name: str, pod: pb.Pod | None) -> None:
        """A pod's claim: on its node while bound or running."""
        if self.following_pods:
            self.room.on_pod(name, pod)


# ---------------------------------------------------------------------------------------------
# The I/O shell
# ---------------------------------------------------------------------------------------------


class NodeShuffler:
    """Measures, turns partitioning on and off, and publishes each live shard's partition in
    its ``SchedulerInstance.spec.partition``. Construct before or after ``informer.start()``
    (kinds Pod, Node, SchedulerInstance); ``run()`` ticks every ``interval_seconds``; ``tick()``
    is public so tests can drive it."""

    def __init__(
        self,
        store: Store,
        informer: Informer,
        settings: PartitionSettings,
        *,
        shard_grace_seconds: float,
        liveness: ShardLiveness | None = None,
        bound_claims: BoundClaims | None = None,
    ) -> None:
        self.store = store
        self.informer = informer
        self.settings = settings
        self.grace_seconds = shard_grace_seconds
        # The dispatcher's judge of liveness, read by its shard loop; without one (a shuffler on
        # its own, in tests), the shuffler reads the stamps itself each tick.
        self._reads_liveness = liveness is None
        self.liveness = liveness or ShardLiveness(store, informer, shard_grace_seconds)
        # The pods' claims: the dispatcher's ledger's, or followed here.
        claims = bound_claims if bound_claims is not None else PodClaims(informer)
        # The room left per partition, for the dispatcher's shard choice.
        self.room = PartitionRoom(claims, informer)
        self.allocation = Allocation(claims)
        self.counters = ShardCounters()
        self.meter = Meter(settings.window_seconds)
        self.figures = Figures()
        self.on = False
        self.reason = ""
        self.partitions: Partitions | None = None
        self._clear_since: float | None = None
        # Node additions and deletions seen, and what the partitions were last synced with:
        # a tick with no shard or node coming or going costs no pass over the nodes.
        self._node_events = 0
        self._synced: tuple[frozenset[str], int] | None = None
        # Per shard, the partitions (generation, version) last written; a new Partitions gets a
        # new generation.
        self._generation = 0
        self._published: dict[str, tuple[int, int]] = {}
        self.writes = 0  # partitions written, for tests and logs
        # Nodes only: pods reach the room once partitions exist (``PartitionRoom``). Registering
        # delivers what the informer already holds, as adds.
        informer.add_handlers(
            Handlers.of(
                pb.Node, on_add=self._on_add, on_update=self._on_update, on_delete=self._on_delete
            )
        )

    # -- informer ------------------------------------------------------------------------------

    def _on_add(self, _kind: str, node: pb.Node) -> None:
        self._node_events += 1
        self.allocation.on_node(node.metadata.name, node)
        self.room.on_node(node.metadata.name, node)

    def _on_update(self, _kind: str, _old: pb.Node, node: pb.Node) -> None:
        self.allocation.on_node(node.metadata.name, node)
        self.room.on_node(node.metadata.name, node)

    def _on_delete(self, _kind: str, node: pb.Node) -> None:
        self._node_events += 1
        self.allocation.on_node(node.metadata.name, None)
        self.room.on_node(node.metadata.name, None)

    # -- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        await self.informer.wait_synced()
        while True:
            try:
                await self.tick()
            except StoreError as exc:
                log.warning("node shuffler tick failed", error=str(exc))
            await asyncio.sleep(self.settings.interval_seconds)

    def measure(self, now: float) -> Figures:
        for obj in self.informer.list("SchedulerInstance"):
            assert isinstance(obj, pb.SchedulerInstance)
            s = obj.status
            self.counters.observe(
                obj.metadata.name, s.proposed_pods, s.bound_pods, s.conflicted_pods
            )
        throughput, conflicts = self.meter.sample(now, self.counters)
        self.figures = Figures(self.allocation.percent(), throughput, conflicts)
        return self.figures

    def decide(self, figures: Figures, now: float) -> bool:
        """On or off, by the mode and, in ``auto``, the triggers (off only after they have been
        clear for ``off_after_seconds``)."""
        mode = self.settings.mode
        if mode != "auto":
            self.reason = f"mode {mode}"
            return mode == "on"
        fired = figures.triggers(self.settings)
        if fired:
            self._clear_since = None
            self.reason = ", ".join(fired)
            return True
        if not self.on:
            return False
        if self._clear_since is None:
            self._clear_since = now
        if now - self._clear_since >= self.settings.off_after_seconds:
            self.reason = "triggers clear"
            return False
        return True

    async def tick(self) -> None:
        now = time.monotonic()
        figures = self.measure(now)
        on = self.decide(figures, now)
        if self._reads_liveness:
            await self.liveness.read()
        if self.informer.staleness() > self.grace_seconds / 2 or not self.liveness.judging:
            # Out of touch with the store (``ShardLiveness``: it took no writes for a while, or
            # our loop was blocked), every stamp looks old: judging shards dead now would take
            # their partitions away, or clear them all, and the shards would meet on the whole
            # view until we caught up (as ``check_shards`` judges nobody meanwhile). The
            # partitions stay as published.
            return
        live = self.liveness.live()
        if on != self.on:
            log.info(
                "node partitioning " + ("on" if on else "off"),
                reason=self.reason,
                allocation_percent=round(figures.allocation_percent, 1),
                pods_per_second=round(figures.throughput),
                conflict_percent=round(figures.conflict_percent, 2),
            )
            self.on = on
        # One shard has nobody to conflict with: a partition of every node would only make its
        # record (rewritten by its status writes) as large as the cluster.
        if on and len(live) >= 2:
            synced = (frozenset(live), self._node_events)
            if self.partitions is None or synced != self._synced:
                nodes = self.informer.names("Node")
                if self.partitions is None:
                    stored = {name: list(inst.spec.partition) for name, inst in live.items()}
                    self.partitions = Partitions.seeded(stored, live, nodes)
                    self._generation += 1
                if self.partitions.sync(live, nodes):
                    log.info("partitions changed", nodes=self.partitions.sizes())
                self._synced = synced
        else:
            self.partitions = None
            self._synced = None
        parts = self.partitions
        self.room.regroup(parts, None if parts is None else (self._generation, parts.version))
        await self._publish(live)

    def _wanted(self, shard: str) -> tuple[list[str], tuple[int, int]]:
        """The shard's partition and the (generation, version) it belongs to ((0, 0): none)."""
        if self.partitions is None:
            return [], (0, 0)
        return self.partitions.of(shard), (self._generation, self.partitions.version)

    async def _publish(self, live: Mapping[str, pb.SchedulerInstance]) -> None:
        """Write the partitions that changed since last written, or whose stored copy is not
        ours (a shard registered afresh): compare-and-set on the cached copy, once more on a
        fresh one when the shard's status write won the race."""
        updates: list[pb.SchedulerInstance] = []
        tokens: dict[str, tuple[int, int]] = {}
        for shard, inst in live.items():
            nodes, token = self._wanted(shard)
            stored = inst.spec.partition
            if self._published.get(shard) == token and len(stored) == len(nodes):
                continue
            if list(stored) == nodes:  # written before (e.g. by a dispatcher before a restart)
                self._published[shard] = token
                continue
            new = pb.SchedulerInstance()
            new.CopyFrom(inst)
            del new.spec.partition[:]
            new.spec.partition.extend(nodes)
            updates.append(new)
            tokens[shard] = token
        if not updates:
            return
        results = await self.store.update_many(updates)
        # A status write won the compare-and-set: once more on a fresh copy (else the next tick).
        raced = [
            u.metadata.name
            for u, r in zip(updates, results, strict=True)
            if isinstance(r, ConflictError)
        ]
        if raced:
            retry = []
            for fresh in await self.store.get_many(pb.SchedulerInstance, raced):
                if fresh is not None:
                    del fresh.spec.partition[:]
                    fresh.spec.partition.extend(self._wanted(fresh.metadata.name)[0])
                    retry.append(fresh)
            updates += retry
            results += await self.store.update_many(retry)
        for inst, result in zip(updates, results, strict=True):
            if isinstance(result, ConflictError | NotFoundError):
                continue  # the next tick sees the newer copy (or the shard is gone)
            if isinstance(result, StoreError):
                log.warning(
                    "could not write a partition", shard=inst.metadata.name, error=str(result)
                )
                continue
            self._published[inst.metadata.name] = tokens[inst.metadata.name]
            self.writes += 1
