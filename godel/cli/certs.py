"""`godel certs`: the cluster's CA and the certificates of services, the admin and tenants.

`godel up` runs `init` for its home by itself; compose runs it once in its ``certs`` service,
writing to a volume the other services mount. The issuing is in :mod:`godel.tls`.
"""

from __future__ import annotations

from pathlib import Path

import click

from godel import local, tls
from godel.cli.common import home_option
from godel.cli.output import Group, fail


@click.group(
    "certs",
    cls=Group,
    help="The cluster CA and its certificates (mutual TLS between services and clients).",
    no_args_is_help=True,
)
def certs_app() -> None:
    pass


dir_option = click.option(
    "--dir",
    "directory",
    envvar=tls.TLS_DIR_VARIABLE,
    type=click.Path(path_type=Path),
    show_envvar=True,
    help="Credentials directory (default: HOME/tls).",
)


def _directory(directory: Path | None, home: Path | None) -> Path:
    return directory or local.GodelHome(home or local.default_home()).tls_dir


@certs_app.command("init")
@dir_option
@home_option
@click.option(
    "--host",
    multiple=True,
    help="Another name or address the services are dialled at (repeatable), e.g. a "
    "compose service name; loopback and this machine's name are always in.",
)
def init(directory: Path | None, home: Path | None, host: tuple[str, ...]) -> None:
    """Create the cluster CA with the service and admin certificates (kept if they exist)."""
    target = _directory(directory, home)
    existed = (target / f"{tls.CA}.crt").exists()
    try:
        from godel import pki  # cryptography: only for the commands that make certificates

        pki.init_cluster(target, list(host))
    except (tls.CredentialsError, OSError) as exc:
        fail(str(exc))
    click.echo(f"{'kept the' if existed else 'created a'} cluster CA in {target}")


@certs_app.command("issue")
@click.argument("name", help="The identity: a tenant's name, or an admin's.")
@click.option("--role", default="tenant", help="tenant (default), admin or service.")
@click.option("--queue", multiple=True, help="A queue the tenant may submit to (repeatable).")
@dir_option
@home_option
def issue(
    name: str, role: str, queue: tuple[str, ...], directory: Path | None, home: Path | None
) -> None:
    """Issue a certificate signed by the cluster CA: NAME.crt and NAME.key beside it.

    A program uses it with GODEL_IDENTITY=NAME (and GODEL_TLS_DIR when not the home's).
    """
    if role not in tls.ROLES:
        fail(f"--role must be one of {', '.join(tls.ROLES)}, not {role!r}")
    if queue and role != "tenant":
        fail("--queue is for tenants: the admin may use every queue")
    target = _directory(directory, home)
    try:
        from godel import pki

        path = pki.issue(target, name, role, queues=list(queue))  # type: ignore[arg-type]
    except tls.CredentialsError as exc:
        fail(str(exc))
    click.echo(f"issued {path} ({role} {name!r}; queues: {', '.join(queue or []) or 'none'})")
