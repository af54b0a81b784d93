"""The nodes a node agent serves: their shape (capacity, pools, topology), labels and taints,
registration, and heartbeats.

The Node object is written only at registration (and when it went missing); heartbeats are
stamps in the store's heartbeat hash, outside the change feed, as Kubernetes keeps node leases
apart from Node objects. A Node write per heartbeat would flood every watcher at scale.

Plain builders (``hollow_nodes``, ``process_node``, ``parse_labels``, ``parse_taints``) are pure
so they can be table-tested; :class:`NodeSet` owns the stored copies and every Node write.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from placement import labels as label_syntax
from protos.godel.v1 import objects_pb2 as pb
from services.nodeagent.gpus import NO_GPUS, MachineGpus
from services.nodeagent.nodelist import ListedNode
from store import AlreadyExistsError, ConflictError, NotFoundError, Store, StoreError

log = structlog.get_logger(__name__)

GiB = 1 << 30
HOLLOW = "hollow"
PROCESS = "process"
ZONES = 4
READY = "Ready"

_TAINT_EFFECTS = {
    "noschedule": pb.NO_SCHEDULE,
    "prefernoschedule": pb.PREFER_NO_SCHEDULE,
    "noexecute": pb.NO_EXECUTE,
}
_INVALID_NAME_CHARS = re.compile(r"[^a-z0-9.-]+")


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class Shape:
    """The guaranteed capacity of one node and the share of it offered as reclaimable."""

    milli_cpu: int = 4000
    memory_bytes: int = 32 * GiB
    max_pods: int = 110
    gpus: int = 0
    reclaimable_percent: int = 50
    sockets: int = 2
    numa_per_socket: int = 1
    gpu_model: str = ""  # of every card (status.gpu_model); "" with no cards


def dns_name(text: str) -> str:
    """``text`` as a DNS-1123 name (hostnames may carry capitals or '_')."""
    name = _INVALID_NAME_CHARS.sub("-", text.lower()).strip("-.")
    return name[:200].rstrip("-.") or "node"


def machine_node_name(configured: str = "") -> str:
    """The name of the process node: as configured, else this machine's hostname."""
    return dns_name(configured or socket.gethostname())


def agent_nodes(
    prefix: str, process_node: str = "", listed: Sequence[str] | None = None
) -> list[str]:
    """The nodes an agent serves as its certificate names them (``tls.Identity.nodes``): its
    hollow nodes ``<prefix>-<i>`` as the prefix ``<prefix>-*`` (or, served from a node list,
    ``listed`` by name), and its process node (if any) by name."""
    hollow = list(listed) if listed is not None else [f"{dns_name(prefix)}-*"]
    return [*hollow, *([dns_name(process_node)] if process_node else [])]


def parse_labels(text: str) -> dict[str, str]:
    """``"zone=a,disk=ssd"`` → ``{"zone": "a", "disk": "ssd"}``; ValueError names a bad item."""
    labels: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"label {item!r} is not KEY=VALUE")
        key, value = key.strip(), value.strip()
        problem = label_syntax.key_problem(key) or label_syntax.value_problem(value)
        if problem is not None:
            raise ValueError(f"label {item!r}: {problem}")
        labels[key] = value
    return labels


def parse_taints(text: str) -> list[pb.Taint]:
    """``"gpu=true:NoSchedule,dedicated:NoExecute"`` → taints (effect names as Kubernetes spells
    them, case-insensitive); ValueError names a bad item."""
    taints: list[pb.Taint] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key_value, sep, effect = item.rpartition(":")
        effect_value = _TAINT_EFFECTS.get(effect.strip().lower())
        if not sep or effect_value is None:
            raise ValueError(
                f"taint {item!r} is not KEY[=VALUE]:EFFECT "
                "(EFFECT one of NoSchedule, PreferNoSchedule, NoExecute)"
            )
        key, _, value = key_value.partition("=")
        key, value = key.strip(), value.strip()
        if not key:
            raise ValueError(f"taint {item!r} has no key")
        # A taint's key and value have a label's syntax, as Kubernetes validates them.
        problem = label_syntax.key_problem(key) or label_syntax.value_problem(value)
        if problem is not None:
            raise ValueError(f"taint {item!r}: {problem}")
        taints.append(pb.Taint(key=key, value=value, effect=effect_value))
    return taints


def topology(capacity: pb.Resources, sockets: int, numa_per_socket: int = 1) -> pb.NodeTopology:
    """``sockets`` sockets of ``numa_per_socket`` NUMA nodes each (ids in order, socket
    ``id // numa_per_socket``), the capacity split evenly (the remainder goes to the last), so
    NUMA-aware placement has something real to divide."""
    sockets = max(1, sockets)
    zones = sockets * max(1, numa_per_socket)
    topo = pb.NodeTopology(sockets=sockets)
    for i in range(zones):
        last = i == zones - 1

        def share(total: int, last: bool = last) -> int:
            part = total // zones
            return total - part * (zones - 1) if last else part

        topo.numa_nodes.append(
            pb.NumaNode(
                id=i,
                socket=i // max(1, numa_per_socket),
                capacity=pb.Resources(
                    milli_cpu=share(capacity.milli_cpu),
                    memory_bytes=share(capacity.memory_bytes),
                    gpus=share(capacity.gpus),
                ),
            )
        )
    return topo


MODE_LABEL = "godel.io/mode"


def build_node(
    name: str,
    *,
    agent: str,
    mode: str,
    shape: Shape,
    labels: dict[str, str],
    taints: Sequence[pb.Taint],
    now: int,
) -> pb.Node:
    node = pb.Node(metadata=pb.ObjectMeta(name=name))
    node.metadata.labels.update(labels)
    # Lets a job choose real processes (or simulation): nodeSelector {godel.io/mode: process}.
    node.metadata.labels[MODE_LABEL] = mode
    node.spec.agent = agent
    node.spec.mode = mode
    node.spec.taints.extend(taints)
    set_status(node, shape, now)
    return node


def set_status(node: pb.Node, shape: Shape, now: int) -> None:
    """Capacity, pools, topology, and a fresh heartbeat."""
    status = node.status
    status.allocatable.CopyFrom(
        pb.Resources(
            milli_cpu=shape.milli_cpu,
            memory_bytes=shape.memory_bytes,
            gpus=shape.gpus,
            pods=shape.max_pods,
        )
    )
    pct = shape.reclaimable_percent
    status.reclaimable.CopyFrom(
        pb.Resources(
            milli_cpu=shape.milli_cpu * pct // 100,
            memory_bytes=shape.memory_bytes * pct // 100,
        )
    )
    status.topology.CopyFrom(topology(status.allocatable, shape.sockets, shape.numa_per_socket))
    status.gpu_model = shape.gpu_model if shape.gpus else ""
    mark_ready(node, now)


def mark_ready(node: pb.Node, now: int) -> None:
    """A heartbeat: ready, condition Ready=True (its transition time kept while unchanged)."""
    node.status.heartbeat_ms = now
    node.status.ready = True
    for cond in node.status.conditions:
        if cond.type == READY:
            if cond.status != "True":
                cond.status, cond.reason, cond.message = "True", "AgentHeartbeat", ""
                cond.last_transition_ms = now
            return
    node.status.conditions.append(
        pb.Condition(type=READY, status="True", reason="AgentHeartbeat", last_transition_ms=now)
    )


def hollow_nodes(
    count: int,
    *,
    prefix: str,
    agent: str,
    shape: Shape,
    labels: dict[str, str],
    taints: Sequence[pb.Taint],
    now: int,
) -> list[pb.Node]:
    """``count`` simulated nodes ``<prefix>-<i>``: the common labels, ``hostname=<name>`` and a
    ``zone`` cycling zone-0..zone-3 unless the labels fix one."""
    nodes = []
    for i in range(count):
        name = f"{prefix}-{i}"
        own = {"zone": f"zone-{i % ZONES}", **labels, "hostname": name}
        nodes.append(
            build_node(
                name, agent=agent, mode=HOLLOW, shape=shape, labels=own, taints=taints, now=now
            )
        )
    return nodes


def listed_nodes(
    listed: Sequence[ListedNode],
    *,
    agent: str,
    shape: Shape,
    labels: dict[str, str],
    taints: Sequence[pb.Taint],
    now: int,
) -> list[pb.Node]:
    """Simulated nodes of a node list (``nodelist.py``), each its row's name, cpu, memory, cards
    and model; the rest of ``shape`` (pod slots, reclaimable share, sockets) and the labels as
    ``hollow_nodes`` gives them."""
    nodes = []
    for i, row in enumerate(listed):
        own = replace(
            shape,
            milli_cpu=row.milli_cpu,
            memory_bytes=row.memory_bytes,
            gpus=row.gpus,
            gpu_model=row.gpu_model,
        )
        node_labels = {"zone": f"zone-{i % ZONES}", **labels, "hostname": row.name}
        nodes.append(
            build_node(
                row.name,
                agent=agent,
                mode=HOLLOW,
                shape=own,
                labels=node_labels,
                taints=taints,
                now=now,
            )
        )
    return nodes


@dataclass(frozen=True, slots=True)
class MachineNuma:
    """One NUMA node of this machine: its id, socket and the CPUs this agent may use there."""

    id: int
    socket: int
    cpus: tuple[int, ...]


def parse_cpulist(text: str) -> list[int]:
    """The kernel's cpulist format: ``"0-3,8,10-11"`` → [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def machine_numa(sysfs: Path = Path("/sys/devices/system")) -> list[MachineNuma]:
    """This machine's NUMA nodes from sysfs, each with the CPUs this process may run on; one
    NUMA node of every allowed CPU where sysfs does not say (other OSes, containers hiding it)."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not allowed:
        allowed = list(range(os.cpu_count() or 1))
    found: list[MachineNuma] = []
    try:
        for entry in sorted((sysfs / "node").glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
            cpus = [c for c in parse_cpulist((entry / "cpulist").read_text()) if c in allowed]
            if not cpus:
                continue  # memory-only NUMA node, or none of its CPUs are ours
            package = sysfs / "cpu" / f"cpu{cpus[0]}" / "topology" / "physical_package_id"
            socket = int(package.read_text()) if package.exists() else 0
            found.append(MachineNuma(int(entry.name[4:]), max(socket, 0), tuple(cpus)))
    except (OSError, ValueError):
        found = []
    return found or [MachineNuma(0, 0, tuple(allowed))]


def machine_topology(
    numa: Sequence[MachineNuma], memory_bytes: int, gpus: int = 0
) -> pb.NodeTopology:
    """The process node's topology: per NUMA node 1000 milli-CPU per CPU and a share of the
    memory by CPU count (the remainder to the last); its GPU cards split evenly (the remainder
    to the last: which NUMA node a card hangs off is not asked)."""
    total = sum(len(z.cpus) for z in numa) or 1
    topo = pb.NodeTopology(sockets=len({z.socket for z in numa}))
    given = 0
    for i, zone in enumerate(numa):
        mem = memory_bytes - given if i == len(numa) - 1 else memory_bytes * len(zone.cpus) // total
        given += mem
        cards = gpus // len(numa) + (gpus % len(numa) if i == len(numa) - 1 else 0)
        topo.numa_nodes.append(
            pb.NumaNode(
                id=zone.id,
                socket=zone.socket,
                capacity=pb.Resources(
                    milli_cpu=1000 * len(zone.cpus), memory_bytes=mem, gpus=cards
                ),
            )
        )
    return topo


def process_node(
    name: str,
    *,
    agent: str,
    cpus: int,
    memory_bytes: int,
    max_pods: int,
    reclaimable_percent: int,
    labels: dict[str, str],
    taints: Sequence[pb.Taint],
    now: int,
    numa: Sequence[MachineNuma] = (),
    gpus: MachineGpus = NO_GPUS,
) -> pb.Node:
    """This machine as a node: its real CPU count, memory and GPU cards (``gpus.machine_gpus``);
    its real NUMA nodes when given (``machine_numa``), else one socket of one NUMA node."""
    shape = Shape(
        milli_cpu=cpus * 1000,
        memory_bytes=memory_bytes,
        max_pods=max_pods,
        gpus=gpus.cards,
        gpu_model=gpus.model,
        reclaimable_percent=reclaimable_percent,
        sockets=1,
    )
    own = {"zone": "zone-0", **labels, "hostname": name}
    node = build_node(
        name, agent=agent, mode=PROCESS, shape=shape, labels=own, taints=taints, now=now
    )
    if numa:
        node.status.topology.CopyFrom(machine_topology(numa, memory_bytes, gpus.cards))
    return node


class NodeSet:
    """The stored copies of this agent's nodes, their registration and their heartbeats.

    Registration of a node that already exists (an agent restart) re-reads it and writes it
    compare-and-set with this agent's spec and status, keeping the fields other writers own
    (labels they added, conditions); a conflict re-reads and writes again.
    """

    def __init__(self, store: Store, desired: Iterable[pb.Node]) -> None:
        self._store = store
        self.desired = {n.metadata.name: n for n in desired}
        self.stored: dict[str, pb.Node] = {}
        self.mode = {name: n.spec.mode for name, n in self.desired.items()}
        self.heartbeats = 0  # heartbeat round trips, for tests and metrics

    def names(self) -> set[str]:
        return set(self.desired)

    async def register(self) -> None:
        """Create every node; one that already exists (an agent restart) is updated to this
        agent's spec and status, keeping labels and cordons that others set."""
        now = now_ms()
        fresh = [_copy(n) for n in self.desired.values()]
        for n in fresh:
            mark_ready(n, now)
        existing: list[str] = []
        for node, result in zip(fresh, await self._store.create_many(fresh), strict=True):
            if isinstance(result, AlreadyExistsError):
                existing.append(node.metadata.name)
            elif isinstance(result, StoreError):
                raise result
            else:
                self.stored[node.metadata.name] = node
        if existing:
            await self._update_existing(existing)
        await self._store.record_heartbeats(list(self.desired))
        log.info(
            "nodes registered",
            nodes=len(self.desired),
            created=len(self.desired) - len(existing),
            updated=len(existing),
        )

    async def _update_existing(self, names: list[str]) -> None:
        for _ in range(5):  # a node may change between our read and our write
            current = await self._store.get_many(pb.Node, names)
            updates: list[pb.Node] = []
            creates: list[pb.Node] = []
            for name, node in zip(names, current, strict=True):
                if node is None:
                    creates.append(_copy(self.desired[name]))
                    continue
                updates.append(self._merged(node))
            retry: list[str] = []
            results = await self._store.update_many(updates) + await self._store.create_many(
                creates
            )
            for node, result in zip(updates + creates, results, strict=True):
                if isinstance(result, ConflictError | AlreadyExistsError | NotFoundError):
                    retry.append(node.metadata.name)
                elif isinstance(result, StoreError):
                    raise result
                else:
                    self.stored[node.metadata.name] = node
            if not retry:
                return
            names = retry
        raise StoreError(f"nodes {names} kept changing while being registered")

    def _merged(self, stored: pb.Node) -> pb.Node:
        """The stored node with this agent's spec, labels, taints and status applied."""
        want = self.desired[stored.metadata.name]
        node = _copy(stored)
        node.metadata.labels.update(want.metadata.labels)
        node.spec.agent, node.spec.mode = want.spec.agent, want.spec.mode
        node.spec.agent_address = want.spec.agent_address
        del node.spec.taints[:]
        node.spec.taints.extend(want.spec.taints)
        conditions = list(node.status.conditions)
        node.status.CopyFrom(want.status)
        del node.status.conditions[:]
        node.status.conditions.extend(conditions)
        mark_ready(node, now_ms())
        return node

    async def heartbeat(self) -> None:
        """One heartbeat for every node, in one round trip outside the change feed (so it wakes
        no watcher); nodes deleted behind our back are registered again."""
        self.heartbeats += 1
        missing = await self._store.record_heartbeats(list(self.desired))
        if missing:
            log.info("nodes missing from the store; registering them again", nodes=len(missing))
            for name in missing:
                self.stored.pop(name, None)
            await self._update_existing(missing)
            await self._store.record_heartbeats(missing)


def _copy(node: pb.Node) -> pb.Node:
    out = pb.Node()
    out.CopyFrom(node)
    return out
