"""docker-compose.yml and the Dockerfile, checked statically (no Docker engine needed): every
command runs a module that exists, every container has a healthcheck, readiness ordering only
references defined, health-checked services, and scaled services can actually scale."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
STORE = "store"
SCALED = ("scheduler", "binder")
DEPENDS_ON_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict) and isinstance(document.get("services"), dict)
    return document["services"]


def _godel_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in services.items() if name != STORE}


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", str(duration))
    assert match, f"unsupported duration {duration!r}"
    value, unit = float(match[1]), match[2]
    return value * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]


def test_every_component_has_a_service(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {
        STORE, "dispatcher", "scheduler", "binder", "rescheduler", "nodeagent"
    }  # fmt: skip


def test_commands_run_importable_modules(services: dict[str, dict[str, Any]]) -> None:
    for name, spec in _godel_services(services).items():
        command = spec["command"]
        assert command[:2] == ["python", "-m"], f"{name}: exec-form `python -m <module>` expected"
        module = command[2]
        assert module == f"services.{name}"
        importlib.import_module(module)
        assert importlib.util.find_spec(f"{module}.__main__") is not None, f"{module}.__main__"


def test_every_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, spec in services.items():
        test = spec.get("healthcheck", {}).get("test")
        assert test and test[0] == "CMD", f"{name}: healthcheck.test missing"
    for name, spec in _godel_services(services).items():
        test = spec["healthcheck"]["test"]
        assert test[1:4] == ["python", "-m", "services.runtime.healthcheck"], name
        importlib.import_module(test[3])
        address = test[test.index("--addr") + 1]
        assert address.rsplit(":", 1)[1] == str(spec["environment"]["GODEL_PORT"]), (
            f"{name}: the healthcheck probes another port than the service listens on"
        )


def test_depends_on_references_healthy_defined_services(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, spec in services.items():
        for dependency, condition in spec.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on undefined {dependency}"
            assert condition["condition"] in DEPENDS_ON_CONDITIONS, name
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"
    for name, spec in _godel_services(services).items():
        assert spec["depends_on"][STORE]["condition"] == "service_healthy", name


def test_scaled_services_have_no_fixed_name_or_host_port(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in SCALED:
        assert "container_name" not in services[name], name
        assert "ports" not in services[name], name


def test_shutdown_grace_and_configuration(services: dict[str, dict[str, Any]]) -> None:
    for name, spec in _godel_services(services).items():
        environment = spec["environment"]
        assert environment["GODEL_STORE_URL"].startswith(f"redis://{STORE}:"), name
        grace = float(environment["GODEL_GRACE_SECONDS"])
        assert _seconds(spec["stop_grace_period"]) > grace, (
            f"{name}: stop_grace_period must exceed the gRPC grace, or Docker SIGKILLs mid-drain"
        )


def test_store_persists_with_an_append_only_file(services: dict[str, dict[str, Any]]) -> None:
    command = services[STORE]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert services[STORE]["volumes"], "the AOF must live on a volume"


def test_dockerfile_builds_one_image_from_this_project() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.MULTILINE)
    assert re.search(r"^RUN pip install \.", text, re.MULTILINE)
