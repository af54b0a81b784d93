"""The report of a benchmark: JSON (everything), Markdown (tables) and PNG plots."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure


def write(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write ``<workload>-<timestamp>.{json,md}`` and ``-throughput.png`` / ``-latency.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    stem = out_dir / f"{report['workload']}{'-quick' if report['quick'] else ''}-{stamp}"
    paths = {
        "json": stem.with_suffix(".json"),
        "md": stem.with_suffix(".md"),
        "throughput": Path(f"{stem}-throughput.png"),
        "latency": Path(f"{stem}-latency.png"),
    }
    paths["json"].write_text(json.dumps(report, indent=1) + "\n")
    paths["md"].write_text(markdown(report, paths))
    _plot_throughput(report, paths["throughput"])
    _plot_latency(report, paths["latency"])
    return paths


def markdown(report: dict[str, Any], paths: dict[str, Path] | None = None) -> str:
    m = report["machine"]
    lines = [
        f"# {report['workload']}{' (quick)' if report['quick'] else ''}",
        "",
        report["description"].strip(),
        "",
        f"- date: {report['started']}; command: `{report['command']}`",
        f"- machine: {m['cpus']} cores, {m['memory_gib']} GiB, {m['platform']}, "
        f"Python {m['python']}; store fsync: {report['fsync']}"
        f"{'; store allocator: ' + m['store_allocator'] if m.get('store_allocator') else ''}"
        f"{'; services: ' + m['services_allocator'] if m.get('services_allocator') else ''}",
        "",
        summary_table(report),
        "",
        "Throughput: pods bound per 1 s sample during the measured phase (scheduler_perf style);",
        "overall = measured pods / time from the first submit to the last bind.",
        "Latency: submit -> bound per pod (creation_timestamp_ms to status.bound_ms).",
        *leadership_section(report),
        *restart_section(report),
        *rescheduling_section(report),
        "## CPU seconds (user+sys) and peak RSS per process, measured phase",
        "",
    ]
    components = sorted({c for r in report["runs"] for c in r["resources"]})
    lines.append("| process | " + " | ".join(_label(r) for r in report["runs"]) + " |")
    lines.append("|---|" + "---|" * len(report["runs"]))
    for c in components:
        cells = []
        for r in report["runs"]:
            u = r["resources"].get(c)
            cells.append(f"{u['cpu_seconds']:.1f} s / {u['peak_rss_mib']:.0f} MiB" if u else "")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## CPU ms (user+sys) per measured pod, measured phase",
        "",
        "| processes | " + " | ".join(_label(r) for r in report["runs"]) + " |",
        "|---|" + "---|" * len(report["runs"]),
    ]
    per_pod = [cpu_ms_per_pod(r) for r in report["runs"]]
    for group in CPU_GROUPS:
        lines.append(f"| {group} | " + " | ".join(f"{p[group]:.3f}" for p in per_pod) + " |")
    if paths:
        lines += [
            "",
            f"![throughput]({paths['throughput'].name})",
            f"![latency]({paths['latency'].name})",
        ]
    return "\n".join(lines) + "\n"


CPU_GROUPS = ("shards", "binders", "services")
"""The rows of the CPU-per-pod table: the scheduler processes, the binders, and every process
of the cluster (the store included; the load generator not)."""


def cpu_ms_per_pod(run: dict[str, Any]) -> dict[str, float]:
    """CPU milliseconds per measured pod over the measured phase, by CPU_GROUPS: the figure to
    compare on a shared machine, where wall-clock rates move with the other processes' load."""
    pods = run["measured_pods"] or 1

    def total(keep: Callable[[str], bool]) -> float:
        return sum(float(u["cpu_seconds"]) for c, u in run["resources"].items() if keep(c))

    return {
        "shards": 1000 * total(lambda c: c.startswith("scheduler-")) / pods,
        "binders": 1000 * total(lambda c: c.startswith("binder-")) / pods,
        "services": 1000 * total(lambda c: c != "load") / pods,
    }


def summary_table(report: dict[str, Any]) -> str:
    base = report.get("baseline")
    head = [
        "run", "nodes", "shards", "init", "measured", "avg pods/s", "P50", "P90", "P99",
        "overall pods/s", "total s", "latency P50 / P99 ms",
    ]  # fmt: skip
    # The Binder's conflict rate (conflicts per pod proposed), where shards compete.
    conflicts = any(r["cluster"]["shards"] > 1 and "conflicts" in r for r in report["runs"])
    if conflicts:
        head += ["conflicts", "partitioned shards"]
    if base:
        head.append(f"avg / overall vs {base}")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in report["runs"]:
        t, lat = r["throughput"], r["latency_ms"]
        cells = [
            _label(r),
            f"{r['cluster']['nodes']:,}",
            str(r["cluster"]["shards"]),
            f"{r['init_pods']:,}",
            f"{r['measured_pods']:,}",
            f"{t['average']:,.0f}",
            f"{t['p50']:,.0f}",
            f"{t['p90']:,.0f}",
            f"{t['p99']:,.0f}",
            f"{t['overall']:,.0f}",
            f"{r['total_seconds']:.1f}",
            f"{lat['p50']:,.0f} / {lat['p99']:,.0f}",
        ]
        if conflicts:
            c = r.get("conflicts", {})
            cells.append(
                f"{c.get('rate_percent', 0):.2f} % ({c.get('conflicted', 0):,} of"
                f" {c.get('proposed', 0):,})"
            )
            cells.append(str(c.get("partitioned_shards", 0)))
        if base:
            ratios = r.get("ratio_to_baseline", {})
            cells.append(" / ".join(_times(ratios.get(k)) for k in ("average", "overall")))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def leadership_section(report: dict[str, Any]) -> list[str]:
    """How steady the Binder's lease was: changes of hands per phase and the worst renewal
    lateness (a lease lapses when lateness reaches its duration minus the renewal period)."""
    runs = [r for r in report["runs"] if r.get("leadership")]
    if not runs:
        return [""]
    lines = [
        "",
        "## Binder leadership",
        "",
        "| run | lease changes (init / measured) | epoch at end | worst renewal lateness |",
        "|---|---|---|---|",
    ]
    for r in runs:
        x = r["leadership"]
        lines.append(
            f"| {_label(r)} | {x['changes_init']} / {x['changes_measured']} | {x['epoch']} | "
            f"{x['worst_renewal_lateness_s'] * 1000:,.0f} ms |"
        )
    return [*lines, ""]


def restart_section(report: dict[str, Any]) -> list[str]:
    """Each kind of service started again after a SIGTERM, seconds until it served (its
    informer synced and its caches built); how long binding stopped while the binder restarted
    (a standby leads once the lease is released); and the seconds a standby Binder took to
    lead after the leader's SIGKILL (the lease's expiry and the catch-up); with a spare shard,
    how long until a process served as the restarted shard, and the seconds the spare took to
    register as a shard killed -9 and to serve as it (the lease's expiry: no listing)."""
    runs = [r for r in report["runs"] if r.get("restart_seconds")]
    if not runs:
        return [""]
    lines = [
        "",
        "## Restarts: seconds until serving again",
        "",
        "| run | component | seconds | CPU seconds by then |",
        "|---|---|---|---|",
    ]
    for r in runs:
        cpu = r.get("restart_cpu_seconds", {})
        for name, seconds in r["restart_seconds"].items():
            used = f"{cpu[name]:.1f}" if name in cpu else "—"
            lines.append(f"| {_label(r)} | {name} | {seconds:.1f} | {used} |")
        for name, seconds in r.get("binding_resumed_seconds", {}).items():
            lines.append(
                f"| {_label(r)} | a binder leads again after {name}'s SIGTERM | {seconds:.1f} | — |"
            )
        for name, seconds in r.get("scheduling_resumed_seconds", {}).items():
            lines.append(
                f"| {_label(r)} | a process serves as {name} again after its SIGTERM | "
                f"{seconds:.1f} | — |"
            )
        if "takeover_seconds" in r:
            lines.append(
                f"| {_label(r)} | binder takeover (leader killed -9) | "
                f"{r['takeover_seconds']:.1f} | — |"
            )
        if "shard_takeover_seconds" in r:
            took = r["shard_takeover_seconds"]
            lines.append(
                f"| {_label(r)} | shard takeover (scheduler-0's holder killed -9): a standby registered | "
                f"{took['registered']:.1f} | — |"
            )
            lines.append(
                f"| {_label(r)} | shard takeover (scheduler-0's holder killed -9): the standby schedules | "
                f"{took['scheduling']:.1f} | — |"
            )
    return [*lines, ""]


def rescheduling_section(report: dict[str, Any]) -> list[str]:
    """The rounds triggered after the measured phase: time and predicted effect."""
    runs = [r for r in report["runs"] if r.get("reschedule")]
    if not runs:
        return [""]
    lines = [
        "",
        "## Rescheduling round after the measured phase",
        "",
        "| run | policy | outcome | moves | batches | plan s | RPC s | gpu frag before → after |"
        " whole free gpu nodes | free nodes | jobs within skew | placed nowhere |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        x = r["reschedule"]
        b, a = x["before"], x["after"]
        lines.append(
            f"| {_label(r)} | {x['policy']}{' (dry run)' if x['dry_run'] else ''} | "
            f"{x['outcome']} | {x['moves']:,} | {x['batches']} | {x['plan_seconds']:.2f} | "
            f"{x['rpc_seconds']:.2f} | {b['gpu_fragmentation']:.1%} → {a['gpu_fragmentation']:.1%} | "
            f"{b['whole_free_gpu_nodes']:,} → {a['whole_free_gpu_nodes']:,} | "
            f"{b['free_nodes']:,} → {a['free_nodes']:,} | "
            f"{_share(b['spread_share'], a['spread_share'])} | {a['unplaced_pods']:,} |"
        )
    lines.append("")
    executed = [r for r in runs if "evicted" in r["reschedule"]]
    if executed:
        lines += [
            "Executed rounds (RPC s = from the trigger until the last batch's replacements run):",
            "",
            "| run | evicted | movements | moves/s | gpu frag measured after | whole free gpu"
            " nodes measured after | gangs moved whole / left whole / partly evicted | message |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in executed:
            x = r["reschedule"]
            m = x["measured_after"]
            g = x.get("gangs") or {}
            gangs = (
                f"{g['moved_whole']} / {g['left_whole']} / {g['partly_evicted']} of {g['gangs']}"
                if g.get("gangs")
                else "-"
            )
            lines.append(
                f"| {_label(r)} | {x['evicted']:,} | {x['movements']} | "
                f"{x['moves_per_second']:,.0f} | {m.get('gpu_fragmentation', 0):.1%} | "
                f"{m.get('whole_free_gpu_nodes', 0):,} | {gangs} | {x['message']} |"
            )
        lines.append("")
    loads = [r for r in executed if r["reschedule"].get("measured_load")]
    if loads:
        lines += [
            "Measured load (what the node agents report; executed rounds: after the replacements"
            " run), percent of each node's CPU and of its bandwidth:",
            "",
            "| run | nodes | CPU sd before → after | CPU max before → after | network sd before"
            " → after | network max before → after |",
            "|---|---|---|---|---|---|",
        ]
        for r in loads:
            b, a = (
                r["reschedule"]["measured_load"]["before"],
                r["reschedule"]["measured_load"]["after"],
            )
            lines.append(
                f"| {_label(r)} | {b['nodes']:,} | {b['cpu']['stddev']:.1f} → {a['cpu']['stddev']:.1f}"
                f" | {b['cpu']['max']:.1f} → {a['cpu']['max']:.1f}"
                f" | {b['network']['stddev']:.1f} → {a['network']['stddev']:.1f}"
                f" | {b['network']['max']:.1f} → {a['network']['max']:.1f} |"
            )
        lines.append("")
    return lines


def _share(before: float, after: float) -> str:
    """Jobs within max skew: only TopologySpread policies report it."""
    return f"{before:.1%} → {after:.1%}" if before or after else "-"


def _times(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio is not None else "-"


def _label(run: dict[str, Any]) -> str:
    return str(run["variant"] or run["name"])


def _plot_throughput(report: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in report["runs"]:
        timeline = r["timeline"]
        xs = [t for t, _ in timeline[1:]]
        ys = [(b - pb) / (t - pt) if t > pt else 0.0 for (pt, pb), (t, b) in pairwise(timeline)]
        ax.plot(xs, ys, marker=".", label=_label(r))
    _save(
        fig,
        ax,
        ("seconds since first submit", "pods bound per second"),
        f"{report['workload']}: throughput",
        path,
    )


def _plot_latency(report: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in report["runs"]:
        cdf = r["latency_ms"]["cdf"]
        if cdf:
            ax.plot(cdf, [i / (len(cdf) - 1) for i in range(len(cdf))], label=_label(r))
    _save(
        fig,
        ax,
        ("submit -> bound latency (ms)", "fraction of measured pods"),
        f"{report['workload']}: latency CDF",
        path,
    )


def _save(fig: Figure, ax: Axes, labels: tuple[str, str], title: str, path: Path) -> None:
    """Label, title and grid a chart of one line per run, write it to ``path`` and close it."""
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
