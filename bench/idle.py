"""``python -m bench.idle WORKLOAD [--variant V] [--seconds 20] [--quick] [--out DIR]``

What a cluster spends per second rather than per pod: the workload's cluster is started (its
hollow nodes ready, its init pods bound, the change feed settled), then each process's CPU is
sampled over ``--seconds`` with nothing submitted. Prints the CPU of each kind of service in
millicores (CPU-milliseconds per second) and writes the report as JSON (``idle-*.json``). A
measured phase of T seconds and N pods pays ``millicores × T ÷ N`` of this per pod.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench import workload as workloads
from godel.cli.output import configure_logging

DEFAULT_OUT = Path("bench/results")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.idle", description="Each service's CPU on an idle cluster."
    )
    parser.add_argument("workload", help="a name in bench/workloads/ or a YAML path")
    parser.add_argument("--variant", default="", help="the series variant whose cluster to start")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to sample")
    parser.add_argument("--quick", action="store_true", help="the workload's small sizes")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report directory")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    opts = parser.parse_args(argv)
    configure_logging(opts.verbose)
    from bench import harness

    try:
        suite = workloads.load(opts.workload, quick=opts.quick)
        runs = [r for r in suite.runs if r.variant == opts.variant] or suite.runs[:1]
        if opts.variant and runs[0].variant != opts.variant:
            raise workloads.WorkloadError(f"{suite.path}: no variant {opts.variant!r}")
    except workloads.WorkloadError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if opts.seconds <= 0:
        sys.stderr.write("error: --seconds must be positive\n")
        return 2
    try:
        report = harness.measure_idle(runs[0], seconds=opts.seconds)
    except harness.BenchError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    report["command"] = " ".join(["python -m bench.idle", *(argv or sys.argv[1:])])
    opts.out.mkdir(parents=True, exist_ok=True)
    stem = runs[0].name.replace("/", "-")
    path = opts.out / f"idle-{stem}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    for kind, millicores in report["millicores"].items():
        sys.stdout.write(f"{kind:<12} {millicores:>8.1f} millicores\n")
    sys.stdout.write(f"{'services':<12} {report['millicores_all_services']:>8.1f} millicores\n")
    sys.stdout.write(f"report: {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
