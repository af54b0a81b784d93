"""``python -m bench WORKLOAD [--quick] [--variant V ...] [--out bench/results] [--fsync ...]
[--rate N]``

Runs a workload file (``bench/workloads/<WORKLOAD>.yaml`` or a path) against real local
clusters and writes the report. ``python -m bench --list`` lists the workloads. Other entry
points: ``python -m bench.store`` (store throughput) and ``python -m bench.load`` (used by the
harness).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bench import workload as workloads
from godel.cli.output import configure_logging

if TYPE_CHECKING:  # the harness is imported when a workload runs, not for --help
    from bench.harness import Fsync

DEFAULT_OUT = Path("bench/results")


def run(
    name: str,
    *,
    quick: bool = False,
    out: Path = DEFAULT_OUT,
    fsync: Fsync = "always",
    rate: float | None = None,
    variants: list[str] | None = None,
) -> int:
    """Run one workload file and write its report; returns the exit code."""
    from bench import harness, report

    try:
        suite = workloads.select(workloads.load(name, quick=quick), variants or [])
    except workloads.WorkloadError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if fsync not in ("always", "everysec", "no"):
        sys.stderr.write(f"error: --fsync must be always, everysec or no (got {fsync!r})\n")
        return 2
    try:
        result = harness.run_suite(
            suite,
            quick=quick,
            fsync=fsync,
            rate=rate,
            keep_logs=out,
        )
    except harness.BenchError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; every process was stopped\n")
        return 130
    paths = report.write(result, out)
    sys.stdout.write(report.summary_table(result) + "\n\n")
    for kind, path in paths.items():
        sys.stdout.write(f"{kind}: {path}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Run a benchmark workload against a local cluster."
    )
    parser.add_argument("workload", nargs="?", help="a name in bench/workloads/ or a YAML path")
    parser.add_argument("--quick", action="store_true", help="the workload's small sizes")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report directory")
    parser.add_argument("--fsync", choices=("always", "everysec", "no"), default="always")
    parser.add_argument("--rate", type=float, help="offered pods/s (default: the workload's)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this variant of a series (repeatable; the baseline always runs too)",
    )
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    opts = parser.parse_args(argv)
    configure_logging(opts.verbose)
    if opts.list or not opts.workload:
        for name in workloads.available():
            sys.stdout.write(f"{name}\n")
        return 0 if opts.list else 2
    return run(
        opts.workload,
        quick=opts.quick,
        out=opts.out,
        fsync=opts.fsync,
        rate=opts.rate,
        variants=opts.variant,
    )


if __name__ == "__main__":
    raise SystemExit(main())
