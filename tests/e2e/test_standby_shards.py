"""Warm standby shards with the real processes (`godel up --standby-shards 1`): a shard's name
is a lease, and a spare, its view synced, takes the name of a shard whose process is killed
(-9) or stopped (SIGTERM) — registering that shard at its own address, so the dispatcher's
units for it are scheduled by the spare — while a process started again for a held name waits
as its standby; a holder frozen (SIGSTOP) past its lease and woken (SIGCONT) after the spare
took its name takes nothing back and stamps nothing; a spare for two names takes the one that
freed. README: services/scheduler/README.md, "Standby shards"."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import psutil

from godel.local.cluster import probe_credentials
from protos.godel.v1 import objects_pb2 as pb
from services.runtime.healthcheck import probe
from services.scheduler.service import SCHEDULER_SERVICE
from services.scheduler.shardlease import shard_lease
from store import Store
from tests import factories as f
from tests.e2e.conftest import Cluster, wait_until

SPARE = "scheduler-spare-0"
# A short lease, so that a takeover is quick (the renewals come from a thread of their own);
# stamps five times a second, so that a short window would show a stray one.
SCHEDULER_ARGS = ("--lease-ms", "2000", "--renew-ms", "400", "--heartbeat-seconds", "0.2")
DISPATCHER_ARGS = ("--shard-grace-seconds", "3")


def _address_of(cluster: Cluster, shard: str) -> str:
    """The address shard ``shard``'s record names ("" when there is none)."""
    for inst in cluster.client.list("SchedulerInstance"):
        assert isinstance(inst, pb.SchedulerInstance)
        if inst.metadata.name == shard:
            return str(inst.spec.address)
    return ""


def _holder(cluster: Cluster, shard: str) -> str:
    async def read(store: Store) -> str:
        lease = await store.get_lease(shard_lease(shard))
        return lease.holder if lease is not None else ""

    holder: str = cluster.run_store(read)
    return holder


def _serves_as_shard(cluster: Cluster, name: str) -> str:
    """The Scheduler health entry of process ``name``: SERVING only while it is a shard."""
    credentials = probe_credentials(cluster.home, cluster.state)
    return probe(cluster.component(name).address, SCHEDULER_SERVICE, 1, credentials)


def _bound(cluster: Cluster, prefix: str, count: int) -> bool:
    pods = [p for p in cluster.client.list(pb.Pod) if p.metadata.name.startswith(prefix)]
    return len(pods) == count and all(p.spec.node_name for p in pods)


def _kill(cluster: Cluster, name: str, sig: signal.Signals) -> None:
    pid = cluster.component(name).pid
    assert pid is not None
    os.kill(pid, sig)
    wait_until(lambda: not psutil.pid_exists(pid) or _zombie(pid), 30, f"{name} gone")


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_spare_takes_a_killed_shard_and_a_restart_waits_as_its_standby(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(
        schedulers=1,
        standby_shards=1,
        binders=1,
        hollow_nodes=10,
        service_args=(("scheduler", SCHEDULER_ARGS), ("dispatcher", DISPATCHER_ARGS)),
    )
    shard, spare = cluster.component("scheduler-0"), cluster.component(SPARE)
    assert _address_of(cluster, "scheduler-0") == shard.address
    # The spare is up (its view synced) but is no shard: no record, its Scheduler entry down.
    assert _serves_as_shard(cluster, SPARE) == "NOT_SERVING"
    assert _serves_as_shard(cluster, "scheduler-0") == "SERVING"
    assert {i.metadata.name for i in cluster.client.list("SchedulerInstance")} == {"scheduler-0"}

    # Units the killed shard held are handed out again, to the spare: the only shard now.
    jobs = [f.job(f"burst-{i}", replicas=4, min_member=4) for i in range(5)]
    assert all(r.created for r in cluster.client.submit(jobs).results)
    _kill(cluster, "scheduler-0", signal.SIGKILL)
    wait_until(
        lambda: _address_of(cluster, "scheduler-0") == spare.address,
        30,
        "the spare registered as scheduler-0",
    )
    assert _serves_as_shard(cluster, SPARE) == "SERVING"
    wait_until(lambda: _bound(cluster, "burst-", 20), 60, "the burst bound by the spare")
    assert cluster.client.submit([f.job("after-kill", replicas=2)]).results[0].created
    wait_until(lambda: _bound(cluster, "after-kill", 2), 60, "a later job bound by the spare")

    # scheduler-0 started again while the spare holds its name: a standby, not a second shard.
    cluster.start_again("scheduler-0")
    wait_until(lambda: _serves_as_shard(cluster, "scheduler-0") == "NOT_SERVING", 60, "restarted")
    time.sleep(1.0)  # a few of its campaign rounds: the name stays the spare's
    assert _address_of(cluster, "scheduler-0") == spare.address
    assert _holder(cluster, "scheduler-0").startswith(SPARE + "/")

    # SIGTERM of the holder releases the name: the restarted process takes it over.
    _kill(cluster, SPARE, signal.SIGTERM)
    wait_until(
        lambda: _address_of(cluster, "scheduler-0") == cluster.component("scheduler-0").address,
        30,
        "the restarted scheduler-0 registered again",
    )
    assert cluster.client.submit([f.job("after-term", replicas=2)]).results[0].created
    wait_until(lambda: _bound(cluster, "after-term", 2), 60, "a job bound after the SIGTERM")


def test_frozen_holder_takes_nothing_back_and_a_spare_takes_the_name_that_freed(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(
        schedulers=2,
        standby_shards=1,
        binders=1,
        hollow_nodes=10,
        service_args=(("scheduler", SCHEDULER_ARGS), ("dispatcher", DISPATCHER_ARGS)),
    )
    spare = cluster.component(SPARE)
    other = _address_of(cluster, "scheduler-0")
    frozen = cluster.component("scheduler-1").pid
    assert frozen is not None
    os.kill(frozen, signal.SIGSTOP)
    try:
        # The spare stands by for both names; only scheduler-1's lease frees.
        wait_until(
            lambda: _address_of(cluster, "scheduler-1") == spare.address,
            30,
            "the spare registered as scheduler-1",
        )
        assert _address_of(cluster, "scheduler-0") == other
        assert _holder(cluster, "scheduler-0").startswith("scheduler-0/")
    finally:
        os.kill(frozen, signal.SIGCONT)
    # The woken holder learns its lease is gone and stands by: it does not register again.
    wait_until(
        lambda: _serves_as_shard(cluster, "scheduler-1") == "NOT_SERVING", 30, "stepped down"
    )
    time.sleep(1.0)
    assert _address_of(cluster, "scheduler-1") == spare.address
    assert _holder(cluster, "scheduler-1").startswith(SPARE + "/")

    # Nor does it stamp scheduler-1: with the spare frozen (its lease still running), the
    # stamp stays where the spare left it.
    async def stamp(store: Store) -> int:
        beats = await store.shard_heartbeats()
        return beats.last_ms.get("scheduler-1", 0)

    spare_pid = spare.pid
    assert spare_pid is not None
    os.kill(spare_pid, signal.SIGSTOP)
    try:
        time.sleep(0.2)  # a stamp in flight lands
        before = cluster.run_store(stamp)
        time.sleep(0.8)  # four of the woken holder's beats, within the spare's lease
        after = cluster.run_store(stamp)
    finally:
        os.kill(spare_pid, signal.SIGCONT)
    assert after == before

    assert cluster.client.submit([f.job("after-freeze", replicas=4)]).results[0].created
    wait_until(lambda: _bound(cluster, "after-freeze", 4), 60, "a job bound afterwards")
