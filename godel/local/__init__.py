"""A local cluster of real processes under ``$GODEL_HOME`` (what `godel up/down/status` drive).

Names are imported on first use: a `godel get` reads only the cluster's state file
(``godel.local.home``) and must not pay for the process machinery (``godel.local.cluster``
brings the server runtime and the store client along).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from godel.local.home import (
        ClusterState,
        ComponentRecord,
        GodelHome,
        StateError,
        default_home,
    )

_HOMES = {
    "ClusterError": "cluster",
    "ClusterSpec": "cluster",
    "ComponentStatus": "cluster",
    "binder_lease": "cluster",
    "down": "cluster",
    "scale": "cluster",
    "start_again": "cluster",
    "status": "cluster",
    "up": "cluster",
    "ClusterState": "home",
    "ComponentRecord": "home",
    "GodelHome": "home",
    "StateError": "home",
    "default_home": "home",
}


def __getattr__(name: str) -> Any:
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


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
