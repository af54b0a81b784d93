"""GodelClient: the synchronous SDK. It runs AsyncGodelClient on an event loop of its own (one
daemon thread per client), so retries, deadlines, error mapping, handles, waiting and watch
resumption exist once, in the async code; this module only carries calls across."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar, overload

from foundation import tls
from godel.client._async import Applied, AsyncGodelClient, AsyncJobHandle, Selector
from godel.client._transport import DEFAULT_TIMEOUT, ClosedOnExit
from godel.client.objects import (
    Event,
    Explanation,
    Job,
    Object,
    Pod,
    PriorityClass,
    Reservation,
)

T = TypeVar("T")


class _Loop:
    """An event loop on a daemon thread, and a blocking ``run`` of coroutines on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="godel-client", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            # Ctrl-C (or any error of the caller's thread) must not leave the call running.
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class JobHandle:
    """One submitted job (see AsyncJobHandle, which does the work)."""

    def __init__(self, handle: AsyncJobHandle, loop: _Loop) -> None:
        self._handle = handle
        self._loop = loop

    @property
    def name(self) -> str:
        return self._handle.name

    @property
    def existing(self) -> bool:
        return self._handle.existing

    def __repr__(self) -> str:
        return repr(self._handle)

    def status(self) -> Job:
        return self._loop.run(self._handle.status())

    def pods(self) -> list[Pod]:
        return self._loop.run(self._handle.pods())

    def explain(self) -> list[Explanation]:
        return self._loop.run(self._handle.explain())

    def delete(self) -> int:
        return self._loop.run(self._handle.delete())

    def retry(self) -> Job:
        return self._loop.run(self._handle.retry())

    def wait(self, phase: str = "Succeeded", timeout: float | None = None) -> Job:
        return self._loop.run(self._handle.wait(phase, timeout))


class GodelClient(ClosedOnExit):
    """The synchronous client of a Gödel cluster: AsyncGodelClient's methods, blocking.

    ``address`` defaults to ``$GODEL_ADDRESS`` / ``$GODEL_SERVER``, else the local cluster of
    ``home`` / ``$GODEL_HOME``; ``credentials`` to those ``discover_credentials`` finds
    (``insecure=True``: plaintext, for a cluster started with --insecure).
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
        self._loop = _Loop()

        async def make() -> AsyncGodelClient:
            # Made on the loop: a grpc.aio channel belongs to the loop it was created on.
            return AsyncGodelClient(
                address,
                home=home,
                timeout=timeout,
                reconnect_timeout=reconnect_timeout,
                credentials=credentials,
                insecure=insecure,
            )

        try:
            self._async = self._loop.run(make())
        except BaseException:
            self._loop.stop()
            raise
        self.address = self._async.address

    def close(self) -> None:
        if self._loop.loop.is_closed():
            return  # closed before: close() may be called again (and by __exit__)
        self._loop.run(self._async.close())
        self._loop.stop()

    @overload
    def submit(self, jobs: Job, *, request_id: str | None = None) -> JobHandle: ...

    @overload
    def submit(self, jobs: Sequence[Job], *, request_id: str | None = None) -> list[JobHandle]: ...

    def submit(
        self, jobs: Job | Sequence[Job], *, request_id: str | None = None
    ) -> JobHandle | list[JobHandle]:
        if isinstance(jobs, Job):
            return JobHandle(
                self._loop.run(self._async.submit(jobs, request_id=request_id)), self._loop
            )
        handles = self._loop.run(self._async.submit(list(jobs), request_id=request_id))
        return [JobHandle(h, self._loop) for h in handles]

    def apply_manifest(self, manifest: str | bytes | dict[str, Any]) -> list[Applied]:
        return self._loop.run(self._async.apply_manifest(manifest))

    def delete(self, kind: str, name: str, *, resource_version: int = 0) -> int:
        return self._loop.run(self._async.delete(kind, name, resource_version=resource_version))

    def retry_job(self, name: str) -> Job:
        return self._loop.run(self._async.retry_job(name))

    def apply_priority_class(self, priority_class: PriorityClass) -> Applied:
        return self._loop.run(self._async.apply_priority_class(priority_class))

    def priority_classes(self) -> list[PriorityClass]:
        return self._loop.run(self._async.priority_classes())

    def priority_class(self, name: str) -> PriorityClass:
        return self._loop.run(self._async.priority_class(name))

    def delete_priority_class(self, name: str) -> None:
        self._loop.run(self._async.delete_priority_class(name))

    def reserve(self, reservation: Reservation) -> Reservation:
        return self._loop.run(self._async.reserve(reservation))

    def reservation(self, name: str) -> Reservation:
        return self._loop.run(self._async.reservation(name))

    def reservations(self) -> list[Reservation]:
        return self._loop.run(self._async.reservations())

    def job(self, name: str) -> JobHandle:
        return JobHandle(self._async.job(name), self._loop)

    def get(self, kind: str, name: str) -> Object:
        return self._loop.run(self._async.get(kind, name))

    def list(self, kind: str, *, job: str = "", labels: Selector = None) -> list[Object]:
        return self._loop.run(self._async.list(kind, job=job, labels=labels))

    def explain(self, pod: str) -> Explanation:
        return self._loop.run(self._async.explain(pod))

    def watch(
        self,
        kinds: str | Sequence[str],
        *,
        selector: Selector = None,
        job: str = "",
        from_revision: int = 0,
    ) -> Iterator[Event]:
        """AsyncGodelClient.watch as an iterator; close it (or leave the loop) to stop."""
        events = self._async.watch(kinds, selector=selector, job=job, from_revision=from_revision)

        async def next_event() -> Event:
            return await anext(events)

        try:
            while True:
                try:
                    yield self._loop.run(next_event())
                except StopAsyncIteration:
                    return
        finally:
            self._loop.run(events.aclose())
