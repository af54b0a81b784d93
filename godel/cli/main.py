"""The `godel` entry point (console script ``godel = godel.cli.main:main``).

Each command group lives in its own module with a ``register(app)`` function; to add commands
(``get``, ``apply``, ...), write ``godel/cli/<group>.py`` and list it in ``COMMAND_GROUPS``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Annotated

import typer

from godel.cli import bench, certs, cluster, output, reschedule, resources

COMMAND_GROUPS: tuple[ModuleType, ...] = (cluster, certs, resources, reschedule, bench)

app = typer.Typer(
    name="godel",
    help="Gödel: a unified scheduler for online services and offline batch/ML jobs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # `godel --install-completion` (bash, zsh, fish, PowerShell); kind names complete too.
    add_completion=True,
)


@app.callback()
def _global_options(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log what is being done (to stderr).")
    ] = False,
) -> None:
    output.VERBOSE = verbose


for group in COMMAND_GROUPS:
    group.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
