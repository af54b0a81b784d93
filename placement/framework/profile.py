"""Scheduling profile: which plugins run, with which score weights and args, loaded from YAML.

    filters: [NodeUnschedulable, NodeAffinity, TaintToleration, NodePorts, NodeResourcesFit]
    scores:
      - {name: LeastAllocated, weight: 1}
      - {name: NodeAffinity, weight: 2}
    args:
      LeastAllocated: {cpu_weight: 1, memory_weight: 1}
    preemption: true      # PostFilter: evict lower-priority pods when nothing fits (default)
    tieBreak: first       # Select among equal top scores: first (scan order, default) or random
    tieBreakSeed: 7       # random only, optional: a reproducible draw (else the OS's entropy)

``tieBreak: random`` is kube-scheduler's selectHost (uniformly among the nodes with the top
score); with no scores every feasible node ties, so such a profile places at random.

A profile is refused, with a message naming the offending entry, for: unknown keys, an unknown
plugin, a plugin listed twice at one extension point, a weight that is not a positive integer,
a plugin that does not implement the extension point it is listed under, or bad args, a
``preemption`` that is not a boolean, a ``tieBreak`` other than first or random, a
``tieBreakSeed`` that is not a non-negative integer or comes without ``tieBreak: random``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placement.framework.registry import PluginConfigError, Registry

# Cheap, definitive (unresolvable) rejections first, as Gödel's ordered filter registry does.
DEFAULT_FILTERS = (
    "NodeUnschedulable",
    "NodeAffinity",
    "TaintToleration",
    "NodePorts",
    # Before the pool fit: a model the pod does not accept is final (unresolvable), and a card
    # short of a share says so rather than the pool's total.
    "GpuCards",
    "NodeResourcesFit",
    # After the pool fit: NUMA nodes are a finer cut of the same room.
    "NumaTopology",
    # Topology rules last: they run only for pods they concern (Framework.prepare).
    "PodTopologySpread",
    "InterPodAffinity",
)
TIE_BREAK_FIRST = "first"  # the scan order from the rotating offset decides
TIE_BREAK_RANDOM = "random"  # uniformly among the nodes with the top score
TIE_BREAKS = (TIE_BREAK_FIRST, TIE_BREAK_RANDOM)
DEFAULT_SCORES = (
    ("LeastAllocated", 1),
    ("BalancedAllocation", 1),
    ("NodeAffinity", 2),
    ("TaintToleration", 3),
    # kube-scheduler's default weights.
    ("PodTopologySpread", 2),
    ("InterPodAffinity", 2),
    # Packs NUMA-bound pods onto partly used NUMA nodes; 0 for every other pod.
    ("NumaTopology", 2),
    # Where the learned GPU shape mix's fragmentation grows least (pods asking no GPU: by the
    # GPU they strand on nodes with cards). Its default policy (fgd-balance) scores on a scale
    # of its own, so the scores above only break its ties on a GPU node.
    ("GpuFragmentation", 10),
)
# Unit level: job-level affinity groups a gang's nodes by topology domain (no-op for others).
DEFAULT_GROUPING = ("JobLevelAffinity",)
# Unit level: pods that may take a reservation's hold try its node first (no-op for others).
DEFAULT_LOCATING = ("Reservation",)


class ProfileError(PluginConfigError):
    """The profile is invalid."""


@dataclass(frozen=True)
class Profile:
    filters: tuple[str, ...] = DEFAULT_FILTERS
    scores: tuple[tuple[str, int], ...] = DEFAULT_SCORES
    locating: tuple[str, ...] = DEFAULT_LOCATING
    grouping: tuple[str, ...] = DEFAULT_GROUPING
    args: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # PostFilter: a pod that fits nowhere may evict lower-priority pods (on unless switched off).
    preemption: bool = True
    # Select: which of the nodes with the top score (``TIE_BREAKS``), and the random draw's
    # seed (None: the OS's entropy).
    tie_break: str = TIE_BREAK_FIRST
    tie_break_seed: int | None = None


_KEYS = {
    "filters", "scores", "locating", "grouping", "args", "preemption", "tieBreak", "tieBreakSeed",
}  # fmt: skip


def where_of(source: str | Path) -> str:
    """How errors about a profile from ``source`` name it: its path, or "profile" for text."""
    return str(source) if isinstance(source, Path) else "profile"


def parse_profile(source: str | Path, registry: Registry) -> Profile:
    """Parse YAML text (or a file) and check its shape against ``registry``: known plugins,
    each listed once, integer weights. The plugins' own args are checked by building them
    (``runtime.load_profile``, which callers use)."""
    where = where_of(source)
    import yaml  # a profile's reader's only: ~1 MiB of heap a process that has none never needs

    try:
        text = source.read_text() if isinstance(source, Path) else source
        doc = yaml.safe_load(text)
    except OSError as exc:
        raise ProfileError(f"{where}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ProfileError(f"{where}: not valid YAML: {exc}") from exc
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ProfileError(f"{where}: expected a mapping with keys {sorted(_KEYS)}")
    unknown = set(doc) - _KEYS
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {sorted(unknown)} (known: {sorted(_KEYS)})")
    profile = Profile(
        filters=_names(doc, "filters", where, DEFAULT_FILTERS),
        scores=_scores(doc, where),
        locating=_names(doc, "locating", where, DEFAULT_LOCATING),
        grouping=_names(doc, "grouping", where, DEFAULT_GROUPING),
        args=_args(doc, where),
        preemption=_flag(doc, "preemption", where, default=True),
        tie_break=_tie_break(doc, where),
        tie_break_seed=_tie_break_seed(doc, where),
    )
    check_profile(profile, registry, where)
    return profile


def check_profile(profile: Profile, registry: Registry, where: str = "profile") -> None:
    """Refuse unknown or duplicate plugins and bad weights."""
    for point, names in (
        ("filters", profile.filters),
        ("scores", tuple(n for n, _ in profile.scores)),
        ("locating", profile.locating),
        ("grouping", profile.grouping),
    ):
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise ProfileError(f"{where}: {point}: plugin {name!r} listed twice")
            seen.add(name)
            if name not in registry:
                raise ProfileError(
                    f"{where}: {point}: unknown plugin {name!r} (known: {registry.names()})"
                )
    for name, weight in profile.scores:
        if isinstance(weight, bool) or not isinstance(weight, int) or weight <= 0:
            raise ProfileError(f"{where}: scores: {name}: weight must be an integer > 0")
    for name in profile.args:
        if name not in registry:
            raise ProfileError(f"{where}: args: unknown plugin {name!r}")


def _flag(doc: dict[str, Any], key: str, where: str, *, default: bool) -> bool:
    value = doc.get(key, default)
    if not isinstance(value, bool):
        raise ProfileError(f"{where}: {key}: expected true or false, got {value!r}")
    return value


def _tie_break(doc: dict[str, Any], where: str) -> str:
    value = doc.get("tieBreak", TIE_BREAK_FIRST)
    if value not in TIE_BREAKS:
        raise ProfileError(f"{where}: tieBreak: expected one of {list(TIE_BREAKS)}, got {value!r}")
    return str(value)


def _tie_break_seed(doc: dict[str, Any], where: str) -> int | None:
    if "tieBreakSeed" not in doc:
        return None
    value = doc["tieBreakSeed"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProfileError(f"{where}: tieBreakSeed: expected an integer >= 0, got {value!r}")
    if doc.get("tieBreak") != TIE_BREAK_RANDOM:
        raise ProfileError(f"{where}: tieBreakSeed: only with tieBreak: {TIE_BREAK_RANDOM}")
    return value


def _names(doc: dict[str, Any], key: str, where: str, default: tuple[str, ...]) -> tuple[str, ...]:
    if key not in doc:
        return default
    value = doc[key] or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProfileError(f"{where}: {key}: expected a list of plugin names")
    return tuple(value)


def _scores(doc: dict[str, Any], where: str) -> tuple[tuple[str, int], ...]:
    if "scores" not in doc:
        return DEFAULT_SCORES
    value = doc["scores"] or []
    if not isinstance(value, list):
        raise ProfileError(f"{where}: scores: expected a list of {{name, weight}}")
    out = []
    for i, entry in enumerate(value):
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ProfileError(f"{where}: scores[{i}]: expected {{name: PLUGIN, weight: N}}")
        extra = set(entry) - {"name", "weight"}
        if extra:
            raise ProfileError(f"{where}: scores[{i}]: unknown key(s) {sorted(extra)}")
        weight = entry.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int) or weight <= 0:
            raise ProfileError(
                f"{where}: scores[{i}] ({entry['name']}): weight must be an integer > 0, "
                f"got {weight!r}"
            )
        out.append((entry["name"], weight))
    return tuple(out)


def _args(doc: dict[str, Any], where: str) -> dict[str, Mapping[str, Any]]:
    value = doc.get("args") or {}
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: args: expected a mapping of plugin name to args")
    for name, args in value.items():
        if not isinstance(args, dict):
            raise ProfileError(f"{where}: args: {name}: expected a mapping")
    return value
