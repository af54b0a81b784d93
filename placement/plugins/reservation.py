"""Reservation (Gödel's Reservation locating plugin): a pod that may take a reservation's hold
tries the node holding it first, before the usual scan — a preference, not a filter: a pod that
does not fit there is placed as usual (and its reservation waits for another owner's pod or its
TTL). Whether it fits there is the filters' question, which judge that node without the hold
(``placement.reservations.lent``, applied by the framework to every filter), so the room is
its owner's alone: every other pod sees it taken.

The preference is the unit's list of recommended nodes (``UnitInfo.preferred``, untagged), as
a Movement's recommendations are: a node is listed once per hold of the unit's pods there."""

from __future__ import annotations

from typing import ClassVar

from placement.framework import LocatingPlugin, NoArgs, PluginSpec, UnitInfo
from placement.nodeinfo import NodeInfo

NAME = "Reservation"
# The tag of a reservation's preference: none (a Movement's recommendation names the Movement,
# which the Binder records; a hold's consumption is the Binder's own finding).
UNTAGGED = ""


class Reservation:
    NAME: ClassVar[str] = NAME

    def locate(self, unit: UnitInfo, nodes: list[NodeInfo]) -> list[NodeInfo] | None:
        """No narrowing (None); the nodes holding the unit's pods' holds join its preferred
        nodes, each hold once, first (ahead of any Movement's recommendation)."""
        wanted: list[tuple[str, str]] = []
        seen: set[str] = set()
        for pod in unit.pods:
            for hold, node in sorted(pod.reservations.items()):
                if hold not in seen:
                    seen.add(hold)
                    wanted.append((node, UNTAGGED))
        if wanted:
            listed = set(unit.preferred)
            unit.preferred[:0] = [w for w in wanted if w not in listed]
        return None


def new(args: NoArgs) -> Reservation:
    return Reservation()


_check: type[LocatingPlugin] = Reservation
SPEC = PluginSpec(NAME, NoArgs, new)
