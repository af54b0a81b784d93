"""The openb trace loader (bundled files, malformed rows) and the offline simulator's quick
form on a subset of the trace: structure only (rows, monotone arrived %), never timing."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bench import gpufrag_sim, gputrace
from bench.gputrace import TraceError, load_nodes, load_pods

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"


def test_the_bundled_trace_loads_as_the_paper_describes_it() -> None:
    nodes = load_nodes(gputrace.GPU_NODES)
    assert (len(nodes), sum(n.gpus for n in nodes)) == (1213, 6212)
    sizes = {name: len(load_pods(path)) for name, path in gputrace.POD_LISTS.items()}
    assert sizes == {"default": 8152, "gpushare40": 8152, "multigpu20": 8324}
    default = [pod.shape for pod in load_pods(gputrace.POD_LISTS["default"])]
    assert sum(1 for s in default if s.gpu_count == 0) == 1088
    assert sum(1 for s in default if s.is_share) == 3078


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        ("nodes", "sn,cpu_milli,gpu,model\nn1,1000,1,T4\n", "header: missing column(s) memory_mib"),
        (
            "nodes",
            NODE_HEADER + "n1,lots,1024,1,T4\n",
            ":2: cpu_milli: must be an integer (got 'lots')",
        ),
        ("nodes", NODE_HEADER + "n1,1000,1024,2,\n", ":2: model: a node with GPUs must name"),
        (
            "nodes",
            NODE_HEADER + "n1,1000,1024,1,T4\nn1,1000,1024,1,T4\n",
            ":3: sn: duplicate node 'n1'",
        ),
        ("nodes", NODE_HEADER + "n1,1000,1024,-1,T4\n", ":2: gpu: must be at least 0 (got -1)"),
        ("nodes", NODE_HEADER + "n1,1000,1024\n", ":2: row: expected 5 fields"),
        ("nodes", NODE_HEADER + "n1,1000,1024,0,\n", "no GPU nodes"),
        (
            "pods",
            POD_HEADER + "p1,1000,1024,2,500,\n",
            ":2: gpu_milli: a task of 2 cards takes them whole",
        ),
        (
            "pods",
            POD_HEADER + "p1,1000,1024,1,1200,\n",
            ":2: gpu_milli: must be 0..1000 (got 1200)",
        ),
        (
            "pods",
            POD_HEADER + "p1,1000,1024,0,300,\n",
            ":2: num_gpu and gpu_milli: both zero or both",
        ),
        ("pods", POD_HEADER + ",1000,1024,0,0,\n", ":2: name: must not be empty"),
        ("pods", POD_HEADER, "no pods"),
    ],
)
def test_a_malformed_trace_is_refused_naming_line_and_field(
    tmp_path: Path, kind: str, text: str, message: str
) -> None:
    path = tmp_path / f"{kind}.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as caught:
        load_nodes(path) if kind == "nodes" else load_pods(path)
    assert str(caught.value).startswith(str(path))
    assert message in str(caught.value)


def test_accepted_models_are_read_from_gpu_spec(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + "p1,1000,1024,1,500,T4|V100M16\np2,1000,1024,1,1000,\n")
    first, second = load_pods(path)
    assert first.shape.models == frozenset({"T4", "V100M16"})
    assert first.shape.memory == 1024 << 20
    assert second.shape.models == frozenset()


def _subset(source: Path, target: Path, rows: int) -> Path:
    with source.open() as handle:
        lines = handle.readlines()
    target.write_text("".join(lines[: rows + 1]))
    return target


def test_the_quick_form_writes_monotone_curves_a_summary_and_a_plot(tmp_path: Path) -> None:
    nodes = _subset(gputrace.GPU_NODES, tmp_path / "nodes.csv", 80)
    pods = _subset(gputrace.POD_LISTS["default"], tmp_path / "pods.csv", 500)
    out = tmp_path / "out"
    argv = ["--nodes", str(nodes), "--pods", str(pods), "--quick", "--out", str(out)]
    for policy in ("fgd-fill", "fgd", "random"):
        argv += ["--policy", policy]
    assert gpufrag_sim.main(argv) == 0

    (curves,) = [p for p in out.glob("gpufrag-*.csv") if not p.stem.endswith("-summary")]
    (summary,) = out.glob("gpufrag-*-summary.csv")
    assert list(out.glob("gpufrag-*.png"))
    rows = list(csv.DictReader(curves.open()))
    assert set(rows[0]) == set(gpufrag_sim.CURVE_COLUMNS)
    runs: dict[tuple[str, str], list[dict[str, str]]] = {}
    for row in rows:
        runs.setdefault((row["policy"], row["seed"]), []).append(row)
    assert set(runs) == {(p, s) for p in ("fgd-fill", "fgd", "random") for s in ("0", "1")}
    for points in runs.values():
        arrived = [float(p["arrived_pct"]) for p in points]
        assert arrived == sorted(arrived)
        assert arrived[-1] <= gpufrag_sim.OVERSUBSCRIBE_PERCENT
        assert arrived[-1] > 100  # tasks were drawn past the trace's own
        tasks = [int(p["tasks"]) for p in points]
        assert all(
            int(p["placed"]) + int(p["unplaced"]) == t for p, t in zip(points, tasks, strict=True)
        )
        allocated = [100 - float(p["unallocated_pct"]) for p in points]
        assert allocated == sorted(allocated)  # no deletions
    read = list(csv.DictReader(summary.open()))
    assert len(read) == len(runs)
    assert {float(r["arrived_pct"]) for r in read} == {100.0}

    # --combine makes one report of earlier outputs, without running anything
    again = tmp_path / "again"
    assert gpufrag_sim.main(["--combine", str(curves), "--out", str(again), "--no-plot"]) == 0
    (combined,) = again.glob("gpufrag-*-summary.csv")
    assert list(csv.DictReader(combined.open())) == read


def test_a_bad_file_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_HEADER + "n1,1000,1024,x,T4\n")
    code = gpufrag_sim.main(
        [
            "--nodes",
            str(nodes),
            "--pods",
            str(gputrace.POD_LISTS["default"]),
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 2
    assert "gpu: must be an integer (got 'x')" in capsys.readouterr().err
    assert not list(tmp_path.glob("gpufrag-*"))


def test_learning_the_mix_as_tasks_come_labels_its_runs(tmp_path: Path) -> None:
    nodes = _subset(gputrace.GPU_NODES, tmp_path / "nodes.csv", 40)
    pods = _subset(gputrace.POD_LISTS["default"], tmp_path / "pods.csv", 300)
    out = tmp_path / "out"
    argv = ["--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "--out", str(out)]
    argv += ["--policy", "fgd-fill", "--learn", "100", "--no-plot"]
    assert gpufrag_sim.main(argv) == 0
    (summary,) = out.glob("gpufrag-*-summary.csv")
    (row,) = csv.DictReader(summary.open())
    assert row["policy"] == "fgd-fill/learn100"
    assert int(row["placed"]) > 0
