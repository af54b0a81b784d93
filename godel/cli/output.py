"""Output helpers shared by every command: kubectl-style tables, ages, JSON, errors on stderr."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from enum import StrEnum
from typing import NoReturn

import click

# Set by the global --verbose option; commands that run code which logs (the local-cluster
# machinery) configure logging with it when they start, so a `godel get` never imports structlog.
VERBOSE = False


class Group(click.Group):
    """A command group whose --help lists its commands in the order they were added (the
    order of the README's walk-through, not the alphabet), each with the first paragraph of its
    help in full, as typer, the previous parser, printed them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        commands = [(name, self.get_command(ctx, name)) for name in self.list_commands(ctx)]
        rows = [
            (name, " ".join((cmd.help or "").split("\n\n")[0].split()))
            for name, cmd in commands
            if cmd is not None and not cmd.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    widths: Sequence[int] | None = None,
    header: bool = True,
) -> list[int]:
    """Left-aligned columns separated by three spaces, like kubectl: no borders, no wrapping, so
    scripts can split on whitespace. Empty values print as ``<none>``. Returns the column
    widths, which later rows of a watch (``header=False``) line up with."""
    cells = [[str(h) for h in headers]]
    cells += [[("<none>" if v is None or v == "" else str(v)) for v in row] for row in rows]
    wide = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    if widths is not None:
        wide = [max(a, b) for a, b in zip(wide, widths, strict=True)]
    for row in cells if header else cells[1:]:
        click.echo("   ".join(v.ljust(w) for v, w in zip(row, wide, strict=True)).rstrip())
    return wide


_AGE_UNITS = (("d", 86400), ("h", 3600), ("m", 60))


def age(seconds: float) -> str:
    """kubectl-style age of a duration: 42s, 7m, 3h, 2d (its largest whole unit, rounded down;
    a negative duration, a clock ahead of ours, is 0s)."""
    whole = max(0, int(seconds))
    for unit, size in _AGE_UNITS:
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def age_of_ms(epoch_ms: int) -> str:
    """How long ago ``epoch_ms`` (milliseconds since the epoch) was; ``<unknown>`` when unset."""
    if not epoch_ms:
        return "<unknown>"
    return age(time.time() - epoch_ms / 1000)


def print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2))


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` to stderr and exit with ``code``."""
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(code)


def configure_logging(verbose: bool) -> None:
    """Command-line tools log to stderr, so stdout stays clean for tables and -o json."""
    import logging

    import structlog

    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.INFO if verbose else logging.WARNING
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
