"""The metrics endpoint every service gets from the runtime, and the store's round-trip time:
scraped over real HTTP from a service run in-process against the real store server; and what a
Binder batch counts. (Metrics of a live cluster after a job: tests/e2e/test_metrics.py.)"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar
from wsgiref.simple_server import WSGIServer, make_server

import grpc
import pytest
from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.parser import text_string_to_metric_families

from foundation.netutil import free_port
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services import metrics
from services.runtime import Service, ServiceConfig, ServiceHost
from services.runtime.metrics import MetricsServer, SampledGauge
from store import Store

SAMPLED = SampledGauge("godel_test_sampled_items", "A gauge the test service samples", ("kind",))


def scrape(address: str) -> dict[str, float]:
    """Every sample of the endpoint as ``name{label=value,...}`` -> value."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


class Sampling(Service[ServiceConfig]):
    component = "sampling"
    config_class = ServiceConfig
    items: ClassVar[dict[str, int]] = {"a": 2, "b": 5}

    def add_servicers(self, server: grpc.aio.Server) -> None:
        pass

    def sample_metrics(self) -> None:
        SAMPLED.publish({(kind,): count for kind, count in self.items.items()})


@pytest.fixture
def service_config(store_url: str, cluster_name: str, tmp_path: Path) -> ServiceConfig:
    return ServiceConfig(
        name="metrics-1",
        port=free_port(),
        store_url=store_url,
        cluster=cluster_name,
        grace_seconds=0.5,
        home=tmp_path,
        metrics_sample_seconds=0.05,
        insecure=True,  # plaintext in-process; tests/e2e/test_tls.py covers TLS
    )


async def test_every_service_serves_its_metrics_on_loopback(service_config: ServiceConfig) -> None:
    async with ServiceHost(Sampling, service_config) as host:
        service = host.service
        assert service is not None
        host_part, port = service.metrics_address.rsplit(":", 1)
        assert host_part == "127.0.0.1" and int(port) > 0
        samples = await _scrape_until(service.metrics_address, "godel_test_sampled_items{kind=b}")
        assert samples["godel_test_sampled_items{kind=a}"] == 2
        assert samples["godel_test_sampled_items{kind=b}"] == 5

        # A label that is gone from the service's state is gone from the next scrape.
        Sampling.items = {"a": 3}
        samples = await _scrape_until(
            service.metrics_address,
            "godel_test_sampled_items{kind=a}",
            lambda s: s["godel_test_sampled_items{kind=a}"] == 3,
        )
        assert "godel_test_sampled_items{kind=b}" not in samples
        address = service.metrics_address
    with pytest.raises(OSError):
        scrape(address)  # stopped with the service


async def test_a_step_that_holds_the_event_loop_shows_as_its_lag(
    service_config: ServiceConfig,
) -> None:
    """Every service runs the loop-lag probe: a step that keeps the loop for 400 ms of CPU
    without an await is the greatest stall its endpoint reports, in wall time and in the loop
    thread's own CPU time, and counted in the lag histogram (at least 300 ms of it: on an idle
    loop the probe sleeps 100 ms at a time)."""
    async with ServiceHost(Sampling, service_config) as host:
        service = host.service
        assert service is not None
        await _scrape_until(service.metrics_address, "godel_event_loop_lag_max_seconds{}")
        over_quarter = _sample("godel_event_loop_lag_seconds_bucket", le="+Inf") - _sample(
            "godel_event_loop_lag_seconds_bucket", le="0.25"
        )
        _hold_the_loop(0.4)
        samples = await _scrape_until(
            service.metrics_address,
            "godel_event_loop_lag_max_seconds{}",
            lambda s: s["godel_event_loop_lag_max_seconds{}"] >= 0.25,
        )
        assert host.loop_lag.max_seconds >= 0.25
        assert host.loop_lag.held_max_seconds >= 0.25
        assert samples["godel_event_loop_held_max_seconds{}"] >= 0.25
        assert samples["godel_event_loop_lag_seconds_count{}"] > 0
        stalls = _sample("godel_event_loop_lag_seconds_bucket", le="+Inf") - _sample(
            "godel_event_loop_lag_seconds_bucket", le="0.25"
        )
        assert stalls >= over_quarter + 1


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::1"])
def test_a_stop_wakes_the_serving_loop_instead_of_waiting_for_its_poll(host: str) -> None:
    """``serve_forever`` notices a shutdown only when its wait on the socket ends. Served here
    with a wait of an hour, the stop must still end the loop and close the port (the standard
    library's own stop waited out the poll: half a second of every service's stop and of every
    in-process test's teardown)."""
    server = make_server(host, 0, make_wsgi_app(REGISTRY), _Server6 if ":" in host else WSGIServer)
    loop = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 3600}, daemon=True
    )
    loop.start()
    metrics_server = MetricsServer(server, loop, host, "http")
    stopping = threading.Thread(target=metrics_server.stop, daemon=True)
    stopping.start()
    stopping.join(timeout=30)
    assert not stopping.is_alive() and not loop.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(
            ("localhost" if host == "0.0.0.0" else host, metrics_server.port), timeout=5
        )


class _Server6(WSGIServer):
    address_family = socket.AF_INET6


async def test_metrics_port_minus_one_serves_none(service_config: ServiceConfig) -> None:
    async with ServiceHost(Sampling, replace(service_config, metrics_port=-1)) as host:
        assert host.service is not None and host.service.metrics_address == ""


async def test_store_round_trips_are_timed_per_operation(
    service_config: ServiceConfig, store: Store
) -> None:
    async with ServiceHost(Sampling, service_config) as host:
        assert host.service is not None
        address = host.service.metrics_address
        before = scrape(address)
        await store.revision()
        await store.get_lease("nobody")
        after = scrape(address)
    for operation in ("read", "lease"):
        key = f"godel_store_round_trip_seconds_count{{operation={operation}}}"
        assert after[key] >= before.get(key, 0) + 1, operation
        assert after[f"godel_store_round_trip_seconds_sum{{operation={operation}}}"] > 0


def _hold_the_loop(cpu_seconds: float) -> None:
    """A step that computes for ``cpu_seconds`` of its thread's CPU time without an await, as
    a service's long step would (called on its loop)."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


async def _scrape_until(address: str, key: str, ok: Any = None) -> dict[str, float]:
    for _ in range(200):
        samples = await asyncio.to_thread(scrape, address)
        if key in samples and (ok is None or ok(samples)):
            return samples
        await asyncio.sleep(0.05)
    raise AssertionError(f"{key} never appeared at {address}")


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_decided_batch_counts_binds_refusals_by_reason_preemptions_and_latency() -> None:
    batch = ipb.DecisionBatch(
        units=[
            ipb.UnitDecision(
                job="j",
                placements=[
                    ipb.Placement(pod="j-0", node="n1", victims=["low-0", "low-1"]),
                    ipb.Placement(pod="j-1", node="n2", victims=["low-2"]),
                    ipb.Placement(pod="j-2", node="n3"),
                    ipb.Placement(pod="j-3", node="n3"),
                ],
            )
        ]
    )
    verdicts = ipb.VerdictBatch(
        verdicts=[
            ipb.PodVerdict(pod="j-0", code=ipb.BOUND),
            ipb.PodVerdict(pod="j-1", code=ipb.CONFLICT),  # its victim was not evicted
            ipb.PodVerdict(pod="j-2", code=ipb.CONFLICT),
            ipb.PodVerdict(pod="j-3", code=ipb.STALE),
        ]
    )
    bound = pb.Pod(metadata=pb.ObjectMeta(name="j-0", creation_timestamp_ms=10_000))
    bound.status.bound_ms = 12_500
    names = (
        ("godel_binder_pods_bound_total", {}),
        ("godel_binder_conflicts_total", {"reason": "conflict"}),
        ("godel_binder_conflicts_total", {"reason": "stale"}),
        ("godel_binder_conflicts_total", {"reason": "gang_rejected"}),
        ("godel_binder_preemptions_total", {}),
        ("godel_binder_submit_to_bound_seconds_count", {}),
        ("godel_binder_submit_to_bound_seconds_sum", {}),
    )
    before = [_sample(name, **labels) for name, labels in names]
    metrics.record_verdicts(batch, verdicts, [bound], now_ms=99_999)
    moved = [_sample(name, **labels) - b for (name, labels), b in zip(names, before, strict=True)]
    # Approximately: the registry is shared, and the latency sum already holds other tests'
    # observations, so the difference carries their rounding.
    assert moved == pytest.approx([1, 2, 1, 0, 2, 1, 2.5])
