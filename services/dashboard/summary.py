"""The cluster at a glance, kept current from the informer's events and condensed once a tick.

:class:`ClusterTracker` is fed by informer handlers (cheap, per change) and keeps what the page
needs and the objects do not say directly: every node's requested resources per pool
(``placement.room``, kept per node), pending pods and why they wait, and binds per second with
their submit→bound latency. :meth:`summary` condenses that into one JSON-ready dict whose size
does not grow with the cluster: nodes become at most ``max_cells`` heatmap cells per pool (a cell
averages a run of nodes), pending pods become counts per reason, and movements and the time
series are bounded. On 20,000 nodes a tick is a pass over
the nodes (no pods) and a message of a few tens of kilobytes, sent only when something changed.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message

from placement import nodeinfo
from placement.claims import TERMINAL_PHASES
from placement.gpu import gpu_figures, gpu_shapes, shape_mix
from placement.nodeinfo import NodeInfo, PodRequest
from placement.quotas import DEFAULT_QUEUE
from placement.reservations import expires_ms, holds_room
from placement.resources import MILLI_PER_CARD, Quantities
from placement.room import NodeRoom, RoomClaim
from protos.godel.v1 import objects_pb2 as pb
from store.lease import holder_name
from store.nodes import Heartbeats
from store.pulse import last_beat_ms

GUARANTEED = "guaranteed"
BEST_EFFORT = "best_effort"
POOLS = (GUARANTEED, BEST_EFFORT)
# The page's pool names -> placement's.
_POOL = {GUARANTEED: nodeinfo.GUARANTEED, BEST_EFFORT: nodeinfo.BEST_EFFORT}
WAITING = "waiting to be scheduled"
"""The reason shown for a pending pod no scheduler has reported on yet."""

_LATENCY_SAMPLES_PER_SECOND = 256
_RECENT_MOVEMENTS = 10
# Reservations listed (those expiring soonest): the panel is a glance, `godel get rsv` the list.
_LISTED_RESERVATIONS = 20
_MAX_REASONS = 12


@dataclass(slots=True)
class _Second:
    """Binds observed in one wall-clock second and a sample of their latencies."""

    at: int
    bound: int = 0
    latencies_ms: list[int] = field(default_factory=list)


# A gang's phases, in the order it goes through them, as the API's manifests name them.
GANG_PHASES = {
    pb.JOB_PENDING: "Pending",
    pb.JOB_PRESCHEDULING: "PreScheduling",
    pb.JOB_SCHEDULED: "Scheduled",
    pb.JOB_RUNNING: "Running",
    pb.JOB_SUCCEEDED: "Succeeded",
    pb.JOB_FAILED: "Failed",
    pb.JOB_TIMEOUT: "Timeout",
    pb.JOB_UNSCHEDULABLE: "Unschedulable",
    pb.JOB_DELETING: "Deleting",
}


def pending_reason(pod: pb.Pod) -> str:
    """The reason a pending pod waits, as a group key: the reason most nodes gave ("insufficient
    cpu") in the shard's diagnosis (``status.unschedulable``, counts as data), else the
    condition's own message."""
    for condition in pod.status.conditions:
        if condition.type == "PodScheduled" and condition.status == "False":
            reasons = pod.status.unschedulable.reasons
            if reasons:
                return str(max(reasons, key=lambda r: r.nodes).reason)
            return condition.message or condition.reason or WAITING
    return WAITING


def heatmap(values: list[float], max_cells: int) -> tuple[list[int], int]:
    """Utilisations (0..1, or -1 for a node without capacity in the pool) as at most
    ``max_cells`` percentages, each the mean of a run of nodes (-1: none of them has capacity);
    also the number of nodes per cell."""
    if not values:
        return [], 1
    per_cell = math.ceil(len(values) / max_cells)
    cells: list[int] = []
    for start in range(0, len(values), per_cell):
        run = [v for v in values[start : start + per_cell] if v >= 0]
        cells.append(round(100 * sum(run) / len(run)) if run else -1)
    return cells, per_cell


def percentile(sorted_values: list[int], q: float) -> int | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class _DefaultQueue:
    """The default queue's figures, counted from its pods. Jobs that name no queue go there, and
    no Queue object need exist for it — nor, then, a status that the dispatcher writes — so the
    page counts what its pods hold and how many of them wait, as ``Queue.status`` would."""

    def __init__(self) -> None:
        self._held: dict[str, Quantities] = {}  # pod -> its requests, while it holds a claim
        self._used = Quantities()
        self._waiting: dict[str, str] = {}  # pending pod -> its job
        self._jobs: Counter[str] = Counter()  # job -> its pending pods

    @staticmethod
    def has(pod: pb.Pod) -> bool:
        return pod.spec.queue in ("", DEFAULT_QUEUE)

    def holds(self, name: str, requests: Quantities) -> None:
        self._held[name] = requests
        self._used.add(requests)

    def waits(self, name: str, job: str) -> None:
        self._waiting[name] = job
        self._jobs[job] += 1

    def forget(self, name: str) -> None:
        held = self._held.pop(name, None)
        if held is not None:
            self._used.add(held, -1)
        job = self._waiting.pop(name, None)
        if job is not None:
            self._jobs[job] -= 1
            if not self._jobs[job]:
                del self._jobs[job]

    def status(self) -> pb.QueueStatus:
        return pb.QueueStatus(
            used=self._used.as_resources(),
            pending_pods=len(self._waiting),
            pending_units=len(self._jobs),
        )


class ClusterTracker:
    """Informer handlers for Node and Pod, and the summary the dashboard sends."""

    def __init__(self, *, window_seconds: int = 300, max_cells: int = 2048) -> None:
        self.window_seconds = window_seconds
        self.max_cells = max_cells
        self.nodes: dict[str, pb.Node] = {}
        # Per node, read once per change rather than from the protobuf on every tick (a tick
        # over 20,000 nodes must stay a few tens of milliseconds): ready. Node names sorted,
        # until a node comes or goes.
        self._ready: dict[str, bool] = {}
        self._order: list[str] | None = None
        # Per node and pool, its capacity (CPU and memory) and what the pods holding a claim
        # there request: the room accumulator kept per node (the page shows nodes), offered by
        # every node, ready or not (a node's utilisation is shown whatever its state).
        self._room = NodeRoom()
        # Per node, its utilisation per pool (POOLS order), kept current as claims change.
        self._utilisation: dict[str, tuple[float, float]] = {}
        self._pending: dict[str, str] = {}  # pod -> reason
        self._phases: Counter[int] = Counter()
        self._pod_phase: dict[str, int] = {}
        self._seconds: deque[_Second] = deque()
        self._default_queue = _DefaultQueue()
        # Per pod holding GPU cards: its node and the cards the Binder gave it; per node with
        # cards: their model and count (so a tick passes over GPU nodes only, as tuples).
        self._gpu_holders: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._gpu_nodes: dict[str, tuple[str, int]] = {}
        # Per pod holding a claim on a GPU node or asking GPUs: its node and request, what the
        # GPU fragmentation is measured from; the last figures, None once something changed.
        self._gpu_pods: dict[str, tuple[str, PodRequest]] = {}
        self._gpu_figures: dict[str, Any] | None = None
        # Gangs (jobs of min_member > 1: their status is stored) by phase.
        self._gang_phase: dict[str, int] = {}
        self._gangs: Counter[int] = Counter()

    # --- informer handlers ----------------------------------------------------------------

    def on_add(self, kind: str, obj: Message) -> None:
        self._changed(kind, None, obj)

    def on_update(self, kind: str, old: Message, new: Message) -> None:
        self._changed(kind, old, new)

    def on_delete(self, kind: str, obj: Message) -> None:
        self._changed(kind, obj, None)

    def _changed(self, kind: str, old: Message | None, new: Message | None) -> None:
        if kind == "Node":
            if isinstance(new, pb.Node):
                name = new.metadata.name
                if name not in self.nodes:
                    self._order = None
                self.nodes[name] = new
                g, be = new.status.allocatable, new.status.reclaimable
                self._ready[name] = new.status.ready
                if new.status.allocatable.gpus:
                    model = new.status.gpu_model or "unknown"
                    self._gpu_nodes[name] = (model, new.status.allocatable.gpus)
                    self._gpu_figures = None
                elif self._gpu_nodes.pop(name, None) is not None:
                    self._gpu_figures = None
                self._room.set_node(
                    name,
                    {
                        nodeinfo.GUARANTEED: Quantities(g.milli_cpu, g.memory_bytes),
                        nodeinfo.BEST_EFFORT: Quantities(be.milli_cpu, be.memory_bytes),
                    },
                )
                self._update_utilisation(name)
            elif isinstance(old, pb.Node):
                self.nodes.pop(old.metadata.name, None)
                self._ready.pop(old.metadata.name, None)
                if self._gpu_nodes.pop(old.metadata.name, None) is not None:
                    self._gpu_figures = None
                self._room.set_node(old.metadata.name, None)
                self._utilisation.pop(old.metadata.name, None)
                self._order = None
        elif kind == "Job":
            job = new if isinstance(new, pb.Job) else old
            if isinstance(job, pb.Job):
                self._gang_changed(job.metadata.name, new if isinstance(new, pb.Job) else None)
        elif kind == "Pod":
            self._pod_changed(
                old if isinstance(old, pb.Pod) else None, new if isinstance(new, pb.Pod) else None
            )

    def _gang_changed(self, name: str, job: pb.Job | None) -> None:
        if (phase := self._gang_phase.pop(name, None)) is not None:
            self._gangs[phase] -= 1
        if job is None or (job.spec.min_member or job.spec.replicas) <= 1:
            return
        phase = job.status.phase or pb.JOB_PENDING
        self._gang_phase[name] = phase
        self._gangs[phase] += 1

    def _pod_changed(self, old: pb.Pod | None, new: pb.Pod | None) -> None:
        changed = new or old
        if changed is None:  # neither is a pod
            return
        name = changed.metadata.name
        self._release(name)
        self._pending.pop(name, None)
        self._default_queue.forget(name)
        if (phase := self._pod_phase.pop(name, None)) is not None:
            self._phases[phase] -= 1
        if new is None:
            return
        self._pod_phase[name] = new.status.phase
        self._phases[new.status.phase] += 1
        if new.spec.node_name:
            # Its own rule, kept from before ``placement.claims``: a pod on a node counts until
            # it finishes (a bound pod is BOUND or RUNNING, so the two agree in practice).
            if new.status.phase not in TERMINAL_PHASES:
                self._claim(name, new)
            if old is not None and not old.spec.node_name:
                self._record_bind(new)
        elif new.status.phase == pb.POD_PENDING:
            self._pending[name] = pending_reason(new)
            if _DefaultQueue.has(new):
                self._default_queue.waits(name, new.spec.job)

    def _claim(self, name: str, pod: pb.Pod) -> None:
        if pod.spec.gpu_cards:
            self._gpu_holders[name] = (pod.spec.node_name, tuple(pod.spec.gpu_cards))
        if pod.spec.template.requests.gpus or pod.spec.node_name in self._gpu_nodes:
            self._gpu_pods[name] = (pod.spec.node_name, PodRequest.from_pod(pod))
            self._gpu_figures = None
        claim = RoomClaim.of(pod)
        self._room.claim(name, claim)
        self._update_utilisation(claim.node)
        if _DefaultQueue.has(pod):
            self._default_queue.holds(name, claim.requests)

    def _release(self, name: str) -> None:
        self._gpu_holders.pop(name, None)
        if self._gpu_pods.pop(name, None) is not None:
            self._gpu_figures = None
        claim = self._room.release(name)
        if claim is not None:
            self._update_utilisation(claim.node)

    def _record_bind(self, pod: pb.Pod) -> None:
        now = int(time.time())
        if not self._seconds or self._seconds[-1].at != now:
            self._seconds.append(_Second(now))
            while self._seconds and self._seconds[0].at <= now - self.window_seconds:
                self._seconds.popleft()
        second = self._seconds[-1]
        second.bound += 1
        if len(second.latencies_ms) < _LATENCY_SAMPLES_PER_SECOND:
            bound_ms = pod.status.bound_ms or int(time.time() * 1000)
            second.latencies_ms.append(max(bound_ms - pod.metadata.creation_timestamp_ms, 0))

    # --- the summary ----------------------------------------------------------------------

    def _update_utilisation(self, node: str) -> None:
        if node in self._ready:  # a pod may name a node this view has not seen (yet)
            self._utilisation[node] = (
                self.utilisation(node, GUARANTEED),
                self.utilisation(node, BEST_EFFORT),
            )

    def utilisation(self, node: str, pool: str) -> float:
        """The dominant share (CPU or memory) of the pool requested by pods holding claims; -1
        when the node has no capacity in the pool."""
        offer = self._room.node_offer(node, _POOL[pool])
        if offer is None:
            raise KeyError(node)
        cpu_cap, mem_cap = offer.cpu, offer.mem
        used = self._room.node_claimed(node, _POOL[pool])
        if used is None:
            return 0.0 if cpu_cap > 0 or mem_cap > 0 else -1.0
        shares = [u / c for u, c in ((used.cpu, cpu_cap), (used.mem, mem_cap)) if c > 0]
        return min(max(shares), 1.0) if shares else -1.0

    def node_summary(self) -> dict[str, Any]:
        if self._order is None:
            self._order = sorted(self._ready)
        order = self._order
        pools: dict[str, Any] = {}
        utilisation = self._utilisation
        for index, pool in enumerate(POOLS):
            values = [utilisation[name][index] for name in order]
            cells, per_cell = heatmap(values, self.max_cells)
            measured = [v for v in values if v >= 0]
            pools[pool] = {
                "cells": cells,
                "nodes_per_cell": per_cell,
                "mean_percent": round(100 * sum(measured) / len(measured)) if measured else None,
                "busy_nodes": sum(1 for v in measured if v > 0),
            }
        return {
            "total": len(order),
            "ready": sum(1 for ready in self._ready.values() if ready),
            "pools": pools,
        }

    def gpu_summary(self) -> list[dict[str, Any]]:
        """Per GPU model (most cards first): its nodes, cards, and cards some unfinished pod
        holds (wholly or a share of it)."""
        held: dict[str, set[int]] = {}
        for holder_node, holder_cards in self._gpu_holders.values():
            held.setdefault(holder_node, set()).update(holder_cards)
        models: dict[str, dict[str, Any]] = {}
        for name, (model, cards) in self._gpu_nodes.items():
            row = models.setdefault(model, {"model": model, "nodes": 0, "cards": 0, "used": 0})
            row["nodes"] += 1
            row["cards"] += cards
            row["used"] += sum(1 for c in held.get(name, ()) if c < cards)
        return sorted(models.values(), key=lambda r: (-r["cards"], r["model"]))

    def gpu_fragmentation(self) -> dict[str, Any]:
        """The GPU nodes' fragmentation as the rescheduler measures it (``placement.gpu``'s
        figures over the running pods' GPU shapes; reservations' holds aside): expected and
        whole-machine fragmentation in percent of free GPU, whole free GPU nodes, free GPUs.
        Recomputed only after a GPU node or a pod on one changed (a pass over those)."""
        if self._gpu_figures is None:
            infos = {name: NodeInfo.from_node(self.nodes[name]) for name in self._gpu_nodes}
            for node, req in self._gpu_pods.values():
                info = infos.get(node)
                if info is not None:
                    info.add_pod(req)
            mix = shape_mix(gpu_shapes(req for _, req in self._gpu_pods.values()))
            figures = gpu_figures(infos.values(), mix)
            self._gpu_figures = {
                "expected_percent": round(100 * figures.expected_fragmentation, 1),
                "fragmentation_percent": round(100 * figures.fragmentation, 1),
                "whole_free_nodes": figures.whole_free_nodes,
                "free_gpus": round(figures.free_milli / MILLI_PER_CARD, 1),
            }
        return self._gpu_figures

    def pod_summary(self) -> dict[str, int]:
        return {
            "pending": self._phases[pb.POD_PENDING],
            "bound": self._phases[pb.POD_BOUND],
            "running": self._phases[pb.POD_RUNNING],
            "succeeded": self._phases[pb.POD_SUCCEEDED],
            "failed": self._phases[pb.POD_FAILED],
        }

    def gang_summary(self) -> list[dict[str, Any]]:
        """Gangs per phase, in the order a gang goes through them (PreScheduling and Timeout
        named as the API names them); phases without a gang left out."""
        return [
            {"phase": word, "jobs": self._gangs[phase]}
            for phase, word in GANG_PHASES.items()
            if self._gangs[phase] > 0
        ]

    def default_queue_status(self) -> pb.QueueStatus:
        """The default queue's status as its pods show it (see :func:`queue_summary`)."""
        return self._default_queue.status()

    def pending_reasons(self) -> list[dict[str, Any]]:
        counts = Counter(self._pending.values())
        return [{"reason": r, "pods": n} for r, n in counts.most_common(_MAX_REASONS)]

    def throughput(self, now: float | None = None) -> dict[str, Any]:
        """The window, one value per second, oldest first, as columns (compact in JSON): pods
        bound, and their submit→bound latency p50 / p99 in ms (None for a second without
        binds)."""
        end = int(now if now is not None else time.time())
        start = end - self.window_seconds + 1
        by_second = {s.at: s for s in self._seconds}
        bound: list[int] = []
        p50: list[int | None] = []
        p99: list[int | None] = []
        for at in range(start, end + 1):
            second = by_second.get(at)
            latencies = sorted(second.latencies_ms) if second else []
            bound.append(second.bound if second else 0)
            p50.append(percentile(latencies, 0.5))
            p99.append(percentile(latencies, 0.99))
        return {"start": start, "bound": bound, "p50_ms": p50, "p99_ms": p99}


def queue_summary(
    queues: Iterable[pb.Queue], default_status: pb.QueueStatus | None = None
) -> list[dict[str, Any]]:
    """A row per queue, by name. The default queue is listed even when no Queue object is
    stored for it (jobs naming no queue go there): without quota, with ``default_status``
    (:meth:`ClusterTracker.default_queue_status`)."""
    by_name = {q.metadata.name: q for q in queues}
    if DEFAULT_QUEUE not in by_name:
        by_name[DEFAULT_QUEUE] = pb.Queue(
            metadata=pb.ObjectMeta(name=DEFAULT_QUEUE), status=default_status
        )
    rows = []
    for _, queue in sorted(by_name.items()):
        quota, used = queue.spec.quota, queue.status.used
        rows.append(
            {
                "name": queue.metadata.name,
                "quota": _resources(quota) if queue.spec.HasField("quota") else None,
                "used": _resources(used),
                "pending_pods": queue.status.pending_pods,
                "pending_units": queue.status.pending_units,
            }
        )
    return rows


def shard_summary(
    shards: Iterable[pb.SchedulerInstance], beats: Heartbeats
) -> list[dict[str, Any]]:
    """One row per shard; its heartbeat's age from its liveness stamp (``store.pulse``), in the
    store server's clock."""
    rows = []
    for shard in sorted(shards, key=lambda s: s.metadata.name):
        last = last_beat_ms(beats, shard.metadata.name, shard.status.heartbeat_ms)
        rows.append(
            {
                "name": shard.metadata.name,
                "address": shard.spec.address,
                "ready": shard.status.ready,
                "heartbeat_age_s": round(max(beats.now_ms - last, 0) / 1000, 1),
                "undecided_pods": shard.status.undecided_pods,
            }
        )
    return rows


def movement_summary(movements: Iterable[pb.Movement]) -> list[dict[str, Any]]:
    recent = sorted(
        movements,
        key=lambda m: (m.metadata.creation_timestamp_ms, m.metadata.name),
        reverse=True,
    )[:_RECENT_MOVEMENTS]
    rows = []
    for movement in recent:
        rows.append(
            {
                "name": movement.metadata.name,
                "policy": movement.spec.policy,
                "batch": movement.spec.batch,
                "phase": movement.status.phase,
                "pods": len(movement.spec.deleted_tasks),
                "created_ms": movement.metadata.creation_timestamp_ms,
                "message": movement.status.message,
            }
        )
    return rows


def reservation_summary(reservations: Iterable[pb.Reservation]) -> dict[str, Any]:
    """How many reservations live and what room they hold (cpu, memory), and the ones expiring
    soonest: where, for whom, until when."""
    live = list(reservations)
    held = Quantities()
    for rsv in live:
        if holds_room(rsv):
            held.add(Quantities.of_pod_request(rsv.spec.template))
    soonest = sorted(live, key=lambda r: (expires_ms(r), r.metadata.name))[:_LISTED_RESERVATIONS]
    rows = []
    for rsv in soonest:
        owner = rsv.spec.owner
        whose = owner.selector or f"job={owner.job}" + (
            f"/{owner.index}" if owner.HasField("index") else ""
        )
        rows.append(
            {
                "name": rsv.metadata.name,
                "node": rsv.status.node,
                "owner": whose,
                "milli_cpu": rsv.spec.template.requests.milli_cpu,
                "memory_bytes": rsv.spec.template.requests.memory_bytes,
                "expires_ms": expires_ms(rsv),
            }
        )
    return {"count": len(live), "milli_cpu": held.cpu, "memory_bytes": held.mem, "soonest": rows}


def lease_summary(lease: pb.Lease | None) -> dict[str, Any]:
    if lease is None or not lease.holder:
        return {"leader": None, "address": None, "epoch": lease.epoch if lease else 0}
    return {
        "leader": holder_name(lease.holder),
        "address": lease.holder_address,
        "epoch": lease.epoch,
    }


def _resources(r: pb.Resources) -> dict[str, int]:
    return {
        "milli_cpu": r.milli_cpu,
        "memory_bytes": r.memory_bytes,
        "gpus": r.gpus,
        "pods": r.pods,
    }
