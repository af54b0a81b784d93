"""The dispatcher: the public entry point (submissions, logical queues, dispatch to shards).

For now the gRPC contract is registered with the generated base servicer, which answers every RPC
with UNIMPLEMENTED; the process already starts, connects the store and reports health.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from protos.godel.v1 import api_pb2, api_pb2_grpc
from services.runtime import Service, ServiceConfig


@dataclass(frozen=True)
class DispatcherConfig(ServiceConfig):
    """Dispatcher settings."""


class DispatcherService(Service[DispatcherConfig]):
    component = "dispatcher"
    config_class = DispatcherConfig
    grpc_services = (api_pb2.DESCRIPTOR.services_by_name["Dispatcher"].full_name,)

    def add_servicers(self, server: grpc.aio.Server) -> None:
        # The generated base servicer answers every RPC with UNIMPLEMENTED (its stub marks the
        # methods abstract, hence the ignore); the real servicer replaces it.
        servicer = api_pb2_grpc.DispatcherServicer()  # type: ignore[abstract]
        api_pb2_grpc.add_DispatcherServicer_to_server(servicer, server)
