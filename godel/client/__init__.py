"""The Python SDK of a Gödel cluster, and the protobuf client the CLI uses.

    from godel.client import GodelClient, job

    with GodelClient() as client:                # $GODEL_ADDRESS, else the `godel up` cluster
        train = client.submit(job("train", replicas=8, cpu="2", memory="4Gi"))
        train.wait("Running", timeout=60)
        for pod in train.pods():
            print(pod.name, pod.node)
        train.delete()

``AsyncGodelClient`` is the same API for asyncio (``await client.submit(...)``, ``async for
event in client.watch(...)``). Objects come back manifest-shaped (``godel.client.objects``);
failures are typed ClientErrors. See godel/README.md for the reference.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from foundation.tls import Credentials
    from godel.client._async import Applied, AsyncGodelClient, AsyncJobHandle, JobFailed
    from godel.client._proto import ProtoClient, ReschedulerClient, logs
    from godel.client._sync import GodelClient, JobHandle
    from godel.client._transport import (
        MAX_MESSAGE_BYTES,
        AlreadyExists,
        ClientError,
        ClusterNotFound,
        Conflict,
        DeadlineExceeded,
        Invalid,
        NotFound,
        PermissionDenied,
        Unauthenticated,
        Unavailable,
        Violation,
        discover,
        discover_credentials,
        local_address,
    )
    from godel.client.objects import (
        Event,
        Explanation,
        Job,
        Object,
        Pod,
        PriorityClass,
        Reservation,
        job,
        priority_class,
        reservation,
    )
    from store.kinds import unwrap, wrap

# Names are imported on first use: the CLI needs only the protobuf client (``_proto``), not the
# asyncio SDK, and a `godel get` should not pay for it.
_HOMES = {
    **dict.fromkeys(("Applied", "AsyncGodelClient", "AsyncJobHandle", "JobFailed"), "_async"),
    **dict.fromkeys(("ProtoClient", "ReschedulerClient", "logs", "unwrap", "wrap"), "_proto"),
    **dict.fromkeys(("GodelClient", "JobHandle"), "_sync"),
    **dict.fromkeys(
        (
            "MAX_MESSAGE_BYTES",
            "AlreadyExists",
            "ClientError",
            "ClusterNotFound",
            "Credentials",
            "Conflict",
            "DeadlineExceeded",
            "Invalid",
            "NotFound",
            "PermissionDenied",
            "Unauthenticated",
            "Unavailable",
            "Violation",
            "discover",
            "discover_credentials",
            "local_address",
        ),
        "_transport",
    ),
    **dict.fromkeys(
        (
            "Event",
            "Explanation",
            "Job",
            "Object",
            "Pod",
            "PriorityClass",
            "Reservation",
            "job",
            "priority_class",
            "reservation",
        ),
        "objects",
    ),
}


def __getattr__(name: str) -> Any:
    if name == "Credentials":  # the credentials= argument's type lives in the bottom library
        from foundation.tls import Credentials

        return Credentials
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "MAX_MESSAGE_BYTES",
    "AlreadyExists",
    "Applied",
    "AsyncGodelClient",
    "AsyncJobHandle",
    "ClientError",
    "ClusterNotFound",
    "Conflict",
    "Credentials",
    "DeadlineExceeded",
    "Event",
    "Explanation",
    "GodelClient",
    "Invalid",
    "Job",
    "JobFailed",
    "JobHandle",
    "NotFound",
    "Object",
    "PermissionDenied",
    "Pod",
    "PriorityClass",
    "ProtoClient",
    "ReschedulerClient",
    "Reservation",
    "Unauthenticated",
    "Unavailable",
    "Violation",
    "discover",
    "discover_credentials",
    "job",
    "local_address",
    "logs",
    "priority_class",
    "reservation",
    "unwrap",
    "wrap",
]
