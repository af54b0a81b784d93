"""`godel up`, `godel down`, `godel status`: a local cluster of real processes under $GODEL_HOME.

The commands parse options and print; the process management is in :mod:`godel.local`.
"""

from __future__ import annotations

import shlex
import signal
import time
from calendar import timegm
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from godel import client, local
from godel.cli import output
from godel.cli.output import OutputFormat, fail, print_json, print_table

HomeOption = Annotated[
    Path | None,
    typer.Option(
        "--home",
        envvar="GODEL_HOME",
        help="State directory of the cluster: store data, logs, cluster.json (default ~/.godel).",
        show_default=False,
    ),
]


INSECURE_WARNING = (
    "WARNING: INSECURE CLUSTER (started with --insecure): gRPC is plaintext and "
    "unauthenticated; anyone who reaches its ports may submit, read and delete anything"
)


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)
    app.command("audit")(audit)
    app.command("backup")(backup)
    app.command("restore")(restore)


def up(
    home: HomeOption = None,
    schedulers: Annotated[int, typer.Option(min=1, help="Scheduler shards.")] = 2,
    binders: Annotated[
        int, typer.Option(min=1, help="Binders (one leader, the rest standby).")
    ] = 2,
    nodeagents: Annotated[int, typer.Option(min=1, help="Node agent processes.")] = 1,
    hollow_nodes: Annotated[
        int, typer.Option(min=0, help="Simulated nodes (4 CPU, 32 GiB, 110 pods each).")
    ] = 100,
    process_node: Annotated[
        bool,
        typer.Option(help="Also run real processes on this machine, as one process-mode node."),
    ] = True,
    store_replicas: Annotated[
        int,
        typer.Option(
            min=0,
            help="Store replicas: with any, three Sentinels fail over to one when the primary "
            "dies, and every write waits until a replica has it.",
        ),
    ] = 0,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for SERVING.")] = 30.0,
    grace: Annotated[
        float, typer.Option(min=0, help="Services' shutdown grace period, in seconds.")
    ] = 5.0,
    foreground: Annotated[
        bool, typer.Option("--foreground", help="Stay attached; Ctrl-C stops the cluster.")
    ] = False,
    run_as: Annotated[
        str,
        typer.Option(
            "--run-as",
            help="User process-mode pods run as, never root (default: nobody when started as "
            "root, else yours).",
        ),
    ] = "",
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Serve plaintext gRPC with no authentication: anyone who reaches a port may "
            "do anything. Default: a cluster CA and mutual TLS.",
        ),
    ] = False,
    dashboard: Annotated[
        bool, typer.Option(help="Also start the web dashboard (its URL is in `godel status`).")
    ] = True,
) -> None:
    """Start a local cluster: the store server and every service as separate processes.

    Uses the store at $GODEL_REDIS_URL instead of starting one when that is set. Issues the
    cluster's CA and certificates into HOME/tls (kept across restarts); the CLI and the SDK
    pick the admin identity up from there.
    """
    from store import redact_url

    godel_home = _home(home)
    spec = local.ClusterSpec(
        schedulers=schedulers,
        binders=binders,
        nodeagents=nodeagents,
        ready_timeout=timeout,
        grace_seconds=grace,
        hollow_nodes=hollow_nodes,
        process_node=process_node,
        insecure=insecure,
        run_as=run_as,
        dashboard=dashboard,
        store_replicas=store_replicas,
    )
    try:
        state = local.up(godel_home, spec)
    except (local.ClusterError, local.StateError) as exc:
        fail(str(exc))
    print_table(
        ["NAME", "PID", "ADDRESS", "METRICS", "LOG"],
        [
            (c.name, c.pid, redact_url(c.address), c.metrics_address or "-", c.log)
            for c in state.components
        ],
    )
    if insecure:
        typer.echo(INSECURE_WARNING, err=True)
    else:
        typer.echo(f"\nmutual TLS: credentials in {godel_home.tls_dir} (admin.crt is yours)")
    for c in state.components:
        if c.web_url:
            typer.echo(f"\ndashboard: {c.web_url}")
    if not foreground:
        typer.echo(f"\ncluster running in {godel_home}; stop it with `{_down_command(home)}`")
        return
    typer.echo(f"\ncluster running in {godel_home}; Ctrl-C stops it")
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    signal.sigwait(stop_signals)
    _print_outcomes(local.down(godel_home))


def down(
    home: HomeOption = None,
    purge: Annotated[
        bool,
        typer.Option(
            "--purge", help="Also remove the cluster's state directory (store data, logs)."
        ),
    ] = False,
) -> None:
    """Stop the local cluster: SIGTERM every service, then the store; SIGKILL stragglers."""
    godel_home = _home(home)
    try:
        outcomes = local.down(godel_home)
    except local.StateError as exc:
        fail(str(exc))
    if not outcomes:
        typer.echo(f"no cluster running in {godel_home}")
    else:
        _print_outcomes(outcomes)
    if purge:
        for path in godel_home.purge():
            typer.echo(f"removed {path}")


def status(
    home: HomeOption = None,
    output: Annotated[OutputFormat, typer.Option("--output", "-o")] = OutputFormat.table,
) -> None:
    """Show every component: pid, address, alive, health; then whether the nodes are
    partitioned between the scheduler shards, and each shard's node count. Exits 1 if any
    component is unhealthy."""
    from store import redact_url

    try:
        statuses = local.status(_home(home))
        state = _home(home).load()
        lease = local.binder_lease(_home(home))
    except (local.ClusterError, local.StateError) as exc:
        fail(str(exc))
    if state is not None and state.insecure:
        typer.echo(INSECURE_WARNING, err=True)
    leader = lease.holder if lease is not None else ""
    if output is OutputFormat.json:
        print_json(
            [
                asdict(s)
                | {
                    "address": redact_url(s.address),
                    "healthy": s.healthy,
                    "leader": s.kind == "binder" and s.name == leader,
                }
                for s in statuses
            ]
        )
    else:
        print_table(
            ["NAME", "PID", "ADDRESS", "METRICS", "ALIVE", "HEALTH", "AGE"],
            [
                (
                    s.name + (" (leader)" if s.kind == "binder" and s.name == leader else ""),
                    s.pid,
                    redact_url(s.address),
                    f"http://{s.metrics_address}/metrics" if s.metrics_address else "-",
                    "yes" if s.alive else "no",
                    s.health,
                    _age(s.started),
                )
                for s in statuses
            ],
        )
        typer.echo("")
        if lease is None:
            typer.echo("binder leader: unknown (the store did not answer)")
        elif leader:
            typer.echo(f"binder leader: {leader} at {lease.holder_address} (epoch {lease.epoch})")
        else:
            typer.echo(f"binder leader: none (last epoch {lease.epoch})")
        for s in statuses:
            if s.web_url:
                typer.echo(f"dashboard: {s.web_url}")
        dispatcher = next((s for s in statuses if s.kind == "dispatcher" and s.healthy), None)
        if dispatcher is not None:
            _print_partitions(dispatcher.address)
    unhealthy = [s.name for s in statuses if not s.healthy]
    if unhealthy:
        fail(f"unhealthy: {', '.join(unhealthy)}")


def audit(
    home: HomeOption = None,
    store_url: Annotated[
        str | None,
        typer.Option(
            "--store-url",
            envvar="GODEL_REDIS_URL",
            show_default=False,
            help="Audit this store instead of the local cluster's.",
        ),
    ] = None,
) -> None:
    """Check the cluster's state against the scheduling invariants; exits 1 on any violation."""
    import asyncio

    from godel.audit import audit as run_audit
    from store import Store, StoreError

    url = _store_url(home, store_url)

    async def check() -> None:
        store = await Store.connect(url)
        try:
            report = await run_audit(store)
        finally:
            await store.close()
        typer.echo(f"{report.nodes} nodes, {report.pods} pods, {report.bound} bound or running")
        for violation in report.violations:
            typer.echo(f"violation: {violation}", err=True)
        if not report.ok:
            raise typer.Exit(1)
        typer.echo("invariants hold: no over-commit, every pod bound once, gangs whole")

    try:
        asyncio.run(check())
    except StoreError as exc:
        fail(str(exc))


def backup(
    file: Annotated[Path, typer.Argument(help="Where to write the backup.")],
    home: HomeOption = None,
    store_url: Annotated[
        str | None,
        typer.Option(
            "--store-url",
            envvar="GODEL_REDIS_URL",
            show_default=False,
            help="Back up this store instead of the local cluster's.",
        ),
    ] = None,
) -> None:
    """Write a consistent snapshot of the cluster's store to FILE, while the cluster runs."""
    from godel.local.backup import backup as take_backup
    from store import StoreError

    url = _store_url(home, store_url)
    try:
        snapshot = take_backup(url, file)
    except StoreError as exc:
        fail(str(exc))
    typer.echo(f"backed up {len(snapshot.entries)} keys at revision {snapshot.revision} to {file}")


def restore(
    file: Annotated[Path, typer.Argument(help="A file written by `godel backup`.")],
    home: HomeOption = None,
) -> None:
    """Bring the stopped local cluster back to the backup in FILE; `godel up` then starts from it."""
    from godel.local.backup import restore as run_restore
    from store import StoreError

    try:
        snapshot = run_restore(_home(home), file)
    except (StoreError, local.ClusterError, local.StateError) as exc:
        fail(str(exc))
    typer.echo(
        f"restored {len(snapshot.entries)} keys at revision {snapshot.revision} "
        f"(backup of {snapshot.created}) into {_home(home)}; start it with `godel up`"
    )


def local_address(kind: str, home: Path | None, flag: str) -> str:
    """Where the local cluster in ``home`` (default $GODEL_HOME) serves ``kind``; exits with
    an error naming ``flag`` when no cluster runs there. The lookup is the SDK's, so programs
    and the CLI find the same cluster."""
    try:
        return client.local_address(kind, home)
    except client.ClusterNotFound as exc:
        fail(f"{exc} or {flag}")


def _store_url(home: Path | None, store_url: str | None) -> str:
    """``--store-url`` if given, else the local cluster's store."""
    if store_url is not None:
        return store_url
    state = _home(home).load()
    if state is None:
        fail(f"no cluster in {_home(home)}: start one with `godel up`, or pass --store-url")
    return state.store_url


def _home(path: Path | None) -> local.GodelHome:
    # Every command that gets here drives the local-cluster machinery, which logs.
    output.configure_logging(output.VERBOSE)
    return local.GodelHome(path or local.default_home())


def _print_partitions(address: str) -> None:
    """The node shuffler's partitions as the shards' SchedulerInstances hold them: on when any
    shard has one (services/dispatcher/partitions.py)."""
    try:
        with client.ProtoClient(address, timeout=5.0) as api:
            shards = api.list("SchedulerInstance")
    except client.ClientError as exc:
        typer.echo(f"\npartitioning: unknown ({exc})")
        return
    partitions = {s.metadata.name: len(s.spec.partition) for s in shards}  # type: ignore[attr-defined]
    on = any(partitions.values())
    typer.echo(f"\npartitioning: {'on' if on else 'off'}")
    print_table(
        ["SHARD", "NODES"],
        [(name, count if on else "all") for name, count in sorted(partitions.items())],
    )


def _down_command(home: Path | None) -> str:
    """The `godel down` that stops the cluster `godel up` just started in ``home``."""
    if home is None:
        return "godel down"
    return f"godel down --home {shlex.quote(str(home))}"


def _print_outcomes(outcomes: list[tuple[str, str]]) -> None:
    for name, outcome in outcomes:
        typer.echo(f"{name} {outcome}")


def _age(started_iso: str) -> str:
    """kubectl-style age: 42s, 7m, 3h, 2d."""
    seconds = int(time.time() - timegm(time.strptime(started_iso, "%Y-%m-%dT%H:%M:%SZ")))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"
