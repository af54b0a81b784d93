"""``PodIndex``: the names of pods by node and by job, one index for every controller and the API."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterable

from google.protobuf.message import Message

from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.jobphase import (
    JobCounts,
    StatusTally,
    as_creating,
    as_deleting,
    as_read,
    derives_status,
)
from services.dispatcher.objects import being_deleted, pods_complete
from services.grouped import GroupedNames
from store.informer import Handlers, Informer

# Pods of one job read (decoded from the informer's cache) and counted at a time by
# :meth:`PodIndex.status_of`, which hands the loop to others once STATUS_SLICE_SECONDS have
# passed since it last did (2,000 pods at a time took up to 60 ms on a busy machine).
STATUS_SLICE_PODS = 250
STATUS_SLICE_SECONDS = 0.02


class PodIndex:
    """The names of pods by node and by job, kept from informer events; the pods themselves are
    read from the informer (which holds them encoded: a reference to each decoded pod here kept
    2.6 KiB a pod alive). One index serves every controller of the dispatcher (each pod event
    is indexed once, not once per controller); a controller that acts on changed jobs takes its
    own feed of their names (:meth:`subscribe`)."""

    def __init__(self, informer: Informer) -> None:
        self.by_node = GroupedNames()
        self.by_job = GroupedNames()
        self._informer = informer
        # Each subscriber's feed, what it ignores of a job's own updates, and whether it takes
        # only jobs whose status is stored (subscribe).
        self._feeds: list[tuple[set[str], Callable[[pb.Job], bool] | None, bool]] = []
        # The jobs whose status is stored, not derived (``derives_status``): jobs of more than
        # one pod, so few beside a stream of one-pod jobs.
        self._stored_status: set[str] = set()
        informer.add_handlers(
            Handlers(
                on_add=self._on_add,
                on_update=self._on_update,
                on_delete=self._on_delete,
                kinds=frozenset({"Pod", "Job"}),
            )
        )

    def pods_on(self, node: str) -> list[pb.Pod]:
        return self._read(self.by_node.get(node))

    def pods_of(self, job: str) -> list[pb.Pod]:
        return self._read(self.by_job.get(job))

    async def status_of(self, job: pb.Job, now_ms: int | None = None) -> JobCounts:
        """``job_status`` of ``job`` from its pods in the view (at ``now_ms``), read and
        counted a slice at a time with the loop served between (a big job's pods change
        meanwhile: each change brings the job back to whoever computes its status)."""
        names = list(self.by_job.get(job.metadata.name))
        tally = StatusTally(job)
        until = time.monotonic() + STATUS_SLICE_SECONDS
        for first in range(0, len(names), STATUS_SLICE_PODS):
            if first and time.monotonic() >= until:
                await asyncio.sleep(0)
                until = time.monotonic() + STATUS_SLICE_SECONDS
            tally.add(self._read(names[first : first + STATUS_SLICE_PODS]))
        return tally.counts(now_ms)

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
        pods = self.pods_of(job.metadata.name)
        if newer is not None:
            name = newer.metadata.name
            pods = [p for p in pods if p.metadata.name != name] + [newer]
        return as_read(job, pods)

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
        return feed

    def _changed(self, job: str) -> None:
        stored = job in self._stored_status
        for feed, _, stored_only in self._feeds:
            if stored or not stored_only:
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
        if isinstance(obj, pb.Pod):
            self._put(obj)
        elif isinstance(obj, pb.Job):
            self._job_seen(obj)
            self._changed(obj.metadata.name)

    def _on_update(self, kind: str, old: Message, obj: Message) -> None:
        if isinstance(old, pb.Pod) and isinstance(obj, pb.Pod):
            job, node, was_on = obj.spec.job, obj.spec.node_name, old.spec.node_name
            if old.spec.job != job:
                self._drop(old)
                self._put(obj)
                return
            # Its job's group holds it already (every update of a pod but a rare rewrite):
            # only a bind moves it between nodes, and its job hears of it.
            if node != was_on:
                name = obj.metadata.name
                self.by_node.discard(was_on, name)
                if node:
                    self.by_node.add(node, name)
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
        name = sys.intern(pod.metadata.name)  # one string with the claims' (``Claim.of``)
        spec = pod.spec
        node = spec.node_name
        if node:
            self.by_node.add(node, name)
        job = spec.job
        if job:
            self.by_job.add(job, name)
            self._changed(job)

    def _drop(self, pod: pb.Pod) -> None:
        name = pod.metadata.name
        self.by_node.discard(pod.spec.node_name, name)
        self.by_job.discard(pod.spec.job, name)
        if pod.spec.job:
            self._changed(pod.spec.job)
