"""Metrics scraped from a live cluster of real processes after a job, and `godel status`
showing the binder leader, every service's metrics endpoint and the dashboard URL."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ROOT, Cluster, wait_until
from tests.e2e.test_pipeline import bound, job_yaml

pytestmark = pytest.mark.e2e

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(address: str) -> Samples:
    """Every sample at http://ADDRESS/metrics as (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: list[Samples], name: str, **labels: str) -> float:
    return sum(value(s, name, **labels) for s in samples)


def test_metrics_move_after_a_job_and_status_shows_where_they_are(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=2, binders=2, hollow_nodes=8, dashboard=True)
    wait_until(lambda: len(cluster.client.list("Node")) == 8, what="8 nodes registered")
    services = [c for c in cluster.state.components if c.kind != "store"]
    assert all(c.metrics_address.startswith("127.0.0.1:") for c in services)

    cluster.godel("apply", "-f", str(ROOT / "examples" / "queue.yaml"))  # queue "research"
    cluster.godel(
        "apply", "-f", "-", stdin=job_yaml("metered", 6, 6, "1", extra="  queue: research\n")
    )
    wait_until(lambda: bound(cluster, "metered") == 6, what="all 6 pods bound")

    def of(kind: str) -> list[Samples]:
        return [scrape(c.metrics_address) for c in services if c.kind == kind]

    # Counters moved and histograms have samples, in the services that did the work.
    shards = of("scheduler")
    assert total(shards, "godel_scheduler_pods_scheduled_total") >= 6
    assert total(shards, "godel_scheduler_scheduling_duration_seconds_count") >= 1
    assert total(shards, "godel_scheduler_scheduling_duration_seconds_sum") > 0

    def leading_binder() -> str | None:
        flags = {
            c.name: value(scrape(c.metrics_address), "godel_binder_is_leader")
            for c in services
            if c.kind == "binder"
        }
        leaders = [name for name, flag in flags.items() if flag == 1]
        return leaders[0] if len(flags) == 2 and len(leaders) == 1 else None

    leader_name = wait_until(leading_binder, what="exactly one binder reporting leadership")
    leader = scrape(cluster.component(leader_name).metrics_address)
    assert value(leader, "godel_binder_pods_bound_total") >= 6
    assert value(leader, "godel_binder_submit_to_bound_seconds_count") >= 6
    assert value(leader, "godel_binder_lease_epoch") >= 1

    # Gauges sampled from the dispatcher's state: the queue it used and both shards' credits.
    def dispatcher_gauges() -> Samples | None:
        [samples] = of("dispatcher")
        shards_seen = {
            dict(labels)["shard"]
            for (name, labels) in samples
            if name == "godel_dispatcher_shard_credits"
        }
        queued = ("godel_dispatcher_queue_pending_pods", (("queue", "research"),))
        return (
            samples if shards_seen == {"scheduler-0", "scheduler-1"} and queued in samples else None
        )

    dispatcher = wait_until(dispatcher_gauges, what="credit gauges and the queue's depth")
    # Everything bound: the queue is known and empty.
    assert value(dispatcher, "godel_dispatcher_queue_pending_pods", queue="research") == 0

    # The node agent's gauges, and a rescheduling round (a dry run) counted by outcome.
    [agent] = [c for c in services if c.kind == "nodeagent"]
    wait_until(
        lambda: value(scrape(agent.metrics_address), "godel_nodeagent_nodes") == 8,
        what="the agent's node count",
    )
    cluster.godel("reschedule", "binpacking", "--dry-run")
    [rescheduler] = of("rescheduler")
    rounds = [
        v
        for (name, labels), v in rescheduler.items()
        if name == "godel_rescheduler_rounds_total"
        and dict(labels)["policy"] == "binpacking"
        and dict(labels)["dry_run"] == "true"
    ]
    assert sum(rounds) == 1

    # The store's round trips are timed in every service, and informers report their lag.
    for component in services:
        samples = scrape(component.metrics_address)
        reads = value(samples, "godel_store_round_trip_seconds_count", operation="read")
        assert reads > 0, component.name
        # Serving, each process froze its caches out of the collector's sight, after a full
        # collection that was timed.
        assert value(samples, "godel_gc_frozen_objects") > 0, component.name
        assert value(samples, "godel_gc_pause_seconds_count", generation="2") >= 1, component.name
    assert any(name == "godel_store_informer_lag_seconds" for name, _ in dispatcher)

    # `godel status`: the leader (the one whose metrics say so), every metrics URL, the dashboard.
    status = cluster.godel("status").stdout
    match = re.search(r"binder leader: (binder-\d) at (\S+) \(epoch (\d+)\)", status)
    assert match is not None, status
    assert match.group(1) == leader_name
    assert match.group(2) == cluster.component(leader_name).address
    assert int(match.group(3)) == value(leader, "godel_binder_lease_epoch")
    for component in services:
        assert f"http://{component.metrics_address}/metrics" in status, component.name
    dashboard = cluster.component("dashboard")
    assert dashboard.web_url and f"dashboard: {dashboard.web_url}" in status
