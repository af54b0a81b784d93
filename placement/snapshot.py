"""The per-cycle view of the nodes that a search reads and mutates, and the label index that
PreFilters narrow by.

:class:`Snapshot` holds NodeInfo clones in a stable order. Updating it from a live source (the
shard's cache) clones only the NodeInfos whose generation changed: the source records which nodes
it touched, the snapshot which nodes the cycle touched. :meth:`Snapshot.of` builds a standalone
snapshot from NodeInfos (the rescheduler's simulation, tests).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Set
from typing import Protocol

from placement.nodeinfo import NodeInfo, PodRequest
from placement.topology import TopologyIndex


class LabelIndex:
    """Existing nodes by label (key, value), for PreFilters. Changed only by Node events, never
    by pod placements, so keeping it costs nothing on the hot path."""

    _EMPTY: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self._nodes: dict[tuple[str, str], set[str]] = {}

    def nodes_with(self, key: str, value: str) -> Set[str]:
        return self._nodes.get((key, value), self._EMPTY)

    def add(self, node: str, labels: dict[str, str]) -> None:
        for item in labels.items():
            self._nodes.setdefault(item, set()).add(node)

    def remove(self, node: str, labels: dict[str, str]) -> None:
        for item in labels.items():
            nodes = self._nodes.get(item)
            if nodes is not None:
                nodes.discard(node)
                if not nodes:
                    del self._nodes[item]


class NodeSource(Protocol):
    """What a snapshot is updated from (the scheduler shard's cache)."""

    labels: LabelIndex
    nodes: dict[str, NodeInfo]
    present: set[str]
    dirty: set[str]
    node_set_version: int


class _StaticSource:
    """A fixed set of NodeInfos as a NodeSource."""

    def __init__(self, infos: Iterable[NodeInfo]) -> None:
        self.labels = LabelIndex()
        self.nodes = {info.name: info for info in infos}
        self.present = set(self.nodes)
        self.dirty = set(self.nodes)
        self.node_set_version = 1
        for info in self.nodes.values():
            self.labels.add(info.name, info.labels)


# Node changes remembered for changed_since(): a cycle's worth many times over.
_MAX_CHANGES = 100_000
_TOKENS = itertools.count(1)


class Snapshot:
    """Node state for scheduling cycles: NodeInfo clones in a stable order (by name)."""

    def __init__(self) -> None:
        self.infos: dict[str, NodeInfo] = {}
        self.nodes: list[NodeInfo] = []  # existing nodes, sorted by name
        self._index: dict[str, int] = {}
        self._node_set_version = -1
        # Bumped whenever ``nodes`` is rebuilt (a node added or removed); in between, an update
        # only replaces re-cloned entries in place, at the same positions.
        self.layout = 0
        self.touched: set[str] = set()  # nodes the cycle mutated: re-cloned on the next update
        self.clones = 0  # how many NodeInfos the updates copied (tests, metrics)
        # The cache's live label index (labels change only between cycles); None until the first
        # update, so nothing is narrowed against an index that was never filled.
        self.labels: LabelIndex | None = None
        # Every change to a node, in order (updated from the cache, assumed on, forgotten
        # from): what a search that found no node must look at again (``changed_since``).
        self._changes: list[str] = []
        self._changes_base = 0  # the change number of _changes[0]
        self.token = next(_TOKENS)  # tells this snapshot's versions from another's
        # Pods matching a selector per topology domain (inter-pod affinity, spread): inactive,
        # and free, until a pod needs it (``pod_counts``) or an anti-affine pod is placed; then
        # kept in step with the nodes each update brings and the cycle's assumes and forgets.
        self.topology = TopologyIndex()

    @classmethod
    def of(cls, infos: Iterable[NodeInfo]) -> Snapshot:
        """A snapshot of clones of ``infos`` (the originals are not touched)."""
        snapshot = cls()
        snapshot.update(_StaticSource(infos))
        return snapshot

    def update(self, cache: NodeSource) -> int:
        """Bring the snapshot up to the cache: clone only nodes whose generation changed."""
        self.labels = cache.labels
        touched = self.touched
        changed = cache.dirty | touched
        cache.dirty = set()
        self.touched = set()
        copied = 0
        topology = self.topology
        anti_seen = False
        for name in changed:
            live = cache.nodes.get(name)
            mine = self.infos.get(name)
            if live is None or name not in cache.present:
                self.infos.pop(name, None)
                if topology.active:
                    topology.sync_node(name, None)
                continue
            if mine is None or mine.generation != live.generation or name in touched:
                mine = self.infos[name] = live.clone()
                self._changes.append(name)
                copied += 1
            if topology.active:
                topology.sync_node(name, mine)
            elif live.anti_pods:
                anti_seen = True
        if anti_seen:  # an anti-affine pod binds every later pod its terms match
            self.pod_counts()
        if self._node_set_version != cache.node_set_version:
            self._node_set_version = cache.node_set_version
            self.nodes = [self.infos[n] for n in sorted(self.infos)]
            self._index = {info.name: i for i, info in enumerate(self.nodes)}
            self.layout += 1
        else:
            for name in changed:
                i = self._index.get(name)
                if i is not None:
                    self.nodes[i] = self.infos[name]
        self.clones += copied
        if len(self._changes) > _MAX_CHANGES:  # older questions get "everything" (None)
            self._changes_base += len(self._changes)
            self._changes = []
        return copied

    def get(self, name: str) -> NodeInfo | None:
        return self.infos.get(name)

    def assume(self, req: PodRequest, node_name: str) -> None:
        self.infos[node_name].add_pod(req)
        self.touched.add(node_name)
        self._changes.append(node_name)
        if self.topology.active:
            self.topology.add(node_name, req)

    def forget(self, pod: str, node_name: str) -> None:
        self.infos[node_name].remove_pod(pod)
        self.touched.add(node_name)
        self._changes.append(node_name)
        if self.topology.active:
            self.topology.remove(pod)

    def pod_counts(self) -> TopologyIndex:
        """The topology index, built from every node's pods on first use."""
        if not self.topology.active:
            self.topology.activate(self.infos.values())
        return self.topology

    @property
    def version(self) -> int:
        """A number that grows with every node change (see :meth:`changed_since`)."""
        return self._changes_base + len(self._changes)

    def changed_since(self, version: int) -> set[str] | None:
        """The nodes changed (or added) since ``version``; None when that is no longer known.
        A node not among them is exactly as it was then."""
        if version < self._changes_base:
            return None
        return set(self._changes[version - self._changes_base :])
