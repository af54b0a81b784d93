"""What a service process imports before it holds anything (issue 34, item 3: every interpreter's
baseline counts nine times). Real service processes, started as `godel up` starts them, are
asked through ``-X importtime`` what they loaded by the time they serve."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.memory import imported_modules, loaded_packages, start_idle_service, wait_serving
from foundation import pki
from foundation.netutil import free_ports

# Loaded only on the rare path that needs them: structlog's rich (and pygments, attrs) never;
# cryptography never (it makes certificates; a service reads their names with
# foundation.certnames); networkx by the first rescheduling round with moves; croniter by a
# cron trigger; yaml by a --config file or a profile file (the rescheduler reads its default
# policies with it).
NEVER_AT_IDLE = {
    "rich",
    "pygments",
    "attr",
    "cryptography.hazmat",  # redis tries the bare package for its version: no more
    "networkx",
    "croniter",
    "godel",
    "bench",
}
ONLY_WHERE_READ = {"yaml": {"rescheduler"}}


def _loaded_by_idle_service(kind: str, store_url: str, cluster: str, home: Path) -> set[str]:
    """With TLS, as `godel up` runs it: the health probe's certificate is read as every
    caller's is."""
    pki.init_cluster(home / "tls", agents={"nodeagent-0": ["hollow-0"]})
    ports = free_ports(3)
    log = home / f"{kind}.stderr"
    with log.open("wb") as stderr:
        process = start_idle_service(kind, store_url, home, False, ports, stderr, cluster=cluster)
        try:
            wait_serving(process, ports[0], home, insecure=False)
        finally:
            process.terminate()
            process.wait(30)
    modules = imported_modules(log.read_text(errors="replace"))
    return loaded_packages(modules, {*NEVER_AT_IDLE, *ONLY_WHERE_READ, "grpc", "store"})


@pytest.mark.parametrize("kind", ["binder", "rescheduler", "nodeagent"])
def test_a_serving_idle_service_has_loaded_none_of_the_heavy_packages_it_does_not_use(
    kind: str, store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    loaded = _loaded_by_idle_service(kind, store_url, cluster_name, tmp_path)
    assert "grpc" in loaded and "store" in loaded  # the log is the whole process's
    unused = NEVER_AT_IDLE | {p for p, readers in ONLY_WHERE_READ.items() if kind not in readers}
    assert loaded.isdisjoint(unused), sorted(loaded & unused)


def test_structlog_loaded_by_services_leaves_rich_importable_for_whoever_wants_it() -> None:
    """The services load structlog with rich out of its sight (services/__init__.py); a process
    that imported them (the bench) still imports rich itself."""
    import subprocess
    import sys

    code = (
        "import sys, services, structlog.dev\n"
        "assert structlog.dev.rich is None and 'rich' not in sys.modules\n"
        "import rich.console\n"
        "print(rich.console.Console.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Console"
