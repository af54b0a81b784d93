"""The node lifecycle controller: a node whose heartbeat lapsed is marked NotReady and its pods
fail (``NodeLost``), replaced when their job replaces lost pods."""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from google.protobuf.message import Message

from placement.claims import CLAIM_PHASES
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.controllers.podindex import PodIndex
from services.dispatcher.controllers.ticking import tick_forever
from services.eviction import NODE_LOST, evicted, replacement
from store import Store, StoreError
from store.client import Create, Op, Release, Update
from store.informer import Handlers, Informer

log = structlog.get_logger(__name__)


READY = "Ready"
HEARTBEAT_LAPSED = "NodeHeartbeatLapsed"


class NodeLifecycleController:
    """Marks nodes whose heartbeat lapsed NotReady and fails their pods (``NodeLost``), creating
    replacements for jobs with ``spec.replace_lost_pods``; marks them ready again when their
    heartbeat resumes (if the lapse was what made them NotReady).

    Heartbeats are read from the store's heartbeat hash (one read per tick, in the store's clock),
    not from Node objects, which the agents write only at registration. One atomic commit per lost
    node (node update, its pods' ``Release``s, the replacements), all nodes of a tick in one
    ``commit_many``. Every op is compare-and-set: a pod or node that changed since this view makes
    that node's commit fail, and the node is reconsidered on the next tick. Pods bound to a node
    that no longer exists are failed the same way.

    A node with no ``spec.agent`` that never heartbeated (created directly, e.g. by a test or a
    simulator) is left alone; any other node gets the grace from its last heartbeat, or from its
    creation until its first one.
    """

    def __init__(
        self,
        store: Store,
        informer: Informer,
        *,
        grace_seconds: float = 10.0,
        interval_seconds: float = 1.0,
        pods: PodIndex | None = None,
    ) -> None:
        self._store = store
        self._informer = informer
        self.grace_ms = int(grace_seconds * 1000)
        self.interval = interval_seconds
        self.pods = pods or PodIndex(informer)
        # Nodes NotReady because their heartbeat lapsed: the ones that may come back.
        self.lapsed: set[str] = set()
        informer.add_handlers(
            Handlers(
                on_add=self._on_node,
                on_update=lambda kind, _old, new: self._on_node(kind, new),
                on_delete=lambda kind, obj: self._on_node(kind, obj, deleted=True),
                kinds=frozenset({"Node"}),
            )
        )
        # Round trips, for tests and metrics.
        self.commit_calls = 0
        self.full_ticks = 0  # ticks that read every node's stamp

    def _on_node(self, kind: str, obj: Message, deleted: bool = False) -> None:
        if not isinstance(obj, pb.Node):
            return
        name = obj.metadata.name
        if not deleted and not obj.status.ready and _ready_reason(obj) == HEARTBEAT_LAPSED:
            self.lapsed.add(name)
        else:
            self.lapsed.discard(name)

    async def run(self) -> None:
        await tick_forever("node lifecycle", self._informer, self.tick, self.interval)

    async def tick(self) -> None:
        """One pass. Usually only the stale stamps and those of lapsed nodes travel and are
        looked at (a cluster of 20,000 healthy nodes costs one small round trip); every node is
        read when some node has no stamp at all (registered, not yet heartbeating)."""
        beats = await self._store.stale_heartbeats(self.grace_ms, sorted(self.lapsed))
        if beats.stamped < self._informer.count("Node"):
            await self._full_tick()
            return
        now = beats.now_ms
        commits: list[list[Op]] = []
        described: list[tuple[str, str, int]] = []  # (node, what, pods failed)
        gone: list[str] = []
        vanished = [n for n in self.pods.nodes_with_claims() if not self._informer.has("Node", n)]
        on = await self._pods_on([*beats.stale, *vanished])
        for name, last in beats.stale.items():
            node = self._informer.get("Node", name)
            if not isinstance(node, pb.Node):
                gone.append(name)  # a deleted node's stamp, lapsed
                continue
            ops = self._lost(node, now, last, on.get(name, ()))
            if ops:
                commits.append(ops)
                described.append((name, "lost", len(ops) - 1))
        for name, last in beats.named.items():
            node = self._informer.get("Node", name)
            if isinstance(node, pb.Node) and now - last <= self.grace_ms:
                commits.append([Update(_set_ready(node, True, now, "NodeHeartbeatResumed", ""))])
                described.append((name, "ready again", 0))
        await self._store.forget_heartbeats(gone)
        for name in vanished:
            ops = self._fail_pods(on.get(name, ()), now, f"node {name!r} no longer exists")
            if ops:
                commits.append(ops)
                described.append((name, "gone", len(ops)))
        await self._commit(commits, described)

    async def _full_tick(self) -> None:
        self.full_ticks += 1
        beats = await self._store.heartbeats()
        now = beats.now_ms  # the store's clock, like the heartbeats it compares against
        commits: list[list[Op]] = []
        described: list[tuple[str, str, int]] = []  # (node, what, pods failed)
        nodes = {n.metadata.name: n for n in self._nodes()}
        lost: dict[str, int] = {}  # node -> its last heartbeat, for those lost
        for name, node in nodes.items():
            # The heartbeat hash (server clock) when the agent has stamped it; the registration
            # time written on the Node (the agent's clock) only before that.
            last = beats.last_ms.get(name) or node.status.heartbeat_ms
            if not node.spec.agent and not last:
                continue  # no agent and never a heartbeat: not under heartbeat management
            # A new node gets the grace from its creation before its first heartbeat.
            last = last or node.metadata.creation_timestamp_ms
            if now - last > self.grace_ms:
                lost[name] = last
            elif not node.status.ready and _ready_reason(node) == HEARTBEAT_LAPSED:
                commits.append([Update(_set_ready(node, True, now, "NodeHeartbeatResumed", ""))])
                described.append((name, "ready again", 0))
        # Heartbeats of deleted nodes, once they lapsed (a node registering right now may be
        # stamped before this view sees its object).
        gone = [n for n, ms in beats.last_ms.items() if n not in nodes and now - ms > self.grace_ms]
        await self._store.forget_heartbeats(gone)
        vanished = [n for n in self.pods.nodes_with_claims() if n not in nodes]
        on = await self._pods_on([*lost, *vanished])
        for name, last in lost.items():
            ops = self._lost(nodes[name], now, last, on.get(name, ()))
            if ops:
                commits.append(ops)
                described.append((name, "lost", len(ops) - 1))
        for name in vanished:
            ops = self._fail_pods(on.get(name, ()), now, f"node {name!r} no longer exists")
            if ops:
                commits.append(ops)
                described.append((name, "gone", len(ops)))
        await self._commit(commits, described)

    async def _pods_on(self, nodes: Iterable[str]) -> dict[str, list[pb.Pod]]:
        """The pods holding a claim on ``nodes``, whole, by node: read from the store in one
        round trip (the view keeps a record of each, not its bytes), for the nodes some pod
        holds a claim on only (a node lost long ago, still stale, costs nothing)."""
        holding = self.pods.nodes_with_claims()
        wanted = {n for n in nodes if n in holding}
        if not wanted:
            return {}
        out: dict[str, list[pb.Pod]] = {}
        for pod in await self.pods.fetch(self.pods.names_on(wanted)):
            out.setdefault(pod.spec.node_name, []).append(pod)
        return out

    async def _commit(self, commits: list[list[Op]], described: list[tuple[str, str, int]]) -> None:
        if not commits:
            return
        self.commit_calls += 1
        results = await self._store.commit_many(commits)
        for (node_name, what, failed), result in zip(described, results, strict=True):
            if isinstance(result, StoreError):
                # Most often a heartbeat or a pod phase raced us: the next tick decides again.
                log.debug("node lifecycle commit skipped", node=node_name, error=str(result))
            elif what == "ready again":
                log.info("node ready again", node=node_name)
            else:
                log.warning("node lost", node=node_name, reason=what, pods_failed=failed)

    def _nodes(self) -> Iterable[pb.Node]:
        for obj in self._informer.list("Node"):
            assert isinstance(obj, pb.Node)
            yield obj

    def _lost(self, node: pb.Node, now: int, last: int, pods: Iterable[pb.Pod]) -> list[Op]:
        name = node.metadata.name
        ops: list[Op] = []
        if node.status.ready:
            age_s = (now - last) / 1000
            message = f"no heartbeat for {age_s:.1f}s (grace {self.grace_ms / 1000:g}s)"
            ops.append(Update(_set_ready(node, False, now, HEARTBEAT_LAPSED, message)))
        ops += self._fail_pods(pods, now, f"node {name!r} stopped heartbeating")
        return ops

    def _fail_pods(self, pods: Iterable[pb.Pod], now: int, message: str) -> list[Op]:
        """Fail ``pods`` (a node's, read whole from the store), each replaced when its job
        replaces lost pods."""
        ops: list[Op] = []
        taken: set[str] = set()  # replacement names used in this commit
        for pod in sorted(pods, key=lambda p: p.metadata.name):
            if pod.status.phase not in CLAIM_PHASES:
                continue
            ops.append(Release(evicted(pod, NODE_LOST, message, now)))
            job = self._informer.get("Job", pod.spec.job) if pod.spec.job else None
            if isinstance(job, pb.Job) and job.spec.replace_lost_pods:
                siblings = self.pods.outlines_of(pod.spec.job)  # names and indexes
                new = replacement(pod, siblings, taken)
                taken.add(new.metadata.name)
                ops.append(Create(new))
        return ops


def _ready_reason(node: pb.Node) -> str:
    for cond in node.status.conditions:
        if cond.type == READY:
            return cond.reason
    return ""


def _set_ready(node: pb.Node, ready: bool, now: int, reason: str, message: str) -> pb.Node:
    out = pb.Node()
    out.CopyFrom(node)
    out.status.ready = ready
    status = "True" if ready else "False"
    for cond in out.status.conditions:
        if cond.type == READY:
            if cond.status != status:
                cond.last_transition_ms = now
            cond.status, cond.reason, cond.message = status, reason, message
            return out
    out.status.conditions.append(
        pb.Condition(
            type=READY, status=status, reason=reason, message=message, last_transition_ms=now
        )
    )
    return out
