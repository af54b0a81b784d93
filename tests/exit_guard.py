"""Pytest plugin: the test run always exits.

A run once printed its summary and then hung for 13+ minutes at interpreter exit, on a grpc.aio
server nobody had stopped. The per-test timeout cannot catch that (no test is running any more),
so at the end of the session this plugin:

1. fails the session (exit code 1) naming every gRPC server, service process and non-daemon
   thread that tests started and left running — a test that forgets to stop what it started is a
   bug even when the run happens to exit;
2. tears those down: processes are terminated (then killed); a server or thread cannot be stopped
   from outside its event loop or its own code, so when one is left the interpreter is ended with
   ``os._exit`` once pytest has finished reporting;
3. arms a last resort: if the interpreter is still alive ``exit_guard_timeout`` seconds (default
   60) after the session finished, every thread's stack goes to stderr and the process exits 1.

gRPC servers are tracked by wrapping ``grpc.aio.server``, so every server is seen, whoever creates
it (``ServiceHost``, test helpers). Processes are found as descendants of this process, and by an
environment variable they inherit, which also finds services a CLI started and left behind when it
exited. Loaded from tests/conftest.py, or with ``-p tests.exit_guard``.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import grpc
import psutil
import pytest

# Every process started during the session inherits this; it holds a token unique to the session.
SESSION_ENV = "GODEL_TEST_SESSION"

_TERMINATE_SECONDS = 5.0
_THREAD_JOIN_SECONDS = 2.0


@dataclass
class _Server:
    server: grpc.aio.Server
    loop: asyncio.AbstractEventLoop
    addresses: list[str]
    test: str

    def __str__(self) -> str:
        return f"gRPC server {', '.join(self.addresses) or '(no port)'} (started by {self.test})"


@dataclass
class _Leftovers:
    servers: list[_Server]
    processes: list[psutil.Process]
    threads: list[threading.Thread]

    def __bool__(self) -> bool:
        return bool(self.servers or self.processes or self.threads)

    def lines(self) -> list[str]:
        return [
            *(str(s) for s in self.servers),
            *(f"process {p.pid}: {_argv(p)}" for p in self.processes),
            *(f"non-daemon thread {t.name!r}" for t in self.threads),
        ]


@dataclass
class _Guard:
    token: str = field(default_factory=lambda: f"{os.getpid()}-{uuid.uuid4().hex[:12]}")
    # Started and not yet stopped, by id(): strong references, so that a server dropped while
    # still running is reported here rather than left to grpc's __del__ at interpreter exit.
    servers: dict[int, _Server] = field(default_factory=dict)
    threads_before: set[threading.Thread] = field(default_factory=set)
    children_before: set[int] = field(default_factory=set)
    current_test: str = "code outside any test"
    real_server: Callable[..., grpc.aio.Server] | None = None
    # Set when something could not be stopped: the exit code to end the interpreter with.
    hard_exit: int | None = None


_guard = _Guard()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "exit_guard_timeout",
        "Seconds the interpreter may live on after the session finished before its thread "
        "stacks are dumped and it exits 1 (0: never).",
        default="60",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Appended, not replaced: a session run by a test (a sub-session) still marks its processes
    # as the outer session's too.
    os.environ[SESSION_ENV] = f"{os.environ.get(SESSION_ENV, '')} {_guard.token}".strip()
    _guard.threads_before = set(threading.enumerate())
    _guard.children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    if _guard.real_server is None:
        _guard.real_server = grpc.aio.server
        grpc.aio.server = _tracked_server


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    _guard.current_test = item.nodeid
    try:
        return (yield)
    finally:
        _guard.current_test = "code outside any test"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Runs after the runner's own sessionfinish, which tears down session-scoped fixtures."""
    timeout = float(session.config.getini("exit_guard_timeout"))
    if timeout > 0:
        # Outlives pytest: covers the rest of pytest's shutdown and the interpreter's exit. To fd 2
        # itself: by the time it fires, pytest's capture has given fd 2 back to the real stderr.
        faulthandler.dump_traceback_later(timeout, exit=True, file=2)
    leftovers = _left_running()
    if not leftovers:
        return
    _report(session.config, leftovers)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if not _tear_down(leftovers):
        _guard.hard_exit = int(session.exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    timeout = float(config.getini("exit_guard_timeout"))
    if timeout > 0:
        # Re-armed once pytest has reported: the whole timeout is for the interpreter's exit,
        # however long the leftover check and the summary took on a loaded machine.
        faulthandler.dump_traceback_later(timeout, exit=True, file=2)
    if _guard.real_server is not None:
        grpc.aio.server = _guard.real_server
        _guard.real_server = None
    if _guard.hard_exit is not None:
        # A server or thread that cannot be stopped would keep the interpreter from exiting:
        # pytest has reported everything, so end the process here.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_guard.hard_exit)


def _tracked_server(*args: Any, **kwargs: Any) -> grpc.aio.Server:
    """``grpc.aio.server``, remembering the server from ``start()`` until ``stop()`` returns."""
    assert _guard.real_server is not None
    server = _guard.real_server(*args, **kwargs)
    addresses: list[str] = []
    add_insecure_port, add_secure_port = server.add_insecure_port, server.add_secure_port
    start, stop = server.start, server.stop

    def insecure(address: str) -> int:
        port: int = add_insecure_port(address)
        addresses.append(_with_port(address, port))
        return port

    def secure(address: str, credentials: grpc.ServerCredentials) -> int:
        port: int = add_secure_port(address, credentials)
        addresses.append(_with_port(address, port))
        return port

    async def started() -> None:
        await start()
        loop = asyncio.get_running_loop()
        _guard.servers[id(server)] = _Server(server, loop, addresses, _guard.current_test)

    async def stopped(grace: float | None) -> None:
        await stop(grace)
        _guard.servers.pop(id(server), None)

    server.add_insecure_port = insecure
    server.add_secure_port = secure
    server.start = started
    server.stop = stopped
    return server


def _with_port(address: str, port: int) -> str:
    """``127.0.0.1:0`` bound to port 41234 is ``127.0.0.1:41234``."""
    host = address.rsplit(":", 1)[0]
    return f"{host}:{port}"


def _left_running() -> _Leftovers:
    return _Leftovers(list(_guard.servers.values()), _session_processes(), _session_threads())


def _session_processes() -> list[psutil.Process]:
    """Running processes this session started: its descendants, and processes carrying its
    token in their environment (services a CLI started and left behind are no descendants)."""
    me = psutil.Process()
    found = {p.pid: p for p in me.children(recursive=True)}
    for proc in psutil.process_iter():
        if proc.pid in found or proc.pid == me.pid:
            continue
        try:
            if _guard.token in proc.environ().get(SESSION_ENV, "").split():
                found[proc.pid] = proc
        except psutil.Error:  # gone, a zombie, or another user's
            continue
    return [p for pid, p in found.items() if pid not in _guard.children_before and _alive(p)]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _argv(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "(exited)"


def _session_threads() -> list[threading.Thread]:
    """Non-daemon threads started during the session that are still alive after a short join
    (an executor's worker may still be on its way out)."""
    deadline = time.monotonic() + _THREAD_JOIN_SECONDS
    left = []
    for thread in threading.enumerate():
        if thread.daemon or thread in _guard.threads_before:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            left.append(thread)
    return left


def _report(config: pytest.Config, leftovers: _Leftovers) -> None:
    title = "exit guard: left running after the session (the session fails)"
    hint = "Stop what a test starts in a finalizer: try/finally or fixture teardown."
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        print(title, *leftovers.lines(), hint, sep="\n", file=sys.stderr)
        return
    reporter.line("")  # the progress line of -q may not have ended
    reporter.section(title, sep="=", red=True, bold=True)
    for line in leftovers.lines():
        reporter.line(line, red=True)
    reporter.line(hint)


def _tear_down(leftovers: _Leftovers) -> bool:
    """Stop what can be stopped; False when something is left that only the exit can end."""
    for proc in leftovers.processes:
        _signal(proc.terminate)
    _, alive = psutil.wait_procs(leftovers.processes, timeout=_TERMINATE_SECONDS)
    for proc in alive:
        _signal(proc.kill)
    psutil.wait_procs(alive, timeout=_TERMINATE_SECONDS)
    servers_stopped = all(_stop_server(s) for s in leftovers.servers)
    return servers_stopped and not leftovers.threads


def _signal(send: Callable[[], None]) -> None:
    try:
        send()
    except psutil.NoSuchProcess:
        pass


def _stop_server(entry: _Server) -> bool:
    """A grpc.aio server can only be stopped on its own loop: possible while that loop is open
    (a session-scoped loop), not once pytest-asyncio or asyncio.run has closed it."""
    if entry.loop.is_closed() or entry.loop.is_running():
        return False
    try:
        entry.loop.run_until_complete(asyncio.wait_for(entry.server.stop(0), _TERMINATE_SECONDS))
    except Exception:
        return False
    return True
