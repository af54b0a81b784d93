"""Free room per pool, kept incrementally: the one accumulator of "what the nodes offer minus
what the pods holding claims take".

It is fed events, never a scan: a node's offer set, changed or withdrawn (``set_node``), a
pod's claim taken or returned (``claim`` / ``release``; a second release changes nothing), and,
for the dispatcher, room held by units sent to a shard and not yet bound (``hold``). Each event
moves the sums by the difference: O(1), and no allocation beyond the first claim on a node.

Composed per key, because its users deliberately count over different sets of nodes:

- ``PoolRoom``: the totals per pool (``capacity``, ``claimed``, ``free``) over the whole
  cluster. A claim counts wherever its node is, known or not, usable or not (a cordoned node's
  pods still hold their room; a pod bound to a node not seen yet holds it too). The dispatcher's
  queue and the allocation trigger. Its claim record is the caller's (anything with a ``pool``
  and shared ``requests``), so a caller that keeps more per bound pod (the queue: its queue,
  priority...) keeps one record, not two.
- ``NodeRoom``: the same, and per node per pool (``node_offer``, ``node_claimed``), and per
  group of nodes (``regroup``: e.g. nodes by the shard whose partition holds them;
  ``group_free``), re-summed only when the grouping changes. The partitions, the dashboard's
  per-node utilisation, tidal reclaim's per-node pools.

What a node offers is the caller's choice too: ``usable_offer`` (ready and schedulable nodes,
both pools) is the dispatcher's and the partitions' (``NodeRoom.on_node``); the dashboard's
utilisation and the allocation trigger count every node. Which pods hold a claim is
``placement.claims`` (``NodeRoom.on_pod``); tidal reclaim leaves out pods being deleted.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, KeysView, Mapping
from typing import Generic, NamedTuple, Protocol, TypeVar

from placement.claims import holds_claim
from placement.nodeinfo import POOLS, pool_capacity, pool_of
from placement.resources import Quantities
from protos.godel.v1 import objects_pb2 as pb

Offer = Mapping[str, Quantities]  # pool -> what a node offers to it


class Held(Protocol):
    """What a claim takes: ``requests`` (never mutated: shared) of ``pool``."""

    @property
    def pool(self) -> str: ...

    @property
    def requests(self) -> Quantities: ...


class RoomClaim(NamedTuple):
    """A pod's claim as a ``NodeRoom`` counts it: its node, its pool and its requests (the
    requests shared by every pod asking the same, the node name interned). A tuple: one is made
    per claim event, and a frozen dataclass costs several times as much to make."""

    node: str
    pool: str
    requests: Quantities

    @classmethod
    def of(cls, pod: pb.Pod) -> RoomClaim:
        return cls(
            sys.intern(pod.spec.node_name),
            pool_of(pod.spec.qos),
            Quantities.shared_request(pod.spec.template),
        )


def usable_offer(node: pb.Node | None) -> dict[str, Quantities] | None:
    """What a node offers new pods per pool: its capacity of each pool while it is ready and
    schedulable, nothing (None) when it is gone, not ready or cordoned."""
    if node is None or not node.status.ready or node.spec.unschedulable:
        return None
    return {pool: Quantities.of(pool_capacity(node, pool)) for pool in POOLS}


C = TypeVar("C", bound=Held)


class PoolRoom(Generic[C]):
    """Per pool over the whole cluster: what the nodes offer, what claims (and holds) take,
    and the room left (see the module's docstring)."""

    # Whether claims are also summed per node (``NodeRoom``): a flag, not an overridden
    # method, so the totals alone (the queue's, per bound pod) pay no call for it.
    _per_node = False

    def __init__(self) -> None:
        self._offers: dict[str, Offer] = {}  # node -> its offer
        self._claims: dict[str, C] = {}  # pod -> its claim
        self._capacity = {pool: Quantities() for pool in POOLS}
        self._claimed = {pool: Quantities() for pool in POOLS}
        # group -> pool -> room left (``NodeRoom.regroup``; none here).
        self._groups: dict[str, dict[str, Quantities]] = {}
        self._group_of: Mapping[str, str] = {}  # node -> group (the caller's own map)

    # -- events ----------------------------------------------------------------------------

    def set_node(self, name: str, offer: Offer | None) -> None:
        """A node's offer per pool, replacing what it offered before (None: it offers
        nothing: gone, or not usable). Its claims stay."""
        old = self._offers.pop(name, None)
        free = self._group_room(name)
        if old is not None:
            for pool, amount in old.items():
                self._capacity[pool].add(amount, -1)
                if free is not None:
                    free[pool].add(amount, -1)
        if offer is not None:
            self._offers[name] = offer
            for pool, amount in offer.items():
                self._capacity[pool].add(amount)
                if free is not None:
                    free[pool].add(amount)

    def claim(self, pod: str, held: C) -> None:
        """``pod`` holds ``held`` (replacing any claim it held before)."""
        claims = self._claims
        old = claims.get(pod)
        if old is held:
            return
        if old is not None:
            self._claimed[old.pool].add(old.requests, -1)
            if self._per_node:
                self._take_on_node(old, -1)
        claims[pod] = held
        self._claimed[held.pool].add(held.requests)
        if self._per_node:
            self._take_on_node(held, 1)

    def restate(self, pod: str, held: C) -> None:
        """``pod``'s claim record replaced by ``held``, which takes exactly what the one it
        replaces took (its pool, its shared ``requests``, and its node): the sums stay as they
        are (a bound pod's start, its deletion mark). Its caller vouches for that."""
        self._claims[pod] = held

    def claim_summed_later(self, pod: str, held: C) -> None:
        """``claim`` of a pod holding none yet, its requests added to the pool's sum by the
        caller later (``add_claimed``): a listing's claims, summed per shared request."""
        if pod in self._claims:
            self.claim(pod, held)
            return
        self._claims[pod] = held
        if self._per_node:
            self._take_on_node(held, 1)

    def add_claimed(self, pool: str, requests: Quantities, count: int) -> None:
        """``count`` claims of ``requests`` in ``pool`` (``claim_summed_later``'s)."""
        self._claimed[pool].add(requests, count)

    def release(self, pod: str) -> C | None:
        """``pod`` holds no claim (any more): its claim, None if it held none (a second
        release changes nothing)."""
        held = self._claims.pop(pod, None)
        if held is not None:
            self._claimed[held.pool].add(held.requests, -1)
            if self._per_node:
                self._take_on_node(held, -1)
        return held

    def hold(self, pool: str, requests: Quantities, sign: int = 1) -> None:
        """Room taken (1) or given back (-1) on no node yet: a unit sent to a shard, not bound.
        Counted in the totals only."""
        self._claimed[pool].add(requests, sign)

    def _take_on_node(self, held: C, sign: int) -> None:
        """Per node and group sums: ``NodeRoom``'s."""

    def _group_room(self, node: str) -> dict[str, Quantities] | None:
        if not self._groups:
            return None
        group = self._group_of.get(node)
        return None if group is None else self._groups.get(group)

    # -- questions -------------------------------------------------------------------------

    def capacity(self, pool: str) -> Quantities:
        """What the nodes offer to ``pool`` in all (read it, never change it)."""
        return self._capacity[pool]

    def claimed(self, pool: str) -> Quantities:
        """What claims and holds take of ``pool`` in all (read it, never change it)."""
        return self._claimed[pool]

    def free(self, pool: str) -> Quantities:
        """The room left in ``pool``: capacity minus claims and holds (a new instance;
        fragmentation aside: the shards judge the nodes)."""
        free = self._capacity[pool].copy()
        free.add(self._claimed[pool], -1)
        return free

    def holds(self, pod: str) -> bool:
        return pod in self._claims

    def claim_of(self, pod: str) -> C | None:
        return self._claims.get(pod)

    def claims(self) -> Iterable[C]:
        """Every claim held (a live view)."""
        return self._claims.values()

    def claims_by_pod(self) -> Iterable[tuple[str, C]]:
        """Every claim held with its pod's name (a live view)."""
        return self._claims.items()

    def by_pod(self) -> Mapping[str, C]:
        """Each claim by its pod's name (a live view, never to change)."""
        return self._claims

    def pods(self) -> KeysView[str]:
        """The names of the pods holding a claim (a live view)."""
        return self._claims.keys()

    def node_offer(self, node: str, pool: str) -> Quantities | None:
        """What ``node`` offers to ``pool`` (None: nothing: unknown, or withdrawn)."""
        offer = self._offers.get(node)
        return None if offer is None else offer.get(pool)


class NodeRoom(PoolRoom[RoomClaim]):
    """``PoolRoom`` also summed per node and per group of nodes, and fed straight from Node and
    Pod objects by the common rules if the caller likes (``on_node``, ``on_pod``)."""

    _per_node = True

    def __init__(self) -> None:
        super().__init__()
        # node -> pool -> what the claims on it take (an entry from its first claim on).
        self._node_claimed: dict[str, dict[str, Quantities]] = {}

    def on_node(self, name: str, node: pb.Node | None) -> None:
        """A node offers its pools while ready and schedulable (``usable_offer``)."""
        self.set_node(name, usable_offer(node))

    def on_pod(self, name: str, pod: pb.Pod | None) -> None:
        """A pod holds a claim while bound or running (``placement.claims.holds_claim``)."""
        if pod is None or not holds_claim(pod):
            self.release(name)
            return
        old = self._claims.get(name)
        if old is not None and old.node == pod.spec.node_name:
            return  # bound -> running: a bound pod's node, QoS and requests stay as they were
        self.claim(name, RoomClaim.of(pod))

    def _take_on_node(self, held: RoomClaim, sign: int) -> None:
        node, pool, requests = held
        used = self._node_claimed.get(node)
        if used is None:
            used = self._node_claimed[node] = {p: Quantities() for p in POOLS}
        used[pool].add(requests, sign)
        free = self._group_room(node)
        if free is not None:
            free[pool].add(requests, -sign)

    def node_claimed(self, node: str, pool: str) -> Quantities | None:
        """What the claims on ``node`` take of ``pool`` (None: no claim there yet)."""
        used = self._node_claimed.get(node)
        return None if used is None else used[pool]

    def regroup(self, group_of: Mapping[str, str] | None, groups: Iterable[str] = ()) -> None:
        """Sum the room per group again: ``group_of`` maps a node to its group (kept by
        reference: the caller's own map; its later changes count from the next ``regroup``),
        ``groups`` names every group, empty ones too. None: no groups. O(nodes): for when the
        grouping itself changes."""
        self._groups = {}
        if group_of is None:
            self._group_of = {}
            return
        self._group_of = group_of
        for group in groups:
            self._groups[group] = {pool: Quantities() for pool in POOLS}
        for node in group_of:
            free = self._group_room(node)
            if free is None:
                continue
            for pool, amount in self._offers.get(node, {}).items():
                free[pool].add(amount)
            for pool, amount in self._node_claimed.get(node, {}).items():
                free[pool].add(amount, -1)

    def group_free(self, group: str, pool: str) -> Quantities | None:
        """The room left in ``group``'s nodes (None: not a group), live: read it, never change
        it."""
        free = self._groups.get(group)
        return None if free is None else free[pool]
