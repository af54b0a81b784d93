"""RetryJob: a gang whose scheduling timed out (phase Timeout) starts again — Pending, its
schedule timer restarted (``gangtimeout.restarted``), its pods dispatched again once the
dispatcher sees the change. A job in any other phase is refused (FAILED_PRECONDITION), naming
its phase. A tenant retries only its own jobs, as it applies over them."""

from __future__ import annotations

import time
from typing import Any

import grpc

from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services import tenancy
from services.dispatcher.api.rpc import abort, refuse_if
from services.dispatcher.controllers.gangtimeout import restarted
from services.runtime.auth import caller
from store import ConflictError, NotFoundError, Store, StoreUnavailableError

# A concurrent write of the job (its status controller) is merged again this many times.
_CAS_RETRIES = 5


class RetryRpc:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def RetryJob(
        self, request: api_pb2.RetryJobRequest, context: Any
    ) -> api_pb2.RetryJobResponse:
        if not request.name:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "name: required")
        try:
            for _ in range(_CAS_RETRIES):
                job = await self.store.get(pb.Job, request.name)
                await refuse_if(context, tenancy.apply_over_refusal(caller(), "Job", job))
                if job.status.phase != pb.JOB_TIMEOUT:
                    phase = pb.JobPhase.Name(job.status.phase or pb.JOB_PENDING).removeprefix(
                        "JOB_"
                    )
                    await abort(
                        context,
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"job {request.name!r} is {phase.capitalize()}: only a job whose scheduling timed out"
                        " (Timeout) is retried",
                    )
                try:
                    stored = await self.store.update(restarted(job, int(time.time() * 1000)))
                except ConflictError:
                    continue  # its status changed meanwhile: read it again
                return api_pb2.RetryJobResponse(job=stored)
        except NotFoundError as exc:
            await abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except StoreUnavailableError as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(exc))
        await abort(context, grpc.StatusCode.ABORTED, f"job {request.name!r} kept changing")
