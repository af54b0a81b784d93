"""Get and List: read-your-writes. Get reads the store; List serves the dispatcher's informer
cache once it has reached the store's revision at the time of the request, else the store, in
pages sorted by name whose continue tokens name a kept snapshot (``listing.py``). A Node's
heartbeat comes from the store's heartbeat hash, a pending preemptor's nominated node from the
dispatcher's memory, a one-pod job's status from its pod, a job being deleted as Deleting."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError, Message

from placement import labelselector
from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services import tenancy
from services.dispatcher.api import listing
from services.dispatcher.api.rpc import abort, refuse_if
from services.dispatcher.controllers.jobphase import derives_status
from services.dispatcher.controllers.podindex import PodIndex
from services.dispatcher.dispatching.dispatch import UnitDispatcher
from services.dispatcher.dispatching.entries import is_pending
from services.dispatcher.objects import being_deleted, metadata_of, pods_complete
from services.runtime.auth import caller
from store import InvalidObjectError, NotFoundError, Store, StoreUnavailableError
from store import kinds as kinds_mod
from store.encoded import EncodedList
from store.informer import ENCODED_KINDS
from store.kinds import wrap
from store.pulse import last_beat_ms

log = structlog.get_logger(__name__)

DEFAULT_PAGE = 500
# How long a List waits for the dispatcher's view to reach the store's revision before it reads
# the store instead.
LIST_CATCH_UP_SECONDS = 2.0
MAX_PAGE = 5000


class ReadRpc:
    def __init__(
        self,
        store: Store,
        core: UnitDispatcher,
        pods: PodIndex,
        snapshots: listing.ListingSnapshots,
        statuses_counted: asyncio.Event | None = None,
    ) -> None:
        self.store = store
        self.core = core
        self.pods = pods
        self.snapshots = snapshots
        # Set once the job status controller's first tick has counted every job
        # (``JobStatusController.counted``): a restarted dispatcher serves before it, and a
        # job's stored status is the previous dispatcher's until then, so a Job is read after.
        self.statuses_counted = statuses_counted

    async def _statuses_current(self, kind: str) -> None:
        if kind == "Job" and self.statuses_counted is not None:
            await self.statuses_counted.wait()

    async def Get(self, request: api_pb2.GetRequest, context: Any) -> api_pb2.Object:
        try:
            kind = kinds_mod.kind_named(request.kind)
            await self._statuses_current(kind.name)
            obj = await self.store.get(kind.message, request.name)
            if isinstance(obj, pb.Node):
                await self.live_heartbeats([obj])
            elif isinstance(obj, pb.SchedulerInstance):
                await self.live_shard_heartbeats([obj])
            elif isinstance(obj, pb.Pod):
                self.show_nominations([obj])
            elif isinstance(obj, pb.Job):
                obj = self.pods.job_as_read(obj)
        except InvalidObjectError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except NotFoundError as exc:
            await abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except StoreUnavailableError as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        await refuse_if(context, tenancy.read_refusal(caller(), kind.name, obj))
        return wrap(kind.name, obj)

    async def List(self, request: api_pb2.ListRequest, context: Any) -> api_pb2.ListResponse:
        try:
            kind = kinds_mod.kind_named(request.kind)
        except InvalidObjectError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if request.job and kind.name != "Pod":
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "job: only Pods have a job")
        if not 0 <= request.limit <= MAX_PAGE:
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"limit: must be within 0..{MAX_PAGE}"
            )
        snapshot_id, after = "", ""
        if request.continue_token:
            try:
                snapshot_id, after = listing.decode_token(request.continue_token)
            except listing.MalformedTokenError as exc:
                await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        selects = await request_selector(request, context)
        identity = caller()
        limit = request.limit or DEFAULT_PAGE
        # What a snapshot was made for: another request may not page through it.
        key = (
            kind.name,
            request.selector,
            tuple(sorted(request.label_selector.items())),
            request.job,
            identity,
        )
        await self._statuses_current(kind.name)
        kept = self.snapshots.window(snapshot_id, key, after, limit + 1) if snapshot_id else None
        if kept is not None:
            window, revision = kept
        else:
            try:
                if kind.name == "Pod":
                    items, revision = await self._pod_listing(request.job)
                else:
                    items, revision = await self._listing(kind.name, kind.message)
            except StoreUnavailableError as exc:
                await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
            matches = (
                o
                for o in items
                if (meta := metadata_of(o)).name > after
                and selects(meta.labels)
                and (not request.job or (isinstance(o, pb.Pod) and o.spec.job == request.job))
                and tenancy.owns(identity, kind.name, o)
            )
            picked: Sequence[Message]
            if kind.name in ENCODED_KINDS:  # kept encoded: a million decoded pods are 2.6 GiB
                picked = EncodedList(kind.message, matches)
            else:
                picked = sorted(matches, key=lambda o: metadata_of(o).name)
            window = picked[: limit + 1]
            snapshot_id = self.snapshots.keep(key, picked, revision) if len(picked) > limit else ""
        page = [wrap(kind.name, o) for o in window[:limit]]  # copies: the cache stays untouched
        await self._as_read(kind.name, page, context)
        token = ""
        if len(window) > limit:
            last = metadata_of(window[limit - 1]).name
            token = listing.encode_token(snapshot_id, last)
        elif snapshot_id:
            self.snapshots.drop(snapshot_id)  # the last page
        return api_pb2.ListResponse(items=page, resource_version=revision, continue_token=token)

    async def _as_read(self, kind: str, page: list[api_pb2.Object], context: Any) -> None:
        """A page's objects as readers see them: pods with their nominated node, one-pod jobs
        with their derived status, jobs being deleted as Deleting, nodes and scheduler shards
        with their last heartbeat."""
        if kind == "Pod":
            self.show_nominations([o.pod for o in page])
        if kind == "Job":
            for o in page:
                if derives_status(o.job) or being_deleted(o.job) or not pods_complete(o.job):
                    o.job.status.CopyFrom(self.pods.job_as_read(o.job).status)
        if kind == "Node":
            try:
                await self.live_heartbeats([o.node for o in page])
            except StoreUnavailableError as exc:
                await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        if kind == "SchedulerInstance":
            try:
                await self.live_shard_heartbeats([o.scheduler_instance for o in page])
            except StoreUnavailableError as exc:
                await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))

    async def _listing(self, kind: str, message: type[Message]) -> tuple[Iterable[Message], int]:
        """Every object of a kind, at least as new as the store's current revision (so a List
        sees the caller's own writes). Kinds the dispatcher watches come from its informer
        cache, once it has caught up with that revision, instead of decoding the whole kind
        from the store for each page; the store is the fallback when the view lags."""
        informer = self.core.informer
        if kind in informer.kinds:
            revision = await self.store.revision()
            try:
                await informer.wait_for_revision(revision, LIST_CATCH_UP_SECONDS)
            except TimeoutError:
                pass
            else:
                # Read lazily: pods are decoded one at a time as the caller filters them.
                return informer.cache[kind].values(), informer.revision
        return await self.store.list_all(message)

    async def _pod_listing(self, job: str) -> tuple[Iterable[Message], int]:
        """Pods from the store: the dispatcher's view keeps the bytes of pending pods only (a
        pod on a node is a record: ``controllers/podindex.py``). One job's pods by name, as the
        view knows them once it has reached the store's revision (one read of a few); every
        pod from one listing, each decoded as the caller filters it (a million decoded at once
        were 2.6 GiB)."""
        revision = await self.store.revision()
        if job:
            try:
                await self.core.informer.wait_for_revision(revision, LIST_CATCH_UP_SECONDS)
            except TimeoutError:
                pass
            else:
                names = sorted(self.pods.by_job.get(job))
                found = await self.store.get_many(pb.Pod, names)
                return [pod for pod in found if pod is not None], revision
        listing = await self.store.list_stored(["Pod"])
        return _decoded_pods(listing.encoded("Pod")), listing.revision

    async def live_heartbeats(self, nodes: list[pb.Node]) -> None:
        """Serve each node's last heartbeat from the store's heartbeat hash: the stored Node
        keeps its registration time, since heartbeats stay out of the change feed."""
        if not nodes:
            return
        beats = (await self.store.heartbeats()).last_ms
        for node in nodes:
            node.status.heartbeat_ms = beats.get(node.metadata.name, node.status.heartbeat_ms)
        await self.live_loads(nodes)

    async def live_loads(self, nodes: list[pb.Node]) -> None:
        """Serve each node's measured load from the store's load hash, where node agents report
        it outside the change feed (one round trip; a node without a report shows none)."""
        loads = await self.store.node_loads([node.metadata.name for node in nodes])
        for node in nodes:
            load = loads.get(node.metadata.name)
            if load is None:
                node.status.ClearField("load")
            else:
                node.status.load.CopyFrom(load)

    async def live_shard_heartbeats(self, shards: list[pb.SchedulerInstance]) -> None:
        """Serve each shard's last liveness stamp (``store.pulse``) as its heartbeat: the stored
        record keeps its registration time, since the stamps stay out of the change feed."""
        if not shards:
            return
        beats = await self.store.shard_heartbeats()
        for shard in shards:
            name = shard.metadata.name
            shard.status.heartbeat_ms = last_beat_ms(beats, name, shard.status.heartbeat_ms)

    def show_nominations(self, pods: list[pb.Pod]) -> None:
        """Fill ``status.nominated_node`` of pending preemptors from the dispatcher's memory
        (see services/dispatcher/dispatching/nominations.py): the stored pod never carries it."""
        if not len(self.core.nominations):
            return
        for pod in pods:
            if is_pending(pod):
                nomination = self.core.nominations.of(pod.spec.job, pod.metadata.name)
                if nomination is not None:
                    pod.status.nominated_node = nomination.node


def _decoded_pods(encoded: Iterable[tuple[str, bytes]]) -> Iterator[pb.Pod]:
    for name, data in encoded:
        try:
            yield pb.Pod.FromString(data)
        except DecodeError as exc:
            log.error("undecodable pod in the store; not listed", name=name, error=str(exc))


async def request_selector(
    request: api_pb2.ListRequest | api_pb2.WatchRequest, context: Any
) -> Callable[[Mapping[str, str]], bool]:
    """Whether labels match a request's selectors: the equality map and the selector text (an
    unparsable text is INVALID_ARGUMENT, never ignored)."""
    try:
        parsed = labelselector.parse(request.selector)
    except labelselector.SelectorSyntaxError as exc:
        await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"selector: {exc}")
    equal = dict(request.label_selector)

    def selects(labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == val for k, val in equal.items()) and labelselector.matches(
            parsed, labels
        )

    return selects
