"""GpuCards: a pod's GPUs against a node's cards (``placement.gpu``, the one home of per-card
accounting): the model the pod accepts, a share fitting one card, whole cards wholly free.

Reasons (as ``godel explain`` shows them): ``GPU model not accepted`` (unresolvable: only
another node helps, so preemption does not try), ``no GPU card with enough free share`` and
``not enough whole free GPU cards`` (evicting pods that hold cards could help). The pool's totals
stay NodeResourcesFit's (``insufficient gpus``), which also judges a node with fewer cards than
the pod asks. A pod asking no GPU passes at the cost of one attribute read.
"""

from __future__ import annotations

from typing import ClassVar

from placement.framework import FilterPlugin, NoArgs, PluginSpec, PodInfo, Status
from placement.gpu import fit_failure
from placement.nodeinfo import NodeInfo

NAME = "GpuCards"


class GpuCards:
    NAME: ClassVar[str] = NAME

    def filter(self, pod: PodInfo, node: NodeInfo) -> Status | None:
        if not pod.req.requests.gpus:
            return None
        found = fit_failure(node, pod.req)
        if found is None:
            return None
        if found.unresolvable:
            return Status.unresolvable(found.reason, plugin=NAME)
        return Status.unschedulable(found.reason, plugin=NAME)


def new(_args: NoArgs) -> GpuCards:
    return GpuCards()


_check: type[FilterPlugin] = GpuCards
SPEC = PluginSpec(NAME, NoArgs, new)
