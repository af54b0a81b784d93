"""Admission limits by caller: how many pods one job may have, and how many live pods one tenant
may hold, so that no tenant can swamp the cluster by default (a 100,000-replica job of anyone
was accepted, and kept the dispatcher busy for minutes).

| limit (``DispatcherConfig``, where the defaults are) | whom |
|---|---|
| ``max_replicas`` | a tenant's job |
| ``admin_max_replicas`` | the admin's job (everyone's, in a cluster without TLS) |
| ``max_pods_per_tenant`` | a tenant's live pods (not Succeeded or Failed); the admin has none |

A tenant's live pods are counted from the dispatcher's informer as pods come, change phase and
go (``TenantPods``: a counter per tenant, no scan per Submit). That view trails the store by
the watch's delay, so each tenant's Submits take turns (``TenantTurns``), each judged once the
view holds what the tenant's previous one stored: two quick submissions cannot both pass a
limit that only one of them fits under.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from foundation.tls import Identity
from placement.claims import TERMINAL_PHASES
from protos.godel.v1 import objects_pb2 as pb
from services import tenancy
from store import Store, StoreError
from store.informer import Handlers, Informer

# How long a tenant's Submit waits for the dispatcher's view to hold the tenant's previous one
# before it is refused as UNAVAILABLE (retried by clients; nothing is stored).
CATCH_UP_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """The dispatcher's admission limits (its settings of the same names)."""

    max_replicas: int
    admin_max_replicas: int
    max_pods_per_tenant: int

    def replicas_for(self, identity: Identity | None) -> tuple[int, str]:
        """The most pods one job of ``identity`` may have, and the setting that says so."""
        if tenancy.unrestricted(identity):
            return self.admin_max_replicas, "admin_max_replicas"
        return self.max_replicas, "max_replicas"


def _live(pod: pb.Pod) -> bool:
    return bool(pod.metadata.owner) and pod.status.phase not in TERMINAL_PHASES


class TenantPods:
    """Each tenant's live pods (``metadata.owner``; not Succeeded or Failed), kept from the
    informer's pod events: one counter per tenant, O(1) per event and per read."""

    def __init__(
        self, informer: Informer, live_on_nodes: Callable[[], Counter[str]] | None = None
    ) -> None:
        """``live_on_nodes``: the live pods kept as records per owner
        (``PodIndex.live_on_nodes_by_owner``), counted from there once a listing is handed
        over, not pod by pod."""
        self._live: Counter[str] = Counter()
        self._live_on_nodes = live_on_nodes
        handlers = Handlers.of(
            pb.Pod,
            on_add=self._on_add,
            on_update=self._on_update,
            on_delete=lambda _, pod: self._count(pod, -1),
        )
        if live_on_nodes is not None:
            handlers.on_listed = self._on_listed
            handlers.refused_at_listing = False
        informer.add_handlers(handlers)

    def _on_listed(self, _kind: str) -> None:
        assert self._live_on_nodes is not None
        for owner, pods in self._live_on_nodes().items():
            if owner:  # the admin's pods are not counted
                self._live[owner] += pods

    def of(self, tenant: str) -> int:
        return self._live[tenant]

    def _on_add(self, _kind: str, pod: pb.Pod) -> None:
        # ``_count(pod, 1)`` with the owner read once: every pod listed at a (re)start.
        owner = pod.metadata.owner
        if owner and pod.status.phase not in TERMINAL_PHASES:
            self._live[owner] += 1

    def _on_update(self, _kind: str, old: pb.Pod, new: pb.Pod) -> None:
        owner = new.metadata.owner
        if not owner and not old.metadata.owner:
            return  # the admin's pods are not counted
        if old.metadata.owner == owner and _live(old) == _live(new):
            return  # counted as it was (bound, running: most updates)
        self._count(old, -1)
        self._count(new, 1)

    def _count(self, pod: pb.Pod, delta: int) -> None:
        if _live(pod):
            owner = pod.metadata.owner
            self._live[owner] += delta
            if not self._live[owner]:
                del self._live[owner]


class ViewBehindError(Exception):
    """The dispatcher's view did not reach what the tenant stored last in time."""


class TenantTurns:
    """One Submit of a tenant at a time, each judged on a view that holds what the tenant's
    previous Submit stored (:meth:`turn`). Other tenants and the admin do not wait."""

    def __init__(self, store: Store, informer: Informer) -> None:
        self._store = store
        self._informer = informer
        self._locks: dict[str, asyncio.Lock] = {}
        # Per tenant: the store's revision once its last Submit had stored its jobs.
        self._stored_through: dict[str, int] = {}

    @asynccontextmanager
    async def turn(self, tenant: str) -> AsyncIterator[None]:
        """The tenant's turn; raises ViewBehindError if the view lags more than
        ``CATCH_UP_SECONDS`` behind what the tenant's previous turn stored."""
        lock = self._locks.setdefault(tenant, asyncio.Lock())
        async with lock:
            through = self._stored_through.get(tenant, 0)
            try:
                await self._informer.wait_for_revision(through, CATCH_UP_SECONDS)
            except TimeoutError as exc:
                raise ViewBehindError(
                    f"the dispatcher's view of the store is behind (at revision "
                    f"{self._informer.revision}; tenant {tenant!r} stored through {through}): "
                    "its live pods cannot be counted yet; retry"
                ) from exc
            try:
                yield
            finally:
                # Whatever the turn stored (even if it failed midway) is in the store by now.
                with contextlib.suppress(StoreError):
                    self._stored_through[tenant] = await self._store.revision()
