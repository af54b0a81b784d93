"""``PodIndex``: the dispatcher's pods by job, and its record of each pod on a node.

The dispatcher's informer keeps the bytes of pods without a node only (pending pods: the dispatch
core sends them). A pod on a node is kept as a record, not as its bytes: its claim in the quota
ledger while it holds one (``dispatching.entries.Claim``: bound or running), else a ``Placed``
here (finished, mostly). Readers that count (job status, a one-pod job as read) read records;
readers that write a pod back or show it whole (node lifecycle, job retry, budgets, drain, a
List of pods) read it from the store. At 100,000 bound pods on 2,000 nodes this took the
dispatcher from 718 to ~330 bytes a bound pod (bench/README.md, issue 34)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, KeysView, Mapping
from operator import itemgetter
from typing import NamedTuple, Protocol

from google.protobuf.message import Message

from placement.claims import CLAIM_PHASES, TERMINAL_PHASES, holds_claim
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.jobphase import (
    JobCounts,
    StatusTally,
    as_creating,
    as_deleting,
    as_read,
    derives_status,
)
from services.dispatcher.dispatching.entries import Claim, shared_int
from services.dispatcher.dispatching.feed import ViewFeed
from services.dispatcher.objects import being_deleted, pods_complete
from services.grouped import GroupedNames
from store.client import Store
from store.informer import Handlers, Informer
from store.kinds import StoredObject

# Pods of one job read (decoded from the informer's cache) and counted at a time by
# :meth:`PodIndex.status_of`, which hands the loop to others once STATUS_SLICE_SECONDS have
# passed since it last did (2,000 pods at a time took up to 60 ms on a busy machine). Short:
# a request on a new connection needs a dozen turns of the loop (its handshake, then its
# call), each waiting for a slice to end; with 20 ms slices a health check during the first
# job status tick after a restart over 1,000,000 pods took 0.5-0.9 s, with 5 ms ~0.2 s.
STATUS_SLICE_PODS = 250
STATUS_SLICE_SECONDS = 0.005


class LoopTurns:
    """Hands the event loop to others once ``STATUS_SLICE_SECONDS`` have passed since it last
    did: one budget for a run of counting, shared by the jobs of a tick (a slice per job alone
    never handed it over for jobs quicker than a slice: the job status controller's first tick
    after a restart over 1,000 jobs of 1,000 pods held the loop for 0.8 s, health checks
    included)."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until = time.monotonic() + STATUS_SLICE_SECONDS

    async def take(self) -> None:
        """A turn for the others if this run's slice is spent."""
        if time.monotonic() >= self._until:
            await asyncio.sleep(0)
            self._until = time.monotonic() + STATUS_SLICE_SECONDS


# A claim's owner, read by C (``PodIndex.live_on_nodes_by_owner``).
_CLAIM_OWNER = itemgetter(Claim._fields.index("owner"))


def keeps_bytes(kind: str, obj: StoredObject) -> bool:
    """What the dispatcher's informer keeps (its ``hold``): every object but a pod on a node,
    which the pod index and the quota ledger keep a record of instead."""
    return not (type(obj) is pb.Pod and obj.spec.node_name)


class ClaimBook(Protocol):
    """The quota ledger's claims, as the pod index reads them (``dispatching.unitqueue``)."""

    def claim_of(self, pod: str) -> Claim | None: ...

    def claimed_pods(self) -> KeysView[str]: ...

    def claims_by_pod(self) -> Mapping[str, Claim]: ...

    def claims_on(self, nodes: Collection[str]) -> list[Claim]: ...

    def claims(self) -> list[Claim]: ...

    def nodes_with_claims(self) -> KeysView[str]: ...


class Placed(NamedTuple):
    """A pod on a node holding no claim (finished, mostly), as the pod index keeps it: what a
    job's status and the handlers read of it."""

    job: str
    pod_index: int
    node: str
    phase: pb.PodPhase.ValueType
    reason: str
    finished_ms: int
    owner: str
    started_ms: int

    @classmethod
    def of(cls, pod: pb.Pod) -> Placed:
        spec, status = pod.spec, pod.status
        return cls(
            sys.intern(spec.job),
            shared_int(spec.index),
            sys.intern(spec.node_name),
            status.phase,
            sys.intern(status.reason),
            status.finished_ms,
            sys.intern(pod.metadata.owner),
            status.started_ms,
        )

    def outline(self, name: str) -> pb.Pod:
        """The pod as far as this record knows it (never to be written back)."""
        pod = pb.Pod()
        pod.metadata.name = name
        pod.metadata.owner = self.owner
        spec = pod.spec
        spec.job = self.job
        spec.index = self.pod_index
        spec.node_name = self.node
        status = pod.status
        status.phase = self.phase
        status.reason = self.reason
        status.finished_ms = self.finished_ms
        status.started_ms = self.started_ms
        return pod


class _PlacedNames(Collection[str]):
    """The names of the pods kept as records (the informer's ``held_elsewhere``)."""

    __slots__ = ("_claimed", "_placed")

    def __init__(self, claimed: Collection[str], placed: Collection[str]) -> None:
        self._claimed = claimed
        self._placed = placed

    def __contains__(self, name: object) -> bool:
        return name in self._claimed or name in self._placed

    def __iter__(self) -> Iterator[str]:
        yield from self._claimed
        yield from self._placed

    def __len__(self) -> int:
        return len(self._claimed) + len(self._placed)


class PodIndex:
    """The names of pods by job, and a record of each pod on a node (see the module), kept from
    informer events. One index serves every controller of the dispatcher (each pod event is
    indexed once, not once per controller); a controller that acts on changed jobs takes its
    own feed of their names (:meth:`subscribe`).

    ``claims``: the quota ledger's, which keeps the record of each pod holding a claim (none:
    this index keeps a record of every pod on a node itself). ``store``: where the full body
    of a pod on a node is read (:meth:`fetch`), when the informer keeps none of it.
    ``listed_from``: the feed that makes those claims of a listing's pods, handing this index
    the listed pods on a node that hold none (``ViewFeed.listed_without_claim``)."""

    def __init__(
        self,
        informer: Informer,
        claims: ClaimBook | None = None,
        store: Store | None = None,
        listed_from: ViewFeed | None = None,
    ) -> None:
        self.by_job = GroupedNames()
        self._informer = informer
        self._claims = claims
        self._store = store
        # Each pod on a node that holds no claim in ``claims`` (every pod on a node without
        # ``claims``), by name.
        self._placed: dict[str, Placed] = {}
        # Their names, as the informer asks for them on every pod event it has no bytes of
        # (``placed_names``): one collection over two live views, made once.
        claimed = claims.claimed_pods() if claims is not None else ()
        self._placed_names = _PlacedNames(claimed, self._placed.keys())
        # Per node, the pods of ``_placed`` holding a claim there (without ``claims`` only).
        self._claims_on_node: dict[str, int] = {}
        # Each subscriber's feed, what it ignores of a job's own updates, and whether it takes
        # only jobs whose status is stored (subscribe).
        self._feeds: list[tuple[set[str], Callable[[pb.Job], bool] | None, bool]] = []
        # The same feeds by what they take, for a pod's change (every pod event comes here).
        self._every_job_feeds: list[set[str]] = []
        self._stored_only_feeds: list[set[str]] = []
        # The jobs whose status is stored, not derived (``derives_status``): jobs of more than
        # one pod, so few beside a stream of one-pod jobs.
        self._stored_status: set[str] = set()
        handlers = Handlers(
            on_add=self._on_add,
            on_update=self._on_update,
            on_delete=self._on_delete,
            kinds=frozenset({"Pod", "Job"}),
            on_listed=self._on_listed,
            on_listed_refused=self._on_listed_placed,
        )
        if listed_from is not None:
            handlers.refused_at_listing = False  # handed by the feed, those without a claim
            listed_from.listed_without_claim.append(self._on_add)
        informer.add_handlers(handlers)

    # -----------------------------------------------------------------------------------------
    # What the informer asks of the records (``Informer(hold=keeps_bytes, ...)``)
    # -----------------------------------------------------------------------------------------

    def placed_names(self, kind: str) -> Collection[str]:
        """The pods kept as records, not by the informer (``held_elsewhere``)."""
        return self._placed_names if kind == "Pod" else ()

    def recall(self, kind: str, name: str) -> StoredObject:
        """A pod kept as a record, as its outline (``recall``): what handlers read of a pod
        before its change."""
        claim = self._claims.claim_of(name) if self._claims is not None else None
        if claim is not None:
            return claim.outline()
        placed = self._placed.get(name)
        if placed is not None:
            return placed.outline(name)
        pod = pb.Pod()
        pod.metadata.name = name
        return pod

    # -----------------------------------------------------------------------------------------
    # Reads
    # -----------------------------------------------------------------------------------------

    def outlines_of(self, job: str) -> list[pb.Pod]:
        """The job's pods as the view has them: a pending pod whole, a pod on a node as its
        record's outline (name, owner, job, index, node, phase, reason, start, finish; see
        ``recall``). Enough to count (``job_status``, ``as_read``); never to be written back:
        :meth:`fetch` reads pods whole."""
        return self._outlines(self.by_job.get(job))

    def names_on(self, nodes: Collection[str]) -> list[str]:
        """The pods holding a claim on ``nodes`` (a scan of the claims: no names are kept per
        node)."""
        if self._claims is not None:
            names = [claim.name for claim in self._claims.claims_on(nodes)]
        else:
            names = []
        names += [n for n, p in self._placed.items() if p.node in nodes and p.phase in CLAIM_PHASES]
        return names

    # What a holder of ``Handlers(refused_at_listing=False)`` reads of the pods kept as records
    # (on a node) once a listing is handed over: counted, not handed pod by pod (two readers
    # of a million claims, a Python step each, were 0.3 s of a restart).

    def live_on_nodes_by_owner(self) -> Counter[str]:
        """How many pods kept as records are live (not Succeeded or Failed), per owner
        (``metadata.owner``; "" for the admin's): every claim (bound or running), counted in
        C, and the other records that are."""
        counts: Counter[str] = Counter()
        if self._claims is not None:
            counts.update(map(_CLAIM_OWNER, self._claims.claims_by_pod().values()))
        counts.update(r.owner for r in self._placed.values() if r.phase not in TERMINAL_PHASES)
        return counts

    def jobs_failed_on_nodes(self) -> set[str]:
        """The jobs of the pods kept as records that failed on a node (a claim never has)."""
        return {r.job for r in self._placed.values() if r.phase == pb.POD_FAILED and r.job}

    def nodes_with_claims(self) -> Collection[str]:
        """The nodes some pod holds a claim on."""
        if self._claims is not None:
            return self._claims.nodes_with_claims()
        return self._claims_on_node.keys()

    async def fetch(self, names: Iterable[str]) -> list[pb.Pod]:
        """The pods named, whole, as the store has them now (one read; a pod gone is left
        out): what a writer of a pod on a node reads, the view keeping only its record."""
        wanted = list(names)
        if not wanted:
            return []
        if self._store is None:
            return self._read(wanted)
        return [pod for pod in await self._store.get_many(pb.Pod, wanted) if pod is not None]

    async def fetch_of(self, job: str) -> list[pb.Pod]:
        """The job's pods, whole (:meth:`fetch`)."""
        return await self.fetch(self.by_job.get(job))

    async def status_of(
        self, job: pb.Job, now_ms: int | None = None, turns: LoopTurns | None = None
    ) -> JobCounts:
        """``job_status`` of ``job`` from its pods in the view (at ``now_ms``), read and
        counted a slice at a time with the loop served between (a big job's pods change
        meanwhile: each change brings the job back to whoever computes its status).
        ``turns``: the budget of a run of jobs this one belongs to (else its own)."""
        names = list(self.by_job.get(job.metadata.name))
        tally = StatusTally(job)
        turns = LoopTurns() if turns is None else turns
        for first in range(0, len(names), STATUS_SLICE_PODS):
            await turns.take()
            self._count(tally, names[first : first + STATUS_SLICE_PODS])
        return tally.counts(now_ms)

    def _count(self, tally: StatusTally, names: Iterable[str]) -> None:
        """Count the pods named into ``tally``: from their records (no outline made), a
        pending pod from the informer."""
        cached = self._informer.cache["Pod"]
        claim_of = self._claims.claims_by_pod().get if self._claims is not None else None
        placed = self._placed
        count = tally.count
        holding: list[Claim] = []
        for name in names:
            claim = claim_of(name) if claim_of is not None else None
            if claim is not None:
                holding.append(claim)
            elif (record := placed.get(name)) is not None:
                count(name, record.job, record.pod_index, record.phase, record.reason)
            elif isinstance(pod := cached.get(name), pb.Pod):
                tally.add((pod,))
        tally.count_holding(holding)

    def job_as_read(self, job: pb.Job, newer: pb.Pod | None = None) -> pb.Job:
        """``job`` with its status as readers see it, from the pods in the view: Deleting with
        the pods it has left once marked for deletion (:func:`as_deleting`), with the pods
        stored so far while its pods are being created (:func:`as_creating`), else derived from
        its pod for a one-pod job (:func:`as_read`; ``newer``, a pod of the job fresher than the
        view's copy, counts instead); else ``job`` itself."""
        if being_deleted(job):
            return as_deleting(job, self.by_job.count(job.metadata.name))
        if not pods_complete(job):
            return as_creating(job)
        if not derives_status(job):
            return job
        pods = self.outlines_of(job.metadata.name)
        if newer is not None:
            name = newer.metadata.name
            pods = [p for p in pods if p.metadata.name != name] + [newer]
        return as_read(job, pods)

    def _outlines(self, names: Iterable[str]) -> list[pb.Pod]:
        cached = self._informer.cache["Pod"]
        claim_of = self._claims.claim_of if self._claims is not None else None
        placed = self._placed
        out: list[pb.Pod] = []
        for name in names:
            pod = cached.get(name)
            if isinstance(pod, pb.Pod):
                out.append(pod)
                continue
            claim = claim_of(name) if claim_of is not None else None
            if claim is not None:
                out.append(claim.outline())
            elif (record := placed.get(name)) is not None:
                out.append(record.outline(name))
        return out

    def _read(self, names: Iterable[str]) -> list[pb.Pod]:
        cached = self._informer.cache["Pod"]
        return [pod for n in names if isinstance(pod := cached.get(n), pb.Pod)]

    def subscribe(
        self, *, ignore: Callable[[pb.Job], bool] | None = None, stored_status_only: bool = False
    ) -> set[str]:
        """A set that collects the names of jobs whose pods (or themselves) changed from now
        on, starting with every job known; its owner takes names out as it handles them.
        ``ignore(job)`` keeps an update of the job itself out of this feed (its owner's own
        write coming back through the watch). ``stored_status_only``: only jobs whose status
        is stored (a one-pod job's is derived when read, and its pod's every change brought it
        to a controller that read the job only to leave it alone). A pod seen before its job
        is no loss: the job's own arrival brings it, and its status counts every pod then."""
        feed = set(self._informer.names("Job"))
        feed |= self.by_job.keys()
        self._feeds.append((feed, ignore, stored_status_only))
        (self._stored_only_feeds if stored_status_only else self._every_job_feeds).append(feed)
        return feed

    def _changed(self, job: str) -> None:
        for feed in self._every_job_feeds:
            feed.add(job)
        if job in self._stored_status:
            for feed in self._stored_only_feeds:
                feed.add(job)

    def _job_changed(self, job: pb.Job) -> None:
        name = job.metadata.name
        stored = name in self._stored_status
        for feed, ignore, stored_only in self._feeds:
            if (stored or not stored_only) and (ignore is None or not ignore(job)):
                feed.add(name)

    def _job_seen(self, job: pb.Job) -> None:
        if derives_status(job):
            self._stored_status.discard(job.metadata.name)
        else:
            self._stored_status.add(job.metadata.name)

    def _on_add(self, kind: str, obj: Message) -> None:
        if type(obj) is pb.Pod:
            self._put(obj)
        elif isinstance(obj, pb.Job):
            self._job_seen(obj)
            self._changed(obj.metadata.name)

    def _on_update(self, kind: str, old: Message, obj: Message) -> None:
        if isinstance(old, pb.Pod) and isinstance(obj, pb.Pod):
            job = obj.spec.job
            if old.spec.job != job:
                self._drop(old)
                self._put(obj)
                return
            # Its job's group holds it already (every update of a pod but a rare rewrite).
            old_node, node = old.spec.node_name, obj.spec.node_name
            if old_node and old_node == node and self._claims is not None:
                # On the same node before and after: a record of its own only if it holds no
                # claim (the ledger's claim is its record, and stays one while it holds it:
                # bound -> running, most updates of a pod on a node).
                name = obj.metadata.name
                if (
                    self._claims.claim_of(name) is None
                    or not holds_claim(obj)
                    or name in self._placed
                ):
                    self._unplace(old)
                    self._place(obj, name)
            elif old_node or node:
                if old_node:
                    self._unplace(old)  # a pending pod has no record to drop
                name = obj.metadata.name
                kept = self._place(obj, name)
                if job and kept is not name and not old_node:
                    # Just bound: its group takes the claim's string (one string per pod).
                    self.by_job.discard(job, name)
                    self.by_job.add(job, kept)
            if job:
                self._changed(job)
        elif isinstance(obj, pb.Job):
            self._job_seen(obj)
            self._job_changed(obj)

    def _on_delete(self, kind: str, obj: Message) -> None:
        if isinstance(obj, pb.Pod):
            self._drop(obj)
        elif isinstance(obj, pb.Job):
            self._stored_status.discard(obj.metadata.name)
            for feed, _, _ in self._feeds:
                feed.discard(obj.metadata.name)

    def _put(self, pod: pb.Pod) -> None:
        # Each field read once: every pod listed at a (re)start comes through here.
        spec = pod.spec
        if spec.node_name:
            if (
                self._claims is not None
                and self._informer.delivering_listing
                and pod.status.phase in CLAIM_PHASES
            ):
                return  # its claim is grouped with its job's once all are listed (_on_listed)
            name = self._place(pod, pod.metadata.name)
        else:
            name = pod.metadata.name
        job = spec.job
        if job:
            self.by_job.add(job, name)
            self._changed(job)

    def _on_listed_placed(self, kind: str, obj: Message) -> None:
        """A listed pod the informer keeps no bytes of (on a node): ``_put``, but one holding a
        claim is grouped with its job's once all are listed (``_on_listed``), so only the
        phase is read of most (a listing's bound and running pods)."""
        if type(obj) is pb.Pod and (self._claims is None or obj.status.phase not in CLAIM_PHASES):
            self._put(obj)

    def _on_listed(self, kind: str) -> None:
        """The listing's pods holding a claim, grouped by job from the claims the quota ledger
        made of them: a pass over the claims instead of a handler's work per listed pod (a
        fifth of a restart's CPU)."""
        if kind != "Pod" or self._claims is None:
            return
        names: dict[str, list[str]] = {}
        for claim in self._claims.claims():
            job = claim.job
            if job:
                of_job = names.get(job)
                if of_job is None:
                    names[job] = [claim.name]
                else:
                    of_job.append(claim.name)
        for job, of_job in names.items():
            self.by_job.add_all(job, of_job)
            self._changed(job)

    def _drop(self, pod: pb.Pod) -> None:
        name = pod.metadata.name
        self._unplace(pod)
        self.by_job.discard(pod.spec.job, name)
        if pod.spec.job:
            self._changed(pod.spec.job)

    def _place(self, pod: pb.Pod, name: str) -> str:
        """Keep the record of a pod on a node, unless the ledger's claim is it; returns its
        name as the record keeps it (one string for the claim, its record and its job's
        group)."""
        spec = pod.spec
        node = spec.node_name
        if not node:
            return name
        claimed = holds_claim(pod)
        if claimed and self._claims is not None:
            claim = self._claims.claim_of(name)
            return claim.name if claim is not None else name
        self._placed[name] = Placed.of(pod)
        if claimed:
            self._claims_on_node[node] = self._claims_on_node.get(node, 0) + 1
        return name

    def _unplace(self, pod: pb.Pod) -> None:
        record = self._placed.pop(pod.metadata.name, None)
        if record is not None and record.phase in CLAIM_PHASES:
            left = self._claims_on_node[record.node] - 1
            if left:
                self._claims_on_node[record.node] = left
            else:
                del self._claims_on_node[record.node]
