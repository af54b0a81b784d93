"""TaintToleration: a node's NoSchedule and NoExecute taints must all be tolerated (filter); the
fewer untolerated PreferNoSchedule taints, the higher the score (normalized, reversed)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from placement.framework import (
    MAX_NODE_SCORE,
    FilterPlugin,
    NoArgs,
    NormalizeScore,
    PluginSpec,
    PodInfo,
    ScorePlugin,
    Status,
)
from placement.framework.interface import Toleration
from placement.nodeinfo import NodeInfo
from protos.godel.v1 import objects_pb2 as pb

NAME = "TaintToleration"
UNTOLERATED = "untolerated taint"
_UNTOLERATED = Status.unresolvable(UNTOLERATED, plugin=NAME)

_HARD = (pb.NO_SCHEDULE, pb.NO_EXECUTE)


def tolerates(tolerations: Iterable[Toleration], key: str, value: str, effect: int) -> bool:
    for t in tolerations:
        if t.effect and t.effect != effect:
            continue
        if t.exists:
            if not t.key or t.key == key:
                return True
        elif t.key == key and t.value == value:
            return True
    return False


class TaintToleration:
    NAME: ClassVar[str] = NAME

    def filter(self, pod: PodInfo, node: NodeInfo) -> Status | None:
        for taint in node.taints:
            effect = taint.effect
            if effect in _HARD and not tolerates(pod.tolerations, taint.key, taint.value, effect):
                return _UNTOLERATED
        return None

    def score(self, pod: PodInfo, node: NodeInfo) -> int:
        count = 0
        for taint in node.taints:
            if taint.effect == pb.PREFER_NO_SCHEDULE and not tolerates(
                pod.tolerations, taint.key, taint.value, taint.effect
            ):
                count += 1
        return count

    def normalize_scores(self, pod: PodInfo, scores: list[int]) -> None:
        top = max(scores, default=0)
        for i, s in enumerate(scores):
            scores[i] = MAX_NODE_SCORE if top == 0 else MAX_NODE_SCORE - s * MAX_NODE_SCORE // top


def new(args: NoArgs) -> TaintToleration:
    return TaintToleration()


_check_filter: type[FilterPlugin] = TaintToleration
_check_score: type[ScorePlugin] = TaintToleration
_check_norm: type[NormalizeScore] = TaintToleration
SPEC = PluginSpec(NAME, NoArgs, new)
