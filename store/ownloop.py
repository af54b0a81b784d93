"""Work that must not wait behind its owner's event loop — renewing the Binder's lease
(``lease.LeaseKeeper``), stamping a shard's liveness (``pulse.ShardPulse``) — run on a thread of
its own with its own event loop (and its own store connection, which the work opens there).

``OwnLoopWorker`` is the part they share: the thread, started by :meth:`OwnLoopWorker.run` in the
owner's loop, which returns when the work ends and raises what ended it (the owner supervises
it as any task of its own); a stop event the work watches; and callbacks into the owner's loop
that the thread never waits for (:meth:`OwnLoopWorker.call_owner`), so a busy owner cannot stall
the work either. (The GIL still passes between the threads every few milliseconds.)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")


class OwnLoopWorker:
    """A worker whose :meth:`work` runs on a thread and event loop of its own. Subclasses write
    :meth:`work` (it returns once ``self.stopping`` is set) and name the thread."""

    thread_name = "own-loop"

    def __init__(self) -> None:
        self._owner: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Set (in the worker's loop) to end the work; None until the worker's loop runs.
        self.stopping: asyncio.Event | None = None
        self._ready = threading.Event()  # set once the worker's loop runs, or the thread ends
        self._thread: threading.Thread | None = None

    async def work(self) -> None:
        raise NotImplementedError

    async def run(self) -> None:
        """Run :meth:`work` on a thread of its own until it returns (see :meth:`stop_thread`);
        raises what ended it. Cancelled, it stops the thread first."""
        self._owner = asyncio.get_running_loop()
        ended: asyncio.Future[None] = self._owner.create_future()
        self._thread = threading.Thread(
            target=self._thread_main, args=(ended,), name=self.thread_name, daemon=True
        )
        self._thread.start()
        try:
            await asyncio.shield(ended)
        except asyncio.CancelledError:
            await self.stop_thread()
            raise

    async def stop_thread(
        self, last: Callable[[], Coroutine[Any, Any, None]] | None = None
    ) -> None:
        """End the work: ``last()`` run in the worker's loop first, if given (and the loop still
        runs), then the stop event set; returns once the thread has ended."""
        thread = self._thread
        if thread is None:
            return
        await asyncio.to_thread(self._ready.wait)
        if last is not None:
            with contextlib.suppress(RuntimeError):  # the worker's loop ended meanwhile
                await self.in_worker(last())
        loop, stopping = self._loop, self.stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        await asyncio.to_thread(thread.join)

    async def in_worker(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` in the worker's loop and wait for it here, in the owner's."""
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running():
            work.close()
            raise RuntimeError(f"{self.thread_name} is not running")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop))

    def call_owner(self, callback: Callable[[], Coroutine[Any, Any, None]], what: str) -> None:
        """Run ``callback()`` in the owner's loop, not waited for; a failure is logged as
        ``what``. Calls keep their order. Nothing if the owner's loop is gone."""
        owner = self._owner
        if owner is None:
            return
        with contextlib.suppress(RuntimeError):  # the owner's loop closed
            future = asyncio.run_coroutine_threadsafe(callback(), owner)
            future.add_done_callback(lambda f: _log_failure(f, what))

    def call_owner_soon(self, callback: Callable[[], None]) -> None:
        """``callback()`` in the owner's loop as soon as it gets to it (not waited for)."""
        owner = self._owner
        if owner is not None:
            with contextlib.suppress(RuntimeError):
                owner.call_soon_threadsafe(callback)

    def _thread_main(self, ended: asyncio.Future[None]) -> None:
        error: BaseException | None = None
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to the owner, who supervises the worker
            error = exc
        finally:
            self._ready.set()
        owner = self._owner
        assert owner is not None
        with contextlib.suppress(RuntimeError):  # the owner's loop is gone: nobody to tell
            owner.call_soon_threadsafe(_settle, ended, error)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        self._ready.set()
        await self.work()


def _settle(ended: asyncio.Future[None], error: BaseException | None) -> None:
    if ended.done():
        return
    if error is None:
        ended.set_result(None)
    else:
        ended.set_exception(error)


def _log_failure(future: Any, what: str) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error(f"{what} failed", error=repr(future.exception()))
