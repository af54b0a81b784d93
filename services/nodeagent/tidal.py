"""Tidal best-effort capacity: a node's reclaimable pool follows what its guaranteed (online)
pods actually use, and best-effort pods give way when the tide of online load comes in.

Online services are provisioned for their peak but use far less most of the day; Gödel's
unified pool lends the difference to offline work. Each tick the agent works out, per node:

    online usage = what the node's guaranteed pods use now
                   (hollow: their requests × the usage curve's percent at this time of day;
                    process: the measured CPU and memory of their processes)
    reclaimable  = max(0, allocatable - online usage - reserve)

and writes the pool onto the Node when it moved by at least ``min_change_percent`` of the node
(or shrank below what best-effort pods hold): shards and the Binder then place best-effort pods
against it. When best-effort pods hold more than the new pool, the lowest-priority ones (newest
first among equals) are evicted until the rest fit — the agent asks, the Binder evicts, through
the one eviction path (reason ``Reclaimed``; their jobs get replacements, placed elsewhere).
Guaranteed pods are never touched.

The curve and the pool are plain functions; :class:`TidalController` is the loop.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import psutil
import structlog
from google.protobuf.message import Message

from placement.claims import holds_claim
from placement.nodeinfo import BEST_EFFORT, GUARANTEED
from placement.resources import Quantities
from placement.room import NodeRoom, RoomClaim
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.eviction import RECLAIMED
from services.nodeagent.nodes import PROCESS
from services.peers.binder import BinderEvictor, EvictError
from store import Store
from store.errors import ConflictError, StoreError
from store.informer import Handlers

log = structlog.get_logger(__name__)

DAY_SECONDS = 86_400


# ---------------------------------------------------------------------------------------------
# The curve
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UsageCurve:
    """A daily curve of online usage: the percent of their requests that guaranteed pods use,
    linear between points given as ``hour=percent`` (``"0=20,9=70,14=95,22=30"``), wrapping
    from the last point of the day to the first. ``period_seconds`` compresses the day (a
    bench or a test plays a day in a minute)."""

    points: tuple[tuple[float, float], ...]  # (hour in [0, 24), percent), by hour
    period_seconds: float = DAY_SECONDS

    @classmethod
    def parse(cls, text: str, period_seconds: float = DAY_SECONDS) -> UsageCurve:
        if not period_seconds > 0:
            raise ValueError(f"period {period_seconds!r}: must be above 0 seconds")
        points: dict[float, float] = {}
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            hour_text, sep, percent_text = part.partition("=")
            try:
                if not sep:
                    raise ValueError
                hour, percent = float(hour_text), float(percent_text)
            except ValueError:
                raise ValueError(f"{part!r}: expected hour=percent, e.g. 14=90") from None
            if not (0 <= hour < 24 and math.isfinite(hour)):
                raise ValueError(f"{part!r}: the hour must be within 0..24")
            if not (0 <= percent <= 100):
                raise ValueError(f"{part!r}: the percent must be within 0..100")
            if hour in points:
                raise ValueError(f"{part!r}: hour {hour:g} given twice")
            points[hour] = percent
        if not points:
            raise ValueError("no points: expected hour=percent pairs, e.g. '0=20,14=90'")
        return cls(tuple(sorted(points.items())), period_seconds)

    def percent_at(self, unix_seconds: float) -> float:
        hour = (unix_seconds % self.period_seconds) / self.period_seconds * 24
        points = self.points
        if len(points) == 1:
            return points[0][1]
        # The points around ``hour``, wrapping over midnight.
        before = points[-1][0] - 24, points[-1][1]
        for h, p in points:
            if h > hour:
                after = (h, p)
                break
            before = (h, p)
        else:
            after = points[0][0] + 24, points[0][1]
        (h0, p0), (h1, p1) = before, after
        return p0 + (p1 - p0) * (hour - h0) / (h1 - h0)


# ---------------------------------------------------------------------------------------------
# The pool and who gives way
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Usage:
    milli_cpu: int = 0
    memory_bytes: int = 0


def held_usage(held: Quantities | None, percent: float) -> Usage:
    """What simulated online pods holding ``held`` (their requests summed) use: ``percent`` of
    it, as ``hollow_usage`` counts them one by one."""
    if held is None:
        return Usage()
    return Usage(int(held.cpu * percent / 100), int(held.mem * percent / 100))


def hollow_usage(guaranteed: Iterable[pb.Pod], percent: float) -> Usage:
    """What simulated online pods use: ``percent`` of their requests."""
    cpu = mem = 0
    for pod in guaranteed:
        r = pod.spec.template.requests
        cpu += r.milli_cpu
        mem += r.memory_bytes
    return Usage(int(cpu * percent / 100), int(mem * percent / 100))


class ProcessUsage:
    """What the processes of guaranteed pods on a process node use, measured (CPU over the
    time since the last measurement, resident memory), their children included. A pod without
    a process (simulated on a process node) counts as a hollow one."""

    def __init__(self, pid_of: Callable[[str], int | None]) -> None:
        self.pid_of = pid_of
        self._procs: dict[int, psutil.Process] = {}

    def __call__(self, guaranteed: Iterable[pb.Pod], percent: float) -> Usage:
        cpu = mem = 0
        simulated: list[pb.Pod] = []
        live: set[int] = set()
        for pod in guaranteed:
            pid = self.pid_of(pod.metadata.name)
            if pid is None:
                simulated.append(pod)
                continue
            try:
                root = self._procs.get(pid) or psutil.Process(pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue  # ended meanwhile
            for found in tree:
                # The same Process object across calls: cpu_percent measures since the last.
                proc = self._procs.setdefault(found.pid, found)
                live.add(proc.pid)
                try:
                    with proc.oneshot():
                        cpu += int(proc.cpu_percent(None) * 10)  # 100 % of a core = 1000 milli
                        mem += proc.memory_info().rss
                except psutil.Error:
                    continue
        for pid in set(self._procs) - live:
            del self._procs[pid]
        rest = hollow_usage(simulated, percent)
        return Usage(cpu + rest.milli_cpu, mem + rest.memory_bytes)


def reclaimable_pool(
    allocatable: pb.Resources, usage: Usage, reserve_percent: int, gpus: int
) -> pb.Resources:
    """What best-effort pods may hold on a node whose online pods use ``usage``: the rest of
    the node less a reserve (headroom for online bursts), never below zero."""
    cpu = allocatable.milli_cpu * (100 - reserve_percent) // 100 - usage.milli_cpu
    mem = allocatable.memory_bytes * (100 - reserve_percent) // 100 - usage.memory_bytes
    return pb.Resources(milli_cpu=max(0, cpu), memory_bytes=max(0, mem), gpus=gpus)


def pressure_victims(best_effort: Sequence[pb.Pod], pool: pb.Resources) -> list[pb.Pod]:
    """The best-effort pods to evict so the rest fit ``pool``: lowest priority first, the most
    recently started first among equals (it has lost the least work), until what remains fits
    in CPU and memory."""
    cpu = sum(p.spec.template.requests.milli_cpu for p in best_effort)
    mem = sum(p.spec.template.requests.memory_bytes for p in best_effort)
    victims: list[pb.Pod] = []
    order = sorted(
        best_effort,
        key=lambda p: (p.spec.priority, -p.status.started_ms, p.metadata.name),
    )
    for pod in order:
        if cpu <= pool.milli_cpu and mem <= pool.memory_bytes:
            break
        victims.append(pod)
        cpu -= pod.spec.template.requests.milli_cpu
        mem -= pod.spec.template.requests.memory_bytes
    return victims


def pool_moved(old: pb.Resources, new: pb.Resources, node: pb.Resources, percent: int) -> bool:
    """Whether the pool changed by at least ``percent`` of the node in CPU or memory."""
    return (
        abs(old.milli_cpu - new.milli_cpu) * 100 >= percent * max(1, node.milli_cpu)
        or abs(old.memory_bytes - new.memory_bytes) * 100 >= percent * max(1, node.memory_bytes)
        or old.gpus != new.gpus
    )


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TidalSettings:
    interval_seconds: float = 2.0
    reserve_percent: int = 10
    min_change_percent: int = 2


def gives_way(pod: pb.Pod) -> bool:
    """Whether the tide counts the pod on its node: it holds a claim there and is not already
    being deleted (its room is on its way back; it is not evicted again)."""
    return holds_claim(pod) and not pod.metadata.deletion_timestamp_ms


class TidalController:
    """Once per interval: each node's pool from its online usage, written where it moved, and
    best-effort pods over the pool evicted (one partial ``Binder.Evict`` for every node).

    What the pods hold per node and pool is the room accumulator (``placement.room``, kept per
    node: the tide judges each node's reclaimable pool on its own), fed by ``handlers()``
    per informer event: a hollow node's online usage is its guaranteed pods' sum from it. The
    agent keeps no bytes of a hollow pod, so a tick reads whole pods only where it chooses
    among them: the process node's (``pods``: whose process to measure) and, on a node whose
    best-effort pods hold more than its new pool, those pods (one ``get_many`` a tick, whom to
    evict)."""

    def __init__(
        self,
        store: Store,
        nodes: Mapping[str, pb.Node],
        pods: Callable[[], Iterable[pb.Pod]],
        usage: Callable[[str, list[pb.Pod], float], Usage],
        curve: UsageCurve | None,
        evictor: BinderEvictor,
        settings: TidalSettings,
    ) -> None:
        self.store = store
        self.nodes = nodes  # this agent's nodes as registered (their allocatable)
        # The pods bound to this agent's nodes whose bytes it keeps (the process node's): what
        # ``usage`` measures on a process node.
        self.pods = pods
        self.usage = usage  # (process node, its guaranteed pods, curve percent) -> usage
        self.curve = curve
        self.evictor = evictor
        self.settings = settings
        self.pools: dict[str, pb.Resources] = {}  # last pool written per node
        self.evicted = 0  # for tests and metrics
        # Per node and pool, what the pods the tide counts (``gives_way``) request. No node
        # offers: the pool is what this loop computes.
        self.held = NodeRoom()
        # The string to key a pod by, equal to its name: the runner's (``PodRunner.name_of``),
        # so the agent holds one string per pod, not one here too.
        self.name_of: Callable[[str], str] = lambda name: name

    def handlers(self) -> Handlers:
        """Informer handlers (kind Pod) that keep ``held``: register them on the informer
        ``pods`` reads."""
        return Handlers(
            lambda _kind, pod: self.on_pod(pod),
            lambda _kind, _old, pod: self.on_pod(pod),
            lambda _kind, pod: self.on_pod(pod, gone=True),
            frozenset({"Pod"}),
        )

    def on_pod(self, pod: Message, *, gone: bool = False) -> None:
        """A pod added or changed (``gone``: deleted): its claim on its node, if the tide
        counts it."""
        if not isinstance(pod, pb.Pod):
            return
        name = pod.metadata.name
        if gone or not gives_way(pod):
            self.held.release(name)
            return
        old = self.held.claim_of(name)
        if old is None or old.node != pod.spec.node_name:
            self.held.claim(self.name_of(name), RoomClaim.of(pod))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.interval_seconds)
            try:
                await self.tick()
            except (StoreError, EvictError) as exc:
                log.warning("tidal tick failed; trying again next tick", error=str(exc))

    async def tick(self, now: float | None = None) -> None:
        # Without a curve, simulated online pods use all they requested.
        percent = (
            self.curve.percent_at(time.time() if now is None else now) if self.curve else 100.0
        )
        guaranteed: dict[str, list[pb.Pod]] = {}
        for pod in self.pods():
            if gives_way(pod) and pod.spec.qos != pb.QOS_BEST_EFFORT:
                guaranteed.setdefault(pod.spec.node_name, []).append(pod)
        pools: dict[str, pb.Resources] = {}
        for name, node in self.nodes.items():
            if node.spec.mode == PROCESS:
                usage = self.usage(name, guaranteed.get(name, []), percent)
            else:
                usage = held_usage(self.held.node_claimed(name, GUARANTEED), percent)
            pools[name] = reclaimable_pool(
                node.status.allocatable,
                usage,
                self.settings.reserve_percent,
                node.status.reclaimable.gpus,
            )
        await self._write_pools(pools)
        best_effort = await self._best_effort_over(pools)
        victims = [
            v
            for name, pool in pools.items()
            for v in pressure_victims(best_effort.get(name, []), pool)
        ]
        if victims:
            await self._evict(victims)

    async def _best_effort_over(self, pools: Mapping[str, pb.Resources]) -> dict[str, list[pb.Pod]]:
        """The best-effort pods the tide counts on each node whose best-effort pods hold more
        than its pool, as stored (one read of them all; none when no node is over)."""
        over: set[str] = set()
        for name, pool in pools.items():
            held = self.held.node_claimed(name, BEST_EFFORT)
            if held is not None and (held.cpu > pool.milli_cpu or held.mem > pool.memory_bytes):
                over.add(name)
        if not over:
            return {}
        names = [
            pod
            for pod, claim in self.held.claims_by_pod()
            if claim.pool == BEST_EFFORT and claim.node in over
        ]
        out: dict[str, list[pb.Pod]] = {}
        for pod in await self.store.get_many(pb.Pod, names):
            if (
                pod is not None
                and pod.spec.node_name in over
                and pod.spec.qos == pb.QOS_BEST_EFFORT
                and gives_way(pod)
            ):
                out.setdefault(pod.spec.node_name, []).append(pod)
        return out

    async def _write_pools(self, pools: dict[str, pb.Resources]) -> None:
        """Write the pools that moved enough, or that shrank below what best-effort pods hold
        (the shards must stop adding to those at once). One read and one write round trip."""
        changed = []
        for name, pool in pools.items():
            last = self.pools.get(name)
            held = self.held.node_claimed(name, BEST_EFFORT)
            held_cpu = held.cpu if held is not None else 0
            if (
                last is None
                or pool_moved(
                    last,
                    pool,
                    self.nodes[name].status.allocatable,
                    self.settings.min_change_percent,
                )
                or (held_cpu > pool.milli_cpu and last != pool)
            ):
                changed.append(name)
        if not changed:
            return
        stored = await self.store.get_many(pb.Node, changed)
        updates = []
        for node in stored:
            if node is None:
                continue  # deleted behind our back: the heartbeat registers it again
            pool = pools[node.metadata.name]
            if node.status.reclaimable != pool:
                node.status.reclaimable.CopyFrom(pool)
                updates.append(node)
            else:
                self.pools[node.metadata.name] = pool
        results = await self.store.update_many(updates) if updates else []
        for node, result in zip(updates, results, strict=True):
            if isinstance(result, ConflictError):
                continue  # someone else wrote the node meanwhile: next tick reads it again
            if isinstance(result, StoreError):
                raise result
            self.pools[node.metadata.name] = node.status.reclaimable
        if updates:
            log.info("reclaimable pools updated", nodes=len(updates))

    async def _evict(self, victims: list[pb.Pod]) -> None:
        request = ipb.EvictRequest(
            reason=RECLAIMED,
            message="online usage rose: the node's reclaimable pool shrank below its "
            "best-effort pods",
            partial=True,
        )
        for pod in victims:
            request.pods.add(name=pod.metadata.name, uid=pod.metadata.uid)
        response = await self.evictor.evict(request)
        evicted = [r.pod for r in response.results if r.outcome == ipb.EvictResult.EVICTED]
        refused = {
            r.pod: r.reason for r in response.results if r.outcome == ipb.EvictResult.REFUSED
        }
        self.evicted += len(evicted)
        log.info(
            "best-effort pods evicted under online pressure",
            evicted=len(evicted),
            refused=len(refused),
            nodes=len({p.spec.node_name for p in victims}),
            first_refusal=next(iter(refused.items()), None),
        )
