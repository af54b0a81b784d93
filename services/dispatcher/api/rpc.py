"""What every RPC group of the API shares: answering with a gRPC status (``abort``), the two
refusals it raises (``Aborted``, ``Refused``), and a store error told as a field violation."""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from protos.godel.v1 import api_pb2
from services.dispatcher.api import validation as v
from store import AlreadyExistsError, CommitError, InvalidObjectError, StoreError


async def abort(context: Any, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("unreachable")  # context.abort raises


async def refuse_if(context: Any, refusal: str | None) -> None:
    if refusal is not None:
        await abort(context, grpc.StatusCode.PERMISSION_DENIED, refusal)


class Aborted(Exception):
    """A compare-and-set the client asked for failed: answered with ABORTED."""


class Refused(Exception):
    """The caller's identity may not do this (``tenancy``): answered with PERMISSION_DENIED."""


def store_violation(prefix: str, exc: StoreError) -> api_pb2.FieldViolation:
    cause = exc.cause if isinstance(exc, CommitError) else exc
    if isinstance(cause, AlreadyExistsError):
        what = "job" if cause.kind == "Job" else cause.kind.lower()
        return v.violation(
            f"{prefix}.metadata.name", f"AlreadyExists: {what} {cause.name!r} already exists"
        )
    if isinstance(cause, InvalidObjectError):
        field = f"{prefix}.{cause.field}" if cause.field else prefix
        return v.violation(field, cause.reason)
    return v.violation(prefix, f"the store rejected it: {cause}")
