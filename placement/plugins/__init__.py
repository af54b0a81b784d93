"""In-tree plugins, one module each (NAME, args, factory, SPEC)."""

from placement.framework import Registry
from placement.plugins import (
    balancedallocation,
    gpucards,
    gpufragmentation,
    interpodaffinity,
    joblevelaffinity,
    leastallocated,
    mostallocated,
    nodeaffinity,
    nodeports,
    noderesourcesfit,
    nodeunschedulable,
    numatopology,
    podtopologyspread,
    reservation,
    tainttoleration,
)


def new_in_tree_registry() -> Registry:
    return Registry(
        [
            noderesourcesfit.SPEC,
            nodeunschedulable.SPEC,
            nodeports.SPEC,
            nodeaffinity.SPEC,
            tainttoleration.SPEC,
            leastallocated.SPEC,
            mostallocated.SPEC,
            balancedallocation.SPEC,
            interpodaffinity.SPEC,
            podtopologyspread.SPEC,
            numatopology.SPEC,
            joblevelaffinity.SPEC,
            gpucards.SPEC,
            gpufragmentation.SPEC,
            reservation.SPEC,
        ]
    )


__all__ = ["new_in_tree_registry"]
