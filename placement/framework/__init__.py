"""The scheduling framework: plugin API, registry, profile, runtime. See ../README.md."""

from placement.framework.interface import (
    MAX_NODE_SCORE,
    Candidates,
    Code,
    FilterPlugin,
    GroupingPlugin,
    JobAffinity,
    LocatingPlugin,
    NodeGroups,
    NodeLabels,
    NormalizeScore,
    Plugin,
    PodInfo,
    PreFilter,
    ScorePlugin,
    SpreadConstraint,
    Status,
    TopologyPlugin,
    UnitInfo,
)
from placement.framework.profile import Profile, ProfileError
from placement.framework.registry import NoArgs, PluginConfigError, PluginSpec, Registry
from placement.framework.runtime import Framework, load_profile

__all__ = [
    "MAX_NODE_SCORE",
    "Candidates",
    "Code",
    "FilterPlugin",
    "Framework",
    "GroupingPlugin",
    "JobAffinity",
    "LocatingPlugin",
    "NoArgs",
    "NodeGroups",
    "NodeLabels",
    "NormalizeScore",
    "Plugin",
    "PluginConfigError",
    "PluginSpec",
    "PodInfo",
    "PreFilter",
    "Profile",
    "ProfileError",
    "Registry",
    "ScorePlugin",
    "SpreadConstraint",
    "Status",
    "TopologyPlugin",
    "UnitInfo",
    "load_profile",
]
