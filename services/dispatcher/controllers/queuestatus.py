"""The queue status controller: ``Queue.status`` from the dispatcher's accounting."""

from __future__ import annotations

from collections.abc import Callable

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.ticking import tick_forever
from store import Store
from store.informer import Informer


class QueueStatusController:
    """Keeps ``Queue.status`` (resources its bound pods hold, its pending units and pods) current
    from the dispatcher's accounting: the queues whose status changed are written with one
    ``update_many`` per interval. Compare-and-set on the cached version; a conflict is left to
    the next tick, which starts from the fresh copy the watch brings. Only status is changed."""

    def __init__(
        self,
        store: Store,
        informer: Informer,
        statuses: Callable[[], dict[str, pb.QueueStatus]],
        *,
        interval_seconds: float = 1.0,
    ) -> None:
        self._store = store
        self._informer = informer
        self._statuses = statuses
        self.interval = interval_seconds
        self.writes = 0  # update_many round trips, for tests and metrics

    async def run(self) -> None:
        await tick_forever("queue status", self._informer, self.tick, self.interval)

    async def tick(self) -> None:
        updates: list[pb.Queue] = []
        statuses = self._statuses()
        for obj in self._informer.list("Queue"):
            assert isinstance(obj, pb.Queue)
            status = statuses.get(obj.metadata.name, pb.QueueStatus())
            if status == obj.status:
                continue
            queue = pb.Queue()
            queue.CopyFrom(obj)
            queue.status.CopyFrom(status)
            updates.append(queue)
        if updates:
            self.writes += 1
            await self._store.update_many(updates)
