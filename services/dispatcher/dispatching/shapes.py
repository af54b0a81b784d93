"""``NodeShapes``: the distinct node capacities per pool, kept per node event, for Submit's
"no node can ever hold this pod" (``api/validation.py``)."""

from __future__ import annotations

from collections import Counter

from placement.nodeinfo import POOLS, pool_capacity
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.objects import NodeShape


def shapes_of(node: pb.Node) -> dict[str, NodeShape]:
    out = {}
    for pool in POOLS:
        capacity = pool_capacity(node, pool)
        out[pool] = NodeShape(capacity.milli_cpu, capacity.memory_bytes, capacity.gpus)
    return out


class NodeShapes:
    def __init__(self) -> None:
        self._of_node: dict[str, dict[str, NodeShape]] = {}
        # Nodes of each (pool, shape), and the distinct shapes built from it when they change:
        # every Submit asks, and walking 5,000 nodes a request cost one-pod jobs dearly.
        self._nodes: Counter[tuple[str, NodeShape]] = Counter()
        self._distinct: dict[str, frozenset[NodeShape]] | None = None

    def set(self, node: str, shapes: dict[str, NodeShape] | None) -> None:
        """The node's shapes per pool from now on (None: the node is gone)."""
        before = self._of_node.pop(node, None)
        if before is not None:
            for key in before.items():
                self._nodes[key] -= 1
                if not self._nodes[key]:
                    del self._nodes[key]
                    self._distinct = None
        if shapes is not None:
            self._of_node[node] = shapes
            for key in shapes.items():
                if not self._nodes[key]:
                    self._distinct = None
                self._nodes[key] += 1

    def distinct(self) -> dict[str, frozenset[NodeShape]]:
        """Distinct node capacities per pool (for "no node can ever hold this pod")."""
        if self._distinct is None:
            out: dict[str, set[NodeShape]] = {pool: set() for pool in POOLS}
            for pool, shape in self._nodes:
                out[pool].add(shape)
            self._distinct = {pool: frozenset(s) for pool, s in out.items()}
        return self._distinct
