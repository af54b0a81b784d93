"""A local cluster of real processes under ``$GODEL_HOME`` (what `godel up/down/status` drive)."""

from godel.local.cluster import (
    ClusterError,
    ClusterSpec,
    ComponentStatus,
    binder_lease,
    down,
    scale,
    start_again,
    status,
    up,
)
from godel.local.home import ClusterState, ComponentRecord, GodelHome, StateError, default_home

__all__ = [
    "ClusterError",
    "ClusterSpec",
    "ClusterState",
    "ComponentRecord",
    "ComponentStatus",
    "GodelHome",
    "StateError",
    "binder_lease",
    "default_home",
    "down",
    "scale",
    "start_again",
    "status",
    "up",
]
