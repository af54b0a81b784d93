"""A scheduler shard: schedules the units the dispatcher streams to it, sends decisions to the Binder.

For now the gRPC contract is registered with the generated base servicer, which answers every RPC
with UNIMPLEMENTED; the process already starts, connects the store and reports health.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from protos.godel.v1 import internal_pb2, internal_pb2_grpc
from services.runtime import Service, ServiceConfig


@dataclass(frozen=True)
class SchedulerConfig(ServiceConfig):
    """Scheduler settings."""


class SchedulerService(Service[SchedulerConfig]):
    component = "scheduler"
    config_class = SchedulerConfig
    grpc_services = (internal_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name,)

    def add_servicers(self, server: grpc.aio.Server) -> None:
        # The generated base servicer answers every RPC with UNIMPLEMENTED (its stub marks the
        # methods abstract, hence the ignore); the real servicer replaces it.
        servicer = internal_pb2_grpc.SchedulerServicer()  # type: ignore[abstract]
        internal_pb2_grpc.add_SchedulerServicer_to_server(servicer, server)
