"""Reclaim's victim choice: which borrowed pods go so a queue below its min gets its guaranteed
capacity. Pure and table-driven."""

from __future__ import annotations

import pytest

from placement.budgets import BudgetTracker
from placement.nodeinfo import BEST_EFFORT, GUARANTEED
from placement.resources import Quantities
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.reclaim import choose_victims
from services.dispatcher.dispatching.unitqueue import Claim

# Every pod a claim below was made for, as the dispatcher's informer would read it.
PODS: dict[str, pb.Pod] = {}


def claim(
    name: str,
    queue: str = "b",
    *,
    cpu: int = 1000,
    mem: int = 0,
    priority: int = 0,
    started: int = 0,
    pool: str = GUARANTEED,
    job: str = "",
) -> Claim:
    pod = pb.Pod(metadata=pb.ObjectMeta(name=name, uid=f"uid-{name}"))
    pod.spec.job = job or f"{queue}-job"
    pod.spec.queue = queue
    pod.spec.priority = priority
    pod.spec.node_name = "n1"
    pod.spec.template.requests.milli_cpu = cpu
    pod.spec.template.requests.memory_bytes = mem
    pod.status.phase = pb.POD_RUNNING
    pod.status.started_ms = started
    if pool == BEST_EFFORT:
        pod.spec.qos = pb.QOS_BEST_EFFORT
    PODS[name] = pod
    return Claim.of(pod)


def budget(job: str, allowed: int) -> pb.DisruptionBudget:
    b = pb.DisruptionBudget(metadata=pb.ObjectMeta(name=f"{job}-budget"))
    b.spec.job = job
    b.spec.max_unavailable = 0
    b.status.disruptions_allowed = allowed
    return b


# (case, need cpu of queue "a", claims, mins {queue: cpu}, budgets, victims in order)
CASES: list[tuple[str, int, list[Claim], dict[str, int], list[pb.DisruptionBudget], list[str]]] = [
    ("lowest priority first", 1000,
     [claim("hi", priority=5), claim("lo", priority=1)], {}, [], ["lo"]),
    ("any priority when only it is borrowed", 1000,
     [claim("top", priority=1000)], {}, [], ["top"]),
    ("newest first among equals (least work lost)", 1000,
     [claim("old", started=1), claim("new", started=9)], {}, [], ["new"]),
    ("enough to cover the need, no more", 2500,
     [claim(f"p{i}", started=i) for i in range(5)], {}, [], ["p4", "p3", "p2"]),
    ("only beyond the other queue's min", 3000,
     [claim(f"p{i}", started=i) for i in range(4)], {"b": 3000}, [], ["p3"]),
    ("a queue at its min loses nothing", 1000,
     [claim("p0"), claim("p1")], {"b": 2000}, [], []),
    ("the starving queue's own pods stay", 1000,
     [claim("mine", queue="a"), claim("theirs")], {}, [], ["theirs"]),
    ("from several lending queues", 2000,
     [claim("b1", priority=3), claim("c1", queue="c", priority=1)], {}, [], ["c1", "b1"]),
    ("a disruption budget keeps its pod", 1000,
     [claim("kept", priority=0, job="guarded"), claim("next", priority=2)], {},
     [budget("guarded", 0)], ["next"]),
    ("a budget allowing one lets one go", 2000,
     [claim("g1", job="guarded", started=2), claim("g2", job="guarded", started=1)], {},
     [budget("guarded", 1)], ["g1"]),
    ("a pod that frees nothing needed is not taken", 1000,
     [claim("memory-only", cpu=0, mem=1 << 30), claim("cpu")], {}, [], ["cpu"]),
    ("best-effort pods do not hold guaranteed capacity", 1000,
     [claim("be", pool=BEST_EFFORT), claim("g")], {}, [], ["g"]),
    ("not enough borrowed: what there is", 5000, [claim("only")], {}, [], ["only"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("need", "claims", "mins", "budgets", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_choose_victims(
    need: int,
    claims: list[Claim],
    mins: dict[str, int],
    budgets: list[pb.DisruptionBudget],
    expected: list[str],
) -> None:
    usage: dict[str, Quantities] = {}
    for c in claims:
        usage.setdefault(c.queue, Quantities()).add(c.requests)
    victims = choose_victims(
        {"a": Quantities(cpu=need)},
        claims,
        PODS.get,
        lambda q: usage.get(q, Quantities()),
        lambda q: Quantities(cpu=mins.get(q, 0)),
        BudgetTracker(budgets),
    )
    assert [v.pod.metadata.name for v in victims] == expected
    assert all(v.for_queue == "a" for v in victims)


def test_excluded_pods_are_not_chosen_again() -> None:
    claims = [claim("gone-soon", started=9), claim("other", started=1)]
    victims = choose_victims(
        {"a": Quantities(cpu=1000)},
        claims,
        PODS.get,
        lambda q: Quantities(cpu=2000, pods=2),
        lambda q: Quantities(),
        BudgetTracker(()),
        exclude=frozenset({"gone-soon"}),
    )
    assert [v.pod.metadata.name for v in victims] == ["other"]


def test_a_claim_whose_pod_is_gone_from_the_view_is_not_chosen() -> None:
    claims = [claim("vanished", started=9), claim("other", started=1)]
    victims = choose_victims(
        {"a": Quantities(cpu=1000)},
        claims,
        lambda name: None if name == "vanished" else PODS.get(name),
        lambda q: Quantities(cpu=2000, pods=2),
        lambda q: Quantities(),
        BudgetTracker(()),
    )
    assert [v.pod.metadata.name for v in victims] == ["other"]


def test_claims_of_pods_asking_the_same_share_one_quantities() -> None:
    requests = pb.Resources(milli_cpu=500, memory_bytes=1 << 30)
    template = pb.PodTemplate(requests=requests)
    one, two = Quantities.shared_request(template), Quantities.shared_request(template)
    assert one is two and (one.cpu, one.mem, one.pods) == (500, 1 << 30, 1)
    other = Quantities.shared_request(
        pb.PodTemplate(requests=pb.Resources(milli_cpu=500, extended={"x/fpga": 1}))
    )
    assert other is not one and other.extended == {"x/fpga": 1}


def test_only_the_pods_weighed_are_read_and_one_being_deleted_is_not_chosen() -> None:
    leaving = claim("leaving", started=9)
    PODS["leaving"].metadata.deletion_timestamp_ms = 5
    claims = [Claim.of(PODS["leaving"]), claim("newer", started=8)]
    claims += [claim(f"older-{i}", started=i) for i in range(5)]
    read: list[str] = []

    def read_pod(name: str) -> pb.Pod | None:
        read.append(name)
        return PODS.get(name)

    victims = choose_victims(
        {"a": Quantities(cpu=1000)},
        claims,
        read_pod,
        lambda q: Quantities(cpu=7000, pods=7),
        lambda q: Quantities(),
        BudgetTracker(()),
    )
    assert leaving.deleting is False and claims[0].deleting is True
    assert [v.pod.metadata.name for v in victims] == ["newer"] and read == ["newer"]
