"""PendingChecker: no moves while more than ``max_pending`` pods wait for a node in the policy's
scope. A cluster that cannot place the pods it has should not be given evicted ones to place too.

A pending pod counts when it could run in scope: its node selector agrees with the scope's labels
on every key both name (a pod pinned elsewhere does not hold this scope back).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from placement.framework import PluginSpec
from protos.godel.v1 import objects_pb2 as pb
from services.rescheduler.framework import Check, ClusterView, Move

NAME = "PendingChecker"


@dataclass(frozen=True)
class PendingCheckerArgs:
    max_pending: int = 0

    def validate(self) -> None:
        if self.max_pending < 0:
            raise ValueError("max_pending must be >= 0")


def pending_in_scope(pending: Sequence[pb.Pod], scope_labels: Mapping[str, str]) -> int:
    count = 0
    for pod in pending:
        selector = pod.spec.template.node_selector
        if all(selector.get(k, v) == v for k, v in scope_labels.items()):
            count += 1
    return count


class PendingChecker:
    NAME: ClassVar[str] = NAME

    def __init__(self, args: PendingCheckerArgs) -> None:
        self.args = args
        self._pending = 0

    def start_round(self, view: ClusterView, now: float) -> None:
        self._pending = pending_in_scope(view.pending, view.scope_labels)

    def check(self, view: ClusterView, move: Move) -> str | None:
        if self._pending > self.args.max_pending:
            return f"{self._pending} pods are pending in scope (max {self.args.max_pending})"
        return None

    def admit(self, view: ClusterView, move: Move) -> None:
        return None

    def record(self, moves: Sequence[Move], view: ClusterView, generation: int, now: float) -> None:
        return None


def new(args: PendingCheckerArgs) -> PendingChecker:
    return PendingChecker(args)


_check: type[Check] = PendingChecker
SPEC = PluginSpec(NAME, PendingCheckerArgs, new)
