"""Why pods were handed back, written on the pods: ``PodScheduled=False`` with the reason, and
the search's diagnosis as data in ``status.unschedulable`` (what `godel explain` renders).

Writes run as side tasks off the scheduling loop; a stopping shard lets them finish briefly
(``drain``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import structlog

from placement.search import Diagnosis
from protos.godel.v1 import objects_pb2 as pb
from store import Store
from store.client import MAX_OPS_PER_CALL
from store.errors import StoreError
from store.informer import Informer

log = structlog.get_logger(__name__)

# Pods per round trip: the store's bound on one script (store.client.MAX_OPS_PER_CALL), so a
# huge unit's pods go as many short calls with the event loop free in between.
MARK_CHUNK_PODS = MAX_OPS_PER_CALL


def now_ms() -> int:
    return int(time.time() * 1000)


class UnschedulableRecorder:
    def __init__(self, store: Store, informer: Informer, shard: str) -> None:
        self._store = store
        self._informer = informer
        self.shard = shard  # set again by a spare when it takes a name
        self._tasks: set[asyncio.Task[None]] = set()

    def record(self, reasons: dict[str, str], diagnoses: dict[str, Diagnosis]) -> None:
        """Write ``reasons`` (pod -> why) and ``diagnoses`` on the pods, in the background."""
        self._spawn(self._mark(reasons, diagnoses))

    async def drain(self, wait: float) -> None:
        """Let the writes in flight finish for ``wait`` seconds in all, then cancel the rest."""
        side = list(self._tasks)
        if not side:
            return
        _, late = await asyncio.wait(side, timeout=wait)
        for task in late:
            task.cancel()
        await asyncio.gather(*side, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _mark(self, reasons: dict[str, str], diagnoses: dict[str, Diagnosis]) -> None:
        """Conflicts are ignored: whoever changed the pod meanwhile knows better. A pod handed
        back for another cause than a search (e.g. the Binder's rejections) has no diagnosis."""
        now = now_ms()
        pods: list[pb.Pod] = []
        for name, reason in reasons.items():
            if len(pods) >= MARK_CHUNK_PODS:
                # Tens of thousands of pods handed back (a huge unit on a full cluster): written
                # a chunk at a time, so building and encoding them never holds the event loop
                # (heartbeats) for long.
                await self._write(pods)
                pods = []
            cached = self._informer.get("Pod", name)
            if not isinstance(cached, pb.Pod) or cached.spec.node_name:
                continue
            pods.append(self._marked(cached, reason, diagnoses.get(name), now))
        await self._write(pods)

    def _marked(self, cached: pb.Pod, reason: str, diagnosis: Diagnosis | None, now: int) -> pb.Pod:
        pod = pb.Pod()
        pod.CopyFrom(cached)
        cond = next((c for c in pod.status.conditions if c.type == "PodScheduled"), None)
        if cond is None:
            cond = pod.status.conditions.add(type="PodScheduled")
        if cond.status != "False":
            cond.last_transition_ms = now
        cond.status, cond.reason, cond.message = "False", "Unschedulable", reason
        pod.status.scheduler = self.shard
        pod.status.attempts += 1
        if diagnosis is None:
            pod.status.ClearField("unschedulable")
        else:
            pod.status.unschedulable.CopyFrom(diagnosis.to_proto())
        return pod

    async def _write(self, pods: list[pb.Pod]) -> None:
        if not pods:
            return
        try:
            await self._store.update_many(pods)
        except StoreError as exc:
            log.warning("could not record unschedulable pods", error=str(exc), pods=len(pods))
