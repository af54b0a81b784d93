"""JobLevelAffinity, table-driven: a gang against nodes labelled with racks and switches ->
the domain its pods land in (best fit first, preferred switch first, spilling only within the
required rack), or the reason it fits no single domain. Run through the real unit search with
the default profile, so the groups are what the shards use. Plus the cross-node rule the Binder
and audit share (``domain_violations``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from placement.framework import Framework, JobAffinity, PodInfo, Profile, UnitInfo
from placement.nodeinfo import NodeInfo
from placement.plugins import new_in_tree_registry
from placement.plugins.joblevelaffinity import JobLevelAffinity, domain_violations
from placement.search import UnitScheduler
from placement.snapshot import Snapshot
from tests.factories import GiB, job, job_affinity, node, pods_of

# Rack a: 4 nodes on switches a1 (2) and a2 (2). Rack b: 8 nodes on b1 (4) and b2 (4). Two nodes
# carry no rack label. Every node: 4 cpu.
LAYOUT = (
    [("a", "a1")] * 2 + [("a", "a2")] * 2 + [("b", "b1")] * 4 + [("b", "b2")] * 4 + [("", "")] * 2
)


def nodes() -> list[NodeInfo]:
    out = []
    for i, (rack, switch) in enumerate(LAYOUT):
        n = node(f"{rack or 'x'}-{i:02d}", cpu=4000, mem=64 * GiB)
        if rack:
            n.metadata.labels.update(rack=rack, switch=switch)
        out.append(NodeInfo.from_node(n))
    return out


@dataclass
class Case:
    id: str
    replicas: int
    cpu: int
    required: list[str]
    preferred: list[str] = field(default_factory=list)
    placed_nodes: tuple[str, ...] = ()
    # Movement recommendations (node, tag) the unit's pods try first.
    recommended: list[tuple[str, str]] = field(default_factory=list)
    # Expected: the (rack, switch) pairs the pods land on, or a substring of the failure.
    lands: set[tuple[str, str]] | None = None
    reason: str = ""


def where(n: NodeInfo) -> tuple[str, str]:
    return (n.labels.get("rack", ""), n.labels.get("switch", ""))


CASES = [
    Case("gang of 10 lands in the rack that fits best (a, the smaller)", 10, 1000, ["rack"],
         lands={("a", "a1"), ("a", "a2")}),
    Case("gang of 20 too big for rack a goes to rack b", 20, 1000, ["rack"],
         lands={("b", "b1"), ("b", "b2")}),
    Case("gang of 40 fits no single rack", 40, 1000, ["rack"],
         reason="nodes fit: 12 in no single rack domain with room for the whole gang (40 pods), "
                "2 without label rack"),
    Case("preferred switch: a gang of 3 stays on one switch", 3, 2000, ["rack"], ["switch"],
         lands={("a", "a1")}),
    Case("spills from the switches only within the rack, never across", 5, 2000,
         ["rack"], ["switch"], lands={("a", "a1"), ("a", "a2")}),
    Case("rack a has the room in sum but not per node: rack b", 5, 3000, ["rack"],
         lands={("b", "b1"), ("b", "b2")}),
    Case("pods already placed fix the rack", 2, 1000, ["rack"], ["switch"],
         placed_nodes=("b-04",), lands={("b", "b1")}),
    Case("placed pods fix the rack even when it is full", 2, 1000, ["rack"],
         placed_nodes=("x-12",), reason="outside the rack domain of the job's placed pods"),
    Case("a recommendation outside the chosen rack is not taken", 2, 1000, ["rack"],
         recommended=[("b-04", "m1"), ("a-00", "m1")], lands={("a", "a1")}),
    Case("preferred only: one switch, else anywhere", 4, 4000, [], ["switch"],
         lands={("b", "b1")}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_job_level_affinity_domain_choice_and_spill(case: Case) -> None:
    snapshot = Snapshot.of(nodes())
    j = job_affinity(job("g", replicas=case.replicas, cpu=case.cpu, mem=GiB), case.required,
                     case.preferred)  # fmt: skip
    pods = [PodInfo.from_pod(p) for p in pods_of(j)]
    unit = UnitInfo(
        "g",
        case.replicas,
        0,
        0,
        pods,
        affinity=JobAffinity.from_job(j),
        placed_nodes=case.placed_nodes,
        preferred=list(case.recommended),
    )
    result = UnitScheduler(Framework(Profile(), new_in_tree_registry())).schedule(unit, snapshot)
    if case.lands is None:
        assert not result.success
        assert case.reason in result.reason, result.reason
        assert all(case.reason in why for why in result.unplaced.values())
        return
    assert result.success, result.reason
    assert len(result.placements) == case.replicas
    assert {where(snapshot.infos[p.node]) for p in result.placements} == case.lands


def test_a_unit_without_job_affinity_is_not_grouped() -> None:
    unit = UnitInfo("g", 1, 0, 0, [])
    assert JobLevelAffinity().group(unit, nodes()) is None


@pytest.mark.parametrize(
    ("placed", "refused"),
    [
        ([("p0", {"rack": "a"}), ("p1", {"rack": "a"})], {}),
        (
            [("p0", {"rack": "a"}), ("p1", {"rack": "b"})],
            {"p1": "node is in rack=b, the job's pods are in rack=a"},
        ),
        ([("p0", {"zone": "z"}), ("p1", {"rack": "a"})], {"p0": "node has no rack label"}),
        ([("p0", None)], {"p0": "node has no rack label"}),
    ],
    ids=["one-domain", "second-domain-refused", "missing-label", "unknown-node"],
)
def test_domain_violations(
    placed: list[tuple[str, dict[str, str] | None]], refused: dict[str, str]
) -> None:
    got = domain_violations(JobAffinity(("rack",)), placed)
    assert set(got) == set(refused)
    for pod, why in refused.items():
        assert why in got[pod]
