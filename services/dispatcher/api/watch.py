"""Watch: ``from_revision`` 0 sends every current object as ADDED and a BOOKMARK at the listing
revision, then the change feed; a quiet second yields a BOOKMARK. A watcher of Jobs gets a
one-pod job again (MODIFIED, its status derived) whenever its pod changes, so a Job watch reads
the pod feed too; a watch of one job decodes only the changes named like it or its pods."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

import grpc
from google.protobuf.message import Message

from foundation.tls import Identity
from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services import tenancy
from services.dispatcher.api.reads import request_selector
from services.dispatcher.api.rpc import abort
from services.dispatcher.controllers.jobphase import as_creating, as_read, derives_status
from services.dispatcher.controllers.podindex import PodIndex
from services.dispatcher.objects import metadata_of, pods_complete
from services.runtime.auth import caller
from store import (
    InvalidObjectError,
    ResourceVersionTooNewError,
    ResourceVersionTooOldError,
    Store,
    StoreUnavailableError,
)
from store import kinds as kinds_mod
from store.informer import Informer
from store.kinds import wrap

_EVENT = {
    "ADDED": api_pb2.WatchEvent.ADDED,
    "MODIFIED": api_pb2.WatchEvent.MODIFIED,
    "DELETED": api_pb2.WatchEvent.DELETED,
}


class WatchRpc:
    def __init__(self, store: Store, informer: Informer, pods: PodIndex) -> None:
        self.store = store
        self.informer = informer
        self.pods = pods

    async def Watch(
        self, request: api_pb2.WatchRequest, context: Any
    ) -> AsyncGenerator[api_pb2.WatchEvent, None]:
        try:
            kinds = [kinds_mod.kind_named(k).name for k in request.kinds] or list(kinds_mod.KINDS)
        except InvalidObjectError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if request.from_revision < 0:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "from_revision: negative")
        if request.job and not set(kinds) <= {"Job", "Pod"}:
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, "job: only Jobs and Pods have a job"
            )
        matches = _watch_filter(await request_selector(request, context), request.job, caller())
        revision = request.from_revision
        try:
            if revision == 0:
                async for event in self._listing(kinds, matches):
                    yield event
                    revision = event.revision  # the last one, a BOOKMARK, is the listing's
            async for event in self._feed(request, kinds, revision, matches):
                yield event
        except ResourceVersionTooNewError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"from_revision: {exc}")
        except ResourceVersionTooOldError as exc:
            await abort(context, grpc.StatusCode.OUT_OF_RANGE, str(exc))
        except StoreUnavailableError as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))

    async def _listing(
        self, kinds: list[str], matches: Callable[[str, Message], bool]
    ) -> AsyncGenerator[api_pb2.WatchEvent, None]:
        """Every current object as ADDED, then a BOOKMARK at the listing's revision."""
        snapshot = await self.store.list_kinds(kinds)
        for kind, objs in snapshot.items.items():
            for obj in sorted(objs, key=lambda o: metadata_of(o).resource_version):
                if isinstance(obj, pb.Job):
                    obj = self.pods.job_as_read(obj)
                if matches(kind, obj):
                    yield api_pb2.WatchEvent(
                        type=api_pb2.WatchEvent.ADDED,
                        object=wrap(kind, obj),
                        revision=metadata_of(obj).resource_version,
                    )
        yield api_pb2.WatchEvent(type=api_pb2.WatchEvent.BOOKMARK, revision=snapshot.revision)

    async def _feed(
        self,
        request: api_pb2.WatchRequest,
        kinds: list[str],
        revision: int,
        matches: Callable[[str, Message], bool],
    ) -> AsyncGenerator[api_pb2.WatchEvent, None]:
        """The change feed from ``revision`` on. A one-pod job's status is derived from its pod
        (``as_read``): the feed has no update of the job when its pod changes, so a watcher of
        Jobs gets one made from the pod's, at the pod's revision. Pods are read for that even
        when not asked for."""
        jobs_wanted, pods_wanted = "Job" in kinds, "Pod" in kinds
        feed_kinds = [*kinds, "Pod"] if jobs_wanted and not pods_wanted else kinds
        async for batch in self.store.watch(
            revision, feed_kinds, keep=_of_job(request.job) if request.job else None
        ):
            sent = False
            for event in batch.events:
                if event.obj is None:
                    continue
                obj = event.obj
                if jobs_wanted and isinstance(obj, pb.Pod) and event.type != "DELETED":
                    job = await self._job_of_changed_pod(obj, event.type)
                    if job is not None and matches("Job", job):
                        sent = True
                        yield api_pb2.WatchEvent(
                            type=api_pb2.WatchEvent.MODIFIED,
                            object=wrap("Job", job),
                            revision=event.revision,
                        )
                    if not pods_wanted:
                        continue
                elif isinstance(obj, pb.Job) and event.type == "ADDED":
                    # Created with its pods (a big job: with their first chunk): nothing placed.
                    obj = as_read(obj, ()) if pods_complete(obj) else as_creating(obj)
                elif isinstance(obj, pb.Job) and event.type == "MODIFIED":
                    obj = self.pods.job_as_read(obj)
                if not matches(event.kind, obj):
                    continue
                sent = True
                yield api_pb2.WatchEvent(
                    type=_EVENT[event.type],
                    object=wrap(event.kind, obj),
                    revision=event.revision,
                )
            if not sent:
                # Nothing (or nothing matching): tell the watcher how far the feed got, so it
                # resumes from here rather than re-reading changes it does not want.
                yield api_pb2.WatchEvent(type=api_pb2.WatchEvent.BOOKMARK, revision=batch.revision)

    async def _job_of_changed_pod(self, pod: pb.Pod, event_type: str) -> pb.Job | None:
        """The job of a pod that changed, as read now, if its status is derived from that pod
        (a one-pod job); None for other jobs, whose status updates are in the feed. A pod's
        creation changes nothing: its job was just created with it, pending."""
        if event_type == "ADDED" or not pod.spec.job:
            return None
        job = self.informer.get("Job", pod.spec.job)
        if job is None:  # the view lags the feed: ask the store
            job = (await self.store.get_many(pb.Job, [pod.spec.job]))[0]
        if not isinstance(job, pb.Job) or not derives_status(job):
            return None
        return self.pods.job_as_read(job, newer=pod)


def _watch_filter(
    selects: Callable[[Mapping[str, str]], bool], job: str, identity: Identity | None = None
) -> Callable[[str, Message], bool]:
    """Whether a watched object matches a WatchRequest's label selectors and job, and is one
    the caller may see (a tenant's own jobs and pods; a filtered-out change is a bookmark)."""

    def matches(kind: str, obj: Message) -> bool:
        if not tenancy.owns(identity, kind, obj):
            return False
        meta = metadata_of(obj)
        if not selects(meta.labels):
            return False
        if not job:
            return True
        if kind == "Job":
            return meta.name == job
        return kind == "Pod" and isinstance(obj, pb.Pod) and obj.spec.job == job

    return matches


def _of_job(job: str) -> Callable[[str, bytes], bool]:
    """Whether a change of the feed may be of ``job`` or its pods, by the object's name alone
    (pods are ``<job>-<index>``, replacements ``<job>-<index>-r<n>``), so a watch of one job
    decodes only those: ``_watch_filter`` then decides on the object itself."""
    name, pods = job.encode(), f"{job}-".encode()

    def named(kind: str, obj_name: bytes) -> bool:
        return obj_name == name if kind == "Job" else obj_name.startswith(pods)

    return named
