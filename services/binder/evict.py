"""One EvictRequest against the Binder's view: which pods go, and the commit that takes them.

All or nothing by default: a batch of the rescheduler (a swap, a cycle) is planned to leave
together, so one pod that may not go keeps every pod of the request in place. A ``partial``
request (a node agent relieving pressure) takes each pod that may go, in order. A pod already gone, finished or
re-created under its name (another uid) needs nothing and does not block the rest. The live pods
are charged to the disruption budgets selecting them, with allowances from the Binder's own
current view — the same accounting preemption's victims go through, and the committer decides one
request or batch at a time, so evictions of every kind together never exceed a budget. Each pod
is evicted through the one eviction path (``services.eviction``) with a replacement, in one
commit the caller fences.

The request's pods are read from the store for each attempt (one read): the Binder keeps
records of bound pods, not their bytes, and an eviction writes the whole pod.

Synchronous and free of I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from placement.claims import holds_claim
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.binder.state import ClusterState
from services.binder.victims import LiveBudgets
from services.eviction import Eviction, EvictionOps
from store.client import Op

EVICTED = ipb.EvictResult.EVICTED
GONE = ipb.EvictResult.GONE
REFUSED = ipb.EvictResult.REFUSED


class EvictPlan:
    def __init__(
        self,
        request: ipb.EvictRequest,
        pods: Mapping[str, pb.Pod | None],
        state: ClusterState,
        now_ms: int,
    ) -> None:
        """``pods``: the request's pods as read for it (None: gone)."""
        self.request = request
        self.pods = pods
        self.state = state
        self.now_ms = now_ms
        self.results: dict[str, ipb.EvictResult] = {}
        self.live: list[pb.Pod] = []
        self.refused = False
        # The reservations keeping evicted pods' room (their jobs' ``spec.reservation``).
        self.kept: list[pb.Reservation] = []
        self._check()

    def _check(self) -> None:
        problems: dict[str, str] = {}
        live: set[str] = set()
        for ref in self.request.pods:
            pod = self.pods.get(ref.name)
            if pod is None or not holds_claim(pod):
                self._result(ref.name, GONE, "not bound or running")
            elif ref.uid and pod.metadata.uid != ref.uid:
                self._result(ref.name, GONE, f"re-created (uid {pod.metadata.uid}, not {ref.uid})")
            elif pod.metadata.deletion_timestamp_ms:
                self._result(ref.name, GONE, "being deleted")
            elif ref.name in problems or ref.name in live:
                problems[ref.name] = "named twice in the request"
            else:
                live.add(ref.name)
                self.live.append(pod)
        if self.request.partial:
            self._admit_each(problems)
            return
        if not problems and self.live:
            tracker = LiveBudgets(self.state, self.live).tracker()
            broken = tracker.try_admit(self.live)
            if broken:
                problems = dict.fromkeys((p.metadata.name for p in self.live), "; ".join(broken))
        if problems:
            self.refuse(problems)

    def _admit_each(self, problems: dict[str, str]) -> None:
        """A partial request: each live pod goes unless it has a problem of its own or the
        budgets, charged with the pods before it, no longer allow it."""
        tracker = LiveBudgets(self.state, self.live).tracker()
        admitted: list[pb.Pod] = []
        for pod in self.live:
            name = pod.metadata.name
            why = problems.get(name) or "; ".join(tracker.try_admit([pod]))
            if why:
                self._result(name, REFUSED, why)
            else:
                admitted.append(pod)
        self.live = admitted

    def refuse(self, problems: dict[str, str]) -> None:
        """Nothing is evicted: each live pod says why (its own problem, else the others')."""
        self.refused = True
        summary = "; ".join(f"{name}: {why}" for name, why in problems.items())
        for pod in self.live:
            name = pod.metadata.name
            own = problems.get(name)
            self._result(name, REFUSED, own if own is not None else f"not alone: {summary}")
        self.live = []

    def ops(self) -> tuple[list[Op], list[str]]:
        """The commit: each live pod released as evicted, with its replacement (and the
        reservation keeping its room, if its job asks). Per op, the evicted pod it serves."""
        builder = EvictionOps(
            self.state.jobs.get,
            self.state.names_of_job,
            always_replace=True,
            node_ready=self._node_ready,
            reservation_exists=self._reservation_exists,
        )
        for pod in self.live:
            builder.add(
                Eviction(pod, self.request.reason, self.request.message or self._message()),
                self.now_ms,
            )
        self.kept = builder.kept
        return builder.ops, builder.targets

    def _reservation_exists(self, name: str) -> bool:
        return name in self.state.reservations.by_name or name in self.state.pending_reservations

    def _node_ready(self, name: str) -> bool:
        node = self.state.nodes.get(name)
        return node is not None and node.status.ready

    def _message(self) -> str:
        by = self.request.requester or "a client"
        movement = f" (movement {self.request.movement})" if self.request.movement else ""
        return f"evicted by {by}{movement}"

    def evicted(self, replacements: dict[str, str]) -> None:
        """The commit applied: the live pods are evicted."""
        for pod in self.live:
            name = pod.metadata.name
            result = self._result(name, EVICTED, "")
            result.replacement = replacements.get(name, "")

    def response(self) -> ipb.EvictResponse:
        return ipb.EvictResponse(
            results=[
                self.results[ref.name] for ref in self.request.pods if ref.name in self.results
            ]
        )

    def _result(
        self, pod: str, outcome: ipb.EvictResult.Outcome.ValueType, reason: str
    ) -> ipb.EvictResult:
        result = ipb.EvictResult(pod=pod, outcome=outcome, reason=reason)
        self.results[pod] = result
        return result
