"""Table-driven cases for the shared fit check (scheduler and binder both rely on it)."""

from __future__ import annotations

import pytest

from placement.framework import PodInfo
from placement.nodeinfo import (
    INSUFFICIENT_CPU,
    INSUFFICIENT_GPUS,
    INSUFFICIENT_MEMORY,
    TOO_MANY_PODS,
    NodeInfo,
    PodRequest,
    port_conflict,
    resource_fit_failures,
)
from protos.godel.v1 import objects_pb2 as pb
from tests.factories import GiB, job, node, pods_of


def info(**kw: int) -> NodeInfo:
    return NodeInfo.from_node(node("n", **kw))


def req(
    name: str = "p",
    pool: str = "g",
    cpu: int = 0,
    mem: int = 0,
    gpu: int = 0,
    ports: tuple[tuple[str, int], ...] = (),
) -> PodRequest:
    return PodRequest(name, pool, cpu, mem, gpu, ports)


CASES = [
    # name, node kwargs, pods already there, the new pod, expected failures
    ("fits exactly", dict(cpu=1000, mem=GiB), [req("a", cpu=500)], req(cpu=500, mem=GiB), []),
    ("cpu over by one", dict(cpu=1000), [req("a", cpu=500)], req(cpu=501), [INSUFFICIENT_CPU]),
    ("memory", dict(mem=GiB), [], req(mem=GiB + 1), [INSUFFICIENT_MEMORY]),
    # PodRequest amounts are milli-GPU: one card is 1000.
    ("gpus", dict(gpus=1), [req("a", gpu=1000)], req(gpu=1000), [INSUFFICIENT_GPUS]),
    ("gpu shares of one card", dict(gpus=1), [req("a", gpu=600)], req(gpu=400), []),
    (
        "gpu shares over one card",
        dict(gpus=1),
        [req("a", gpu=600)],
        req(gpu=401),
        [INSUFFICIENT_GPUS],
    ),
    (
        "pod slots are shared by the pools",
        dict(pods=1, be_cpu=1000),
        [req("a")],
        req(pool="be", cpu=1),
        [TOO_MANY_PODS],
    ),
    (
        "best-effort uses the reclaimable pool",
        dict(cpu=4000, be_cpu=100),
        [],
        req(pool="be", cpu=200),
        [INSUFFICIENT_CPU],
    ),
    (
        "guaranteed ignores best-effort usage",
        dict(cpu=1000, be_cpu=1000),
        [req("a", pool="be", cpu=1000)],
        req(cpu=1000),
        [],
    ),
    ("zero request always fits resources", dict(cpu=0, mem=0), [], req(), []),
    (
        "several failures at once",
        dict(cpu=100, mem=100, pods=1),
        [req("a")],
        req(cpu=200, mem=200),
        [TOO_MANY_PODS, INSUFFICIENT_CPU, INSUFFICIENT_MEMORY],
    ),
]


@pytest.mark.parametrize(
    ("name", "node_kw", "existing", "pod", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_resource_fit(
    name: str,
    node_kw: dict[str, int],
    existing: list[PodRequest],
    pod: PodRequest,
    expected: list[str],
) -> None:
    n = info(**node_kw)
    for e in existing:
        assert n.add_pod(e)
    assert resource_fit_failures(n, pod) == expected


def test_add_remove_is_exact_and_idempotent() -> None:
    n = info(cpu=1000)
    gen = n.generation
    assert n.add_pod(req("a", cpu=300, ports=(("TCP", 80),)))
    assert not n.add_pod(req("a", cpu=300))  # counted once
    assert n.free("g")[0] == 700 and port_conflict(n, req(ports=(("TCP", 80),)))
    assert not port_conflict(n, req(ports=(("UDP", 80),)))
    assert n.remove_pod("a") is not None and n.remove_pod("a") is None
    assert n.free("g")[0] == 1000 and not n.used_ports and n.generation > gen


def test_clone_is_independent() -> None:
    n = info(cpu=1000)
    c = n.clone()
    c.add_pod(req("a", cpu=1000))
    assert n.free("g")[0] == 1000 and c.free("g")[0] == 0
    # Capacity is shared until the node changes; a change replaces it, so the clone keeps its own.
    assert c.capacity is n.capacity
    n.set_node(node("n", cpu=2000))
    assert n.free("g")[0] == 2000 and c.free("g")[0] == 0 and c.capacity["g"][0] == 1000


def test_host_ports_of_a_clone_and_its_source_stay_apart() -> None:
    n = info(cpu=1000)
    n.add_pod(req("a", ports=(("TCP", 80),)))
    c = n.clone()
    c.add_pod(req("b", ports=(("TCP", 81),)))
    n.remove_pod("a")
    assert n.used_ports == set() and c.used_ports == {("TCP", 80), ("TCP", 81)}
    c.remove_pod("b")
    assert c.used_ports == {("TCP", 80)} and port_conflict(c, req(ports=(("TCP", 80),)))


def test_set_node_keeps_pods() -> None:
    n = info(cpu=1000)
    n.add_pod(req("a", cpu=400))
    bigger = node("n", cpu=2000)
    bigger.spec.taints.add(key="k", effect=pb.NO_SCHEDULE)
    n.set_node(bigger)
    assert n.free("g")[0] == 1600 and len(n.taints) == 1


def test_renamed_requests_and_pod_infos_keep_everything_but_the_name() -> None:
    pod = pods_of(job("a", cpu=300, mem=7))[0]
    pod.spec.template.node_selector["zone"] = "z1"
    pod.spec.priority = 9
    info = PodInfo.from_pod(pod)
    copy = info.renamed("a-0-r1", b"k")
    assert (copy.name, copy.req.name, copy.template_key, copy.resource_version) == (
        "a-0-r1", "a-0-r1", b"k", 0,
    )  # fmt: skip
    assert (copy.req.cpu, copy.req.mem, copy.req.priority) == (300, 7, 9)
    assert copy.node_selector == info.node_selector and copy.job == info.job
    assert info.name == "a-0" and info.req.name == "a-0"  # the original is untouched


def test_a_clone_shares_the_pod_map_until_either_side_changes() -> None:
    """A snapshot's clone holds no copy of the node's pods until one side changes them (a copy
    per node was ~45 bytes a pod in every shard); a change on either side never shows on the
    other."""
    live = info(cpu=4000, mem=4 * GiB)
    live.add_pod(req("a", cpu=100))
    clone = live.clone()
    assert clone.pods is live.pods  # shared, not copied
    clone.add_pod(req("b", cpu=100))  # the search assumes a pod on its clone
    assert sorted(clone.pods) == ["a", "b"] and sorted(live.pods) == ["a"]
    again = live.clone()
    live.remove_pod("a")  # the informer's change, after a snapshot took the node
    assert sorted(again.pods) == ["a"] and again.requested["g"][0] == 100
    assert live.pods == {} and live.requested["g"][0] == 0
    assert live.remove_pod("a") is None and again.remove_pod("zz") is None
    assert again.pods_shared  # a removal of nothing copies nothing
