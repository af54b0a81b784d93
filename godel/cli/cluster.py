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

import click

from godel import client, local
from godel.cli import output
from godel.cli.common import home_option
from godel.cli.output import OutputFormat, age, fail, print_json, print_table
from store.lease import holder_name

INSECURE_WARNING = (
    "WARNING: INSECURE CLUSTER (started with --insecure): gRPC is plaintext and "
    "unauthenticated; anyone who reaches its ports may submit, read and delete anything"
)


@click.command("up")
@home_option
@click.option("--schedulers", type=click.IntRange(min=1), default=2, help="Scheduler shards.")
@click.option(
    "--standby-shards",
    type=click.IntRange(min=0),
    default=0,
    help="Spare scheduler processes, warm (view synced), each standing by for every shard: "
    "one takes a shard's name when its process dies or stops.",
)
@click.option(
    "--binders",
    type=click.IntRange(min=1),
    default=2,
    help="Binders (one leader, the rest standby).",
)
@click.option("--nodeagents", type=click.IntRange(min=1), default=1, help="Node agent processes.")
@click.option(
    "--hollow-nodes",
    type=click.IntRange(min=0),
    default=100,
    help="Simulated nodes (4 CPU, 32 GiB, 110 pods each).",
)
@click.option(
    "--hollow-gpus",
    type=click.IntRange(min=0),
    default=0,
    help="GPU cards of each simulated node (of --hollow-gpu-model).",
)
@click.option(
    "--hollow-gpu-model",
    default="",
    help="The model of the simulated nodes' cards, e.g. V100M32.",
)
@click.option(
    "--hollow-node-list",
    type=click.Path(dir_okay=False),
    default=None,
    help="A CSV of simulated nodes, each its own cpu, memory, cards and model "
    "(sn,cpu_milli,memory_mib,gpu,model, as the openb trace's node lists), instead of "
    "--hollow-nodes; split among the node agents.",
)
@click.option(
    "--process-node/--no-process-node",
    default=True,
    help="Also run real processes on this machine, as one process-mode node (metrics and the "
    "dashboard then require a client certificate on loopback too: pods can reach it).",
)
@click.option(
    "--store-replicas",
    type=click.IntRange(min=0),
    default=0,
    help="Store replicas: with any, three Sentinels fail over to one when the primary "
    "dies, and every write waits until a replica has it.",
)
@click.option(
    "--timeout", type=click.FloatRange(min=1), default=30.0, help="Seconds to wait for SERVING."
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=5.0,
    help="Services' shutdown grace period, in seconds.",
)
@click.option("--foreground", is_flag=True, help="Stay attached; Ctrl-C stops the cluster.")
@click.option(
    "--run-as",
    default="",
    show_default=False,
    help="One user every process-mode pod runs as, never root (default: each pod a uid of "
    "its own when started as root, else yours).",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Serve plaintext gRPC with no authentication: anyone who reaches a port may "
    "do anything. Default: a cluster CA and mutual TLS.",
)
@click.option(
    "--dashboard/--no-dashboard",
    default=True,
    help="Also start the web dashboard (its URL is in `godel status`).",
)
def up(
    home: Path | None,
    schedulers: int,
    standby_shards: int,
    binders: int,
    nodeagents: int,
    hollow_nodes: int,
    hollow_gpus: int,
    hollow_gpu_model: str,
    hollow_node_list: str | None,
    process_node: bool,
    store_replicas: int,
    timeout: float,
    grace: float,
    foreground: bool,
    run_as: str,
    insecure: bool,
    dashboard: bool,
) -> None:
    """Start a local cluster: the store server and every service as separate processes.

    Uses the store at $GODEL_REDIS_URL instead of starting one when that is set. Issues the
    cluster's CA and certificates into HOME/tls (kept across restarts); the CLI and the SDK
    pick the admin identity up from there.
    """
    from store import redact_url

    godel_home = _home(home)
    given = click.get_current_context().get_parameter_source("hollow_nodes")
    if hollow_node_list and given == click.core.ParameterSource.COMMANDLINE:
        fail("--hollow-node-list names the simulated nodes: no --hollow-nodes with it")
    spec = local.ClusterSpec(
        schedulers=schedulers,
        standby_shards=standby_shards,
        binders=binders,
        nodeagents=nodeagents,
        ready_timeout=timeout,
        grace_seconds=grace,
        hollow_nodes=hollow_nodes,
        hollow_gpus=hollow_gpus,
        hollow_gpu_model=hollow_gpu_model,
        hollow_node_list=hollow_node_list or "",
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
        click.echo(INSECURE_WARNING, err=True)
    else:
        click.echo(f"\nmutual TLS: credentials in {godel_home.tls_dir} (admin.crt is yours)")
    if state.https_on_loopback:
        click.echo(
            "metrics and the dashboard require a client certificate (process-mode pods run on "
            "this machine): `godel certs export` writes admin.p12 for your browser"
        )
    for c in state.components:
        if c.web_url:
            click.echo(f"\ndashboard: {c.web_url}")
    if not foreground:
        click.echo(f"\ncluster running in {godel_home}; stop it with `{_down_command(home)}`")
        return
    click.echo(f"\ncluster running in {godel_home}; Ctrl-C stops it")
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    signal.sigwait(stop_signals)
    _print_outcomes(local.down(godel_home))


@click.command("down")
@home_option
@click.option(
    "--purge",
    is_flag=True,
    help="Also remove everything the cluster keeps in its home (store data and replicas, "
    "Sentinels, logs, certificates, state), and the home once empty.",
)
def down(home: Path | None, purge: bool) -> None:
    """Stop the local cluster: SIGTERM every service, then the store; SIGKILL stragglers."""
    godel_home = _home(home)
    try:
        outcomes = local.down(godel_home)
    except local.StateError as exc:
        fail(str(exc))
    if not outcomes:
        click.echo(f"no cluster running in {godel_home}")
    else:
        _print_outcomes(outcomes)
    if purge:
        try:
            removed = godel_home.purge()
        except local.StateError as exc:
            fail(str(exc))
        for path in removed:
            click.echo(f"removed {path}")


@click.command("status")
@home_option
@click.option("--output", "-o", type=click.Choice([f.value for f in OutputFormat]), default="table")
def status(home: Path | None, output: str) -> None:
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
        click.echo(INSECURE_WARNING, err=True)
    leader = holder_name(lease.holder) if lease is not None else ""
    if output == OutputFormat.json:
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
                    s.metrics_url or "-",
                    "yes" if s.alive else "no",
                    s.health,
                    _age(s.started),
                )
                for s in statuses
            ],
        )
        click.echo("")
        if lease is None:
            click.echo("binder leader: unknown (the store did not answer)")
        elif leader:
            click.echo(f"binder leader: {leader} at {lease.holder_address} (epoch {lease.epoch})")
        else:
            click.echo(f"binder leader: none (last epoch {lease.epoch})")
        for s in statuses:
            if s.web_url:
                click.echo(f"dashboard: {s.web_url}")
        dispatcher = next((s for s in statuses if s.kind == "dispatcher" and s.healthy), None)
        if dispatcher is not None:
            _print_partitions(dispatcher.address)
    unhealthy = [s.name for s in statuses if not s.healthy]
    if unhealthy:
        fail(f"unhealthy: {', '.join(unhealthy)}")


@click.command("audit")
@home_option
@click.option(
    "--store-url",
    envvar="GODEL_REDIS_URL",
    show_envvar=True,
    help="Audit this store instead of the local cluster's.",
)
def audit(home: Path | None, store_url: str | None) -> None:
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
        click.echo(f"{report.nodes} nodes, {report.pods} pods, {report.bound} bound or running")
        for violation in report.violations:
            click.echo(f"violation: {violation}", err=True)
        if not report.ok:
            raise click.exceptions.Exit(1)
        click.echo("invariants hold: no over-commit, every pod bound once, gangs whole")

    try:
        asyncio.run(check())
    except StoreError as exc:
        fail(str(exc))


@click.command("backup")
@click.argument("file", type=click.Path(path_type=Path), help="Where to write the backup.")
@home_option
@click.option(
    "--store-url",
    envvar="GODEL_REDIS_URL",
    show_envvar=True,
    help="Back up this store instead of the local cluster's.",
)
def backup(file: Path, home: Path | None, store_url: str | None) -> None:
    """Write a consistent snapshot of the cluster's store to FILE, while the cluster runs."""
    from godel.local.backup import backup as take_backup
    from store import StoreError

    url = _store_url(home, store_url)
    try:
        snapshot = take_backup(url, file)
    except StoreError as exc:
        fail(str(exc))
    click.echo(f"backed up {len(snapshot.entries)} keys at revision {snapshot.revision} to {file}")


@click.command("restore")
@click.argument("file", type=click.Path(path_type=Path), help="A file written by `godel backup`.")
@home_option
def restore(file: Path, home: Path | None) -> None:
    """Bring the stopped local cluster back to the backup in FILE; `godel up` then starts from it."""
    from godel.local.backup import restore as run_restore
    from store import StoreError

    try:
        snapshot = run_restore(_home(home), file)
    except (StoreError, local.ClusterError, local.StateError) as exc:
        fail(str(exc))
    click.echo(
        f"restored {len(snapshot.entries)} keys at revision {snapshot.revision} "
        f"(backup of {snapshot.created}) into {_home(home)}; start it with `godel up`"
    )


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
    shard has one (services/dispatcher/dispatching/partitions.py)."""
    # Here, not at the top: the cluster commands that talk to no API do not load the messages.
    from protos.godel.v1 import objects_pb2

    try:
        with client.ProtoClient(address, timeout=5.0) as api:
            shards = api.list(objects_pb2.SchedulerInstance)
    except client.ClientError as exc:
        click.echo(f"\npartitioning: unknown ({exc})")
        return
    partitions = {s.metadata.name: len(s.spec.partition) for s in shards}
    on = any(partitions.values())
    click.echo(f"\npartitioning: {'on' if on else 'off'}")
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
        click.echo(f"{name} {outcome}")


def _age(started_iso: str) -> str:
    return age(time.time() - timegm(time.strptime(started_iso, "%Y-%m-%dT%H:%M:%SZ")))
