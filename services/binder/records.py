"""What a Binder commit leaves behind besides the store's write, for both of its write paths
(a decision batch's binds and evictions, an Evict request's evictions): each written pod
accounted in the binder's state until the informer shows it, events, a Movement's landings."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import structlog

from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services import events, movements
from services.binder.decide import BOUND, NOT_LEADER, STALE
from services.binder.leadership import Spawn
from services.binder.state import ClusterState
from services.eviction import EVICTION_REASONS, KEPT_FROM_ANNOTATION
from store.client import Create, Op, Release, Store
from store.errors import StoreError
from store.informer import Informer

log = structlog.get_logger(__name__)


class CommitRecords:
    """The records of committed writes; each method runs right after a successful commit."""

    def __init__(
        self,
        store: Store,
        informer: Informer,
        state: ClusterState,
        recorder: events.EventRecorder,
        spawn: Spawn,
    ) -> None:
        self.store = store
        self.informer = informer
        self.state = state
        self.events = recorder
        self.spawn = spawn

    def written(self, ops: Sequence[Op]) -> list[tuple[int, pb.Pod]]:
        """Account each pod a committed batch of ``ops`` wrote (bound, evicted or created) in the
        binder's state, unless the informer already shows that write; returns (the index of its
        op, the pod) for each, in op order."""
        written_pods: list[tuple[int, pb.Pod]] = []
        for i, op in enumerate(ops):
            written = op.obj if isinstance(op, Create) else getattr(op, "pod", None)
            if not isinstance(written, pb.Pod):
                continue
            self.state.record_written(written, self.informer.revision)
            written_pods.append((i, written))
        return written_pods

    def evictions(self, ops: Iterable[Op]) -> None:
        """An event per pod a commit evicted (a preemption's victims, a rescheduling's or a
        drain's pods): its reason and message, the preemptor or the node it left."""
        for op in ops:
            if not isinstance(op, Release) or op.pod.status.reason not in EVICTION_REASONS:
                continue
            pod = op.pod
            related = (
                events.ref("Pod", name=pod.status.preempted_by)
                if pod.status.preempted_by
                else events.ref("Node", name=pod.spec.node_name)
            )
            self.events.record(
                events.ref("Pod", pod),
                pod.status.reason,
                pod.status.message,
                type_=events.WARNING,
                related=related,
                owner=pod.metadata.owner,
            )

    def kept(self, reservations: Iterable[pb.Reservation]) -> None:
        """After an eviction commit that kept evicted pods' room (their jobs'
        ``spec.reservation``): each reservation's hold in the binder's state at once (no batch
        decided before the informer brings it may take the room), and an event each."""
        for rsv in reservations:
            self.state.on_add("Reservation", rsv)
            self.events.record(
                events.ref("Reservation", rsv),
                events.RESERVATION_HELD,
                f"keeping the room of pod {rsv.metadata.annotations[KEPT_FROM_ANNOTATION]!r} "
                f"on {rsv.status.node} for its replacement for {rsv.spec.ttl_seconds}s",
                related=events.ref("Node", name=rsv.status.node),
                owner=rsv.metadata.owner,
            )

    def consumptions(self, consumed: dict[str, str]) -> None:
        """After a commit that consumed reservations (reservation -> the pod that took it): an
        event each, and their holds off the binder's state at once (the informer's delete
        comes later, and back-to-back batches must not count the room twice)."""
        for reservation, pod in consumed.items():
            held = self.state.reservations.by_name.get(reservation)
            node = held.status.node if held is not None else "its node"
            self.events.record(
                events.ref("Reservation", held, name=reservation),
                events.RESERVATION_CONSUMED,
                f"pod {pod!r} bound on {node} took the reserved room",
                related=events.ref("Pod", name=pod),
                owner=held.metadata.owner if held is not None else "",
            )
        self.state.consumed(consumed)

    def rejections(self, verdicts: Iterable[ipb.PodVerdict]) -> None:
        """An event per pod the Binder refused to bind, with why (``verdicts``: a batch's, or
        those of them other than BOUND). A leadership change, or a pod that changed or went
        since the decision (STALE), is no news about it: not recorded."""
        for verdict in verdicts:
            if verdict.code in (BOUND, NOT_LEADER, STALE, ipb.VERDICT_UNSPECIFIED):
                continue
            refused = self.informer.get(pb.Pod, verdict.pod)
            self.events.record(
                events.ref("Pod", name=verdict.pod),
                events.BIND_REJECTED,
                f"{ipb.VerdictCode.Name(verdict.code)} on {verdict.node or 'no node'}: "
                f"{verdict.reason}",
                type_=events.WARNING,
                related=events.ref("Node", name=verdict.node) if verdict.node else None,
                owner=refused.metadata.owner if refused is not None else "",
            )

    def landings(self, bound: Iterable[pb.Pod]) -> None:
        """Replacements of a Movement's jobs that bound: recorded on the Movement (actual on a
        recommended node, else mismatched) after the commit, off the committer's path — the
        record informs the rescheduler's failure ratio, it does not gate the bind."""
        landed: dict[str, list[pb.Pod]] = defaultdict(list)
        for pod in bound:
            if pod.status.movement:
                landed[pod.status.movement].append(pod)
        for movement, pods in landed.items():
            self.spawn(self._record_landing(movement, pods), name=f"binder-landing-{movement}")

    async def _record_landing(self, movement: str, pods: list[pb.Pod]) -> None:
        try:
            await movements.change(self.store, movement, movements.record_landing(pods))
        except StoreError as exc:
            log.warning("recording landings failed", movement=movement, error=str(exc))
