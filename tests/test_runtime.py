"""The service runtime: config precedence and errors, an in-process service's health, reflection and
lifecycle, and real service processes stopped by signals. Real store server, real gRPC."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from foundation.netutil import free_port
from protos.godel.v1 import api_pb2, api_pb2_grpc
from services.runtime import (
    ConfigError,
    Service,
    ServiceConfig,
    ServiceHost,
    StartupError,
    cancel_and_wait,
    load_config,
)
from services.runtime.config import advertised_address
from services.runtime.healthcheck import probe

RESCHEDULER = api_pb2.DESCRIPTOR.services_by_name["Rescheduler"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

# --------------------------------------------------------------------------------------------
# Config: defaults < file < environment < flags
# --------------------------------------------------------------------------------------------

PRECEDENCE_CASES: list[tuple[str, dict[str, Any] | None, dict[str, str], list[str], dict[str, Any]]] = [
    # (case, file, environment, argv, expected fields)
    ("defaults", None, {}, [], {"port": 0, "host": "127.0.0.1", "log_format": "auto"}),
    ("file over defaults", {"port": 7001, "log_level": "debug"}, {}, [], {"port": 7001, "log_level": "debug"}),
    ("env over file", {"port": 7001}, {"GODEL_PORT": "7002"}, [], {"port": 7002}),
    ("flag over env", {"port": 7001}, {"GODEL_PORT": "7002"}, ["--port", "7003"], {"port": 7003}),
    ("flag over file", {"grace_seconds": 9}, {}, ["--grace-seconds", "0.5"], {"grace_seconds": 0.5}),
    ("sources merge per key", {"port": 7001, "cluster": "f"}, {"GODEL_CLUSTER": "e"}, ["--name", "n"],
     {"port": 7001, "cluster": "e", "name": "n"}),
    ("GODEL_REDIS_URL is an alias", None, {"GODEL_REDIS_URL": "redis://a:1/0"}, [],
     {"store_url": "redis://a:1/0"}),
    ("GODEL_STORE_URL wins over the alias", None,
     {"GODEL_REDIS_URL": "redis://a:1/0", "GODEL_STORE_URL": "redis://b:2/0"}, [],
     {"store_url": "redis://b:2/0"}),
    ("alias over file", {"store_url": "redis://f:1/0"}, {"GODEL_REDIS_URL": "redis://e:1/0"}, [],
     {"store_url": "redis://e:1/0"}),
    ("flag over alias", None, {"GODEL_REDIS_URL": "redis://e:1/0"}, ["--store-url", "redis://c:1/0"],
     {"store_url": "redis://c:1/0"}),
    ("YAML int for a float", {"grace_seconds": 3}, {}, [], {"grace_seconds": 3.0}),
    ("strings converted", None, {"GODEL_GRACE_SECONDS": "2.5", "GODEL_HOME": "~/g"}, [],
     {"grace_seconds": 2.5, "home": Path.home() / "g"}),
    ("empty file", {}, {}, [], {"port": 0}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("file", "environ", "argv", "expected"),
    [case[1:] for case in PRECEDENCE_CASES],
    ids=[case[0] for case in PRECEDENCE_CASES],
)
def test_config_precedence(
    tmp_path: Path,
    file: dict[str, Any] | None,
    environ: dict[str, str],
    argv: list[str],
    expected: dict[str, Any],
) -> None:
    if file is not None:
        path = tmp_path / "godel.yaml"
        path.write_text(yaml.safe_dump(file))
        argv = ["--config", str(path), *argv]
    config = load_config(ServiceConfig, argv, environ)
    assert {key: getattr(config, key) for key in expected} == expected


ERROR_CASES: list[tuple[str, str | None, dict[str, str], list[str], list[str]]] = [
    # (case, file text, environment, argv, fragments the message must contain; {file} = its path)
    ("unknown key in file", "stor_url: redis://x\n", {}, [], ["{file}", "unknown key 'stor_url'", "store_url"]),
    ("wrong type in file", "port: eighty\n", {}, [], ["{file}", "'port'", "'eighty'", "integer"]),
    ("YAML bool is not a number", "port: true\n", {}, [], ["{file}", "'port'", "integer"]),
    ("number is not a string", "store_url: 5\n", {}, [], ["{file}", "'store_url'", "string"]),
    ("not a choice", "log_format: xml\n", {}, [], ["{file}", "'log_format'", "one of"]),
    ("file not a mapping", "- port\n", {}, [], ["{file}", "mapping"]),
    ("file not YAML", "port: [\n", {}, [], ["{file}", "not valid YAML"]),
    ("env not a number", None, {"GODEL_GRACE_SECONDS": "soon"}, [], ["GODEL_GRACE_SECONDS", "number"]),
    ("env above maximum", None, {"GODEL_PORT": "70000"}, [], ["GODEL_PORT", "maximum 65535"]),
    ("below minimum in file", "grace_seconds: -1\n", {}, [], ["{file}", "'grace_seconds'", "minimum"]),
    ("flag not a number", None, {}, ["--port", "x"], ["--port", "integer"]),
    ("flag not a choice", None, {}, ["--log-level", "loud"], ["--log-level", "loud"]),
    ("unknown flag", None, {}, ["--bogus", "1"], ["--bogus"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("file_text", "environ", "argv", "fragments"),
    [case[1:] for case in ERROR_CASES],
    ids=[case[0] for case in ERROR_CASES],
)
def test_config_errors_name_the_key_and_source(
    tmp_path: Path,
    file_text: str | None,
    environ: dict[str, str],
    argv: list[str],
    fragments: list[str],
) -> None:
    path = tmp_path / "godel.yaml"
    if file_text is not None:
        path.write_text(file_text)
        argv = ["--config", str(path), *argv]
    with pytest.raises(ConfigError) as caught:
        load_config(ServiceConfig, argv, environ)
    for fragment in fragments:
        assert fragment.format(file=path) in str(caught.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(ServiceConfig, ["--config", str(tmp_path / "absent.yaml")], {})


def test_entry_point_exits_2_on_bad_config(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("stor_url: redis://x\n")
    result = subprocess.run(
        [sys.executable, "-m", "services.dispatcher", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "stor_url" in result.stderr and str(path) in result.stderr


# --------------------------------------------------------------------------------------------
# A service run in-process
# --------------------------------------------------------------------------------------------


class RecordingService(Service[ServiceConfig]):
    """Serves the Rescheduler contract as stubs and records what it sees at each hook."""

    component = "recording"
    config_class = ServiceConfig
    grpc_services = (RESCHEDULER,)
    address = ""  # set by the test before start: on_start probes the server over gRPC

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.events: list[str] = []

    def add_servicers(self, server: grpc.aio.Server) -> None:
        servicer = api_pb2_grpc.ReschedulerServicer()  # type: ignore[abstract]
        api_pb2_grpc.add_ReschedulerServicer_to_server(servicer, server)

    async def on_start(self) -> None:
        await self.store.ping()
        self.events.append(f"on_start health={await _check(type(self).address, '')}")
        self.spawn(asyncio.Event().wait(), name="idle-loop")

    async def on_stop(self) -> None:
        await self.store.ping()  # the store is still open while draining
        self.events.append(f"on_stop tasks={len(self._tasks)}")


async def _check(address: str, service: str) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


async def _list_services(address: str) -> set[str]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=2
        )
        async for response in call:
            return {s.name for s in response.list_services_response.service}
    raise AssertionError("no reflection response")


@pytest.fixture
def service_config(store_url: str, cluster_name: str, tmp_path: Path) -> ServiceConfig:
    return ServiceConfig(
        name="probe-1",
        port=free_port(),
        store_url=store_url,
        cluster=cluster_name,
        grace_seconds=0.5,
        home=tmp_path,
        insecure=True,  # plaintext in-process; tests/test_tls.py covers TLS
    )


async def test_in_process_service_serves_health_reflection_and_stubs(
    service_config: ServiceConfig,
) -> None:
    RecordingService.address = f"127.0.0.1:{service_config.port}"
    async with ServiceHost(RecordingService, service_config) as host:
        assert host.address == RecordingService.address
        assert await _check(host.address, "") == "SERVING"
        assert await _check(host.address, RESCHEDULER) == "SERVING"
        assert {RESCHEDULER, "grpc.health.v1.Health"} <= await _list_services(host.address)

        async with grpc.aio.insecure_channel(host.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await api_pb2_grpc.ReschedulerStub(channel).Trigger(
                    api_pb2.TriggerRequest(), timeout=2
                )
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        service = host.service
        assert isinstance(service, RecordingService)

    # SERVING only after on_start; on_stop ran with the store open and the loop still running,
    # which was cancelled afterwards.
    assert service.events == ["on_start health=NOT_SERVING", "on_stop tasks=1"]
    assert not service._tasks
    assert probe(RecordingService.address, timeout=0.5) == "UNREACHABLE"


async def test_port_zero_picks_a_free_port(service_config: ServiceConfig) -> None:
    class Quiet(RecordingService):
        async def on_start(self) -> None:
            pass

    async with ServiceHost(Quiet, replace(service_config, port=0)) as host:
        assert not host.address.endswith(":0")
        assert await _check(host.address, "") == "SERVING"


ADVERTISE_CASES: list[tuple[str, str, str, str]] = [
    # (case, advertise_address, bind host, expected with port 50051 and hostname "c0ffee")
    ("explicit advertise address wins", "binder-0.example:7000", "0.0.0.0", "binder-0.example:7000"),
    ("IPv4 wildcard: the hostname", "", "0.0.0.0", "c0ffee:50051"),
    ("IPv6 wildcard: the hostname", "", "::", "c0ffee:50051"),
    ("bracketed IPv6 wildcard: the hostname", "", "[::]", "c0ffee:50051"),
    ("empty host binds all: the hostname", "", "", "c0ffee:50051"),
    ("loopback, as godel up binds: unchanged", "", "127.0.0.1", "127.0.0.1:50051"),
    ("a specific address: unchanged", "", "127.0.0.7", "127.0.0.7:50051"),
    ("IPv6 address: bracketed", "", "::1", "[::1]:50051"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("advertise", "host", "expected"),
    [case[1:] for case in ADVERTISE_CASES],
    ids=[case[0] for case in ADVERTISE_CASES],
)
def test_advertised_address(advertise: str, host: str, expected: str) -> None:
    assert advertised_address(advertise, host, 50051, hostname="c0ffee") == expected


async def test_wildcard_bind_advertises_the_reachable_hostname(
    service_config: ServiceConfig,
) -> None:
    """What a compose replica does: bound to 0.0.0.0, it publishes HOSTNAME:port, which a peer
    can dial (here the machine's hostname resolves to itself), never 0.0.0.0."""

    class Bare(Service[ServiceConfig]):  # RecordingService shadows `address`; this one does not
        component = "bare"
        config_class = ServiceConfig

        def add_servicers(self, server: grpc.aio.Server) -> None:
            pass

    config = replace(service_config, host="0.0.0.0", port=0)
    async with ServiceHost(Bare, config) as host:
        service = host.service
        assert service is not None
        port = service.bound_port
        assert host.address == f"0.0.0.0:{port}"
        assert service.address == f"{socket.gethostname()}:{port}"
        assert await _check(service.address, "") == "SERVING"


async def test_failed_background_task_stops_the_service_with_exit_code_1(
    service_config: ServiceConfig,
) -> None:
    class Crashing(RecordingService):
        async def on_start(self) -> None:
            self.spawn(self._crash(), name="crasher")

        async def _crash(self) -> None:
            raise RuntimeError("lost the lease")

    async with ServiceHost(Crashing, service_config) as host:
        assert host.service is not None
        await asyncio.wait_for(host.service.stop_requested.wait(), timeout=5)
        assert host.service.exit_code == 1


async def test_unreachable_store_fails_startup(service_config: ServiceConfig) -> None:
    config = replace(
        service_config, store_url=f"redis://127.0.0.1:{free_port()}/0", store_connect_seconds=0.3
    )
    with pytest.raises(StartupError, match=r"still unreachable after 0\.3s"):
        async with ServiceHost(RecordingService, config):
            pass


# --------------------------------------------------------------------------------------------
# Real service processes and signals
# --------------------------------------------------------------------------------------------


@pytest.fixture
def dispatcher(store_url: str, cluster_name: str, tmp_path: Path) -> Iterator[Any]:
    """Start `python -m services.dispatcher`; yields a factory taking the grace in seconds."""
    started: list[subprocess.Popen[bytes]] = []

    def start(grace_seconds: float) -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        log = tmp_path / f"dispatcher-{len(started)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "services.dispatcher", "--port", str(port),
                 "--store-url", store_url, "--cluster", cluster_name, "--name", "dispatcher-test",
                 "--grace-seconds", str(grace_seconds), "--log-format", "json",
                 "--insecure", "true"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        started.append(proc)
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while probe(address, timeout=0.5) != "SERVING":
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "dispatcher never became SERVING"
            time.sleep(0.05)
        return proc, address

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _watch_health(address: str) -> tuple[grpc.Channel, Iterator[Any]]:
    channel = grpc.insecure_channel(address)
    stream = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service=""), timeout=30
    )
    return channel, stream


def test_sigterm_reports_not_serving_then_exits_zero_within_grace(dispatcher: Any) -> None:
    grace = 1.5
    proc, address = dispatcher(grace)
    channel, stream = _watch_health(address)
    with channel:
        assert next(stream).status == SERVING
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # The open Watch is an in-flight RPC: it sees NOT_SERVING, then is cancelled at the grace.
        assert next(stream).status == NOT_SERVING
        with pytest.raises(grpc.RpcError):
            next(stream)
        assert proc.wait(timeout=grace + 10) == 0
    assert time.monotonic() - signalled < grace + 3


def test_sigterm_without_inflight_rpcs_exits_at_once(dispatcher: Any) -> None:
    proc, _ = dispatcher(30.0)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - signalled < 5


def test_second_signal_forces_exit(dispatcher: Any) -> None:
    proc, address = dispatcher(30.0)
    channel, stream = _watch_health(address)
    with channel:
        assert next(stream).status == SERVING
        proc.send_signal(signal.SIGTERM)
        assert next(stream).status == NOT_SERVING  # now draining, held by this Watch for 30 s
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM


def test_healthcheck_module_exit_codes(dispatcher: Any) -> None:
    proc, address = dispatcher(1.0)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.runtime.healthcheck", "--addr", address,
             "--insecure", *args],
            capture_output=True, text=True, timeout=30, env={**os.environ},
        )  # fmt: skip

    assert run().returncode == 0
    assert run("--service", "godel.v1.Dispatcher").returncode == 0
    unknown = run("--service", "godel.v1.Nope")
    assert unknown.returncode == 1 and "SERVICE_UNKNOWN" in unknown.stdout
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    gone = run("--timeout", "1")
    assert gone.returncode == 1 and "UNREACHABLE" in gone.stdout


async def test_cancel_and_wait_outlasts_a_swallowed_cancellation() -> None:
    """redis-py can swallow a cancellation mid-read; one cancel() then leaves the loop running."""
    swallowed = []

    async def stubborn_loop() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)  # as redis-py does: carry on as if nothing happened

    task = asyncio.create_task(stubborn_loop())
    await asyncio.sleep(0.02)
    await asyncio.wait_for(cancel_and_wait([task]), timeout=5)
    assert task.done() and task.cancelled() and swallowed


class SlowToDrain(RecordingService):
    """A service whose drain would take far longer than any grace."""

    async def on_stop(self) -> None:
        self.events.append("draining")
        await asyncio.sleep(60)
        self.events.append("drained")


async def test_a_drain_that_overruns_the_grace_is_cut_at_it(
    service_config: ServiceConfig,
) -> None:
    """The whole stop fits in grace_seconds (an orchestrator SIGKILLs a process that overstays
    its grace): a drain still running when the grace is spent is cancelled, the store is still
    closed, and the stop returns."""
    config = replace(service_config, grace_seconds=1.0)
    host = ServiceHost(SlowToDrain, config)
    SlowToDrain.address = f"127.0.0.1:{config.port}"
    await host.start()
    await asyncio.wait_for(host.stop(), 30)  # the drain alone would take 60 s
    service = host.service
    assert isinstance(service, SlowToDrain)
    assert service.events[-1] == "draining"  # cut, not finished


def test_store_password_file_goes_into_the_store_url(tmp_path: Path) -> None:
    secret = tmp_path / "service.secret"
    secret.write_text("p@ss/word\n")
    config = load_config(
        ServiceConfig,
        ["--store-url", "redis://godel@store:6379/0", "--store-password-file", str(secret)],
        environ={},
    )
    assert config.store_connection_url() == "redis://godel:p%40ss%2Fword@store:6379/0"
    assert load_config(ServiceConfig, [], environ={}).store_connection_url().startswith("redis://")
    missing = load_config(
        ServiceConfig, ["--store-password-file", str(tmp_path / "nope")], environ={}
    )
    with pytest.raises(ConfigError, match="store_password_file: cannot read"):
        missing.store_connection_url()
