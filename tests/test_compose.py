"""docker-compose.yml and the Dockerfile, checked statically (no Docker engine needed): the file is
valid under the compose specification's JSON schema, every command runs a module that exists,
every container has a healthcheck, readiness ordering only references defined, health-checked
services, scaled services can actually scale, and the image installs its locked dependencies in a
layer of their own. tests/e2e/test_compose_up.py runs the file.

The schema, tests/data/compose-spec.json, is the compose specification's
(github.com/compose-spec/compose-spec, schema/compose-spec.json, Apache-2.0) as docker-compose
1.29.2 ships it in its PyPI wheel (compose/config/compose_spec.json), copied byte for byte: no
package on PyPI ships a newer copy (`compose-spec` wraps a Rust parser and has none), and it
cannot be downloaded here. It covers every key this file uses.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import store.server as server_mod

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements.lock"
PYPROJECT = ROOT / "pyproject.toml"
SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"
STORE = "store"
CERTS = "certs"  # the one-shot init service writing the cluster's credentials to its volume
STORE_INIT = "store-init"
HA = ("store-replica", "sentinel")  # profile `ha`
STORE_SIDE = (STORE, STORE_INIT, *HA)
SECRETS_VOLUME = "store-secrets"
SCALED = ("scheduler", "binder")
DEPENDS_ON_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict) and isinstance(loaded.get("services"), dict)
    return loaded


@pytest.fixture(scope="module")
def services(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return document["services"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft201909Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft201909Validator.check_schema(schema)  # the schema names draft 2019-09
    return jsonschema.Draft201909Validator(schema)


def test_file_is_valid_under_the_compose_specification_schema(
    document: dict[str, Any], validator: jsonschema.Draft201909Validator
) -> None:
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(document)]
    assert not errors, "\n".join(errors)


SCHEMA_VIOLATIONS = [
    # (case, path to a mapping, key, bad value): each must be rejected, or validation is toothless
    ("unknown service key", ("services", "scheduler"), "replica", 4),
    ("replicas not an integer", ("services", "scheduler", "deploy"), "replicas", "four"),
    ("command not a string or list", ("services", "binder"), "command", {"python": "-m"}),
    ("unknown depends_on condition", ("services", "dispatcher", "depends_on", "store"),
     "condition", "service_ready"),
    ("unknown healthcheck key", ("services", "store", "healthcheck"), "interval_seconds", 2),
    ("unknown top-level key", (), "service", {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "key", "value"),
    [case[1:] for case in SCHEMA_VIOLATIONS],
    ids=[case[0] for case in SCHEMA_VIOLATIONS],
)
def test_schema_rejects_an_invalid_file(
    document: dict[str, Any],
    validator: jsonschema.Draft201909Validator,
    path: tuple[str, ...],
    key: str,
    value: object,
) -> None:
    broken = copy.deepcopy(document)
    target = broken
    for step in path:
        target = target[step]
    target[key] = value
    assert not validator.is_valid(broken)


def _godel_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The long-running Gödel components (not the store's side, not the one-shot certs)."""
    return {name: spec for name, spec in services.items() if name not in (*STORE_SIDE, CERTS)}


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", str(duration))
    assert match, f"unsupported duration {duration!r}"
    value, unit = float(match[1]), match[2]
    return value * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]


def test_every_component_has_a_service(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {
        *STORE_SIDE, CERTS, "dispatcher", "scheduler", "binder", "rescheduler", "nodeagent",
        "dashboard",
    }  # fmt: skip


def test_metrics_and_dashboard_ports_are_exposed_and_published_on_loopback(
    services: dict[str, dict[str, Any]],
) -> None:
    """Every container serves metrics on the project network at the port its environment names,
    over HTTPS requiring the cluster's client certificates; what reaches the host is published on
    its loopback only, each host port once."""
    host_ports: list[str] = []
    for name, spec in _godel_services(services).items():
        environment = spec["environment"]
        assert environment["GODEL_METRICS_HOST"] == "0.0.0.0", name
        # Exposed, so they require the cluster's client certificates (HTTPS).
        assert str(environment["GODEL_HTTPS_ON_LOOPBACK"]) == "true", name
        assert str(environment["GODEL_METRICS_PORT"]) in spec["expose"], name
        for entry in spec.get("ports", []):
            host_ip, host_port, container_port = str(entry).split(":")
            assert host_ip == "127.0.0.1", f"{name}: {entry} is published beyond loopback"
            assert container_port in spec["expose"], f"{name}: {entry} publishes no served port"
            host_ports.append(host_port)
    assert len(host_ports) == len(set(host_ports)), "a host port is published twice"
    dashboard = services["dashboard"]
    web_port = str(dashboard["environment"]["GODEL_WEB_PORT"])
    assert f"127.0.0.1:{web_port}:{web_port}" in dashboard["ports"]
    for name in ("dispatcher", "rescheduler", "nodeagent", "dashboard"):
        metrics = str(services[name]["environment"]["GODEL_METRICS_PORT"])
        assert any(str(p).endswith(f":{metrics}") for p in services[name]["ports"]), name


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
        if name in (STORE_INIT, CERTS):
            continue  # a one-shot: it exits, and its dependents wait for that
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
        assert spec["depends_on"][CERTS]["condition"] == "service_completed_successfully", name


def test_the_certs_service_issues_credentials_every_service_uses(
    services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """The init service writes the CA and certificates to the certs volume once; every component
    mounts that volume read-only and finds its identity there (GODEL_TLS_DIR), its certificate
    naming every compose service name it may be dialled at."""
    from cryptography import x509

    from foundation import pki, tls

    init = services[CERTS]
    assert init["restart"] == "no" and "depends_on" not in init
    command = init["command"]
    assert command[:5] == ["python", "-m", "godel", "certs", "init"], command
    directory = command[command.index("--dir") + 1]
    assert f"certs:{directory}" in init["volumes"]
    hosts = {command[i + 1] for i, arg in enumerate(command) if arg == "--host"}
    assert hosts == set(_godel_services(services)), "every service name is in the certificate"
    for name, spec in _godel_services(services).items():
        assert spec["environment"]["GODEL_TLS_DIR"] == directory, name
        assert f"certs:{directory}:ro" in spec["volumes"], name
        assert "--insecure" not in spec["command"] and "GODEL_INSECURE" not in spec["environment"]
    # The command, run as the container runs it: the credentials the services load.
    result = subprocess.run(
        [sys.executable, *command[1:6], str(tmp_path), *command[7:]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    # Each component's own identity (named after its kind, which is its compose service name;
    # the node agent's after the agent, GODEL_NAME), and the probes' service identity, name
    # every compose service.
    agent = services["nodeagent"]["environment"]
    agent_stem = tls.agent_stem(agent["GODEL_NAME"])
    stems = [
        tls.SERVICE,
        *(k if k != tls.NODEAGENT else agent_stem for k in _godel_services(services)),
    ]
    for stem in stems:
        service = tls.load(tmp_path, stem)
        identity = pki.identity_of(service.certificate)
        assert identity.role == "service", stem
        kind = tls.NODEAGENT if stem == agent_stem else stem
        assert identity.name == (tls.SERVICE_NAME if stem == tls.SERVICE else kind)
        names = (
            x509.load_pem_x509_certificate(service.certificate)
            .extensions.get_extension_for_class(x509.SubjectAlternativeName)
            .value.get_values_for_type(x509.DNSName)
        )
        assert hosts | {tls.SERVICE_NAME} <= set(names), stem
    assert pki.identity_of(tls.load(tmp_path, tls.ADMIN).certificate).role == "admin"
    # The node agent's certificate is its own: it names the agent and every node the agent
    # serves (its hollow nodes, named after it, and its process node), and no other.
    assert not (tmp_path / f"{tls.NODEAGENT}.crt").exists(), "no certificate shared by agents"
    identity = pki.identity_of(tls.load(tmp_path, agent_stem).certificate)
    assert identity.agent == agent["GODEL_NAME"]
    served = [f"{agent['GODEL_NAME']}-{i}" for i in (0, 99)] + [agent["GODEL_PROCESS_NODE_NAME"]]
    assert all(identity.serves(node) for node in served), identity.nodes
    assert not identity.serves("nodeagent2-0") and not identity.serves("elsewhere")


def test_scaled_services_have_no_fixed_name_or_host_port(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in SCALED:
        assert "container_name" not in services[name], name
        assert "ports" not in services[name], name


def test_replicas_advertise_their_own_hostname(services: dict[str, dict[str, Any]]) -> None:
    """Bound to 0.0.0.0 with no advertise address, a replica publishes its default hostname (its
    container id, which Docker's DNS resolves on the project network). A fixed advertise address
    would be the same for every replica of a scaled service, and a custom `hostname:` is not
    resolvable by peers."""
    for name, spec in _godel_services(services).items():
        assert spec["environment"]["GODEL_HOST"] == "0.0.0.0", name
        assert "GODEL_ADVERTISE_ADDRESS" not in spec["environment"], name
        assert "hostname" not in spec, name


def test_shutdown_grace_and_configuration(services: dict[str, dict[str, Any]]) -> None:
    for name, spec in _godel_services(services).items():
        environment = spec["environment"]
        assert _default(environment["GODEL_STORE_URL"]).startswith(f"redis://godel@{STORE}:"), name
        grace = float(environment["GODEL_GRACE_SECONDS"])
        assert _seconds(spec["stop_grace_period"]) > grace, (
            f"{name}: stop_grace_period must exceed the gRPC grace, or Docker SIGKILLs mid-drain"
        )


def test_store_persists_with_an_append_only_file(services: dict[str, dict[str, Any]]) -> None:
    command = services[STORE]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert services[STORE]["volumes"], "the AOF must live on a volume"


def test_store_is_locked_with_a_generated_secret(services: dict[str, dict[str, Any]]) -> None:
    """As `godel up` locks its store: an ACL file and a random password that the one-shot
    store-init writes into a volume; the store runs from that ACL, the services read the password
    from the volume, and no password appears in the file itself."""
    init = services[STORE_INIT]
    assert init["command"][:4] == ["python", "-m", "store.server", "lock"]
    secrets_dir = init["command"][4]
    assert f"{SECRETS_VOLUME}:{secrets_dir}" in init["volumes"]
    assert init["restart"] == "no"
    store = services[STORE]
    assert store["depends_on"][STORE_INIT]["condition"] == "service_completed_successfully"
    command = store["command"]
    assert command[command.index("--aclfile") + 1] == f"{secrets_dir}/users.acl"
    assert f"{SECRETS_VOLUME}:{secrets_dir}:ro" in store["volumes"]
    for name, spec in _godel_services(services).items():
        environment = spec["environment"]
        assert environment["GODEL_STORE_PASSWORD_FILE"] == f"{secrets_dir}/service.secret", name
        assert f"{SECRETS_VOLUME}:{secrets_dir}:ro" in spec["volumes"], name
        url = urlsplit(_default(environment["GODEL_STORE_URL"]))
        assert url.password is None, f"{name}: a password in the compose file"


def _default(value: str) -> str:
    """A value as compose interpolates it with the variable unset: ``${VAR:-default}``."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_ha_profile_runs_a_replica_and_three_sentinels(
    services: dict[str, dict[str, Any]], document: dict[str, Any]
) -> None:
    """`docker compose --profile ha up`: a replica of the store and three Sentinels (which
    promote it), all from store-init's secrets, never started without the profile; the services
    reach the store through the Sentinels when GODEL_STORE_URL says so."""
    replica, sentinel = services["store-replica"], services["sentinel"]
    for spec in (replica, sentinel):
        assert spec["profiles"] == ["ha"]
        assert f"{SECRETS_VOLUME}:/run/godel-store:ro" in spec["volumes"]
    command = replica["command"]
    server = command[command.index("valkey-server") :]
    assert server[1] == "/run/godel-store/server.conf", "the replication login, not in argv"
    assert command[command.index("--replicaof") + 1 :] == [STORE, "6379"]
    assert "/run/godel-store/sentinel.conf" in sentinel["command"][-1]
    assert sentinel["deploy"]["replicas"] == 3
    store = services[STORE]["command"]
    assert store[store.index("valkey-server") + 1] == "/run/godel-store/server.conf"
    assert "store-replica-data" in document["volumes"]
    url = services["dispatcher"]["environment"]["GODEL_STORE_URL"]
    assert url.startswith("${GODEL_STORE_URL:-"), "the ha profile's URL comes from outside"


@pytest.mark.parametrize("name", [STORE, "store-replica"])
def test_every_start_of_a_store_server_asks_the_sentinels_its_role(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    """As `godel up --ha` starts its servers: through store.rejoin, so that a primary killed and
    restarted comes back as the new primary's replica at once (not as a second primary for
    Sentinel to demote ~18 s later), and a promoted replica restarts as the primary. Each
    server names itself as the Sentinels know it: its service name, which it announces."""
    spec = services[name]
    command = spec["command"]
    assert command[:4] == ["python", "-P", "-m", "store.rejoin"], name
    server = command.index("--")
    options = dict(zip(command[4:server:2], command[5:server:2], strict=True))
    assert options == {"--data-dir": "/run/godel-store", "--host": name, "--port": "6379"}
    assert command[server + 1] == "valkey-server"
    assert command[command.index("--replica-announce-ip") + 1] == name
    assert command[command.index("--dir") + 1] == "/data"
    assert f"{name}-data:/data" in spec["volumes"]
    # The valkey image's user, owner of store-init's server files (--acl-owner) and of the
    # image's /data; never the services' user, who must not read the admin secret.
    init = services[STORE_INIT]["command"]
    assert spec["user"] == f"{init[init.index('--acl-owner') + 1]}:999"
    assert init[init.index("--secret-owner") + 1] != "999"
    assert spec["image"] == services["dispatcher"]["image"], "our image: store.rejoin is in it"


def test_the_image_carries_the_store_server_and_its_cli_on_the_path() -> None:
    """The store's containers run this image: valkey-server (which store.rejoin execs by name)
    and valkey-cli (their healthcheck) are on $PATH, and /data belongs to the store's user."""
    steps = _instructions(DOCKERFILE.read_text())
    step = next(s for s in steps if "find_server_binary" in s)
    assert 'ln -s "$server" /usr/local/bin/valkey-server' in step
    assert '/valkey-cli" /usr/local/bin/valkey-cli' in step
    assert "mkdir /data && chown 999:999 /data" in step


def test_the_sentinels_act_as_quickly_as_godel_up_has_them(tmp_path: Path) -> None:
    """Compose's Sentinels with `godel up --ha`'s timings (a dead primary replaced within
    seconds, not the 5 s + 60 s they had), and a login for store.rejoin to ask them."""
    server_mod.lock_secrets_dir(tmp_path / "secrets")
    conf = (tmp_path / "secrets" / "sentinel.conf").read_text()
    assert f"down-after-milliseconds godel {server_mod.SENTINEL_DOWN_AFTER_MS}\n" in conf
    assert f"failover-timeout godel {server_mod.SENTINEL_FAILOVER_TIMEOUT_MS}\n" in conf
    assert f"user {server_mod.STORE_SERVER_USER} on #" in conf
    sentinels = (tmp_path / "secrets" / server_mod.SENTINELS_FILE).read_text().split()
    assert sentinels == ["sentinel:26379"]


def _instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, one per line (continuations joined, comments dropped)."""
    joined = re.sub(r"\\\n\s*", " ", dockerfile)
    return [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]


def test_dockerfile_builds_one_image_from_this_project() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.MULTILINE)
    assert re.search(r"^RUN pip install --no-deps \.$", text, re.MULTILINE)


def test_dockerfile_installs_the_lock_file_before_copying_the_source() -> None:
    """A code edit invalidates only the layers after `COPY . .`: the locked dependencies must be
    installed before it, from the lock file alone, and the project after it without resolving
    (or the layer cache is defeated, or a dependency sneaks in unpinned)."""
    steps = _instructions(DOCKERFILE.read_text())

    def index(pattern: str) -> int:
        found = [i for i, step in enumerate(steps) if re.fullmatch(pattern, step)]
        assert len(found) == 1, f"expected one instruction matching {pattern!r}: {steps}"
        return found[0]

    copy_lock = index(rf"COPY {LOCK.name} \.")
    install_lock = index(rf"RUN pip install --require-hashes --no-deps -r {LOCK.name}")
    copy_source = index(r"COPY \. \.")
    install_project = index(r"RUN pip install --no-deps \.")
    assert copy_lock < install_lock < copy_source < install_project
    assert not any(s.startswith(("COPY", "ADD")) for s in steps[:copy_lock]), "source copied early"


def _locked() -> dict[str, str]:
    """Canonical package name → pinned version, from ``name==version`` lines; each has hashes."""
    text = LOCK.read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", text, re.MULTILINE))
    entries = re.split(r"\n(?=[A-Za-z0-9])", text)
    for entry in entries:
        if "==" in entry.split("\n", 1)[0]:
            assert "--hash=sha256:" in entry, f"no hash for {entry.splitlines()[0]}"
    return {canonicalize_name(name): version for name, version in pins.items()}


def test_lock_file_pins_every_runtime_dependency() -> None:
    """Every dependency of pyproject.toml (and of the extras it asks for, e.g. redis[hiredis]) is
    in the lock at a version its specifier allows: the two cannot drift apart."""
    locked = _locked()
    assert "godel-scheduler-py" not in locked, "the project itself is installed from the source"
    requirements = [
        Requirement(r) for r in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    ]
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{requirement} is not in {LOCK.name}"
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"{LOCK.name} pins {name}=={locked[name]}, outside {requirement}"
        )
        for extra in requirement.extras:
            for dependency in map(Requirement, importlib.metadata.requires(requirement.name) or []):
                if dependency.marker is not None and dependency.marker.evaluate({"extra": extra}):
                    assert canonicalize_name(dependency.name) in locked, (
                        f"{dependency.name} (of {requirement}) is not in {LOCK.name}"
                    )
