"""`godel bench` runs the benchmark harness as a process of its own (the CLI sits a layer below
the benchmarks and never imports them): its arguments reach `python -m bench`, and so do its
errors and exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_godel_bench_hands_the_workload_to_the_harness_and_keeps_its_exit_code(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "godel", "bench", "no-such-workload", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no workload 'no-such-workload'" in result.stderr
    assert "SchedulingBasic-5000" in result.stderr  # the harness lists what it has


def test_godel_bench_refuses_a_bad_fsync_before_starting_anything(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "godel", "bench", "SchedulingBasic-500", "--fsync", "sometimes"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "--fsync must be always, everysec or no" in result.stderr
