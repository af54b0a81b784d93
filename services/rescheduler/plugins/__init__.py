"""The rescheduler's detector/algorithm plugins, one module each (NAME, Args, new, SPEC). Every
plugin is both a Detector and an Algorithm (services.rescheduler.framework)."""

from placement.framework import Registry
from services.rescheduler.plugins import (
    binpacking,
    colocation,
    gpudefrag,
    loadbalance,
    topologyspread,
)


def new_plugin_registry() -> Registry:
    return Registry(
        [binpacking.SPEC, gpudefrag.SPEC, loadbalance.SPEC, topologyspread.SPEC, colocation.SPEC]
    )


__all__ = ["new_plugin_registry"]
