"""Reservations without a node, dispatched to the shards as one-pod units (``ReservationQueue``).

A reservation applied without ``spec.node`` is stored Pending; the shards place it as the pod it
stands for (``placement.reservations.as_pod``: the same filters and scores) and the Binder
commits it Reserved (``services/binder/reserve.py``). The dispatcher hands each to one shard at
a time, as a unit of one pod (``Unit.reservation``; its unit key on the shard link is its hold
name, which no job can have), and when the shard could not place it, backs it off (doubling,
capped, as a unit) and writes the shard's reason into its ``status.message``. A reservation
placed (``UNIT_DONE``) waits a moment for the informer to show it Reserved; one that shows
Reserved or goes is forgotten (revoked from its shard if it was there).

Synchronous and free of I/O (time comes in as arguments); state is rebuilt from the informer
alone, so a dispatcher restart loses none, and a shard lost puts its reservations back in line.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from foundation.retry import Backoff
from placement.reservations import awaits_placement, hold_name
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.entries import BackoffSettings


class Waiting(enum.Enum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    # Not placed by its last attempt: retried after ``not_before``.
    BACKOFF = "backoff"
    # Placed: waiting for the informer to show it Reserved (retried after ``not_before`` if
    # it never does, e.g. the Binder's verdict was lost; the Binder refuses a second placement).
    PLACED = "placed"


@dataclass(slots=True)
class ReservationEntry:
    name: str
    resource_version: int
    seq: int
    state: Waiting = Waiting.QUEUED
    shard: str = ""
    attempts: int = 0
    not_before: float = 0.0
    reason: str = ""

    @property
    def key(self) -> str:
        """Its unit key on a shard link and in outcomes: its hold name (no job's name)."""
        return hold_name(self.name)


class ReservationQueue:
    """The reservations awaiting a node, in arrival order, and where each stands."""

    def __init__(self, backoff: BackoffSettings) -> None:
        self.entries: dict[str, ReservationEntry] = {}
        self._by_key: dict[str, ReservationEntry] = {}
        self._backoff = Backoff(backoff.initial_seconds, cap=backoff.max_seconds)
        self._settle_seconds = backoff.initial_seconds
        self._seq = 0

    def __len__(self) -> int:
        return len(self.entries)

    def entry_of_key(self, key: str) -> ReservationEntry | None:
        return self._by_key.get(key)

    def seen(self, rsv: pb.Reservation) -> ReservationEntry | None:
        """The informer's view of ``rsv``: tracked while it awaits a node. Returns the entry
        it no longer needs (the caller revokes it from its shard if dispatched), else None."""
        name = rsv.metadata.name
        entry = self.entries.get(name)
        if not awaits_placement(rsv):
            return self.forget(name)
        if entry is None:
            self._seq += 1
            entry = ReservationEntry(name, rsv.metadata.resource_version, self._seq)
            self.entries[name] = entry
            self._by_key[entry.key] = entry
        entry.resource_version = rsv.metadata.resource_version
        return None

    def forget(self, name: str) -> ReservationEntry | None:
        entry = self.entries.pop(name, None)
        if entry is not None:
            del self._by_key[entry.key]
        return entry

    def ready(self, now: float) -> list[ReservationEntry]:
        """Those to dispatch now, in arrival order (a backoff or settle wait that ran out
        queues its entry again)."""
        out = []
        for entry in sorted(self.entries.values(), key=lambda e: e.seq):
            if entry.state in (Waiting.BACKOFF, Waiting.PLACED) and entry.not_before <= now:
                entry.state = Waiting.QUEUED
            if entry.state == Waiting.QUEUED:
                out.append(entry)
        return out

    def next_wake(self, now: float) -> float | None:
        """Seconds until a waiting entry is due (None: none waits)."""
        waits = [
            e.not_before - now
            for e in self.entries.values()
            if e.state in (Waiting.BACKOFF, Waiting.PLACED)
        ]
        return max(0.0, min(waits)) if waits else None

    def dispatched(self, entry: ReservationEntry, shard: str) -> ipb.Unit:
        """Count it as ``shard``'s; the unit that carries it."""
        entry.state = Waiting.DISPATCHED
        entry.shard = shard
        unit = ipb.Unit(reservation=entry.name)
        unit.pods.add(name=entry.key, resource_version=entry.resource_version)
        return unit

    def outcome(self, shard: str, outcome: ipb.UnitOutcome, now: float) -> ReservationEntry | None:
        """The shard's outcome for a reservation it held. Returns the entry when its reason
        is new (the caller writes it on the reservation), else None."""
        entry = self._by_key.get(outcome.job)
        if entry is None or entry.state != Waiting.DISPATCHED or entry.shard != shard:
            return None
        entry.shard = ""
        if outcome.code == ipb.UNIT_DONE:
            entry.attempts = 0
            entry.state = Waiting.PLACED
            entry.not_before = now + self._settle_seconds
            return None
        entry.attempts += 1
        entry.state = Waiting.BACKOFF
        entry.not_before = now + self._backoff.delay(entry.attempts - 1)
        reason = outcome.reason or "no node fits it"
        if reason == entry.reason:
            return None
        entry.reason = reason
        return entry

    def wake(self) -> int:
        """A node joined: those backing off try again now, as an infeasible unit does on a
        node change. Returns how many."""
        woken = 0
        for entry in self.entries.values():
            if entry.state == Waiting.BACKOFF:
                entry.state = Waiting.QUEUED
                woken += 1
        return woken

    def shard_lost(self, shard: str) -> int:
        """The shard is gone: what it held is queued again. Returns how many."""
        lost = 0
        for entry in self.entries.values():
            if entry.state == Waiting.DISPATCHED and entry.shard == shard:
                entry.state, entry.shard = Waiting.QUEUED, ""
                lost += 1
        return lost


def waiting_message(reason: str) -> str:
    """A reservation's ``status.message`` while no node fits it."""
    return f"not placed yet: {reason}"
