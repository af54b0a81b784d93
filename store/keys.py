"""The key layout of one cluster in Redis. Every key of a cluster shares the hash tag
``{<cluster>}``, so a move to Redis Cluster keeps each multi-key script on one slot; spreading
kinds across slots later is a change here and in the scripts' KEYS, not in the services."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    cluster: str

    @property
    def _prefix(self) -> str:
        return f"godel:{{{self.cluster}}}"

    @property
    def pattern(self) -> str:
        """A glob matching every key of this cluster and no other's."""
        return f"{self._prefix}:*"

    @property
    def revision(self) -> str:
        """The global revision counter."""
        return f"{self._prefix}:rev"

    @property
    def feed(self) -> str:
        """The change feed: a stream whose entry IDs are ``<revision>-0``."""
        return f"{self._prefix}:feed"

    @property
    def accounting(self) -> str:
        """Node capacity and usage per pool: fields ``<node>|c.<pool>.<res>`` and ``|u.``."""
        return f"{self._prefix}:acct"

    @property
    def claims(self) -> str:
        """Which node (pool, amounts) each bound pod holds: field = pod name."""
        return f"{self._prefix}:claims"

    def data(self, kind: str) -> str:
        """Serialised objects of a kind: field = name."""
        return f"{self._prefix}:obj:{kind}"

    def versions(self, kind: str) -> str:
        """Resource versions of a kind's objects: field = name."""
        return f"{self._prefix}:rv:{kind}"

    @property
    def heartbeats(self) -> str:
        """Node heartbeats (server ms), outside the change feed: field = node name."""
        return f"{self._prefix}:heartbeats"

    @property
    def node_loads(self) -> str:
        """Nodes' measured load (serialised ``NodeLoad``), outside the change feed: field = node
        name."""
        return f"{self._prefix}:loads"

    @property
    def shard_heartbeats(self) -> str:
        """Scheduler shards' liveness stamps (server ms), outside the change feed: field =
        shard name (``store/pulse.py``)."""
        return f"{self._prefix}:heartbeats:shards"

    @property
    def replication_barrier(self) -> str:
        """Written only to wait behind it: a replica that has it has every earlier write."""
        return f"{self._prefix}:barrier"

    def lease(self, name: str) -> str:
        return f"{self._prefix}:lease:{name}"

    @property
    def no_lease(self) -> str:
        """Placeholder passed as the lease key of unfenced commits (never read)."""
        return f"{self._prefix}:lease:-"
