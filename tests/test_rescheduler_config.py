"""Rescheduler policy config: durations, valid configs parsed to the expected PolicyConfigs, and
every kind of invalid config refused with the offending entry named."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from placement.framework.registry import NoArgs, PluginSpec, Registry
from services.rescheduler.config import (
    CRON,
    PERIODIC,
    SIGNAL,
    PluginRef,
    PolicyConfig,
    PolicyConfigError,
    TriggerConfig,
    load_policies,
    parse_duration,
)

# -- small registries of dummy plugins ------------------------------------------------------------


@dataclass(frozen=True)
class BinPackingArgs:
    resources: dict[str, int] = field(default_factory=lambda: {"cpu": 1})
    threshold_percentage: int = 50

    def validate(self) -> None:
        if not 0 < self.threshold_percentage <= 100:
            raise ValueError(
                f"threshold_percentage must be in (0, 100], got {self.threshold_percentage}"
            )


@dataclass(frozen=True)
class ThrottleArgs:
    label_key: str = "app"
    window: str = "1h"
    max_moves: int = 1

    def validate(self) -> None:
        if self.max_moves <= 0:
            raise ValueError(f"max_moves must be > 0, got {self.max_moves}")


class DummyPlugin:
    NAME: ClassVar[str] = "Dummy"

    def __init__(self, args: object) -> None:
        self.args = args


def spec(name: str, args_type: type[Any] = NoArgs) -> PluginSpec[Any]:
    return PluginSpec(name, args_type, DummyPlugin)


DETECTORS = Registry([spec("BinPacking", BinPackingArgs), spec("LoadBalance")])
ALGORITHMS = Registry([spec("BinPacking", BinPackingArgs), spec("LoadBalance")])
CHECKS = Registry([spec("Protection"), spec("Throttle", ThrottleArgs)])


def load(source: str | Path) -> list[PolicyConfig]:
    return load_policies(source, DETECTORS, ALGORITHMS, CHECKS)


# -- YAML builders: a minimal valid policy, changed per case --------------------------------------

DROP = object()  # an override that removes the key


def policy(name: object = "x", **overrides: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "detector": {"name": "LoadBalance"},
        "algorithm": {"name": "LoadBalance"},
    }
    for key, value in {"name": name, **overrides}.items():
        if value is DROP:
            entry.pop(key, None)
        else:
            entry[key] = value
    return entry


def doc(*policies: object) -> str:
    return yaml.safe_dump({"policies": list(policies)}, sort_keys=False)


# -- durations ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1h30m15s", 5415.0),
        ("1.5h", 5400.0),
        ("500ms", 0.5),
    ],
    ids=lambda v: str(v),
)
def test_parse_duration_reads_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    ["", "5", "5x", "m5", "1h 30m", "-5m", "1h30", "5m!", "h"],
    ids=[
        "empty",
        "no-unit",
        "bad-unit",
        "unit-first",
        "space",
        "negative",
        "trailing-number",
        "trailing-junk",
        "unit-only",
    ],
)
def test_parse_duration_refuses_non_durations_naming_them(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{text!r} is not a duration")):
        parse_duration(text)


@pytest.mark.parametrize("text", ["0s", "0h0m", "0ms"], ids=["0s", "0h0m", "0ms"])
def test_parse_duration_refuses_zero(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{text!r}: a duration must be longer")):
        parse_duration(text)


# -- trigger kinds --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trigger", "kinds"),
    [
        (TriggerConfig(), []),
        (TriggerConfig(period_seconds=60), [PERIODIC]),
        (TriggerConfig(cron="0 3 * * *"), [CRON]),
        (TriggerConfig(signal=int(signal.SIGUSR2)), [SIGNAL]),
        (TriggerConfig(60, "0 3 * * *", int(signal.SIGHUP)), [PERIODIC, CRON, SIGNAL]),
    ],
    ids=["none", "period", "cron", "signal", "all"],
)
def test_trigger_kinds_lists_the_kinds_set(trigger: TriggerConfig, kinds: list[str]) -> None:
    assert trigger.kinds() == kinds


# -- valid configs --------------------------------------------------------------------------------

FULL_EXAMPLE = """
policies:
  - name: gpu-defrag
    trigger:
      period: 5m
      cron: "0 3 * * *"
      signal: SIGUSR2
    detector: {name: BinPacking, args: {resources: {gpu: 1}, threshold_percentage: 50}}
    algorithm: {name: BinPacking}
    checks:
      - Protection
      - {name: Throttle, args: {label_key: app, window: 1h, max_moves: 2}}
    scope: {labels: {pool: gpu}}
    failure_ratio_threshold: 0.3
  - name: balance
    detector: LoadBalance
    algorithm: {name: LoadBalance, args: {}}
"""

FULL_EXPECTED = [
    PolicyConfig(
        name="gpu-defrag",
        trigger=TriggerConfig(period_seconds=300.0, cron="0 3 * * *", signal=int(signal.SIGUSR2)),
        detector=PluginRef("BinPacking", {"resources": {"gpu": 1}, "threshold_percentage": 50}),
        algorithm=PluginRef("BinPacking", {}),
        checks=(
            PluginRef("Protection", {}),
            PluginRef("Throttle", {"label_key": "app", "window": "1h", "max_moves": 2}),
        ),
        scope={"pool": "gpu"},
        failure_ratio_threshold=0.3,
    ),
    PolicyConfig(
        name="balance",
        trigger=TriggerConfig(),
        detector=PluginRef("LoadBalance", {}),
        algorithm=PluginRef("LoadBalance", {}),
        checks=(),
        scope={},
        failure_ratio_threshold=0.2,
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("# nothing configured yet\n", []),
        ("policies:\n", []),
        ("policies: []\n", []),
        (FULL_EXAMPLE, FULL_EXPECTED),
        (
            doc(policy(trigger={"signal": 12})),
            [
                PolicyConfig(
                    "x",
                    TriggerConfig(signal=int(signal.SIGUSR2)),
                    PluginRef("LoadBalance"),
                    PluginRef("LoadBalance"),
                )
            ],
        ),
        (
            doc(policy(trigger={}, scope={}, checks=[], failure_ratio_threshold=1)),
            [
                PolicyConfig(
                    "x",
                    TriggerConfig(),
                    PluginRef("LoadBalance"),
                    PluginRef("LoadBalance"),
                    failure_ratio_threshold=1.0,
                )
            ],
        ),
    ],
    ids=[
        "empty-file",
        "only-a-comment",
        "policies-null",
        "policies-empty",
        "full-example",
        "signal-by-number",
        "empty-trigger-scope-checks",
    ],
)
def test_valid_config_parses_to_policies(text: str, expected: list[PolicyConfig]) -> None:
    assert load(text) == expected


def test_config_file_is_read_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "rescheduler.yaml"
    path.write_text(FULL_EXAMPLE)
    assert load(path) == FULL_EXPECTED


# -- invalid configs: each message names the entry ------------------------------------------------

INVALID = [
    ("not-yaml", "policies: [a\n", "not valid YAML"),
    ("top-not-mapping", "- a\n", "the config: expected a mapping with keys policies, got a list"),
    ("top-unknown-key", "policy: []\n", "the config: unknown key(s) policy (known: policies)"),
    ("policies-not-list", "policies: {a: 1}\n", "policies: expected a list, got a mapping"),
    ("entry-not-mapping", "policies: [x]\n", "policies[0]: expected a mapping with keys name"),
    ("name-missing", doc(policy(name=DROP)), "policies[0]: name: required"),
    ("name-uppercase", doc(policy(name="Gpu_Defrag")), "policies[0]: name: 'Gpu_Defrag' must be"),
    ("name-trailing-dash", doc(policy(name="gpu-")), "policies[0]: name: 'gpu-' must be"),
    ("name-not-string", doc(policy(name=7)), "policies[0]: name: 7 must be"),
    (
        "name-duplicate",
        doc(policy("a"), policy("b"), policy("a")),
        "policies[2] (a): name: duplicate of policies[0]",
    ),
    (
        "policy-unknown-key",
        doc(policy(detecter={"name": "LoadBalance"})),
        "policies[0] (x): unknown key(s) detecter (known: name, trigger, detector",
    ),
    ("detector-missing", doc(policy(detector=DROP)), "policies[0] (x): detector: required"),
    (
        "detector-unknown",
        doc(policy(detector={"name": "Foo"})),
        "policies[0] (x): detector: unknown detector 'Foo' (known: BinPacking, LoadBalance)",
    ),
    (
        "detector-no-name",
        doc(policy(detector={"args": {}})),
        "policies[0] (x): detector: name: expected a plugin name, got None",
    ),
    (
        "detector-args-refused",
        doc(policy(detector={"name": "BinPacking", "args": {"threshold_percentage": 150}})),
        "policies[0] (x): detector: args: BinPacking: threshold_percentage must be in (0, 100]",
    ),
    (
        "detector-args-unknown",
        doc(policy(detector={"name": "BinPacking", "args": {"threshold": 50}})),
        "policies[0] (x): detector: args: BinPacking: unknown arg 'threshold'",
    ),
    (
        "detector-args-not-mapping",
        doc(policy(detector={"name": "BinPacking", "args": [1]})),
        "policies[0] (x): detector: args: BinPacking: expected a mapping, got a list",
    ),
    ("algorithm-missing", doc(policy(algorithm=DROP)), "policies[0] (x): algorithm: required"),
    (
        "algorithm-unknown",
        doc(policy(algorithm="Optimal")),
        "policies[0] (x): algorithm: unknown algorithm 'Optimal' (known: BinPacking, LoadBalance)",
    ),
    (
        "check-unknown",
        doc(policy("ok"), policy("gpu-defrag", checks=["Foo"])),
        "policies[1] (gpu-defrag): checks[0]: unknown check 'Foo' (known: Protection, Throttle)",
    ),
    (
        "check-twice",
        doc(policy(checks=["Protection", {"name": "Protection"}])),
        "policies[0] (x): checks[1]: check 'Protection' listed twice",
    ),
    (
        "check-unknown-key",
        doc(policy(checks=[{"name": "Throttle", "arg": {}}])),
        "policies[0] (x): checks[0]: unknown key(s) arg (known: name, args)",
    ),
    (
        "check-args-wrong-type",
        doc(policy(checks=["Protection", {"name": "Throttle", "args": {"max_moves": "two"}}])),
        "policies[0] (x): checks[1]: args: Throttle: arg 'max_moves': 'two' has the wrong type",
    ),
    (
        "checks-not-list",
        doc(policy(checks="Protection")),
        "policies[0] (x): checks: expected a list",
    ),
    (
        "trigger-not-mapping",
        doc(policy(trigger="5m")),
        "policies[0] (x): trigger: expected a mapping with keys period, cron, signal, got str '5m'",
    ),
    (
        "trigger-unknown-key",
        doc(policy(trigger={"every": "5m"})),
        "policies[0] (x): trigger: unknown key(s) every (known: period, cron, signal)",
    ),
    (
        "period-bad",
        doc(policy(trigger={"period": "5 minutes"})),
        "policies[0] (x): trigger.period: '5 minutes' is not a duration",
    ),
    (
        "period-without-unit",
        doc(policy(trigger={"period": 300})),
        "policies[0] (x): trigger.period: 300 is not a duration",
    ),
    (
        "period-zero",
        doc(policy(trigger={"period": "0s"})),
        "policies[0] (x): trigger.period: '0s': a duration must be longer than zero",
    ),
    (
        "cron-bad",
        doc(policy(trigger={"cron": "61 * * * *"})),
        "policies[0] (x): trigger.cron: '61 * * * *' is not a valid cron expression",
    ),
    (
        "cron-too-few-fields",
        doc(policy(trigger={"cron": "0 3 * *"})),
        "policies[0] (x): trigger.cron: '0 3 * *' is not a valid cron expression",
    ),
    (
        "cron-never-matches",
        doc(policy(trigger={"cron": "0 0 31 2 *"})),
        "policies[0] (x): trigger.cron: '0 0 31 2 *' never matches from now on",
    ),
    (
        "signal-sigterm",
        doc(policy(trigger={"signal": "SIGTERM"})),
        "policies[0] (x): trigger.signal: 'SIGTERM' is not a signal a policy may use "
        "(allowed: SIGHUP, SIGUSR1, SIGUSR2",
    ),
    (
        "signal-number-sigint",
        doc(policy(trigger={"signal": 2})),
        "policies[0] (x): trigger.signal: 2 is not a signal a policy may use",
    ),
    (
        "scope-unknown-key",
        doc(policy(scope={"pool": "gpu"})),
        "policies[0] (x): scope: unknown key(s) pool (known: labels)",
    ),
    (
        "scope-labels-not-mapping",
        doc(policy(scope={"labels": ["pool=gpu"]})),
        "policies[0] (x): scope.labels: expected a mapping, got a list",
    ),
    (
        "scope-label-not-string",
        doc(policy(scope={"labels": {"tier": 1}})),
        "policies[0] (x): scope.labels.tier: 1 is not a string",
    ),
    (
        "ratio-above-one",
        doc(policy(failure_ratio_threshold=1.5)),
        "policies[0] (x): failure_ratio_threshold: 1.5 is not a number between 0 and 1",
    ),
    (
        "ratio-negative",
        doc(policy(failure_ratio_threshold=-0.1)),
        "policies[0] (x): failure_ratio_threshold: -0.1 is not a number between 0 and 1",
    ),
    (
        "ratio-not-number",
        doc(policy(failure_ratio_threshold="high")),
        "policies[0] (x): failure_ratio_threshold: 'high' is not a number between 0 and 1",
    ),
    (
        "ratio-bool",
        doc(policy(failure_ratio_threshold=True)),
        "policies[0] (x): failure_ratio_threshold: True is not a number between 0 and 1",
    ),
]


@pytest.mark.parametrize(
    ("text", "message"),
    [(text, message) for _, text, message in INVALID],
    ids=[case_id for case_id, _, _ in INVALID],
)
def test_invalid_config_is_refused_naming_the_entry(text: str, message: str) -> None:
    with pytest.raises(PolicyConfigError, match=re.escape(message)):
        load(text)


# -- files ----------------------------------------------------------------------------------------


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "nope.yaml"


def _directory(tmp_path: Path) -> Path:
    return tmp_path


def _not_utf8(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"policies: []\n# caf\xe9\n")
    return path


def _bad_policy(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(doc(policy(trigger={"cron": "61 * * * *"})))
    return path


@pytest.mark.parametrize(
    ("make_path", "message"),
    [
        (_missing, "cannot read: No such file or directory"),
        (_directory, "cannot read: Is a directory"),
        (_not_utf8, "cannot read: not UTF-8 text"),
        (_bad_policy, "policies[0] (x): trigger.cron: '61 * * * *' is not a valid cron"),
    ],
    ids=["missing", "directory", "not-utf8", "bad-policy"],
)
def test_file_errors_name_the_file(tmp_path: Path, make_path: Any, message: str) -> None:
    path = make_path(tmp_path)
    with pytest.raises(PolicyConfigError, match=re.escape(f"{path}: {message}")):
        load(path)


def test_refused_plugin_args_keep_the_plugin_error_as_cause() -> None:
    text = doc(policy(detector={"name": "BinPacking", "args": {"threshold_percentage": 0}}))
    with pytest.raises(PolicyConfigError) as caught:
        load(text)
    assert "threshold_percentage" in str(caught.value.__cause__)
