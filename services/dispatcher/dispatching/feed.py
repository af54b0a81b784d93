"""The informer's view fed into the dispatch core: pods into the ``UnitQueue`` (and the count of
bound pods per job that a unit carries to its shard), nodes into the queue's room and the node
shapes, queue changes re-keyed, a deleted job revoked, a changed shard record signalled.

Handlers run on the event loop and change the state synchronously, as the rest of the core."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Callable

import structlog
from google.protobuf.message import Message

from placement.claims import CLAIM_PHASES
from placement.room import usable_offer
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.entries import Claim, JobShare
from services.dispatcher.dispatching.shapes import NodeShapes, shapes_of
from services.dispatcher.dispatching.unitqueue import UnitQueue
from services.dispatcher.objects import metadata_of, pods_complete

log = structlog.get_logger(__name__)

_BOUND_PHASES = (pb.POD_BOUND, pb.POD_RUNNING, pb.POD_SUCCEEDED)


class ViewFeed:
    def __init__(
        self,
        queue: UnitQueue,
        kick: asyncio.Event,
        shards_changed: asyncio.Event,
        revoke: Callable[[str], None],
        take_back: Callable[[str], None] | None = None,
        listing_under_way: Callable[[], bool] | None = None,
    ) -> None:
        self.queue = queue
        self._kick = kick  # set: a dispatch round may send something now
        self._shards_changed = shards_changed
        self.revoke = revoke
        # Takes a unit back from the shard holding it, into the queue (a gang timed out).
        self.take_back = take_back
        self.shapes = NodeShapes()
        # Per job: its pods bound, running or succeeded (``Unit.already_bound``). A total, not
        # a record per pod: an update's or deletion's pod as it was (the informer's, or its
        # outline from the records: ``Informer(recall=...)``) says what it counted for.
        self._bound_pods: Counter[str] = Counter()
        # Whether the informer is handing over a listing (``Informer.delivering_listing``);
        # meanwhile what a job's pods share is read once per job (``Claim.of``), and forgotten
        # once it is listed (``on_listed``): a listing's pods come in no order.
        self._listing_under_way = listing_under_way
        self._per_job: dict[str, JobShare] = {}
        # Who takes a listing's objects the informer keeps no bytes of and that hold no claim
        # (``on_listed_refused``; the pod index keeps a record of a finished pod on a node):
        # handed them here, where their phase is read already, rather than by a listing
        # handler of their own reading it again (~0.4 µs a listed bound pod).
        self.listed_without_claim: list[Callable[[str, Message], None]] = []

    def bound_pods(self, job: str) -> int:
        """How many of the job's pods are bound, running or succeeded."""
        return self._bound_pods.get(job, 0)

    def on_add(self, kind: str, obj: Message) -> None:
        if type(obj) is pb.Pod:
            # What _on_change does with a new pod, straight: every pod listed at a (re)start
            # comes through here.
            self._track_pod(obj)
            return
        self._on_change(kind, None, obj)

    def on_listed(self, kind: str) -> None:
        self._per_job.clear()
        self._bound_pods.update(self.queue.sum_listed())  # the listed claims, per job
        if kind == "Node":
            # The listing's nodes, at once: a look at every pending unit per listed node was
            # nodes × units (20,000 nodes).
            self._wake_infeasible()

    def take_listed(self, pod: pb.Pod) -> bool:
        """A pod of a (re)start's listing (the dispatcher's ``Informer(take_listed=)``): one on
        a node holding a claim becomes its claim here and is taken — the informer then reads
        no resource version of it, appends none to its bytes (a copy of every bound pod's) and
        hands it to no handler (none takes a listed pod holding a claim but this feed: the pod
        index and the tenants' counts read the ledger's claims once listed). Any other pod goes
        on to the handlers (False)."""
        spec = pod.spec
        if not (node := spec.node_name):
            return False
        if (phase := (status := pod.status).phase) not in CLAIM_PHASES:
            return False
        # Summed, and counted as its job's bound pods, once listed (``on_listed``).
        self.queue.claim_listed(
            Claim.from_parts(pod, pod.metadata, spec, status, node, phase, self._per_job)
        )
        return True

    def on_listed_refused(self, kind: str, obj: Message) -> None:
        """A listed object the informer keeps no bytes of (``Handlers.on_listed_refused``: a
        pod on a node, the dispatcher's ``hold`` refusing those): what ``on_add`` does with it
        while a listing is under way, its parts read once and handed on (a listing's every
        pod on a node comes through here, but those ``take_listed`` took)."""
        if type(obj) is not pb.Pod:
            self.on_add(kind, obj)
        elif not (node := (spec := obj.spec).node_name):
            self._track_pod(obj)
        elif (phase := (status := obj.status).phase) in CLAIM_PHASES:
            # Summed, and counted as its job's bound pods, once listed (``on_listed``).
            self.queue.claim_listed(
                Claim.from_parts(obj, obj.metadata, spec, status, node, phase, self._per_job)
            )
            return
        elif phase in _BOUND_PHASES:
            self._bound_pods[sys.intern(spec.job)] += 1
        for take in self.listed_without_claim:
            take(kind, obj)

    def on_update(self, kind: str, old: Message, new: Message) -> None:
        self._on_change(kind, old, new)

    def on_delete(self, kind: str, obj: Message) -> None:
        self._on_change(kind, obj, None)

    def _on_change(self, kind: str, old: Message | None, new: Message | None) -> None:
        if kind == "Pod":
            if (
                isinstance(old, pb.Pod)
                and isinstance(new, pb.Pod)
                and _stays_placed(old, new)
                and self.queue.restate_claim(new)
            ):
                # Bound -> running (most pod updates): nothing pending, bound or room changes,
                # only the claim's start. Forget + track would give the same, at twice the cost.
                self.queue.drop_if_empty(old.spec.job)
                return
            if isinstance(old, pb.Pod) and isinstance(new, pb.Pod) and self._just_bound(old, new):
                return
            # An update is forget + track; the unit must not be dropped in between, or a one-pod
            # unit would lose its state (backoff, infeasible) whenever its pod changes, e.g.
            # when a shard records why the pod did not fit.
            released = False
            if old is not None:
                assert isinstance(old, pb.Pod)
                released = self._forget_pod(old)
            if new is not None:
                assert isinstance(new, pb.Pod)
                self._track_pod(new)
                released = released and not self.queue.holds_claim(new.metadata.name)
            if released:
                self._kick.set()  # room freed: a unit held for it may go now
            if old is not None:
                self.queue.drop_if_empty(old.spec.job)
        elif kind == "Job" and new is None and old is not None:
            name = metadata_of(old).name
            self.queue.timed_out.discard(name)
            self.revoke(name)
        elif kind == "Job" and isinstance(new, pb.Job):
            timed_out = new.status.phase == pb.JOB_TIMEOUT
            if timed_out != (new.metadata.name in self.queue.timed_out):
                self._timed_out(new.metadata.name, timed_out)
            if (
                isinstance(old, pb.Job)
                and not pods_complete(old)
                and pods_complete(new)
                and new.metadata.name in self.queue.units
            ):
                self._kick.set()  # its last pods were created: the unit may go now
        elif kind == "Node":
            self._node_changed(old, new)
        elif kind == "Queue":
            queue = new if new is not None else old
            assert isinstance(queue, pb.Queue)
            self.queue.queue_changed(queue.metadata.name)
            self._kick.set()
        elif kind == "SchedulerInstance":
            self._shards_changed.set()

    def _just_bound(self, old: pb.Pod, new: pb.Pod) -> bool:
        """A pending pod bound (the commonest pod update after bound -> running): out of its
        unit and into the ledger as a claim, each field read once; its claim shares what its
        job's pods share with the unit's other pods (``UnitEntry.share``: one read per unit,
        not per pod). False, nothing done, for any other update (forget + track does it)."""
        old_spec, spec = old.spec, new.spec
        node = spec.node_name
        if old_spec.node_name or not node or old.status.phase != pb.POD_PENDING:
            return False
        status = new.status
        phase = status.phase
        job = spec.job
        queue = self.queue
        meta = new.metadata
        name = meta.name
        if (
            phase not in CLAIM_PHASES
            or old_spec.job != job
            or queue.holds_claim(name)
            or (self._listing_under_way is not None and self._listing_under_way())
        ):
            return False
        entry = queue.take_pending(name, job)
        share = entry.share if entry is not None else None
        if share is None:
            share = JobShare.of(new)
            if entry is not None:
                entry.share = share
        claim = Claim.of_share(meta, spec, status, node, phase, share)
        queue.claim(claim)
        self._bound_pods[claim.job] += 1  # its job's string, interned
        queue.drop_if_empty(job)
        return True

    def _timed_out(self, job: str, timed_out: bool) -> None:
        """A gang timed out (its pods are dispatched no more, and taken back from a shard
        holding them) or was restarted (queued again)."""
        at_shard = self.queue.set_timed_out(job, timed_out)
        if at_shard is not None and self.take_back is not None:
            self.take_back(job)
        if not timed_out:
            self._kick.set()

    def _forget_pod(self, pod: pb.Pod) -> bool:
        """Undo ``_track_pod``; True if the pod held a claim."""
        released = self.queue.remove_pod(pod)
        spec = pod.spec
        if spec.node_name and pod.status.phase in _BOUND_PHASES:
            job = spec.job
            left = self._bound_pods.get(job, 0) - 1
            if left > 0:
                self._bound_pods[job] = left
            else:
                self._bound_pods.pop(job, None)
        return released

    def _track_pod(self, pod: pb.Pod) -> None:
        spec = pod.spec
        if spec.node_name:
            # A pod on a node joins no unit: its claim if it holds one (``holds_claim``, its
            # fields read once here: every pod listed at a (re)start comes through here).
            phase = pod.status.phase
            if phase in CLAIM_PHASES:
                if self._listing_under_way is not None and self._listing_under_way():
                    # Summed, and counted as its job's bound pods, once listed (``on_listed``).
                    self.queue.claim_listed(Claim.of(pod, self._per_job))
                else:
                    claim = Claim.of(pod)
                    self.queue.claim(claim)
                    self._bound_pods[claim.job] += 1  # its job's string, interned
            elif phase in _BOUND_PHASES:
                self._bound_pods[sys.intern(spec.job)] += 1  # one string per job
        elif self.queue.add_pod(pod, int(time.time() * 1000)):
            self._kick.set()

    def _node_changed(self, old: Message | None, new: Message | None) -> None:
        if new is None:
            if old is not None:
                name = metadata_of(old).name
                self.shapes.set(name, None)
                self.queue.set_node(name, None)
            return
        assert isinstance(new, pb.Node)
        self.shapes.set(new.metadata.name, shapes_of(new))
        self.queue.set_node(new.metadata.name, usable_offer(new))
        if isinstance(old, pb.Node) and _material(old) == _material(new):
            return
        if old is None and self._listing_under_way is not None and self._listing_under_way():
            return  # woken once the listing's nodes are all in (``on_listed``)
        self._wake_infeasible()

    def _wake_infeasible(self) -> None:
        """A node appeared or changed: units that could never fit may fit now."""
        woke = self.queue.wake_infeasible()
        if woke:
            self._kick.set()
            log.info("cluster changed; infeasible units queued again", units=woke)


def _stays_placed(old: pb.Pod, new: pb.Pod) -> bool:
    """Whether the update leaves the pod holding a claim on the node it held one on, for the
    same job (so it counts as bound for that job before and after, and was never pending)."""
    return (
        old.status.phase in CLAIM_PHASES
        and new.status.phase in CLAIM_PHASES
        and bool(old.spec.node_name)
        and old.spec.node_name == new.spec.node_name
        and old.spec.job == new.spec.job
    )


def _material(node: pb.Node) -> bytes:
    """A node's fields that decide whether pods fit it (not its heartbeat)."""
    copy = pb.Node()
    copy.CopyFrom(node)
    copy.metadata.resource_version = 0
    copy.status.heartbeat_ms = 0
    return copy.SerializeToString(deterministic=True)
