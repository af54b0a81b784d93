"""Delete: a Job goes with all its pods (``controllers/deletion.py``) and is revoked from the
shard holding it; any other kind is one delete. A job small enough for one commit is gone when
the call answers; a bigger one is marked and answered at once as in progress, with the pods it
has left, while its pods go in the background (it reads as Deleting until it is gone; a second
Delete answers the same, and resumes it if no one here is deleting it). ``resource_version``
makes it a compare-and-set (ABORTED on a mismatch). A priority class that jobs name is not
deleted (FAILED_PRECONDITION naming them): they were admitted with its value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services import tenancy
from services.dispatcher import priorityclasses
from services.dispatcher.api.rpc import Aborted, abort, refuse_if
from services.dispatcher.controllers.deletion import Deletion, JobDeleter
from services.dispatcher.controllers.podindex import PodIndex
from services.dispatcher.dispatching.dispatch import UnitDispatcher
from services.runtime.auth import caller
from store import (
    CommitError,
    ConflictError,
    InvalidObjectError,
    NotFoundError,
    Store,
    StoreUnavailableError,
)
from store import kinds as kinds_mod
from store.informer import Informer

# How long a Delete of a priority class waits for the dispatcher's view to reach the store's
# revision before it answers UNAVAILABLE (it counts the class's jobs in that view).
VIEW_CATCH_UP_SECONDS = 5.0


class DeleteRpc:
    def __init__(
        self, store: Store, core: UnitDispatcher, deleter: JobDeleter, pods: PodIndex
    ) -> None:
        self.store = store
        self.core = core
        self.deleter = deleter
        self.pods = pods

    async def Delete(self, request: api_pb2.DeleteRequest, context: Any) -> api_pb2.DeleteResponse:
        try:
            kind = kinds_mod.kind_named(request.kind)
            if not tenancy.unrestricted(identity := caller()):
                stored = await self.store.get_many(kind.message, [request.name])
                await refuse_if(context, tenancy.delete_refusal(identity, kind.name, stored[0]))
            if kind.name == "Job":
                deletion = await self._delete_job(request.name, request.resource_version)
                self.core.revoke(request.name)
                if not deletion.in_progress:
                    return api_pb2.DeleteResponse(deleted=deletion.deleted)
                return api_pb2.DeleteResponse(
                    in_progress=True, pods_remaining=self.pods.by_job.count(request.name)
                )
            if kind.name == "PriorityClass":
                await self._refuse_class_in_use(request.name, context)
            await self.store.delete(
                kind.message, request.name, expected_version=request.resource_version
            )
            return api_pb2.DeleteResponse(deleted=1)
        except InvalidObjectError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except NotFoundError as exc:
            await abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except (ConflictError, Aborted) as exc:
            await abort(context, grpc.StatusCode.ABORTED, str(exc))
        except StoreUnavailableError as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))

    async def _refuse_class_in_use(self, name: str, context: Any) -> None:
        """FAILED_PRECONDITION if stored jobs name class ``name``, judged on the dispatcher's
        view once it holds every write made before this call (UNAVAILABLE if it lags)."""
        informer = self.core.informer
        try:
            await informer.wait_for_revision(await self.store.revision(), VIEW_CATCH_UP_SECONDS)
        except TimeoutError:
            await abort(
                context,
                grpc.StatusCode.UNAVAILABLE,
                "the dispatcher's view of the store is behind: the jobs naming priority class "
                f"{name!r} cannot be counted yet; retry",
            )
        users = priorityclasses.jobs_naming(informer.each(pb.Job), name)
        if users:
            await abort(
                context, grpc.StatusCode.FAILED_PRECONDITION, priorityclasses.in_use(name, users)
            )

    async def _delete_job(self, name: str, expected: int) -> Deletion:
        """The job and every pod of it (bound pods return their claims): one commit, or a big
        job marked and deleted in chunks in the background (``deletion.JobDeleter.start``)."""
        job = await self.store.get(pb.Job, name)
        try:
            return await self.deleter.start(job, expected)
        except CommitError as exc:
            raise Aborted(str(exc.cause)) from exc


def pods_of_job_by_scan(informer: Informer) -> Callable[[str], list[str]]:
    """Pods of a job by the informer (replacements are not ``<job>-<index>``): a scan, for a
    servicer built without the dispatcher's pod index."""

    def pods_of(job: str) -> list[str]:
        return [
            p.metadata.name
            for p in informer.each("Pod")
            if isinstance(p, pb.Pod) and p.spec.job == job
        ]

    return pods_of
