"""The `godel` entry point (console script ``godel = godel.cli.main:main``).

Each command group lives in its own module (``godel/cli/<group>.py``); to add a command, write
it there as a click command and list it in ``COMMANDS``. A module is imported when one of its
commands runs (or --help lists them all), so a `godel get` does not load the code of
`godel up`, `certs` or `bench`.

The parser is plain click, not typer: typer built its commands from the functions' type hints
at every start (and imported pydantic to check them), which cost a `godel get` more CPU than
its RPC (issue 12; bench/README.md, "CLI latency").
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import click

from godel.cli import output

# Command name -> "module:attribute", in the order --help lists them (the README's walk-through;
# certs last, as the one group).
COMMANDS = {
    "up": "godel.cli.cluster:up",
    "down": "godel.cli.cluster:down",
    "status": "godel.cli.cluster:status",
    "audit": "godel.cli.cluster:audit",
    "backup": "godel.cli.cluster:backup",
    "restore": "godel.cli.cluster:restore",
    "apply": "godel.cli.resources:apply",
    "get": "godel.cli.resources:get",
    "describe": "godel.cli.resources:describe",
    "delete": "godel.cli.resources:delete",
    "explain": "godel.cli.resources:explain",
    "retry": "godel.cli.resources:retry",
    "logs": "godel.cli.resources:logs",
    "scale": "godel.cli.resources:scale",
    "cordon": "godel.cli.resources:cordon",
    "uncordon": "godel.cli.resources:uncordon",
    "drain": "godel.cli.resources:drain",
    "reschedule": "godel.cli.reschedule:reschedule",
    "bench": "godel.cli.bench:bench",
    "certs": "godel.cli.certs:certs_app",
}


class _LazyGroup(output.Group):
    """The root group: a command's module is imported when the command is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command), target
        return command


# Shell completion: click's, driven by this variable (`_GODEL_COMPLETE=bash_source godel`).
COMPLETE_VARIABLE = "_GODEL_COMPLETE"
# Where --install-completion puts each shell's script, and the line its start-up file needs.
_COMPLETION_FILES = {
    "bash": ("~/.bash_completions/godel.sh", "~/.bashrc", "source {script}"),
    "zsh": ("~/.zfunc/_godel", "~/.zshrc", "fpath+=~/.zfunc; autoload -Uz compinit; compinit"),
    "fish": ("~/.config/fish/completions/godel.fish", None, ""),
}


def _shell() -> str:
    shell = Path(os.environ.get("SHELL", "")).name
    if shell not in _COMPLETION_FILES:
        raise click.UsageError(
            f"shell completion is for {', '.join(_COMPLETION_FILES)}; $SHELL is {shell or 'unset'!r}"
        )
    return shell


def _completion_script(shell: str) -> str:
    from click.shell_completion import get_completion_class

    completion = get_completion_class(shell)
    assert completion is not None  # bash, zsh and fish are click's own
    return completion(app, {}, "godel", COMPLETE_VARIABLE).source()


def _show_completion(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_completion_script(_shell()))
        ctx.exit()


def _install_completion(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    shell = _shell()
    script_path, rc_path, line = _COMPLETION_FILES[shell]
    script = Path(script_path).expanduser()
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(_completion_script(shell))
    if rc_path is not None:
        rc = Path(rc_path).expanduser()
        wanted = line.format(script=script)
        if wanted not in (rc.read_text() if rc.exists() else ""):
            with rc.open("a") as f:
                f.write(f"\n{wanted}\n")
    click.echo(f"{shell} completion installed in {script}; it works in new shells")
    ctx.exit()


@click.group(
    name="godel",
    cls=_LazyGroup,
    help="Gödel: a unified scheduler for online services and offline batch/ML jobs.",
    no_args_is_help=True,
    # Options with a default say so in --help, as they did under typer.
    context_settings={"show_default": True},
)
@click.option("--verbose", "-v", is_flag=True, help="Log what is being done (to stderr).")
# `godel --install-completion` (bash, zsh, fish); kind names complete too.
@click.option(
    "--install-completion",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_install_completion,
    help="Install completion for the current shell.",
)
@click.option(
    "--show-completion",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_completion,
    help="Show completion for the current shell, to copy it or customize the installation.",
)
def app(verbose: bool) -> None:
    output.VERBOSE = verbose


def main() -> None:
    app(prog_name=None, complete_var=COMPLETE_VARIABLE)


if __name__ == "__main__":
    main()
