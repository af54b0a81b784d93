"""NumaTopology: a pod's NUMA policy against a node's sockets and NUMA nodes (Gödel's
NonNativeTopology, reference/godel-scheduler.md §3.7), as a filter, a score, and the one choice
of NUMA ids that the shard proposes and the Binder verifies or makes.

Policies (``pb.NumaPolicy``, guaranteed pods only: best-effort pods use the reclaimable pool,
which no NUMA node backs):

- none: the pod takes the node's pool. On a node holding NUMA-bound pods it must also fit in
  what they leave: the pool minus whole exclusively held NUMA nodes minus single-NUMA pods'
  requests (Gödel's "shared cores must still fit in the remaining NUMAs").
- SINGLE: the pod's cpu, memory and GPUs come from one NUMA node that no pod holds
  exclusively; the best fit (least room left) is chosen.
- EXCLUSIVE: the pod gets whole NUMA nodes to itself — the fewest free ones (no single-NUMA pod
  on them, no other owner) of one socket whose capacity covers its request; a request that
  would need NUMA nodes of two sockets fails. Among sockets, the one left with the fewest free
  NUMA nodes (packing, so whole sockets stay free for large pods).

A node without a reported topology fails SINGLE and EXCLUSIVE pods for good (unresolvable); a
request larger than any NUMA node (SINGLE) or socket (EXCLUSIVE) too; everything else is
resolvable, so preemption may free NUMA nodes.

Differences from Gödel: no per-resource NUMA alignment list (GPUs are always aligned with the
pod's NUMA nodes), no cross-socket exclusive placement, and the score packs NUMA pods (Gödel
scores nothing for NUMA).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from placement.framework import FilterPlugin, NoArgs, PluginSpec, PodInfo, ScorePlugin, Status
from placement.nodeinfo import (
    GUARANTEED,
    NUMA_EXCLUSIVE,
    NUMA_SINGLE,
    NodeInfo,
    NumaZone,
    PodRequest,
)

NAME = "NumaTopology"

NO_TOPOLOGY = "node reports no NUMA topology"
EXCEEDS_NUMA_NODE = "request exceeds every NUMA node"
NO_NUMA_ROOM = "no NUMA node with room"
EXCEEDS_SOCKET = "request needs NUMA nodes of more than one socket"
NO_FREE_NUMA = "not enough free NUMA nodes on one socket"
NO_SHARED_ROOM = "insufficient room outside NUMA-bound pods"


@dataclass(frozen=True, slots=True)
class NumaFailure:
    reason: str
    unresolvable: bool = False


Choice = tuple[int, ...] | NumaFailure


def _covers(cpu: int, mem: int, gpu: int, req: PodRequest) -> bool:
    q = req.requests
    return q.cpu <= cpu and q.mem <= mem and q.gpus <= gpu


def _shared_room_left(
    node: NodeInfo, extra_owned: list[int], extra_single: PodRequest | None
) -> bool:
    """Whether the node's unbound ("shared") pods still fit in the pool once NUMA nodes of
    ``extra_owned`` capacity are held exclusively and ``extra_single`` is bound to one."""
    alloc, used = node.capacity[GUARANTEED], node.requested[GUARANTEED]
    bound = node.numa_bound
    held = _numa_held(node)
    q = extra_single.requests if extra_single else None
    add = (q.cpu, q.mem, q.gpus) if q else (0, 0, 0)
    for r in range(3):
        shared = used[r] - bound[r]
        if shared and shared + held[r] + extra_owned[r] + add[r] > alloc[r]:
            return False
    return True


def _numa_held(node: NodeInfo) -> list[int]:
    """[cpu, memory, gpus] of the guaranteed pool that NUMA-bound pods hold, out of the shared
    pods' reach: whole NUMA nodes held exclusively, and what single-NUMA pods use."""
    held = [0, 0, 0]
    for zone in node.numa:
        if zone.id in node.numa_owner:
            held[0] += zone.cpu
            held[1] += zone.mem
            held[2] += zone.gpu
    for u in node.numa_used.values():
        held[0] += u[0]
        held[1] += u[1]
        held[2] += u[2]
    return held


def choose(node: NodeInfo, req: PodRequest) -> Choice:
    """The NUMA ids ``req`` would hold on ``node`` (() for a pod bound to none), or why it cannot
    be placed there by its NUMA policy."""
    if req.pool != GUARANTEED:
        return ()
    policy = req.numa_policy
    if not policy:
        return _fits_shared(node, req)
    if not node.numa:
        return NumaFailure(NO_TOPOLOGY, unresolvable=True)
    if policy == NUMA_SINGLE:
        return _choose_single(node, req)
    return _choose_exclusive(node, req)


def _fits_shared(node: NodeInfo, req: PodRequest) -> Choice:
    if not node.numa_pods:  # nothing NUMA-bound here: the pool check says it all
        return ()
    alloc, used = node.capacity[GUARANTEED], node.requested[GUARANTEED]
    taken = _numa_held(node)
    bound = node.numa_bound
    q = req.requests
    for r, want in enumerate((q.cpu, q.mem, q.gpus)):
        if want and used[r] - bound[r] + taken[r] + want > alloc[r]:
            return NumaFailure(NO_SHARED_ROOM)
    return ()


def _choose_single(node: NodeInfo, req: PodRequest) -> Choice:
    best: tuple[int, int, int, int] | None = None
    big_enough = False
    q = req.requests
    for zone in node.numa:
        if not _covers(zone.cpu, zone.mem, zone.gpu, req):
            continue
        big_enough = True
        if zone.id in node.numa_owner:
            continue
        used = node.numa_used.get(zone.id)
        cpu, mem, gpu = (
            (zone.cpu - used[0], zone.mem - used[1], zone.gpu - used[2])
            if used
            else (zone.cpu, zone.mem, zone.gpu)
        )
        if not _covers(cpu, mem, gpu, req):
            continue
        key = (cpu - q.cpu, mem - q.mem, gpu - q.gpus, zone.id)  # best fit first
        if best is None or key < best:
            best = key
    if best is None:
        return NumaFailure(NO_NUMA_ROOM) if big_enough else NumaFailure(EXCEEDS_NUMA_NODE, True)
    if not _shared_room_left(node, [0, 0, 0], req):
        return NumaFailure(NO_SHARED_ROOM)
    return (best[3],)


def _fewest_covering(zones: list[NumaZone], req: PodRequest) -> list[NumaZone] | None:
    """The fewest of ``zones`` whose capacity together covers ``req`` (largest first)."""
    taken: list[NumaZone] = []
    cpu = mem = gpu = 0
    for zone in sorted(zones, key=lambda z: (-z.cpu, -z.mem, -z.gpu, z.id)):
        if _covers(cpu, mem, gpu, req):
            break
        taken.append(zone)
        cpu, mem, gpu = cpu + zone.cpu, mem + zone.mem, gpu + zone.gpu
    return taken if _covers(cpu, mem, gpu, req) else None


def _choose_exclusive(node: NodeInfo, req: PodRequest) -> Choice:
    sockets: dict[int, list[NumaZone]] = {}
    for zone in node.numa:
        sockets.setdefault(zone.socket, []).append(zone)
    best: tuple[int, int, int] | None = None
    chosen: list[NumaZone] = []
    big_enough = False
    for socket, zones in sorted(sockets.items()):
        if _fewest_covering(zones, req) is None:
            continue
        big_enough = True
        free = [z for z in zones if z.id not in node.numa_owner and z.id not in node.numa_used]
        taken = _fewest_covering(free, req)
        if taken is None:
            continue
        key = (len(taken), len(free) - len(taken), socket)
        if best is None or key < best:
            best, chosen = key, taken
    if best is None:
        return NumaFailure(NO_FREE_NUMA) if big_enough else NumaFailure(EXCEEDS_SOCKET, True)
    owned = [sum(z.cpu for z in chosen), sum(z.mem for z in chosen), sum(z.gpu for z in chosen)]
    if not _shared_room_left(node, owned, None):
        return NumaFailure(NO_SHARED_ROOM)
    return tuple(sorted(z.id for z in chosen))


def pin_numa(node: NodeInfo, req: PodRequest) -> PodRequest:
    """``req`` holding the NUMA nodes :func:`choose` picks on ``node`` (unchanged for a pod
    bound to none, or when none fit: the Binder then chooses or refuses)."""
    if not req.numa_policy:
        return req
    found = choose(node, req)
    return req.pinned(found) if isinstance(found, tuple) and found else req


def verify(node: NodeInfo, req: PodRequest, ids: tuple[int, ...]) -> str | None:
    """Why the NUMA ids a decision names for ``req`` cannot be held on ``node`` (None: they
    can): the Binder's check of a shard's proposal, and the audit's of a bound pod."""
    policy = req.numa_policy
    if not policy:
        return "the pod has no NUMA policy but NUMA nodes were assigned" if ids else None
    zones = {z.id: z for z in node.numa}
    missing = [i for i in ids if i not in zones]
    if missing:
        return f"no NUMA node {', '.join(map(str, missing))}"
    if not ids:
        return "no NUMA node assigned"
    for i in ids:
        owner = node.numa_owner.get(i)
        if owner is not None and owner != req.name:
            return f"NUMA node {i} is held exclusively by pod {owner!r}"
    if policy == NUMA_SINGLE:
        if len(ids) != 1:
            return f"a single-NUMA pod holds one NUMA node, not {len(ids)}"
        zone, used = zones[ids[0]], node.numa_used.get(ids[0], [0, 0, 0])
        if not _covers(zone.cpu - used[0], zone.mem - used[1], zone.gpu - used[2], req):
            return f"NUMA node {ids[0]} has no room for the pod"
        return None if _shared_room_left(node, [0, 0, 0], req) else NO_SHARED_ROOM
    chosen = [zones[i] for i in ids]
    if len({z.socket for z in chosen}) > 1:
        return f"NUMA nodes {', '.join(map(str, ids))} span more than one socket"
    busy = [i for i in ids if i in node.numa_used]
    if busy:
        return f"NUMA node {busy[0]} holds single-NUMA pods, it cannot be held exclusively"
    cpu, mem, gpu = (
        sum(z.cpu for z in chosen),
        sum(z.mem for z in chosen),
        sum(z.gpu for z in chosen),
    )
    if not _covers(cpu, mem, gpu, req):
        return f"NUMA nodes {', '.join(map(str, ids))} are too small for the pod"
    return None if _shared_room_left(node, [cpu, mem, gpu], None) else NO_SHARED_ROOM


class NumaTopology:
    NAME: ClassVar[str] = NAME

    def filter(self, pod: PodInfo, node: NodeInfo) -> Status | None:
        req = pod.req
        if not req.numa_policy and not node.numa_pods:
            return None  # the common case: nothing NUMA-bound on either side
        found = choose(node, req)
        if isinstance(found, NumaFailure):
            if found.unresolvable:
                return Status.unresolvable(found.reason, plugin=NAME)
            return Status.unschedulable(found.reason, plugin=NAME)
        return None

    def score(self, pod: PodInfo, node: NodeInfo) -> int:
        """Packs NUMA-bound pods: how full the NUMA nodes the pod would take end up (SINGLE: the
        chosen NUMA node's cpu and memory; EXCLUSIVE: the share of the node's NUMA nodes held),
        so whole NUMA nodes stay free for exclusive pods. 0 for other pods and misfits."""
        req = pod.req
        if not req.numa_policy:
            return 0
        found = choose(node, req)
        if isinstance(found, NumaFailure) or not found:
            return 0
        if req.numa_policy == NUMA_EXCLUSIVE:
            return 100 * (len(node.numa_owner) + len(found)) // len(node.numa)
        zone = next(z for z in node.numa if z.id == found[0])
        used = node.numa_used.get(zone.id, [0, 0, 0])
        parts = [
            100 * (used[r] + want) // cap
            for r, (want, cap) in enumerate(((req.cpu, zone.cpu), (req.mem, zone.mem)))
            if cap
        ]
        return sum(parts) // len(parts) if parts else 0


def new(_args: NoArgs) -> NumaTopology:
    return NumaTopology()


_check_filter: type[FilterPlugin] = NumaTopology
_check_score: type[ScorePlugin] = NumaTopology
SPEC = PluginSpec(NAME, NoArgs, new)
