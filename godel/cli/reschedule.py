"""`godel reschedule POLICY [--dry-run]` and `godel get policies`: the Rescheduler's API.

The rescheduler is found through ``--rescheduler`` / ``$GODEL_RESCHEDULER``, else the local
cluster in ``$GODEL_HOME``. A plan prints as a table of moves (with their batch and, for a dry
run, where the simulated scheduler put each replacement) and a before/after summary.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from godel.cli.common import home_option, local_address, rescheduler_option
from godel.cli.output import age, fail, print_json, print_table

if TYPE_CHECKING:  # the client and the messages load when a command runs
    from godel.client import ReschedulerClient
    from protos.godel.v1 import api_pb2


def rescheduler_client(address: str | None, home: Path | None) -> ReschedulerClient:
    from godel.client import ClientError, ReschedulerClient

    address = address or local_address("rescheduler", home, "--rescheduler")
    try:  # the credentials as the SDK finds them: $GODEL_TLS_DIR, else the home's
        return ReschedulerClient(address, home=home)
    except ClientError as exc:
        fail(str(exc))


@click.command("reschedule")
@click.argument("policy", default="", help="The policy to run (see `godel get policies`).")
@click.option("--pause", is_flag=True, help="Kill switch: no round starts, no batch is evicted.")
@click.option("--resume", is_flag=True, help="Undo --pause.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Plan and simulate the round on a copy of the state; change nothing.",
)
@click.option("--output", "-o", default="table", help="table (default) or json.")
@rescheduler_option
@home_option
def reschedule(
    policy: str,
    pause: bool,
    resume: bool,
    dry_run: bool,
    output: str,
    rescheduler: str | None,
    home: Path | None,
) -> None:
    """Run one rescheduling round of POLICY now and print its plan (a dry run simulates it and
    changes nothing); or pause / resume every policy."""
    from godel.client import ClientError

    if output not in ("table", "json"):
        fail(f"unknown output format {output!r} (table or json)")
    if pause or resume:
        if pause and resume:
            fail("--pause and --resume exclude each other")
        if policy or dry_run:
            fail("--pause / --resume take no POLICY and no --dry-run: they act on every policy")
        with rescheduler_client(rescheduler, home) as client:
            try:
                paused = client.pause(pause)
            except ClientError as exc:
                fail(str(exc))
        click.echo("rescheduling paused" if paused else "rescheduling resumed")
        return
    if not policy:
        fail("name a POLICY (see `godel get policies`), or --pause / --resume")
    with rescheduler_client(rescheduler, home) as client:
        try:
            response = client.trigger(policy, dry_run=dry_run)
        except ClientError as exc:
            fail(str(exc))
    if output == "json":
        from google.protobuf import json_format

        print_json([json_format.MessageToDict(p) for p in response.plans])
        return
    for plan in response.plans:
        print_plan(plan)


def print_plan(plan: api_pb2.Plan) -> None:
    mode = "dry run" if plan.dry_run else "round"
    if plan.movements:
        unreserved = (
            f", {plan.unreserved} moves dropped: their room could not be reserved"
            if plan.unreserved
            else ""
        )
        click.echo(
            f"movements: {', '.join(plan.movements)} ({plan.evicted} pods evicted{unreserved})"
        )
    click.echo(
        f"policy {plan.policy}: {mode} {plan.generation} {plan.outcome}: {plan.message} "
        f"({plan.duration_ms} ms, store revision {plan.revision})"
    )
    if plan.moves:
        click.echo("")
        headers = ["BATCH", "POD", "JOB", "FROM", "TO"]
        if plan.dry_run:
            headers.append("SIMULATED")
        rows = []
        for m in plan.moves:
            row: list[object] = [m.batch, m.pod, m.job, m.from_node, m.to_node]
            if plan.dry_run:
                row.append(m.simulated_node or "(unplaced)")
            rows.append(row)
        print_table(headers, rows)
    if plan.rejected:
        click.echo("")
        click.echo("dropped:")
        print_table(
            ["POD", "FROM", "TO", "REASON"],
            [[r.pod, r.from_node, r.to_node, r.reason] for r in plan.rejected],
        )
    if plan.left_whole:
        click.echo("")
        click.echo("left whole (a running gang moves whole or not at all):")
        print_table(["JOB", "REASON"], [[g.job, g.reason] for g in plan.left_whole])
    if plan.HasField("after"):
        click.echo("")
        print_figures(plan.before, plan.after, gpu=_has_gpus(plan), spread=_is_spread(plan))


def _has_gpus(plan: api_pb2.Plan) -> bool:
    return plan.before.gpu_fragmentation > 0 or plan.before.whole_free_gpu_nodes > 0


def _is_spread(plan: api_pb2.Plan) -> bool:
    return plan.before.spread_share > 0 or plan.after.spread_share > 0


def print_figures(
    before: api_pb2.ClusterFigures, after: api_pb2.ClusterFigures, *, gpu: bool, spread: bool
) -> None:
    rows: list[list[object]] = [
        ["free nodes", before.free_nodes, after.free_nodes],
        [
            "utilisation spread",
            f"{before.utilisation_spread:.3f}",
            f"{after.utilisation_spread:.3f}",
        ],
    ]
    if gpu:
        rows.append(
            [
                "gpu fragmentation",
                f"{before.gpu_fragmentation:.1%}",
                f"{after.gpu_fragmentation:.1%}",
            ]
        )
        rows.append(
            [
                "expected gpu fragmentation",
                f"{before.expected_gpu_fragmentation:.1%}",
                f"{after.expected_gpu_fragmentation:.1%}",
            ]
        )
        rows.append(
            ["whole free gpu nodes", before.whole_free_gpu_nodes, after.whole_free_gpu_nodes]
        )
    if spread:
        rows.append(
            ["jobs within max skew", f"{before.spread_share:.1%}", f"{after.spread_share:.1%}"]
        )
    rows.append(["pods placed nowhere", "", after.unplaced_pods])
    print_table(["", "BEFORE", "AFTER"], rows)


def get_policies(output: str, rescheduler: str | None, home: Path | None) -> None:
    """`godel get policies`: each policy's plugins, triggers and last round."""
    from godel.client import ClientError

    with rescheduler_client(rescheduler, home) as client:
        try:
            listing = client.list_policies()
            policies, paused = list(listing.policies), listing.paused
        except ClientError as exc:
            fail(str(exc))
    if output == "json":
        from google.protobuf import json_format

        print_json([json_format.MessageToDict(p) for p in policies])
        return
    if not policies:
        click.echo("No policies configured.", err=True)
        return
    if paused:
        click.echo("rescheduling is PAUSED (godel reschedule --resume)", err=True)
    rows = []
    for p in policies:
        last = p.last_round
        rows.append(
            [
                p.name,
                ",".join(p.detectors),
                ",".join(p.checks) or "<none>",
                p.schedule,
                _ago(p.last_run_ms) if p.last_run_ms else "<never>",
                f"{last.outcome}: {len(last.moves)} moves" if p.HasField("last_round") else "",
            ]
        )
    print_table(["NAME", "PLUGIN", "CHECKS", "TRIGGERS", "LAST-ROUND", "RESULT"], rows)


def _ago(ms: int) -> str:
    return f"{age(time.time() - ms / 1000)} ago"
