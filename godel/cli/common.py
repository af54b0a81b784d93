"""Options and look-ups shared by the command modules, kept apart from them so that a command
imports only its own module and this one."""

from __future__ import annotations

from pathlib import Path

import click

from godel.cli.output import fail

home_option = click.option(
    "--home",
    envvar="GODEL_HOME",
    type=click.Path(path_type=Path),
    show_envvar=True,
    help="State directory of the cluster: store data, logs, cluster.json (default ~/.godel).",
)
server_option = click.option(
    "--server",
    "-s",
    envvar="GODEL_SERVER",
    show_envvar=True,
    help="Dispatcher address host:port (default: the local cluster's).",
)
rescheduler_option = click.option(
    "--rescheduler",
    envvar="GODEL_RESCHEDULER",
    show_envvar=True,
    help="Rescheduler address host:port (default: the local cluster's).",
)


def local_address(kind: str, home: Path | None, flag: str) -> str:
    """Where the local cluster in ``home`` (default $GODEL_HOME) serves ``kind``; exits with
    an error naming ``flag`` when no cluster runs there. The lookup is the SDK's, so programs
    and the CLI find the same cluster."""
    from godel import client

    try:
        return client.local_address(kind, home)
    except client.ClusterNotFound as exc:
        fail(f"{exc} or {flag}")
