"""NodeUnschedulable: nodes cordoned (spec.unschedulable) or not ready take no new pods."""

from __future__ import annotations

from typing import ClassVar

from placement.framework import FilterPlugin, NoArgs, PluginSpec, PodInfo, Status
from placement.nodeinfo import NodeInfo

NAME = "NodeUnschedulable"
NODE_UNSCHEDULABLE = "node unschedulable"
NODE_NOT_READY = "node not ready"

_UNSCHEDULABLE = Status.unresolvable(NODE_UNSCHEDULABLE, plugin=NAME)
_NOT_READY = Status.unresolvable(NODE_NOT_READY, plugin=NAME)


class NodeUnschedulable:
    NAME: ClassVar[str] = NAME

    def filter(self, pod: PodInfo, node: NodeInfo) -> Status | None:
        if node.unschedulable:
            return _UNSCHEDULABLE
        if not node.ready:
            return _NOT_READY
        return None


def new(args: NoArgs) -> NodeUnschedulable:
    return NodeUnschedulable()


_check: type[FilterPlugin] = NodeUnschedulable
SPEC = PluginSpec(NAME, NoArgs, new)
