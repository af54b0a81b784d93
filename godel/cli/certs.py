"""`godel certs`: the cluster's CA and the certificates of services, the admin and tenants.

`godel up` runs `init` for its home by itself; compose runs it once in its ``certs`` service,
writing to a volume the other services mount. The issuing is in :mod:`foundation.tls`.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import click

from foundation import tls
from godel import local
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
@click.option(
    "--agent",
    multiple=True,
    metavar="NAME[=NODE,...]",
    help="A node agent (its --name) to issue its own certificate for, naming the nodes it "
    "serves: node names or prefixes ending in '*' (default NAME-*: its hollow nodes). "
    "Repeatable.",
)
def init(
    directory: Path | None, home: Path | None, host: tuple[str, ...], agent: tuple[str, ...]
) -> None:
    """Create the cluster CA with each service kind's, the probes' and the admin's certificates,
    and each --agent's own. What exists is kept; missing certificates are issued (a directory
    from an older release gains the per-kind service identities), an agent's again when it
    named other nodes."""
    target = _directory(directory, home)
    existed = (target / f"{tls.CA}.crt").exists()
    agents = dict(_agent(value) for value in agent)
    try:
        from foundation import pki  # cryptography: only for the commands that make certificates

        issued = pki.init_cluster(target, list(host), agents=agents)
    except (tls.CredentialsError, OSError) as exc:
        fail(str(exc))
    click.echo(f"{'kept the' if existed else 'created a'} cluster CA in {target}")
    if existed and issued:
        click.echo(f"issued the missing certificates: {', '.join(issued)}")


def _agent(value: str) -> tuple[str, list[str]]:
    """``NAME`` or ``NAME=NODE,NODE``: an agent and the nodes its certificate names."""
    from services.nodeagent.nodes import agent_nodes

    name, given, nodes = value.partition("=")
    if given and not nodes.strip():
        fail(f"--agent {value!r}: name its nodes after '=', or leave out '=' for {name}-*")
    return name, [n.strip() for n in nodes.split(",")] if given else agent_nodes(name)


@certs_app.command("issue")
@click.argument("name", help="The identity: a tenant's name, an admin's, or a node agent's.")
@click.option("--role", default="tenant", help="tenant (default), admin, service or nodeagent.")
@click.option("--queue", multiple=True, help="A queue the tenant may submit to (repeatable).")
@click.option(
    "--node",
    multiple=True,
    help="For --role nodeagent: a node the agent serves, or a prefix ending in '*' "
    "(repeatable; default NAME-*, its hollow nodes).",
)
@click.option(
    "--host",
    multiple=True,
    help="For --role nodeagent: another name or address it is dialled at (repeatable).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an identity issued before (its old certificate stays valid until it expires).",
)
@dir_option
@home_option
def issue(
    name: str,
    role: str,
    queue: tuple[str, ...],
    node: tuple[str, ...],
    host: tuple[str, ...],
    force: bool,
    directory: Path | None,
    home: Path | None,
) -> None:
    """Issue a certificate signed by the cluster CA: NAME.crt and NAME.key beside it.

    A program uses it with GODEL_IDENTITY=NAME (and GODEL_TLS_DIR when not the home's). The
    cluster's own identities (the CA, the services', the admin's) are `godel certs init`'s and
    never issued here; an identity issued before is kept unless --force.

    --role nodeagent issues node agent NAME (its --name) its own certificate,
    nodeagent.NAME.crt, naming the nodes it serves (--node): the Binder lets it evict only
    best-effort pods there, for tidal pressure.
    """
    agent = role == tls.NODEAGENT
    if role not in tls.ROLES and not agent:
        fail(f"--role must be one of {', '.join((*tls.ROLES, tls.NODEAGENT))}, not {role!r}")
    if queue and role != "tenant":
        fail("--queue is for tenants: the admin may use every queue")
    if (node or host) and not agent:
        fail(f"--{'node' if node else 'host'} is for node agents (--role nodeagent)")
    target = _directory(directory, home)
    from foundation import pki

    stem = tls.agent_stem(name) if agent else name
    if stem in pki.reserved_names():
        fail(
            f"{name!r} is one of the cluster's own identities ({', '.join(pki.reserved_names())}),"
            " made by `godel certs init`: issue another name",
            code=2,
        )
    if (target / f"{stem}.crt").exists() and not force:
        fail(
            f"{name!r} is already issued ({target / (stem + '.crt')}): pass --force to replace it",
            code=2,
        )
    try:
        if role in tls.ROLES:
            path = pki.issue(target, name, role, queues=list(queue))
            click.echo(f"issued {path} ({role} {name!r}; queues: {', '.join(queue) or 'none'})")
        else:
            nodes = list(node) or _agent(name)[1]
            path = pki.issue_agent(target, name, nodes, hosts=list(host))
            click.echo(f"issued {path} (node agent {name!r}; nodes: {', '.join(nodes)})")
    except tls.CredentialsError as exc:
        fail(str(exc))


@certs_app.command("export")
@click.argument("name", default=tls.ADMIN, help="The identity to export (default: admin).")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Where to write the bundle (default: NAME.p12 beside it).",
)
@click.option(
    "--password",
    envvar="GODEL_P12_PASSWORD",
    help="The bundle's password (default: a random one, printed).",
)
@dir_option
@home_option
def export(
    name: str,
    out: Path | None,
    password: str | None,
    directory: Path | None,
    home: Path | None,
) -> None:
    """Write NAME's certificate and key as a PKCS#12 bundle (.p12), for a browser or an OS key
    store: an exposed dashboard (HTTPS) asks for a client certificate of the cluster. Import the
    bundle as your certificate and ca.crt as a trusted authority."""
    source = _directory(directory, home)
    target = out or source / f"{name}.p12"
    chosen = password if password is not None else secrets.token_urlsafe(12)
    try:
        from foundation import pki

        bundle = pki.export_pkcs12(source, name, chosen.encode())
        # 0600 from the start, as the key it holds.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(bundle)
    except (tls.CredentialsError, OSError) as exc:
        fail(str(exc))
    click.echo(f"wrote {target} ({name!r}); authority to trust: {source / (tls.CA + '.crt')}")
    if password is None:
        click.echo(f"password: {chosen}")
