"""What the store keeps per node besides its object: heartbeats (``lua/heartbeat.lua``) and the
accounting of capacity and claims that commits maintain."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.typing import EncodableT, FieldT

from protos.godel.v1 import objects_pb2 as pb
from store.connection import StoreConnection, read_with_retry, translate_errors
from store.metrics import HEARTBEAT_ROUND_TRIP


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """A node's capacity and bound usage as the store accounts them, per pool."""

    capacity: dict[str, int]
    used: dict[str, int]


@dataclass(frozen=True, slots=True)
class Heartbeats:
    """Nodes' last heartbeats and the time they were read, all in the store server's clock."""

    now_ms: int
    last_ms: dict[str, int]


@dataclass(frozen=True)
class StaleBeats:
    """What :meth:`Store.stale_heartbeats` read, in the store server's clock."""

    now_ms: int
    stamped: int  # nodes with a heartbeat stamp
    stale: dict[str, int]  # the stamps older than asked
    named: dict[str, int]  # the stamps of the nodes asked about (any age)


class NodeHeartbeats(StoreConnection):
    """Node heartbeats: server-time stamps kept outside the change feed (like Kubernetes' node
    leases: heartbeats must not wake every watcher)."""

    async def record_heartbeats(self, nodes: Sequence[str]) -> list[str]:
        """Stamp the named nodes with the server's time, in one round trip. Returns the names
        with no Node object (deleted or never created): they get no heartbeat."""
        if not nodes:
            return []
        reply = await self._heartbeat(["record", *nodes])
        return [name.decode() for name in reply[1:]]

    async def heartbeats(self) -> Heartbeats:
        """Every node's last heartbeat and the server's time now, in one round trip."""
        reply = await self._heartbeat(["read"])
        flat = reply[1:]
        last = {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}
        return Heartbeats(now_ms=int(reply[0]), last_ms=last)

    async def stale_heartbeats(self, older_than_ms: int, nodes: Sequence[str] = ()) -> StaleBeats:
        """The heartbeats older than ``older_than_ms``, the stamps of ``nodes`` whatever their
        age, and how many nodes have a stamp, in one round trip: a lifecycle tick that moves
        only the few it acts on, not every node's stamp."""
        reply = await self._heartbeat(["stale", str(older_than_ms), *nodes])
        now, stamped, count = int(reply[0]), int(reply[1]), int(reply[2])
        flat = reply[3:]
        pairs = [(flat[i].decode(), int(flat[i + 1])) for i in range(0, len(flat), 2)]
        return StaleBeats(
            now_ms=now, stamped=stamped, stale=dict(pairs[:count]), named=dict(pairs[count:])
        )

    async def forget_heartbeats(self, nodes: Sequence[str]) -> None:
        """Drop the heartbeats (and the measured loads) of nodes that are gone."""
        if nodes:
            await self._heartbeat(["forget", *nodes])
            with translate_errors():
                await self._redis.hdel(self.keys.node_loads, *nodes)

    async def record_node_loads(self, loads: Mapping[str, pb.NodeLoad]) -> None:
        """Nodes' measured load, in one round trip outside the change feed (like heartbeats:
        a load changes every few seconds and must wake no watcher)."""
        if not loads:
            return
        mapping: dict[FieldT, EncodableT] = {
            name: load.SerializeToString() for name, load in loads.items()
        }
        with translate_errors():
            await self._redis.hset(self.keys.node_loads, mapping=mapping)

    async def node_loads(self, nodes: Sequence[str] = ()) -> dict[str, pb.NodeLoad]:
        """The last reported load of the named nodes (none named: of every node), in one round
        trip; a node without a report is left out."""
        if not nodes:
            raw: Any = await read_with_retry(lambda: self._redis.hgetall(self.keys.node_loads))
            return {name.decode(): pb.NodeLoad.FromString(value) for name, value in raw.items()}
        names = list(nodes)
        values: Any = await read_with_retry(lambda: self._redis.hmget(self.keys.node_loads, names))
        return {
            name: pb.NodeLoad.FromString(value)
            for name, value in zip(names, values, strict=True)
            if value is not None
        }

    async def _heartbeat(self, args: list[str]) -> Any:
        with translate_errors(), HEARTBEAT_ROUND_TRIP.time():
            return await self._heartbeat_script(
                keys=[self.keys.heartbeats, self.keys.versions("Node")], args=args
            )


class NodeAccounting(StoreConnection):
    """Node accounting, the read side (claims are written only inside commits)."""

    async def node_usage(self, node: str) -> NodeUsage | None:
        fields = ["c.g.cpu", "c.g.mem", "c.g.gpu", "c.be.cpu", "c.be.mem", "c.be.gpu", "c.pods"]
        fields += ["u" + f[1:] for f in fields]
        with translate_errors():
            keys = [f"{node}|{f}" for f in fields]
            values: Any = await self._redis.hmget(self.keys.accounting, keys)
        if values[0] is None:
            return None
        capacity = {f[2:]: int(v or 0) for f, v in zip(fields[:7], values[:7], strict=True)}
        used = {f[2:]: int(v or 0) for f, v in zip(fields[7:], values[7:], strict=True)}
        return NodeUsage(capacity, used)

    async def claim_count(self) -> int:
        """How many pods hold a node claim (bound or running): one cheap read, for sampling."""
        return int(await read_with_retry(lambda: self._redis.hlen(self.keys.claims)))

    async def claims(self) -> dict[str, str]:
        """Every bound pod's claim: pod name -> "node pool cpu mem gpu" (gpu in milli-GPU)."""
        with translate_errors():
            raw: Any = await self._redis.hgetall(self.keys.claims)
        return {k.decode(): v.decode() for k, v in raw.items()}
