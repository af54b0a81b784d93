"""The shard in-process against a real store and real gRPC on loopback: the test plays the
dispatcher (opens Scheduler.Dispatch) and runs a small recording Binder servicer that holds the
`binder` lease, to isolate the shard from the real Binder."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services.runtime import ServiceHost
from services.runtime.config import ConfigError
from services.scheduler import service as scheduler_service
from services.scheduler.service import SchedulerConfig, SchedulerService
from store import Store
from store.errors import ConflictError, NotFoundError
from tests.factories import GiB, job, job_affinity, node, pods_of


@dataclass
class RecordingBinder(internal_pb2_grpc.BinderServicer):
    """Records every DecisionBatch; answers BOUND, except the first placement of each pod
    listed in ``conflict_once`` (CONFLICT), and everything while ``not_leader`` is set. The
    first batch holding a pod listed in ``silent_once`` gets no answer at all (a lost verdict)."""

    conflict_once: set[str] = field(default_factory=set)
    silent_once: set[str] = field(default_factory=set)
    batches: list[ipb.DecisionBatch] = field(default_factory=list)
    not_leader: bool = False

    async def Decide(  # type: ignore[override]
        self, request_iterator: AsyncIterator[ipb.DecisionBatch], context: Any
    ) -> AsyncIterator[ipb.VerdictBatch]:
        async for batch in request_iterator:
            self.batches.append(batch)
            pods = {p.pod for u in batch.units for p in u.placements}
            if pods & self.silent_once:
                self.silent_once -= pods
                continue
            out = ipb.VerdictBatch(batch_id=batch.batch_id)
            for unit in batch.units:
                for p in unit.placements:
                    code = ipb.BOUND
                    if self.not_leader:
                        code = ipb.NOT_LEADER
                    elif p.pod in self.conflict_once:
                        self.conflict_once.discard(p.pod)
                        code = ipb.CONFLICT
                    out.verdicts.add(pod=p.pod, job=unit.job, code=code, node=p.node)
            yield out


@pytest.fixture
async def binder(store: Store) -> AsyncIterator[RecordingBinder]:
    servicer = RecordingBinder()
    server = grpc.aio.server()
    internal_pb2_grpc.add_BinderServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        ok, _ = await store.acquire_lease("binder", "test-binder", 60_000, f"127.0.0.1:{port}")
        assert ok
        yield servicer
    finally:
        await server.stop(0)


class Dispatcher:
    """The test's side of one Dispatch stream."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.call: Any = internal_pb2_grpc.SchedulerStub(self.channel).Dispatch()
        self.credits = 0
        self.outcomes: dict[str, ipb.UnitOutcome] = {}
        self.outcome_messages = 0  # stream messages that carried outcomes

    async def send(self, *units: ipb.Unit) -> None:
        await self.call.write(ipb.DispatchMessage(units=ipb.UnitBatch(units=list(units))))

    async def until(self, pred: Any, timeout: float = 10) -> None:
        async def loop() -> None:
            while not pred():
                msg = await self.call.read()
                assert msg is not grpc.aio.EOF
                if msg.HasField("credit"):
                    self.credits += msg.credit.pods
                elif msg.HasField("outcomes"):
                    self.outcome_messages += 1
                    for outcome in msg.outcomes.outcomes:
                        self.outcomes[outcome.job] = outcome
                elif msg.HasField("outcome"):
                    self.outcome_messages += 1
                    self.outcomes[msg.outcome.job] = msg.outcome

        await asyncio.wait_for(loop(), timeout)

    async def close(self) -> None:
        await self.call.done_writing()
        await self.channel.close()


async def create_job(store: Store, j: pb.Job) -> ipb.Unit:
    pods = pods_of(j)
    await store.create_unit(j, pods)
    return ipb.Unit(
        job=j,
        pods=[
            ipb.PodRef(
                name=p.metadata.name,
                uid=p.metadata.uid,
                resource_version=p.metadata.resource_version,
                index=p.spec.index,
            )
            for p in pods
        ],
    )


async def eventually(pred: Any, timeout: float = 10) -> None:
    async def poll() -> None:
        while not pred():  # noqa: ASYNC110 (state changes in another task, no event to wait on)
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


@pytest.fixture
def config(store_url: str, cluster_name: str) -> SchedulerConfig:
    return SchedulerConfig(
        name="shard-a",
        store_url=store_url,
        cluster=cluster_name,
        port=0,
        heartbeat_seconds=0.1,
        status_seconds=0.1,
        backoff_initial_seconds=0.01,
        grace_seconds=0.5,
        insecure=True,  # plaintext in-process; tests/test_tls.py covers TLS
        log_level="warning",
    )


async def test_shard_schedules_units_and_streams_decisions_to_the_binder(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    for i in range(5):
        await store.create(node(f"n{i}", cpu=4000, mem=32 * GiB))
    gang = await create_job(store, job("gang", replicas=5, min_member=5, cpu=3000, mem=GiB))
    web = await create_job(store, job("web", replicas=3, min_member=1, cpu=500, mem=GiB))
    big = await create_job(store, job("big", replicas=2, min_member=2, cpu=9000, mem=GiB))
    nowhere = job("nowhere", replicas=2, min_member=1, cpu=100, mem=GiB)
    nowhere.spec.template.node_selector["zone"] = "moon"
    nowhere = await create_job(store, nowhere)
    binder.conflict_once = {"web-1"}

    async with ServiceHost(SchedulerService, config) as host:
        inst = await store.get(pb.SchedulerInstance, "shard-a")
        assert inst.spec.address == host.address
        d = Dispatcher(host.address)
        await d.until(lambda: d.credits == 5000)  # Credit{capacity} on open
        d.credits = 0
        await d.send(gang, web, big, nowhere)
        await d.until(
            lambda: {"gang", "web", "big", "nowhere"} <= set(d.outcomes) and d.credits == 12
        )

        assert d.outcomes["gang"].code == ipb.UNIT_DONE
        assert sorted(d.outcomes["gang"].pods) == [f"gang-{i}" for i in range(5)]
        assert d.outcomes["web"].code == ipb.UNIT_DONE
        assert d.outcomes["big"].code == ipb.UNIT_UNSCHEDULABLE
        assert "0/5 nodes fit: 5 insufficient cpu" in d.outcomes["big"].reason
        assert sorted(d.outcomes["big"].pods) == ["big-0", "big-1"]
        # No node could ever take it (only more room could help "big"): infeasible, so the
        # dispatcher holds it until the nodes change instead of retrying it.
        assert d.outcomes["nowhere"].code == ipb.UNIT_INFEASIBLE
        assert d.outcomes["nowhere"].reason.startswith(
            "0/5 nodes fit: 5 node(s) didn't match node selector"
        )

        # The gang travelled whole in one decision; no node got more than it holds.
        decisions = [u for b in binder.batches for u in b.units]
        gang_decisions = [u for u in decisions if u.job == "gang"]
        assert len(gang_decisions) == 1 and len(gang_decisions[0].placements) == 5
        assert gang_decisions[0].min_member == 5
        per_node: dict[str, int] = {}
        for u in decisions:
            for p in u.placements:
                cpu = 3000 if u.job == "gang" else 500
                per_node[p.node] = per_node.get(p.node, 0) + cpu
        assert all(v <= 4000 for v in per_node.values())
        assert all(b.shard == "shard-a" for b in binder.batches)
        # web-1 was rejected once (CONFLICT) and decided again.
        web_pods = [p.pod for u in decisions if u.job == "web" for p in u.placements]
        assert sorted(web_pods) == ["web-0", "web-1", "web-1", "web-2"]
        assert not any(u.job in ("big", "nowhere") for u in decisions)

        # The unschedulable pods carry the reason for `godel explain`.
        async def marked() -> pb.Pod:
            while True:
                pod = await store.get(pb.Pod, "big-0")
                if pod.status.conditions:
                    return pod
                await asyncio.sleep(0.02)

        pod = await asyncio.wait_for(marked(), 5)
        cond = pod.status.conditions[0]
        assert (cond.type, cond.status, cond.reason) == ("PodScheduled", "False", "Unschedulable")
        assert cond.message.startswith("0/5 nodes fit: 5 insufficient cpu")
        assert pod.status.unschedulable.total_nodes == 5
        assert [(r.reason, r.nodes) for r in pod.status.unschedulable.reasons] == [
            ("insufficient cpu", 5)
        ]
        assert pod.status.scheduler == "shard-a" and pod.status.attempts == 1

        # Liveness stamps advance (in the shard heartbeat hash, not in the record).
        before = (await store.shard_heartbeats()).last_ms["shard-a"]
        await asyncio.sleep(0.35)
        assert (await store.shard_heartbeats()).last_ms["shard-a"] > before
        assert (await store.get(pb.SchedulerInstance, "shard-a")).status.ready
        await d.close()

    # A graceful stop removes the registration and its stamp.
    with pytest.raises(NotFoundError):
        await store.get(pb.SchedulerInstance, "shard-a")
    assert "shard-a" not in (await store.shard_heartbeats()).last_ms


async def test_outcomes_of_units_answered_in_one_verdict_batch_share_a_message(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    """One-pod jobs end by the thousand: the outcomes of every unit one VerdictBatch settles
    travel in one ShardMessage (``outcomes``), not one message per unit."""
    for i in range(5):
        await store.create(node(f"n{i}", cpu=4000, mem=32 * GiB))
    singles = [
        await create_job(store, job(f"s{k}", replicas=1, min_member=1, cpu=100, mem=GiB))
        for k in range(20)
    ]
    async with ServiceHost(SchedulerService, config) as host:
        d = Dispatcher(host.address)
        await d.until(lambda: d.credits == 5000)
        await d.send(*singles)
        await d.until(lambda: len(d.outcomes) == 20)
        await d.close()
    assert {job: o.code for job, o in d.outcomes.items()} == {
        f"s{k}": ipb.UNIT_DONE for k in range(20)
    }
    assert all(list(d.outcomes[f"s{k}"].pods) == [f"s{k}-0"] for k in range(20))
    # Every verdict batch answered at most one outcome message (a cycle may split the 20 units
    # over several decision batches on a slow machine; never one message per unit each).
    assert 1 <= d.outcome_messages <= len(binder.batches)


def searches() -> float:
    """Unit searches the shards of this process have run (one timing sample each)."""
    value = REGISTRY.get_sample_value("godel_scheduler_scheduling_duration_seconds_count")
    return value or 0.0


async def test_one_pod_jobs_share_a_search_and_each_ends_on_its_own(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    """One-pod jobs in line are searched together (their pods placed independently), yet each
    job gets its own decision and outcome: one that fits nowhere ever is infeasible, one too
    big for the room is unschedulable, the rest are placed. A gang and a job with job-level
    affinity are searched alone, and break the line."""
    for i in range(4):
        n = node(f"n{i}", cpu=4000, mem=32 * GiB)
        n.metadata.labels["zone"] = "earth"
        await store.create(n)
    units = [
        await create_job(store, job(f"s{k}", replicas=1, min_member=1, cpu=100, mem=GiB))
        for k in range(10)
    ]
    moon = job("moon", replicas=1, min_member=1, cpu=100, mem=GiB)
    moon.spec.template.node_selector["zone"] = "moon"
    units.append(await create_job(store, moon))
    units.append(await create_job(store, job("huge", replicas=1, min_member=1, cpu=9000)))
    units += [
        await create_job(store, job(f"t{k}", replicas=1, min_member=1, cpu=100, mem=GiB))
        for k in range(5)
    ]
    units.append(await create_job(store, job("gang", replicas=2, min_member=2, cpu=100)))
    units.append(
        await create_job(store, job_affinity(job("racked", replicas=1, cpu=100), ["zone"]))
    )
    units.append(await create_job(store, job("last", replicas=1, min_member=1, cpu=100)))
    async with ServiceHost(SchedulerService, config) as host:
        d = Dispatcher(host.address)
        await d.until(lambda: d.credits == 5000)
        before = searches()
        await d.send(*units)
        await d.until(lambda: len(d.outcomes) == len(units))
        ran = searches() - before
        await d.close()

    codes = {name: o.code for name, o in d.outcomes.items()}
    assert codes.pop("moon") == ipb.UNIT_INFEASIBLE
    assert d.outcomes["moon"].reason.startswith("0/4 nodes fit: 4 node(s) didn't match")
    assert codes.pop("huge") == ipb.UNIT_UNSCHEDULABLE
    assert d.outcomes["huge"].reason.startswith("0/4 nodes fit: 4 insufficient cpu")
    assert set(codes.values()) == {ipb.UNIT_DONE}
    decisions = [u for b in binder.batches for u in b.units]
    # One decision per job placed, each naming its own job and pod.
    assert sorted(u.job for u in decisions) == sorted(codes)
    assert all(
        [p.pod for p in u.placements] == [f"{u.job}-{i}" for i in range(len(u.placements))]
        for u in decisions
    )
    # Seventeen one-pod jobs in line, the gang, the racked job, then one more one-pod job:
    # four searches, not twenty.
    assert ran == 4


async def test_dispatch_stream_joins_outcomes_in_order_and_never_into_a_sent_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outcomes join the waiting outcomes message at the tail; a nomination between them, a
    full message (``MAX_OUTCOMES_PER_MESSAGE``) or the tail's being taken for sending starts a
    new one, so order holds and a message once taken never changes."""
    monkeypatch.setattr(scheduler_service, "MAX_OUTCOMES_PER_MESSAGE", 3)
    stream = scheduler_service._DispatchStream()

    def done(job: str) -> None:
        stream.outcome(job, ipb.UNIT_DONE, [f"{job}-0"])

    def jobs(msg: ipb.ShardMessage | None) -> list[str]:
        assert msg is not None
        if msg.HasField("nominations"):
            return [f"nominations:{msg.nominations.job}"]
        return [o.job for o in msg.outcomes.outcomes]

    for job_name in ("a", "b", "c", "d"):
        done(job_name)
    stream.send(ipb.ShardMessage(nominations=ipb.Nominations(job="e")))
    done("e")
    taken = [await stream.next() for _ in range(3)]
    assert [jobs(m) for m in taken] == [["a", "b", "c"], ["d"], ["nominations:e"]]
    done("f")  # joins "e", still waiting
    last = await stream.next()
    assert jobs(last) == ["e", "f"]
    done("g")  # "e, f" is taken: a new message
    assert jobs(last) == ["e", "f"]
    assert jobs(await stream.next()) == ["g"]


async def test_revoke_and_binder_reconnect(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    for i in range(3):
        await store.create(node(f"n{i}", cpu=4000, mem=32 * GiB))
    binder.not_leader = True
    a = await create_job(store, job("a", replicas=2, min_member=2, cpu=1000, mem=GiB))
    async with ServiceHost(SchedulerService, config) as host:
        d = Dispatcher(host.address)
        await d.until(lambda: d.credits == 5000)
        await d.send(a)
        # The "standby" answers NOT_LEADER: the shard looks the leader up again and resends.
        await eventually(lambda: len(binder.batches) >= 2)
        binder.not_leader = False
        await d.until(lambda: "a" in d.outcomes)
        assert d.outcomes["a"].code == ipb.UNIT_DONE
        assert {b.batch_id for b in binder.batches} == {binder.batches[0].batch_id}

        # Revoked units are dropped and their credits returned, with no outcome.
        service = host.service
        assert isinstance(service, SchedulerService)
        b = await create_job(store, job("b", replicas=2, min_member=2, cpu=1000, mem=GiB))
        binder.not_leader = True  # keep b's decision undecided
        d.credits = 0
        await d.send(b)
        await eventually(lambda: "b" in {u.job for x in binder.batches for u in x.units})
        await d.call.write(ipb.DispatchMessage(revoke=ipb.RevokeUnits(jobs=["b"])))
        await d.until(lambda: d.credits >= 4)  # a's 2 (already returned) + b's 2
        assert "b" not in service.units and "b" not in d.outcomes
        await d.close()


async def test_a_job_affinity_keeps_the_rest_of_a_job_in_the_rack_of_its_bound_pods(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    """Rack a fits the job tighter (the domain a new job would take), but the job's first pod
    is bound in rack b: the rest follows it there, the shard finding the bound pod in its
    cache."""
    for rack, count, cpu in (("a", 2, 4000), ("b", 4, 8000)):
        for i in range(count):
            n = node(f"{rack}{i}", cpu=cpu, mem=32 * GiB)
            n.metadata.labels["rack"] = rack
            await store.create(n)
    j = job_affinity(job("g", replicas=3, min_member=1, cpu=1000, mem=GiB), ["rack"])
    unit = await create_job(store, j)
    first = await store.get(pb.Pod, "g-0")
    first.spec.node_name, first.status.phase = "b1", pb.POD_BOUND
    await store.update(first)
    del unit.pods[0]
    unit.already_bound = 1

    async with ServiceHost(SchedulerService, config) as host:
        d = Dispatcher(host.address)
        await d.until(lambda: d.credits == 5000)
        await d.send(unit)
        await d.until(lambda: "g" in d.outcomes)
        await d.close()

    assert d.outcomes["g"].code == ipb.UNIT_DONE
    placed = {p.pod: p.node for b in binder.batches for u in b.units for p in u.placements}
    assert set(placed) == {"g-1", "g-2"}
    assert all(n.startswith("b") for n in placed.values()), placed


async def test_shard_with_the_real_binder_binds_gangs_without_overcommit(
    store: Store, config: SchedulerConfig, store_url: str, cluster_name: str
) -> None:
    from services.binder.service import BinderConfig, BinderService

    for i in range(4):
        await store.create(node(f"n{i}", cpu=4000, mem=32 * GiB))
    units = [
        await create_job(store, job(f"g{k}", replicas=3, min_member=3, cpu=1000, mem=GiB))
        for k in range(5)
    ]
    binder_config = BinderConfig(
        name="binder-0", store_url=store_url, cluster=cluster_name, port=0, log_level="warning",
        insecure=True,
    )  # fmt: skip
    async with (
        ServiceHost(BinderService, binder_config),
        ServiceHost(SchedulerService, config) as shard,
    ):
        d = Dispatcher(shard.address)
        await d.until(lambda: d.credits == 5000)
        await d.send(*units)
        await d.until(lambda: len(d.outcomes) == 5, timeout=20)
        await d.close()

    # 16 cpu-slots of 1000m: 5 gangs of 3 fit (15); every gang is whole.
    codes = {job: o.code for job, o in d.outcomes.items()}
    assert codes == {f"g{k}": ipb.UNIT_DONE for k in range(5)}
    pods, _ = await store.list_all(pb.Pod)
    assert all(p.spec.node_name and p.status.phase == pb.POD_BOUND for p in pods)
    for i in range(4):
        usage = await store.node_usage(f"n{i}")
        assert usage is not None and usage.used["g.cpu"] <= 4000


async def test_reconciler_takes_back_a_decision_left_without_a_verdict(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    """The Binder received a decision and never answered it while the stream stayed up and
    answered later ones: within one reconcile interval past the verdict timeout the shard
    forgets the placement, decides again and the unit completes; the repair is counted. A
    decision merely slow (nothing after it answered) is left alone. The heartbeat reports the
    shard's counters (pods proposed, bound, conflicted) for the dispatcher's node shuffler."""
    await store.create(node("n0", cpu=4000, mem=32 * GiB))
    lost = await create_job(store, job("lost", replicas=2, min_member=2, cpu=500, mem=GiB))
    clash = await create_job(store, job("clash", replicas=1, cpu=500, mem=GiB))
    binder.silent_once = {"lost-0"}
    binder.conflict_once = {"clash-0"}
    cfg = replace(config, verdict_timeout_seconds=0.5, reconcile_interval_seconds=0.1)
    async with ServiceHost(SchedulerService, cfg) as host:
        shard = host.service
        assert isinstance(shard, SchedulerService)
        d = Dispatcher(host.address)
        await d.send(lost)
        await eventually(lambda: len(binder.batches) == 1)
        await asyncio.sleep(0.6)  # past the verdict timeout, with nothing after it answered
        assert shard.reconcile() == 0  # only slow, as far as the shard can tell: left alone
        assert shard.stats["repaired_decisions"] == 0 and "lost" not in d.outcomes
        await d.send(clash)  # answered (CONFLICT, then BOUND): the Binder moved on past "lost"
        await d.until(lambda: "lost" in d.outcomes and "clash" in d.outcomes)
        assert d.outcomes["lost"].code == ipb.UNIT_DONE
        assert sorted(d.outcomes["lost"].pods) == ["lost-0", "lost-1"]
        assert shard.stats["repaired_decisions"] == 1
        lost_decisions = [u for b in binder.batches for u in b.units if u.job == "lost"]
        assert len(lost_decisions) == 2  # the unanswered one, and the one decided again

        async def counters() -> tuple[int, int, int]:
            s = (await store.get(pb.SchedulerInstance, "shard-a")).status
            return s.proposed_pods, s.bound_pods, s.conflicted_pods

        # lost: 2 + 2 proposed, 2 bound (the taken-back decision is no conflict);
        # clash: 1 conflicted, then 1 bound.
        for _ in range(100):
            if await counters() == (6, 3, 1):
                break
            await asyncio.sleep(0.05)
        assert await counters() == (6, 3, 1)
        await d.close()


async def test_status_writes_keep_a_written_partition_and_the_shard_applies_it(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    """The shard writes its counters from the copy its watch holds (no read per write): a
    partition the dispatcher writes in between makes one write lose its compare-and-set and go
    again on a fresh copy, so the partition is never overwritten, and the shard scans it
    first."""
    for i in range(4):
        await store.create(node(f"n{i}"))
    async with ServiceHost(SchedulerService, replace(config, status_seconds=0.1)) as host:
        shard = host.service
        assert isinstance(shard, SchedulerService)
        await eventually(lambda: shard.informer.get("SchedulerInstance", "shard-a") is not None)
        for partition in (["n1", "n3"], ["n0"]):
            # What the node shuffler does: a compare-and-set, retried on a fresh copy.
            for _ in range(20):
                inst = await store.get(pb.SchedulerInstance, "shard-a")
                del inst.spec.partition[:]
                inst.spec.partition.extend(partition)
                try:
                    await store.update(inst)
                    break
                except ConflictError:
                    continue
            await eventually(lambda p=partition: shard.scheduler.partition == frozenset(p))  # type: ignore[misc]
            # A counter moves (as a decision moves it): the next status write carries it.
            shard.stats["decided_pods"] += 1
            wanted = shard.stats["decided_pods"]

            async def written(count: int = wanted) -> pb.SchedulerInstance:
                while True:
                    got = await store.get(pb.SchedulerInstance, "shard-a")
                    if got.status.proposed_pods == count:
                        return got
                    await asyncio.sleep(0.02)

            after = await asyncio.wait_for(written(), 5)
            assert list(after.spec.partition) == partition
            assert shard.scheduler.partition == frozenset(partition)


async def test_liveness_stays_out_of_the_change_feed(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    """An idle shard stamps its liveness ten times a second here, and its counters have not
    changed: the change feed every informer reads carries no write of its SchedulerInstance
    (the record, with a node partition ~100 KB, was rewritten with every heartbeat)."""
    async with ServiceHost(SchedulerService, config) as host:
        shard = host.service
        assert isinstance(shard, SchedulerService)
        await eventually(lambda: shard.pulse.stamps > 0)
        await asyncio.sleep(0.3)  # the registration and any first status write are behind us
        since = await store.revision()
        stamps = shard.pulse.stamps
        await asyncio.sleep(1.5)  # 15 liveness periods, 15 status periods
        assert shard.pulse.stamps > stamps  # alive all along
        written = []
        async for batch in store.watch(since, ["SchedulerInstance"], block_ms=100):
            written += [e.name for e in batch.events]
            if batch.caught_up:
                break
        assert written == [], f"SchedulerInstance writes in the change feed: {written}"


async def test_a_shard_whose_record_was_deleted_as_dead_registers_again(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    """What the dispatcher's reconciler does to a shard silent too long (frozen, cut off):
    its record deleted. Its next stamp finds no record, and the shard registers again."""
    async with ServiceHost(SchedulerService, config) as host:
        shard = host.service
        assert isinstance(shard, SchedulerService)
        await eventually(lambda: shard.pulse.stamps > 0)
        await store.delete(pb.SchedulerInstance, "shard-a")

        async def registered() -> bool:
            found = await store.get_many(pb.SchedulerInstance, ["shard-a"])
            return found[0] is not None and found[0].spec.address == host.address

        for _ in range(200):
            if await registered():
                break
            await asyncio.sleep(0.05)
        assert await registered()
        # And stamps again.
        await asyncio.sleep(0.3)
        beats = await store.shard_heartbeats()
        assert beats.now_ms - beats.last_ms["shard-a"] < 5000


async def test_a_reservation_without_a_node_is_placed_as_a_one_pod_unit(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    """A unit carrying a reservation is placed like the pod it stands for (its filters, shared
    with a one-pod job's search) and proposed in the same decision batch, marked as a
    reservation's; one no node fits is handed back with the reason in its outcome, and the
    shard writes nothing on it (the dispatcher does)."""
    from placement.reservations import hold_name
    from tests.factories import reservation

    await store.create(node("n0", cpu=1000, mem=32 * GiB))
    await store.create(node("n1", cpu=4000, mem=32 * GiB))
    stored: dict[str, pb.Reservation] = {}
    for name, cpu in (("anywhere", 2000), ("nowhere", 9000)):
        rsv = reservation(name, "", job="train", cpu=cpu)
        rsv.status.phase = pb.RESERVATION_PENDING
        stored[name] = await store.create(rsv)
    web = await create_job(store, job("web", replicas=1, min_member=1, cpu=500, mem=GiB))

    def unit_of(name: str) -> ipb.Unit:
        unit = ipb.Unit(reservation=name)
        unit.pods.add(name=hold_name(name), resource_version=stored[name].metadata.resource_version)
        return unit

    async with ServiceHost(SchedulerService, config) as host:
        d = Dispatcher(host.address)
        await d.until(lambda: d.credits == 5000)
        d.credits = 0
        await d.send(unit_of("anywhere"), unit_of("nowhere"), web)
        keys = {hold_name("anywhere"), hold_name("nowhere"), "web"}
        await d.until(lambda: keys <= set(d.outcomes) and d.credits == 3)
        assert d.outcomes[hold_name("anywhere")].code == ipb.UNIT_DONE
        assert d.outcomes["web"].code == ipb.UNIT_DONE
        nowhere = d.outcomes[hold_name("nowhere")]
        assert nowhere.code == ipb.UNIT_UNSCHEDULABLE
        assert "0/2 nodes fit: 2 insufficient cpu" in nowhere.reason
        decisions = [u for b in binder.batches for u in b.units]
        [placed] = [u for u in decisions if u.reservation]
        assert (placed.reservation, placed.job) == ("anywhere", hold_name("anywhere"))
        assert [(p.pod, p.node, p.pod_resource_version) for p in placed.placements] == [
            (hold_name("anywhere"), "n1", stored["anywhere"].metadata.resource_version)
        ]
        assert [u.job for u in decisions if not u.reservation] == ["web"]
        after = await store.get(pb.Reservation, "nowhere")
        assert after.metadata.resource_version == stored["nowhere"].metadata.resource_version
        await d.close()


async def test_a_shard_keeps_no_bytes_of_bound_pods_yet_its_preemption_keeps_their_budgets(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    """The shard's informer keeps a bound pod by name alone (its cache's record serves the
    accounting and the victim search), and a label-selector budget over bound pods is still
    read from those records: the preemptor finds no victim it may take. A pending pod stays
    whole."""
    await store.create(node("n0", cpu=2000, mem=32 * GiB))
    low = job("low", replicas=2, cpu=1000, mem=GiB)
    low.spec.template.labels["app"] = "web"
    low_pods = pods_of(low)
    for p in low_pods:
        p.spec.node_name, p.status.phase, p.spec.priority = "n0", pb.POD_RUNNING, 1
        p.spec.preemptible = True
    await store.create_unit(low, low_pods)
    budget = pb.DisruptionBudget(metadata=pb.ObjectMeta(name="keep-web"))
    budget.spec.selector.add(key="app", operator=pb.LabelSelectorRequirement.IN, values=["web"])
    budget.spec.max_unavailable = 0
    budget.status.disruptions_allowed = 0
    await store.create(budget)
    high = job("high", cpu=1000, mem=GiB)
    high.spec.priority = 100
    high_pods = pods_of(high)
    high_pods[0].spec.priority = 100
    await store.create_unit(high, high_pods)
    stored = await store.get(pb.Pod, "high-0")
    unit = ipb.Unit(
        job=high,
        pods=[ipb.PodRef(name="high-0", resource_version=stored.metadata.resource_version)],
    )

    async with ServiceHost(SchedulerService, config) as host:
        shard = host.service
        assert isinstance(shard, SchedulerService)
        await eventually(lambda: shard.cache.running("low-1") is not None)
        assert shard.informer.get("Pod", "low-0") is None  # no bytes of a bound pod
        assert shard.informer.knows("Pod", "low-0")
        assert shard.victims.budget_violations(["low-0"]) == ["keep-web"]
        d = Dispatcher(host.address)
        await d.until(lambda: d.credits > 0)
        await d.send(unit)
        await d.until(lambda: "high" in d.outcomes)
        assert shard.informer.get("Pod", "high-0") is not None  # pending: whole
        await d.close()

    assert d.outcomes["high"].code == ipb.UNIT_UNSCHEDULABLE
    assert not [p for b in binder.batches for u in b.units for p in u.placements]


async def test_a_shard_started_over_bound_pods_preempts_the_right_victims(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    """A restart builds the shard's records from one listing, every pod of a template sharing
    its parsed part (placement.preemption.TemplateParts): the pods of one template that differ
    in priority, preemptibility or start still get each its own, so the preemptor's victims
    are the ones they were before — the latest-started of the lowest priority, never a pod
    that may not be preempted, nor one of higher priority."""
    for name in ("n0", "n1"):
        await store.create(node(name, cpu=4000, mem=32 * GiB))
    # One template for every bound pod (2000m, 1 GiB); what differs is each pod's own.
    own = {
        "keep-0": ("n0", 1, False, 100),  # node, priority, preemptible, started_ms
        "keep-1": ("n0", 1, False, 200),
        "low-0": ("n1", 1, True, 100),
        "low-1": ("n1", 1, True, 300),
        "mid-0": ("n1", 5, True, 400),
    }
    for name, (on, priority, preemptible, started) in own.items():
        p = pb.Pod(metadata=pb.ObjectMeta(name=name))
        p.spec.job = name.split("-")[0]
        p.spec.priority = priority
        p.spec.preemptible = preemptible
        p.spec.node_name = on
        p.spec.template.requests.milli_cpu = 2000 if name != "mid-0" else 0
        p.spec.template.requests.memory_bytes = GiB
        p.status.phase = pb.POD_RUNNING
        p.status.started_ms = started
        await store.create(p)
    high = job("high", replicas=1, min_member=1, cpu=2000, mem=GiB)
    high.spec.priority = 10
    high_pods = pods_of(high)
    high_pods[0].spec.priority = 10
    await store.create_unit(high, high_pods)
    unit = ipb.Unit(
        job=high,
        pods=[ipb.PodRef(name="high-0", resource_version=high_pods[0].metadata.resource_version)],
    )

    async with ServiceHost(SchedulerService, config) as host:
        shard = host.service
        assert isinstance(shard, SchedulerService)
        assert set(shard.cache.bound) == set(own)
        assert len(shard.cache.template_parts) == 2  # 2000m pods, and mid-0's
        low_0, low_1 = shard.cache.running("low-0"), shard.cache.running("low-1")
        assert low_0 is not None and low_1 is not None and low_0.req.requests is low_1.req.requests
        d = Dispatcher(host.address)
        await d.until(lambda: d.credits == 5000)
        await d.send(unit)
        await d.until(lambda: "high" in d.outcomes)
        await d.close()

    assert d.outcomes["high"].code == ipb.UNIT_DONE
    placed = [p for b in binder.batches for u in b.units for p in u.placements]
    assert [(p.pod, p.node, list(p.victims)) for p in placed] == [("high-0", "n1", ["low-1"])]


async def test_a_second_process_for_a_held_name_waits_refusing_dispatch_then_takes_it_on_stop(
    store: Store, binder: RecordingBinder, config: SchedulerConfig
) -> None:
    """Standby shards in-process (services/scheduler/README.md, "Standby shards"): a process
    configured for a name another holds serves its health but not as the shard — no record of
    its own, Dispatch refused — and the holder's graceful stop releases the name, which it then
    takes: the record names its address and it schedules a unit dispatched to it."""
    await store.create(node("n0", cpu=4000, mem=32 * GiB))
    fast = replace(config, lease_ms=1000, renew_ms=200)
    async with ServiceHost(SchedulerService, fast) as first:
        async with ServiceHost(SchedulerService, fast) as second:
            standby = second.service
            assert isinstance(standby, SchedulerService)
            assert not standby.serving
            inst = await store.get(pb.SchedulerInstance, "shard-a")
            assert inst.spec.address == first.address
            refused = Dispatcher(second.address)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await refused.until(lambda: False)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            await refused.channel.close()

            await first.stop()  # releases the name as it stops
            await eventually(lambda: standby.serving)
            inst = await store.get(pb.SchedulerInstance, "shard-a")
            assert inst.spec.address == second.address
            d = Dispatcher(second.address)
            await d.send(await create_job(store, job("after", replicas=1, cpu=100, mem=GiB)))
            await d.until(lambda: "after" in d.outcomes)
            assert d.outcomes["after"].code == ipb.UNIT_DONE
            await d.close()


@pytest.mark.parametrize(
    ("name", "standby_for", "names"),
    [
        ("shard-a", "", ("shard-a",)),  # a shard: its own name
        ("spare", "scheduler-0,scheduler-1", ("scheduler-0", "scheduler-1")),
        ("spare", " scheduler-0 , ,scheduler-1 ", ("scheduler-0", "scheduler-1")),
    ],
)
def test_the_names_a_process_may_be(name: str, standby_for: str, names: tuple[str, ...]) -> None:
    assert SchedulerConfig(name=name, standby_for=standby_for).shard_names() == names


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"standby_for": " , "}, "standby_for names no shard"),
        ({"lease_ms": 1000, "renew_ms": 600}, "renew_ms (600) must be at most half"),
    ],
)
def test_standby_settings_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        SchedulerConfig(**settings)
