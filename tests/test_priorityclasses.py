"""Priority classes: the precedence of a job's priority, preemption policy and preemptibility
(job, class, queue; the globalDefault) as table tests of the one home that resolves them
(``services/dispatcher/priorityclasses.py``), the validation of classes and of jobs naming them,
and the dispatcher's public API on a real store: Apply (one globalDefault, immutable fields),
Submit (resolution stored on the job and its pods, a missing class, a differing priority),
Delete (refused while jobs name the class), List and Get."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from godel import client as sdk
from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher import priorityclasses as pc
from services.dispatcher.api import validation as v
from services.dispatcher.priorityclasses import PriorityClasses
from store import Store
from store.kinds import wrap
from tests import factories as f
from tests.dispatcher_harness import Running, dispatcher_config, run_dispatcher

LOWER, NEVER, UNSET = pb.PREEMPT_LOWER_PRIORITY, pb.NEVER, pb.PREEMPTION_POLICY_UNSPECIFIED


def klass(
    name: str,
    value: int,
    *,
    default: bool = False,
    policy: int = UNSET,
    preemptible: bool | None = None,
) -> pb.PriorityClass:
    c = pb.PriorityClass(metadata=pb.ObjectMeta(name=name), value=value, global_default=default)
    c.preemption_policy = policy  # type: ignore[assignment]
    if preemptible is not None:
        c.preemptible = preemptible
    return c


def job_spec(
    *,
    class_name: str = "",
    priority: int = 0,
    policy: int = UNSET,
    preemptible: bool | None = None,
) -> pb.JobSpec:
    spec = pb.JobSpec(priority_class_name=class_name, priority=priority)
    spec.preemption_policy = policy  # type: ignore[assignment]
    if preemptible is not None:
        spec.preemptible = preemptible
    return spec


def queue(preemptible_default: bool) -> pb.Queue:
    q = pb.Queue(metadata=pb.ObjectMeta(name="q"))
    q.spec.preemptible_default = preemptible_default
    return q


HIGH = klass("high", 1000, policy=NEVER, preemptible=False)
LOW = klass("low", 10, preemptible=True)
PLAIN = klass("plain", 50)  # says nothing of policy or preemptibility
DEFAULT = klass("fallback", 5, default=True, preemptible=True)
CLASSES = PriorityClasses.of([HIGH, LOW, PLAIN, DEFAULT])
NO_DEFAULT = PriorityClasses.of([HIGH, LOW, PLAIN])

# (case, classes, job's spec, queue) -> (class taken, priority, policy, pods' preemptible)
PRECEDENCE = [
    ("no class, no default: the job's own", NO_DEFAULT, job_spec(priority=7), None,
     "", 7, UNSET, False),
    ("the named class gives priority, policy and preemptible", CLASSES,
     job_spec(class_name="high"), queue(True), "high", 1000, NEVER, False),
    ("the job's policy wins over its class's", CLASSES,
     job_spec(class_name="high", policy=LOWER), None, "high", 1000, LOWER, False),
    ("the job's preemptible wins over its class's", CLASSES,
     job_spec(class_name="high", preemptible=True), None, "high", 1000, NEVER, True),
    ("the class's preemptible wins over the queue's", CLASSES,
     job_spec(class_name="low"), queue(False), "low", 10, UNSET, True),
    ("a class silent on preemptible leaves it to the queue", CLASSES,
     job_spec(class_name="plain"), queue(True), "plain", 50, UNSET, True),
    ("a class silent on preemptible, no queue stored: false", CLASSES,
     job_spec(class_name="plain"), None, "plain", 50, UNSET, False),
    ("a raw priority equal to the class's value", CLASSES,
     job_spec(class_name="low", priority=10), None, "low", 10, UNSET, True),
    ("no class, no priority: the globalDefault", CLASSES, job_spec(), queue(False),
     "fallback", 5, UNSET, True),
    ("a raw priority and no class: no default", CLASSES, job_spec(priority=3), queue(False),
     "", 3, UNSET, False),
    ("the job's preemptible over the globalDefault's", CLASSES, job_spec(preemptible=False),
     None, "fallback", 5, UNSET, False),
    ("the job's own preemptible, no class", NO_DEFAULT, job_spec(preemptible=True),
     queue(False), "", 0, UNSET, True),
    ("no class, the queue's default", NO_DEFAULT, job_spec(), queue(True), "", 0, UNSET, True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("classes", "spec", "queue_", "taken", "priority", "policy", "preemptible"),
    [c[1:] for c in PRECEDENCE],
    ids=[c[0] for c in PRECEDENCE],
)
def test_precedence_of_job_class_and_queue(
    classes: PriorityClasses,
    spec: pb.JobSpec,
    queue_: pb.Queue | None,
    taken: str,
    priority: int,
    policy: int,
    preemptible: bool,
) -> None:
    job = pb.Job(metadata=pb.ObjectMeta(name="j"), spec=spec)
    chosen = classes.class_for(job.spec)
    assert (chosen.metadata.name if chosen else "") == taken
    pc.resolve(job, chosen)
    assert job.spec.priority_class_name == taken
    assert job.spec.priority == priority
    assert job.spec.preemption_policy == policy
    assert pc.pod_preemptible(job.spec, chosen, queue_) is preemptible


def test_a_named_class_that_does_not_exist_is_taken_as_none_and_refused() -> None:
    spec = job_spec(class_name="nope")
    assert CLASSES.class_for(spec) is None  # not the globalDefault instead
    ctx = v.SubmitContext(priority_classes=CLASSES)
    job = f.job("j")
    job.spec.priority_class_name = "nope"
    (found,) = v.validate_submission([job], ctx)
    assert [(x.field, x.description) for x in found] == [
        ("jobs[0].spec.priority_class_name", "priority class 'nope' does not exist")
    ]


# (case, job's priority_class_name, job's priority) -> violation (field, words in it) or None
JOB_VALIDATION = [
    ("an existing class", "low", 0, None),
    ("the class's own value beside it", "low", 10, None),
    ("a differing raw priority names both fields", "low", 11,
     ("jobs[0].spec.priority", "jobs[0].spec.priority_class_name")),
    ("a missing class", "gone", 0, ("jobs[0].spec.priority_class_name", "'gone' does not exist")),
    ("a name that is no name", "Not A Name", 0,
     ("jobs[0].spec.priority_class_name", "DNS-1123")),
    ("no class, a raw priority", "", 5, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "priority", "expected"),
    [c[1:] for c in JOB_VALIDATION],
    ids=[c[0] for c in JOB_VALIDATION],
)
def test_jobs_naming_classes_are_validated(
    name: str, priority: int, expected: tuple[str, str] | None
) -> None:
    job = f.job("j")
    job.spec.priority_class_name = name
    job.spec.priority = priority
    (found,) = v.validate_submission([job], v.SubmitContext(priority_classes=CLASSES))
    if expected is None:
        assert found == []
        return
    assert len(found) == 1, found
    assert found[0].field == expected[0]
    assert expected[1] in found[0].description


# (case, class) -> the field of its one violation, or None
CLASS_VALIDATION = [
    ("valid", klass("ok", 100), None),
    ("the lowest value", klass("ok", -1_000_000_000), None),
    ("the highest value", klass("ok", 1_000_000_000), None),
    ("a value in the system's range", klass("ok", 2_000_000_000), "x.value"),
    ("a value below the range", klass("ok", -1_000_000_001), "x.value"),
    ("a name with capitals", klass("High", 1), "x.metadata.name"),
    ("no name", klass("", 1), "x.metadata.name"),
    ("an unknown preemption policy", klass("ok", 1, policy=9), "x.preemption_policy"),
    ("a description of a novel", pb.PriorityClass(
        metadata=pb.ObjectMeta(name="ok"), description="x" * 1025), "x.description"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "field"), [c[1:] for c in CLASS_VALIDATION], ids=[c[0] for c in CLASS_VALIDATION]
)
def test_classes_are_validated(obj: pb.PriorityClass, field: str | None) -> None:
    found = v.validate_priority_class(obj, "x")
    assert [x.field for x in found] == ([field] if field else [])


def test_what_admission_resolved_is_the_job_as_applied_again() -> None:
    stored = job_spec(class_name="fallback", priority=5, policy=NEVER)
    again = job_spec()  # the manifest as first applied: no class, no priority, no policy
    pc.as_admitted(again, stored)
    assert again == stored
    other = job_spec(class_name="low")  # naming another class: a change, not filled
    pc.as_admitted(other, stored)
    assert (other.priority_class_name, other.priority) == ("low", 0)
    classless = job_spec(priority=3)  # a job stored without a class keeps its own fields
    pc.as_admitted(classless, job_spec(priority=4))
    assert classless.priority == 3


def test_immutable_fields_of_a_class() -> None:
    assert pc.immutable_changes(LOW, klass("low", 10, preemptible=True, default=True)) == []
    assert pc.immutable_changes(LOW, klass("low", 11, preemptible=True)) == ["value"]
    assert pc.immutable_changes(LOW, klass("low", 10)) == ["preemptible"]
    assert pc.immutable_changes(PLAIN, klass("plain", 50, policy=NEVER)) == ["preemption_policy"]


# ---------------------------------------------------------------------------------------------
# Through the dispatcher's API, on a real store
# ---------------------------------------------------------------------------------------------


@pytest.fixture
async def dispatcher(
    store_url: str, cluster_name: str, tmp_path: Path, store: Store
) -> AsyncIterator[Running]:
    await store.create(f.node("n1", cpu=4000))
    async with run_dispatcher(dispatcher_config(store_url, cluster_name, tmp_path)) as running:
        yield running


async def apply(dispatcher: Running, *objs: pb.PriorityClass) -> api_pb2.ApplyResponse:
    request = api_pb2.ApplyRequest(objects=[wrap("PriorityClass", o) for o in objs])
    return await dispatcher.api.Apply(request)


async def test_a_job_naming_a_class_is_stored_with_what_the_class_gives(
    dispatcher: Running, store: Store
) -> None:
    applied = await apply(dispatcher, HIGH, LOW)
    assert [r.action for r in applied.results] == ["created", "created"]
    job = f.job("urgent", replicas=2)
    job.spec.priority_class_name = "high"
    result = (await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[job]))).results[0]
    assert result.created, result.violations
    stored = await store.get(pb.Job, "urgent")
    assert (stored.spec.priority, stored.spec.preemption_policy) == (1000, NEVER)
    for pod in await store.get_many(pb.Pod, ["urgent-0", "urgent-1"]):
        assert pod is not None
        assert (pod.spec.priority, pod.spec.preemption_policy) == (1000, NEVER)
        assert pod.spec.preemptible is False

    # The same manifest applied again is the stored job, not a change of its priority; a retry
    # of a Submit naming a class finds the job its first attempt stored.
    again = await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[wrap("Job", job)]))
    assert again.results[0].action == "unchanged", again.results[0].violations
    retried = f.job("retried")
    retried.spec.priority_class_name = "low"
    for attempt in ("created", "existing"):
        request = api_pb2.SubmitRequest(jobs=[retried], request_id="r-1")
        (outcome,) = (await dispatcher.api.Submit(request)).results
        assert getattr(outcome, attempt), (attempt, outcome)
    # Another class is another priority: the job's class is immutable, as its priority is.
    job.spec.priority_class_name = "low"
    moved = await dispatcher.api.Apply(api_pb2.ApplyRequest(objects=[wrap("Job", job)]))
    assert moved.results[0].action == "invalid"
    assert "objects[0].job.spec.priority_class_name" in {
        x.field for x in moved.results[0].violations
    }


async def test_a_missing_class_or_a_differing_priority_is_refused_and_nothing_stored(
    dispatcher: Running, store: Store
) -> None:
    await apply(dispatcher, LOW)
    missing, differing = f.job("a"), f.job("b")
    missing.spec.priority_class_name = "gone"
    differing.spec.priority_class_name = "low"
    differing.spec.priority = 99
    results = (
        await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[missing, differing]))
    ).results
    assert [(x.field, x.description) for x in results[0].violations] == [
        ("jobs[0].spec.priority_class_name", "priority class 'gone' does not exist")
    ]
    (why,) = results[1].violations
    assert why.field == "jobs[1].spec.priority"
    assert "99" in why.description and "'low'" in why.description
    assert "priority_class_name" in why.description
    assert await store.get_many(pb.Job, ["a", "b"]) == [None, None]


async def test_the_global_default_is_one_and_applies_to_jobs_naming_nothing(
    dispatcher: Running, store: Store
) -> None:
    first = klass("first", 5, default=True)
    assert (await apply(dispatcher, first)).results[0].action == "created"

    # A second default, stored or beside another in one request, is refused naming the first.
    second = klass("second", 6, default=True)
    (refused,) = (await apply(dispatcher, second)).results
    assert refused.action == "invalid"
    assert [(x.field, x.description) for x in refused.violations] == [
        (
            "objects[0].priority_class.global_default",
            "priority class 'first' is already the globalDefault: at most one class is",
        )
    ]
    both = await apply(dispatcher, klass("a", 1, default=True), klass("b", 2, default=True))
    assert [r.action for r in both.results] == ["invalid", "invalid"]
    assert "'first'" in both.results[0].violations[0].description
    assert await store.get_many(pb.PriorityClass, ["second", "a", "b"]) == [None, None, None]
    # The default moves in one request: the first gives it up, the second takes it.
    moved = await apply(dispatcher, klass("first", 5), second)
    assert [r.action for r in moved.results] == ["configured", "created"], moved.results

    plain, raw = f.job("plain"), f.job("raw")
    raw.spec.priority = 3
    results = (await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=[plain, raw]))).results
    assert all(r.created for r in results), results
    plain_stored, raw_stored = await store.get_many(pb.Job, ["plain", "raw"])
    assert plain_stored is not None and raw_stored is not None
    assert (plain_stored.spec.priority_class_name, plain_stored.spec.priority) == ("second", 6)
    assert (raw_stored.spec.priority_class_name, raw_stored.spec.priority) == ("", 3)


async def test_what_jobs_were_admitted_with_is_immutable(dispatcher: Running) -> None:
    await apply(dispatcher, LOW)
    changed = klass("low", 11, preemptible=True)
    changed.description = "cheaper"
    (result,) = (await apply(dispatcher, changed)).results
    assert result.action == "invalid"
    assert [x.field for x in result.violations] == ["objects[0].priority_class.value"]
    assert "immutable" in result.violations[0].description
    described = klass("low", 10, preemptible=True)
    described.description = "batch work, preempted first"
    (ok,) = (await apply(dispatcher, described)).results
    assert ok.action == "configured"
    got = await dispatcher.api.Get(api_pb2.GetRequest(kind="PriorityClass", name="low"))
    assert got.priority_class.description == "batch work, preempted first"
    listed = await dispatcher.api.List(api_pb2.ListRequest(kind="PriorityClass"))
    assert [o.priority_class.metadata.name for o in listed.items] == ["low"]


async def test_a_class_in_use_is_not_deleted(dispatcher: Running, store: Store) -> None:
    await apply(dispatcher, LOW)
    jobs = [f.job(f"batch-{i}") for i in range(7)]
    for job in jobs:
        job.spec.priority_class_name = "low"
    results = (await dispatcher.api.Submit(api_pb2.SubmitRequest(jobs=jobs))).results
    assert all(r.created for r in results)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await dispatcher.api.Delete(api_pb2.DeleteRequest(kind="PriorityClass", name="low"))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == (
        "priority class 'low' is in use by 7 jobs (batch-0, batch-1, batch-2, batch-3, "
        "batch-4 and 2 more): delete them first (their priority was resolved from it)"
    )
    assert await store.get(pb.PriorityClass, "low")

    for job in jobs:
        await dispatcher.api.Delete(api_pb2.DeleteRequest(kind="Job", name=job.metadata.name))
    deleted = await dispatcher.api.Delete(api_pb2.DeleteRequest(kind="PriorityClass", name="low"))
    assert deleted.deleted == 1
    assert await store.get_many(pb.PriorityClass, ["low"]) == [None]


async def test_the_sdk_reads_and_writes_classes_in_their_own_terms(
    dispatcher: Running, store: Store
) -> None:
    async with sdk.AsyncGodelClient(dispatcher.host.address, insecure=True) as client:
        made = sdk.priority_class(
            "service", 100000, description="online", preemption_policy="Never", preemptible=False
        )
        assert (await client.apply_priority_class(made)).action == "created"
        assert (await client.apply_priority_class(made)).action == "unchanged"
        with pytest.raises(sdk.Invalid) as caught:
            await client.apply_priority_class(sdk.priority_class("service", 7))
        assert {v.field for v in caught.value.violations} == {
            "objects[0].priority_class.value",
            "objects[0].priority_class.preemption_policy",
            "objects[0].priority_class.preemptible",
        }
        (listed,) = await client.priority_classes()
        assert isinstance(listed, sdk.PriorityClass)
        assert (listed.name, listed.value, listed.global_default) == ("service", 100000, False)
        assert (listed.preemption_policy, listed.preemptible, listed.description) == (
            "Never",
            False,
            "online",
        )
        assert (await client.priority_class("service")).value == 100000

        handle = await client.submit(sdk.job("web", priority_class_name="service"))
        status = await handle.status()
        assert (status.spec["priorityClassName"], status.spec["priority"]) == ("service", 100000)
        with pytest.raises(sdk.Conflict, match=r"in use by 1 job \(web\)"):
            await client.delete_priority_class("service")
        await handle.delete()
        await client.delete_priority_class("service")
        assert await client.priority_classes() == []


async def test_classes_are_watched_like_every_kind(dispatcher: Running) -> None:
    await apply(dispatcher, LOW)
    stream = dispatcher.api.Watch(api_pb2.WatchRequest(kinds=["PriorityClass"]))
    first = await asyncio.wait_for(stream.read(), 10)
    assert (first.type, first.object.priority_class.metadata.name) == (
        api_pb2.WatchEvent.ADDED,
        "low",
    )
    described = klass("low", 10, preemptible=True)
    described.description = "batch"
    await apply(dispatcher, described)
    while True:
        event = await asyncio.wait_for(stream.read(), 10)
        if event.type != api_pb2.WatchEvent.BOOKMARK:
            break
    assert event.type == api_pb2.WatchEvent.MODIFIED
    assert event.object.priority_class.description == "batch"
    stream.cancel()
