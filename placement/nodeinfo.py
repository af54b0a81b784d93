"""NodeInfo: the compact per-node state that scheduling decisions read, and the one
implementation of "do this pod's requests fit this node" shared by the scheduler shards (against
their snapshot) and the Binder (against the authoritative state).

Plain synchronous code over integers: it runs once per candidate node per pod. A pod's amounts
are the one resource vector (``placement.resources.Quantities``, ``PodRequest.requests``); a
node's capacity and requested amounts per pool stay int lists [milli-CPU, bytes, GPUs], which
the loops index. GPUs are milli-GPU (1000 per card) in both, and per card in ``card_used``
(``placement.gpu``, the one home of that accounting).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from foundation.frozen import positional_maker
from placement.labelselector import PodTerm, pod_term
from placement.resources import MILLI_PER_CARD, Quantities, request_milli, shared_amounts
from protos.godel.v1 import objects_pb2 as pb

GUARANTEED = "g"
BEST_EFFORT = "be"
POOLS = (GUARANTEED, BEST_EFFORT)

# Reasons, worded as kube-scheduler words them, so `godel explain` reads familiarly.
INSUFFICIENT_CPU = "insufficient cpu"
INSUFFICIENT_MEMORY = "insufficient memory"
INSUFFICIENT_GPUS = "insufficient gpus"
TOO_MANY_PODS = "too many pods"
PORTS_IN_USE = "host port in use"


_NO_LABELS: Mapping[str, str] = {}


@functools.lru_cache(maxsize=4096)
def _label_set(items: frozenset[tuple[str, str]]) -> Mapping[str, str]:
    # Interned: the same keys and values across label sets are one string each. (Interned
    # strings are freed when unused, except in the 3.12 releases before gh-113993's fix.)
    return {sys.intern(k): sys.intern(v) for k, v in items}


def shared_labels(labels: Mapping[str, str]) -> Mapping[str, str]:
    """``labels`` as a read-only mapping shared by every pod with the same labels (a job's pods
    carry its template's): one dict per label set instead of one per pod, which was a third of
    a shard's memory per bound pod. Never mutate the result."""
    return _label_set(frozenset(labels.items()))


def pool_of(qos: int) -> str:
    """The pool a pod draws from: the node's reclaimable capacity for best-effort pods, its
    guaranteed (allocatable) capacity for every other QoS. The one home of this rule: the store's
    node accounting, the shards, the Binder and the dispatcher all ask here."""
    return BEST_EFFORT if qos == pb.QOS_BEST_EFFORT else GUARANTEED


POOL_NAMES = {GUARANTEED: "guaranteed", BEST_EFFORT: "best-effort"}


def pool_capacity(node: pb.Node, pool: str) -> pb.Resources:
    """What the node offers to pods of ``pool``."""
    return node.status.reclaimable if pool == BEST_EFFORT else node.status.allocatable


# NUMA policies that bind a pod to NUMA nodes (pb.NumaPolicy); others take the node's pool only.
NUMA_SINGLE = pb.NUMA_POLICY_SINGLE
NUMA_EXCLUSIVE = pb.NUMA_POLICY_EXCLUSIVE


def numa_policy_of(pod: pb.Pod) -> int:
    """The pod's NUMA binding: SINGLE, EXCLUSIVE or 0 (none). Best-effort pods live on the
    reclaimable pool, which no NUMA node backs: they are never bound (as in Gödel)."""
    policy = pod.spec.template.numa_policy
    if policy in (NUMA_SINGLE, NUMA_EXCLUSIVE) and pod.spec.qos != pb.QOS_BEST_EFFORT:
        return int(policy)
    return 0


@dataclass(frozen=True, slots=True)
class NumaZone:
    """One NUMA node of a node's topology, as the node agent reports it (guaranteed pool)."""

    id: int
    socket: int
    cpu: int
    mem: int
    gpu: int


@dataclass(frozen=True, slots=True, init=False)
class PodRequest:
    """What a pod asks of one node: its requests, pool, ports, priority, labels, NUMA binding
    and GPU cards.

    ``requests`` is the resource vector (``placement.resources.Quantities``, the one that room
    and usage are summed in), one pod slot, shared by every pod asking the same: never mutate
    it. The per-node filter and score loops read ``q = req.requests`` once, then ``q.cpu``,
    ``q.mem``, ``q.gpus``; ``cpu``, ``mem`` and ``gpu`` are read-only views for everyone else.
    Constructed as before, ``PodRequest(name, pool, cpu, mem, gpu, ...)`` (``gpu`` in milli-GPU,
    as ``cpu`` is milli-CPU: 1000 per whole card), or with ``requests=`` a vector instead of the
    three amounts."""

    name: str
    pool: str
    requests: Quantities = field(hash=False)
    host_ports: tuple[tuple[str, int], ...] = ()
    # The pod's priority, for preemption (placement.preemption sums requests per priority).
    priority: int = 0
    # What inter-pod affinity and topology spread count (placement.topology): the pod's labels,
    # and its required anti-affinity terms, which bind the pods placed after it too (symmetry).
    labels: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    anti_terms: tuple[PodTerm, ...] = ()
    # NUMA binding (SINGLE, EXCLUSIVE or 0) and, once chosen, the NUMA node ids it holds.
    numa_policy: int = 0
    numa_nodes: tuple[int, ...] = ()
    # The GPU models it accepts (empty: any) and, once chosen, the cards it holds
    # (placement.gpu: ``requests.gpus`` is a share of one card below 1000, else whole cards).
    gpu_models: tuple[str, ...] = ()
    gpu_cards: tuple[int, ...] = ()

    def __init__(
        self,
        name: str,
        pool: str,
        cpu: int = 0,
        mem: int = 0,
        gpu: int = 0,
        host_ports: tuple[tuple[str, int], ...] = (),
        priority: int = 0,
        labels: Mapping[str, str] | None = None,
        anti_terms: tuple[PodTerm, ...] = (),
        numa_policy: int = 0,
        numa_nodes: tuple[int, ...] = (),
        *,
        requests: Quantities | None = None,
        gpu_models: tuple[str, ...] = (),
        gpu_cards: tuple[int, ...] = (),
    ) -> None:
        setattr_ = object.__setattr__  # frozen
        setattr_(self, "name", name)
        setattr_(self, "pool", pool)
        setattr_(self, "requests", shared_amounts(cpu, mem, gpu) if requests is None else requests)
        setattr_(self, "host_ports", host_ports)
        setattr_(self, "priority", priority)
        setattr_(self, "labels", {} if labels is None else labels)
        setattr_(self, "anti_terms", anti_terms)
        setattr_(self, "numa_policy", numa_policy)
        setattr_(self, "numa_nodes", numa_nodes)
        setattr_(self, "gpu_models", gpu_models)
        setattr_(self, "gpu_cards", gpu_cards)

    @property
    def cpu(self) -> int:
        return self.requests.cpu

    @property
    def mem(self) -> int:
        return self.requests.mem

    @property
    def gpu(self) -> int:
        return self.requests.gpus

    def pinned(self, numa_nodes: tuple[int, ...]) -> PodRequest:
        """The same request holding ``numa_nodes`` (the shard's or the Binder's choice)."""
        copy = self.renamed(self.name)
        object.__setattr__(copy, "numa_nodes", numa_nodes)
        return copy

    def with_cards(self, gpu_cards: tuple[int, ...]) -> PodRequest:
        """The same request holding GPU ``gpu_cards`` (the shard's or the Binder's choice)."""
        copy = self.renamed(self.name)
        object.__setattr__(copy, "gpu_cards", gpu_cards)
        return copy

    def renamed(self, name: str) -> PodRequest:
        """The same request for another pod (a replacement): cheaper than dataclasses.replace,
        which a simulation of tens of thousands of moves calls as often."""
        copy = object.__new__(PodRequest)
        for slot in PodRequest.__slots__:
            object.__setattr__(copy, slot, getattr(self, slot))
        object.__setattr__(copy, "name", name)
        return copy

    @classmethod
    def from_pod(cls, pod: pb.Pod, name: str | None = None) -> PodRequest:
        return cls.from_parts(pod.metadata, pod.spec, name)

    @classmethod
    def from_parts(
        cls,
        meta: pb.ObjectMeta,
        spec: pb.PodSpec,
        name: str | None = None,
        part: RequestPart | None = None,
    ) -> PodRequest:
        """``from_pod`` of the pod with this metadata and spec, for a caller that read them
        already. Every bound pod comes through here when a shard or the Binder (re)starts: each
        submessage is read once (a protobuf field read is ~0.3 µs, most of this method's cost),
        and the request is made without __init__'s keyword handling (``_make_request``). ``name``: the
        pod's name as the caller already holds it, so the caller's indexes and this request
        share one string (each read of ``metadata.name`` is a new one, ~60 bytes a pod for
        every holder that keeps it). ``part``: ``request_part`` of the pod's template and QoS,
        read already for another pod of the same template (``placement.preemption
        .TemplateParts``); the template is then not read at all."""
        if part is None:
            part = request_part(spec.template, spec.qos)
        pool, requests, host_ports, anti_terms, numa_policy, gpu_models, asks_gpus = part
        labels = meta.labels
        # Most pods have no NUMA nodes: the empty tuple without a copy.
        numa_nodes = spec.numa_nodes
        return _make_request(
            meta.name if name is None else name,
            pool,
            requests,
            host_ports,
            spec.priority,
            shared_labels(labels) if labels else _NO_LABELS,
            anti_terms,
            numa_policy,
            tuple(numa_nodes) if numa_nodes else (),
            gpu_models,
            # Read only for a pod asking GPUs: repeated fields cost even when empty.
            tuple(spec.gpu_cards) if asks_gpus else (),
        )


class RequestPart(NamedTuple):
    """What a ``PodRequest`` takes from its pod's template and QoS alone: the same for every pod
    with an equal template and QoS, so it can be read once for all of them (a job of 1,000 pods
    carries one template). ``request_part`` is the one reading of it."""

    pool: str
    requests: Quantities
    host_ports: tuple[tuple[str, int], ...]
    anti_terms: tuple[PodTerm, ...]
    numa_policy: int
    gpu_models: tuple[str, ...]
    asks_gpus: bool  # whether the pod's own ``gpu_cards`` are read


def request_part(tpl: pb.PodTemplate, qos: int) -> RequestPart:
    """The part of a ``PodRequest`` its template and QoS decide (``RequestPart``)."""
    req = tpl.requests
    gpus = req.gpus
    # Most pods have no ports: the empty tuple without a generator.
    ports = tpl.ports
    policy = tpl.numa_policy
    return RequestPart(
        pool_of(qos),
        (
            Quantities.shared_request(tpl)
            if req.extended
            else shared_amounts(
                req.milli_cpu,
                req.memory_bytes,
                request_milli(gpus, tpl.gpu_milli) if gpus else 0,
            )
        ),
        tuple((p.protocol or "TCP", p.host_port) for p in ports if p.host_port) if ports else (),
        _anti_terms(tpl),
        # numa_policy_of's rule, on the fields already read.
        int(policy) if policy in (NUMA_SINGLE, NUMA_EXCLUSIVE) and qos != pb.QOS_BEST_EFFORT else 0,
        tuple(tpl.gpu_models) if gpus else (),
        bool(gpus),
    )


# A PodRequest from its fields in order, without the frozen __init__'s keyword handling and
# object.__setattr__ per field (``foundation.frozen``): every bound pod of a restart is made here.
_make_request = positional_maker(PodRequest)
assert PodRequest.__slots__ == (
    "name",
    "pool",
    "requests",
    "host_ports",
    "priority",
    "labels",
    "anti_terms",
    "numa_policy",
    "numa_nodes",
    "gpu_models",
    "gpu_cards",
), "PodRequest's fields moved: from_parts passes them in this order"


def _anti_terms(tpl: pb.PodTemplate) -> tuple[PodTerm, ...]:
    # HasField first: reading an unset submessage builds it, and this runs for every pod.
    if not tpl.HasField("affinity") or not tpl.affinity.HasField("pod_anti_affinity"):
        return ()
    return tuple(pod_term(t) for t in tpl.affinity.pod_anti_affinity.required)


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint as plain values (read per candidate node, so no protobuf access)."""

    key: str
    value: str
    effect: int


@dataclass(slots=True)
class NodeInfo:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    # Capacity and requested amounts per pool: [milli-CPU, memory bytes, GPUs]. Capacity is
    # never changed in place (``set_node`` replaces it), so clones share it.
    capacity: dict[str, list[int]] = field(
        default_factory=lambda: {GUARANTEED: [0, 0, 0], BEST_EFFORT: [0, 0, 0]}
    )
    requested: dict[str, list[int]] = field(
        default_factory=lambda: {GUARANTEED: [0, 0, 0], BEST_EFFORT: [0, 0, 0]}
    )
    max_pods: int = 0
    pods: dict[str, PodRequest] = field(default_factory=dict)
    used_ports: set[tuple[str, int]] = field(default_factory=set)
    # Bumped on every change, so snapshots copy only the nodes that changed.
    generation: int = 0
    # Pods here with required anti-affinity terms: while there are none anywhere, a pod without
    # pod affinity or spread constraints needs no topology index at all.
    anti_pods: int = 0
    # NUMA topology and what NUMA-bound pods hold of it: per NUMA id the [cpu, mem, gpu] of
    # single-NUMA pods, the exclusive owner of whole NUMA nodes, and the bound pods' total
    # requests (the rest of the guaranteed pool's use is "shared": unbound pods).
    numa: tuple[NumaZone, ...] = ()
    numa_used: dict[int, list[int]] = field(default_factory=dict)
    numa_owner: dict[int, str] = field(default_factory=dict)
    numa_pods: int = 0
    numa_bound: list[int] = field(default_factory=lambda: [0, 0, 0])
    # GPU cards (placement.gpu): the node's model, and per card index the milli-GPU its pods
    # hold (one entry per card of the guaranteed pool; replaced, never changed in place).
    gpu_model: str = ""
    card_used: tuple[int, ...] = ()
    # Whether ``pods`` is shared with a clone or its original (copy on write): a snapshot
    # clones every changed node, and most clones and originals change no more before the next
    # clone; a copy each was the shard's biggest duplicate (a pod map per node, ~45 bytes a
    # pod). The first ``add_pod`` or ``remove_pod`` of either side copies it.
    pods_shared: bool = field(default=False, compare=False, repr=False)

    @classmethod
    def from_node(cls, node: pb.Node) -> NodeInfo:
        info = cls(node.metadata.name)
        info.set_node(node)
        return info

    def set_node(self, node: pb.Node) -> None:
        """Take the node's own fields (labels, taints, capacity); keep the pods."""
        self.labels = dict(node.metadata.labels)
        self.taints = tuple(Taint(t.key, t.value, t.effect) for t in node.spec.taints)
        self.unschedulable = node.spec.unschedulable
        self.ready = node.status.ready
        self.capacity = {}
        for pool in POOLS:
            offered = pool_capacity(node, pool)
            self.capacity[pool] = [
                offered.milli_cpu,
                offered.memory_bytes,
                offered.gpus * MILLI_PER_CARD,
            ]
        self.max_pods = node.status.allocatable.pods
        self.numa = tuple(
            NumaZone(
                z.id,
                z.socket,
                z.capacity.milli_cpu,
                z.capacity.memory_bytes,
                z.capacity.gpus * MILLI_PER_CARD,
            )
            for z in node.status.topology.numa_nodes
        )
        self.gpu_model = node.status.gpu_model
        cards = node.status.allocatable.gpus
        if cards != len(self.card_used):
            self.card_used = (0,) * cards
            for req in self.pods.values():
                if req.gpu_cards:
                    self._account_cards(req, 1)
        self.generation += 1

    def add_pod(self, req: PodRequest) -> bool:
        """Account a pod on this node; False (and no change) if it is already here."""
        if req.name in self.pods:
            return False
        if self.pods_shared:
            self._own_pods()
        self.pods[req.name] = req
        used = self.requested[req.pool]
        q = req.requests
        used[0] += q.cpu
        used[1] += q.mem
        used[2] += q.gpus
        if req.host_ports:  # a new set, not changed in place: clones share it (``clone``)
            self.used_ports = self.used_ports.union(req.host_ports)
        if req.anti_terms:
            self.anti_pods += 1
        if req.numa_nodes and req.numa_policy:
            self._account_numa(req, 1)
        if req.gpu_cards:
            self._account_cards(req, 1)
        self.generation += 1
        return True

    def _account_cards(self, req: PodRequest, sign: int) -> None:
        # A share takes its milli of its card, a whole-card pod 1000 of each (placement.gpu).
        # Indices outside the node's cards are not counted (audit reports them). A new tuple:
        # clones share it.
        milli = req.requests.gpus
        each = milli if milli < MILLI_PER_CARD else MILLI_PER_CARD
        used = list(self.card_used)
        for card in req.gpu_cards:
            if 0 <= card < len(used):
                used[card] += sign * each
        self.card_used = tuple(used)

    def _account_numa(self, req: PodRequest, sign: int) -> None:
        # New containers, never changed in place: clones share them (``clone``), and only the
        # few NUMA-bound pods pay for the copies.
        self.numa_pods += sign
        bound = self.numa_bound
        q = req.requests
        self.numa_bound = [
            bound[0] + sign * q.cpu,
            bound[1] + sign * q.mem,
            bound[2] + sign * q.gpus,
        ]
        if req.numa_policy == NUMA_EXCLUSIVE:
            owner = dict(self.numa_owner)
            for i in req.numa_nodes:
                if sign > 0:
                    owner[i] = req.name
                elif owner.get(i) == req.name:
                    del owner[i]
            self.numa_owner = owner
            return
        zone = req.numa_nodes[0]
        was = self.numa_used.get(zone, (0, 0, 0))
        used = [was[0] + sign * q.cpu, was[1] + sign * q.mem, was[2] + sign * q.gpus]
        numa_used = dict(self.numa_used)
        if any(used):
            numa_used[zone] = used
        else:
            numa_used.pop(zone, None)
        self.numa_used = numa_used

    def remove_pod(self, name: str) -> PodRequest | None:
        if self.pods_shared and name in self.pods:
            self._own_pods()
        req = self.pods.pop(name, None)
        if req is None:
            return None
        used = self.requested[req.pool]
        q = req.requests
        used[0] -= q.cpu
        used[1] -= q.mem
        used[2] -= q.gpus
        if req.host_ports:
            # No two pods of a node hold the same host port (NodePorts), so removing is exact.
            self.used_ports = self.used_ports.difference(req.host_ports)
        if req.anti_terms:
            self.anti_pods -= 1
        if req.numa_nodes and req.numa_policy:
            self._account_numa(req, -1)
        if req.gpu_cards:
            self._account_cards(req, -1)
        self.generation += 1
        return req

    def free(self, pool: str) -> tuple[int, int, int]:
        cap, used = self.capacity[pool], self.requested[pool]
        return cap[0] - used[0], cap[1] - used[1], cap[2] - used[2]

    def clone(self) -> NodeInfo:
        """A copy whose pods and use can change apart from this one. What is only ever
        replaced, never changed in place, is shared: labels, taints, capacity and NUMA zones
        (``set_node``), host ports and NUMA use (pods with ports or NUMA binding make new ones).
        GPU card use too. A snapshot clones every changed node every cycle."""
        requested = self.requested
        self.pods_shared = True
        return NodeInfo(
            self.name,
            self.labels,
            self.taints,
            self.unschedulable,
            self.ready,
            self.capacity,
            {GUARANTEED: list(requested[GUARANTEED]), BEST_EFFORT: list(requested[BEST_EFFORT])},
            self.max_pods,
            self.pods,
            self.used_ports,
            self.generation,
            self.anti_pods,
            self.numa,
            self.numa_used,
            self.numa_owner,
            self.numa_pods,
            self.numa_bound,
            self.gpu_model,
            self.card_used,
            pods_shared=True,
        )

    def _own_pods(self) -> None:
        """A pod map of its own, before changing the one shared with a clone (``clone``)."""
        self.pods = dict(self.pods)
        self.pods_shared = False


def resource_fit_failures(node: NodeInfo, req: PodRequest) -> list[str]:
    """Why ``req`` does not fit ``node``'s pool and pod slots ([] if it fits)."""
    failures = []
    if len(node.pods) + 1 > node.max_pods:
        failures.append(TOO_MANY_PODS)
    cap, used = node.capacity[req.pool], node.requested[req.pool]
    q = req.requests
    if q.cpu and used[0] + q.cpu > cap[0]:
        failures.append(INSUFFICIENT_CPU)
    if q.mem and used[1] + q.mem > cap[1]:
        failures.append(INSUFFICIENT_MEMORY)
    if q.gpus and used[2] + q.gpus > cap[2]:
        failures.append(INSUFFICIENT_GPUS)
    return failures


def port_conflict(node: NodeInfo, req: PodRequest) -> bool:
    return any(port in node.used_ports for port in req.host_ports)
