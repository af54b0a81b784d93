"""Micro-benchmark of the GpuFragmentation score (placement/plugins/gpufragmentation.py) on many
GPU nodes, one core, no services:

    PYTHONPATH=. python -m bench.gpuscore_micro [--nodes 6000] [--pods 200] [--seed 1] [--partly 100]

Nodes of 8 cards (64 CPU, 512 GiB); ``--partly`` percent of them (all by default: the worst
case) have each card used in steps of 250 milli-GPU and 0 or 8 cores beside it, drawn at random
(thousands of distinct states), the rest are idle or full. Each pod is a share (250, 500 or 750 milli-GPU, 4 CPU) scored on every node, as
kube-mode search with percentageOfNodesToScore 100 would: the default profile's score sum
(``Framework.score_parts``) with and without GpuFragmentation, the plugin alone with its caches
cold (a policy rebuilt: every state scored again) and warm, and the default profile's filters
over the same nodes (the rest of the search's per-node work) for scale.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from placement.framework import Framework, PodInfo, Profile
from placement.framework.profile import DEFAULT_SCORES
from placement.nodeinfo import NodeInfo, PodRequest
from placement.plugins import new_in_tree_registry
from placement.plugins.gpufragmentation import GpuFragmentation
from protos.godel.v1 import objects_pb2 as pb

CARDS = 8


def _nodes(n: int, rng: random.Random, partly: int) -> list[NodeInfo]:
    out = []
    for i in range(n):
        node = pb.Node(metadata=pb.ObjectMeta(name=f"gpu-{i:05d}"))
        a = node.status.allocatable
        a.milli_cpu, a.memory_bytes, a.pods, a.gpus = 64_000, 512 << 30, 110, CARDS
        node.status.ready = True
        node.status.gpu_model = "V100M32"
        info = NodeInfo.from_node(node)
        kind = rng.randrange(100)
        for card in range(CARDS):
            if kind >= partly:  # idle or full, half each
                used = 1000 if kind % 2 else 0
            else:
                used = rng.choice((0, 0, 250, 500, 750, 1000))
            if used:
                cpu = rng.choice((0, 8000))
                req = PodRequest(f"gpu-{i}-{card}", "g", cpu, 0, used, gpu_cards=(card,))
                info.add_pod(req)
        out.append(info)
    return out


def _pod(name: str, milli: int) -> PodInfo:
    return PodInfo(name, "j", 1, PodRequest(name, "g", 4000, 8 << 30, milli))


def _time(runs: int, fn: Callable[[], object]) -> float:
    start = time.process_time()
    for _ in range(runs):
        fn()
    return (time.process_time() - start) / runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=6000)
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--partly", type=int, default=100, help="%% of nodes with cards in part use")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    nodes = _nodes(args.nodes, rng, args.partly)
    states = len({(tuple(sorted(n.card_used)), tuple(n.requested["g"][:2])) for n in nodes})
    registry = new_in_tree_registry()
    with_gpu = Framework(Profile(), registry)
    without = Framework(
        Profile(scores=tuple(s for s in DEFAULT_SCORES if s[0] != "GpuFragmentation")), registry
    )
    plugin = with_gpu.plugins["GpuFragmentation"]
    assert isinstance(plugin, GpuFragmentation)
    pods = [_pod(f"p-{k}", rng.choice((250, 500, 750))) for k in range(args.pods)]

    def scores(framework: Framework) -> float:
        return _time(1, lambda: [framework.score_parts(p, nodes) for p in pods]) / len(pods)

    def filters() -> None:
        for p in pods:
            for n in nodes:
                with_gpu.run_filters(p, n)

    scores(with_gpu)  # warm: the mix has seen every shape
    filter_s = _time(1, filters) / len(pods)
    other_s = scores(without)
    all_s = scores(with_gpu)
    warm_s = _time(1, lambda: [[plugin.score(p, n) for n in nodes] for p in pods]) / len(pods)

    def cold() -> None:
        for p in pods[:20]:
            plugin.forget_scores()
            for n in nodes:
                plugin.score(p, n)

    plugin.score(pods[0], nodes[0])
    cold_s = _time(1, cold) / 20
    ms = 1000.0
    print(
        f"{args.nodes} GPU nodes ({states} distinct states), share pods, per pod: "
        f"filters {filter_s * ms:.1f} ms; default scores without GpuFragmentation "
        f"{other_s * ms:.1f} ms, with it {all_s * ms:.1f} ms; GpuFragmentation alone "
        f"warm {warm_s * ms:.1f} ms, cold (states scored anew) {cold_s * ms:.1f} ms"
    )


if __name__ == "__main__":
    main()
