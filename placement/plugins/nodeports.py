"""NodePorts: the pod's host ports are free on the node."""

from __future__ import annotations

from typing import ClassVar

from placement.framework import FilterPlugin, NoArgs, PluginSpec, PodInfo, Status
from placement.nodeinfo import PORTS_IN_USE, NodeInfo, port_conflict

NAME = "NodePorts"
_IN_USE = Status.unschedulable(PORTS_IN_USE, plugin=NAME)


class NodePorts:
    NAME: ClassVar[str] = NAME

    def filter(self, pod: PodInfo, node: NodeInfo) -> Status | None:
        if pod.req.host_ports and port_conflict(node, pod.req):
            return _IN_USE
        return None


def new(args: NoArgs) -> NodePorts:
    return NodePorts()


_check: type[FilterPlugin] = NodePorts
SPEC = PluginSpec(NAME, NoArgs, new)
