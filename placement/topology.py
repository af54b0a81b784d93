"""The topology index: how many pods matching a selector each topology domain holds, kept
incrementally, for inter-pod affinity and topology spread (placement.plugins.interpodaffinity,
placement.plugins.podtopologyspread) in the shards and the Binder.

A domain is one value of a node label (``zone=a``). The index knows every node's labels and every
pod on every node; what it counts is asked for by the plugins:

- ``domain_counts(selector, key)``: pods matching ``selector`` per value of ``key``. The first
  question about a (selector, key) builds its counter once, from the pods carrying the label the
  selector requires (``In``) or, failing that, every pod; from then on every pod added or removed
  updates it (O(counters) per pod, no scan).
- ``existing_anti()``: the required anti-affinity terms of the pods placed, with the domains that
  hold such pods (Kubernetes' symmetry: an existing pod's anti-affinity keeps matching pods out).
- ``domains(key)``: the domains of ``key`` and how many nodes each has.

Owners feed it: the shard's snapshot from the nodes its cache changed (bind, unbind, assume,
forget all mark a node dirty) and from the cycle's own assumes; the Binder from its state and the
placements of a batch as it accepts them. It stays inactive (costing nothing) until a pod with
pod affinity, anti-affinity or spread constraints, or an anti-affine pod placed anywhere, needs it;
activation reads every pod once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from placement.labelselector import OP_IN, PodTerm, Selector, matches
from placement.nodeinfo import NodeInfo, PodRequest

_EMPTY: Mapping[str, int] = {}


class PodCounts(Protocol):
    """What the topology plugins read (the shard's snapshot index, the Binder's)."""

    def domain_counts(self, selector: Selector, key: str) -> Mapping[str, int]: ...

    def existing_anti(self) -> Iterable[tuple[PodTerm, Mapping[str, int]]]: ...

    def domains(self, key: str) -> Mapping[str, int]: ...

    def node_labels(self) -> Mapping[str, Mapping[str, str]]: ...


def _bump(counts: dict[str, int], domain: str, delta: int) -> None:
    n = counts.get(domain, 0) + delta
    if n > 0:
        counts[domain] = n
    else:
        counts.pop(domain, None)


class TopologyIndex:
    def __init__(self) -> None:
        self.active = False
        self._labels: dict[str, Mapping[str, str]] = {}  # existing node -> its labels
        self._pods: dict[str, dict[str, PodRequest]] = {}  # node -> pods on it (any node name)
        self._where: dict[str, str] = {}  # pod -> node
        self._counts: dict[tuple[Selector, str], dict[str, int]] = {}
        self._anti: dict[PodTerm, dict[str, int]] = {}
        self._domains: dict[str, dict[str, int]] = {}
        # Pods by label (key, value): the candidates a counter with an ``In`` starts from.
        self._by_label: dict[tuple[str, str], set[str]] = {}
        # Bumped when a known node changes labels or vanishes: its pods left domains the
        # node's new labels no longer name (a cache keyed by domains starts over).
        self.relabels = 0

    # -- feeding -----------------------------------------------------------------------------

    def activate(self, nodes: Iterable[NodeInfo], present: Iterable[str] | None = None) -> None:
        """Start indexing: read every node and pod once. ``present``: the nodes that exist (a
        NodeInfo can stand for a vanished node still holding pods); default: all of them."""
        self.active = True
        infos = list(nodes)
        names = set(present) if present is not None else {i.name for i in infos}
        for info in infos:
            if info.name in names:
                self.set_node(info.name, info.labels)
            for req in info.pods.values():
                self.add(info.name, req)

    def set_node(self, name: str, labels: Mapping[str, str] | None) -> None:
        """A node appeared, changed labels (its pods move between domains) or vanished (None)."""
        old = self._labels.get(name)
        if old == labels:
            return
        pods = list(self._pods.get(name, {}).values())
        for req in pods:
            self.remove(req.name)
        if old is not None:
            self.relabels += 1
            for key, counts in self._domains.items():
                if key in old:
                    _bump(counts, old[key], -1)
            del self._labels[name]
        if labels is not None:
            self._labels[name] = labels
            for key, counts in self._domains.items():
                if key in labels:
                    _bump(counts, labels[key], 1)
        for req in pods:
            self.add(name, req)

    def add(self, node: str, req: PodRequest) -> None:
        """Count ``req`` on ``node`` (moving it if it was elsewhere; nothing if already there)."""
        where = self._where.get(req.name)
        if where == node:
            return
        if where is not None:
            self.remove(req.name)
        self._where[req.name] = node
        self._pods.setdefault(node, {})[req.name] = req
        for item in req.labels.items():
            self._by_label.setdefault(item, set()).add(req.name)
        self._account(node, req, 1)

    def remove(self, pod: str) -> None:
        node = self._where.pop(pod, None)
        if node is None:
            return
        on_node = self._pods[node]
        req = on_node.pop(pod)
        if not on_node:
            del self._pods[node]
        for item in req.labels.items():
            pods = self._by_label.get(item)
            if pods is not None:
                pods.discard(pod)
                if not pods:
                    del self._by_label[item]
        self._account(node, req, -1)

    def sync_node(self, name: str, info: NodeInfo | None) -> None:
        """Make the index agree with ``info`` (the node as it is now; None: gone, with its pods)."""
        self.set_node(name, info.labels if info is not None else None)
        mine = self._pods.get(name, {})
        now = info.pods if info is not None else {}
        if mine.keys() == now.keys():
            return
        for pod in [p for p in mine if p not in now]:
            self.remove(pod)
        for pod, req in now.items():
            if pod not in mine:
                self.add(name, req)

    def _account(self, node: str, req: PodRequest, delta: int) -> None:
        labels = self._labels.get(node)
        if labels is None:
            return  # a pod on a vanished node is in no domain
        for (sel, key), counts in self._counts.items():
            domain = labels.get(key)
            if domain is not None and matches(sel, req.labels):
                _bump(counts, domain, delta)
        for term in req.anti_terms:
            domain = labels.get(term.topology_key)
            if domain is not None:
                _bump(self._anti.setdefault(term, {}), domain, delta)
                if not self._anti[term]:
                    del self._anti[term]

    # -- questions (PodCounts) ---------------------------------------------------------------

    def domain_counts(self, selector: Selector, key: str) -> Mapping[str, int]:
        counts = self._counts.get((selector, key))
        if counts is not None:
            return counts
        counts = self._counts[(selector, key)] = {}
        for node, req in self._candidates(selector):
            labels = self._labels.get(node)
            if labels is not None and key in labels and matches(selector, req.labels):
                _bump(counts, labels[key], 1)
        return counts

    def _candidates(self, selector: Selector) -> Iterator[tuple[str, PodRequest]]:
        first_in = next((r for r in selector if r.op == OP_IN), None)
        if first_in is None:
            for node, pods in self._pods.items():
                for req in pods.values():
                    yield node, req
            return
        for value in first_in.values:
            for pod in self._by_label.get((first_in.key, value), ()):
                node = self._where[pod]
                yield node, self._pods[node][pod]

    def existing_anti(self) -> Iterable[tuple[PodTerm, Mapping[str, int]]]:
        return self._anti.items()

    @property
    def has_anti(self) -> bool:
        return bool(self._anti)

    def domains(self, key: str) -> Mapping[str, int]:
        counts = self._domains.get(key)
        if counts is None:
            counts = self._domains[key] = {}
            for labels in self._labels.values():
                if key in labels:
                    _bump(counts, labels[key], 1)
        return counts

    def node_labels(self) -> Mapping[str, Mapping[str, str]]:
        return self._labels

    def pods_on(self, node: str) -> Mapping[str, PodRequest]:
        return self._pods.get(node, {})


__all__ = ["PodCounts", "TopologyIndex"]
