"""PendingChecker: a pod is not moved while more pods than a threshold wait for a node in its
sub-cluster. A part of the cluster that cannot place the pods it has should not be given evicted
ones to place too.

**Which pending pods count.** The original counts the pending pods of the moving pod's
sub-cluster. Gödel's sub-clusters are groups of nodes named by the values of one node label (the
scheduler's ``subClusterKey``); a pod belongs to the sub-cluster its node selector names for that
label, and to the default sub-cluster ("") when it names none. This model has exactly those two
parts — node labels and pods' node selectors — so here ``sub_cluster_key`` names the label and a
pod's sub-cluster is ``node_selector[sub_cluster_key]`` (or ""), as in the original. The other
groupings the model has are not sub-clusters: a shard's node partition is the dispatcher's
internal, shifting split of the work, not something a pod belongs to; a queue is a tenant's
quota, not a set of nodes; the guaranteed and best-effort pools are two capacities of every node.
Without ``sub_cluster_key`` every pod's sub-cluster is the policy's scope as a whole.

Either way, only pending pods that could run in the policy's scope count: a pod's node selector
must agree with the scope's labels on every key both name (a pod pinned elsewhere does not hold
this scope back).

**Thresholds**, as the original's ``pendingThresholds`` and ``defaultPendingThreshold``: a move
is vetoed when its pod's sub-cluster has more pending pods than ``thresholds[sub-cluster]``, or,
for a sub-cluster not listed there, than ``max_pending``. With neither there is no limit: a
PendingChecker listed without args never vetoes (the original passes every move without args).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from placement.framework import PluginSpec
from protos.godel.v1 import objects_pb2 as pb
from services.rescheduler.framework import Check, ClusterView, Move

NAME = "PendingChecker"


@dataclass(frozen=True)
class PendingCheckerArgs:
    # Most pods that may wait in a sub-cluster not named in ``thresholds``; None: no limit.
    max_pending: int | None = None
    # The node label whose values name sub-clusters; "": the policy's scope is one.
    sub_cluster_key: str = ""
    # Per sub-cluster (a value of ``sub_cluster_key``), the most pods that may wait in it.
    thresholds: dict[str, int] = field(default_factory=dict)

    def validate(self) -> None:
        if self.max_pending is not None and not _count(self.max_pending):
            raise ValueError(
                f"max_pending must be an int >= 0 (omitted: no limit), got {self.max_pending!r}"
            )
        if not isinstance(self.thresholds, dict):
            raise ValueError("thresholds must be a mapping of sub-cluster to an int >= 0")
        for sub_cluster, limit in self.thresholds.items():
            if not isinstance(sub_cluster, str):
                raise ValueError(f"thresholds: {sub_cluster!r} is not a sub-cluster name")
            if not _count(limit):
                raise ValueError(f"thresholds.{sub_cluster} must be an int >= 0, got {limit!r}")
        if self.thresholds and not self.sub_cluster_key:
            raise ValueError(
                "thresholds need sub_cluster_key (the node label whose values they name)"
            )


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def could_run_in_scope(pod: pb.Pod, scope_labels: Mapping[str, str]) -> bool:
    """Whether ``pod``'s node selector agrees with the scope's labels on every key both name."""
    selector = pod.spec.template.node_selector
    return all(selector.get(k, v) == v for k, v in scope_labels.items())


class PendingChecker:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: PendingCheckerArgs) -> None:
        self.args = args
        self._pending: Counter[str] = Counter()  # sub-cluster -> pending pods in scope
        self._verdicts: dict[str, str | None] = {}  # pod -> veto, this round

    def start_round(self, view: ClusterView, now: float) -> None:
        self._verdicts.clear()
        self._pending.clear()
        if self.args.max_pending is None and not self.args.thresholds:
            return  # no limit: nothing to count
        key = self.args.sub_cluster_key
        for pod in view.pending:
            if could_run_in_scope(pod, view.scope_labels):
                self._pending[pod.spec.template.node_selector.get(key, "") if key else ""] += 1

    def sub_cluster(self, view: ClusterView, pod: str) -> str:
        """The sub-cluster of a placed pod ("" = the default one, or the policy's scope)."""
        key = self.args.sub_cluster_key
        running = view.pods.get(pod)
        if not key or running is None:
            return ""
        return dict(running.info.node_selector).get(key, "")

    def check(self, view: ClusterView, move: Move) -> str | None:
        if move.pod not in self._verdicts:
            self._verdicts[move.pod] = self._judge(view, move.pod)
        return self._verdicts[move.pod]

    def _judge(self, view: ClusterView, pod: str) -> str | None:
        sub_cluster = self.sub_cluster(view, pod)
        limit = self.args.thresholds.get(sub_cluster, self.args.max_pending)
        waiting = self._pending[sub_cluster]
        if limit is None or waiting <= limit:
            return None
        key = self.args.sub_cluster_key
        where = f"sub-cluster {key}={sub_cluster!r}" if key else "the policy's scope"
        return f"{waiting} pods are pending in {where} (max {limit})"

    def admit(self, view: ClusterView, move: Move) -> None:
        return None

    def retract(self, view: ClusterView, move: Move) -> None:
        return None

    def record(self, moves: Sequence[Move], view: ClusterView, generation: int, now: float) -> None:
        return None


def new(args: PendingCheckerArgs) -> PendingChecker:
    return PendingChecker(args)


_check: type[Check] = PendingChecker
SPEC = PluginSpec(NAME, PendingCheckerArgs, new)
