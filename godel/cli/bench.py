"""`godel bench WORKLOAD`: run a benchmark workload against real local clusters.

A thin shell over the harness: it runs ``python -m bench`` in a process of its own (the CLI is
a layer below the benchmarks, which start clusters through it). The workloads are the files in
``bench/workloads/``; see bench/README.md for what the report holds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from godel.cli.output import fail


@click.command("bench")
@click.argument("workload", help="A workload name in bench/workloads/ or a YAML file path.")
@click.option("--quick", is_flag=True, help="Use the workload's small sizes.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("bench/results"),
    help="Report directory.",
)
@click.option("--fsync", default="always", help="Store fsync policy: always, everysec or no.")
@click.option(
    "--rate", type=click.FloatRange(min=0), help="Offered pods/s (default: the workload's)."
)
@click.option(
    "--variant",
    multiple=True,
    help="Run only this variant of a series (repeatable; plus the baseline).",
)
def bench(
    workload: str, quick: bool, out: Path, fsync: str, rate: float | None, variant: tuple[str, ...]
) -> None:
    """Start a local cluster per run, submit the workload's pods, report throughput and latency.

    Writes <workload>-<timestamp>.json, .md and PNG plots to --out; prints the summary table.
    """
    if fsync not in ("always", "everysec", "no"):
        fail(f"--fsync must be always, everysec or no (got {fsync!r})", code=2)
    argv = [sys.executable, "-m", "bench", workload, "--out", str(out), "--fsync", fsync]
    if quick:
        argv.append("--quick")
    if rate is not None:
        argv += ["--rate", repr(rate)]
    for name in variant:
        argv += ["--variant", name]
    code = subprocess.call(argv)
    if code:
        raise click.exceptions.Exit(code)  # the harness has said why
