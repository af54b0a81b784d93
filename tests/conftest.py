"""Shared fixtures: a real Redis-compatible server for the whole session (or $GODEL_REDIS_URL),
and per-test isolation by cluster name (every key of a cluster carries its name), so tests never
flush each other's data. The session-end guard is tests/exit_guard.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from store import Store
from store.server import StoreServer, store_url_from_env

# The run always exits, and fails naming any server, process or thread a test left running.
pytest_plugins = ["tests.exit_guard"]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (pyproject's addopts: two workers), the e2e tests (tests/e2e/, each
    starting a whole cluster) form one unit of work, run one after the other by one worker,
    while the other tests are handed out one by one to whichever worker is free: never two
    clusters at once on a 2-core machine, for tests that wait on real processes and time and
    bind the ports `godel up` picked. (xdist's own `--dist loadgroup` cannot do it under
    pytest 9: it regroups by rewriting node ids, which pytest 9 no longer lets it do.)"""
    if config.getvalue("dist") != "load":
        return None  # another --dist asked for on the command line
    from xdist.scheduler import LoadScopeScheduling

    class E2EOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/e2e" if nodeid.startswith("tests/e2e/") else nodeid

    return E2EOnOneWorker(config, log)


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """structlog's configuration is process-wide: a command run in-process points it at stderr
    (``godel.cli.output.configure_logging``), and without this every later test on that worker
    would log there. Each test starts from structlog's defaults instead."""
    import structlog

    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="session")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = store_url_from_env()
    if external:
        yield external
        return
    server = StoreServer.start(tmp_path_factory.mktemp("store-server"), fsync="everysec")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def cluster_name() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(store_url: str, cluster_name: str) -> AsyncIterator[Store]:
    s = await Store.connect(store_url, cluster=cluster_name)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def private_server(tmp_path: Path) -> Iterator[StoreServer]:
    """A server of the test's own, for tests that kill or restart it."""
    server = StoreServer.start(tmp_path / "store", fsync="always")
    try:
        yield server
    finally:
        server.stop()
