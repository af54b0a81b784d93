"""A queue's max (``placement.quotas``), the one judgement the dispatcher's admission, the
Binder's check and ``godel audit`` share: pure, table-driven."""

from __future__ import annotations

import pytest

from placement.quotas import (
    DEFAULT_QUEUE,
    Excess,
    QueueExcess,
    SubtreeUsage,
    first_excess,
    held_below,
    hierarchy_excess,
    lineage,
    maxima,
    queue_of,
    quota_excess,
)
from placement.resources import Quantities
from protos.godel.v1 import objects_pb2 as pb


def q(cpu: int = 0, mem: int = 0, gpus: int = 0, pods: int = 0, **ext: int) -> Quantities:
    return Quantities(cpu, mem, gpus, pods, dict(ext))


# (case, quota, used, request, expected first excess)
QUOTA_CASES: list[tuple[str, pb.Resources | None, Quantities, Quantities, Excess | None]] = [
    ("no quota", None, q(cpu=10**9), q(cpu=10**9), None),
    ("empty quota is unlimited", pb.Resources(), q(cpu=5), q(cpu=5), None),
    ("fits exactly", pb.Resources(milli_cpu=1000), q(cpu=600), q(cpu=400), None),
    ("cpu over", pb.Resources(milli_cpu=1000), q(cpu=600), q(cpu=401), Excess("cpu", 1001, 1000)),
    ("unset cpu unlimited, memory over", pb.Resources(memory_bytes=100), q(cpu=10**6, mem=50),
     q(mem=51), Excess("memory", 101, 100)),
    # GPUs count in milli-GPU against a max in whole cards: shares count as what they are.
    ("gpus over", pb.Resources(gpus=2), q(gpus=2000), q(gpus=1000), Excess("gpus", 3000, 2000)),
    ("gpu shares within", pb.Resources(gpus=2), q(gpus=1500), q(gpus=500), None),
    ("gpu shares over", pb.Resources(gpus=2), q(gpus=1500), q(gpus=501), Excess("gpus", 2001, 2000)),
    ("pod count over", pb.Resources(pods=3), q(pods=2), q(pods=2), Excess("pods", 4, 3)),
    ("extended over", pb.Resources(extended={"fpga": 1}), q(fpga=1), q(fpga=1),
     Excess("fpga", 2, 1)),
    ("extended not requested", pb.Resources(extended={"fpga": 1}), q(fpga=1), q(cpu=1), None),
    ("already over, nothing asked", pb.Resources(milli_cpu=1000), q(cpu=1600), q(),
     Excess("cpu", 1600, 1000)),
    ("the first resource over is named", pb.Resources(milli_cpu=10, gpus=1), q(cpu=10, gpus=1),
     q(cpu=1, gpus=1), Excess("cpu", 11, 10)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("quota", "used", "request_", "expected"),
    [c[1:] for c in QUOTA_CASES],
    ids=[c[0] for c in QUOTA_CASES],
)
def test_first_excess(
    quota: pb.Resources | None, used: Quantities, request_: Quantities, expected: Excess | None
) -> None:
    assert first_excess(quota, used, request_) == expected
    assert quota_excess(quota, used, request_) == (expected.resource if expected else "")


def queue(name: str, *, cpu: int = 0, parent: str = "", gpus: int = 0) -> pb.Queue:
    out = pb.Queue(metadata=pb.ObjectMeta(name=name))
    if cpu or gpus:
        out.spec.quota.milli_cpu = cpu
        out.spec.quota.gpus = gpus
    out.spec.parent = parent
    return out


# org (max 2000m) > team-a (max 1000m) > team-a1 (no max); org > team-b (no max); solo (no max)
QUEUES = {
    x.metadata.name: x
    for x in (
        queue("org", cpu=2000),
        queue("team-a", cpu=1000, parent="org"),
        queue("team-a1", parent="team-a"),
        queue("team-b", parent="org"),
        queue("solo"),
        queue("loop-1", cpu=1000, parent="loop-2"),
        queue("loop-2", parent="loop-1"),
    )
}

# (case, queue, request, holdings per queue, expected (queue over, resource) or None)
HierarchyCase = tuple[str, str, Quantities, dict[str, Quantities], tuple[str, str] | None]
HIERARCHY_CASES: list[HierarchyCase] = [
    ("no max anywhere", "solo", q(cpu=10**6), {"solo": q(cpu=10**6)}, None),
    ("an unknown queue has no max", "nowhere", q(cpu=10**6), {}, None),
    ("own max holds", "team-a", q(cpu=400), {"team-a": q(cpu=600)}, None),
    ("own max exceeded", "team-a", q(cpu=401), {"team-a": q(cpu=600)}, ("team-a", "cpu")),
    ("a child's holdings count against its parent's max", "team-a", q(cpu=401),
     {"team-a1": q(cpu=600)}, ("team-a", "cpu")),
    ("a queue without a max is bounded by its parent's", "team-b", q(cpu=500),
     {"team-a": q(cpu=1000), "team-b": q(cpu=600)}, ("org", "cpu")),
    ("a grandchild is bounded by every max above it", "team-a1", q(cpu=500),
     {"team-b": q(cpu=1600)}, ("org", "cpu")),
    ("siblings do not count against each other's max", "team-a", q(cpu=1000),
     {"team-b": q(cpu=900)}, None),
    ("a cycle of parents ends the walk", "loop-2", q(cpu=1001), {}, ("loop-1", "cpu")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("queue_name", "request_", "holdings", "expected"),
    [c[1:] for c in HIERARCHY_CASES],
    ids=[c[0] for c in HIERARCHY_CASES],
)
def test_hierarchy_excess(
    queue_name: str,
    request_: Quantities,
    holdings: dict[str, Quantities],
    expected: tuple[str, str] | None,
) -> None:
    """The dispatcher's way (sums per question) and the Binder's (a ``SubtreeUsage`` charged
    as pods come) agree."""
    summed = hierarchy_excess(
        queue_name,
        request_,
        QUEUES.get,
        lambda judged: held_below(judged, QUEUES.get, lambda x: holdings.get(x, q()), holdings),
    )
    kept = SubtreeUsage(QUEUES.get, holdings).excess(queue_name, request_)
    assert summed == kept
    assert (None if kept is None else (kept.queue, kept.excess.resource)) == expected


def test_held_below_sums_the_queue_and_its_descendants() -> None:
    holdings = {"org": q(cpu=1), "team-a": q(cpu=10), "team-a1": q(cpu=100), "solo": q(cpu=1000)}
    used = lambda x: holdings.get(x, q())  # noqa: E731
    assert held_below("org", QUEUES.get, used, holdings).cpu == 111
    assert held_below("team-a", QUEUES.get, used, holdings).cpu == 110
    assert held_below("solo", QUEUES.get, used, holdings).cpu == 1000
    usage = SubtreeUsage(QUEUES.get, holdings)
    assert [usage.held(x).cpu for x in ("org", "team-a", "solo", "nowhere")] == [111, 110, 1000, 0]


def test_subtree_usage_charges_reach_every_parent() -> None:
    usage = SubtreeUsage(QUEUES.get)
    usage.charge("team-a1", q(cpu=700))
    assert (usage.held("team-a").cpu, usage.held("org").cpu) == (700, 700)
    assert usage.excess("team-a1", q(cpu=301)) == QueueExcess("team-a", Excess("cpu", 1001, 1000))
    usage.charge("team-a1", q(cpu=700), -1)
    assert usage.excess("team-a1", q(cpu=1000)) is None


def test_maxima_over_the_lineage() -> None:
    assert lineage("team-a1", QUEUES.get) == ("team-a1", "team-a", "org")
    assert [x for x, _ in maxima(lineage("team-a1", QUEUES.get), QUEUES.get)] == ["team-a", "org"]
    assert maxima(lineage("solo", QUEUES.get), QUEUES.get) == []
    assert maxima(lineage("nowhere", QUEUES.get), QUEUES.get) == []


def test_over_max_reports_queues_holding_more_than_their_max() -> None:
    holdings = {"team-a1": q(cpu=1600), "team-b": q(cpu=500), "solo": q(cpu=10**6)}
    assert SubtreeUsage(QUEUES.get, holdings).over_max(QUEUES) == [
        QueueExcess("org", Excess("cpu", 2100, 2000)),
        QueueExcess("team-a", Excess("cpu", 1600, 1000)),
    ]


def test_describe_names_the_rule_the_queue_and_the_amounts() -> None:
    own = QueueExcess("team-a", Excess("cpu", 1600, 1000)).describe("team-a")
    assert own == "QueueQuota: queue 'team-a' would hold 1600m of cpu, over its max 1000m"
    parent = QueueExcess("org", Excess("memory", 3, 2)).describe("team-b")
    assert parent == (
        "QueueQuota: parent queue 'org' of 'team-b' would hold 3B of memory, over its max 2B"
    )


def test_queue_of_defaults() -> None:
    pod = pb.Pod()
    assert queue_of(pod) == DEFAULT_QUEUE
    pod.spec.queue = "research"
    assert queue_of(pod) == "research"
