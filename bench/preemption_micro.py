"""Micro-benchmarks of the preemption library on one core, no services:

    PYTHONPATH=. python -m bench.preemption_micro

- NodeInfo.add_pod/remove_pod pairs (the scheduler's hot path the quick check must not slow),
- the quick check over a full 5,000-node cluster, cold (totals built) and warm (cached),
- the victim search on one full node, and ordering 5,000 candidates.
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable

from placement.framework.interface import PodInfo
from placement.nodeinfo import NodeInfo, PodRequest
from placement.preemption import (
    Candidate,
    LowerPriorityTotals,
    VictimCandidate,
    could_fit_after_preemption,
    order_candidates,
    resources_fit,
    select_victims,
)
from protos.godel.v1 import objects_pb2 as pb

NODES = 5000
PODS_PER_NODE = 20
POD_CPU = 200  # 20 x 200m fills a 4-core node


def _full_node(i: int) -> tuple[NodeInfo, list[VictimCandidate]]:
    node = pb.Node(metadata=pb.ObjectMeta(name=f"n{i:05d}"))
    node.status.allocatable.milli_cpu = PODS_PER_NODE * POD_CPU
    node.status.allocatable.memory_bytes = 64 << 30
    node.status.allocatable.pods = 110
    info = NodeInfo.from_node(node)
    victims = []
    for k in range(PODS_PER_NODE):
        req = PodRequest(f"low-{i}-{k}", "g", POD_CPU, 1 << 30, 0, priority=k % 3)
        info.add_pod(req)
        victims.append(VictimCandidate(req.name, f"low-{i}", req.priority, 1000 + k, req))
    return info, victims


def _preemptor() -> PodInfo:
    req = PodRequest("high-0", "g", POD_CPU, 1 << 30, 0, priority=100)
    return PodInfo("high-0", "high", 0, req, priority=100)


def _best_of(fn: Callable[[], object], number: int, repeat: int = 5) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat))


def main() -> None:
    info, _ = _full_node(0)
    extra = PodRequest("x", "g", 500, 1 << 30, 0, priority=1)

    def pair() -> None:
        info.add_pod(extra)
        info.remove_pod("x")

    t = _best_of(pair, 100_000, repeat=15)
    print(f"add_pod+remove_pod, 100k pairs: {t * 1e3:.1f} ms ({t * 10:.3f} us/pair)")

    cluster = [_full_node(i) for i in range(NODES)]
    pre = _preemptor()
    totals = LowerPriorityTotals()
    start = time.perf_counter()
    hopeful = sum(could_fit_after_preemption(pre, n, totals) for n, _ in cluster)
    cold = time.perf_counter() - start
    warm = _best_of(lambda: [could_fit_after_preemption(pre, n, totals) for n, _ in cluster], 1)
    print(
        f"quick check, {NODES} full nodes x {PODS_PER_NODE} pods: cold {cold * 1e3:.1f} ms, "
        f"warm {warm * 1e3:.1f} ms ({warm / NODES * 1e6:.2f} us/node), {hopeful} hopeful"
    )

    node, candidates = cluster[0]
    t = _best_of(lambda: select_victims(pre, node, candidates), 1000)
    found = select_victims(pre, node, candidates) or []
    print(
        f"select_victims, one node with {PODS_PER_NODE} candidates: {t * 1e3:.1f} us/call "
        f"({len(found)} victim)"
    )
    t = _best_of(lambda: select_victims(pre, node, candidates, resources_fit), 1000)
    print(f"  the same through a fits callable (NodeInfo clone): {t * 1e3:.1f} us/call")

    cands = [Candidate(n.name, (select_victims(pre, n, c) or [])) for n, c in cluster]
    t = _best_of(lambda: order_candidates(cands), 10)
    print(f"order_candidates, {NODES} candidates: {t / 10 * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
