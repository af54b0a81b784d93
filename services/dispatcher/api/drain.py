"""Drain: cordon a node, then evict each of its pods through the Binder (the one eviction
path, which charges disruption budgets), one partial request: a pod its budget protects waits
without holding back the others."""

from __future__ import annotations

from typing import Any

import grpc
import structlog

from placement.claims import holds_claim
from protos.godel.v1 import api_pb2
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services import tenancy
from services.dispatcher.api.rpc import abort, refuse_if
from services.dispatcher.dispatching.dispatch import UnitDispatcher
from services.eviction import DRAINED
from services.peers.binder import EvictError
from services.runtime.auth import caller
from store import ConflictError, NotFoundError, Store, StoreUnavailableError

log = structlog.get_logger(__name__)


class DrainRpc:
    def __init__(self, store: Store, core: UnitDispatcher) -> None:
        self.store = store
        self.core = core

    async def Drain(self, request: api_pb2.DrainRequest, context: Any) -> api_pb2.DrainResponse:
        # Before anything is read: a refused caller learns nothing of the node or its pods.
        await refuse_if(context, tenancy.drain_refusal(caller()))
        try:
            return await self._drain(request)
        except NotFoundError as exc:
            await abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except ConflictError as exc:
            await abort(context, grpc.StatusCode.ABORTED, str(exc))
        except EvictError as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        except StoreUnavailableError as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))

    async def _drain(self, request: api_pb2.DrainRequest) -> api_pb2.DrainResponse:
        """Cordon the node, then evict each of its pods through the Binder (the one eviction
        path, which charges disruption budgets): one request per pod, so a pod its budget
        protects now waits without holding back the others."""
        node = await self.store.get(pb.Node, request.node)
        out = api_pb2.DrainResponse()
        if not node.spec.unschedulable and not request.dry_run:
            node.spec.unschedulable = True
            await self.store.update(node)
            out.cordoned = True
        # Its pods holding a claim, by the dispatcher's claims (it keeps no pod on a node
        # whole), read from the store in one round trip.
        names = sorted(c.name for c in self.core.queue.claims_on({request.node}))
        pods = [
            p
            for p in await self.store.get_many(pb.Pod, names)
            if p is not None and p.spec.node_name == request.node and holds_claim(p)
        ]
        if request.dry_run:
            for pod in pods:
                out.pods.add(pod=pod.metadata.name, outcome="would evict")
        elif pods:
            evictor = self.core.evictor
            if evictor is None:
                raise EvictError("this dispatcher has no way to reach the Binder")
            # One partial request: each pod its disruption budgets allow goes, the rest wait.
            response = await evictor.evict(
                ipb.EvictRequest(
                    pods=[ipb.PodRef(name=p.metadata.name, uid=p.metadata.uid) for p in pods],
                    reason=DRAINED,
                    message=f"node {request.node} drained",
                    partial=True,
                )
            )
            for result in response.results:
                if result.outcome == ipb.EvictResult.EVICTED:
                    out.pods.add(pod=result.pod, outcome="evicted", replacement=result.replacement)
                elif result.outcome == ipb.EvictResult.REFUSED:
                    out.pods.add(pod=result.pod, outcome="waiting", reason=result.reason)
        log.info(
            "drain",
            node=request.node,
            evicted=sum(p.outcome == "evicted" for p in out.pods),
            waiting=sum(p.outcome == "waiting" for p in out.pods),
        )
        return out
