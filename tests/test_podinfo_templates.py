"""``PodInfo.from_pod`` reads each distinct template once (``TemplateView``, by template key):
the shards, the Binder, preemption and audit build their view of a pod through it, so a view
shared by the pods of one template must be, field for field, the one the pod alone gives. The
oracle below is ``from_pod`` as it was before the views were shared: every field read from the
pod itself."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from placement.framework import PodInfo, interface
from placement.framework.interface import SpreadConstraint, Toleration, template_key
from placement.labelselector import pod_term, requirement, selector
from placement.nodeinfo import PodRequest
from protos.godel.v1 import objects_pb2 as pb
from tests.factories import GiB


def oracle(pod: pb.Pod, *, keyed: bool = True) -> PodInfo:
    """The pod's view read from the pod alone (no part shared)."""
    tpl = pod.spec.template
    req = PodRequest.from_pod(pod)
    aff = tpl.affinity
    node_aff = aff.node_affinity
    pod_affinity = tuple(pod_term(t) for t in aff.pod_affinity.required)
    preferred = tuple((w.weight, pod_term(w.term)) for w in aff.pod_affinity.preferred) + tuple(
        (-w.weight, pod_term(w.term)) for w in aff.pod_anti_affinity.preferred
    )
    spread = tuple(
        SpreadConstraint(
            c.max_skew,
            c.topology_key,
            c.when_unsatisfiable != pb.TopologySpreadConstraint.SCHEDULE_ANYWAY,
            selector(c.label_selector),
        )
        for c in tpl.topology_spread_constraints
    )
    return PodInfo(
        name=pod.metadata.name,
        job=pod.spec.job,
        resource_version=pod.metadata.resource_version,
        req=req,
        template_key=template_key(pod) if keyed else b"",
        node_selector=tuple(sorted(tpl.node_selector.items())),
        required_terms=tuple(
            tuple(requirement(r) for r in t.match_expressions) for t in node_aff.required
        ),
        preferred_terms=tuple(
            (p.weight, tuple(requirement(r) for r in p.preference.match_expressions))
            for p in node_aff.preferred
        ),
        tolerations=tuple(
            Toleration(t.key, t.operator == pb.Toleration.EXISTS, t.value, int(t.effect))
            for t in tpl.tolerations
        ),
        priority=pod.spec.priority,
        preemption_policy=pod.spec.preemption_policy,
        labels=req.labels,
        pod_affinity=pod_affinity,
        preferred_pod_terms=preferred,
        spread=spread,
        has_topology=bool(pod_affinity or preferred or spread or req.anti_terms),
    )


def fields(info: PodInfo) -> dict[str, object]:
    """Every field of the view and of its request (``PodRequest`` compares without labels)."""
    out: dict[str, object] = {f"req.{s}": getattr(info.req, s) for s in PodRequest.__slots__}
    out.update({s: getattr(info, s) for s in PodInfo.__slots__ if s != "req"})
    return out


def pod(name: str = "j-0", job: str = "j") -> pb.Pod:
    """A pending pod of a template with something of everything placement reads."""
    p = pb.Pod(metadata=pb.ObjectMeta(name=name, resource_version=7))
    p.metadata.labels["app"] = "web"
    p.spec.job = job
    p.spec.priority = 3
    p.spec.qos = pb.QOS_GUARANTEED
    tpl = p.spec.template
    tpl.labels["app"] = "web"
    tpl.requests.milli_cpu = 500
    tpl.requests.memory_bytes = GiB
    tpl.node_selector["zone"] = "a"
    tpl.ports.add(container_port=80, host_port=8080)
    tpl.tolerations.add(key="gpu", operator=pb.Toleration.EXISTS)
    nterm = tpl.affinity.node_affinity.required.add()
    nterm.match_expressions.add(key="disk", operator=pb.LabelSelectorRequirement.IN, values=["ssd"])
    pref = tpl.affinity.node_affinity.preferred.add(weight=5)
    pref.preference.match_expressions.add(key="rack", operator=pb.LabelSelectorRequirement.EXISTS)
    anti = tpl.affinity.pod_anti_affinity.required.add(topology_key="hostname")
    anti.label_selector.add(key="app", operator=pb.LabelSelectorRequirement.IN, values=["web"])
    tpl.affinity.pod_affinity.preferred.add(weight=2).term.topology_key = "zone"
    c = tpl.topology_spread_constraints.add(max_skew=1, topology_key="zone")
    c.label_selector.add(key="app", operator=pb.LabelSelectorRequirement.IN, values=["web"])
    p.status.phase = pb.POD_PENDING
    return p


def plain(name: str = "p-0") -> pb.Pod:
    """A pod of the benchmark's shape: requests only."""
    p = pb.Pod(metadata=pb.ObjectMeta(name=name, resource_version=3))
    p.spec.job = name.rsplit("-", 1)[0]
    p.spec.qos = pb.QOS_GUARANTEED
    p.spec.template.requests.milli_cpu = 100
    p.spec.template.requests.memory_bytes = 500 << 20
    return p


def _set(change: Callable[[pb.Pod], object]) -> Callable[[pb.Pod], pb.Pod]:
    def made(p: pb.Pod) -> pb.Pod:
        change(p)
        return p

    return made


# What differs between two pods of one template (their own fields): each pod's view has its own.
PER_POD: list[tuple[str, Callable[[pb.Pod], pb.Pod]]] = [
    ("name", _set(lambda p: setattr(p.metadata, "name", "j-9"))),
    ("resource version", _set(lambda p: setattr(p.metadata, "resource_version", 99))),
    ("job", _set(lambda p: setattr(p.spec, "job", "k"))),
    ("priority", _set(lambda p: setattr(p.spec, "priority", 100))),
    ("preemption policy", _set(lambda p: setattr(p.spec, "preemption_policy", pb.NEVER))),
    ("labels", _set(lambda p: p.metadata.labels.update({"app": "db", "tier": "x"}))),
    ("no labels", _set(lambda p: p.metadata.ClearField("labels"))),
    ("NUMA nodes held", _set(lambda p: p.spec.numa_nodes.extend([1]))),
]

# What differs between two templates: each gets a view of its own.
PER_TEMPLATE: list[tuple[str, Callable[[pb.Pod], pb.Pod]]] = [
    ("qos", _set(lambda p: setattr(p.spec, "qos", pb.QOS_BEST_EFFORT))),
    ("requests", _set(lambda p: setattr(p.spec.template.requests, "milli_cpu", 1))),
    ("node selector", _set(lambda p: p.spec.template.node_selector.update({"zone": "b"}))),
    ("toleration", _set(lambda p: p.spec.template.ClearField("tolerations"))),
    ("node affinity", _set(lambda p: p.spec.template.affinity.ClearField("node_affinity"))),
    ("anti-affinity", _set(lambda p: p.spec.template.affinity.ClearField("pod_anti_affinity"))),
    ("no affinity", _set(lambda p: p.spec.template.ClearField("affinity"))),
    ("spread", _set(lambda p: p.spec.template.ClearField("topology_spread_constraints"))),
    ("ports", _set(lambda p: p.spec.template.ClearField("ports"))),
    ("NUMA policy", _set(lambda p: setattr(p.spec.template, "numa_policy", pb.NUMA_POLICY_SINGLE))),
    ("GPUs", _set(lambda p: setattr(p.spec.template.requests, "gpus", 2))),
    ("template labels", _set(lambda p: p.spec.template.labels.update({"x": "y"}))),
]


def _id(value: object) -> str:
    return value if isinstance(value, str) else ""


@pytest.mark.parametrize(("what", "change"), PER_POD + PER_TEMPLATE, ids=_id)
@pytest.mark.parametrize("keyed", [True, False])
def test_a_view_is_the_one_the_pod_alone_gives(
    what: str, change: Callable[[pb.Pod], pb.Pod], keyed: bool
) -> None:
    """After another pod of the first template was read (its view cached), each changed pod
    gets exactly the view read from it alone."""
    PodInfo.from_pod(pod(), keyed=keyed)
    for p in (pod(), change(pod()), plain(), change(plain())):
        assert fields(PodInfo.from_pod(p, keyed=keyed)) == fields(oracle(p, keyed=keyed)), what


def test_a_gpu_pod_holds_its_own_cards() -> None:
    first, second = pod("j-0"), pod("j-1")
    for p in (first, second):
        p.spec.template.requests.gpus = 1
    second.spec.gpu_cards.extend([3])
    PodInfo.from_pod(first)
    info = PodInfo.from_pod(second)
    assert info.req.gpu_cards == (3,)
    assert fields(info) == fields(oracle(second))


@pytest.mark.parametrize(("what", "change"), PER_POD, ids=_id)
def test_pods_of_one_template_share_its_view(what: str, change: Callable[[pb.Pod], pb.Pod]) -> None:
    a, b = PodInfo.from_pod(pod()), PodInfo.from_pod(change(pod()))
    assert a is not b and a.req is not b.req, what
    assert a.template_key == b.template_key
    for shared in ("node_selector", "required_terms", "tolerations", "spread", "pod_affinity"):
        assert getattr(a, shared) is getattr(b, shared), shared
    assert a.req.requests is b.req.requests and a.req.anti_terms is b.req.anti_terms


@pytest.mark.parametrize(("what", "change"), PER_TEMPLATE, ids=_id)
def test_another_template_gets_its_own_view(what: str, change: Callable[[pb.Pod], pb.Pod]) -> None:
    a, b = PodInfo.from_pod(pod()), PodInfo.from_pod(change(pod()))
    assert a.template_key != b.template_key, what
    assert fields(b) == fields(oracle(change(pod()))), what


def test_a_view_is_a_pods_own_to_change() -> None:
    """What a judge sets on a pod's view (its holds, its prepared topology, a replacement's
    name) stays on that pod's view."""
    a, b = PodInfo.from_pod(pod("j-0")), PodInfo.from_pod(pod("j-1"))
    a.reservations = {"reservation:r": "n1"}
    a.template_key += b"\x00reservations:r"
    a.topology = {"x": 1}
    assert b.reservations == {} and b.topology is None
    assert b.template_key == template_key(pod("j-1"))
    assert a.renamed("j-2", b"k").name == "j-2" and b.name == "j-1"


def test_the_views_start_over_past_their_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interface, "_VIEWS_LIMIT", 3)
    interface._VIEWS.clear()
    for cpu in range(1, 8):
        p = plain(f"p{cpu}-0")
        p.spec.template.requests.milli_cpu = cpu
        assert fields(PodInfo.from_pod(p)) == fields(oracle(p))
        assert len(interface._VIEWS) <= 3
