"""The dispatcher's public API through a real grpc.aio client against the service run in-process
on a real store: Submit validation (table-driven, store unchanged on every rejection), Apply,
Get, List, Delete, Explain, Watch, and their error codes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.api.watch import _of_job
from services.dispatcher.controllers.creation import CHUNK_OPS, first_commit
from services.dispatcher.controllers.pods import normalise_job
from services.dispatcher.dispatching.queueing import policy_for
from services.dispatcher.objects import PODS_CREATED_ANNOTATION
from services.eviction import evicted
from services.runtime.healthcheck import probe
from store import Store
from store.client import Bind, Release
from store.kinds import wrap
from tests import factories as f
from tests.dispatcher_harness import Running, dispatcher_config, eventually, run_dispatcher

Job = pb.Job
Mutate = Callable[[Job], None]
# Generous: a health check that waited this long for the dispatcher's loop is starved.
HEALTH_DEADLINE_SECONDS = 10.0


@pytest.fixture
async def dispatcher(store_url: str, cluster_name: str, tmp_path: Path) -> AsyncIterator[Running]:
    async with run_dispatcher(dispatcher_config(store_url, cluster_name, tmp_path)) as running:
        yield running


async def seed(store: Store) -> None:
    """One 4-core node (2 cores reclaimable), queue team-a, and an existing job "taken"."""
    await store.create(f.node("n1", cpu=4000, be_cpu=2000, be_mem=f.GiB))
    await store.create(pb.Queue(metadata=pb.ObjectMeta(name="team-a")))
    await store.create_unit(f.job("taken"), f.pods_of(f.job("taken")))


def _set(path: str, value: object) -> Mutate:
    def mutate(job: Job) -> None:
        *parents, last = path.split(".")
        msg = job
        for p in parents:
            msg = getattr(msg, p)
        setattr(msg, last, value)

    return mutate


def _toleration(job: Job) -> None:
    job.spec.template.tolerations.add(key="gpu", value="x")


def _affinity(job: Job) -> None:
    term = job.spec.template.affinity.node_affinity.required.add()
    term.match_expressions.add(key="zone", values=["a"])


def _gt_not_int(job: Job) -> None:
    term = job.spec.template.affinity.node_affinity.required.add()
    term.match_expressions.add(key="cores", operator=pb.LabelSelectorRequirement.GT, values=["x"])


def _anti_affinity(job: Job) -> None:
    term = job.spec.template.affinity.pod_anti_affinity.required.add()
    term.label_selector.add(key="app", operator=pb.LabelSelectorRequirement.EXISTS)


def _node_value_impossible(job: Job) -> None:
    term = job.spec.template.affinity.node_affinity.required.add()
    term.match_expressions.add(
        key="zone", operator=pb.LabelSelectorRequirement.NOT_IN, values=["a b"]
    )


def _pod_selector_value_impossible(job: Job) -> None:
    term = job.spec.template.affinity.pod_anti_affinity.required.add(topology_key="zone")
    term.label_selector.add(key="app", operator=pb.LabelSelectorRequirement.IN, values=["-web"])


def _selector_key_impossible(job: Job) -> None:
    term = job.spec.template.affinity.pod_affinity.preferred.add(weight=1).term
    term.topology_key = "zone"
    term.label_selector.add(key="a/b/c", operator=pb.LabelSelectorRequirement.EXISTS)


def _node_selector_value_too_long(job: Job) -> None:
    job.spec.template.node_selector["zone"] = "a" * 64


def _labelled(key: str, value: str, *, pod: bool = False) -> Mutate:
    def mutate(job: Job) -> None:
        (job.spec.template if pod else job.metadata).labels[key] = value

    return mutate


def _toleration_of(key: str, value: str) -> Mutate:
    def mutate(job: Job) -> None:
        job.spec.template.tolerations.add(key=key, operator=pb.Toleration.EQUAL, value=value)

    return mutate


def _spread_skew_zero(job: Job) -> None:
    job.spec.template.topology_spread_constraints.add(topology_key="zone", max_skew=0)


def _spread_no_key(job: Job) -> None:
    job.spec.template.topology_spread_constraints.add(max_skew=1)


def _host_port(port: int) -> Mutate:
    def mutate(job: Job) -> None:
        job.spec.template.ports.add(container_port=80, host_port=port)

    return mutate


def _dup_host_port(job: Job) -> None:
    job.spec.template.ports.add(container_port=80, host_port=8080)
    job.spec.template.ports.add(container_port=81, host_port=8080)


def _extended(job: Job) -> None:
    job.spec.template.requests.extended["example.com/fpga"] = -2


def _no_resources(job: Job) -> None:
    job.spec.template.requests.milli_cpu = 0
    job.spec.template.requests.memory_bytes = 0


def _best_effort_too_big(job: Job) -> None:
    job.spec.qos = pb.QOS_BEST_EFFORT
    job.spec.template.requests.milli_cpu = 3000


def _job_affinity(required: list[str], preferred: list[str]) -> Mutate:
    def mutate(job: Job) -> None:
        f.job_affinity(job, required, preferred)

    return mutate


def _gpus(cards: int, *, milli: int = 0, models: tuple[str, ...] = ()) -> Mutate:
    def mutate(job: Job) -> None:
        f.gpu_job(job, cards, milli=milli, models=models)

    return mutate


T = "jobs[0].spec.template"
BAD_JOBS: list[tuple[str, Mutate, str, str]] = [
    # (case, mutation of a valid 2-replica job, field, description contains)
    ("name missing", _set("metadata.name", ""), "jobs[0].metadata.name", "is required"),
    ("name not DNS-1123", _set("metadata.name", "Bad_Name"), "jobs[0].metadata.name", "DNS-1123 label"),
    ("name with a dot", _set("metadata.name", "a.b"), "jobs[0].metadata.name", "DNS-1123 label"),
    ("name leaves no room for -<index>", _set("metadata.name", "a" * 62), "jobs[0].metadata.name",
     "at most 61 characters"),
    ("job already exists", _set("metadata.name", "taken"), "jobs[0].metadata.name", "AlreadyExists"),
    ("replicas zero", _set("spec.replicas", 0), "jobs[0].spec.replicas", "at least 1"),
    ("replicas over the max", _set("spec.replicas", 100_001), "jobs[0].spec.replicas",
     "at most 100000"),
    ("min_member zero", _set("spec.min_member", 0), "jobs[0].spec.min_member", "at least 1"),
    ("min_member over replicas", _set("spec.min_member", 3), "jobs[0].spec.min_member",
     "must not exceed replicas"),
    ("negative cpu", _set("spec.template.requests.milli_cpu", -1), f"{T}.requests.milli_cpu",
     "must not be negative"),
    ("negative extended", _extended, f"{T}.requests.extended[example.com/fpga]", "must not be negative"),
    ("no cpu and no memory", _no_resources, f"{T}.requests",
     "at least one of milli_cpu, memory_bytes must be set"),
    ("unknown queue", _set("spec.queue", "nope"), "jobs[0].spec.queue", "does not exist"),
    ("unknown qos", _set("spec.qos", 7), "jobs[0].spec.qos", "unknown QoS"),
    ("priority out of range", _set("spec.priority", 2_000_000_000), "jobs[0].spec.priority",
     "must be within"),
    ("toleration operator unspecified", _toleration, f"{T}.tolerations[0].operator", "must be set"),
    ("affinity operator unspecified", _affinity,
     f"{T}.affinity.node_affinity.required[0].match_expressions[0].operator", "must be set"),
    ("GT needs an integer", _gt_not_int,
     f"{T}.affinity.node_affinity.required[0].match_expressions[0].values", "integer"),
    ("anti-affinity without topology key", _anti_affinity,
     f"{T}.affinity.pod_anti_affinity.required[0].topology_key", "is required"),
    ("node affinity value no label can hold", _node_value_impossible,
     f"{T}.affinity.node_affinity.required[0].match_expressions[0].values[0]",
     "not a valid label value"),
    ("pod selector value no label can hold", _pod_selector_value_impossible,
     f"{T}.affinity.pod_anti_affinity.required[0].label_selector[0].values[0]",
     "not a valid label value"),
    ("pod selector key invalid", _selector_key_impossible,
     f"{T}.affinity.pod_affinity.preferred[0].term.label_selector[0].key", "not a DNS-1123 subdomain"),
    ("node selector value too long", _node_selector_value_too_long,
     f"{T}.node_selector['zone']", "at most 63 characters"),
    ("job label key with spaces", _labelled("has spaces!", "x"),
     "jobs[0].metadata.labels['has spaces!']", "'has spaces!' is not a valid label key"),
    ("job label value of 70 characters", _labelled("team", "v" * 70),
     "jobs[0].metadata.labels['team']", "at most 63 characters (got 70)"),
    ("job label key a/b/c", _labelled("a/b/c", "x"),
     "jobs[0].metadata.labels['a/b/c']", "prefix 'a/b' is not a DNS-1123 subdomain"),
    ("pod label key with spaces", _labelled("has spaces!", "x", pod=True),
     f"{T}.labels['has spaces!']", "is not a valid label key"),
    ("pod label value of 70 characters", _labelled("team", "v" * 70, pod=True),
     f"{T}.labels['team']", "at most 63 characters (got 70)"),
    ("toleration key not a label key", _toleration_of("x y", "a"), f"{T}.tolerations[0].key",
     "'x y' is not a valid label key"),
    ("toleration value not a label value", _toleration_of("gpu", "a b"),
     f"{T}.tolerations[0].value", "'a b' is not a valid label value"),
    ("spread max_skew zero", _spread_skew_zero, f"{T}.topology_spread_constraints[0].max_skew",
     "at least 1"),
    ("spread without topology key", _spread_no_key,
     f"{T}.topology_spread_constraints[0].topology_key", "is required"),
    ("host port too high", _host_port(70000), f"{T}.ports[0].host_port", "1..65535"),
    ("host port negative", _host_port(-1), f"{T}.ports[0].host_port", "1..65535"),
    ("host port twice", _dup_host_port, f"{T}.ports[1].host_port", "duplicate"),
    ("negative duration", _set("spec.template.duration_ms", -5), f"{T}.duration_ms",
     "must not be negative"),
    ("hollow usage percent above 1000", _set("spec.template.hollow_usage_percent", 1001),
     f"{T}.hollow_usage_percent", "must be within 0..1000 (got 1001)"),
    ("negative hollow usage percent", _set("spec.template.hollow_usage_percent", -1),
     f"{T}.hollow_usage_percent", "must be within 0..1000 (got -1)"),
    ("negative termination grace", _set("spec.template.termination_grace_seconds", -1),
     f"{T}.termination_grace_seconds", "must not be negative"),
    ("negative protection", _set("spec.protection_seconds", -1), "jobs[0].spec.protection_seconds",
     "must not be negative"),
    ("negative backoff limit", _set("spec.backoff_limit", -1), "jobs[0].spec.backoff_limit",
     "must not be negative"),
    ("negative ttl after finished", _set("spec.ttl_seconds_after_finished", -1),
     "jobs[0].spec.ttl_seconds_after_finished", "must not be negative"),
    ("job affinity with an empty key", _job_affinity(["rack", ""], []),
     "jobs[0].spec.job_affinity.required_topology_keys[1]", "is required"),
    ("job affinity key listed twice", _job_affinity(["rack"], ["rack"]),
     "jobs[0].spec.job_affinity.preferred_topology_keys[0]", "listed twice"),
    ("unknown preemption policy", _set("spec.preemption_policy", 9),
     "jobs[0].spec.preemption_policy", "unknown preemption policy"),
    ("gpu share with two cards", _gpus(2, milli=500), f"{T}.gpu_milli",
     "a share of one card needs requests.gpus: 1 (got 2)"),
    ("gpu share negative", _gpus(1, milli=-1), f"{T}.gpu_milli", "must be 1..999 milli-GPU"),
    ("gpu share of a whole card", _gpus(1, milli=1000), f"{T}.gpu_milli", "must be 1..999"),
    ("gpu model empty", _gpus(1, models=("V100M32", "")), f"{T}.gpu_models[1]",
     "must not be empty"),
    ("gpu model malformed", _gpus(1, models=("V100 M32",)), f"{T}.gpu_models[0]",
     "not a GPU model name"),
    ("larger than every node", _set("spec.template.requests.milli_cpu", 8000),
     f"{T}.requests.milli_cpu",
     "no node can ever hold this pod: largest node has 4000m cpu in the guaranteed pool"),
    ("best-effort larger than every reclaimable pool", _best_effort_too_big,
     f"{T}.requests.milli_cpu", "largest node has 2000m cpu in the best-effort pool"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "field", "description"),
    [c[1:] for c in BAD_JOBS],
    ids=[c[0] for c in BAD_JOBS],
)
async def test_submit_rejects_bad_jobs_and_writes_nothing(
    dispatcher: Running, store: Store, mutate: Mutate, field: str, description: str
) -> None:
    await seed(store)
    job = f.job("web", replicas=2, min_member=1)
    mutate(job)
    before = await store.revision()

    response = await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[job]))

    [result] = response.results
    assert not result.created
    assert [v.field for v in result.violations] == [field], result.violations
    assert description in result.violations[0].description
    assert await store.revision() == before


async def test_the_largest_node_follows_nodes_coming_and_going(
    dispatcher: Running, store: Store
) -> None:
    await store.create(f.node("small", cpu=4000))
    big_job = f.job("big", cpu=8000)

    async def refusal() -> str:
        request = api_pb2.SubmitRequest(jobs=[big_job], dry_run=True)
        [result] = (await dispatcher.api.Submit(request)).results
        return "; ".join(v.description for v in result.violations)

    async def says(text: str) -> bool:
        return text in await refusal()

    await eventually(lambda: says("largest node has 4000m cpu"))
    await store.create(f.node("large", cpu=16000))
    await eventually(lambda: _eq_async(refusal(), ""))  # a node that holds it: accepted
    await store.create(f.node("large-2", cpu=16000))  # a second node of the same shape
    await store.delete(pb.Node, "large")
    assert await refusal() == ""  # one of that shape is left
    await store.delete(pb.Node, "large-2")
    await eventually(lambda: says("largest node has 4000m cpu"))


async def _eq_async(value: Awaitable[str], expected: str) -> bool:
    return await value == expected


async def test_submit_writes_job_and_pods_per_contract(dispatcher: Running, store: Store) -> None:
    await seed(store)
    job = f.job("train", replicas=3, min_member=3, qos=pb.QOS_UNSPECIFIED)
    job.spec.template.labels["app"] = "train"
    job.spec.priority = 7
    job.spec.preemptible = True
    other = f.job("web", replicas=1)
    other.spec.queue = "team-a"

    response = await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[job, other]))

    assert [(r.job, r.created, list(r.violations)) for r in response.results] == [
        ("train", True, []),
        ("web", True, []),
    ]
    stored = await store.get(pb.Job, "train")
    assert stored.metadata.resource_version == response.results[0].resource_version
    assert stored.spec.queue == "default" and stored.spec.qos == pb.QOS_GUARANTEED
    pods = await store.get_many(pb.Pod, ["train-0", "train-1", "train-2"])
    for i, pod in enumerate(pods):
        assert pod is not None
        assert (pod.spec.job, pod.spec.index, pod.spec.priority) == ("train", i, 7)
        assert pod.spec.qos == pb.QOS_GUARANTEED and pod.spec.preemptible
        assert pod.spec.queue == "default" and pod.status.phase == pb.POD_PENDING
        assert pod.spec.template == job.spec.template and pod.metadata.labels["app"] == "train"
        assert not pod.spec.node_name
    assert (await store.get(pb.Pod, "web-0")).spec.queue == "team-a"


PREEMPTIBLE = [
    # id, the queue's preemptible_default (None: the queue is not stored), the job's preemptible
    # (None: unset), the pods' preemptible
    ("job says true", False, True, True),
    ("job says false over a true queue default", True, False, False),
    ("unset takes the queue default true", True, None, True),
    ("unset takes the queue default false", False, None, False),
    ("unset in a queue that is not stored is false", None, None, False),
]


@pytest.mark.parametrize(
    ("queue_default", "job_says", "expected"),
    [c[1:] for c in PREEMPTIBLE],
    ids=[c[0] for c in PREEMPTIBLE],
)
async def test_submit_resolves_preemptible_and_copies_preemption_fields(
    dispatcher: Running,
    store: Store,
    queue_default: bool | None,
    job_says: bool | None,
    expected: bool,
) -> None:
    await seed(store)
    if queue_default is not None:
        queue = pb.Queue(metadata=pb.ObjectMeta(name="default"))
        queue.spec.preemptible_default = queue_default
        await store.create(queue)
    job = f.job("batch", replicas=2, min_member=1)
    if job_says is not None:
        job.spec.preemptible = job_says
    job.spec.preemption_policy = pb.NEVER
    job.spec.protection_seconds = 30

    response = await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[job]))

    assert response.results[0].created, response.results[0].violations
    stored = await store.get(pb.Job, "batch")
    assert stored.spec.HasField("preemptible") == (job_says is not None)
    for pod in await store.get_many(pb.Pod, ["batch-0", "batch-1"]):
        assert pod is not None
        assert pod.spec.preemptible == expected
        assert pod.spec.preemption_policy == pb.NEVER and pod.spec.protection_seconds == 30


async def test_submit_duplicates_in_one_request_and_mixed_results(
    dispatcher: Running, store: Store
) -> None:
    await seed(store)
    jobs = [f.job("a"), f.job("a"), f.job("b", replicas=0), f.job("c")]
    response = await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=jobs))
    got = [(r.job, r.created, [v.field for v in r.violations]) for r in response.results]
    assert got == [
        ("a", True, []),
        ("a", False, ["jobs[1].metadata.name"]),
        ("b", False, ["jobs[2].spec.replicas"]),
        ("c", True, []),
    ]
    assert "duplicate of jobs[0]" in response.results[1].violations[0].description
    assert (await store.get_many(pb.Job, ["b"])) == [None]


async def test_jobs_of_one_spec_are_each_judged_in_one_request(
    dispatcher: Running, store: Store
) -> None:
    """A spec is checked once per request when valid (one-pod jobs of one template), but a bad
    name is still each job's, and a bad spec is reported on every job that has it."""
    await seed(store)
    jobs = [f.job("ok-1"), f.job("Bad_Name"), f.job("ok-2"), f.job("neg-1"), f.job("neg-2")]
    for job in jobs[3:]:
        job.spec.priority = 2_000_000_000
    response = await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=jobs))
    got = [(r.job, r.created, [v.field for v in r.violations]) for r in response.results]
    assert got == [
        ("ok-1", True, []),
        ("Bad_Name", False, ["jobs[1].metadata.name"]),
        ("ok-2", True, []),
        ("neg-1", False, ["jobs[3].spec.priority"]),
        ("neg-2", False, ["jobs[4].spec.priority"]),
    ]


async def test_submit_dry_run_and_edge_cases(dispatcher: Running, store: Store) -> None:
    # No nodes at all: a big job is accepted and pends (the cluster is still being built).
    big = f.job("big", cpu=64_000)
    big.spec.template.ClearField("command")
    dry = await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[big], dry_run=True))
    assert not dry.results[0].created and not dry.results[0].violations
    assert await store.revision() == 0
    real = await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[big]))
    assert real.results[0].created
    again = await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[big]))
    assert "AlreadyExists" in again.results[0].violations[0].description
    assert (await dispatcher.api.Submit(api_pb2.SubmitRequest())).results == []


async def test_submit_reports_a_pod_name_collision_without_writing(
    dispatcher: Running, store: Store
) -> None:
    orphan = f.pods_of(f.job("x"))[0]  # a pod "x-0" with no job
    await store.create(orphan)
    before = await store.revision()
    response = await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[f.job("x")]))
    assert not response.results[0].created
    assert "pod 'x-0' already exists" in response.results[0].violations[0].description
    assert await store.revision() == before


# ---------------------------------------------------------------------------------------------
# Apply
# ---------------------------------------------------------------------------------------------


def _queue(name: str, **spec: object) -> api_pb2.Object:
    return wrap("Queue", pb.Queue(metadata=pb.ObjectMeta(name=name), spec=pb.QueueSpec(**spec)))  # type: ignore[arg-type]


async def test_apply_create_configure_unchanged_invalid(dispatcher: Running, store: Store) -> None:
    quota = pb.Resources(milli_cpu=1000)
    req = api_pb2.ApplyRequest(
        objects=[_queue("q1", quota=quota), wrap("Node", f.node("n1")), _queue("Bad")]
    )
    first = await dispatcher.api.Apply(req)
    assert [(r.kind, r.name, r.action) for r in first.results] == [
        ("Queue", "q1", "created"),
        ("Node", "n1", "created"),
        ("Queue", "Bad", "invalid"),
    ]
    assert first.results[2].violations[0].field == "objects[2].queue.metadata.name"
    again = await dispatcher.api.Apply(req)
    assert [r.action for r in again.results] == ["unchanged", "unchanged", "invalid"]

    changed = await dispatcher.api.Apply(
        api_pb2.ApplyRequest(objects=[_queue("q1", sort_policy=pb.SORT_PRIORITY)])
    )
    assert changed.results[0].action == "configured"
    stored = await store.get(pb.Queue, "q1")
    assert stored.spec.sort_policy == pb.SORT_PRIORITY
    assert stored.metadata.resource_version == changed.results[0].resource_version

    # A node's heartbeat and readiness stay the agent's; capacity is the user's.
    node = await store.get(pb.Node, "n1")
    node.status.heartbeat_ms = 12345
    await store.update(node)
    bigger = f.node("n1", cpu=8000)
    bigger.status.ready = False
    assert (
        await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[wrap("Node", bigger)]))
    ).results[0].action == "configured"
    node = await store.get(pb.Node, "n1")
    assert node.status.allocatable.milli_cpu == 8000
    assert node.status.heartbeat_ms == 12345 and node.status.ready


BAD_APPLIED: list[tuple[str, api_pb2.Object, str]] = [
    ("queue sort policy", _queue("q", sort_policy=9), "objects[0].queue.spec.sort_policy"),  # type: ignore[arg-type]
    ("queue negative quota", _queue("q", quota=pb.Resources(gpus=-1)), "objects[0].queue.spec.quota.gpus"),
    ("queue negative weight", _queue("q", weight=-1), "objects[0].queue.spec.weight"),
    ("queue retired DRF sort policy", _queue("q", sort_policy=3), "objects[0].queue.spec.sort_policy"),  # type: ignore[arg-type]
    ("queue negative min", _queue("q", min=pb.Resources(milli_cpu=-1)),
     "objects[0].queue.spec.min.milli_cpu"),
    ("queue min above max", _queue("q", min=pb.Resources(milli_cpu=2000),
     quota=pb.Resources(milli_cpu=1000)), "objects[0].queue.spec.min.milli_cpu"),
    ("queue negative max pods per job", _queue("q", max_pods_per_job=-1),
     "objects[0].queue.spec.max_pods_per_job"),
    ("queue negative max pending pods", _queue("q", max_pending_pods=-1),
     "objects[0].queue.spec.max_pending_pods"),
    ("queue its own parent", _queue("q", parent="q"), "objects[0].queue.spec.parent"),
    ("queue parent not a name", _queue("q", parent="Bad Name"), "objects[0].queue.spec.parent"),
    ("node negative capacity", wrap("Node", f.node("n", cpu=-1)),
     "objects[0].node.status.allocatable.milli_cpu"),
    ("node taint without effect", wrap("Node", pb.Node(metadata=pb.ObjectMeta(name="n"),
     spec=pb.NodeSpec(taints=[pb.Taint(key="k")]))), "objects[0].node.spec.taints[0].effect"),
    ("budget selects nothing", wrap("DisruptionBudget", pb.DisruptionBudget(
        metadata=pb.ObjectMeta(name="b"), spec=pb.DisruptionBudgetSpec(max_unavailable=0))),
     "objects[0].disruption_budget.spec"),
    ("budget without min or max", wrap("DisruptionBudget", pb.DisruptionBudget(
        metadata=pb.ObjectMeta(name="b"), spec=pb.DisruptionBudgetSpec(job="j"))),
     "objects[0].disruption_budget.spec.max_unavailable"),
    ("budget with min and max", wrap("DisruptionBudget", pb.DisruptionBudget(
        metadata=pb.ObjectMeta(name="b"),
        spec=pb.DisruptionBudgetSpec(job="j", min_available=0, max_unavailable=0))),
     "objects[0].disruption_budget.spec.min_available"),
    ("budget with negative min", wrap("DisruptionBudget", pb.DisruptionBudget(
        metadata=pb.ObjectMeta(name="b"), spec=pb.DisruptionBudgetSpec(job="j", min_available=-1))),
     "objects[0].disruption_budget.spec.min_available"),
    ("node label key with spaces", wrap("Node", pb.Node(metadata=pb.ObjectMeta(name="n", labels={"has spaces!": "x"}))),
     "objects[0].node.metadata.labels['has spaces!']"),
    ("node label value of 70 characters", wrap("Node", pb.Node(metadata=pb.ObjectMeta(name="n", labels={"zone": "v" * 70}))),
     "objects[0].node.metadata.labels['zone']"),
    ("node taint key", wrap("Node", pb.Node(metadata=pb.ObjectMeta(name="n"),
     spec=pb.NodeSpec(taints=[pb.Taint(key="a/b/c", effect=pb.NO_SCHEDULE)]))),
     "objects[0].node.spec.taints[0].key"),
    ("node taint value", wrap("Node", pb.Node(metadata=pb.ObjectMeta(name="n"),
     spec=pb.NodeSpec(taints=[pb.Taint(key="k", value="x y", effect=pb.NO_SCHEDULE)]))),
     "objects[0].node.spec.taints[0].value"),
    ("queue label", wrap("Queue", pb.Queue(metadata=pb.ObjectMeta(name="q", labels={"a/b/c": "x"}))),
     "objects[0].queue.metadata.labels['a/b/c']"),
    ("budget label", wrap("DisruptionBudget", pb.DisruptionBudget(
        metadata=pb.ObjectMeta(name="b", labels={"team": "has spaces!"}),
        spec=pb.DisruptionBudgetSpec(job="j", max_unavailable=1))),
     "objects[0].disruption_budget.metadata.labels['team']"),
    ("new job label", wrap("Job", pb.Job(metadata=pb.ObjectMeta(name="j", labels={"a b": "x"}))),
     "objects[0].job.metadata.labels['a b']"),
    ("pods are the system's", wrap("Pod", f.pods_of(f.job("j"))[0]), "objects[0].pod"),
    ("empty object", api_pb2.Object(), "objects[0]"),
]  # fmt: skip


async def test_apply_jobs_like_every_kind(dispatcher: Running, store: Store) -> None:
    """A Job applied: created (through Submit's validation), then unchanged when applied again,
    configured when only what may change changed, refused naming each immutable field."""
    await seed(store)
    web = f.job("web", replicas=2)
    first = await dispatcher.api.Apply(
        api_pb2.ApplyRequest(objects=[wrap("Job", web)], request_id="r1")
    )
    assert [(r.action, list(r.violations)) for r in first.results] == [("created", [])]
    assert len(await store.get_many(pb.Pod, ["web-0", "web-1"])) == 2

    again = await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[wrap("Job", web)]))
    assert again.results[0].action == "unchanged"
    stored = await store.get(pb.Job, "web")
    # What `get -o yaml` prints (status, uid, version, the request id annotation) is unchanged.
    assert (
        await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[wrap("Job", stored)]))
    ).results[0].action == "unchanged"

    relabelled = pb.Job()
    relabelled.CopyFrom(web)
    relabelled.metadata.labels["team"] = "ml"
    relabelled.spec.backoff_limit = 2
    changed = await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[wrap("Job", relabelled)]))
    assert changed.results[0].action == "configured"
    now = await store.get(pb.Job, "web")
    assert now.metadata.labels["team"] == "ml" and now.spec.backoff_limit == 2
    assert now.metadata.annotations["godel.io/request-id"] == "r1"  # the system's stays
    assert now.status == stored.status

    grown = pb.Job()
    grown.CopyFrom(relabelled)
    grown.spec.replicas = 3
    grown.spec.template.requests.milli_cpu = 200
    refused = await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[wrap("Job", grown)]))
    assert refused.results[0].action == "invalid"
    assert [v.field for v in refused.results[0].violations] == [
        "objects[0].job.spec.replicas",
        "objects[0].job.spec.template.requests.milli_cpu",
    ]
    assert "immutable" in refused.results[0].violations[0].description
    assert (await store.get(pb.Job, "web")).metadata.resource_version == (
        now.metadata.resource_version
    )
    # Labels are what may change of a stored job: held to the label syntax there too.
    mislabelled = pb.Job()
    mislabelled.CopyFrom(relabelled)
    mislabelled.metadata.labels["has spaces!"] = "x"
    refused = await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[wrap("Job", mislabelled)]))
    assert refused.results[0].action == "invalid"
    assert [v.field for v in refused.results[0].violations] == [
        "objects[0].job.metadata.labels['has spaces!']"
    ]
    assert (await store.get(pb.Job, "web")).metadata.resource_version == (
        now.metadata.resource_version
    )

    bad_new = f.job("huge", replicas=1, cpu=64000)
    bad = await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[wrap("Job", bad_new)]))
    assert bad.results[0].action == "invalid"
    assert bad.results[0].violations[0].field.startswith("objects[0].job.spec")
    assert (await store.get_many(pb.Job, ["huge"])) == [None]


@pytest.mark.parametrize(
    ("obj", "field"), [c[1:] for c in BAD_APPLIED], ids=[c[0] for c in BAD_APPLIED]
)
async def test_apply_rejects_bad_objects(
    dispatcher: Running, store: Store, obj: api_pb2.Object, field: str
) -> None:
    response = await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[obj]))
    assert response.results[0].action == "invalid"
    assert [v.field for v in response.results[0].violations] == [field]
    assert await store.revision() == 0


async def test_apply_budget_with_zero_keeps_the_zero(dispatcher: Running, store: Store) -> None:
    never = pb.DisruptionBudget(
        metadata=pb.ObjectMeta(name="web"), spec=pb.DisruptionBudgetSpec(job="web")
    )
    never.spec.max_unavailable = 0  # "never disrupt": a value, not unset
    response = await dispatcher.api.Apply(
        api_pb2.ApplyRequest(objects=[wrap("DisruptionBudget", never)])
    )
    assert [r.action for r in response.results] == ["created"]
    stored = await store.get(pb.DisruptionBudget, "web")
    assert stored.spec.HasField("max_unavailable") and stored.spec.max_unavailable == 0
    assert not stored.spec.HasField("min_available")


async def test_apply_cas_conflict_is_aborted_and_dry_run_writes_nothing(
    dispatcher: Running, store: Store
) -> None:
    created = await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[_queue("q")]))
    rv = created.results[0].resource_version
    stale = _queue("q", weight=3)
    stale.queue.metadata.resource_version = rv - 1 if rv > 1 else rv + 10
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[stale, _queue("other")]))
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert (await store.get_many(pb.Queue, ["other"])) == [None]
    fresh = _queue("q", weight=3)
    fresh.queue.metadata.resource_version = rv
    ok = await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[fresh]))
    assert ok.results[0].action == "configured"
    before = await store.revision()
    dry = await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[_queue("z")], dry_run=True))
    assert dry.results[0].action == "created" and await store.revision() == before


# ---------------------------------------------------------------------------------------------
# Get, List, Delete
# ---------------------------------------------------------------------------------------------


async def _code(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    raise AssertionError("the call succeeded")


async def test_get_and_errors(dispatcher: Running, store: Store) -> None:
    await store.create(f.node("n1"))
    got = await dispatcher.api.Get(api_pb2.GetRequest(kind="Node", name="n1"))
    assert got.node.metadata.name == "n1" and got.node.status.heartbeat_ms == 0
    # A node's last heartbeat is served from the heartbeat hash (the stored object keeps its
    # registration time), by Get and by List.
    await store.record_heartbeats(["n1"])
    beat = (await store.heartbeats()).last_ms["n1"]
    got = await dispatcher.api.Get(api_pb2.GetRequest(kind="Node", name="n1"))
    assert got.node.status.heartbeat_ms == beat
    listed = await dispatcher.api.List(api_pb2.ListRequest(kind="Node"))
    assert [o.node.status.heartbeat_ms for o in listed.items] == [beat]
    assert (await store.get(pb.Node, "n1")).status.heartbeat_ms == 0
    assert await _code(dispatcher.api.Get(api_pb2.GetRequest(kind="Node", name="nope"))) == (
        grpc.StatusCode.NOT_FOUND
    )
    assert await _code(dispatcher.api.Get(api_pb2.GetRequest(kind="Nodes", name="n1"))) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )


async def test_a_shards_last_beat_is_served_from_its_liveness_stamps(
    dispatcher: Running, store: Store
) -> None:
    """`godel get schedulers` shows when each shard last stamped its liveness (the shard
    heartbeat hash, outside the change feed): Get and List serve it as ``status.heartbeat_ms``;
    the stored record keeps its registration time."""
    shard = pb.SchedulerInstance(metadata=pb.ObjectMeta(name="shard-a"))
    shard.spec.address = "127.0.0.1:1"
    shard.status.heartbeat_ms = 1_000  # registered long ago
    await store.create(shard)
    assert await store.record_shard_heartbeat("shard-a")
    beat = (await store.shard_heartbeats()).last_ms["shard-a"]
    got = await dispatcher.api.Get(api_pb2.GetRequest(kind="SchedulerInstance", name="shard-a"))
    assert got.scheduler_instance.status.heartbeat_ms == beat
    listed = await dispatcher.api.List(api_pb2.ListRequest(kind="SchedulerInstance"))
    assert [o.scheduler_instance.status.heartbeat_ms for o in listed.items] == [beat]
    assert (await store.get(pb.SchedulerInstance, "shard-a")).status.heartbeat_ms == 1_000


async def test_list_selectors_jobs_and_pages(dispatcher: Running, store: Store) -> None:
    for i in range(5):
        n = f.node(f"n{i}")
        n.metadata.labels["zone"] = "a" if i % 2 else "b"
        await store.create(n)
    await store.create_unit(f.job("j", replicas=3), f.pods_of(f.job("j", replicas=3)))
    await store.create_unit(f.job("k"), f.pods_of(f.job("k")))

    zone_a = await dispatcher.api.List(
        api_pb2.ListRequest(kind="Node", label_selector={"zone": "a"})
    )
    assert [o.node.metadata.name for o in zone_a.items] == ["n1", "n3"]
    not_a = await dispatcher.api.List(api_pb2.ListRequest(kind="Node", selector="zone notin (a)"))
    assert [o.node.metadata.name for o in not_a.items] == ["n0", "n2", "n4"]
    pods = await dispatcher.api.List(api_pb2.ListRequest(kind="Pod", job="j"))
    assert [o.pod.metadata.name for o in pods.items] == ["j-0", "j-1", "j-2"]

    names, token, pages = [], "", 0
    while True:
        page = await dispatcher.api.List(
            api_pb2.ListRequest(kind="Node", limit=2, continue_token=token)
        )
        names += [o.node.metadata.name for o in page.items]
        pages += 1
        token = page.continue_token
        if not token:
            break
    assert names == [f"n{i}" for i in range(5)] and pages == 3

    bad = [
        api_pb2.ListRequest(kind="Nope"),
        api_pb2.ListRequest(kind="Node", job="j"),
        api_pb2.ListRequest(kind="Node", continue_token="%%%"),
        api_pb2.ListRequest(kind="Node", limit=-1),
        api_pb2.ListRequest(kind="Node", selector="zone in a"),
    ]
    for request in bad:
        assert await _code(dispatcher.api.List(request)) == grpc.StatusCode.INVALID_ARGUMENT


async def test_delete_job_removes_pods_in_one_commit(dispatcher: Running, store: Store) -> None:
    await store.create(f.node("n1"))
    await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[f.job("j", replicas=3)]))
    # One pod bound: deleting returns its claim on the node.
    pod = await store.get(pb.Pod, "j-1")
    pod.spec.node_name = "n1"
    pod.status.phase = pb.POD_BOUND
    await store.commit([Bind(pod)])
    job = await store.get(pb.Job, "j")

    stale = api_pb2.DeleteRequest(
        kind="Job", name="j", resource_version=job.metadata.resource_version + 100
    )
    assert await _code(dispatcher.api.Delete(stale)) == grpc.StatusCode.ABORTED
    before = await store.revision()
    response = await dispatcher.api.Delete(api_pb2.DeleteRequest(kind="Job", name="j"))
    assert response.deleted == 4
    assert await store.revision() == before + 4
    assert await store.get_many(pb.Pod, ["j-0", "j-1", "j-2"]) == [None, None, None]
    usage = await store.node_usage("n1")
    assert usage is not None and usage.used["g.cpu"] == 0
    assert await _code(dispatcher.api.Delete(api_pb2.DeleteRequest(kind="Job", name="j"))) == (
        grpc.StatusCode.NOT_FOUND
    )
    assert await _code(dispatcher.api.Delete(api_pb2.DeleteRequest(kind="Bogus", name="j"))) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    await store.create(f.node("n2"))
    assert (await dispatcher.api.Delete(api_pb2.DeleteRequest(kind="Node", name="n2"))).deleted == 1


# ---------------------------------------------------------------------------------------------
# Explain
# ---------------------------------------------------------------------------------------------


async def test_explain(dispatcher: Running, store: Store) -> None:
    await store.create(f.node("n1"))
    await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[f.job("a"), f.job("b"), f.job("c")]))
    await eventually(lambda: len(dispatcher.service.core.units) == 3, what="units queued")

    waiting = await dispatcher.api.Explain(api_pb2.ExplainRequest(pod="b-0"))
    assert waiting.phase == pb.POD_PENDING
    assert waiting.summary == "waiting in queue default (position 2): no live scheduler shard"

    pod = await store.get(pb.Pod, "c-0")
    pod.status.scheduler = "shard-1"
    pod.status.conditions.add(
        type="PodScheduled", status="False", reason="Unschedulable",
        message="0/5 nodes fit: 4 insufficient cpu, 1 untolerated taint", last_transition_ms=99,
    )  # fmt: skip
    await store.update(pod)
    # A message alone (e.g. written by an older shard) is shown, never parsed into counts.
    said = await dispatcher.api.Explain(api_pb2.ExplainRequest(pod="c-0"))
    assert said.summary == "0/5 nodes fit: 4 insufficient cpu, 1 untolerated taint"
    assert not said.reasons and not said.HasField("diagnosis")
    pod = await store.get(pb.Pod, "c-0")
    pod.status.unschedulable.total_nodes = 5
    pod.status.unschedulable.reasons.add(reason="insufficient cpu", nodes=4)
    pod.status.unschedulable.reasons.add(reason="untolerated taint", nodes=1)
    await store.update(pod)
    why = await dispatcher.api.Explain(api_pb2.ExplainRequest(pod="c-0"))
    assert why.total_nodes == 5 and why.last_attempt_ms == 99 and why.scheduler == "shard-1"
    assert [(r.reason, r.nodes) for r in why.reasons] == [
        ("insufficient cpu", 4),
        ("untolerated taint", 1),
    ]
    assert why.diagnosis == pod.status.unschedulable

    pod = await store.get(pb.Pod, "a-0")
    pod.spec.node_name = "n1"
    pod.status.phase = pb.POD_BOUND
    await store.commit([Bind(pod)])
    bound = await dispatcher.api.Explain(api_pb2.ExplainRequest(pod="a-0"))
    assert (bound.summary, bound.node) == ("bound to n1", "n1")

    # An evicted pod keeps its node: explain says why it ended and who preempted it.
    victim = evicted(
        await store.get(pb.Pod, "a-0"), "Preempted", "preempted by pod 'x-0' on node 'n1'", 1, "x-0"
    )
    await store.commit([Release(victim)])
    gone = await dispatcher.api.Explain(api_pb2.ExplainRequest(pod="a-0"))
    assert gone.summary == "POD_FAILED: Preempted: preempted by pod 'x-0' on node 'n1'"
    assert await _code(dispatcher.api.Explain(api_pb2.ExplainRequest(pod="zz"))) == (
        grpc.StatusCode.NOT_FOUND
    )


# ---------------------------------------------------------------------------------------------
# Watch
# ---------------------------------------------------------------------------------------------


async def test_watch_lists_then_streams(dispatcher: Running, store: Store) -> None:
    await store.create(f.node("n1"))
    await store.create(pb.Queue(metadata=pb.ObjectMeta(name="q")))
    stream = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Node"]))
    first = await stream.read()
    assert (first.type, first.object.node.metadata.name) == (api_pb2.WatchEvent.ADDED, "n1")
    bookmark = await stream.read()
    assert bookmark.type == api_pb2.WatchEvent.BOOKMARK
    assert bookmark.revision == await store.revision()
    await store.create(pb.Queue(metadata=pb.ObjectMeta(name="q2")))  # not watched
    await store.create(f.node("n2"))
    await store.delete(pb.Node, "n1")
    seen = []
    while len(seen) < 2:
        event = await asyncio.wait_for(stream.read(), 5)
        if event.type != api_pb2.WatchEvent.BOOKMARK:
            seen.append((event.type, event.object.node.metadata.name))
    assert seen == [(api_pb2.WatchEvent.ADDED, "n2"), (api_pb2.WatchEvent.DELETED, "n1")]
    stream.cancel()

    # Resume from a revision: only what came after it.
    resumed = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Queue"], from_revision=2))
    event = await asyncio.wait_for(resumed.read(), 5)
    assert (event.type, event.object.queue.metadata.name) == (api_pb2.WatchEvent.ADDED, "q2")
    resumed.cancel()

    bad = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Nope"]))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await bad.read()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_one_pod_jobs_status_is_its_pods_in_get_list_and_watch(
    dispatcher: Running, store: Store
) -> None:
    """A one-pod job stores no status: Get, List and Watch show the one its pod gives it, and a
    watcher of Jobs gets the job again, at the pod's revision, each time its pod changes."""
    await store.create(f.node("n1"))
    await store.create_unit(f.job("solo"), f.pods_of(f.job("solo")))
    start = await store.revision()
    jobs = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Job"], from_revision=start))
    both = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Job", "Pod"], from_revision=start))
    one = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Job"], job="solo", from_revision=start))
    await store.create_unit(f.job("other"), f.pods_of(f.job("other")))
    pod = await store.get(pb.Pod, "solo-0")
    pod.spec.node_name, pod.status.phase = "n1", pb.POD_BOUND
    await store.commit([Bind(pod)])
    bound_at = await store.revision()
    other = await store.get(pb.Pod, "other-0")
    other.spec.node_name, other.status.phase = "n1", pb.POD_BOUND
    await store.commit([Bind(other)])
    pod.status.phase = pb.POD_RUNNING
    await store.update(pod)
    running_at = await store.revision()

    async def phases_read() -> bool:
        got = await dispatcher.api.Get(api_pb2.GetRequest(kind="Job", name="solo"))
        listed = await dispatcher.api.List(api_pb2.ListRequest(kind="Job"))
        solo = next(o.job for o in listed.items if o.job.metadata.name == "solo")
        return got.job.status.phase == solo.status.phase == pb.JOB_RUNNING

    await eventually(phases_read, what="Get and List to show the job running")
    assert (await store.get(pb.Job, "solo")).status.phase == pb.JOB_PHASE_UNSPECIFIED  # stored

    async def changes(stream: object, last: str) -> list[tuple[str, str, int, int, int]]:
        """(kind, name, event type, revision, phase) of every change up to the pod's running
        (``last``: the kind whose event at that revision comes last)."""
        seen: list[tuple[str, str, int, int, int]] = []
        while True:
            event = await asyncio.wait_for(stream.read(), 5)  # type: ignore[attr-defined]
            if event.type == api_pb2.WatchEvent.BOOKMARK:
                continue
            kind = event.object.WhichOneof("kind")
            obj = getattr(event.object, kind)
            seen.append((kind, obj.metadata.name, event.type, event.revision, obj.status.phase))
            if event.revision >= running_at and kind == last:
                return seen

    modified = api_pb2.WatchEvent.MODIFIED
    solo_changes = [
        ("job", "solo", modified, bound_at, pb.JOB_SCHEDULED),
        ("job", "solo", modified, running_at, pb.JOB_RUNNING),
    ]
    seen = await changes(jobs, "job")
    # The other job as created (pending, though its pod is bound by now), then its pod's bind.
    assert [c for c in seen if c[1] == "other"] == [
        ("job", "other", api_pb2.WatchEvent.ADDED, start + 1, pb.JOB_PENDING),
        ("job", "other", modified, bound_at + 1, pb.JOB_SCHEDULED),
    ]
    assert [c for c in seen if c[1] == "solo"] == solo_changes
    assert await changes(one, "job") == solo_changes
    assert [c for c in await changes(both, "pod") if c[1].startswith("solo")] == [
        solo_changes[0],
        ("pod", "solo-0", modified, bound_at, pb.POD_BOUND),
        solo_changes[1],
        ("pod", "solo-0", modified, running_at, pb.POD_RUNNING),
    ]
    for stream in (jobs, both, one):
        stream.cancel()

    # From the start: the listing shows it as read too.
    listing = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Job"], job="solo"))
    first = await asyncio.wait_for(listing.read(), 5)
    assert (first.type, first.object.job.status.phase) == (
        api_pb2.WatchEvent.ADDED,
        pb.JOB_RUNNING,
    )
    listing.cancel()


@pytest.mark.parametrize(
    ("kind", "name", "kept"),
    [
        ("Job", b"j", True),
        ("Job", b"j2", False),
        ("Pod", b"j-0", True),
        ("Pod", b"j-0-r1", True),
        ("Pod", b"jj-0", False),
        ("Pod", b"j", False),
    ],
)
def test_a_watch_of_one_job_decodes_only_what_may_be_its(
    kind: str, name: bytes, kept: bool
) -> None:
    assert _of_job("j")(kind, name) is kept


async def test_watch_from_a_future_revision_says_so(dispatcher: Running, store: Store) -> None:
    await store.create(f.node("n1"))
    ahead = await store.revision() + 1000
    stream = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Node"], from_revision=ahead))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stream.read()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details() or ""
    assert "from_revision" in details and "ahead of the store" in details
    assert "no longer in the change feed" not in details


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xff\xff\xff", b"\x0a\xff\x01garbage", bytes(range(256))],
    ids=["invalid tag", "truncated field", "noise"],
)
async def test_garbage_bytes_are_an_invalid_argument_not_a_server_fault(
    dispatcher: Running, store: Store, garbage: bytes
) -> None:
    before = await store.revision()
    async with grpc.aio.insecure_channel(dispatcher.host.address) as channel:
        submit = channel.unary_unary(
            "/godel.v1.Dispatcher/Submit",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await submit(garbage, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid godel.v1.SubmitRequest" in (caught.value.details() or "")
    assert await store.revision() == before  # nothing stored


async def test_watch_filters_by_label_selector_and_job(dispatcher: Running, store: Store) -> None:
    labelled = f.job("a")
    labelled.metadata.labels["team"] = "ml"
    await store.create_unit(labelled, f.pods_of(labelled))
    await store.create_unit(f.job("b"), f.pods_of(f.job("b")))
    stream = dispatcher.api.Watch(
        api_pb2.WatchRequest(kinds=["Job", "Pod"], label_selector={"team": "ml"})
    )
    names = []
    while (event := await asyncio.wait_for(stream.read(), 5)).type != api_pb2.WatchEvent.BOOKMARK:
        names.append(event.object.job.metadata.name)
    assert names == ["a"]  # its pods do not carry the job's labels
    stream.cancel()

    by_job = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Job", "Pod"], job="b"))
    listed = []
    while (event := await asyncio.wait_for(by_job.read(), 5)).type != api_pb2.WatchEvent.BOOKMARK:
        kind = event.object.WhichOneof("kind")
        listed.append((kind, getattr(event.object, kind).metadata.name))
    assert sorted(listed) == [("job", "b")] + [
        ("pod", p.metadata.name) for p in f.pods_of(f.job("b"))
    ]
    # A change that does not match still moves the watcher on: a bookmark at its revision.
    await store.create(pb.Queue(metadata=pb.ObjectMeta(name="q")))
    await store.delete(pb.Job, "a")
    revision = await store.revision()
    while True:
        event = await asyncio.wait_for(by_job.read(), 5)
        assert event.type == api_pb2.WatchEvent.BOOKMARK
        if event.revision >= revision:
            break
    by_job.cancel()

    bad = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Node"], job="b"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await bad.read()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_submit_retried_with_its_request_id_reports_the_stored_job(
    dispatcher: Running, store: Store
) -> None:
    await seed(store)
    request = api_pb2.SubmitRequest(jobs=[f.job("r"), f.job("s")], request_id="req-1")
    first = await dispatcher.api.Submit(request)
    assert [(r.created, r.existing) for r in first.results] == [(True, False), (True, False)]
    revision = await store.revision()
    again = await dispatcher.api.Submit(request)
    assert [(r.created, r.existing, list(r.violations)) for r in again.results] == [
        (False, True, []),
        (False, True, []),
    ]
    assert [r.resource_version for r in again.results] == [
        r.resource_version for r in first.results
    ]
    assert await store.revision() == revision, "a retry writes nothing"
    stored = await store.get(pb.Job, "r")
    assert stored.metadata.annotations["godel.io/request-id"] == "req-1"
    # Another request of the same name, or the same id with another spec: AlreadyExists.
    other = await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[f.job("r")], request_id="x"))
    assert "AlreadyExists" in other.results[0].violations[0].description
    changed = await dispatcher.api.Submit(
        api_pb2.SubmitRequest(jobs=[f.job("r", replicas=3)], request_id="req-1")
    )
    assert "AlreadyExists" in changed.results[0].violations[0].description
    # Without a request id nothing changes: a second submission is a clash.
    plain = await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[f.job("taken")]))
    assert "AlreadyExists" in plain.results[0].violations[0].description


async def test_retired_sort_policy_is_refused_with_where_fairness_lives(
    dispatcher: Running, store: Store
) -> None:
    response = await dispatcher.api.Apply(
        api_pb2.ApplyRequest(objects=[_queue("q", sort_policy=4)])
    )  # type: ignore[arg-type]
    (why,) = response.results[0].violations
    assert "FairShare" in why.description and "queue_fairness" in why.description
    assert await store.revision() == 0


async def test_a_queue_stored_with_a_retired_sort_policy_still_reads(store: Store) -> None:
    """Queues written before DRF and FairShare moved to the dispatcher's config carry 3 or 4:
    they decode, keep the value, and order their units FIFO."""
    old = pb.Queue(metadata=pb.ObjectMeta(name="old"))
    old.spec.ParseFromString(bytes([0x10, 3]))  # sort_policy = 3, as the previous version wrote
    await store.create(old)
    stored = await store.get(pb.Queue, "old")
    assert stored.spec.sort_policy == 3
    assert policy_for(stored.spec.sort_policy).name == "FIFO"


# ---------------------------------------------------------------------------------------------
# Admission limits per queue
# ---------------------------------------------------------------------------------------------


@pytest.fixture
async def limited(store_url: str, cluster_name: str, tmp_path: Path) -> AsyncIterator[Running]:
    config = dispatcher_config(store_url, cluster_name, tmp_path, max_pending_pods=12)
    async with run_dispatcher(config) as running:
        yield running


def _in_queue(name: str, queue: str, replicas: int) -> pb.Job:
    job = f.job(name, replicas=replicas)
    job.spec.queue = queue
    return job


async def test_admission_limits_refuse_with_the_limit_named(limited: Running, store: Store) -> None:
    await store.create(f.node("n1"))
    capped = pb.Queue(metadata=pb.ObjectMeta(name="capped"))
    capped.spec.max_pods_per_job = 4
    capped.spec.max_pending_pods = 6
    await store.create(capped)

    # Per job: the queue's own limit.
    too_big = await limited.api.Submit(api_pb2.SubmitRequest(jobs=[_in_queue("big", "capped", 5)]))
    (why,) = too_big.results[0].violations
    assert why.field == "jobs[0].spec.replicas"
    assert "at most 4 pods per job (max_pods_per_job)" in why.description

    # Pending: counted across the request, then against what is already pending.
    first = await limited.api.Submit(
        api_pb2.SubmitRequest(jobs=[_in_queue("a", "capped", 4), _in_queue("b", "capped", 3)])
    )
    assert first.results[0].created and not first.results[1].created
    (why,) = first.results[1].violations
    assert why.field == "jobs[1].spec.replicas"
    assert why.description == (
        "queue 'capped' allows at most 6 pending pods (max_pending_pods): "
        "4 are pending and this job adds 3"
    )
    await eventually(lambda: limited.service.core.queue.pending_pods().get("capped") == 4)
    before = await store.revision()
    again = await limited.api.Submit(api_pb2.SubmitRequest(jobs=[_in_queue("c", "capped", 3)]))
    assert "4 are pending and this job adds 3" in again.results[0].violations[0].description
    assert await store.revision() == before  # nothing stored for a refused job
    fits = await limited.api.Submit(api_pb2.SubmitRequest(jobs=[_in_queue("d", "capped", 2)]))
    assert fits.results[0].created

    # The default queue has the dispatcher's default (max_pending_pods = 12 here).
    ok = await limited.api.Submit(api_pb2.SubmitRequest(jobs=[_in_queue("e", "", 12)]))
    assert ok.results[0].created
    await eventually(lambda: limited.service.core.queue.pending_pods().get("default") == 12)
    over = await limited.api.Submit(api_pb2.SubmitRequest(jobs=[_in_queue("f", "", 1)]))
    assert "at most 12 pending pods" in over.results[0].violations[0].description


async def test_apply_refuses_queue_parents_that_form_a_cycle(
    dispatcher: Running, store: Store
) -> None:
    first = await dispatcher.api.Apply(
        api_pb2.ApplyRequest(objects=[_queue("org"), _queue("team", parent="org")])
    )
    assert [r.action for r in first.results] == ["created", "created"]
    await eventually(lambda: len(dispatcher.service.core.informer.list("Queue")) == 2)
    before = await store.revision()
    looped = await dispatcher.api.Apply(
        api_pb2.ApplyRequest(objects=[_queue("org", parent="team")])
    )
    (why,) = looped.results[0].violations
    assert looped.results[0].action == "invalid"
    assert why.field == "objects[0].queue.spec.parent"
    assert "cycle: org -> team -> org" in why.description
    assert await store.revision() == before


async def test_a_job_too_big_for_one_store_script_is_stored_chunk_by_chunk(
    dispatcher: Running, store: Store
) -> None:
    """A job of more pods than one store script should carry (``CHUNK_OPS``) is stored in
    several commits — the job marked unfinished with its first chunk, then a chunk per commit
    advancing the mark, the last one clearing it — so no script holds the store for long. The
    reply comes once the first chunk is stored, the rest follow in the background; a retry of
    the request reports the job."""
    replicas = 2 * CHUNK_OPS + 500
    request = api_pb2.SubmitRequest(jobs=[f.job("big", replicas=replicas)], request_id="big-1")
    response = await dispatcher.api.Submit(request)
    assert response.results[0].created, response.results[0].violations

    async def complete() -> bool:
        stored = await store.get(pb.Job, "big")
        return PODS_CREATED_ANNOTATION not in stored.metadata.annotations

    await eventually(complete, timeout=60, what="every pod created")
    pods, _ = await store.list_all(pb.Pod)
    assert sorted(p.spec.index for p in pods) == list(range(replicas))
    # The job's history in the change feed: one write per commit, each with its chunk's mark.
    marks: list[str] = []
    async for batch in store.watch(0, ["Job"]):
        marks += [e.obj.metadata.annotations.get(PODS_CREATED_ANNOTATION, "") for e in batch.events]  # type: ignore[union-attr]
        if batch.caught_up:
            break
    assert marks == [str(CHUNK_OPS - 1), str(2 * CHUNK_OPS - 2), ""]
    again = await dispatcher.api.Submit(request)
    assert again.results[0].existing


async def test_a_job_too_big_for_one_store_script_is_deleted_in_the_background_chunk_by_chunk(
    dispatcher: Running, store: Store
) -> None:
    """Delete of a job whose pods do not fit one store script answers at once, in progress
    with the pods it has left: the job is marked first (nothing more is made for it), then its
    pods go a chunk per commit in the background, the job last with what remains."""
    replicas = 3 * CHUNK_OPS
    created = await dispatcher.api.Submit(
        api_pb2.SubmitRequest(jobs=[f.job("huge", replicas=replicas)])
    )
    assert created.results[0].created, created.results[0].violations
    pods = dispatcher.service.pods
    await eventually(lambda: pods.by_job.count("huge") == replicas, what="the view has its pods")
    start = await store.revision()
    response = await dispatcher.api.Delete(api_pb2.DeleteRequest(kind="Job", name="huge"))
    assert (response.deleted, response.in_progress, response.pods_remaining) == (0, True, replicas)

    async def gone() -> bool:
        return await store.get_many(pb.Job, ["huge"]) == [None]

    await eventually(gone, timeout=60, what="the job deleted")
    assert (await store.list_all(pb.Pod))[0] == []
    job_events: list[tuple[str, bool]] = []
    pods_before_job = 0
    async for batch in store.watch(start, ["Job", "Pod"]):
        for e in batch.events:
            if isinstance(e.obj, pb.Job):
                job_events.append((e.type, bool(e.obj.metadata.deletion_timestamp_ms)))
            elif e.type == "DELETED" and not any(t == "DELETED" for t, _ in job_events):
                pods_before_job += 1
        if batch.caught_up:
            break
    assert job_events == [("MODIFIED", True), ("DELETED", True)]
    assert pods_before_job >= CHUNK_OPS  # at least one whole chunk went before the job


async def test_health_checks_answer_while_a_big_job_is_created_and_deleted(
    dispatcher: Running, store: Store
) -> None:
    """A job of a tenant's largest size (10,000 pods, ten store commits) created and deleted:
    the dispatcher's health check, asked over and over from another thread meanwhile, answers
    SERVING every time (each creation and deletion chunk is an await; the job's status is
    counted a slice at a time)."""
    replicas = 10_000
    stop = threading.Event()
    answers: list[str] = []

    def probe_until_stopped() -> None:
        while not stop.is_set():
            answers.append(probe(dispatcher.host.address, timeout=HEALTH_DEADLINE_SECONDS))
            time.sleep(0.05)

    prober = asyncio.create_task(asyncio.to_thread(probe_until_stopped))
    try:
        created = await dispatcher.api.Submit(
            api_pb2.SubmitRequest(jobs=[f.job("huge", replicas=replicas)])
        )
        assert created.results[0].created, created.results[0].violations
        pods = dispatcher.service.pods
        await eventually(lambda: pods.by_job.count("huge") == replicas, timeout=60)
        response = await dispatcher.api.Delete(api_pb2.DeleteRequest(kind="Job", name="huge"))
        assert response.in_progress

        async def gone() -> bool:
            return await store.get_many(pb.Job, ["huge"]) == [None]

        await eventually(gone, timeout=120, what="the job deleted")
    finally:
        stop.set()
        await prober
    assert answers and set(answers) == {"SERVING"}, answers


async def test_a_job_being_deleted_reads_as_deleting_with_its_pods_left_and_delete_resumes_it(
    store_url: str, cluster_name: str, tmp_path: Path, store: Store
) -> None:
    """A job marked for deletion that no one is deleting (its dispatcher stopped midway; the
    reconciler, which would resume it, is slowed here): Get, List and Watch show it as phase
    Deleting with the pods it has left, never stored so; a Delete of it answers in progress and
    finishes it."""
    job = normalise_job(f.job("leaving", replicas=6))
    job.metadata.deletion_timestamp_ms = 1
    await store.create_unit(job, f.pods_of(job)[2:])  # two pods went before the stop
    config = dispatcher_config(store_url, cluster_name, tmp_path, reconcile_interval_seconds=3600)
    async with run_dispatcher(config) as dispatcher:
        got = (await dispatcher.api.Get(api_pb2.GetRequest(kind="Job", name="leaving"))).job
        listed = (await dispatcher.api.List(api_pb2.ListRequest(kind="Job"))).items[0].job
        watch = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Job"]))
        watched = (await anext(aiter(watch))).object.job
        watch.cancel()
        for seen in (got, listed, watched):
            assert (seen.status.phase, seen.status.pods_remaining) == (pb.JOB_DELETING, 4)
        assert (await store.get(pb.Job, "leaving")).status.phase != pb.JOB_DELETING

        response = await dispatcher.api.Delete(api_pb2.DeleteRequest(kind="Job", name="leaving"))
        assert (response.in_progress, response.pods_remaining) == (True, 4)

        async def gone() -> bool:
            return await store.get_many(pb.Job, ["leaving"]) == [None]

        await eventually(gone, timeout=30, what="the job deleted")
        assert (await store.list_all(pb.Pod))[0] == []


async def test_a_job_whose_pods_are_being_created_reads_with_how_many_are_stored(
    store_url: str, cluster_name: str, tmp_path: Path, store: Store
) -> None:
    """A big job whose creation stopped after its first commit (its dispatcher stopped; the
    reconciler, which would resume it, is slowed here): Get, List and Watch show it Pending with
    the pods stored so far, never stored so."""
    job = normalise_job(f.job("growing", replicas=CHUNK_OPS + 200))
    await store.commit(first_commit(job, False))
    config = dispatcher_config(store_url, cluster_name, tmp_path, reconcile_interval_seconds=3600)
    async with run_dispatcher(config) as dispatcher:
        got = (await dispatcher.api.Get(api_pb2.GetRequest(kind="Job", name="growing"))).job
        listed = (await dispatcher.api.List(api_pb2.ListRequest(kind="Job"))).items[0].job
        watch = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["Job"]))
        watched = (await anext(aiter(watch))).object.job
        watch.cancel()
        for seen in (got, listed, watched):
            assert (seen.status.phase, seen.status.pods_created) == (pb.JOB_PENDING, CHUNK_OPS - 1)
        assert not (await store.get(pb.Job, "growing")).status.pods_created


async def test_a_deletion_under_way_when_the_dispatcher_stops_is_finished_by_the_next(
    store_url: str, cluster_name: str, tmp_path: Path, store: Store
) -> None:
    """The store is the truth: a dispatcher stopped right after it answered a big job's Delete
    leaves the job marked with its pods; the next dispatcher's reconciler finishes it."""
    replicas = 2 * CHUNK_OPS
    config = dispatcher_config(store_url, cluster_name, tmp_path, reconcile_interval_seconds=0.2)
    async with run_dispatcher(config) as first:
        created = await first.api.Submit(
            api_pb2.SubmitRequest(jobs=[f.job("huge", replicas=replicas)])
        )
        assert created.results[0].created, created.results[0].violations
        view = first.service.pods.by_job
        await eventually(lambda: view.count("huge") == replicas, timeout=60, what="its pods")
        # The RPC's handler called in-process, then the deleter's stop (what the service's stop
        # does) before the loop runs anything else: no chunk of the deletion is done.
        deleting = first.service.api.deleting
        response = await deleting.Delete(api_pb2.DeleteRequest(kind="Job", name="huge"), None)
        await first.service.deleter.close()
    assert response.in_progress
    left = await store.get(pb.Job, "huge")
    assert left.metadata.deletion_timestamp_ms, "marked before the answer"
    assert len((await store.list_all(pb.Pod))[0]) == replicas

    async with run_dispatcher(config) as second:

        async def gone() -> bool:
            return await store.get_many(pb.Job, ["huge"]) == [None]

        await eventually(gone, timeout=60, what="the next dispatcher finished the deletion")
        assert (await store.list_all(pb.Pod))[0] == []
        assert second.service.reconciler.repairs["unfinished_deletion"] == 1


async def test_a_submitted_pods_created_mark_is_not_stored(
    dispatcher: Running, store: Store
) -> None:
    """The mark is the system's: a user's copy of it would hold the job back for good."""
    job = f.job("sly")
    job.metadata.annotations[PODS_CREATED_ANNOTATION] = "0"
    assert (await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[job]))).results[0].created
    stored = await store.get(pb.Job, "sly")
    assert PODS_CREATED_ANNOTATION not in stored.metadata.annotations
