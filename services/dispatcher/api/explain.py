"""Explain: why a pod is where it is — bound, ended, preempting (a nomination in flight),
unschedulable (the shard's last diagnosis), its gang timed out (``Timeout: ...``, with that
diagnosis), or where its unit waits in the dispatcher."""

from __future__ import annotations

from typing import Any

import grpc

from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services import tenancy
from services.dispatcher.api.rpc import abort, refuse_if
from services.dispatcher.controllers.gangtimeout import TIMEOUT_SUMMARY, timeout_condition
from services.dispatcher.dispatching.dispatch import UnitDispatcher
from services.dispatcher.dispatching.entries import is_pending
from services.runtime.auth import caller
from store import NotFoundError, Store, StoreUnavailableError


class ExplainRpc:
    def __init__(self, store: Store, core: UnitDispatcher) -> None:
        self.store = store
        self.core = core

    async def Explain(
        self, request: api_pb2.ExplainRequest, context: Any
    ) -> api_pb2.ExplainResponse:
        try:
            pod = await self.store.get(pb.Pod, request.pod)
        except NotFoundError as exc:
            await abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except StoreUnavailableError as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        await refuse_if(context, tenancy.read_refusal(caller(), "Pod", pod))
        return self.explain(pod)

    def explain(self, pod: pb.Pod) -> api_pb2.ExplainResponse:
        out = api_pb2.ExplainResponse(
            pod=pod.metadata.name,
            phase=pod.status.phase,
            node=pod.spec.node_name,
            scheduler=pod.status.scheduler,
        )
        if pod.status.phase in (pb.POD_SUCCEEDED, pb.POD_FAILED) and pod.status.reason:
            # Ended (an evicted pod keeps its node): why, and by whom (e.g. its preemptor).
            phase = pb.PodPhase.Name(pod.status.phase)
            out.summary = f"{phase}: {pod.status.reason}"
            if pod.status.message:
                out.summary += f": {pod.status.message}"
            return out
        if pod.spec.node_name:
            out.summary = f"bound to {pod.spec.node_name}"
            if pod.status.phase != pb.POD_BOUND:
                out.summary += f" ({pb.PodPhase.Name(pod.status.phase)})"
            return out
        if not is_pending(pod):
            phase = pb.PodPhase.Name(pod.status.phase)
            out.summary = f"{phase}: {pod.status.reason or pod.status.message or 'not scheduled'}"
            return out
        nomination = self.core.nominations.of(pod.spec.job, pod.metadata.name)
        if nomination is not None:
            # In flight with the Binder: an earlier attempt's condition is no longer the story.
            out.nominated_node = nomination.node
            out.victims.extend(nomination.victims)
            count = len(nomination.victims)
            out.summary = (
                f"preempting {count} pod{'' if count == 1 else 's'} on {nomination.node}: "
                + ", ".join(nomination.victims)
            )
            return out
        timed_out = self._timed_out(pod.spec.job)
        if timed_out is not None:
            # Not retried: the last attempt's diagnosis stays attached, the summary says why.
            out.summary = timed_out
        for cond in pod.status.conditions:
            if cond.type == "PodScheduled" and cond.status == "False":
                out.summary = timed_out or cond.message or cond.reason
                out.last_attempt_ms = cond.last_transition_ms
                if pod.status.HasField("unschedulable"):
                    # The shard's counts as it recorded them: no sentence is parsed back.
                    out.diagnosis.CopyFrom(pod.status.unschedulable)
                    out.total_nodes = pod.status.unschedulable.total_nodes
                    out.reasons.extend(pod.status.unschedulable.reasons)
                return out
        out.summary = timed_out or self.core.describe(pod.spec.job)
        return out

    def _timed_out(self, job_name: str) -> str | None:
        """Explain's words for a pod of a gang that timed out (None if its job did not)."""
        job = self.core.informer.get("Job", job_name)
        if not isinstance(job, pb.Job) or job.status.phase != pb.JOB_TIMEOUT:
            return None
        cond = timeout_condition(job)
        return f"{TIMEOUT_SUMMARY}{cond.message if cond is not None else 'not scheduled in time'}"
