"""AsyncGodelClient: the SDK over grpc.aio. Everything the SDK does lives here once; the
synchronous GodelClient runs this very code on a private event loop."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, overload

import grpc
from google.protobuf.message import Message

from foundation import tls
from foundation.retry import Retry
from godel.client._transport import (
    CHANNEL_OPTIONS,
    DEFAULT_TIMEOUT,
    RECONNECT_BACKOFF,
    ClientError,
    Invalid,
    NotFound,
    Unavailable,
    Violation,
    client_error,
    discover,
    rejected,
    resolve_credentials,
)
from godel.client.objects import (
    JOB_PROGRESS,
    Event,
    EventType,
    Explanation,
    Job,
    Object,
    Pod,
    PriorityClass,
    Reservation,
    invalid_manifest,
    object_from_wire,
)
from godel.manifest import ManifestError, load, parse_document
from placement import labelselector
from protos.godel.v1 import api_pb2, api_pb2_grpc

# Jobs go to Submit, these to Apply (what `godel apply` does with a multi-document file).
_WATCH_TYPES: dict[int, EventType] = {
    api_pb2.WatchEvent.ADDED: "ADDED",
    api_pb2.WatchEvent.MODIFIED: "MODIFIED",
    api_pb2.WatchEvent.DELETED: "DELETED",
}
# A stream that ends or breaks with these is reconnected; any other code is the caller's to see.
_RECONNECT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN)


# The phases ``wait`` takes, by their lower-case spelling.
_JOB_PHASES = {p.lower(): p for p in (*JOB_PROGRESS, "Failed", "Unschedulable", "Timeout")}


class JobFailed(Exception):
    """A job being waited for reached Failed or Timeout (or was deleted) instead of the wanted
    phase."""

    def __init__(self, job: Job, wanted: str) -> None:
        super().__init__(f"job {job.name} is {job.phase}, waiting for {wanted}")
        self.job = job


@dataclass(frozen=True)
class Applied:
    """What applying one manifest document did: created, configured, unchanged or existing."""

    kind: str
    name: str
    action: str


def _reached(phase: str, wanted: str, progress: Sequence[str]) -> bool:
    if phase == wanted:
        return True
    return (
        phase in progress and wanted in progress and progress.index(phase) > progress.index(wanted)
    )


class AsyncJobHandle:
    """One submitted job, by name: its state, its pods, waiting for a phase, deleting it."""

    def __init__(self, client: AsyncGodelClient, name: str, *, existing: bool = False) -> None:
        self.client = client
        self.name = name
        self.existing = existing
        """Submit found the job already stored by an earlier attempt of the same request."""

    def __repr__(self) -> str:
        return f"<job {self.name}>"

    async def status(self) -> Job:
        job = await self.client.get("Job", self.name)
        assert isinstance(job, Job)
        return job

    async def pods(self) -> list[Pod]:
        return [p for p in await self.client.list("Pod", job=self.name) if isinstance(p, Pod)]

    async def explain(self) -> list[Explanation]:
        """Where each pod is, or why it is pending, in pod order."""
        pods = await self.pods()
        return list(await asyncio.gather(*(self.client.explain(p.name) for p in pods)))

    async def delete(self) -> int:
        """Delete the job and its pods; how many objects went (0 for a job too big for one
        store commit: its pods go on being deleted in the dispatcher, and it reads as phase
        Deleting until it is gone)."""
        return await self.client.delete("Job", self.name)

    async def retry(self) -> Job:
        """Start a gang whose scheduling timed out (phase Timeout) again: Pending, its
        schedule timer restarted. Raises Conflict if it is in another phase."""
        return await self.client.retry_job(self.name)

    async def wait(self, phase: str = "Succeeded", timeout: float | None = None) -> Job:
        """Return the job once it is in ``phase`` (Pending, PreScheduling, Scheduled, Running,
        Succeeded; a later one of these also counts, Failed, Unschedulable and Timeout only
        themselves). Follows the Watch stream, not polling. Raises JobFailed if it fails, times
        out (a gang not scheduled within its scheduleTimeoutSeconds, unless Timeout is what is
        waited for) or is deleted meanwhile, NotFound if it does not exist, TimeoutError after
        ``timeout`` seconds."""
        wanted = _JOB_PHASES.get(phase.lower())
        if wanted is None:
            raise ValueError(f"{phase!r} is not a job phase")
        events = self.client._events(["Job"], job=self.name)
        # aclosing: leaving early (found, failed, timed out) ends the stream now, not at GC.
        async with asyncio.timeout(timeout), aclosing(events):
            seen = False
            async for item in events:
                if isinstance(item, int):  # a bookmark: the listing is complete
                    if not seen:
                        raise NotFound(grpc.StatusCode.NOT_FOUND, f"job {self.name!r} not found")
                    continue
                job = item.object
                assert isinstance(job, Job)
                seen = True
                if item.type == "DELETED":
                    raise JobFailed(job, wanted)
                if _reached(job.phase, wanted, JOB_PROGRESS):
                    return job
                if job.phase in ("Failed", "Timeout"):
                    raise JobFailed(job, wanted)
        raise AssertionError("unreachable: the watch resumes until cancelled")


class AsyncGodelClient:
    """The asyncio client of a Gödel cluster.

    ``address`` defaults to ``$GODEL_ADDRESS`` / ``$GODEL_SERVER``, else the local cluster of
    ``home`` / ``$GODEL_HOME`` (see ``discover``), with the credentials
    ``discover_credentials`` finds there unless ``credentials`` are given (``insecure=True``:
    plaintext, for a cluster started with --insecure). ``timeout`` is every unary call's deadline;
    a broken watch is resumed for up to ``reconnect_timeout`` seconds before Unavailable.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        home: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        reconnect_timeout: float = 60.0,
        credentials: tls.Credentials | None = None,
        insecure: bool = False,
    ) -> None:
        self.address = discover(address, home=home)
        self.timeout = timeout
        self.reconnect_timeout = reconnect_timeout
        self.credentials = resolve_credentials(credentials, insecure, home)
        self._channel = tls.aio_channel(self.address, self.credentials, CHANNEL_OPTIONS)
        self._api = api_pb2_grpc.DispatcherStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _call(self, method: Any, request: Message) -> Any:
        try:
            return await method(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise client_error(exc, self.address, plaintext=self.credentials is None) from None

    # -----------------------------------------------------------------------------------------
    # Writes
    # -----------------------------------------------------------------------------------------

    @overload
    async def submit(self, jobs: Job, *, request_id: str | None = None) -> AsyncJobHandle: ...

    @overload
    async def submit(
        self, jobs: Sequence[Job], *, request_id: str | None = None
    ) -> list[AsyncJobHandle]: ...

    async def submit(
        self, jobs: Job | Sequence[Job], *, request_id: str | None = None
    ) -> AsyncJobHandle | list[AsyncJobHandle]:
        """Store one job (returns its handle) or several (a handle each, in order).

        Idempotent: the request carries ``request_id`` (a fresh one unless given), and gRPC's
        retries resend it, so a retry after a lost reply reports the job the first attempt
        stored (``handle.existing``) instead of creating it twice or failing. Pass your own id
        to make a submission idempotent across program restarts too. Raises Invalid (with the
        violations) or AlreadyExists; jobs are stored one by one, so on error the others of the
        batch may be stored: ``error.stored`` names them."""
        batch = [jobs] if isinstance(jobs, Job) else list(jobs)
        request = api_pb2.SubmitRequest(
            jobs=[j.to_proto() for j in batch], request_id=request_id or uuid.uuid4().hex
        )
        response = await self._call(self._api.Submit, request)
        handles = [
            AsyncJobHandle(self, r.job, existing=r.existing)
            for r in response.results
            if r.created or r.existing
        ]
        failed = [r for r in response.results if r.violations]
        if failed:
            error = rejected(
                [Violation(v.field, v.description) for r in failed for v in r.violations],
                "submit " + ", ".join(r.job for r in failed),
            )
            error.stored = [h.name for h in handles]
            raise error
        return handles[0] if isinstance(jobs, Job) else handles

    async def apply_manifest(self, manifest: str | bytes | dict[str, Any]) -> list[Applied]:
        """Apply a YAML text (one or more documents, or a List; bytes must be UTF-8) or a
        manifest dict, as `godel apply -f`: each object is created, updated where it may change
        (``configured``) or left ``unchanged``. A change to what cannot change (a job's
        replicas, say) is Invalid naming the field, as is a text that is not a manifest (bytes
        that are not UTF-8 text included): nothing is sent then. Idempotent, as ``submit``: the
        request carries a fresh request id."""
        try:
            if isinstance(manifest, dict):
                docs = [parse_document(manifest, "<manifest>")]
            else:
                docs = load(manifest, "<manifest>")
        except ManifestError as exc:
            raise invalid_manifest(exc) from None
        request = api_pb2.ApplyRequest(
            objects=[d.as_object() for d in docs], request_id=uuid.uuid4().hex
        )
        response = await self._call(self._api.Apply, request)
        bad = [v for r in response.results for v in r.violations]
        if bad:
            raise rejected([Violation(v.field, v.description) for v in bad], "apply")
        return [Applied(r.kind, r.name, r.action) for r in response.results]

    async def delete(self, kind: str, name: str, *, resource_version: int = 0) -> int:
        """Delete an object (a job with its pods); how many objects went. A job too big for one
        store commit is only marked by the time this returns (0): its pods go on being deleted
        in the dispatcher, and it reads as phase Deleting until it is gone. With
        ``resource_version``, only if unchanged since (else Conflict)."""
        request = api_pb2.DeleteRequest(kind=kind, name=name, resource_version=resource_version)
        return int((await self._call(self._api.Delete, request)).deleted)

    async def retry_job(self, name: str) -> Job:
        """Start a gang whose scheduling timed out (phase Timeout) again: back to Pending, its
        schedule timer restarted, its pods dispatched again. Raises Conflict if the job is in
        another phase, NotFound if there is none."""
        response = await self._call(self._api.RetryJob, api_pb2.RetryJobRequest(name=name))
        job = object_from_wire(api_pb2.Object(job=response.job))
        assert isinstance(job, Job)
        return job

    # -----------------------------------------------------------------------------------------
    # Priority classes (the admin writes them; everyone reads them)
    # -----------------------------------------------------------------------------------------

    async def apply_priority_class(self, priority_class: PriorityClass) -> Applied:
        """Create a priority class, or change its globalDefault, description, labels or
        annotations. Invalid when its value, preemption policy or preemptible would change
        (they are resolved into its jobs at admission) or when another class already is the
        globalDefault; PermissionDenied for a tenant."""
        (applied,) = await self.apply_manifest(priority_class.manifest)
        return applied

    async def priority_classes(self) -> list[PriorityClass]:
        """Every priority class, by name."""
        return [o for o in await self.list("PriorityClass") if isinstance(o, PriorityClass)]

    async def priority_class(self, name: str) -> PriorityClass:
        """One priority class (NotFound if there is none of that name)."""
        obj = await self.get("PriorityClass", name)
        assert isinstance(obj, PriorityClass)  # objects.from_proto's class of the kind
        return obj

    async def delete_priority_class(self, name: str) -> None:
        """Delete a priority class; Conflict (naming them) while stored jobs name it."""
        await self.delete("PriorityClass", name)

    async def reserve(self, reservation: Reservation) -> Reservation:
        """Apply a reservation (``godel.client.reservation(...)`` or a manifest): created, or
        its TTL changed; Invalid naming the field when it is larger than its node, its TTL is
        not positive, its owner does not parse or its node does not exist. The stored one."""
        request = api_pb2.ApplyRequest(
            objects=[api_pb2.Object(reservation=reservation.to_proto())],
            request_id=uuid.uuid4().hex,
        )
        response = await self._call(self._api.Apply, request)
        bad = [v for r in response.results for v in r.violations]
        if bad:
            raise rejected([Violation(v.field, v.description) for v in bad], "reserve")
        return await self.reservation(reservation.name)

    async def reservation(self, name: str) -> Reservation:
        """A reservation by name (NotFound once consumed, expired or released)."""
        got = await self.get("Reservation", name)
        assert isinstance(got, Reservation)
        return got

    async def reservations(self) -> list[Reservation]:
        """Every live reservation (a tenant: its own)."""
        return [r for r in await self.list("Reservation") if isinstance(r, Reservation)]

    # -----------------------------------------------------------------------------------------
    # Reads
    # -----------------------------------------------------------------------------------------

    def job(self, name: str) -> AsyncJobHandle:
        """A handle on a job submitted earlier (by anyone)."""
        return AsyncJobHandle(self, name)

    async def get(self, kind: str, name: str) -> Object:
        return object_from_wire(
            await self._call(self._api.Get, api_pb2.GetRequest(kind=kind, name=name))
        )

    async def list(self, kind: str, *, job: str = "", labels: Selector = None) -> list[Object]:
        """Every object of a kind (all pages), optionally only one job's pods or those whose
        labels match ``labels``: a dict (all pairs equal) or a selector in kubectl's grammar
        (``"app in (web,api),!canary"``; a malformed one raises Invalid before any call)."""
        equal, text = _selector(labels)
        items: list[Object] = []
        token = ""
        while True:
            request = api_pb2.ListRequest(
                kind=kind, job=job, label_selector=equal, selector=text, continue_token=token
            )
            response = await self._call(self._api.List, request)
            items += [object_from_wire(o) for o in response.items]
            token = response.continue_token
            if not token:
                return items

    async def explain(self, pod: str) -> Explanation:
        """Where a pod runs, or why it is pending."""
        response = await self._call(self._api.Explain, api_pb2.ExplainRequest(pod=pod))
        return Explanation.from_wire(response)

    async def watch(
        self,
        kinds: str | Sequence[str],
        *,
        selector: Selector = None,
        job: str = "",
        from_revision: int = 0,
    ) -> AsyncGenerator[Event, None]:
        """Every change of objects of ``kinds`` whose labels match ``selector`` (and, with
        ``job``, only that job and its pods): from ``from_revision`` on, or (0) first every
        current object as ADDED. Survives the dispatcher's restarts: the stream is resumed from
        the last revision it delivered, so no event is lost or repeated."""
        async for item in self._events(
            kinds, selector=selector, job=job, from_revision=from_revision
        ):
            if not isinstance(item, int):
                yield item

    async def _events(
        self,
        kinds: str | Sequence[str],
        *,
        selector: Selector = None,
        job: str = "",
        from_revision: int = 0,
    ) -> AsyncGenerator[Event | int, None]:
        """The watch with its bookmarks (yielded as their revision), resumed across breaks.

        Each stored change has its own revision and the server sends changes in revision
        order, so resuming after the last delivered revision neither loses nor repeats one.
        The initial listing (``from_revision`` 0) is ordered by kind, not revision: broken
        before its closing bookmark, it is listed again, and objects already delivered are
        skipped when unchanged, reported MODIFIED when changed and DELETED when gone."""
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        equal, text = _selector(selector)
        revision = from_revision
        listing = from_revision == 0
        delivered: dict[tuple[str, str], Event] = {}  # of the listing, by (kind, name)
        relisted: set[tuple[str, str]] = set()
        reconnecting: Retry | None = None  # since the stream broke; none while it delivers
        while True:
            request = api_pb2.WatchRequest(
                kinds=kinds,
                from_revision=0 if listing else revision,
                label_selector=equal,
                selector=text,
                job=job,
            )
            call = self._api.Watch(request)
            try:
                async for wire in call:
                    reconnecting = None
                    if wire.type == api_pb2.WatchEvent.BOOKMARK:
                        if listing:
                            for key in sorted(delivered.keys() - relisted):
                                gone = delivered[key]
                                yield Event("DELETED", gone.object, wire.revision)
                            listing = False
                            delivered.clear()
                        revision = max(revision, wire.revision)
                        yield revision
                        continue
                    event = Event(
                        _WATCH_TYPES[wire.type], object_from_wire(wire.object), wire.revision
                    )
                    if listing:
                        key = (event.object.kind, event.object.name)
                        relisted.add(key)
                        before = delivered.get(key)
                        if before is not None:
                            if before.revision == event.revision:
                                continue  # delivered before the break
                            event = Event("MODIFIED", event.object, event.revision)
                        delivered[key] = event
                    elif event.revision <= revision:
                        continue  # never twice, whatever a server sends
                    else:
                        revision = event.revision
                    yield event
            except grpc.RpcError as exc:
                error = client_error(exc, self.address, plaintext=self.credentials is None)
                if exc.code() not in _RECONNECT:
                    raise error from None
            finally:
                call.cancel()
            # The stream ended or broke: the server restarted or went away. Reconnect.
            relisted.clear()
            if reconnecting is None:
                reconnecting = Retry(RECONNECT_BACKOFF, deadline_seconds=self.reconnect_timeout)
            elif reconnecting.remaining() < 0:
                raise Unavailable(
                    grpc.StatusCode.UNAVAILABLE,
                    f"watch: cannot reach {self.address} for {self.reconnect_timeout:g}s",
                )
            await reconnecting.sleep()


Selector = dict[str, str] | str | None


def _selector(value: Selector) -> tuple[dict[str, str], str]:
    """(equality map, selector text) of a dict or a kubectl-grammar string, the text checked."""
    if not isinstance(value, str):
        return dict(value or {}), ""
    try:
        labelselector.parse(value)
    except labelselector.SelectorSyntaxError as exc:
        raise Invalid(
            grpc.StatusCode.INVALID_ARGUMENT, str(exc), [Violation("selector", exc.problem)]
        ) from None
    return {}, value


__all__ = ["Applied", "AsyncGodelClient", "AsyncJobHandle", "ClientError", "JobFailed"]
