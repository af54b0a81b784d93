"""The shape of the runtime's server interceptors (``auth.Authorize``,
``decoding.RejectUndecodable``): each replaces a method's handler by one wrapped around it, built
once per handler grpc finds, not once per call."""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable

import grpc


class WrappingInterceptor(grpc.aio.ServerInterceptor, abc.ABC):  # type: ignore[misc]  # grpc ships no type hints
    def __init__(self) -> None:
        # Wrapped handlers by the handler grpc found: built once per method, not per call.
        self._wrapped: dict[int, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def wraps(self, handler: grpc.RpcMethodHandler) -> bool:
        """Whether this interceptor wraps ``handler`` at all (else it is served as it is)."""
        return True

    @abc.abstractmethod
    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """The handler serving ``method`` in place of ``handler``."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or not self.wraps(handler):
            return handler
        cached = self._wrapped.get(id(handler))
        if cached is None or cached[0] is not handler:
            method: str = handler_call_details.method
            cached = self._wrapped[id(handler)] = (handler, self.wrap(handler, method))
        return cached[1]
