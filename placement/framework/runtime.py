"""The framework instance of one profile: plugins built once, run per pod and per node."""

from __future__ import annotations

from collections.abc import Callable

from placement.framework.interface import (
    Candidates,
    FilterPlugin,
    GroupingPlugin,
    LocatingPlugin,
    NodeLabels,
    NormalizeScore,
    Plugin,
    PodInfo,
    PreFilter,
    ScorePlugin,
    Status,
    UnitInfo,
)
from placement.framework.profile import Profile, ProfileError
from placement.framework.registry import Registry
from placement.nodeinfo import NodeInfo

FilterFn = Callable[[PodInfo, NodeInfo], Status | None]
ScoreFn = Callable[[PodInfo, NodeInfo], int]


class Framework:
    def __init__(self, profile: Profile, registry: Registry) -> None:
        self.profile = profile
        self.plugins: dict[str, Plugin] = {}
        self.filters: list[FilterFn] = []
        self.filter_names: list[str] = []
        self.pre_filters: list[PreFilter] = []
        # (name, weight, score fn, normalize fn or None)
        self.scores: list[
            tuple[str, int, ScoreFn, Callable[[PodInfo, list[int]], None] | None]
        ] = []
        self.locating: list[LocatingPlugin] = []
        self.grouping: list[GroupingPlugin] = []

        for name in profile.filters:
            plugin = self._plugin(name, registry)
            if not isinstance(plugin, FilterPlugin):
                raise ProfileError(f"filters: plugin {name!r} is not a Filter plugin")
            self.filters.append(plugin.filter)
            self.filter_names.append(name)
            if isinstance(plugin, PreFilter):
                self.pre_filters.append(plugin)
        for name, weight in profile.scores:
            plugin = self._plugin(name, registry)
            if not isinstance(plugin, ScorePlugin):
                raise ProfileError(f"scores: plugin {name!r} is not a Score plugin")
            norm = plugin.normalize_scores if isinstance(plugin, NormalizeScore) else None
            self.scores.append((name, weight, plugin.score, norm))
        for name in profile.locating:
            plugin = self._plugin(name, registry)
            if not isinstance(plugin, LocatingPlugin):
                raise ProfileError(f"locating: plugin {name!r} is not a Locating plugin")
            self.locating.append(plugin)
        for name in profile.grouping:
            plugin = self._plugin(name, registry)
            if not isinstance(plugin, GroupingPlugin):
                raise ProfileError(f"grouping: plugin {name!r} is not a Grouping plugin")
            self.grouping.append(plugin)

    def _plugin(self, name: str, registry: Registry) -> Plugin:
        # One instance per plugin, shared by every extension point it is listed under.
        plugin = self.plugins.get(name)
        if plugin is None:
            plugin = self.plugins[name] = registry.get(name).build(self.profile.args.get(name))
        return plugin

    # -- pod level ---------------------------------------------------------------------------

    def candidates(self, pod: PodInfo, labels: NodeLabels) -> Candidates | None:
        """The only nodes that can pass every filter, by the PreFilters (None: any node may).
        Several answers intersect; the excluded nodes are explained by the narrowest one."""
        found: Candidates | None = None
        for plugin in self.pre_filters:
            answer = plugin.pre_filter(pod, labels)
            if answer is None:
                continue
            if found is None:
                found = answer
            else:
                narrower = answer if len(answer.nodes) < len(found.nodes) else found
                found = Candidates(found.nodes & answer.nodes, narrower.reason)
        return found

    def run_filters(self, pod: PodInfo, node: NodeInfo) -> Status | None:
        """The first failing filter's status (short-circuit), or None if every filter passes."""
        for fn in self.filters:
            status = fn(pod, node)
            if status is not None:
                return status
        return None

    def score_parts(self, pod: PodInfo, nodes: list[NodeInfo]) -> tuple[list[int], list[int]]:
        """Per node: (weighted sum of normalizing plugins, weighted sum of the others). The
        first part depends only on node properties, so it is reused when a node is re-scored."""
        static = [0] * len(nodes)
        dynamic = [0] * len(nodes)
        for _, weight, score, normalize in self.scores:
            raw = [score(pod, node) for node in nodes]
            if normalize is not None:
                normalize(pod, raw)
                for i, s in enumerate(raw):
                    static[i] += weight * s
            else:
                for i, s in enumerate(raw):
                    dynamic[i] += weight * s
        return static, dynamic

    def dynamic_score(self, pod: PodInfo, node: NodeInfo) -> int:
        return sum(w * score(pod, node) for _, w, score, norm in self.scores if norm is None)

    # -- unit level (defaults are no-ops) ----------------------------------------------------

    def node_groups(self, unit: UnitInfo, nodes: list[NodeInfo]) -> list[list[NodeInfo]] | None:
        """The node groups to try in order, or None for "all nodes, one group" (the default,
        which lets the search use the snapshot's own ordering without copying)."""
        if not self.locating and not self.grouping:
            return None
        for loc in self.locating:
            nodes = loc.locate(unit, nodes)
        groups = [nodes]
        for grp in self.grouping:
            groups = [g for group in groups for g in grp.group(unit, group)]
        return groups
