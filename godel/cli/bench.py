"""`godel bench WORKLOAD`: run a benchmark workload against real local clusters.

A thin shell over the harness (``python -m bench``): the workloads are the files in
``bench/workloads/``; see bench/README.md for what the report holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from godel.cli.output import fail


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)


def bench(
    workload: Annotated[
        str, typer.Argument(help="A workload name in bench/workloads/ or a YAML file path.")
    ],
    quick: Annotated[bool, typer.Option("--quick", help="Use the workload's small sizes.")] = False,
    out: Annotated[Path, typer.Option("--out", help="Report directory.")] = Path("bench/results"),
    fsync: Annotated[
        str, typer.Option("--fsync", help="Store fsync policy: always, everysec or no.")
    ] = "always",
    rate: Annotated[
        float | None,
        typer.Option("--rate", min=0, help="Offered pods/s (default: the workload's)."),
    ] = None,
    variant: Annotated[
        list[str] | None,
        typer.Option(
            "--variant", help="Run only this variant of a series (repeatable; plus the baseline)."
        ),
    ] = None,
) -> None:
    """Start a local cluster per run, submit the workload's pods, report throughput and latency.

    Writes <workload>-<timestamp>.json, .md and PNG plots to --out; prints the summary table.
    """
    from bench.__main__ import run

    if fsync not in ("always", "everysec", "no"):
        fail(f"--fsync must be always, everysec or no (got {fsync!r})", code=2)
    code = run(workload, quick=quick, out=out, fsync=fsync, rate=rate, variants=variant)
    if code:
        raise typer.Exit(code)  # run() has said why
