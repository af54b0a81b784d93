"""The session-end guard (tests/exit_guard.py), proven on real pytest sessions run in a
subprocess: whatever a test leaves running, the run exits, fails, and says what was left."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]

# faulthandler's header for every thread it dumps: only the last-resort exit prints it.
STACK_DUMP = "most recent call first"


def run_session(
    tmp_path: Path, test_source: str, guard_timeout: float = 60
) -> tuple[str, str, int]:
    """Run ``test_source`` as a pytest session with the guard loaded; (stdout, stderr, code).
    The generous subprocess timeout is the assertion that the session exits at all."""
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )
    (tmp_path / "test_sub.py").write_text(textwrap.dedent(test_source))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.exit_guard", "-p", "no:cacheprovider",
         "-q", "-o", f"exit_guard_timeout={guard_timeout}", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    return result.stdout, result.stderr, result.returncode


SERVER_TEST = """
    import asyncio
    from pathlib import Path

    import grpc

    async def serve(stop: bool) -> int:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        if stop:
            await server.stop(0)
        return port

    def test_server() -> None:
        Path(__file__).with_name("port").write_text(str(asyncio.run(serve(stop={stop}))))
"""


def test_a_server_left_running_fails_the_session_naming_its_address(tmp_path: Path) -> None:
    out, err, code = run_session(tmp_path, SERVER_TEST.format(stop=False))
    port = (tmp_path / "port").read_text()
    assert code == 1, out + err
    assert "1 passed" in out  # the test itself passed: the session fails for the leftover
    assert f"gRPC server 127.0.0.1:{port} (started by test_sub.py::test_server)" in out
    assert STACK_DUMP not in err  # it exited by the guard, not by the last resort


def test_a_server_stopped_cleanly_passes(tmp_path: Path) -> None:
    out, err, code = run_session(tmp_path, SERVER_TEST.format(stop=True))
    assert code == 0, out + err
    assert "exit guard" not in out
    assert STACK_DUMP not in err


def test_processes_left_running_are_named_and_killed(tmp_path: Path) -> None:
    # A child, and an orphan: started by a process that has exited, as `godel up` leaves its
    # services, so only the session's environment variable ties it to the session.
    out, err, code = run_session(
        tmp_path,
        """
        import subprocess, sys
        from pathlib import Path

        SLEEP = [sys.executable, "-c", "import time; time.sleep(600)  # {}"]

        def test_processes() -> None:
            child = subprocess.Popen(SLEEP[:-1] + [SLEEP[-1].format("child")])
            orphan = subprocess.run(
                [sys.executable, "-c",
                 "import subprocess, sys; print(subprocess.Popen(sys.argv[1:],"
                 " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,"
                 " start_new_session=True).pid)",
                 *SLEEP[:-1], SLEEP[-1].format("orphan")],
                capture_output=True, text=True, check=True,
            ).stdout
            Path(__file__).with_name("pids").write_text(f"{child.pid} {orphan}")
        """,
    )
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert code == 1, out + err
    for pid, which in zip(pids, ("child", "orphan"), strict=True):
        assert f"process {pid}: {sys.executable} -c import time; time.sleep(600)  # {which}" in out
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running: {pids}"
        time.sleep(0.05)


def test_a_thread_left_running_is_named_and_the_run_still_exits(tmp_path: Path) -> None:
    out, err, code = run_session(
        tmp_path,
        """
        import threading

        def test_thread() -> None:
            threading.Thread(target=threading.Event().wait, name="leaky-thread").start()
        """,
    )
    assert code == 1, out + err
    assert "non-daemon thread 'leaky-thread'" in out
    assert STACK_DUMP not in err


def test_a_hang_at_interpreter_exit_ends_with_thread_stacks(tmp_path: Path) -> None:
    started = time.monotonic()
    out, err, code = run_session(
        tmp_path,
        """
        import atexit, time

        def hang_at_exit() -> None:
            time.sleep(600)

        def test_hangs_at_exit() -> None:
            atexit.register(hang_at_exit)
        """,
        # Long enough for the leftover check and the summary on two cores busy with the other
        # worker's tests (pyproject's addopts): 3 s was sometimes cut short before "1 passed".
        guard_timeout=10,
    )
    assert code != 0, out + err
    assert "1 passed" in out and "exit guard" not in out  # nothing left: only the exit hangs
    assert STACK_DUMP in err and "in hang_at_exit" in err, err
    assert time.monotonic() - started < 60


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
