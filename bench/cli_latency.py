"""Wall time of `godel get / describe / explain`, measured from outside the process.

    python -m bench.cli_latency                      # its own cluster: 20 hollow nodes
    python -m bench.cli_latency --home ~/.godel      # against a running local cluster
    python -m bench.cli_latency --runs 30 --json     # more runs; results as JSON
    python -m bench.cli_latency --baseline-root ../main   # also another tree's CLI, same run

Each command runs ``--runs`` times as a fresh ``python -m godel`` process (what a user's shell
does) and its wall time, from spawn to exit, is recorded; the report gives min / median / p90 per
command beside the same figures for ``python -c pass`` (the interpreter's own start-up on this
machine, in the same run), so the CLI's share reads as the difference, and the median CPU time
(user + system) of the process, which a loaded machine inflates less than wall time. With
``--baseline-root``, each command also runs from that source tree (e.g. the code before a
change) in the same run, interleaved, for a ratio. The goal (issue 12) is a median at or under
150 ms for get, describe and explain on an idle machine.

The commands run with their bytecode cached, as an installed CLI's is (pip compiles what it
installs): each process gets ``PYTHONPYCACHEPREFIX`` (a temporary directory, so no source tree
is written to) without ``PYTHONDONTWRITEBYTECODE``, and every command runs once, unmeasured,
before the measured runs. ``--no-bytecode-cache`` measures with the environment as it is
(with ``PYTHONDONTWRITEBYTECODE=1`` every run compiles the project's modules again).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from godel import local
from godel.client import ProtoClient
from protos.godel.v1 import objects_pb2 as pb

NODES = 20
ROOT = Path(__file__).resolve().parent.parent


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``argv`` in ``cwd`` (``python -m`` imports
    from there first)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _figures(samples: list[tuple[float, float]]) -> dict[str, float]:
    ordered = sorted(wall for wall, _ in samples)
    return {
        "min_ms": round(ordered[0] * 1000, 1),
        "median_ms": round(statistics.median(ordered) * 1000, 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 1),
        "cpu_median_ms": round(statistics.median(cpu for _, cpu in samples) * 1000, 1),
    }


def measure(
    home: Path, runs: int, baseline: Path | None = None, *, bytecode_cache: bool = True
) -> dict[str, dict[str, float]]:
    state = local.GodelHome(home).load()
    if state is None:
        raise SystemExit(f"no cluster in {home}")
    with ProtoClient(state.address_of("dispatcher"), home=home) as client:
        node = client.list(pb.Node)[0].metadata.name
        pods = client.list(pb.Pod)
    # The dispatcher's address given, as a remote cluster's would be: every tree measured
    # reads it alike (an older CLI may not read today's cluster.json).
    env = {**os.environ, "GODEL_HOME": str(home), "GODEL_SERVER": state.address_of("dispatcher")}
    with tempfile.TemporaryDirectory(prefix="godel-cli-latency-pyc-") as pycache:
        if bytecode_cache:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = pycache
        return _measure(env, node, pods, runs, baseline, warm_up=bytecode_cache)


def _measure(
    env: dict[str, str],
    node: str,
    pods: list[pb.Pod],
    runs: int,
    baseline: Path | None,
    *,
    warm_up: bool,
) -> dict[str, dict[str, float]]:
    godel = [sys.executable, "-m", "godel"]
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "godel get nodes": [*godel, "get", "nodes"],
        "godel get nodes -o yaml": [*godel, "get", "nodes", "-o", "yaml"],
        f"godel describe node {node}": [*godel, "describe", "node", node],
    }
    if pods:
        pod = pods[0].metadata.name
        commands[f"godel explain {pod}"] = [*godel, "explain", pod]
    trees = {"": (env, ROOT)}
    if baseline is not None:
        root = baseline.resolve()
        trees[" (baseline)"] = ({**env, "PYTHONPATH": str(root)}, root)
    samples: dict[str, list[tuple[float, float]]] = {}
    # Interleaved: a burst of load hits every command alike.
    for run in range(runs + 1 if warm_up else runs):
        for name, argv in commands.items():
            for suffix, (tree_env, cwd) in trees.items():
                if suffix and not name.startswith("godel"):
                    continue
                timing = _run(argv, tree_env, cwd)
                if run or not warm_up:  # the first round compiles and caches the bytecode
                    samples.setdefault(name + suffix, []).append(timing)
    return {name: _figures(times) for name, times in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, help="a running local cluster (default: start one)")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--baseline-root", type=Path, help="also run the CLI from this source tree, for a ratio"
    )
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="run with the environment's bytecode settings, and no warm-up round",
    )
    args = parser.parse_args()
    cache = not args.no_bytecode_cache
    if args.home is not None:
        results = measure(args.home, args.runs, args.baseline_root, bytecode_cache=cache)
    else:
        with tempfile.TemporaryDirectory(prefix="godel-cli-latency-") as tmp:
            home = local.GodelHome(Path(tmp))
            local.up(home, local.ClusterSpec(hollow_nodes=NODES, process_node=False))
            try:
                job = (
                    "apiVersion: godel/v1\nkind: Job\nmetadata: {name: probe}\n"
                    "spec: {replicas: 1, minMember: 1, template: {requests: {cpu: 100m}}}\n"
                )
                subprocess.run(
                    [sys.executable, "-m", "godel", "apply", "-f", "-"],
                    input=job,
                    text=True,
                    env={**os.environ, "GODEL_HOME": tmp},
                    check=True,
                    capture_output=True,
                )
                results = measure(home.path, args.runs, args.baseline_root, bytecode_cache=cache)
            finally:
                local.down(home)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    width = max(len(name) for name in results)
    print(f"{'command':<{width}}   min ms   median ms   p90 ms   CPU median ms")
    for name, fig in results.items():
        print(
            f"{name:<{width}}   {fig['min_ms']:>6}   {fig['median_ms']:>9}   {fig['p90_ms']:>6}"
            f"   {fig['cpu_median_ms']:>13}"
        )


if __name__ == "__main__":
    main()
