"""Rescheduler policies, loaded from the YAML file the rescheduler's ``--config`` names.

    policies:
      - name: gpu-defrag                     # lowercase alphanumerics and '-', unique
        trigger:                             # any combination; omitted or empty = only by RPC
          period: 5m                         # a duration: 30s, 5m, 1h30m, 1.5h, 500ms (> 0)
          cron: "0 3 * * *"                  # a cron expression in UTC (croniter; a 6th field = seconds)
          signal: SIGUSR2                    # SIGHUP, SIGUSR1 or SIGUSR2, by name or number
        detector: {name: BinPacking, args: {resources: {gpu: 1}, threshold_percentage: 50}}
        algorithm: {name: BinPacking}        # args optional; a bare name works too
        checks:                              # names, or {name, args}; optional
          - Protection
          - {name: Throttle, args: {label_key: app, window_seconds: 3600, max_moves: 2}}
        scope: {labels: {pool: gpu}}         # node label equality selector; omitted = all nodes
        failure_ratio_threshold: 0.2         # 0..1, default 0.2

An empty file, ``policies:`` with nothing after it, or ``policies: []`` means no policies.

Everything is checked at start, so a bad file stops the rescheduler instead of a bad round at 3am:
unknown keys at every level, duplicate names, a detector, algorithm or check that is not
registered, plugin args their plugin refuses (``PluginSpec.parse_args``), a bad duration, cron
expression or signal. Every error is a :class:`PolicyConfigError` whose message names the entry,
e.g. ``policies[1] (gpu-defrag): checks[0]: unknown check 'Foo' (known: Protection, Throttle)``.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from placement.framework.registry import PluginConfigError, Registry

# The kinds of trigger, as TriggerConfig.kinds() and the scheduler's fire(policy, kind) name them.
PERIODIC = "periodic"
CRON = "cron"
SIGNAL = "signal"

DEFAULT_FAILURE_RATIO_THRESHOLD = 0.2  # the original's default

# SIGTERM and SIGINT stop the service (services.runtime) and SIGKILL/SIGSTOP cannot be caught, so a
# policy may only claim the signals meant for users.
POLICY_SIGNALS = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|h|m|s)")
_SECONDS_PER_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

_TOP_KEYS = ("policies",)
_POLICY_KEYS = (
    "name",
    "trigger",
    "detector",
    "algorithm",
    "checks",
    "scope",
    "failure_ratio_threshold",
)
_TRIGGER_KEYS = ("period", "cron", "signal")
_PLUGIN_KEYS = ("name", "args")
_SCOPE_KEYS = ("labels",)


class PolicyConfigError(ValueError):
    """The policy config is invalid; the message names the offending entry and says why."""


@dataclass(frozen=True)
class PluginRef:
    """A plugin a policy names, with its (already validated) raw args."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TriggerConfig:
    """When a policy runs by itself; all None = only when asked over RPC."""

    period_seconds: float | None = None
    cron: str | None = None
    signal: int | None = None

    def kinds(self) -> list[str]:
        """The kinds of trigger that are set, in the order periodic, cron, signal."""
        present = (
            (PERIODIC, self.period_seconds),
            (CRON, self.cron),
            (SIGNAL, self.signal),
        )
        return [kind for kind, value in present if value is not None]


@dataclass(frozen=True)
class PolicyConfig:
    name: str
    trigger: TriggerConfig
    detector: PluginRef
    algorithm: PluginRef
    checks: tuple[PluginRef, ...] = ()
    # Node label equality selector; empty = every node.
    scope: Mapping[str, str] = field(default_factory=dict)
    # Abort a round when more than this share of planned targets no longer fit.
    failure_ratio_threshold: float = DEFAULT_FAILURE_RATIO_THRESHOLD


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``30s``, ``5m``, ``1h30m``, ``1.5h`` or ``500ms``.

    Raises ValueError naming ``text`` when it is not one, or is not longer than zero."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"{text!r} is not a duration (expected e.g. 30s, 5m, 1h30m)")
    seconds = 0.0
    position = 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            break
        seconds += float(match.group(1)) * _SECONDS_PER_UNIT[match.group(2)]
        position = match.end()
    if position != len(text):
        raise ValueError(f"{text!r} is not a duration (expected e.g. 30s, 5m, 1h30m)")
    if seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be longer than zero")
    return seconds


def load_policies(
    source: str | Path, detectors: Registry, algorithms: Registry, checks: Registry
) -> list[PolicyConfig]:
    """Parse policies from YAML text (a ``str``) or a file (a ``Path``) and validate every one
    against the plugin registries. Raises :class:`PolicyConfigError` on the first bad entry."""
    prefix = f"{source}: " if isinstance(source, Path) else ""
    try:
        document = _read_yaml(source)
        parser = _PolicyParser(detectors, algorithms, checks)
        return parser.parse_document(document)
    except PolicyConfigError as exc:
        raise PolicyConfigError(f"{prefix}{exc}") from exc.__cause__


def _read_yaml(source: str | Path) -> object:
    try:
        text = source.read_text() if isinstance(source, Path) else source
    except OSError as exc:
        raise PolicyConfigError(f"cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise PolicyConfigError(f"cannot read: not UTF-8 text ({exc.reason})") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyConfigError(f"not valid YAML: {exc}") from exc


class _PolicyParser:
    """Turns the parsed YAML document into PolicyConfigs; each method raises with the path of
    the entry it is reading (``policies[1] (gpu-defrag): trigger.cron: ...``)."""

    def __init__(self, detectors: Registry, algorithms: Registry, checks: Registry) -> None:
        self._detectors = detectors
        self._algorithms = algorithms
        self._checks = checks

    def parse_document(self, document: object) -> list[PolicyConfig]:
        if document is None:
            return []
        top = _mapping(document, "the config", _TOP_KEYS)
        entries = top.get("policies")
        if entries is None:
            return []
        if not isinstance(entries, list):
            raise PolicyConfigError(f"policies: expected a list, got {_kind(entries)}")
        policies: list[PolicyConfig] = []
        first_index: dict[str, int] = {}
        for index, entry in enumerate(entries):
            policy = self._parse_policy(entry, index)
            if policy.name in first_index:
                raise PolicyConfigError(
                    f"policies[{index}] ({policy.name}): name: duplicate of "
                    f"policies[{first_index[policy.name]}]"
                )
            first_index[policy.name] = index
            policies.append(policy)
        return policies

    def _parse_policy(self, entry: object, index: int) -> PolicyConfig:
        where = f"policies[{index}]"
        name = _policy_name(_expect_mapping(entry, where, _POLICY_KEYS).get("name"), where)
        where = f"{where} ({name})"  # from here on, errors name the policy too
        raw = _mapping(entry, where, _POLICY_KEYS)
        try:
            return PolicyConfig(
                name=name,
                trigger=_trigger(raw.get("trigger")),
                detector=self._plugin(raw, "detector", self._detectors),
                algorithm=self._plugin(raw, "algorithm", self._algorithms),
                checks=self._checks_list(raw.get("checks")),
                scope=_scope(raw.get("scope")),
                failure_ratio_threshold=_ratio(raw),
            )
        except PolicyConfigError as exc:
            raise PolicyConfigError(f"{where}: {exc}") from exc.__cause__

    def _plugin(self, raw: Mapping[str, Any], key: str, registry: Registry) -> PluginRef:
        if key not in raw or raw[key] is None:
            raise PolicyConfigError(f"{key}: required ({{name: PLUGIN, args: {{...}}}})")
        return _plugin_ref(raw[key], key, key, registry)

    def _checks_list(self, raw: object) -> tuple[PluginRef, ...]:
        if raw is None:
            return ()
        if not isinstance(raw, list):
            raise PolicyConfigError(f"checks: expected a list, got {_kind(raw)}")
        refs: list[PluginRef] = []
        for index, entry in enumerate(raw):
            ref = _plugin_ref(entry, f"checks[{index}]", "check", self._checks)
            if any(earlier.name == ref.name for earlier in refs):
                raise PolicyConfigError(f"checks[{index}]: check {ref.name!r} listed twice")
            refs.append(ref)
        return tuple(refs)


def _plugin_ref(raw: object, where: str, role: str, registry: Registry) -> PluginRef:
    """``Name`` or ``{name: Name, args: {...}}``, registered, with args the plugin accepts."""
    if isinstance(raw, str):
        raw = {"name": raw}
    entry = _mapping(raw, where, _PLUGIN_KEYS)
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise PolicyConfigError(f"{where}: name: expected a plugin name, got {name!r}")
    if name not in registry:
        known = ", ".join(registry.names()) or "none"
        raise PolicyConfigError(f"{where}: unknown {role} {name!r} (known: {known})")
    args = entry.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise PolicyConfigError(f"{where}: args: {name}: expected a mapping, got {_kind(args)}")
    try:
        registry.get(name).parse_args(args)
    except PluginConfigError as exc:
        # parse_args already starts its message with the plugin's name.
        raise PolicyConfigError(f"{where}: args: {exc}") from exc
    return PluginRef(name=name, args=dict(args))


def _policy_name(raw: object, where: str) -> str:
    if raw is None:
        raise PolicyConfigError(f"{where}: name: required")
    if not isinstance(raw, str) or not _NAME.match(raw):
        raise PolicyConfigError(
            f"{where}: name: {raw!r} must be lowercase letters, digits and '-' "
            "(starting and ending with a letter or digit)"
        )
    return raw


def _trigger(raw: object) -> TriggerConfig:
    if raw is None:
        return TriggerConfig()
    entry = _mapping(raw, "trigger", _TRIGGER_KEYS)
    return TriggerConfig(
        period_seconds=_period(entry.get("period")),
        cron=_cron(entry.get("cron")),
        signal=_signal(entry.get("signal")),
    )


def _period(raw: object) -> float | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        # A bare number would be ambiguous (seconds? minutes?), so the unit is required.
        raise PolicyConfigError(
            f"trigger.period: {raw!r} is not a duration (expected e.g. 30s, 5m, 1h30m)"
        )
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise PolicyConfigError(f"trigger.period: {exc}") from exc


def _cron(raw: object) -> str | None:
    if raw is None:
        return None
    # Imported when a policy has a cron trigger (none of the defaults has): ~2 MiB otherwise.
    from croniter import CroniterBadDateError, croniter

    if not isinstance(raw, str) or not croniter.is_valid(raw):
        raise PolicyConfigError(f"trigger.cron: {raw!r} is not a valid cron expression")
    try:
        croniter(raw, datetime.now(UTC)).get_next(float)
    except CroniterBadDateError as exc:
        # Valid syntax that matches no date (31 February, a year gone by) would never fire.
        raise PolicyConfigError(f"trigger.cron: {raw!r} never matches from now on") from exc
    return raw


def _signal(raw: object) -> int | None:
    if raw is None:
        return None
    allowed = ", ".join(s.name for s in POLICY_SIGNALS)
    chosen: signal.Signals | None = None
    if isinstance(raw, str):
        chosen = next((s for s in POLICY_SIGNALS if s.name == raw), None)
    elif isinstance(raw, int) and not isinstance(raw, bool):
        chosen = next((s for s in POLICY_SIGNALS if s.value == raw), None)
    if chosen is None:
        raise PolicyConfigError(
            f"trigger.signal: {raw!r} is not a signal a policy may use (allowed: {allowed}, "
            "by name or number)"
        )
    return int(chosen)


def _scope(raw: object) -> dict[str, str]:
    if raw is None:
        return {}
    entry = _mapping(raw, "scope", _SCOPE_KEYS)
    labels = entry.get("labels")
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise PolicyConfigError(f"scope.labels: expected a mapping, got {_kind(labels)}")
    for key, value in labels.items():
        if not isinstance(key, str) or not key:
            raise PolicyConfigError(f"scope.labels: {key!r} is not a label key")
        if not isinstance(value, str):
            raise PolicyConfigError(
                f"scope.labels.{key}: {value!r} is not a string (quote it: {key}: '{value}')"
            )
    return dict(labels)


def _ratio(raw: Mapping[str, Any]) -> float:
    value = raw.get("failure_ratio_threshold", DEFAULT_FAILURE_RATIO_THRESHOLD)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise PolicyConfigError(
            f"failure_ratio_threshold: {value!r} is not a number between 0 and 1"
        )
    return float(value)


def _expect_mapping(raw: object, where: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    """``raw`` as a mapping, or an error naming ``where`` and the keys it should have."""
    if not isinstance(raw, dict):
        raise PolicyConfigError(
            f"{where}: expected a mapping with keys {', '.join(keys)}, got {_kind(raw)}"
        )
    return raw


def _mapping(raw: object, where: str, keys: tuple[str, ...]) -> Mapping[str, Any]:
    """``raw`` as a mapping with only ``keys``, or an error naming ``where``."""
    raw = _expect_mapping(raw, where, keys)
    unknown = sorted(str(k) for k in raw if k not in keys)
    if unknown:
        raise PolicyConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(keys)})"
        )
    return raw


def _kind(value: object) -> str:
    """How an unexpected value reads in an error: ``a list``, ``a mapping``, ``int 5``."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{type(value).__name__} {value!r}"
