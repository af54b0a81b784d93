"""The Binder's single-node checks (``BatchPlan._check_node``) judge a node's placements of a
batch against the authoritative ``NodeInfo`` itself until the batch must change something there
(a victim or a hold taken off, an accepted pod added for the next placement to see): then
against a clone. The verdicts are the ones a clone per node always gave, and the state the
next batch is judged against is never changed by the judging."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from placement.rules import hard_rules
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.binder.decide import CONFLICT, BatchPlan
from services.binder.state import ClusterState
from tests import factories as f


def _pending(name: str, cpu: int, *, priority: int = 0) -> tuple[pb.Job, pb.Pod]:
    job = f.job(name, cpu=cpu)
    job.spec.priority = priority
    pod = f.pods_of(job)[0]
    pod.metadata.resource_version = 5
    pod.spec.priority = priority
    return job, pod


def _bound(name: str, node: str, cpu: int) -> pb.Pod:
    _, pod = _pending(name, cpu)
    pod.spec.node_name = node
    pod.status.phase = pb.POD_RUNNING
    pod.status.started_ms = 1
    pod.spec.preemptible = True
    return pod


@dataclass
class Case:
    id: str
    # (pod, node, milli-CPU, victims) in batch order; each its own one-pod job.
    placements: list[tuple[str, str, int, tuple[str, ...]]]
    accepted: set[str]
    # Pods on the nodes before the batch: (name, node, milli-CPU).
    bound: list[tuple[str, str, int]] = field(default_factory=list)


CASES = [
    Case("one pod that fits", [("a", "n1", 1000, ())], {"a"}),
    Case("one pod too big", [("a", "n1", 5000, ())], set()),
    Case("one pod that fits beside a bound one", [("a", "n1", 2000, ())], {"a"},
         bound=[("x", "n1", 2000)]),
    Case("one pod that does not fit beside a bound one", [("a", "n1", 3000, ())], set(),
         bound=[("x", "n1", 2000)]),
    Case("two that fit together", [("a", "n1", 2000, ()), ("b", "n1", 2000, ())], {"a", "b"}),
    Case("the second sees the first", [("a", "n1", 3000, ()), ("b", "n1", 2000, ())], {"a"}),
    Case("the third sees both", [("a", "n1", 1500, ()), ("b", "n1", 1500, ()),
                                 ("c", "n1", 1500, ())], {"a", "b"}),
    Case("a refused one takes no room", [("a", "n1", 5000, ()), ("b", "n1", 4000, ())], {"b"}),
    Case("nodes apart", [("a", "n1", 3000, ()), ("b", "n2", 3000, ())], {"a", "b"}),
    Case("a preemptor takes its victim's room", [("a", "n1", 4000, ("x",))], {"a"},
         bound=[("x", "n1", 3000)]),
    Case("a placement before a preemptor gets none of the room it frees",
         [("a", "n1", 2000, ()), ("b", "n1", 3000, ("x",))], {"b"}, bound=[("x", "n1", 3000)]),
    Case("a placement after a preemptor sees what it took",
         [("b", "n1", 3000, ("x",)), ("a", "n1", 2000, ())], {"b"}, bound=[("x", "n1", 3000)]),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_nodes_placements_are_judged_in_order_and_the_state_is_left_as_it_was(
    case: Case,
) -> None:
    state = ClusterState()
    for name in ("n1", "n2"):
        state.on_add("Node", f.node(name, cpu=4000))
    for name, node, cpu in case.bound:
        state.on_add("Pod", _bound(name, node, cpu))
    before = {
        name: (dict(info.pods), {k: list(v) for k, v in info.requested.items()}, info.generation)
        for name, info in state.infos.items()
    }
    batch = ipb.DecisionBatch(shard="s", batch_id=1)
    pods: dict[str, pb.Pod | None] = {}
    jobs: dict[str, pb.Job | None] = {}
    for name, node, cpu, victims in case.placements:
        job, pod = _pending(name, cpu, priority=100 if victims else 0)
        jobs[name], pods[pod.metadata.name] = job, pod
        batch.units.add(job=name, min_member=1).placements.add(
            pod=pod.metadata.name, node=node, pod_resource_version=5, victims=victims
        )
    victims_read: dict[str, pb.Pod | None] = {
        name: _bound(name, node, cpu) for name, node, cpu in case.bound
    }
    plan = BatchPlan(batch, pods, jobs, state, hard_rules(), victims_read)
    plan.run()
    assert {c.job for c in plan.candidates.values()} == case.accepted
    for refused in {p[0] for p in case.placements} - case.accepted:
        (rejection,) = [r for n, r in plan.rejected.items() if n.startswith(f"{refused}-")]
        assert rejection.code == CONFLICT
    after = {
        name: (dict(info.pods), {k: list(v) for k, v in info.requested.items()}, info.generation)
        for name, info in state.infos.items()
    }
    assert after == before
