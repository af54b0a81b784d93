"""The rescheduler's executed rounds under the harder cases of issue 11: a swap, a replacement
that cannot use its recommendation (mismatched, then the failure ratio stops the round), GPU
defragmentation of 50 hollow 8-GPU nodes within disruption budgets, and faults — the rescheduler
killed mid-round, a shard killed before it acknowledges.

The swap and the mismatch run the real executor (``RoundExecutor``) in the test process against
a real cluster's store and Binder, with a hand-made plan: the plugins do not plan a swap on
purpose, and a mismatch needs the recommended node to change between planning and landing, which
a hand-made plan makes deterministic. Everything else goes through the rescheduler service.

The GPU defragmentation and the kill -9 run rounds of several batches, each within a budget of
one. A policy with the DisruptionBudget check plans no more moves of a budget than it allows now
(one, here: a one-batch round), so these rescheduler processes run the built-in policies without
that check (``batched_policies``): every move the packing wants is planned, and the budgets are
kept batch by batch — the generator, the executor's wait for them, the Binder.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from foundation import tls
from godel.client import ReschedulerClient
from placement.rules import hard_rules
from protos.godel.v1 import objects_pb2 as pb
from services import movements as shared
from services.eviction import REPLACES_ANNOTATION, RESCHEDULED
from services.peers.binder import BinderEvictor
from services.rescheduler.checks import new_check_registry
from services.rescheduler.config import load_policies
from services.rescheduler.executor import ExecutionConfig, RoundExecutor
from services.rescheduler.framework import ClusterView, Move
from services.rescheduler.plugins import new_plugin_registry
from services.rescheduler.round import PLANNED, Policy, RoundPlan
from services.rescheduler.service import build_policy
from services.rescheduler.view import build_view
from store import Store
from tests.e2e.conftest import Cluster, wait_until
from tests.e2e.test_rescheduler import (
    GPU_NODES,
    TWO_NODES,
    cordon,
    gpu_job,
    original_case,
    spread_gpu_pods,
)
from tests.factories import job as make_job

pytestmark = pytest.mark.e2e

THREE_CPU = 3000
ALIVE = (pb.POD_PENDING, pb.POD_BOUND, pb.POD_RUNNING)
FOUR_CPU_NODES = TWO_NODES  # hollow nodes of 4 CPUs, however many


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def budget(job: str, max_unavailable: int) -> pb.DisruptionBudget:
    out = pb.DisruptionBudget(metadata=pb.ObjectMeta(name=job))
    out.spec.job = job
    out.spec.max_unavailable = max_unavailable
    return out


def batched_policies(tmp_path: Path, **settings: object) -> tuple[str, tuple[str, ...]]:
    """The rescheduler's args for the built-in policies without the DisruptionBudget check
    (see the module docstring), from a --config file in ``tmp_path``, with service
    ``settings``."""
    text = (resources.files("services.rescheduler") / "default_policies.yaml").read_text()
    policies = yaml.safe_load(text)["policies"]
    for policy in policies:
        policy["checks"] = [c for c in policy["checks"] if c != "DisruptionBudget"]
    path = tmp_path / "batched-policies.yaml"
    path.write_text(yaml.safe_dump({**settings, "policies": policies}))
    return ("rescheduler", ("--config", str(path)))


def apply_budgets(cluster: Cluster, budgets: Sequence[pb.DisruptionBudget]) -> None:
    result = cluster.client.apply([("DisruptionBudget", b) for b in budgets])
    assert all(r.action == "created" for r in result.results), result


def pods(cluster: Cluster) -> list[pb.Pod]:
    return [p for p in cluster.client.list("Pod") if isinstance(p, pb.Pod)]


def pod(cluster: Cluster, name: str) -> pb.Pod:
    found = cluster.client.get("Pod", name)
    assert isinstance(found, pb.Pod)
    return found


def movements(cluster: Cluster) -> list[pb.Movement]:
    return [m for m in cluster.client.list("Movement") if isinstance(m, pb.Movement)]


def running_on(cluster: Cluster, name: str) -> str:
    """The node ``name`` runs on, "" while it does not run."""
    p = pod(cluster, name)
    return p.spec.node_name if p.status.phase == pb.POD_RUNNING else ""


def replacements_of(all_pods: Sequence[pb.Pod]) -> dict[str, pb.Pod]:
    """Evicted pod -> the pod that replaces it."""
    return {
        p.metadata.annotations[REPLACES_ANNOTATION]: p
        for p in all_pods
        if REPLACES_ANNOTATION in p.metadata.annotations
    }


def rescheduled(all_pods: Sequence[pb.Pod]) -> list[pb.Pod]:
    return [
        p for p in all_pods if p.status.phase == pb.POD_FAILED and p.status.reason == RESCHEDULED
    ]


def assert_every_evicted_pod_replaced(cluster: Cluster) -> list[pb.Pod]:
    """Every pod evicted as Rescheduled has a replacement that is pending, bound or running.
    Returns the evicted pods."""
    all_pods = pods(cluster)
    evicted = rescheduled(all_pods)
    by_original = replacements_of(all_pods)
    for p in evicted:
        name = p.metadata.name
        assert name in by_original, f"{name} was evicted without a replacement"
        assert by_original[name].status.phase in ALIVE, (name, by_original[name].status)
    return evicted


def make_policy(name: str, failure_ratio_threshold: float = 0.2) -> Policy:
    """A policy for the in-process executor (its plugins only name the Movement's creator)."""
    registry = new_plugin_registry()
    text = (
        f"policies:\n  - name: {name}\n    detector: {{name: BinPacking}}\n"
        f"    algorithm: {{name: BinPacking}}\n"
        f"    failure_ratio_threshold: {failure_ratio_threshold}\n"
    )
    [config] = load_policies(text, registry, registry, new_check_registry())
    return build_policy(config)


async def current_view(store: Store) -> ClusterView:
    nodes, _ = await store.list_all(pb.Node)
    all_pods, _ = await store.list_all(pb.Pod)
    jobs, _ = await store.list_all(pb.Job)
    budgets, revision = await store.list_all(pb.DisruptionBudget)
    return build_view(nodes, all_pods, jobs, budgets, hard_rules(), revision=revision)


class HookedExecutor(RoundExecutor):
    """The real executor, with a test's step run once between the first Movement's
    acknowledgement and its eviction (to change the cluster "meanwhile", deterministically)."""

    def __init__(self, *args: Any, after_acks: Callable[[], None] | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.after_acks = after_acks

    async def _wait_for_acks(self, name: str) -> None:
        await super()._wait_for_acks(name)
        hook, self.after_acks = self.after_acks, None
        if hook is not None:
            await asyncio.to_thread(hook)


def execute(
    cluster: Cluster,
    policy: Policy,
    batches: list[list[Move]],
    after_acks: Callable[[], None] | None = None,
    *,
    reserve_timeout_seconds: float = 60,
) -> RoundPlan:
    """Run ``batches`` through the real executor, in this process, against ``cluster``'s store
    and Binder, with generous timeouts (the outcome decides, not the clock)."""

    service_identity = tls.load(cluster.home.tls_dir, "rescheduler")  # who evicts in rounds

    async def go(store: Store) -> RoundPlan:
        view = await current_view(store)
        plan = RoundPlan(
            policy.name,
            generation=int(time.time() * 1000),
            dry_run=False,
            trigger="test",
            outcome=PLANNED,
            batches=batches,
        )
        executor = HookedExecutor(
            store,
            # As the rescheduler does: the cluster's service identity (mutual TLS).
            BinderEvictor(
                store,
                "rescheduler/test",  # who it is: the Binder refuses a requester not its own
                lambda address, options: tls.aio_channel(address, service_identity, options),
            ),
            paused=lambda: False,
            config=ExecutionConfig(
                ack_timeout_seconds=60,
                budget_wait_seconds=60,
                landing_timeout_seconds=60,
                reserve_timeout_seconds=reserve_timeout_seconds,
            ),
            after_acks=after_acks,
        )
        await executor.execute(policy, plan, view)
        return plan

    plan: RoundPlan = cluster.run_store(go)
    return plan


def wait_budgets_current(cluster: Cluster, jobs: Sequence[str], allowed: int) -> None:
    """Until the budget controller has counted every job's pods (its status says how many may
    go now)."""

    def current() -> bool:
        for job in jobs:
            b = cluster.client.get("DisruptionBudget", job)
            assert isinstance(b, pb.DisruptionBudget)
            if b.status.disruptions_allowed != allowed:
                return False
        return True

    wait_until(current, 60, f"budgets of {', '.join(jobs)} allowing {allowed}")


def kill9(pid: int | None) -> None:
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(pid) or _zombie(pid), 30, f"pid {pid} gone")


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def restart(cluster: Cluster, name: str) -> None:
    cluster.start_again(name)


# --------------------------------------------------------------------------------------------
# 1. A swap
# --------------------------------------------------------------------------------------------


def test_a_swap_is_one_movement_and_both_replacements_land_on_their_recommendations(
    make_cluster: Callable[..., Cluster],
) -> None:
    """Two 3-CPU pods on two 4-CPU nodes exchange nodes: neither target has room until the other
    pod has left, so both go in one batch (one Movement, one Evict) and each replacement must
    use the room its partner vacated — not a third, empty node, nor its own old node, which
    score as well. Executed in process with a hand-made plan."""
    cluster = make_cluster(schedulers=2, binders=1, hollow_nodes=3, service_args=(FOUR_CPU_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 3, 60, "3 nodes")
    n1, n2, n3 = sorted(n.metadata.name for n in cluster.client.list("Node"))  # type: ignore[attr-defined]
    cordon(cluster, n2, True)
    cordon(cluster, n3, True)
    cluster.client.submit([make_job("a", cpu=THREE_CPU)])
    wait_until(lambda: running_on(cluster, "a-0") == n1, 60, "a-0 running on the first node")
    cordon(cluster, n2, False)
    cluster.client.submit([make_job("b", cpu=THREE_CPU)])
    wait_until(lambda: running_on(cluster, "b-0") == n2, 60, "b-0 running on the second node")
    cordon(cluster, n3, False)
    apply_budgets(cluster, [budget("a", 1), budget("b", 1)])
    wait_budgets_current(cluster, ["a", "b"], 1)

    swap = [Move("a-0", "a", n1, n2), Move("b-0", "b", n2, n1)]
    plan = execute(cluster, make_policy("swap"), [swap])

    assert plan.evicted == 2, plan.message
    [movement] = movements(cluster)
    assert plan.movements == [movement.metadata.name]
    assert sorted(t.pod for t in movement.spec.deleted_tasks) == ["a-0", "b-0"]
    assert sorted(movement.status.notified_schedulers) == ["scheduler-0", "scheduler-1"]
    for name in ("a-0", "b-0"):
        p = pod(cluster, name)
        assert (p.status.phase, p.status.reason) == (pb.POD_FAILED, RESCHEDULED)
    replaced = replacements_of(pods(cluster))
    a_new, b_new = replaced["a-0"].metadata.name, replaced["b-0"].metadata.name
    wait_until(
        lambda: running_on(cluster, a_new) and running_on(cluster, b_new),
        60,
        "both replacements running",
    )
    # Each on its recommended node: the room its partner vacated.
    landed_on = (running_on(cluster, a_new), running_on(cluster, b_new))
    assert landed_on == (n2, n1), (landed_on, cluster.client.get("Movement", plan.movements[0]))

    def recorded() -> pb.Movement | None:
        m = cluster.client.get("Movement", movement.metadata.name)
        assert isinstance(m, pb.Movement)
        actual = sum(len(r.actual_pods) for o in m.status.owners for r in o.recommended_nodes)
        return m if actual == 2 and m.status.phase == shared.DONE else None

    done = wait_until(recorded, 60, "both replacements recorded as actual")
    landed = {
        (o.job, r.node, t.pod)
        for o in done.status.owners
        for r in o.recommended_nodes
        for t in r.actual_pods
    }
    assert landed == {("a", n2, a_new), ("b", n1, b_new)}
    assert not any(o.mismatched_tasks for o in done.status.owners)


# --------------------------------------------------------------------------------------------
# 2. Mismatched, and the failure ratio
# --------------------------------------------------------------------------------------------


def test_a_replacement_off_its_recommendation_is_mismatched_and_stops_the_round(
    make_cluster: Callable[..., Cluster],
) -> None:
    """A two-batch plan recommends n1 for both 3-CPU pods of `web`. After the first Movement is
    acknowledged and before its eviction, n1 is cordoned (its room is reserved for the
    replacement, but a cordoned node takes no pod). The first replacement lands elsewhere and
    is recorded as mismatched; the failure ratio (1.0 > 0.2) stops the round: the second
    batch's pod stays where it is, untouched. In process, with a hand-made plan. (n1 *filled*
    meanwhile by another job cannot happen any more: the room is reserved first, see
    ``test_a_job_submitted_before_the_eviction_cannot_take_a_moves_reserved_room``.)"""
    cluster = make_cluster(schedulers=2, binders=1, hollow_nodes=3, service_args=(FOUR_CPU_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 3, 60, "3 nodes")
    n1, n2, n3 = sorted(n.metadata.name for n in cluster.client.list("Node"))  # type: ignore[attr-defined]
    cordon(cluster, n1, True)
    cluster.client.submit([make_job("web", replicas=2, cpu=THREE_CPU)])
    # 3 CPU of 4 each: one pod per node, on the two uncordoned ones.
    wait_until(
        lambda: sorted(running_on(cluster, f"web-{i}") for i in range(2)) == [n2, n3],
        60,
        "web-0 and web-1 running on the second and third nodes",
    )
    cordon(cluster, n1, False)
    apply_budgets(cluster, [budget("web", 1)])
    wait_budgets_current(cluster, ["web"], 1)
    first, second = (pod(cluster, f"web-{i}") for i in range(2))

    def change_n1() -> None:
        cordon(cluster, n1, True)

    # The plan a round makes from this state: both to n1 (the budget forces two batches).
    batches = [
        [Move("web-0", "web", first.spec.node_name, n1)],
        [Move("web-1", "web", second.spec.node_name, n1)],
    ]
    policy = make_policy("pack", failure_ratio_threshold=0.2)
    plan = execute(cluster, policy, batches, after_acks=change_n1)

    assert plan.evicted == 1, plan.message
    assert "failure ratio 1.00 > 0.2" in plan.message and "stopped at batch 2 of 2" in plan.message
    [movement] = movements(cluster)
    assert plan.movements == [movement.metadata.name]
    assert movement.status.phase == shared.DONE
    [owner] = movement.status.owners
    [replacement] = owner.mismatched_tasks
    assert replacement.pod == replacements_of(pods(cluster))["web-0"].metadata.name
    assert replacement.node != n1
    assert not any(r.actual_pods for r in owner.recommended_nodes)
    # The second batch was never evicted: web-1 is the same pod, running where it was.
    stayed = pod(cluster, "web-1")
    assert stayed.metadata.uid == second.metadata.uid
    assert (stayed.status.phase, stayed.spec.node_name) == (pb.POD_RUNNING, second.spec.node_name)
    assert rescheduled(pods(cluster)) == [pod(cluster, "web-0")]
    wait_until(lambda: running_on(cluster, replacement.pod), 60, "the replacement running")
    described = cluster.godel("describe", "movement", movement.metadata.name).stdout
    assert replacement.pod in described
    # The room reserved on n1 for the replacement that went elsewhere is released with the
    # batch, not left held until its TTL.
    assert not cluster.client.list("Reservation")


def test_a_job_submitted_before_the_eviction_cannot_take_a_moves_reserved_room(
    make_cluster: Callable[..., Cluster],
) -> None:
    """Reserve-first: a one-move plan sends web-0 (3 CPU) to n1 (4 CPU). After its Movement is
    acknowledged and before the eviction, another job's 2-CPU pod is submitted while n1 is the
    only open node: without the reservation it would take n1 (the replacement would then land
    elsewhere, mismatched); with it, n1's room is held for web-0's replacement, so the filler
    is unschedulable there and runs elsewhere once the other nodes open. The replacement lands
    on n1, consuming the reservation: 0 mismatched, no reservation left. In process, with a
    hand-made plan."""
    cluster = make_cluster(schedulers=2, binders=1, hollow_nodes=3, service_args=(FOUR_CPU_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 3, 60, "3 nodes")
    n1, n2, n3 = sorted(n.metadata.name for n in cluster.client.list("Node"))  # type: ignore[attr-defined]
    cordon(cluster, n1, True)
    cluster.client.submit([make_job("web", cpu=THREE_CPU)])
    wait_until(lambda: running_on(cluster, "web-0") in (n2, n3), 60, "web-0 running off n1")
    cordon(cluster, n1, False)
    apply_budgets(cluster, [budget("web", 1)])
    wait_budgets_current(cluster, ["web"], 1)
    source = pod(cluster, "web-0").spec.node_name

    def submit_a_filler() -> None:
        [held] = [r for r in cluster.client.list("Reservation") if isinstance(r, pb.Reservation)]
        assert (held.status.phase, held.status.node) == (pb.RESERVATION_RESERVED, n1)
        assert (held.spec.owner.job, held.spec.owner.index) == ("web", 0)
        for node in (n2, n3):
            cordon(cluster, node, True)
        cluster.client.submit([make_job("filler", cpu=2000)])

        def tried() -> bool:
            filler = pod(cluster, "filler-0")
            return filler.status.HasField("unschedulable") or bool(filler.spec.node_name)

        wait_until(tried, 60, "the filler tried while only n1 is open")
        assert not pod(cluster, "filler-0").spec.node_name, "the filler took the reserved room"
        for node in (n2, n3):
            cordon(cluster, node, False)

    plan = execute(
        cluster, make_policy("pack"), [[Move("web-0", "web", source, n1)]], submit_a_filler
    )

    assert plan.evicted == 1 and plan.unreserved == 0, plan.message
    replacement = replacements_of(pods(cluster))["web-0"].metadata.name
    wait_until(lambda: running_on(cluster, replacement), 60, "the replacement running")
    assert running_on(cluster, replacement) == n1
    wait_until(lambda: running_on(cluster, "filler-0"), 60, "the filler running")
    assert running_on(cluster, "filler-0") != n1

    def recorded() -> pb.Movement | None:
        m = cluster.client.get("Movement", plan.movements[0])
        assert isinstance(m, pb.Movement)
        actual = sum(len(r.actual_pods) for o in m.status.owners for r in o.recommended_nodes)
        return m if actual == 1 and m.status.phase == shared.DONE else None

    done = wait_until(recorded, 60, "the replacement recorded as actual")
    assert not any(o.mismatched_tasks for o in done.status.owners)
    assert not cluster.client.list("Reservation")  # consumed by the replacement's bind


def test_a_move_whose_room_cannot_be_reserved_is_dropped_before_anything_is_evicted(
    make_cluster: Callable[..., Cluster],
) -> None:
    """A two-move batch: web-0 to n1, which has the room, and big-0 to n1 as well, which then
    has not (3 CPU each on a 4-CPU node). The Binder reserves the first and leaves the second
    Pending; after the wait the second move is dropped before the eviction — big-0 stays
    running where it was, untouched — and counted in the plan. In process, hand-made plan."""
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=3, service_args=(FOUR_CPU_NODES,))
    wait_until(lambda: len(cluster.client.list("Node")) == 3, 60, "3 nodes")
    n1, n2, n3 = sorted(n.metadata.name for n in cluster.client.list("Node"))  # type: ignore[attr-defined]
    cordon(cluster, n1, True)
    cluster.client.submit([make_job("web", cpu=THREE_CPU), make_job("big", cpu=THREE_CPU)])
    wait_until(
        lambda: sorted((running_on(cluster, "web-0"), running_on(cluster, "big-0"))) == [n2, n3],
        60,
        "web-0 and big-0 running on n2 and n3",
    )
    cordon(cluster, n1, False)
    apply_budgets(cluster, [budget("web", 1), budget("big", 1)])
    wait_budgets_current(cluster, ["web", "big"], 1)
    web, big = pod(cluster, "web-0"), pod(cluster, "big-0")
    batch = [
        Move("web-0", "web", web.spec.node_name, n1),
        Move("big-0", "big", big.spec.node_name, n1),
    ]
    plan = execute(cluster, make_policy("pack"), [batch], reserve_timeout_seconds=3)

    assert plan.unreserved == 1 and plan.evicted == 1, plan.message
    [(dropped, why)] = plan.rejected
    assert dropped.pod == "big-0" and f"its room on {n1} could not be reserved" in why, why
    stayed = pod(cluster, "big-0")
    assert stayed.metadata.uid == big.metadata.uid
    assert (stayed.status.phase, stayed.spec.node_name) == (pb.POD_RUNNING, big.spec.node_name)
    [movement] = movements(cluster)
    assert [t.pod for t in movement.spec.deleted_tasks] == ["web-0"]
    replacement = replacements_of(pods(cluster))["web-0"].metadata.name
    wait_until(lambda: running_on(cluster, replacement), 60, "the replacement running")
    assert running_on(cluster, replacement) == n1
    assert not cluster.client.list("Reservation")  # one consumed, the refused one released


# --------------------------------------------------------------------------------------------
# 3. GPU defragmentation end to end
# --------------------------------------------------------------------------------------------


class HealthSampler:
    """Every 200 ms, from a consistent list of the store: per job, its pods that are bound or
    running (not being deleted); keeps each job's minimum."""

    def __init__(self, cluster: Cluster, jobs: Sequence[str]) -> None:
        self.cluster = cluster
        self.lowest = dict.fromkeys(jobs, sys.maxsize)
        self.samples = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-sampler", daemon=True)

    def __enter__(self) -> HealthSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the sampler did not stop"

    def _run(self) -> None:
        try:
            asyncio.run(self._sample())
        except BaseException as exc:  # reported by the test
            self.error = exc

    async def _sample(self) -> None:
        store = await Store.connect(self.cluster.state.store_url)
        try:
            while not self._stop.is_set():
                all_pods, _ = await store.list_all(pb.Pod)
                healthy = dict.fromkeys(self.lowest, 0)
                for p in all_pods:
                    if (
                        p.spec.job in healthy
                        and p.status.phase in (pb.POD_BOUND, pb.POD_RUNNING)
                        and not p.metadata.deletion_timestamp_ms
                    ):
                        healthy[p.spec.job] += 1
                for job, count in healthy.items():
                    self.lowest[job] = min(self.lowest[job], count)
                self.samples += 1
                await asyncio.sleep(0.2)
        finally:
            await store.close()


def whole_free_nodes(cluster: Cluster) -> int:
    used = {p.spec.node_name for p in pods(cluster) if p.spec.node_name and p.status.phase in ALIVE}
    nodes = [n for n in cluster.client.list("Node") if isinstance(n, pb.Node)]
    return sum(1 for n in nodes if n.metadata.name not in used)


def test_gpu_defragmentation_frees_the_predicted_nodes_within_every_budget(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    replicas, jobs = 10, [f"train-{i}" for i in range(10)]
    cluster = make_cluster(
        schedulers=2,
        binders=1,
        hollow_nodes=50,
        service_args=(GPU_NODES, batched_policies(tmp_path), spread_gpu_pods(tmp_path)),
    )
    wait_until(lambda: len(cluster.client.list("Node")) == 50, 120, "50 nodes registered")
    # 100 one-GPU pods, spread about 2 per node by least-allocated scoring: no node is whole.
    cluster.client.submit([gpu_job(job, replicas) for job in jobs])
    wait_until(
        lambda: sum(1 for p in pods(cluster) if p.status.phase == pb.POD_RUNNING) == 100,
        180,
        "every pod running",
    )
    apply_budgets(cluster, [budget(job, 1) for job in jobs])
    wait_budgets_current(cluster, jobs, 1)
    fragmented = whole_free_nodes(cluster)

    with ReschedulerClient(cluster.state.address_of("rescheduler"), timeout=600) as client:
        [dry] = client.trigger("gpu-defrag", dry_run=True).plans
        assert dry.outcome == PLANNED, dry.message
        predicted = dry.after.whole_free_gpu_nodes
        assert predicted >= fragmented + 10, (fragmented, predicted)
        # A budget of 1 per job: at most one pod of each job per batch.
        assert dry.batches >= 2
        assert not movements(cluster)

        with HealthSampler(cluster, jobs) as sampler:
            [plan] = client.trigger("gpu-defrag").plans
        assert sampler.error is None, sampler.error

    assert plan.outcome == PLANNED, plan.message
    assert plan.evicted == len(plan.moves) > 0, plan.message
    assert len(plan.movements) == plan.batches, plan.message
    assert sampler.samples >= 5
    # Never fewer bound+running pods than the budget allows (replicas - maxUnavailable).
    assert all(low >= replicas - 1 for low in sampler.lowest.values()), sampler.lowest

    wait_until(
        lambda: sum(1 for p in pods(cluster) if p.status.phase == pb.POD_RUNNING) == 100,
        120,
        "every job whole and running again",
    )
    assert_every_evicted_pod_replaced(cluster)
    freed = whole_free_nodes(cluster)
    assert freed >= predicted - 1, (freed, predicted, plan.message)
    assert all(m.status.phase == shared.DONE for m in movements(cluster))


# --------------------------------------------------------------------------------------------
# 4. kill -9 of the rescheduler mid-round
# --------------------------------------------------------------------------------------------


def spread_web(cluster: Cluster, nodes: int) -> None:
    """`web`, one 1-CPU pod per 4-CPU node (least-allocated scoring spreads them), a budget of
    one: packing them takes a batch per move."""
    wait_until(lambda: len(cluster.client.list("Node")) == nodes, 60, f"{nodes} nodes")
    cluster.client.submit([make_job("web", replicas=nodes, cpu=1000)])
    wait_until(
        lambda: sum(1 for p in pods(cluster) if p.status.phase == pb.POD_RUNNING) == nodes,
        60,
        "every web pod running",
    )
    apply_budgets(cluster, [budget("web", 1)])
    wait_budgets_current(cluster, ["web"], 1)


@pytest.mark.parametrize("killed", ["after the first eviction", "while acknowledging"])
def test_rescheduler_kill9_mid_round_leaves_no_pod_unreplaced_and_restarts_clean(
    make_cluster: Callable[..., Cluster], killed: str, tmp_path: Path
) -> None:
    """A 7-batch round (a budget of 1, one pod per batch) is killed -9 after its first eviction,
    or while its first Movement waits for acknowledgements (held there by a third shard killed
    just before: it counts as live until its heartbeat lapses)."""
    acknowledging = killed == "while acknowledging"
    cluster = make_cluster(
        schedulers=3 if acknowledging else 2,
        binders=1,
        hollow_nodes=10,
        service_args=(FOUR_CPU_NODES, batched_policies(tmp_path, reservation_ttl_seconds=5)),
    )
    spread_web(cluster, 10)
    with ReschedulerClient(cluster.state.address_of("rescheduler")) as client:
        [dry] = client.trigger("binpacking", dry_run=True).plans
    assert dry.outcome == PLANNED and dry.batches >= 3, dry.message
    if acknowledging:
        kill9(cluster.component("scheduler-2").pid)

    # The round runs in `godel reschedule` (it blocks until the round ends, or fails when the
    # rescheduler dies).
    trigger = subprocess.Popen(
        [sys.executable, "-m", "godel", "reschedule", "binpacking"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GODEL_HOME": str(cluster.home.path)},
    )
    try:
        if acknowledging:
            wait_until(lambda: movements(cluster), 60, "the first Movement")
        else:
            wait_until(lambda: rescheduled(pods(cluster)), 60, "the first batch evicted")
        kill9(cluster.component("rescheduler").pid)
        trigger.communicate(timeout=60)
    finally:
        if trigger.poll() is None:
            trigger.kill()
            trigger.wait()
    assert trigger.returncode != 0, "the round finished before the kill"
    stale = movements(cluster)
    assert 1 <= len(stale) < dry.batches, [m.metadata.name for m in stale]

    # No pod is left evicted without a replacement.
    evicted = assert_every_evicted_pod_replaced(cluster)
    if acknowledging:
        # Killed before its eviction: nothing evicted, the Movement left behind unacknowledged.
        assert not evicted
        [left] = stale
        assert left.status.phase == shared.ACKNOWLEDGING
        assert "scheduler-2" not in left.status.notified_schedulers
    else:
        assert evicted and len(evicted) < len(dry.moves)

    # The killed round's reservations are not leaked: consumed by replacements, or released by
    # the dispatcher's controller once their (5 s) TTL ran out, with no rescheduler running.
    killed_round = f"move-{stale[0].spec.generation}-"

    def killed_rounds() -> list[pb.Reservation]:
        return [
            r
            for r in cluster.client.list("Reservation")
            if isinstance(r, pb.Reservation) and r.metadata.name.startswith(killed_round)
        ]

    if acknowledging:
        # Reserved before the Movement was created: an orphan now, holding room on its node.
        orphans = killed_rounds()
        assert orphans and all(r.status.phase == pb.RESERVATION_RESERVED for r in orphans)
    wait_until(lambda: not killed_rounds(), 60, "the killed round's reservations released")

    # An operator starts it again: the crashed round's Movements go at start-up.
    restart(cluster, "rescheduler")
    wait_until(lambda: not movements(cluster), 30, "the stale Movements deleted on start")
    wait_until(
        lambda: sum(1 for p in pods(cluster) if p.status.phase == pb.POD_RUNNING) == 10,
        60,
        "the killed round's replacements running",
    )
    wait_budgets_current(cluster, ["web"], 1)

    # A new round starts clean: its own Movements only, and it finishes the packing.
    with ReschedulerClient(cluster.state.address_of("rescheduler")) as client:
        [plan] = client.trigger("binpacking").plans
    assert plan.outcome == PLANNED and plan.evicted == len(plan.moves) > 0, plan.message
    fresh = movements(cluster)
    assert sorted(m.metadata.name for m in fresh) == sorted(plan.movements)
    assert all(m.spec.generation == plan.generation for m in fresh)
    assert all(m.status.phase == shared.DONE for m in fresh), [m.status for m in fresh]
    assert not {m.metadata.name for m in fresh} & {m.metadata.name for m in stale}
    assert_every_evicted_pod_replaced(cluster)


# --------------------------------------------------------------------------------------------
# 5. A shard that dies before acknowledging
# --------------------------------------------------------------------------------------------


def test_a_shard_killed_before_acknowledging_does_not_block_the_round(
    make_cluster: Callable[..., Cluster],
) -> None:
    """scheduler-1 dies just before the round: its SchedulerInstance stays until its heartbeat
    lapses (the executor's 10 s grace), then it is dropped from the shards that must acknowledge.
    The ack timeout is 120 s: had the round waited for the dead shard, it would have been stopped
    at that timeout with its Movement Stopped, not Done."""
    cluster = make_cluster(
        schedulers=2,
        binders=1,
        hollow_nodes=2,
        service_args=(FOUR_CPU_NODES, ("rescheduler", ("--ack-timeout-seconds", "120"))),
    )
    n1, _ = original_case(cluster)
    instances = {s.metadata.name for s in cluster.client.list("SchedulerInstance")}  # type: ignore[attr-defined]
    assert instances == {"scheduler-0", "scheduler-1"}
    kill9(cluster.component("scheduler-1").pid)

    with ReschedulerClient(cluster.state.address_of("rescheduler")) as client:
        [plan] = client.trigger("binpacking").plans
    assert plan.outcome == PLANNED and plan.evicted == 1, plan.message
    [movement] = movements(cluster)
    assert movement.status.phase == shared.DONE, movement.status
    assert list(movement.status.notified_schedulers) == ["scheduler-0"]
    replacement = replacements_of(pods(cluster))["web-0"].metadata.name
    wait_until(lambda: running_on(cluster, replacement) == n1, 60, "the replacement on n1")
    assert pod(cluster, "web-0").status.reason == RESCHEDULED
