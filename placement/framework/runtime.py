"""The framework instance of one profile: plugins built once, run per pod and per node."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path

from placement.framework.interface import (
    Candidates,
    FilterPlugin,
    GroupingPlugin,
    LearningScore,
    LocatingPlugin,
    NodeGroups,
    NodeLabels,
    NormalizeScore,
    Plugin,
    PodInfo,
    PreFilter,
    ScorePlugin,
    SharePolicySource,
    Status,
    TopologyPlugin,
    UnitInfo,
)
from placement.framework.profile import Profile, ProfileError, parse_profile, where_of
from placement.framework.registry import PluginConfigError, Registry
from placement.gpufrag import Policy
from placement.nodeinfo import NodeInfo
from placement.reservations import lent
from placement.topology import PodCounts

FilterFn = Callable[[PodInfo, NodeInfo], Status | None]
ScoreFn = Callable[[PodInfo, NodeInfo], int]


def _lending(fn: FilterFn) -> FilterFn:
    """``fn`` judging a node as the pod's reservations leave it to the pod."""

    def lending(pod: PodInfo, node: NodeInfo) -> Status | None:
        return fn(pod, lent(pod.reservations, node))

    return lending


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
        # Plugins reading the topology index, prepared per pod attempt (``prepare``); a pod none
        # of them prepared for runs only ``node_filters`` and the other scores: today's path.
        self.topology: list[TopologyPlugin] = []
        self.node_filters: list[FilterFn] = []
        self.topology_filters: list[FilterFn] = []
        self._topology_scores: set[str] = set()
        self._share_sources: list[SharePolicySource] = []
        self._learning: list[LearningScore] = []

        for name in profile.filters:
            plugin = self._plugin(name, registry)
            if not isinstance(plugin, FilterPlugin):
                raise ProfileError(f"filters: plugin {name!r} is not a Filter plugin")
            self.filters.append(plugin.filter)
            self.filter_names.append(name)
            if isinstance(plugin, PreFilter):
                self.pre_filters.append(plugin)
            if isinstance(plugin, TopologyPlugin):
                self._add_topology(plugin)
                self.topology_filters.append(plugin.filter)
            else:
                self.node_filters.append(plugin.filter)
        for name, weight in profile.scores:
            plugin = self._plugin(name, registry)
            if not isinstance(plugin, ScorePlugin):
                raise ProfileError(f"scores: plugin {name!r} is not a Score plugin")
            norm = plugin.normalize_scores if isinstance(plugin, NormalizeScore) else None
            if isinstance(plugin, SharePolicySource):
                self._share_sources.append(plugin)
            if isinstance(plugin, LearningScore):
                self._learning.append(plugin)
            self.scores.append((name, weight, plugin.score, norm))
            if isinstance(plugin, TopologyPlugin):
                self._add_topology(plugin)
                self._topology_scores.add(name)
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

    def _add_topology(self, plugin: TopologyPlugin) -> None:
        if all(p is not plugin for p in self.topology):
            self.topology.append(plugin)

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

    def prepare(self, pod: PodInfo, counts: PodCounts) -> bool:
        """Before a scheduling attempt of ``pod``: let each topology plugin read the counts it
        needs (``pod.topology``). True when some topology rule concerns the pod."""
        states: dict[str, object] = {}
        for plugin in self.topology:
            state = plugin.prepare(pod, counts)
            if state is not None:
                states[plugin.NAME] = state
        pod.topology = states or None
        return pod.topology is not None

    def filters_for(self, pod: PodInfo) -> list[FilterFn]:
        """The filters to run for ``pod``: all, or only the node filters when no topology rule
        concerns it (prepared or not). A pod that may take reservations' holds has every filter
        judge a node holding one of them as if that hold were gone (``reservations.lent``)."""
        filters = self.filters if pod.topology is not None else self.node_filters
        if pod.reservations:
            return [_lending(fn) for fn in filters]
        return filters

    def run_filters(self, pod: PodInfo, node: NodeInfo) -> Status | None:
        """The first failing filter's status (short-circuit), or None if every filter passes."""
        if pod.reservations:
            node = lent(pod.reservations, node)
        for fn in self.filters if pod.topology is not None else self.node_filters:
            status = fn(pod, node)
            if status is not None:
                return status
        return None

    def topology_shape(self, pod: PodInfo) -> tuple[frozenset[str], Hashable]:
        """The union of the prepared topology plugins' shapes (``TopologyPlugin.shape``): the
        keys whose domains a node's result reads, and the part that holds for every node."""
        keys: frozenset[str] = frozenset()
        every: list[Hashable] = []
        states = pod.topology or {}
        for plugin in self.topology:
            state = states.get(plugin.NAME)
            if state is not None:
                k, g = plugin.shape(state)
                keys |= k
                every.append((plugin.NAME, g))
        return keys, tuple(every)

    def score_parts(
        self, pod: PodInfo, nodes: list[NodeInfo], *, topology_apart: bool = False
    ) -> tuple[list[int], list[int]]:
        """Per node: (weighted sum of normalizing plugins, weighted sum of the others). The
        first part depends only on node properties, so it is reused when a node is re-scored.
        ``topology_apart``: leave the topology plugins out (``topology_raw`` and
        ``topology_scores`` give them), since their scores move with the counts."""
        static = [0] * len(nodes)
        dynamic = [0] * len(nodes)
        skip = self._topology_scores if pod.topology is None or topology_apart else ()
        for name, weight, score, normalize in self.scores:
            if name in skip:
                continue
            raw = [score(pod, node) for node in nodes]
            if normalize is not None:
                normalize(pod, raw)
                for i, s in enumerate(raw):
                    static[i] += weight * s
            else:
                for i, s in enumerate(raw):
                    dynamic[i] += weight * s
        return static, dynamic

    def topology_raw(self, pod: PodInfo, node: NodeInfo) -> tuple[int, ...]:
        """The raw scores of the topology score plugins for a prepared pod, in profile order."""
        return tuple(
            score(pod, node) for name, _, score, _ in self.scores if name in self._topology_scores
        )

    def topology_scores(self, pod: PodInfo, raws: list[tuple[int, ...]]) -> list[int]:
        """Per node: the weighted, normalized (over ``raws``, one tuple per node) sum of the
        topology score plugins' raw scores."""
        total = [0] * len(raws)
        column = 0
        for name, weight, _, normalize in self.scores:
            if name not in self._topology_scores:
                continue
            values = [r[column] for r in raws]
            column += 1
            if normalize is not None:
                normalize(pod, values)
            for i, v in enumerate(values):
                total[i] += weight * v
        return total

    def observe(self, pod: PodInfo) -> None:
        """Show ``pod`` to the learning score plugins (``LearningScore``), once per attempt,
        before its candidates are picked or scored."""
        for plugin in self._learning:
            plugin.observe(pod)

    def score_generation(self) -> int:
        """Changes whenever a learning score plugin's answer for an unchanged node may have
        changed (the sum of their monotone generations; 0 without any)."""
        return sum(plugin.score_generation() for plugin in self._learning)

    def share_policy(self) -> Policy | None:
        """The policy a GPU share's card is chosen by (``SharePolicySource``; the first score
        plugin that names one), or None: best fit."""
        for source in self._share_sources:
            policy = source.share_policy()
            if policy is not None:
                return policy
        return None

    def dynamic_score(self, pod: PodInfo, node: NodeInfo) -> int:
        skip = self._topology_scores if pod.topology is None else ()
        return sum(
            w * score(pod, node)
            for name, w, score, norm in self.scores
            if norm is None and name not in skip
        )

    # -- unit level (defaults are no-ops) ----------------------------------------------------

    def node_groups(self, unit: UnitInfo, nodes: list[NodeInfo]) -> NodeGroups | None:
        """The node groups to try in order, or None for "all nodes, one group" (the default,
        and the answer when no plugin has an opinion on this unit: the search then keeps the
        snapshot's own ordering without copying)."""
        located = False
        for loc in self.locating:
            narrowed = loc.locate(unit, nodes)
            if narrowed is not None:
                nodes, located = narrowed, True
        found = NodeGroups([nodes]) if located else None
        for grp in self.grouping:
            groups: list[list[NodeInfo]] = []
            reasons: list[str] = []
            opinion = False
            for group in found.groups if found is not None else [nodes]:
                split = grp.group(unit, group)
                if split is None:
                    groups.append(group)
                else:
                    opinion = True
                    groups += split.groups
                    if split.reason:
                        reasons.append(split.reason)
            if opinion:
                prior = [found.reason] if found is not None and found.reason else []
                found = NodeGroups(groups, "; ".join(prior + reasons))
        return found


def load_profile(source: str | Path, registry: Registry) -> Profile:
    """Parse YAML text (or a file) and validate it against ``registry``: its shape
    (``profile.parse_profile``), then every plugin's args, by building each plugin once."""
    profile = parse_profile(source, registry)
    try:
        Framework(profile, registry)
    except ProfileError:
        raise
    except PluginConfigError as exc:
        raise ProfileError(f"{where_of(source)}: {exc}") from exc
    return profile
