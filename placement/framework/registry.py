"""Plugin registry: name -> factory with typed, validated args.

Each plugin module declares ``NAME``, an ``Args`` frozen dataclass (with ``validate()``) and a
``new(args)`` factory, and exposes them as one :class:`PluginSpec`. Args arrive from the profile
YAML as a mapping; unknown keys, wrong types and invalid values are refused with the plugin's
name in the message.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from placement.framework.interface import Plugin


class PluginConfigError(ValueError):
    """A profile or plugin argument is invalid; the message says which and why."""


class Args(Protocol):
    """A frozen dataclass (what ``dataclasses.fields`` reads) with a ``validate()``."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""


@dataclass(frozen=True)
class NoArgs:
    def validate(self) -> None:
        return None


A = TypeVar("A", bound=Args)


@dataclass(frozen=True)
class PluginSpec(Generic[A]):
    name: str
    args_type: type[A]
    factory: Callable[[A], Plugin]

    def build(self, raw: Mapping[str, Any] | None) -> Plugin:
        return self.factory(self.parse_args(raw))

    def parse_args(self, raw: Mapping[str, Any] | None) -> A:
        raw = dict(raw or {})
        if not isinstance(raw, dict):
            raise PluginConfigError(f"{self.name}: args must be a mapping")
        fields = {f.name: f for f in dataclasses.fields(self.args_type)}
        hints = typing.get_type_hints(self.args_type)
        for key, value in raw.items():
            if key not in fields:
                known = ", ".join(sorted(fields)) or "none"
                raise PluginConfigError(f"{self.name}: unknown arg {key!r} (known: {known})")
            if not _type_ok(value, hints[key]):
                raise PluginConfigError(f"{self.name}: arg {key!r}: {value!r} has the wrong type")
        args = self.args_type(**raw)
        try:
            args.validate()
        except ValueError as exc:
            raise PluginConfigError(f"{self.name}: {exc}") from exc
        return args


def _type_ok(value: object, hint: object) -> bool:
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return True


class Registry:
    def __init__(self, specs: Iterable[PluginSpec[Any]] = ()) -> None:
        self._specs: dict[str, PluginSpec[Any]] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: PluginSpec[Any]) -> None:
        if spec.name in self._specs:
            raise PluginConfigError(f"plugin {spec.name!r} registered twice")
        self._specs[spec.name] = spec

    def get(self, name: str) -> PluginSpec[Any]:
        spec = self._specs.get(name)
        if spec is None:
            known = ", ".join(sorted(self._specs))
            raise PluginConfigError(f"unknown plugin {name!r} (known: {known})")
        return spec

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def names(self) -> list[str]:
        return sorted(self._specs)
