"""Undecodable requests are the caller's error: INVALID_ARGUMENT, not UNKNOWN.

grpc answers a request its deserializer cannot parse with UNKNOWN ("Exception deserializing
request!"), which reads as a server fault and tells the caller nothing. This interceptor wraps
every method's deserializer so garbage bytes become a marker instead of an exception, and the
method answers the marker with INVALID_ARGUMENT naming the message type. Only methods that take
one request get this: a streaming method may read its requests with ``context.read()`` (the
shards' Dispatch does), where a marker would reach it unchecked, so request streams — internal
ones, between services — keep the strict deserializer. Servicers never see the marker.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class _Undecodable:
    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except (DecodeError, ValueError, TypeError) as exc:
            return _Undecodable(str(exc) or type(exc).__name__)

    return decode


def _message_name(deserializer: Callable[[bytes], Any] | None) -> str:
    owner = getattr(deserializer, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", "the request message"))


async def _refuse(
    context: grpc.aio.ServicerContext[Any, Any], what: str, bad: _Undecodable
) -> None:
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT, f"request is not a valid {what}: {bad.error}"
    )


class RejectUndecodable(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc has no type information: its classes are Any
    def __init__(self) -> None:
        # Wrapped handlers by the handler grpc found: built once per method, not per call.
        self._wrapped: dict[int, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        cached = self._wrapped.get(id(handler))
        if cached is None or cached[0] is not handler:
            cached = self._wrapped[id(handler)] = (handler, _wrap(handler))
        return cached[1]


def _wrap(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    what = _message_name(handler.request_deserializer)
    decode = _lenient(handler.request_deserializer)
    serialize = handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            _unary(handler.unary_unary, what), decode, serialize
        )
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            _unary_stream(handler.unary_stream, what), decode, serialize
        )
    return handler


def _unary(behavior: Any, what: str) -> Any:
    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, _Undecodable):
            await _refuse(context, what, request)
        return await behavior(request, context)

    return call


def _unary_stream(behavior: Any, what: str) -> Any:
    if not inspect.isasyncgenfunction(behavior):  # writes with context.write()

        async def written(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, _Undecodable):
                await _refuse(context, what, request)
            return await behavior(request, context)

        return written

    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        if isinstance(request, _Undecodable):
            await _refuse(context, what, request)
        async for response in behavior(request, context):
            yield response

    return call
