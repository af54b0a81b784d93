"""A shard's cache reads each distinct pod template once (``placement.preemption.TemplateParts``):
the pods of one template share what it decides, a template that differs in anything placement
reads gets a part of its own, and every record is the one ``VictimCandidate.from_pod`` makes of
the pod alone — so the shard's decisions are those it made before."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from placement.nodeinfo import PodRequest
from placement.preemption import TemplateParts, VictimCandidate
from protos.godel.v1 import objects_pb2 as pb
from services.scheduler.cache import SchedulerCache
from tests.factories import GiB, node


def bound_pod(name: str, on: str = "n1", job: str = "j") -> pb.Pod:
    """A running pod of a template with something of everything placement reads."""
    p = pb.Pod(metadata=pb.ObjectMeta(name=name, resource_version=1))
    p.metadata.labels["app"] = "web"
    p.spec.job = job
    p.spec.priority = 3
    p.spec.qos = pb.QOS_GUARANTEED
    p.spec.preemptible = True
    p.spec.node_name = on
    tpl = p.spec.template
    tpl.labels["app"] = "web"
    tpl.requests.milli_cpu = 500
    tpl.requests.memory_bytes = GiB
    tpl.ports.add(container_port=80, host_port=8080)
    term = tpl.affinity.pod_anti_affinity.required.add(topology_key="hostname")
    term.label_selector.add(key="app", operator=pb.LabelSelectorRequirement.IN, values=["web"])
    p.status.phase = pb.POD_RUNNING
    p.status.started_ms = 1000
    return p


def cache_with(*pods: pb.Pod) -> SchedulerCache:
    cache = SchedulerCache()
    for name in ("n1", "n2"):
        cache.set_node(node(name, cpu=64000, mem=256 * GiB, gpus=8))
    for p in pods:
        cache.set_pod(p)
    return cache


def slots(record: VictimCandidate) -> dict[str, object]:
    """Every field of the record and of its request (``PodRequest`` compares without labels)."""
    fields = {f"req.{s}": getattr(record.req, s) for s in PodRequest.__slots__}
    fields.update({s: getattr(record, s) for s in VictimCandidate.__slots__ if s != "req"})
    return fields


def alone(p: pb.Pod) -> VictimCandidate:
    """The record of ``p`` made from it alone, no part shared: what the cache made before."""
    return VictimCandidate.from_pod(p, node=p.spec.node_name)


def test_pods_of_one_template_share_its_parsed_part() -> None:
    pods = [bound_pod(f"j-{i}", on=f"n{1 + i % 2}") for i in range(4)]
    cache = cache_with(*pods)
    records = [cache.running(p.metadata.name) for p in pods]
    assert all(r is not None for r in records)
    first = records[0]
    assert first is not None and first.req.host_ports == (("TCP", 8080),)
    assert len(cache.template_parts) == 1
    for r in records[1:]:
        assert r is not None
        assert r.req.host_ports is first.req.host_ports  # read once, not once a pod
        assert r.req.anti_terms is first.req.anti_terms
        assert r.labels is first.labels
    for p, r in zip(pods, records, strict=True):
        assert r is not None and slots(r) == slots(alone(p))  # each with its own name, node


def _template(change: Callable[[pb.PodTemplate], object]) -> Callable[[pb.Pod], object]:
    return lambda p: change(p.spec.template)


# What placement reads of a template (and the QoS): a pod differing in any of it is read alone.
TEMPLATE_CHANGES: dict[str, Callable[[pb.Pod], object]] = {
    "cpu": _template(lambda t: setattr(t.requests, "milli_cpu", 501)),
    "memory": _template(lambda t: setattr(t.requests, "memory_bytes", 2 * GiB)),
    "gpus": _template(lambda t: setattr(t.requests, "gpus", 2)),
    "gpu share": _template(
        lambda t: (setattr(t.requests, "gpus", 1), setattr(t, "gpu_milli", 250))
    ),
    "gpu models": _template(
        lambda t: (setattr(t.requests, "gpus", 1), t.gpu_models.append("V100M16"))
    ),
    "extended resource": _template(lambda t: t.requests.extended.update({"rdma": 1})),
    "host port": _template(lambda t: setattr(t.ports[0], "host_port", 8081)),
    "port protocol": _template(lambda t: setattr(t.ports[0], "protocol", "UDP")),
    "no ports": _template(lambda t: t.ClearField("ports")),
    "anti-affinity key": _template(
        lambda t: setattr(t.affinity.pod_anti_affinity.required[0], "topology_key", "zone")
    ),
    "no anti-affinity": _template(lambda t: t.ClearField("affinity")),
    "numa policy": _template(lambda t: setattr(t, "numa_policy", pb.NUMA_POLICY_SINGLE)),
    "template labels": _template(lambda t: t.labels.update({"tier": "gold"})),
    "qos": lambda p: setattr(p.spec, "qos", pb.QOS_BEST_EFFORT),
}


@pytest.mark.parametrize("change", TEMPLATE_CHANGES.values(), ids=TEMPLATE_CHANGES.keys())
def test_a_pod_whose_template_differs_gets_its_own_part(
    change: Callable[[pb.Pod], object],
) -> None:
    usual, other = bound_pod("j-0"), bound_pod("j-1")
    change(other)
    cache = cache_with(usual, other)
    assert len(cache.template_parts) == 2
    got = cache.running("j-1")
    assert got is not None and slots(got) == slots(alone(other))
    first = cache.running("j-0")
    assert first is not None and slots(first) == slots(alone(usual))
    assert slots(got) != {**slots(first), "name": "j-1", "req.name": "j-1"}


# What each pod has of its own: read per pod even where the template's part is shared.
OWN_CHANGES: dict[str, Callable[[pb.Pod], object]] = {
    "job": lambda p: setattr(p.spec, "job", "k"),
    "priority": lambda p: setattr(p.spec, "priority", 7),
    "not preemptible": lambda p: setattr(p.spec, "preemptible", False),
    "protection": lambda p: setattr(p.spec, "protection_seconds", 60),
    "started": lambda p: setattr(p.status, "started_ms", 5000),
    "not started": lambda p: (
        setattr(p.spec, "protection_seconds", 60),
        p.status.ClearField("started_ms"),
    ),
    "claimed": lambda p: setattr(p.status, "preempted_by", "hi-0"),
    "numa nodes": lambda p: p.spec.numa_nodes.append(1),
    "pod labels": lambda p: p.metadata.labels.update({"canary": "yes"}),
    "node": lambda p: setattr(p.spec, "node_name", "n2"),
}


@pytest.mark.parametrize("change", OWN_CHANGES.values(), ids=OWN_CHANGES.keys())
def test_a_pod_of_a_shared_template_keeps_its_own_fields(
    change: Callable[[pb.Pod], object],
) -> None:
    usual, other = bound_pod("j-0"), bound_pod("j-1")
    change(other)
    cache = cache_with(usual, other)
    assert len(cache.template_parts) == 1
    got = cache.running("j-1")
    assert got is not None and slots(got) == slots(alone(other))


def test_gpu_cards_are_each_pods_own_on_a_shared_template() -> None:
    pods = [bound_pod(f"j-{i}") for i in range(2)]
    for i, p in enumerate(pods):
        p.spec.template.requests.gpus = 1
        p.spec.gpu_cards.append(i)
    cache = cache_with(*pods)
    assert len(cache.template_parts) == 1
    for p in pods:
        got = cache.running(p.metadata.name)
        assert got is not None and slots(got) == slots(alone(p))
    assert cache.nodes["n1"].card_used[:2] == (1000, 1000)


def test_template_parts_start_over_past_their_limit() -> None:
    """Pods that each carry a template of their own must not grow the parts without end."""
    parts = TemplateParts(limit=3)
    for cpu in range(1, 8):
        p = bound_pod("j-0")
        p.spec.template.requests.milli_cpu = cpu
        got = VictimCandidate.from_parts(p.metadata, p.spec, p.status, None, "n1", parts.of(p.spec))
        assert slots(got) == slots(alone(p))
        assert len(parts) <= 3
