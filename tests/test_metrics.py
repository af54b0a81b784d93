"""The metrics endpoint every service gets from the runtime, and the store's round-trip time:
scraped over real HTTP from a service run in-process against the real store server."""

from __future__ import annotations

import asyncio
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from godel.netutil import free_port
from services.runtime import Service, ServiceConfig, ServiceHost
from services.runtime.metrics import SampledGauge
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


async def _scrape_until(address: str, key: str, ok: Any = None) -> dict[str, float]:
    for _ in range(200):
        samples = await asyncio.to_thread(scrape, address)
        if key in samples and (ok is None or ok(samples)):
            return samples
        await asyncio.sleep(0.05)
    raise AssertionError(f"{key} never appeared at {address}")
