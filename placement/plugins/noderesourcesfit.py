"""NodeResourcesFit: the pod's requests fit the free capacity of its pool (guaranteed for online
pods, reclaimable for best-effort ones) and a pod slot is free. The check itself is
placement.nodeinfo.resource_fit_failures, shared with the Binder."""

from __future__ import annotations

from typing import ClassVar

from placement.framework import FilterPlugin, NoArgs, PluginSpec, PodInfo, Status
from placement.nodeinfo import NodeInfo, resource_fit_failures

NAME = "NodeResourcesFit"


class NodeResourcesFit:
    NAME: ClassVar[str] = NAME

    def filter(self, pod: PodInfo, node: NodeInfo) -> Status | None:
        failures = resource_fit_failures(node, pod.req)
        # Unschedulable (not unresolvable): evicting pods could make room.
        return Status.unschedulable(*failures, plugin=NAME) if failures else None


def new(args: NoArgs) -> NodeResourcesFit:
    return NodeResourcesFit()


_check: type[FilterPlugin] = NodeResourcesFit
SPEC = PluginSpec(NAME, NoArgs, new)
