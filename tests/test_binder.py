"""The Binder against a real store and real gRPC: the test plays the scheduler shards, opening
``Binder.Decide`` streams to a binder run in-process (ServiceHost) or as real processes.

After every test an audit checks the invariants: no node over-committed (store accounting vs
capacity, per pool) and no pod bound twice (claims vs pods; BOUND verdicts seen per pod)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import pytest

from godel.audit import audit as audit_cluster
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services.binder.decide import ATOMIC_DELETE_REPLICAS, informed_jobs
from services.binder.service import BinderConfig, BinderService
from services.binder.state import ClusterState
from services.dispatcher.controllers.creation import CHUNK_OPS
from services.peers.binder import LEADER_METADATA_KEY
from services.runtime import ServiceHost
from services.runtime.healthcheck import probe
from store import Store
from store.client import Bind, Delete, Fence, Release, Update
from store.errors import FencedError
from store.lease import holder_name
from tests import factories as f

BINDER = "godel.v1.Binder"
V = ipb.VerdictCode
Code: TypeAlias = ipb.VerdictCode.ValueType

# Every BOUND verdict of the current test, per pod: a pod binds at most once.
_bound_verdicts: Counter[str] = Counter()


# --------------------------------------------------------------------------------------------
# Harness
# --------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
async def audit(store: Store) -> AsyncIterator[None]:
    _bound_verdicts.clear()
    yield
    assert [p for p, n in _bound_verdicts.items() if n > 1] == [], "pod bound more than once"
    nodes, _ = await store.list_all(pb.Node)
    for node in nodes:
        usage = await store.node_usage(node.metadata.name)
        assert usage is not None
        over = {k: (v, usage.capacity.get(k)) for k, v in usage.used.items()}
        over = {k: uc for k, uc in over.items() if uc[0] > (uc[1] or 0)}
        assert over == {}, f"node {node.metadata.name} over-committed: {over}"
    pods, _ = await store.list_all(pb.Pod)
    claims = await store.claims()
    holding = {
        p.metadata.name: p.spec.node_name
        for p in pods
        if p.spec.node_name and p.status.phase not in (pb.POD_SUCCEEDED, pb.POD_FAILED)
    }
    assert {name: c.split()[0] for name, c in claims.items()} == holding


def config(store_url: str, cluster: str, name: str, **kw: Any) -> BinderConfig:
    base: dict[str, Any] = {
        "lease_ms": 1000,
        "renew_ms": 200,
        "grace_seconds": 0.5,
        "insecure": True,  # plaintext in-process; tests/test_tls.py covers TLS
    }
    return BinderConfig(store_url=store_url, cluster=cluster, name=name, **(base | kw))


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout: float = 60.0, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def leading(host: ServiceHost[BinderConfig]) -> bool:
    service = host.service
    return isinstance(service, BinderService) and service.is_leader


@pytest.fixture
async def binder(store_url: str, cluster_name: str) -> AsyncIterator[ServiceHost[BinderConfig]]:
    async with ServiceHost(BinderService, config(store_url, cluster_name, "b1")) as host:
        await eventually(lambda: leading(host), what="leadership")
        yield host


class Shard:
    """A scheduler shard's end of one Decide stream."""

    def __init__(self, address: str, name: str = "shard-0") -> None:
        self.name = name
        self.channel = grpc.aio.insecure_channel(address)
        self.call: Any = internal_pb2_grpc.BinderStub(self.channel).Decide()  # type: ignore[no-untyped-call]
        self.next_id = 0

    async def send(self, *units: ipb.UnitDecision) -> int:
        self.next_id += 1
        try:
            await self.call.write(
                ipb.DecisionBatch(shard=self.name, batch_id=self.next_id, units=units)
            )
        except Exception:
            # A standby (or a binder stepping down) may end the stream before our message goes
            # out: the write then fails, and the next read reports the stream's status.
            if not self.call.done():
                raise
        return self.next_id

    async def read(self) -> ipb.VerdictBatch:
        batch: ipb.VerdictBatch = await asyncio.wait_for(self.call.read(), 20)
        for v in batch.verdicts:
            if v.code == V.BOUND:
                _bound_verdicts[v.pod] += 1
        return batch

    async def decide(self, *units: ipb.UnitDecision) -> dict[str, ipb.PodVerdict]:
        batch_id = await self.send(*units)
        answer = await self.read()
        assert answer.batch_id == batch_id
        assert len(answer.verdicts) == sum(len(u.placements) for u in units)
        return {v.pod: v for v in answer.verdicts}

    async def close(self) -> None:
        await self.channel.close()


@pytest.fixture
async def shards(binder: ServiceHost[BinderConfig]) -> AsyncIterator[list[Shard]]:
    opened = [Shard(binder.address, f"shard-{i}") for i in range(2)]
    yield opened
    for s in opened:
        await s.close()


async def submit(store: Store, job: pb.Job) -> dict[str, pb.Pod]:
    pods = f.pods_of(job)
    await store.create_unit(job, pods)
    return {p.metadata.name: p for p in pods}


def unit(
    job: pb.Job,
    pods: dict[str, pb.Pod],
    placements: list[tuple[str, str]] | list[tuple[str, str, list[int]]],
) -> ipb.UnitDecision:
    """A decision; a placement may name the NUMA nodes it claims as a third element."""
    u = ipb.UnitDecision(job=job.metadata.name, min_member=job.spec.min_member)
    for pod, node, *numa in placements:
        rv = pods[pod].metadata.resource_version if pod in pods else 1
        u.placements.add(
            pod=pod, node=node, pod_resource_version=rv, numa_nodes=numa[0] if numa else []
        )
    return u


# --------------------------------------------------------------------------------------------
# One batch: table of cases
# --------------------------------------------------------------------------------------------


def with_port(job: pb.Job, port: int) -> pb.Job:
    job.spec.template.ports.add(container_port=port, host_port=port)
    return job


def ever_scheduled(job: pb.Job) -> pb.Job:
    job.status.ever_scheduled = True
    return job


def labelled(node: pb.Node, **labels: str) -> pb.Node:
    node.metadata.labels.update(labels)
    return node


def tainted(node: pb.Node, key: str) -> pb.Node:
    node.spec.taints.add(key=key, effect=pb.NO_SCHEDULE)
    return node


def labelled_job(job: pb.Job, **labels: str) -> pb.Job:
    job.spec.template.labels.update(labels)
    return job


def selecting(job: pb.Job, **labels: str) -> pb.Job:
    job.spec.template.node_selector.update(labels)
    return job


def requiring_zone(job: pb.Job, *zones: str) -> pb.Job:
    term = job.spec.template.affinity.node_affinity.required.add()
    term.match_expressions.add(key="zone", operator=pb.LabelSelectorRequirement.IN, values=zones)
    return job


def tolerating(job: pb.Job, key: str) -> pb.Job:
    job.spec.template.tolerations.add(key=key, operator=pb.Toleration.EXISTS)
    return job


def anti_affine(job: pb.Job, app: str, key: str = "zone", *, avoid: str = "") -> pb.Job:
    """Pods labelled app=<app>, required anti-affine on ``key`` to app=<avoid or app>."""
    job.spec.template.labels["app"] = app
    term = job.spec.template.affinity.pod_anti_affinity.required.add(topology_key=key)
    term.label_selector.add(
        key="app", operator=pb.LabelSelectorRequirement.IN, values=[avoid or app]
    )
    return job


def spreading(job: pb.Job, app: str, key: str = "zone", skew: int = 1) -> pb.Job:
    job.spec.template.labels["app"] = app
    c = job.spec.template.topology_spread_constraints.add(max_skew=skew, topology_key=key)
    c.when_unsatisfiable = pb.TopologySpreadConstraint.DO_NOT_SCHEDULE
    c.label_selector.add(key="app", operator=pb.LabelSelectorRequirement.IN, values=[app])
    return job


def in_zone(name: str, zone: str, **kw: Any) -> pb.Node:
    return labelled(f.node(name, **kw), zone=zone, hostname=name)


def numa_node(name: str, *, rack: str = "") -> pb.Node:
    """8 cpu on 2 sockets × 1 NUMA node of 4 cpu each."""
    n = f.with_numa(f.node(name, cpu=8000))
    if rack:
        n.metadata.labels["rack"] = rack
    return n


EXCL = pb.NUMA_POLICY_EXCLUSIVE
SINGLE = pb.NUMA_POLICY_SINGLE


def node_state(name: str, *, ready: bool = True, unschedulable: bool = False) -> pb.Node:
    n = f.node(name, cpu=1000)
    n.status.ready = ready
    n.spec.unschedulable = unschedulable
    return n


def timed_out(job: pb.Job) -> pb.Job:
    """A gang the job status controller has marked Timeout (its schedule timeout passed)."""
    job.status.phase = pb.JOB_TIMEOUT
    return job


def being_deleted(job: pb.Job) -> pb.Job:
    """Marked as the dispatcher's chunked deletion marks it (services/dispatcher/controllers/deletion.py)."""
    job.metadata.deletion_timestamp_ms = 1
    return job


@dataclass
class Case:
    id: str
    nodes: list[pb.Node]
    jobs: list[pb.Job]
    # Units in batch order: (job name, [(pod, node)]).
    units: list[tuple[str, list[tuple[str, str]]]]
    # pod -> (code, substring of the reason).
    expect: dict[str, tuple[Code, str]]
    # Pods decided at a resource_version that is no longer theirs.
    stale: set[str] = field(default_factory=set)
    # Jobs whose status.ever_scheduled must be True afterwards.
    scheduled: set[str] = field(default_factory=set)
    # Bound pods' NUMA nodes as stored.
    numa: dict[str, list[int]] = field(default_factory=dict)
    # GPU cards a placement proposes (as a shard does), and bound pods' cards as stored.
    proposed_cards: dict[str, list[int]] = field(default_factory=dict)
    cards: dict[str, list[int]] = field(default_factory=dict)


G = "gang: only"
CASES = [
    Case(
        "gang of 5 with room for 4: none bound",
        [f.node("n1", cpu=1000)],
        [f.job("g", replicas=5, min_member=5, cpu=250)],
        [("g", [(f"g-{i}", "n1") for i in range(5)])],
        {**{f"g-{i}": (V.GANG_REJECTED, G) for i in range(4)},
         "g-4": (V.GANG_REJECTED, "insufficient cpu")},
    ),
    Case(
        "ever scheduled unit: partial binds allowed",
        [f.node("n1", cpu=1000)],
        [ever_scheduled(f.job("g", replicas=5, min_member=5, cpu=250))],
        [("g", [(f"g-{i}", "n1") for i in range(5)])],
        {**{f"g-{i}": (V.BOUND, "") for i in range(4)}, "g-4": (V.CONFLICT, "insufficient cpu")},
    ),
    Case(
        "gang that fits binds whole and is marked ever_scheduled",
        [f.node("n1", cpu=1000), f.node("n2", cpu=1000)],
        [f.job("g", replicas=3, min_member=3, cpu=400)],
        [("g", [("g-0", "n1"), ("g-1", "n2"), ("g-2", "n1")])],
        {"g-0": (V.BOUND, ""), "g-1": (V.BOUND, ""), "g-2": (V.BOUND, "")},
        scheduled={"g"},
    ),
    Case(
        "a rejected gang frees the room it took for later units",
        [f.node("n1", cpu=1000)],
        [f.job("g", replicas=3, min_member=3, cpu=400), f.job("h", cpu=400)],
        [("g", [("g-0", "n1"), ("g-1", "n1"), ("g-2", "nowhere")]), ("h", [("h-0", "n1")])],
        {"g-0": (V.GANG_REJECTED, G), "g-1": (V.GANG_REJECTED, G),
         "g-2": (V.GANG_REJECTED, "not found"), "h-0": (V.BOUND, "")},
    ),
    Case(
        "a job whose deletion began binds nothing more",
        [f.node("n1")],
        [being_deleted(f.job("a"))],
        [("a", [("a-0", "n1")])],
        {"a-0": (V.STALE, "being deleted")},
    ),
    Case(
        "a gang that timed out binds nothing: Timeout is final (until retried)",
        [f.node("n1")],
        [timed_out(f.job("g", replicas=2, min_member=2, cpu=100))],
        [("g", [("g-0", "n1"), ("g-1", "n1")])],
        {"g-0": (V.STALE, "timed out"), "g-1": (V.STALE, "godel retry job/g")},
    ),
    Case(
        "stale pod version",
        [f.node("n1")],
        [f.job("a", replicas=2)],
        [("a", [("a-0", "n1"), ("a-1", "n1")])],
        {"a-0": (V.STALE, "pod changed"), "a-1": (V.BOUND, "")},
        stale={"a-0"},
    ),
    Case(
        "unknown, unready and unschedulable nodes",
        [node_state("down", ready=False), node_state("cordoned", unschedulable=True)],
        [f.job("a", replicas=3)],
        [("a", [("a-0", "nowhere"), ("a-1", "down"), ("a-2", "cordoned")])],
        {"a-0": (V.CONFLICT, "not found"), "a-1": (V.CONFLICT, "not ready"),
         "a-2": (V.CONFLICT, "unschedulable")},
    ),
    Case(
        "best-effort pods use the reclaimable pool",
        [f.node("n1", cpu=4000, be_cpu=150, be_mem=f.GiB)],
        [f.job("be", replicas=2, cpu=100, qos=pb.QOS_BEST_EFFORT), f.job("g", cpu=100)],
        [("be", [("be-0", "n1"), ("be-1", "n1")]), ("g", [("g-0", "n1")])],
        {"be-0": (V.BOUND, ""), "be-1": (V.CONFLICT, "insufficient cpu"), "g-0": (V.BOUND, "")},
    ),
    Case(
        "host ports",
        [f.node("n1"), f.node("n2")],
        [with_port(f.job("w", replicas=3), 8080)],
        [("w", [("w-0", "n1"), ("w-1", "n1"), ("w-2", "n2")])],
        {"w-0": (V.BOUND, ""), "w-1": (V.CONFLICT, "host port in use"), "w-2": (V.BOUND, "")},
    ),
    Case(
        "pod slots",
        [f.node("n1", pods=1)],
        [f.job("a", replicas=2)],
        [("a", [("a-0", "n1"), ("a-1", "n1")])],
        {"a-0": (V.BOUND, ""), "a-1": (V.CONFLICT, "too many pods")},
    ),
    # A decision is a proposal: every hard rule the shards filter by is checked again, so a
    # forged or stale decision cannot place a pod where its constraints forbid.
    Case(
        "forged: node selector not matched",
        [labelled(f.node("gpu"), kind="gpu"), f.node("plain")],
        [selecting(f.job("s", replicas=2), kind="gpu")],
        [("s", [("s-0", "plain"), ("s-1", "gpu")])],
        {"s-0": (V.CONFLICT, "NodeAffinity: node(s) didn't match node selector"),
         "s-1": (V.BOUND, "")},
    ),
    Case(
        "forged: required node affinity not matched",
        [labelled(f.node("a"), zone="z1"), labelled(f.node("b"), zone="z2")],
        [requiring_zone(f.job("z", replicas=2), "z1")],
        [("z", [("z-0", "b"), ("z-1", "a")])],
        {"z-0": (V.CONFLICT, "NodeAffinity"), "z-1": (V.BOUND, "")},
    ),
    Case(
        "forged: untolerated taint",
        [tainted(f.node("t"), "dedicated")],
        [f.job("plain"), tolerating(f.job("tol"), "dedicated")],
        [("plain", [("plain-0", "t")]), ("tol", [("tol-0", "t")])],
        {"plain-0": (V.CONFLICT, "TaintToleration: untolerated taint"), "tol-0": (V.BOUND, "")},
    ),
    Case(
        "forged: guaranteed pod on a node with only reclaimable room",
        [f.node("n1", cpu=100, be_cpu=4000, be_mem=f.GiB)],
        [f.job("g", cpu=1000)],
        [("g", [("g-0", "n1")])],
        {"g-0": (V.CONFLICT, "NodeResourcesFit: insufficient cpu")},
    ),
    # Cross-node rules, serially in batch order: each placement counts once it is accepted.
    Case(
        "anti-affine pair in one batch, one zone: the second is refused",
        [in_zone("n1", "a"), in_zone("n2", "a"), in_zone("n3", "b")],
        [anti_affine(f.job("w", replicas=3), "web")],
        [("w", [("w-0", "n1"), ("w-1", "n2"), ("w-2", "n3")])],
        {"w-0": (V.BOUND, ""),
         "w-1": (V.CONFLICT, "node 'n2': InterPodAffinity: node(s) didn't satisfy existing pods "
                             "anti-affinity rules"),
         "w-2": (V.BOUND, "")},
    ),
    Case(
        "an accepted pod's anti-affinity keeps later matching pods out (symmetry)",
        [in_zone("n1", "a"), in_zone("n2", "a"), in_zone("n3", "b")],
        [anti_affine(f.job("db"), "db", avoid="web"),
         labelled_job(f.job("web", replicas=2), app="web")],
        [("db", [("db-0", "n1")]), ("web", [("web-0", "n2"), ("web-1", "n3")])],
        {"db-0": (V.BOUND, ""),
         "web-0": (V.CONFLICT, "didn't satisfy existing pods anti-affinity rules"),
         "web-1": (V.BOUND, "")},
    ),
    Case(
        "spread maxSkew 1 over zones",
        [in_zone("n1", "a"), in_zone("n2", "a"), in_zone("n3", "b")],
        [spreading(f.job("s", replicas=4), "s")],
        [("s", [("s-0", "n1"), ("s-1", "n2"), ("s-2", "n3"), ("s-3", "n3")])],
        {"s-0": (V.BOUND, ""),
         "s-1": (V.CONFLICT, "PodTopologySpread: node(s) didn't match pod topology spread"),
         "s-2": (V.BOUND, ""), "s-3": (V.BOUND, "")},
    ),
    Case(
        "spread: a node without the topology key is refused",
        [in_zone("n1", "a"), f.node("bare")],
        [spreading(f.job("s"), "s")],
        [("s", [("s-0", "bare")])],
        {"s-0": (V.CONFLICT, "missing required label")},
    ),
    Case(
        "a gang whose pods break anti-affinity is rejected whole",
        [in_zone("n1", "a"), in_zone("n2", "b")],
        [anti_affine(f.job("g", replicas=2, min_member=2), "g", "hostname")],
        [("g", [("g-0", "n1"), ("g-1", "n1")])],
        {"g-0": (V.GANG_REJECTED, G), "g-1": (V.GANG_REJECTED, "InterPodAffinity")},
    ),
    # NUMA: the Binder verifies a decision's NUMA claim, or chooses when it names none.
    Case(
        "forged: two pods claim the same exclusive NUMA node, the second is refused",
        [numa_node("n1")],
        [f.numa_job(f.job("x", replicas=2, cpu=1000), EXCL)],
        [("x", [("x-0", "n1", [0]), ("x-1", "n1", [0])])],
        {"x-0": (V.BOUND, ""),
         "x-1": (V.CONFLICT, "NumaTopology: NUMA node 0 is held exclusively by pod 'x-0'")},
        numa={"x-0": [0]},
    ),
    Case(
        "NUMA nodes chosen by the Binder when the decision names none",
        [numa_node("n1")],
        [f.numa_job(f.job("x", replicas=3, cpu=1000), EXCL)],
        [("x", [("x-0", "n1"), ("x-1", "n1"), ("x-2", "n1")])],
        {"x-0": (V.BOUND, ""), "x-1": (V.BOUND, ""),
         "x-2": (V.CONFLICT, "NumaTopology: not enough free NUMA nodes on one socket")},
        numa={"x-0": [0], "x-1": [1]},
    ),
    Case(
        "forged: a single-NUMA claim too big for its NUMA node",
        [numa_node("n1")],
        [f.numa_job(f.job("s", cpu=6000), SINGLE)],
        [("s", [("s-0", "n1", [1])])],
        {"s-0": (V.CONFLICT, "request exceeds every NUMA node")},
    ),
    Case(
        "forged: NUMA nodes that do not exist",
        [numa_node("n1")],
        [f.numa_job(f.job("s"), SINGLE)],
        [("s", [("s-0", "n1", [5])])],
        {"s-0": (V.CONFLICT, "no NUMA node 5")},
    ),
    # Job-level affinity: every placed pod of the job in one rack.
    Case(
        "forged: a gang split over two racks is rejected whole",
        [numa_node("a1", rack="a"), numa_node("b1", rack="b")],
        [f.job_affinity(f.job("g", replicas=2, min_member=2), ["rack"])],
        [("g", [("g-0", "a1"), ("g-1", "b1")])],
        {"g-0": (V.GANG_REJECTED, G),
         "g-1": (V.GANG_REJECTED, "JobLevelAffinity: node is in rack=b, the job's pods are in "
                                  "rack=a")},
    ),
    Case(
        "job-level affinity: a pod elsewhere is refused, the rest bind",
        [numa_node("a1", rack="a"), numa_node("a2", rack="a"), numa_node("b1", rack="b"),
         f.node("bare")],
        [f.job_affinity(f.job("j", replicas=4), ["rack"])],
        [("j", [("j-0", "a1"), ("j-1", "b1"), ("j-2", "a2"), ("j-3", "bare")])],
        {"j-0": (V.BOUND, ""), "j-1": (V.CONFLICT, "rack=b, the job's pods are in rack=a"),
         "j-2": (V.BOUND, ""), "j-3": (V.CONFLICT, "node has no rack label")},
    ),
    # GPU cards: the Binder verifies a decision's cards, or chooses (best fit for a share, the
    # lowest wholly free for whole cards), and writes them in spec.gpu_cards.
    Case(
        "shares of cards chosen best fit by the Binder",
        [f.gpu_node("n1", 2)],
        [f.gpu_job(f.job("s", replicas=4, cpu=100), milli=300),
         f.gpu_job(f.job("t", cpu=100), milli=500), f.gpu_job(f.job("u", cpu=100), milli=800)],
        [("s", [("s-0", "n1"), ("s-1", "n1"), ("s-2", "n1")]), ("t", [("t-0", "n1")]),
         ("u", [("u-0", "n1")])],
        {"s-0": (V.BOUND, ""), "s-1": (V.BOUND, ""), "s-2": (V.BOUND, ""), "t-0": (V.BOUND, ""),
         "u-0": (V.CONFLICT, "GpuCards: no GPU card with enough free share")},
        cards={"s-0": [0], "s-1": [0], "s-2": [0], "t-0": [1]},
    ),
    Case(
        "whole cards: the lowest wholly free, never shared",
        [f.gpu_node("n1", 4)],
        [f.gpu_job(f.job("s", cpu=100), milli=100), f.gpu_job(f.job("w", replicas=2), 2)],
        [("s", [("s-0", "n1")]), ("w", [("w-0", "n1"), ("w-1", "n1")])],
        {"s-0": (V.BOUND, ""), "w-0": (V.BOUND, ""),
         "w-1": (V.CONFLICT, "GpuCards: not enough whole free GPU cards")},
        cards={"s-0": [0], "w-0": [1, 2]},
    ),
    Case(
        "forged: two whole-card pods claim one card, the second is refused",
        [f.gpu_node("n1", 2)],
        [f.gpu_job(f.job("w", replicas=2))],
        [("w", [("w-0", "n1"), ("w-1", "n1")])],
        {"w-0": (V.BOUND, ""), "w-1": (V.CONFLICT, "GPU card 0 is not wholly free")},
        proposed_cards={"w-0": [0], "w-1": [0]},
        cards={"w-0": [0]},
    ),
    Case(
        "forged: a share on a card without room, and a card the node does not have",
        [f.gpu_node("n1", 2)],
        [f.gpu_job(f.job("s", replicas=3), milli=600)],
        [("s", [("s-0", "n1"), ("s-1", "n1"), ("s-2", "n1")])],
        {"s-0": (V.BOUND, ""),
         "s-1": (V.CONFLICT, "GPU card 1 has 400 milli free, the pod's share is 600"),
         "s-2": (V.CONFLICT, "no GPU card 2 (the node has 2)")},
        proposed_cards={"s-0": [1], "s-1": [1], "s-2": [2]},
        cards={"s-0": [1]},
    ),
    Case(
        "a GPU model the pod does not accept",
        [f.gpu_node("n1", 2, "T4")],
        [f.gpu_job(f.job("m"), models=("V100M16", "V100M32"))],
        [("m", [("m-0", "n1")])],
        {"m-0": (V.CONFLICT, "GpuCards: GPU model not accepted")},
    ),
    Case(
        "malformed decisions",
        [f.node("n1")],
        [f.job("a", replicas=2), f.job("b")],
        [("a", [("a-0", "n1"), ("a-0", "n1"), ("ghost", "n1"), ("b-0", "n1"), ("", "n1")]),
         ("missing-job", [("a-1", "n1")])],
        {"a-0": (V.BOUND, ""), "ghost": (V.STALE, "not found"), "b-0": (V.ERROR, "belongs to"),
         "": (V.ERROR, "without a pod name"), "a-1": (V.ERROR, "belongs to")},
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_decide_batch(store: Store, shards: list[Shard], case: Case) -> None:
    for n in case.nodes:
        await store.create(n)
    pods: dict[str, pb.Pod] = {}
    jobs = {j.metadata.name: j for j in case.jobs}
    for j in case.jobs:
        pods |= await submit(store, j)
    for name in case.stale:
        pods[name].metadata.resource_version -= 1
    units = [unit(jobs.get(job, pb.Job(metadata=pb.ObjectMeta(name=job))), pods, pl)
             for job, pl in case.units]  # fmt: skip
    for u in units:
        for p in u.placements:
            p.gpu_cards.extend(case.proposed_cards.get(p.pod, []))

    answer = await shards[0].send(*units)
    batch = await shards[0].read()
    assert batch.batch_id == answer
    assert len(batch.verdicts) == sum(len(pl) for _, pl in case.units)
    got: dict[str, tuple[Code, str]] = {}
    for v in batch.verdicts:
        got.setdefault(v.pod, (v.code, v.reason))
    assert {p: V.Name(c) for p, (c, _) in got.items()} == {
        p: V.Name(c) for p, (c, _) in case.expect.items()
    }
    for pod, (_, reason) in case.expect.items():
        assert reason in got[pod][1], (pod, got[pod])

    stored = {p.metadata.name: p for p in (await store.list_all(pb.Pod))[0]}
    for v in batch.verdicts:
        if v.code == V.BOUND:
            p = stored[v.pod]
            assert p.spec.node_name == v.node and p.status.phase == pb.POD_BOUND
            assert p.metadata.resource_version == v.resource_version
            assert [(c.type, c.status) for c in p.status.conditions] == [("PodScheduled", "True")]
            assert p.status.bound_ms > 0
        elif v.pod in stored and v.pod not in case.stale and v.code != V.ERROR:
            assert not stored[v.pod].spec.node_name
    for name in case.scheduled:
        assert (await store.get(pb.Job, name)).status.ever_scheduled
    for job in case.jobs:  # only gangs are marked: a one-pod job costs no job write
        if job.spec.min_member <= 1:
            assert not (await store.get(pb.Job, job.metadata.name)).status.ever_scheduled
    for name, numa in case.numa.items():
        assert list(stored[name].spec.numa_nodes) == numa
    assert {
        p.metadata.name: list(p.spec.gpu_cards) for p in stored.values() if p.spec.gpu_cards
    } == case.cards


# --------------------------------------------------------------------------------------------
# Which jobs the Binder may take from its informer instead of reading them
# --------------------------------------------------------------------------------------------


def _decided(job: str, *versions: int) -> ipb.UnitDecision:
    u = ipb.UnitDecision(job=job)
    for i, rv in enumerate(versions):
        u.placements.add(pod=f"{job}-{i}", node="n1", pod_resource_version=rv)
    return u


INFORMED_CASES = [
    # (id, the informer's job or None, its revision, the pods' decided versions, taken from it)
    ("one-pod job seen at the pod's version", f.job("a"), 10, (10,), True),
    ("one-pod job seen later", f.job("a"), 50, (10,), True),
    ("informer behind the decided pod", f.job("a"), 9, (10,), False),
    ("one placement of several ahead of it", f.job("a", replicas=3), 10, (8, 11), False),
    ("a gang: ever_scheduled must be fresh", f.job("a", replicas=2, min_member=2), 10, (5,), False),
    ("a job of min_member 1 within the atomic deletion bound",
     f.job("a", replicas=ATOMIC_DELETE_REPLICAS), 10, (5,), True),
    ("a job deleted in chunks", f.job("a", replicas=ATOMIC_DELETE_REPLICAS + 1), 10, (5,), False),
    ("marked for deletion", being_deleted(f.job("a")), 10, (5,), False),
    ("not in the informer yet", None, 10, (5,), False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("informed", "revision", "versions", "taken"),
    [c[1:] for c in INFORMED_CASES],
    ids=[c[0] for c in INFORMED_CASES],
)
def test_informed_jobs(
    informed: pb.Job | None, revision: int, versions: tuple[int, ...], taken: bool
) -> None:
    batch = ipb.DecisionBatch(units=[_decided("a", *versions), ipb.UnitDecision()])
    known = informed_jobs(batch, {"a": informed}.get, revision)
    assert known == ({"a": informed} if taken else {})


def test_a_chunked_deletion_is_bigger_than_the_bound_the_binder_trusts() -> None:
    # A job the Binder takes from its informer must be deleted in one commit with its pods.
    assert ATOMIC_DELETE_REPLICAS * 2 < CHUNK_OPS


async def test_a_one_pod_job_deleted_after_the_decision_is_refused(
    store: Store, shards: list[Shard]
) -> None:
    await store.create(f.node("n1"))
    job = f.job("gone")
    pods = await submit(store, job)
    decision = unit(job, pods, [("gone-0", "n1")])
    # Deleted with its pod in one commit, as the dispatcher deletes a small job; the Binder's
    # informer may still hold the job when the decision arrives.
    await store.commit([Delete("Pod", "gone-0"), Delete("Job", "gone")])
    await shards[0].send(decision)
    batch = await shards[0].read()
    assert [(v.pod, V.Name(v.code)) for v in batch.verdicts] == [("gone-0", "STALE")]
    assert await store.get_many(pb.Pod, ["gone-0"]) == [None]


# --------------------------------------------------------------------------------------------
# Several batches and streams
# --------------------------------------------------------------------------------------------


async def test_two_shards_conflict_on_one_node(store: Store, shards: list[Shard]) -> None:
    await store.create(f.node("n1", cpu=1000))
    a = f.job("a", replicas=3, cpu=400)
    b = f.job("b", replicas=3, cpu=400)
    pa, pb_ = await submit(store, a), await submit(store, b)
    results = await asyncio.gather(
        shards[0].decide(unit(a, pa, [(p, "n1") for p in pa])),
        shards[1].decide(unit(b, pb_, [(p, "n1") for p in pb_])),
    )
    verdicts = {k: v for r in results for k, v in r.items()}
    codes = Counter(V.Name(v.code) for v in verdicts.values())
    assert codes == {"BOUND": 2, "CONFLICT": 4}
    for v in verdicts.values():
        if v.code == V.CONFLICT:
            assert "insufficient cpu" in v.reason
    usage = await store.node_usage("n1")
    assert usage is not None and usage.used["g.cpu"] == 800
    # Each refused pod is a BindRejected event, written in the Binder's next batch of events.
    refused = {p for p, v in verdicts.items() if v.code == V.CONFLICT}

    async def rejected() -> dict[str, pb.Event]:
        events, _ = await store.list_all(pb.Event)
        return {e.regarding.name: e for e in events if e.reason == "BindRejected"}

    deadline = asyncio.get_running_loop().time() + 10
    while set(await rejected()) != refused:
        assert asyncio.get_running_loop().time() < deadline, "no BindRejected events"
        await asyncio.sleep(0.05)
    for event in (await rejected()).values():
        assert event.type == "Warning" and event.related.name == "n1"
        assert event.message.startswith("CONFLICT on n1: ") and "insufficient cpu" in event.message


async def test_two_shards_anti_affine_pair_in_one_zone_at_once(
    store: Store, shards: list[Shard]
) -> None:
    """Each shard saw an empty zone a and placed its anti-affine pod there in the same instant:
    the Binder's serial cross-node check lets exactly one win, whichever batch came first."""
    for name, zone in (("n1", "a"), ("n2", "a"), ("n3", "b")):
        await store.create(in_zone(name, zone))
    a = anti_affine(f.job("a"), "web")
    b = anti_affine(f.job("b"), "web")
    pa, pb_ = await submit(store, a), await submit(store, b)
    results = await asyncio.gather(
        shards[0].decide(unit(a, pa, [("a-0", "n1")])),
        shards[1].decide(unit(b, pb_, [("b-0", "n2")])),
    )
    verdicts = {k: v for r in results for k, v in r.items()}
    assert sorted(V.Name(v.code) for v in verdicts.values()) == ["BOUND", "CONFLICT"]
    [lost] = [v for v in verdicts.values() if v.code == V.CONFLICT]
    assert "InterPodAffinity" in lost.reason and "anti-affinity" in lost.reason
    # The loser's shard retries elsewhere: zone b is free.
    loser = a if lost.pod == "a-0" else b
    pods = pa if loser is a else pb_
    pods[lost.pod].metadata.resource_version = (
        await store.get(pb.Pod, lost.pod)
    ).metadata.resource_version
    retry = await shards[0].decide(unit(loser, pods, [(lost.pod, "n3")]))
    assert retry[lost.pod].code == V.BOUND


async def test_two_shards_claim_one_exclusive_numa_node_at_once(
    store: Store, shards: list[Shard]
) -> None:
    """Each shard saw NUMA node 0 of n1 free and gave it to its exclusive pod in the same
    instant: exactly one binds; the other is refused naming the holder, and never both hold it."""
    await store.create(numa_node("n1"))
    a = f.numa_job(f.job("a", cpu=1000), EXCL)
    b = f.numa_job(f.job("b", cpu=1000), EXCL)
    pa, pb_ = await submit(store, a), await submit(store, b)
    results = await asyncio.gather(
        shards[0].decide(unit(a, pa, [("a-0", "n1", [0])])),
        shards[1].decide(unit(b, pb_, [("b-0", "n1", [0])])),
    )
    verdicts = {k: v for r in results for k, v in r.items()}
    assert sorted(V.Name(v.code) for v in verdicts.values()) == ["BOUND", "CONFLICT"]
    [won] = [k for k, v in verdicts.items() if v.code == V.BOUND]
    [lost] = [v for v in verdicts.values() if v.code == V.CONFLICT]
    assert f"NUMA node 0 is held exclusively by pod {won!r}" in lost.reason
    stored = {p.metadata.name: p for p in (await store.list_all(pb.Pod))[0]}
    assert [list(p.spec.numa_nodes) for p in stored.values() if p.spec.node_name] == [[0]]


async def test_two_shards_hand_out_one_gpu_card_at_once(store: Store, shards: list[Shard]) -> None:
    """Each shard saw card 0 of n1 free and gave it, whole, to its pod in the same instant:
    exactly one binds; the other is refused (the shard retries), and the card is never shared."""
    await store.create(f.gpu_node("n1", 2))
    a, b = f.gpu_job(f.job("a")), f.gpu_job(f.job("b"))
    pa, pb_ = await submit(store, a), await submit(store, b)
    ua, ub = unit(a, pa, [("a-0", "n1")]), unit(b, pb_, [("b-0", "n1")])
    ua.placements[0].gpu_cards.append(0)
    ub.placements[0].gpu_cards.append(0)
    results = await asyncio.gather(shards[0].decide(ua), shards[1].decide(ub))
    verdicts = {k: v for r in results for k, v in r.items()}
    assert sorted(V.Name(v.code) for v in verdicts.values()) == ["BOUND", "CONFLICT"]
    [lost] = [v for v in verdicts.values() if v.code == V.CONFLICT]
    assert "GPU card 0 is not wholly free" in lost.reason
    stored = {p.metadata.name: p for p in (await store.list_all(pb.Pod))[0]}
    assert [list(p.spec.gpu_cards) for p in stored.values() if p.spec.node_name] == [[0]]


async def test_job_affinity_domain_is_fixed_by_bound_pods(
    store: Store, shards: list[Shard]
) -> None:
    """A later batch of a job whose pods are bound in rack a may not place one in rack b."""
    for name, rack in (("a1", "a"), ("b1", "b")):
        await store.create(numa_node(name, rack=rack))
    j = f.job_affinity(f.job("j", replicas=3), ["rack"])
    pods = await submit(store, j)
    first = await shards[0].decide(unit(j, pods, [("j-0", "a1")]))
    assert first["j-0"].code == V.BOUND
    later = await shards[1].decide(unit(j, pods, [("j-1", "b1"), ("j-2", "a1")]))
    assert later["j-1"].code == V.CONFLICT and "rack=b" in later["j-1"].reason
    assert later["j-2"].code == V.BOUND


async def test_two_shards_spread_holds_across_their_batches(
    store: Store, shards: list[Shard]
) -> None:
    """Two shards each put two pods of one spread group (maxSkew 1 over zones a and b) into
    zone a at once: across both batches only one pod more than zone b's count may bind there."""
    for name, zone in (("n1", "a"), ("n2", "a"), ("n3", "b")):
        await store.create(in_zone(name, zone))
    a = spreading(f.job("a", replicas=2), "group")
    b = spreading(f.job("b", replicas=2), "group")
    pa, pb_ = await submit(store, a), await submit(store, b)
    results = await asyncio.gather(
        shards[0].decide(unit(a, pa, [("a-0", "n1"), ("a-1", "n3")])),
        shards[1].decide(unit(b, pb_, [("b-0", "n2"), ("b-1", "n1")])),
    )
    verdicts = {k: v for r in results for k, v in r.items()}
    bound = {k for k, v in verdicts.items() if v.code == V.BOUND}
    refused = {k: v.reason for k, v in verdicts.items() if v.code == V.CONFLICT}
    # Whichever batch is checked first, its placements count for the other: 3 bind if zone b's
    # pod came first, 2 otherwise; never a skew above 1.
    assert len(bound) >= 2 and len(bound) + len(refused) == 4
    assert all("PodTopologySpread" in r for r in refused.values())
    stored = {p.metadata.name: p for p in (await store.list_all(pb.Pod))[0]}
    zones = Counter("a" if stored[p].spec.node_name in ("n1", "n2") else "b" for p in bound)
    assert abs(zones["a"] - zones["b"]) <= 1


async def test_back_to_back_batches_see_each_other(store: Store, shards: list[Shard]) -> None:
    """Pipelined batches: the second is checked before the informer can show the first."""
    await store.create(f.node("n1", cpu=1000))
    jobs = [f.job(f"j{i}", cpu=400) for i in range(3)]
    pods = [await submit(store, j) for j in jobs]
    for j, p in zip(jobs, pods, strict=True):
        await shards[0].send(unit(j, p, [(f"{j.metadata.name}-0", "n1")]))
    answers = [await shards[0].read() for _ in jobs]
    assert [a.batch_id for a in answers] == [1, 2, 3]
    assert [V.Name(a.verdicts[0].code) for a in answers] == ["BOUND", "BOUND", "CONFLICT"]


async def test_duplicate_decision_is_stale(store: Store, shards: list[Shard]) -> None:
    await store.create(f.node("n1"))
    a = f.job("a")
    pods = await submit(store, a)
    decision = unit(a, pods, [("a-0", "n1")])
    first = await shards[0].decide(decision)
    second = await shards[1].decide(decision)
    assert first["a-0"].code == V.BOUND
    assert second["a-0"].code == V.STALE and "already bound" in second["a-0"].reason


async def test_back_to_back_duplicate_is_refused_by_the_binders_own_check(
    store: Store, shards: list[Shard]
) -> None:
    """The same decision twice on one stream, back to back: the second batch is read after the
    first one's commit, so the Binder's own check refuses it (already bound), not the store."""
    await store.create(f.node("n1"))
    a = f.job("a")
    pods = await submit(store, a)
    decision = unit(a, pods, [("a-0", "n1")])
    await shards[0].send(decision)
    await shards[0].send(decision)
    first, second = await shards[0].read(), await shards[0].read()
    assert first.verdicts[0].code == V.BOUND
    assert second.verdicts[0].code == V.STALE
    assert second.verdicts[0].reason == "pod already bound to 'n1'"


async def test_store_refusal_drops_one_pod_and_commits_the_rest(
    store: Store, binder: ServiceHost[BinderConfig], shards: list[Shard]
) -> None:
    """The binder's view is behind (its informer is paused while another writer fills n1): the
    store's capacity check refuses that Bind, the binder drops the pod, re-applies the gang rule
    and commits the rest of the batch."""
    service = binder.service
    assert isinstance(service, BinderService)
    for name in ("n1", "n2"):
        await store.create(f.node(name, cpu=1000))
    filler = f.job("filler", cpu=1000)
    filler_pods = await submit(store, filler)
    gang = f.job("g", replicas=2, min_member=2, cpu=500)
    single = f.job("s", replicas=2, cpu=500)
    pods = await submit(store, gang) | await submit(store, single)
    await service.informer.stop()
    try:
        taken = filler_pods["filler-0"]
        taken.spec.node_name = "n1"
        await store.commit([Bind(taken)])
        verdicts = await shards[0].decide(
            unit(gang, pods, [("g-0", "n1"), ("g-1", "n2")]),
            unit(single, pods, [("s-0", "n1"), ("s-1", "n2")]),
        )
    finally:
        service.informer.start()
    codes = {p: V.Name(v.code) for p, v in verdicts.items()}
    assert codes == {"g-0": "GANG_REJECTED", "g-1": "GANG_REJECTED", "s-0": "CONFLICT",
                     "s-1": "BOUND"}  # fmt: skip
    assert "insufficient cpu" in verdicts["s-0"].reason
    assert "this pod: node 'n1' pool g: insufficient cpu" in verdicts["g-0"].reason
    assert (await store.get(pb.Pod, "s-1")).spec.node_name == "n2"
    assert not (await store.get(pb.Pod, "g-1")).spec.node_name


async def test_oversized_batch_is_refused(binder: ServiceHost[BinderConfig]) -> None:
    shard = Shard(binder.address)
    try:
        big = ipb.UnitDecision(job="a")
        for i in range(20001):
            big.placements.add(pod=f"p-{i}", node="n1", pod_resource_version=1)
        verdicts = await shard.decide(big)
        assert {V.Name(v.code) for v in verdicts.values()} == {"ERROR"}
        assert "limit" in verdicts["p-0"].reason
    finally:
        await shard.close()


# --------------------------------------------------------------------------------------------
# Leadership
# --------------------------------------------------------------------------------------------


async def test_standby_answers_failed_precondition(
    store: Store, binder: ServiceHost[BinderConfig], store_url: str, cluster_name: str
) -> None:
    async with ServiceHost(BinderService, config(store_url, cluster_name, "b2")) as standby:
        lease = await store.get_lease("binder")
        assert lease is not None and holder_name(lease.holder) == "b1"
        assert lease.holder_address == binder.address
        shard = Shard(standby.address)
        try:
            await shard.send(ipb.UnitDecision(job="a"))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await shard.read()
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert binder.address in (err.value.details() or "")
            trailers = dict(err.value.trailing_metadata() or ())
            assert trailers.get(LEADER_METADATA_KEY) == binder.address
        finally:
            await shard.close()

        async def health(address: str, service: str) -> str:
            return await asyncio.to_thread(probe, address, service)

        await eventually(
            lambda: _eq(health(standby.address, BINDER), "NOT_SERVING"), what="standby health"
        )
        assert await health(standby.address, "") == "SERVING"
        assert await health(binder.address, BINDER) == "SERVING"


async def test_a_binder_started_under_the_leaders_name_waits_as_a_standby(
    store: Store, binder: ServiceHost[BinderConfig], store_url: str, cluster_name: str
) -> None:
    """A second process named like the leader (a restart while the first still lives: frozen,
    or cut off from the store) is another holder: it neither resumes the leader's epoch nor
    publishes its address, and serves as a standby until the lease is free."""
    held = await store.get_lease("binder")
    assert held is not None and held.holder_address == binder.address
    async with ServiceHost(BinderService, config(store_url, cluster_name, "b1")) as twin:
        twin_service = twin.service
        assert isinstance(twin_service, BinderService)
        await twin_service.informer.wait_synced(timeout=15)
        await asyncio.sleep(0.6)  # three of its campaign's retries
        lease = await store.get_lease("binder")
        assert lease is not None
        assert (lease.holder, lease.epoch) == (held.holder, held.epoch)
        assert lease.holder_address == binder.address
        assert not await leading(twin)
        assert await leading(binder)


async def _eq(value: Awaitable[str], expected: str) -> bool:
    return await value == expected


async def test_lease_loss_aborts_streams_and_campaigns_again(
    store: Store, binder: ServiceHost[BinderConfig], shards: list[Shard]
) -> None:
    await store.create(f.node("n1"))
    a = f.job("a", replicas=2)
    pods = await submit(store, a)
    assert (await shards[0].decide(unit(a, pods, [("a-0", "n1")])))["a-0"].code == V.BOUND
    lease = await store.get_lease("binder")
    assert lease is not None
    assert await store.release_lease("binder", lease.holder, lease.epoch)
    # Long enough that the thief still holds it while a loaded machine runs the checks below;
    # short enough for the re-election to follow well within `eventually`.
    ok, stolen = await store.acquire_lease("binder", "thief", 6000, "10.0.0.9:1")
    assert ok
    # The renewal fails: the binder steps down and ends the stream so the shard reconnects.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await shards[0].read()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    shard = Shard(binder.address)
    try:
        await shard.send(unit(a, pods, [("a-1", "n1")]))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await shard.read()
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "10.0.0.9:1" in (err.value.details() or "")
    finally:
        await shard.close()
    # The thief's lease lapses unrenewed; the binder wins it back with a newer epoch.
    await eventually(lambda: leading(binder), what="re-election")
    again = await store.get_lease("binder")
    assert again is not None and holder_name(again.holder) == "b1" and again.epoch > stolen.epoch
    shard = Shard(binder.address)
    try:
        assert (await shard.decide(unit(a, pods, [("a-1", "n1")])))["a-1"].code == V.BOUND
    finally:
        await shard.close()


async def test_fenced_commit_answers_not_leader(
    store: Store, store_url: str, cluster_name: str
) -> None:
    """The lease changes hands between renewals: the store refuses the old epoch's commit."""
    cfg = config(store_url, cluster_name, "slow", lease_ms=30000, renew_ms=15000)
    async with ServiceHost(BinderService, cfg) as host:
        await eventually(lambda: leading(host), what="leadership")
        await store.create(f.node("n1"))
        a = f.job("a")
        pods = await submit(store, a)
        lease = await store.get_lease("binder")
        assert lease is not None
        assert await store.release_lease("binder", lease.holder, lease.epoch)
        assert (await store.acquire_lease("binder", "thief", 30000))[0]
        shard = Shard(host.address)
        try:
            verdicts = await shard.decide(unit(a, pods, [("a-0", "n1")]))
            assert verdicts["a-0"].code == V.NOT_LEADER
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await shard.read()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await shard.close()
        assert not (await store.get(pb.Pod, "a-0")).spec.node_name
        assert not await leading(host)


# --------------------------------------------------------------------------------------------
# Failover between real processes
# --------------------------------------------------------------------------------------------


Start = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def start_binder(store_url: str, cluster_name: str, tmp_path: Path) -> Iterator[Start]:
    """Start ``python -m services.binder`` processes; stop what is left after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str, *flags: str) -> subprocess.Popen[bytes]:
        with (tmp_path / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "services.binder", "--store-url", store_url,
                 "--cluster", cluster_name, "--name", name, "--port", "0",
                 "--log-format", "json", "--insecure", "true", *flags],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ},
            )  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_failover_after_kill_9(store: Store, start_binder: Start) -> None:
    lease_ms = 1000
    by_name = {
        name: start_binder(name, "--lease-ms", str(lease_ms), "--renew-ms", "200")
        for name in ("b1", "b2")
    }

    async def holder() -> pb.Lease | None:
        lease = await store.get_lease("binder")
        return lease if lease is not None and lease.holder else None

    await eventually(lambda: _some(holder()), what="a first leader")
    first = await holder()
    assert first is not None
    await store.create(f.node("n1"))
    a = f.job("a", replicas=2)
    pods = await submit(store, a)
    assert (await bind_via_leader(store, unit(a, pods, [("a-0", "n1")])))["a-0"].code == V.BOUND

    by_name[holder_name(first.holder)].kill()  # SIGKILL: no release, the lease must lapse
    by_name[holder_name(first.holder)].wait(10)
    started = time.monotonic()

    async def taken_over() -> bool:
        lease = await holder()
        return lease is not None and lease.holder != first.holder

    await eventually(taken_over, timeout=20 * lease_ms / 1000, what="the standby to take over")
    second = await holder()
    assert second is not None and second.epoch > first.epoch
    assert time.monotonic() - started < 20 * lease_ms / 1000

    # The deposed leader's epoch no longer writes anything.
    node = await store.get(pb.Node, "n1")
    node.metadata.labels["touched"] = "yes"
    with pytest.raises(FencedError):
        await store.commit([Update(node)], fence=Fence("binder", first.epoch))
    assert "touched" not in (await store.get(pb.Node, "n1")).metadata.labels

    verdicts = await bind_via_leader(store, unit(a, pods, [("a-1", "n1")]))
    assert verdicts["a-1"].code == V.BOUND
    assert (await store.get(pb.Pod, "a-1")).spec.node_name == "n1"


async def _some(value: Awaitable[object | None]) -> bool:
    return await value is not None


async def bind_via_leader(store: Store, decision: ipb.UnitDecision) -> dict[str, ipb.PodVerdict]:
    """What a shard does: find the leader through the lease, retry while it is changing."""
    deadline = time.monotonic() + 20
    while True:
        lease = await store.get_lease("binder")
        if lease is not None and lease.holder:
            shard = Shard(lease.holder_address)
            try:
                verdicts = await shard.decide(decision)
                if all(v.code != V.NOT_LEADER for v in verdicts.values()):
                    return verdicts
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (
                    grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.UNAVAILABLE,
                ):
                    raise
            finally:
                await shard.close()
        assert time.monotonic() < deadline, "no leader answered"
        await asyncio.sleep(0.1)


# --------------------------------------------------------------------------------------------
# Preemption: placements with victims
# --------------------------------------------------------------------------------------------


def prio(job: pb.Job, priority: int, *, preemptible: bool = True, replace: bool = False) -> pb.Job:
    job.spec.priority = priority
    job.spec.preemptible = preemptible
    job.spec.replace_lost_pods = replace
    return job


async def submit_prio(store: Store, job: pb.Job) -> dict[str, pb.Pod]:
    """As the dispatcher copies them: priority, preemptibility, preemption policy and queue on
    every pod."""
    pods = f.pods_of(job)
    for p in pods:
        p.spec.priority = job.spec.priority
        p.spec.preemptible = job.spec.preemptible
        p.spec.preemption_policy = job.spec.preemption_policy
        p.spec.queue = job.spec.queue
    await store.create_unit(job, pods)
    return {p.metadata.name: p for p in pods}


def budget(name: str, job: str, *, max_unavailable: int) -> pb.DisruptionBudget:
    b = pb.DisruptionBudget(metadata=pb.ObjectMeta(name=name))
    b.spec.job = job
    b.spec.max_unavailable = max_unavailable
    return b


def preempting(
    job: pb.Job, pods: dict[str, pb.Pod], placements: list[tuple[str, str, list[str]]]
) -> ipb.UnitDecision:
    u = unit(job, pods, [(p, n) for p, n, _ in placements])
    for pl, (_, _, victims) in zip(u.placements, placements, strict=True):
        pl.victims.extend(victims)
    return u


@dataclass
class PreemptCase:
    id: str
    nodes: list[pb.Node]
    # Jobs already running: (job, [(pod, node)]), bound through the binder first.
    running: list[tuple[pb.Job, list[tuple[str, str]]]]
    preemptors: list[pb.Job]
    # One batch: (job name, [(pod, node, victims)]).
    units: list[tuple[str, list[tuple[str, str, list[str]]]]]
    expect: dict[str, tuple[Code, str]]
    evicted: set[str]
    budgets: list[pb.DisruptionBudget] = field(default_factory=list)


LOW = 1
HIGH = 10
PREEMPT_CASES = [
    PreemptCase(
        "victim evicted and preemptor bound in one commit",
        [f.node("n1", cpu=1000)],
        [(prio(f.job("low", cpu=600), LOW), [("low-0", "n1")])],
        [prio(f.job("high", cpu=600), HIGH)],
        [("high", [("high-0", "n1", ["low-0"])])],
        {"high-0": (V.BOUND, "")},
        {"low-0"},
    ),
    PreemptCase(
        "a victim already gone is fine",
        [f.node("n1", cpu=1000)],
        [],
        [prio(f.job("high", cpu=600), HIGH)],
        [("high", [("high-0", "n1", ["vanished"])])],
        {"high-0": (V.BOUND, "")},
        set(),
    ),
    PreemptCase(
        "a victim claimed twice: the second claimant conflicts",
        [f.node("n1", cpu=1000)],
        [(prio(f.job("low", cpu=600), LOW), [("low-0", "n1")])],
        [prio(f.job("high", replicas=2, cpu=300), HIGH)],
        [("high", [("high-0", "n1", ["low-0"]), ("high-1", "n1", ["low-0"])])],
        {"high-0": (V.BOUND, ""), "high-1": (V.CONFLICT, "claimed by 'high-0'")},
        {"low-0"},
    ),
    PreemptCase(
        "equal priority is never a victim",
        [f.node("n1", cpu=1000)],
        [(prio(f.job("peer", cpu=600), HIGH), [("peer-0", "n1")])],
        [prio(f.job("high", cpu=600), HIGH)],
        [("high", [("high-0", "n1", ["peer-0"])])],
        {"high-0": (V.CONFLICT, "priority not lower")},
        set(),
    ),
    PreemptCase(
        "a non-preemptible pod is never a victim",
        [f.node("n1", cpu=1000)],
        [(prio(f.job("low", cpu=600), LOW, preemptible=False), [("low-0", "n1")])],
        [prio(f.job("high", cpu=600), HIGH)],
        [("high", [("high-0", "n1", ["low-0"])])],
        {"high-0": (V.CONFLICT, "not preemptible")},
        set(),
    ),
    PreemptCase(
        "a victim of the other pool is refused",
        [f.node("n1", cpu=1000, be_cpu=1000, be_mem=f.GiB)],
        [(prio(f.job("be", cpu=600, qos=pb.QOS_BEST_EFFORT), LOW), [("be-0", "n1")])],
        [prio(f.job("high", cpu=600), HIGH)],
        [("high", [("high-0", "n1", ["be-0"])])],
        {"high-0": (V.CONFLICT, "other pool")},
        set(),
    ),
    PreemptCase(
        "a victim on another node is refused",
        [f.node("n1", cpu=1000), f.node("n2", cpu=1000)],
        [(prio(f.job("low", replicas=2, cpu=600), LOW), [("low-0", "n1"), ("low-1", "n2")])],
        [prio(f.job("high", cpu=600), HIGH)],
        [("high", [("high-0", "n1", ["low-1"])])],
        {"high-0": (V.CONFLICT, "is on node 'n2'")},
        set(),
    ),
    PreemptCase(
        "too few victims: the node check fails and nothing is evicted",
        [f.node("n1", cpu=1000)],
        [(prio(f.job("low", replicas=2, cpu=400), LOW), [("low-0", "n1"), ("low-1", "n1")])],
        [prio(f.job("high", cpu=700), HIGH)],
        [("high", [("high-0", "n1", ["low-0"])])],
        {"high-0": (V.CONFLICT, "insufficient cpu")},
        set(),
    ),
    PreemptCase(
        "a disruption budget blocks: CONFLICT naming it, nothing evicted",
        [f.node("n1", cpu=1000)],
        [(prio(f.job("low", cpu=600), LOW), [("low-0", "n1")])],
        [prio(f.job("high", cpu=600), HIGH)],
        [("high", [("high-0", "n1", ["low-0"])])],
        {"high-0": (V.CONFLICT, "disruption budget keep-low allows 0")},
        set(),
        [budget("keep-low", "low", max_unavailable=0)],
    ),
    PreemptCase(
        "gang: the second member's victims break a budget, nothing evicted or bound",
        [f.node("n1", cpu=1000), f.node("n2", cpu=1000)],
        [(prio(f.job("low", replicas=2, cpu=600), LOW), [("low-0", "n1"), ("low-1", "n2")])],
        [prio(f.job("gang", replicas=2, min_member=2, cpu=600), HIGH)],
        [("gang", [("gang-0", "n1", ["low-0"]), ("gang-1", "n2", ["low-1"])])],
        {"gang-0": (V.GANG_REJECTED, G), "gang-1": (V.CONFLICT, "disruption budget one")},
        set(),
        [budget("one", "low", max_unavailable=1)],
    ),
    PreemptCase(
        "a later placement cannot take room a later preemptor frees",
        [f.node("n1", cpu=1000)],
        [(prio(f.job("low", cpu=600), LOW), [("low-0", "n1")])],
        [prio(f.job("plain", cpu=600), HIGH), prio(f.job("high", cpu=600), HIGH)],
        [("plain", [("plain-0", "n1", [])]), ("high", [("high-0", "n1", ["low-0"])])],
        {"plain-0": (V.CONFLICT, "insufficient cpu"), "high-0": (V.BOUND, "")},
        {"low-0"},
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", PREEMPT_CASES, ids=[c.id for c in PREEMPT_CASES])
async def test_preemption_batch(store: Store, shards: list[Shard], case: PreemptCase) -> None:
    for n in case.nodes:
        await store.create(n)
    for b in case.budgets:
        await store.create(b)
    for job, placements in case.running:
        pods = await submit_prio(store, job)
        got = await shards[0].decide(unit(job, pods, placements))
        assert {V.Name(v.code) for v in got.values()} == {"BOUND"}
    pods = {}
    jobs = {j.metadata.name: j for j in case.preemptors}
    for j in case.preemptors:
        pods |= await submit_prio(store, j)
    await asyncio.sleep(0.2)  # the binder's view holds the budgets and the running pods
    verdicts = await shards[1].decide(
        *(preempting(jobs[job], pods, placements) for job, placements in case.units)
    )
    assert {p: V.Name(v.code) for p, v in verdicts.items()} == {
        p: V.Name(c) for p, (c, _) in case.expect.items()
    }
    for pod, (_, reason) in case.expect.items():
        assert reason in verdicts[pod].reason, (pod, verdicts[pod].reason)
    stored = {p.metadata.name: p for p in (await store.list_all(pb.Pod))[0]}
    evicted = {n for n, p in stored.items() if p.status.phase == pb.POD_FAILED}
    assert evicted == case.evicted
    for name in evicted:
        p = stored[name]
        assert p.status.reason == "Preempted" and p.status.finished_ms > 0
        assert p.status.preempted_by in verdicts and verdicts[p.status.preempted_by].code == V.BOUND
        assert p.status.preempted_by in p.status.message and p.spec.node_name in p.status.message


@pytest.mark.parametrize("order", ["preemptor first", "other shard first", "at once"])
async def test_the_room_a_preemptor_frees_is_its_own_across_shards(
    store: Store, shards: list[Shard], order: str
) -> None:
    """Preemption holds what it freed (issue 31 item 5), by construction: the Binder evicts a
    preemptor's victims in the commit that binds it, so the freed room is never free — no
    other shard's pod can take it between the eviction and the bind, whichever batch the
    Binder decides first. Shard 0's preemptor frees n1 (the only node) of low-0; shard 1 sends
    a pod of another job that fits only in that room, before, after or together with it: it is
    refused every time, the preemptor binds, and n1 holds the preemptor alone. (A preemptor
    refused evicts nothing: ``test_preemption_batch``.)"""
    await store.create(f.node("n1", cpu=1000))
    low = prio(f.job("low", cpu=600), LOW)
    await shards[0].decide(unit(low, await submit_prio(store, low), [("low-0", "n1")]))
    high = prio(f.job("high", cpu=600), HIGH)
    other = prio(f.job("other", cpu=600), HIGH)
    high_pods, other_pods = await submit_prio(store, high), await submit_prio(store, other)
    await asyncio.sleep(0.2)  # the binder's view holds the running pod
    preemptor = preempting(high, high_pods, [("high-0", "n1", ["low-0"])])
    competitor = unit(other, other_pods, [("other-0", "n1")])
    if order == "at once":
        first, second = await asyncio.gather(
            shards[0].decide(preemptor), shards[1].decide(competitor)
        )
        verdicts = first | second
    elif order == "preemptor first":
        verdicts = await shards[0].decide(preemptor)
        verdicts |= await shards[1].decide(competitor)
    else:
        verdicts = await shards[1].decide(competitor)
        verdicts |= await shards[0].decide(preemptor)
    assert V.Name(verdicts["high-0"].code) == "BOUND", verdicts["high-0"].reason
    assert V.Name(verdicts["other-0"].code) == "CONFLICT"
    assert "insufficient cpu" in verdicts["other-0"].reason
    stored = {p.metadata.name: p for p in (await store.list_all(pb.Pod))[0]}
    assert stored["low-0"].status.phase == pb.POD_FAILED
    assert stored["low-0"].status.preempted_by == "high-0"
    assert stored["high-0"].spec.node_name == "n1" and not stored["other-0"].spec.node_name
    # One commit: the victim's eviction and the preemptor's bind are consecutive revisions, with
    # no other write between them.
    evicted_at, bound_at = (
        stored["low-0"].metadata.resource_version,
        stored["high-0"].metadata.resource_version,
    )
    assert bound_at - evicted_at == 1, (evicted_at, bound_at)
    usage = await store.node_usage("n1")
    assert usage is not None and usage.used["g.cpu"] == 600


async def test_evicted_pod_of_a_replacing_job_gets_a_replacement(
    store: Store, shards: list[Shard]
) -> None:
    await store.create(f.node("n1", cpu=1000))
    low = prio(f.job("svc", replicas=1, cpu=600), LOW, replace=True)
    await shards[0].decide(unit(low, await submit_prio(store, low), [("svc-0", "n1")]))
    high = prio(f.job("high", cpu=600), HIGH)
    pods = await submit_prio(store, high)
    await asyncio.sleep(0.1)
    verdicts = await shards[0].decide(preempting(high, pods, [("high-0", "n1", ["svc-0"])]))
    assert verdicts["high-0"].code == V.BOUND
    old, new = await store.get_many(pb.Pod, ["svc-0", "svc-0-r1"])
    assert old is not None and old.status.phase == pb.POD_FAILED
    assert new is not None and new.status.phase == pb.POD_PENDING and not new.spec.node_name
    assert new.spec.index == 0 and new.spec.priority == LOW
    assert new.metadata.uid and new.metadata.uid != old.metadata.uid
    assert new.metadata.annotations["godel.io/replaces"] == "svc-0"
    # The eviction, the replacement and the bind are one commit: consecutive revisions.
    assert new.metadata.resource_version == old.metadata.resource_version + 1


async def test_two_shards_against_one_budget_never_exceed_it(
    store: Store, shards: list[Shard]
) -> None:
    """Four full nodes of one job under maxUnavailable 2; two shards each send two preemptors
    at once, each claiming a different victim: the binder admits at most two evictions."""
    nodes = [f"n{i}" for i in range(4)]
    for n in nodes:
        await store.create(f.node(n, cpu=1000))
    await store.create(budget("two", "low", max_unavailable=2))
    low = prio(f.job("low", replicas=4, cpu=600), LOW)
    spread = [(f"low-{i}", n) for i, n in enumerate(nodes)]
    await shards[0].decide(unit(low, await submit_prio(store, low), spread))
    a = prio(f.job("a", replicas=2, cpu=600), HIGH)
    b = prio(f.job("b", replicas=2, cpu=600), HIGH)
    pa, pb_ = await submit_prio(store, a), await submit_prio(store, b)
    await asyncio.sleep(0.2)
    results = await asyncio.gather(
        shards[0].decide(preempting(a, pa, [("a-0", "n0", ["low-0"]), ("a-1", "n1", ["low-1"])])),
        shards[1].decide(preempting(b, pb_, [("b-0", "n2", ["low-2"]), ("b-1", "n3", ["low-3"])])),
    )
    verdicts = {k: v for r in results for k, v in r.items()}
    codes = Counter(V.Name(v.code) for v in verdicts.values())
    assert codes == {"BOUND": 2, "CONFLICT": 2}
    for v in verdicts.values():
        if v.code == V.CONFLICT:
            assert "disruption budget two" in v.reason
    stored = (await store.list_all(pb.Pod))[0]
    assert sum(p.status.reason == "Preempted" for p in stored) == 2


# --------------------------------------------------------------------------------------------
# Forged decisions the shards would never make: the Binder re-checks the preemptor's policy and
# the queues' maxima (the dispatcher's admission is not the last word).
# --------------------------------------------------------------------------------------------


async def rejection_event(store: Store, pod: str) -> pb.Event:
    """The BindRejected event of ``pod``, written in the Binder's next batch of events."""
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        events, _ = await store.list_all(pb.Event)
        found = [e for e in events if e.reason == "BindRejected" and e.regarding.name == pod]
        if found:
            return found[0]
        assert asyncio.get_running_loop().time() < deadline, f"no BindRejected event of {pod}"
        await asyncio.sleep(0.05)


async def test_victims_of_a_never_preemptor_are_refused_and_not_evicted(
    store: Store, shards: list[Shard]
) -> None:
    """A decision giving victims to a pod whose preemptionPolicy is Never, as a forged or buggy
    shard could send it: refused naming the rule, its victim left running."""
    await store.create(f.node("n1", cpu=1000))
    low = prio(f.job("low", cpu=600), LOW)
    await shards[0].decide(unit(low, await submit_prio(store, low), [("low-0", "n1")]))
    never = prio(f.job("never", cpu=600), HIGH)
    never.spec.preemption_policy = pb.NEVER
    pods = await submit_prio(store, never)
    verdicts = await shards[1].decide(preempting(never, pods, [("never-0", "n1", ["low-0"])]))
    refused = verdicts["never-0"]
    assert V.Name(refused.code) == "CONFLICT"
    assert "pod 'never-0' has preemptionPolicy Never" in refused.reason, refused.reason
    victim, preemptor = await store.get_many(pb.Pod, ["low-0", "never-0"])
    assert victim is not None and victim.status.phase == pb.POD_BOUND
    assert victim.spec.node_name == "n1" and not victim.status.preempted_by
    assert preemptor is not None and not preemptor.spec.node_name
    event = await rejection_event(store, "never-0")
    assert "preemptionPolicy Never" in event.message, event.message


def queue(name: str, *, cpu: int = 0, mem: int = 0, pods: int = 0, parent: str = "") -> pb.Queue:
    q = pb.Queue(metadata=pb.ObjectMeta(name=name))
    if cpu or mem or pods:
        q.spec.quota.milli_cpu, q.spec.quota.memory_bytes, q.spec.quota.pods = cpu, mem, pods
    q.spec.parent = parent
    return q


def queued(job: pb.Job, queue_name: str) -> pb.Job:
    job.spec.queue = queue_name
    return job


def binder_state(binder: ServiceHost[BinderConfig]) -> ClusterState:
    service = binder.service
    assert isinstance(service, BinderService)
    return service.state


async def binder_caught_up(binder: ServiceHost[BinderConfig], store: Store) -> None:
    """The binder's informer has applied every change so far (the queues just created)."""
    service = binder.service
    assert isinstance(service, BinderService)
    await service.informer.wait_for_revision(await store.revision(), timeout=15)


async def queues_within_max(store: Store) -> list[str]:
    """What ``godel audit`` reports of the queues' maxima (empty: every queue within)."""
    return [v for v in (await audit_cluster(store)).violations if "queue" in v]


@dataclass
class QuotaCase:
    id: str
    queues: list[pb.Queue]
    # Jobs already bound: (job, [(pod, node)]), through the binder first.
    running: list[tuple[pb.Job, list[tuple[str, str]]]]
    jobs: list[pb.Job]
    # One batch: (job name, [(pod, node, victims)]).
    units: list[tuple[str, list[tuple[str, str, list[str]]]]]
    expect: dict[str, tuple[Code, str]]
    evicted: set[str] = field(default_factory=set)


Q = "QueueQuota: queue 'team' would hold"
QUOTA_CASES = [
    QuotaCase(
        "within the max: every placement binds",
        [queue("team", cpu=1000)],
        [],
        [queued(f.job("a", replicas=2, cpu=500), "team")],
        [("a", [("a-0", "n1", []), ("a-1", "n1", [])])],
        {"a-0": (V.BOUND, ""), "a-1": (V.BOUND, "")},
    ),
    QuotaCase(
        "a batch past the max: the placement that would cross it is refused",
        [queue("team", cpu=1000)],
        [],
        [queued(f.job("a", replicas=2, cpu=800), "team")],
        [("a", [("a-0", "n1", []), ("a-1", "n1", [])])],
        {"a-0": (V.BOUND, ""), "a-1": (V.CONFLICT, f"{Q} 1600m of cpu, over its max 1000m")},
    ),
    QuotaCase(
        "the queue's bound pods count",
        [queue("team", cpu=1000)],
        [(queued(f.job("old", cpu=600), "team"), [("old-0", "n1")])],
        [queued(f.job("a", cpu=600), "team")],
        [("a", [("a-0", "n1", [])])],
        {"a-0": (V.CONFLICT, f"{Q} 1200m of cpu, over its max 1000m")},
    ),
    QuotaCase(
        "memory is judged too",
        [queue("team", mem=f.GiB)],
        [],
        [queued(f.job("a", replicas=2, cpu=10, mem=600 * f.MiB), "team")],
        [("a", [("a-0", "n1", []), ("a-1", "n1", [])])],
        {"a-0": (V.BOUND, ""), "a-1": (V.CONFLICT, f"{Q} {1200 * f.MiB}B of memory")},
    ),
    QuotaCase(
        "so is the pod count",
        [queue("team", pods=1)],
        [],
        [queued(f.job("a", replicas=2, cpu=10), "team")],
        [("a", [("a-0", "n1", []), ("a-1", "n1", [])])],
        {"a-0": (V.BOUND, ""), "a-1": (V.CONFLICT, f"{Q} 2 of pods, over its max 1")},
    ),
    QuotaCase(
        "a parent's max bounds the queues below it",
        [queue("org", cpu=1000), queue("team", parent="org")],
        [(queued(f.job("old", cpu=600), "org"), [("old-0", "n1")])],
        [queued(f.job("a", cpu=600), "team")],
        [("a", [("a-0", "n1", [])])],
        {"a-0": (V.CONFLICT, "parent queue 'org' of 'team' would hold 1200m of cpu")},
    ),
    QuotaCase(
        "another queue's pods do not count",
        [queue("team", cpu=1000)],
        [(queued(f.job("old", cpu=900), "other"), [("old-0", "n1")])],
        [queued(f.job("a", cpu=1000), "team")],
        [("a", [("a-0", "n1", [])])],
        {"a-0": (V.BOUND, "")},
    ),
    QuotaCase(
        "a gang past the max is rejected whole",
        [queue("team", cpu=1000)],
        [],
        [queued(f.job("g", replicas=2, min_member=2, cpu=600), "team")],
        [("g", [("g-0", "n1", []), ("g-1", "n1", [])])],
        {"g-0": (V.GANG_REJECTED, G), "g-1": (V.GANG_REJECTED, Q)},
    ),
    QuotaCase(
        "victims of the same queue free what they hold",
        [queue("team", cpu=1000)],
        [(prio(queued(f.job("low", cpu=800), "team"), LOW), [("low-0", "n1")])],
        [prio(queued(f.job("high", cpu=800), "team"), HIGH)],
        [("high", [("high-0", "n1", ["low-0"])])],
        {"high-0": (V.BOUND, "")},
        {"low-0"},
    ),
    QuotaCase(
        "victims of another queue free nothing of it, and stay",
        [queue("team", cpu=1000)],
        [
            (queued(f.job("old", cpu=600), "team"), [("old-0", "n1")]),
            (prio(queued(f.job("low", cpu=800), "other"), LOW), [("low-0", "n1")]),
        ],
        [prio(queued(f.job("high", cpu=600), "team"), HIGH)],
        [("high", [("high-0", "n1", ["low-0"])])],
        {"high-0": (V.CONFLICT, f"{Q} 1200m of cpu")},
    ),
    QuotaCase(
        "an earlier placement cannot take quota a later preemptor frees",
        [queue("team", cpu=1000)],
        [(prio(queued(f.job("low", cpu=800), "team"), LOW), [("low-0", "n1")])],
        [
            queued(f.job("plain", cpu=300), "team"),
            prio(queued(f.job("high", cpu=800), "team"), HIGH),
        ],
        [("plain", [("plain-0", "n1", [])]), ("high", [("high-0", "n1", ["low-0"])])],
        {"plain-0": (V.CONFLICT, f"{Q} 1100m of cpu"), "high-0": (V.BOUND, "")},
        {"low-0"},
    ),
    QuotaCase(
        "a preemptor refused for the max frees nothing: its victims stay and count",
        [queue("team", cpu=1000)],
        [(prio(queued(f.job("low", cpu=800), "team"), LOW), [("low-0", "n1")])],
        [
            prio(queued(f.job("high", cpu=1100), "team"), HIGH),
            queued(f.job("plain", cpu=300), "team"),
        ],
        [("high", [("high-0", "n1", ["low-0"])]), ("plain", [("plain-0", "n1", [])])],
        {"high-0": (V.CONFLICT, f"{Q} 1100m of cpu"), "plain-0": (V.CONFLICT, f"{Q} 1100m")},
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", QUOTA_CASES, ids=[c.id for c in QUOTA_CASES])
async def test_queue_max_batch(
    store: Store, binder: ServiceHost[BinderConfig], shards: list[Shard], case: QuotaCase
) -> None:
    for n in (f.node("n1", cpu=8000), f.node("n2", cpu=8000)):
        await store.create(n)
    for q in case.queues:
        await store.create(q)
    await binder_caught_up(binder, store)
    for job, placements in case.running:
        pods = await submit_prio(store, job)
        got = await shards[0].decide(unit(job, pods, placements))
        assert {V.Name(v.code) for v in got.values()} == {"BOUND"}
    pods = {}
    jobs = {j.metadata.name: j for j in case.jobs}
    for j in case.jobs:
        pods |= await submit_prio(store, j)
    await asyncio.sleep(0.2)  # the binder's view holds the running pods
    verdicts = await shards[1].decide(
        *(preempting(jobs[job], pods, placements) for job, placements in case.units)
    )
    assert {p: V.Name(v.code) for p, v in verdicts.items()} == {
        p: V.Name(c) for p, (c, _) in case.expect.items()
    }
    for pod, (_, reason) in case.expect.items():
        assert reason in verdicts[pod].reason, (pod, verdicts[pod].reason)
    stored = {p.metadata.name: p for p in (await store.list_all(pb.Pod))[0]}
    assert {n for n, p in stored.items() if p.status.phase == pb.POD_FAILED} == case.evicted
    assert await queues_within_max(store) == []


async def test_racing_shards_never_take_a_queue_past_its_max(
    store: Store, binder: ServiceHost[BinderConfig], shards: list[Shard]
) -> None:
    """Two shards each send a pod of 800m of queue ``team`` (max 1 CPU) at once, as forged or
    racing decisions could: one binds, the other is refused naming the rule, and the queue's
    bound usage stays within its max."""
    await store.create(f.node("n1", cpu=8000))
    await store.create(queue("team", cpu=1000))
    await binder_caught_up(binder, store)
    a, b = queued(f.job("a", cpu=800), "team"), queued(f.job("b", cpu=800), "team")
    pa, pb_ = await submit_prio(store, a), await submit_prio(store, b)
    results = await asyncio.gather(
        shards[0].decide(unit(a, pa, [("a-0", "n1")])),
        shards[1].decide(unit(b, pb_, [("b-0", "n1")])),
    )
    verdicts = {k: v for r in results for k, v in r.items()}
    assert sorted(V.Name(v.code) for v in verdicts.values()) == ["BOUND", "CONFLICT"]
    [(lost, refused)] = [(p, v) for p, v in verdicts.items() if v.code == V.CONFLICT]
    assert f"{Q} 1600m of cpu, over its max 1000m" in refused.reason, refused.reason
    event = await rejection_event(store, lost)
    assert "QueueQuota" in event.message, event.message
    assert await queues_within_max(store) == []
    # Room freed in the queue is usable again: the bound pod finishes, the other binds.
    [(won, _)] = [(p, v) for p, v in verdicts.items() if v.code == V.BOUND]
    done = await store.get(pb.Pod, won)
    done.status.phase = pb.POD_SUCCEEDED
    await store.commit([Release(done)])
    retry = a if lost == "a-0" else b
    pods = pa if lost == "a-0" else pb_
    state = binder_state(binder)

    async def released() -> bool:
        return state.queue_usage["team"].is_zero()

    await eventually(released, what="the finished pod's quota given back")
    again = await shards[0].decide(unit(retry, pods, [(lost, "n1")]))
    assert V.Name(again[lost].code) == "BOUND", again[lost].reason


# --------------------------------------------------------------------------------------------
# Binder.Evict: the one eviction path for requests (the rescheduler's batches). All or
# nothing, within disruption budgets, a replacement per evicted pod in the same commit, pods
# gone or re-created left alone.
# --------------------------------------------------------------------------------------------

E = ipb.EvictResult


@pytest.fixture
async def shard(binder: ServiceHost[BinderConfig]) -> AsyncIterator[Shard]:
    s = Shard(binder.address)
    yield s
    await s.close()


async def running_job(store: Store, shard: Shard, name: str, replicas: int) -> list[pb.Pod]:
    """A job bound on n1 through the Binder, as the shards would place it."""
    j = f.job(name, replicas=replicas, cpu=100)
    pods = await submit(store, j)
    verdicts = await shard.decide(unit(j, pods, [(p, "n1") for p in pods]))
    assert {v.code for v in verdicts.values()} == {ipb.BOUND}
    return [await store.get(pb.Pod, p) for p in pods]


async def evict(address: str, pods: list[pb.Pod], **kw: str | bool) -> dict[str, ipb.EvictResult]:
    async with grpc.aio.insecure_channel(address) as channel:
        request = ipb.EvictRequest(**{"reason": "Rescheduled", "requester": "test", **kw})
        for p in pods:
            request.pods.add(name=p.metadata.name, uid=p.metadata.uid)
        response = await internal_pb2_grpc.BinderStub(channel).Evict(request, timeout=20)
    return {r.pod: r for r in response.results}


async def test_evicted_pods_fail_as_rescheduled_and_get_a_replacement_in_one_commit(
    store: Store, binder: ServiceHost[BinderConfig], shard: Shard
) -> None:
    await store.create(f.node("n1"))
    pods = await running_job(store, shard, "web", 2)
    results = await evict(binder.address, pods, movement="m-1")
    assert {n: E.Outcome.Name(r.outcome) for n, r in results.items()} == {
        "web-0": "EVICTED", "web-1": "EVICTED",
    }  # fmt: skip
    for name, result in results.items():
        old = await store.get(pb.Pod, name)
        assert (old.status.phase, old.status.reason) == (pb.POD_FAILED, "Rescheduled")
        assert "m-1" in old.status.message
        new = await store.get(pb.Pod, result.replacement)
        assert new.status.phase == pb.POD_PENDING and not new.spec.node_name
        assert new.spec.index == old.spec.index and new.metadata.uid != old.metadata.uid
    assert await store.claims() == {}  # both claims returned


async def test_pods_gone_or_recreated_are_left_alone(
    store: Store, binder: ServiceHost[BinderConfig], shard: Shard
) -> None:
    await store.create(f.node("n1"))
    pods = await running_job(store, shard, "web", 2)
    stale = pb.Pod()
    stale.CopyFrom(pods[1])
    stale.metadata.uid = "someone-else"  # the planned pod was re-created under its name
    ghost = pb.Pod(metadata=pb.ObjectMeta(name="ghost"))
    results = await evict(binder.address, [pods[0], stale, ghost])
    assert {n: E.Outcome.Name(r.outcome) for n, r in results.items()} == {
        "web-0": "EVICTED", "web-1": "GONE", "ghost": "GONE",
    }  # fmt: skip
    assert (await store.get(pb.Pod, "web-1")).status.phase == pb.POD_BOUND


@pytest.mark.parametrize(
    ("max_unavailable", "outcome"), [(0, "REFUSED"), (1, "REFUSED"), (2, "EVICTED")],
    ids=["never disrupt", "one at a time: two at once refused", "two allowed"],
)  # fmt: skip
async def test_a_budget_refuses_the_whole_request(
    store: Store,
    binder: ServiceHost[BinderConfig],
    shard: Shard,
    max_unavailable: int,
    outcome: str,
) -> None:
    await store.create(f.node("n1"))
    web = await running_job(store, shard, "web", 2)
    other = await running_job(store, shard, "other", 1)
    budget = pb.DisruptionBudget(metadata=pb.ObjectMeta(name="web"))
    budget.spec.job = "web"
    budget.spec.max_unavailable = max_unavailable
    await store.create(budget)
    host = binder.service
    assert host is not None
    await eventually(
        lambda: _seen(host, "DisruptionBudget", "web"), what="the binder sees the budget"
    )
    results = await evict(binder.address, [*web, *other])
    # All or nothing: the unbudgeted pod of another job stays too when the budget refuses.
    expected = outcome
    assert {E.Outcome.Name(r.outcome) for r in results.values()} == {expected}
    if expected == "REFUSED":
        assert "disruption budget web" in results["web-0"].reason
        assert (await store.get(pb.Pod, "other-0")).status.phase == pb.POD_BOUND


@pytest.mark.parametrize(
    ("max_unavailable", "expected"),
    [
        (0, {"web-0": "REFUSED", "web-1": "REFUSED", "other-0": "EVICTED"}),
        (1, {"web-0": "EVICTED", "web-1": "REFUSED", "other-0": "EVICTED"}),
        (2, {"web-0": "EVICTED", "web-1": "EVICTED", "other-0": "EVICTED"}),
    ],
    ids=["never disrupt", "one at a time: the first goes", "two allowed"],
)
async def test_a_partial_request_takes_each_pod_the_budgets_allow(
    store: Store,
    binder: ServiceHost[BinderConfig],
    shard: Shard,
    max_unavailable: int,
    expected: dict[str, str],
) -> None:
    await store.create(f.node("n1"))
    web = await running_job(store, shard, "web", 2)
    other = await running_job(store, shard, "other", 1)
    budget = pb.DisruptionBudget(metadata=pb.ObjectMeta(name="web"))
    budget.spec.job = "web"
    budget.spec.max_unavailable = max_unavailable
    await store.create(budget)
    host = binder.service
    assert host is not None
    await eventually(
        lambda: _seen(host, "DisruptionBudget", "web"), what="the binder sees the budget"
    )
    results = await evict(binder.address, [*web, *other], reason="Reclaimed", partial=True)
    assert {n: E.Outcome.Name(r.outcome) for n, r in results.items()} == expected
    for name, outcome in expected.items():
        pod = await store.get(pb.Pod, name)
        if outcome == "EVICTED":
            assert (pod.status.phase, pod.status.reason) == (pb.POD_FAILED, "Reclaimed")
        else:
            assert pod.status.phase == pb.POD_BOUND
            assert "disruption budget web" in results[name].reason


async def _seen(host: object, kind: str, name: str) -> bool:
    return host.informer.get(kind, name) is not None  # type: ignore[attr-defined]


async def test_a_request_without_a_reason_is_invalid(
    binder: ServiceHost[BinderConfig],
) -> None:
    async with grpc.aio.insecure_channel(binder.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await internal_pb2_grpc.BinderStub(channel).Evict(ipb.EvictRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reason" in (err.value.details() or "")
