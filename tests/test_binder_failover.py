"""The Binder's preemption across a leader failover: kill -9 of the leader while preemptions
are pipelined to it leaves nothing half-done (real binder processes, real store). Uses the
harness of ``tests/test_binder.py`` (its audit runs after this test too)."""

from __future__ import annotations

import asyncio

from protos.godel.v1 import objects_pb2 as pb
from store import Store
from store.lease import holder_name
from tests import factories as f
from tests.test_binder import (
    HIGH,
    LOW,
    Shard,
    Start,
    _some,
    audit,
    bind_via_leader,
    eventually,
    preempting,
    prio,
    start_binder,
    submit_prio,
    unit,
)

__all__ = ["audit", "start_binder"]  # fixtures, used by name


async def test_kill_9_between_claims_and_binds_leaves_nothing_half_done(
    store: Store, start_binder: Start
) -> None:
    """Preemptions pipelined to the leader, which is killed mid-stream: every victim evicted has
    its preemptor bound on its node and every bound preemptor's victim is evicted (one commit
    each), before and after the standby takes over and the rest is decided again."""
    procs = {n: start_binder(n, "--lease-ms", "1000", "--renew-ms", "200") for n in ("b1", "b2")}

    async def holder() -> pb.Lease | None:
        lease = await store.get_lease("binder")
        return lease if lease is not None and lease.holder else None

    await eventually(lambda: _some(holder()), what="a first leader")
    nodes = [f"n{i}" for i in range(20)]
    for n in nodes:
        await store.create(f.node(n, cpu=1000))
    low = prio(f.job("low", replicas=20, cpu=1000), LOW)
    low_pods = await submit_prio(store, low)
    spread = [(f"low-{i}", n) for i, n in enumerate(nodes)]
    await bind_via_leader(store, unit(low, low_pods, spread))
    highs = [prio(f.job(f"h{i}", cpu=1000), HIGH) for i in range(20)]
    decisions = []
    for i, h in enumerate(highs):
        pods = await submit_prio(store, h)
        decisions.append(preempting(h, pods, [(f"h{i}-0", nodes[i], [f"low-{i}"])]))
    first = await holder()
    assert first is not None
    await asyncio.sleep(0.5)  # the leader's view holds the low pods
    shard = Shard(first.holder_address)
    for d in decisions:
        await shard.send(d)
    procs[holder_name(first.holder)].kill()
    procs[holder_name(first.holder)].wait(10)
    await shard.close()

    async def consistent() -> list[str]:
        pods = {p.metadata.name: p for p in (await store.list_all(pb.Pod))[0]}
        wrong = []
        for i, n in enumerate(nodes):
            victim, preemptor = pods[f"low-{i}"], pods[f"h{i}-0"]
            evicted = victim.status.phase == pb.POD_FAILED
            bound = preemptor.spec.node_name == n
            if evicted != bound or (evicted and victim.status.preempted_by != f"h{i}-0"):
                wrong.append(f"{n}: victim evicted {evicted}, preemptor bound {bound}")
        return wrong

    assert await consistent() == []
    for d in decisions:  # the shard decides again through the new leader
        await bind_via_leader(store, d)
    assert await consistent() == []
    bound = [p for p in (await store.list_all(pb.Pod))[0] if p.spec.job.startswith("h")]
    assert all(p.spec.node_name for p in bound)
