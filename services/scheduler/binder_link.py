"""The shard's link to the Binder leader: one ``Binder.Decide`` stream, decisions out, verdicts in.

Each scheduling cycle hands its ``DecisionBatch`` to :meth:`BinderLink.send`; it stays undecided
until its ``VerdictBatch`` arrives. The leader is found through the Binder's lease
(``services.peers.binder.LEASE``, its ``holder_address``). On a stream error
(FAILED_PRECONDITION, UNAVAILABLE, ...), the stream's end or an all-``NOT_LEADER`` answer, the
link looks the leader up again and resends every undecided batch in order (a duplicate of an
already bound pod is answered ``STALE``). Each verdict is handed to the shard's
:class:`VerdictHandler`, which keeps the units.

The reconciler (:meth:`BinderLink.reconcile`) takes back a batch written on a stream that
stayed up, unanswered for ``verdict_timeout_seconds`` although a batch written after it was
answered: a lost verdict, not a slow Binder. Its placements are rejected as after an ``ERROR``
verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Generic, Protocol, TypeVar

import grpc
import structlog

from foundation.retry import Backoff, Retry
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from services.peers.binder import LEASE as BINDER_LEASE
from services.runtime.service import MAX_MESSAGE_BYTES, Dial
from store import Store
from store.errors import StoreError

log = structlog.get_logger(__name__)

# Verdict codes a rejection is named by (any other code is named by its number).
_RETRY_CODES = {ipb.CONFLICT, ipb.GANG_REJECTED, ipb.STALE, ipb.ERROR, ipb.VERDICT_UNSPECIFIED}
# Rejections that count as optimistic-concurrency conflicts between shards (what the node
# shuffler's conflict rate measures): the room was taken, or a sibling's was and sank the gang.
_CONFLICT_CODES = {ipb.CONFLICT, ipb.GANG_REJECTED}
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# How long the link waits before looking the leader up again, doubled per failure up to the cap.
_RELOOK_SECONDS, _RELOOK_MAX_SECONDS = 0.05, 1.0

# Verdicts applied between two looks at the clock, and how long applying them keeps the loop at
# most before others get a turn (receive_in_slices).
_VERDICTS_PER_STEP = 256
VERDICT_SLICE_SECONDS = 0.02

U = TypeVar("U")
U_contra = TypeVar("U_contra", contravariant=True)


class VerdictHandler(Protocol[U_contra]):
    """What the shard does with each verdict (the link calls it in the batch's order)."""

    def bound(self, unit: U_contra, pod: str) -> None:
        """The Binder bound ``pod``."""
        ...

    def rejected(
        self, unit: U_contra, pod: str, why: str, conflict: bool, resource_version: int
    ) -> None:
        """The Binder rejected ``pod`` (``why``: ``binder: CODE: reason``); ``conflict``: another
        shard's placement took the room; retry against a view at least at
        ``resource_version`` (0: no condition)."""
        ...

    def settled(self, unit: U_contra) -> None:
        """Every placement of ``unit`` in this batch has its verdict."""
        ...


class BinderLink(Generic[U]):
    def __init__(
        self,
        store: Store,
        dial: Dial,
        handler: VerdictHandler[U],
        verdict_timeout_seconds: float,
    ) -> None:
        self._store = store
        self._dial = dial
        self._handler = handler
        self.verdict_timeout_seconds = verdict_timeout_seconds
        # Decisions sent (or to send) and not yet answered, by batch id; resent on reconnect.
        self._undecided: dict[int, tuple[ipb.DecisionBatch, list[U]]] = {}
        self._unsent: deque[int] = deque()
        self._send_wake = asyncio.Event()
        self._batch_id = 0
        # Each undecided batch written on the current stream: when (monotonic) and in which
        # order; and the latest write the Binder has answered. A batch left behind by an answer
        # to a later one was lost, not merely slow.
        self._written_at: dict[int, tuple[float, int]] = {}
        self._writes = 0
        self._answered_write = 0
        self.repaired = 0  # decisions the reconciler took back

    def send(self, batch: ipb.DecisionBatch, units: list[U]) -> None:
        """Queue ``batch`` (one ``UnitDecision`` per unit of ``units``, in order) for the
        leader; it is resent on every reconnect until answered."""
        self._batch_id += 1
        batch.batch_id = self._batch_id
        self._undecided[self._batch_id] = (batch, units)
        self._unsent.append(self._batch_id)
        self._send_wake.set()

    # -- the stream --------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep a stream to the current leader, for ever."""
        relook = Retry(Backoff(_RELOOK_SECONDS, cap=_RELOOK_MAX_SECONDS))
        while True:
            address = await self._leader_address()
            if address is None:
                await relook.sleep()
                continue
            try:
                await self._run_stream(address)
                log.info("binder stream ended; looking up the leader again", binder=address)
            except grpc.aio.AioRpcError as exc:
                log.info(
                    "binder stream failed; looking up the leader again",
                    binder=address,
                    code=exc.code().name,
                    details=exc.details(),
                )
            await relook.sleep()

    async def _leader_address(self) -> str | None:
        try:
            lease = await self._store.get_lease(BINDER_LEASE)
        except StoreError as exc:
            log.warning("cannot read the binder lease", error=str(exc))
            return None
        if lease is None or not lease.holder or not lease.holder_address:
            return None
        return lease.holder_address

    async def _run_stream(self, address: str) -> None:
        async with self._dial(address, CHANNEL_OPTIONS) as channel:
            call = internal_pb2_grpc.BinderStub(channel).Decide()
            # Everything not yet answered goes again, in order; the Binder answers duplicates of
            # already-bound pods with STALE.
            self._unsent = deque(sorted(self._undecided))
            self._written_at.clear()
            self._answered_write = 0
            writer = asyncio.create_task(self._write_batches(call))
            try:
                async for verdicts in call:
                    if await self.receive_in_slices(verdicts):
                        return  # NOT_LEADER: reconnect to the new leader
            finally:
                writer.cancel()
                # A write racing the call's end raises InvalidStateError ("RPC already
                # finished", e.g. when the Binder stepped down mid-stream): the stream is over
                # either way, and the loop looks the leader up again.
                with contextlib.suppress(
                    asyncio.CancelledError, grpc.aio.AioRpcError, asyncio.InvalidStateError
                ):
                    await writer

    async def _write_batches(self, call: Any) -> None:
        while True:
            while self._unsent:
                batch_id = self._unsent.popleft()
                entry = self._undecided.get(batch_id)
                if entry is not None:
                    await call.write(entry[0])
                    if batch_id not in self._written_at:
                        self._writes += 1
                        self._written_at[batch_id] = (time.monotonic(), self._writes)
            self._send_wake.clear()
            await self._send_wake.wait()

    # -- verdicts ----------------------------------------------------------------------------

    def receive(self, vb: ipb.VerdictBatch) -> bool:
        """Apply one VerdictBatch. Returns True when the Binder said it is not the leader (the
        batch stays undecided and is resent to the new leader)."""
        entry = self._take(vb)
        if isinstance(entry, bool):
            return entry
        for _ in self._apply(vb, *entry):
            pass
        return False

    async def receive_in_slices(self, vb: ipb.VerdictBatch) -> bool:
        """:meth:`receive`, handing the loop to others every ``VERDICT_SLICE_SECONDS``: the
        verdicts of a 100,000-pod unit applied at once held a shard's loop for seconds, past
        its heartbeat's grace. A unit is settled (queued again, or finished) only once all its
        verdicts are applied, so the cycle never takes it up half-answered."""
        entry = self._take(vb)
        if isinstance(entry, bool):
            return entry
        until = time.monotonic() + VERDICT_SLICE_SECONDS
        for _ in self._apply(vb, *entry):
            if time.monotonic() >= until:
                await asyncio.sleep(0)
                until = time.monotonic() + VERDICT_SLICE_SECONDS
        return False

    def _take(self, vb: ipb.VerdictBatch) -> tuple[ipb.DecisionBatch, list[U]] | bool:
        """The decisions ``vb`` answers, no longer undecided; True if the Binder said it is not
        the leader (they stay), False if they are not ours (answered already)."""
        entry = self._undecided.get(vb.batch_id)
        if entry is None:
            return False
        if vb.verdicts and all(v.code == ipb.NOT_LEADER for v in vb.verdicts):
            return True
        del self._undecided[vb.batch_id]
        written = self._written_at.pop(vb.batch_id, None)
        if written is not None:
            self._answered_write = max(self._answered_write, written[1])
        return entry

    def _apply(
        self, vb: ipb.VerdictBatch, batch: ipb.DecisionBatch, units: list[U]
    ) -> Iterator[None]:
        """Each placement's verdict to its unit, then each unit settled; pauses (yields) every
        ``_VERDICTS_PER_STEP`` placements, for a caller that looks at the clock."""
        got = {v.pod: v for v in vb.verdicts}
        handler = self._handler
        applied = 0
        for decision, unit in zip(batch.units, units, strict=True):
            for placement in decision.placements:
                applied += 1
                if applied % _VERDICTS_PER_STEP == 0:
                    yield
                pod = placement.pod
                verdict = got.get(pod)
                if verdict is None:
                    handler.rejected(
                        unit, pod, "binder: ERROR: no verdict from the binder", False, 0
                    )
                    continue
                code = verdict.code
                if code == ipb.BOUND:
                    handler.bound(unit, pod)
                    continue
                name = ipb.VerdictCode.Name(code) if code in _RETRY_CODES else str(code)
                handler.rejected(
                    unit,
                    pod,
                    f"binder: {name}: {verdict.reason}",
                    code in _CONFLICT_CODES,
                    verdict.resource_version,
                )
            handler.settled(unit)

    def reconcile(self) -> int:
        """Take back decisions the Binder received and never answered (a verdict lost while the
        stream stayed up: a reconnect resends everything by itself): unanswered for
        ``verdict_timeout_seconds`` although a decision written after them has been answered,
        so a Binder that is only slow is left alone. Their placements are rejected as by an
        ERROR verdict; a pod that did bind is found bound by the retry. Returns the number of
        decisions repaired."""
        deadline = time.monotonic() - self.verdict_timeout_seconds
        stuck = [
            batch_id
            for batch_id, (at, write) in self._written_at.items()
            if at <= deadline and write < self._answered_write
        ]
        repaired = 0
        for batch_id in stuck:
            entry = self._undecided.get(batch_id)
            if entry is None:
                self._written_at.pop(batch_id, None)
                continue
            repaired += 1
            batch, _ = entry
            reason = f"no verdict within {self.verdict_timeout_seconds:g}s (reconciler)"
            pods = [(d.job, p.pod) for d in batch.units for p in d.placements]
            self.receive(
                ipb.VerdictBatch(
                    batch_id=batch_id,
                    verdicts=[
                        ipb.PodVerdict(pod=pod, job=job, code=ipb.ERROR, reason=reason)
                        for job, pod in pods
                    ],
                )
            )
            self.repaired += 1
            log.warning(
                "reconciler: decision without a verdict taken back",
                batch_id=batch_id,
                pods=len(pods),
                repaired_total=self.repaired,
            )
        return repaired
