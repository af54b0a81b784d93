"""Framework tests: profile loading (good and bad YAML), registry args, the runtime's filter
short-circuit and weighted scores."""

from __future__ import annotations

from pathlib import Path

import pytest

from placement.framework import (
    Framework,
    Profile,
    ProfileError,
    Status,
    UnitInfo,
    load_profile,
)
from placement.nodeinfo import NodeInfo
from placement.plugins import new_in_tree_registry
from protos.godel.v1 import objects_pb2 as pb
from tests.factories import GiB, node
from tests.test_scheduler_plugins import make_node, make_pod, req

REGISTRY = new_in_tree_registry()


def test_default_profile_is_valid() -> None:
    profile = load_profile("", REGISTRY)
    assert profile == Profile()
    fw = Framework(profile, REGISTRY)
    assert fw.filter_names[0] == "NodeUnschedulable"


def test_profile_from_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(
        "filters: [NodeResourcesFit]\n"
        "scores:\n  - {name: MostAllocated, weight: 3}\n  - BalancedAllocation\n"
        "args:\n  MostAllocated: {cpu: 2, memory: 1}\n"
    )
    profile = load_profile(path, REGISTRY)
    assert profile.filters == ("NodeResourcesFit",)
    assert profile.scores == (("MostAllocated", 3), ("BalancedAllocation", 1))
    assert profile.args == {"MostAllocated": {"cpu": 2, "memory": 1}}
    assert profile.preemption  # on unless switched off


def test_preemption_is_switched_off_per_profile() -> None:
    assert load_profile("preemption: false\n", REGISTRY).preemption is False


BAD_PROFILES = [
    ("not-yaml", "filters: [a\n", "not valid YAML"),
    ("not-a-mapping", "- a\n", "expected a mapping"),
    ("unknown-key", "filter: []\n", r"unknown key\(s\) \['filter'\]"),
    ("unknown-filter", "filters: [NoSuch]\n", "filters: unknown plugin 'NoSuch'"),
    ("unknown-score", "scores: [{name: NoSuch}]\n", "scores: unknown plugin 'NoSuch'"),
    ("duplicate-filter", "filters: [NodePorts, NodePorts]\n", "plugin 'NodePorts' listed twice"),
    (
        "duplicate-score",
        "scores: [LeastAllocated, {name: LeastAllocated, weight: 2}]\n",
        "listed twice",
    ),
    (
        "zero-weight",
        "scores: [{name: LeastAllocated, weight: 0}]\n",
        "weight must be an integer > 0",
    ),
    ("negative-weight", "scores: [{name: LeastAllocated, weight: -1}]\n", "weight must be"),
    ("string-weight", "scores: [{name: LeastAllocated, weight: '2'}]\n", "weight must be"),
    ("bool-weight", "scores: [{name: LeastAllocated, weight: true}]\n", "weight must be"),
    ("score-extra-key", "scores: [{name: LeastAllocated, wieght: 2}]\n", "unknown key"),
    ("filters-not-list", "filters: NodePorts\n", "expected a list of plugin names"),
    ("not-a-filter", "filters: [LeastAllocated]\n", "'LeastAllocated' is not a Filter plugin"),
    ("not-a-score", "scores: [NodePorts]\n", "'NodePorts' is not a Score plugin"),
    ("args-unknown-plugin", "args: {Nope: {}}\n", "args: unknown plugin 'Nope'"),
    ("args-bad-key", "args: {LeastAllocated: {cpus: 1}}\n", "LeastAllocated: unknown arg 'cpus'"),
    ("args-bad-value", "args: {LeastAllocated: {cpu: -2}}\n", "weight of cpu must be >= 0"),
    ("args-no-args-plugin", "args: {NodePorts: {x: 1}}\n", "NodePorts: unknown arg 'x'"),
    ("preemption-not-bool", "preemption: 'no'\n", "preemption: expected true or false"),
    ("tie-break-unknown", "tieBreak: last\n", r"tieBreak: expected one of \['first', 'random'\]"),
    (
        "tie-break-seed-negative",
        "tieBreak: random\ntieBreakSeed: -1\n",
        "tieBreakSeed: expected an integer >= 0",
    ),
    ("tie-break-seed-text", "tieBreak: random\ntieBreakSeed: x\n", "tieBreakSeed: expected"),
    ("tie-break-seed-alone", "tieBreakSeed: 3\n", "tieBreakSeed: only with tieBreak: random"),
]


@pytest.mark.parametrize(
    ("text", "error"), [c[1:] for c in BAD_PROFILES], ids=[c[0] for c in BAD_PROFILES]
)
def test_bad_profile_is_refused_with_a_clear_error(text: str, error: str) -> None:
    with pytest.raises(ProfileError, match=error):
        load_profile(text, REGISTRY)


def test_tie_break_defaults_to_scan_order_and_takes_random_with_a_seed() -> None:
    assert load_profile("", REGISTRY).tie_break == "first"
    profile = load_profile("scores: []\ntieBreak: random\ntieBreakSeed: 7\n", REGISTRY)
    assert (profile.scores, profile.tie_break, profile.tie_break_seed) == ((), "random", 7)


def test_missing_profile_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "nope.yaml", REGISTRY)


def test_filters_short_circuit_on_first_failure() -> None:
    fw = Framework(Profile(filters=("NodeUnschedulable", "NodeResourcesFit")), REGISTRY)
    pod = make_pod(cpu=10_000)
    status = fw.run_filters(pod, make_node(ready=False))
    assert status == Status.unresolvable("node not ready", plugin="NodeUnschedulable")
    assert fw.run_filters(pod, make_node())
    assert fw.run_filters(make_pod(cpu=1), make_node()) is None


def test_weighted_scores_split_static_and_dynamic() -> None:
    profile = load_profile(
        "scores: [{name: LeastAllocated, weight: 2}, {name: NodeAffinity, weight: 3}]\n",
        REGISTRY,
    )
    fw = Framework(profile, REGISTRY)
    pod = make_pod(cpu=2000, preferred=[(5, [req("zone", pb.LabelSelectorRequirement.IN, "a")])])
    nodes = [make_node(labels={"zone": "a"}), make_node(cpu=8000)]
    static, dynamic = fw.score_parts(pod, nodes)
    assert static == [300, 0]
    # LeastAllocated over cpu and memory (this pod requests no memory): (50+100)/2, (75+100)/2
    assert dynamic == [2 * 75, 2 * 87]
    assert fw.dynamic_score(pod, nodes[1]) == 174


def test_unit_hooks_default_to_no_ops() -> None:
    fw = Framework(Profile(), REGISTRY)
    nodes = [NodeInfo.from_node(node("a", mem=GiB))]
    assert fw.node_groups(UnitInfo("j", 1, 0, 0), nodes) is None


def test_bad_profile_file_is_a_config_error(tmp_path: Path) -> None:
    from services.runtime import ConfigError, load_config
    from services.scheduler.service import SchedulerConfig

    path = tmp_path / "p.yaml"
    path.write_text("filters: [NodePorts, NodePorts]\n")
    with pytest.raises(ConfigError, match=r"profile: .*plugin 'NodePorts' listed twice"):
        load_config(SchedulerConfig, ["--profile", str(path)], {})
    path.write_text("scores: [MostAllocated]\n")
    config = load_config(SchedulerConfig, ["--profile", str(path), "--mode", "kube"], {})
    assert config.load_profile().scores == (("MostAllocated", 1),)
    assert config.mode == "kube"
