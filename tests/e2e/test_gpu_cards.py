"""GPU cards end to end: real processes (store server, dispatcher, two scheduler shards, a
Binder, hollow node agents with GPUs). Whole-card pods get cards of their own, shares of one
card land on cards without any card passing 1000 milli-GPU, the Binder writes the cards in
spec.gpu_cards, and a pod asking for a model no node has stays pending with `explain` saying so.
The teardown's audit checks the card rules over every bound pod too."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import pytest

from protos.godel.v1 import objects_pb2 as pb
from tests.e2e.conftest import Cluster, wait_until
from tests.factories import gpu_job
from tests.factories import job as make_job

pytestmark = pytest.mark.e2e

# Two nodes of two cards each (hollow nodes report no model).
GPU_NODES = ("nodeagent", ("--hollow-gpus", "2", "--hollow-cpu-milli", "64000"))


def pods(cluster: Cluster) -> list[pb.Pod]:
    return cluster.client.list("Pod")  # type: ignore[return-value]


def bound(cluster: Cluster, job: str, count: int) -> list[pb.Pod]:
    placed = [p for p in pods(cluster) if p.spec.job == job and p.spec.node_name]
    return placed if len(placed) == count else []


def test_cards_are_assigned_whole_or_shared_never_over_one_card(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=2, binders=1, hollow_nodes=2, service_args=(GPU_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 2, 120, "2 nodes registered")
    cluster.client.submit(
        [
            gpu_job(make_job("picky", cpu=100), models=("A100",)),
            gpu_job(make_job("whole", replicas=2, cpu=100), 1),
        ]
    )
    whole = wait_until(lambda: bound(cluster, "whole", 2), 120, "the whole-card pods bound")
    # Two cards are left wholly free: six shares of 300 fit, three to a card, at most.
    cluster.client.submit([gpu_job(make_job("shares", replicas=6, cpu=100), milli=300)])
    shares = wait_until(lambda: bound(cluster, "shares", 6), 120, "the shares bound")

    held: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
    for p in whole:
        assert len(p.spec.gpu_cards) == 1, p.metadata.name
        held[(p.spec.node_name, p.spec.gpu_cards[0])].append((p.metadata.name, 1000))
    for p in shares:
        assert len(p.spec.gpu_cards) == 1, p.metadata.name
        held[(p.spec.node_name, p.spec.gpu_cards[0])].append((p.metadata.name, 300))
    for (node, card), holders in held.items():
        assert 0 <= card < 2, (node, card)
        assert sum(m for _, m in holders) <= 1000, (node, card, holders)
        if any(m == 1000 for _, m in holders):
            assert len(holders) == 1, f"whole card {card} of {node} shared: {holders}"
    assert len({key for p in whole for key in held if (p.metadata.name, 1000) in held[key]}) == 2

    # No node has the model the picky pod accepts: it stays pending, and explain says why.
    def explained() -> str:
        summary = cluster.client.explain("picky-0").summary
        return summary if "GPU model not accepted" in summary else ""

    summary = wait_until(explained, 60, "an explanation for the picky pod")
    assert not cluster.client.get("Pod", "picky-0").spec.node_name  # type: ignore[attr-defined]
    assert summary in cluster.godel("explain", "picky-0").stdout
