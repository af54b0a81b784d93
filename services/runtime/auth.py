"""Who may call what: every call's identity comes from its verified client certificate.

The TLS handshake already refused anyone without a certificate of the cluster's CA (mutual TLS,
``foundation.tls``). This interceptor decides, per method, which roles and service kinds may call it
(``RULES``: the schedulers → Binder.Decide, the dispatcher → Scheduler.Dispatch, …) and makes
the caller's identity available to the servicer (:func:`caller`) for the finer, per-object rules
of the public API (a tenant reads only its own jobs). A refusal is PERMISSION_DENIED naming
the rule. In insecure mode (``--insecure``) there is no certificate and no interceptor: every
caller may do everything, and :func:`caller` is None.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from foundation.certnames import identity_of
from foundation.tls import CredentialsError, Identity
from services.runtime.interceptor import WrappingInterceptor


@dataclass(frozen=True)
class MethodRule:
    """Who may call the methods under ``prefix``; ``name`` is quoted in refusals. ``admits``
    holds roles (``admin``, ``tenant``, ``service``: any service) and service kinds as
    ``service:<kind>`` (a service certificate's name is its kind, ``foundation.tls``)."""

    prefix: str
    admits: frozenset[str]
    name: str
    says: str


_CLIENTS = frozenset({"admin", "tenant"})
_EVERYONE = frozenset({"service", "admin", "tenant"})
_PUBLIC = "the public API accepts the cluster's client identities"

RULES: tuple[MethodRule, ...] = (
    # Internal RPCs: each admits the service kinds that call it in the flow of a job, and no
    # other (a compromised dashboard or node agent cannot propose placements).
    MethodRule(
        "/godel.v1.Scheduler/Dispatch", frozenset({"service:dispatcher"}), "dispatch",
        "only the dispatcher hands units to a scheduler shard",
    ),
    MethodRule(
        "/godel.v1.Binder/Decide", frozenset({"service:scheduler"}), "decide",
        "only scheduler shards propose placements to the Binder",
    ),
    # What each of them may evict (a node agent: its own nodes' best-effort pods, for tidal
    # pressure) is the Binder's to judge: services/binder/evictrules.py.
    MethodRule(
        "/godel.v1.Binder/Evict",
        frozenset({"service:dispatcher", "service:rescheduler", "service:nodeagent", "admin"}),
        "evict",
        "evictions come from the dispatcher (reclaim, drain), the rescheduler, node agents "
        "(tidal pressure) and the admin",
    ),
    MethodRule("/godel.v1.Rescheduler/ListPolicies", _CLIENTS, "public-api", _PUBLIC),
    MethodRule(
        "/godel.v1.Rescheduler/", frozenset({"admin"}), "admin-only",
        "triggering and pausing rescheduling is for the admin identity",
    ),
    MethodRule("/godel.v1.Dispatcher/", _CLIENTS, "public-api", _PUBLIC),
    MethodRule("/godel.v1.NodeAgent/Logs", _CLIENTS, "public-api", _PUBLIC),
    MethodRule("/grpc.health.v1.Health/", _EVERYONE, "health", "anyone of the cluster"),
    MethodRule("/grpc.reflection.", _EVERYONE, "reflection", "anyone of the cluster"),
)  # fmt: skip
"""First match wins (so a method's own rule goes before its service's); a method no rule names
is refused (default-deny), so a new internal RPC admits no one until it is given a rule."""


def principals(identity: Identity) -> frozenset[str]:
    """What rules may name ``identity`` by: its role and, for a service, ``service:<kind>``."""
    if identity.role == "service":
        return frozenset({"service", f"service:{identity.name}"})
    return frozenset({identity.role})


_caller: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("caller", default=None)


def caller() -> Identity | None:
    """The identity of the call being served; None in insecure mode (no certificates)."""
    return _caller.get()


def rule_for(method: str) -> MethodRule | None:
    return next((rule for rule in RULES if method.startswith(rule.prefix)), None)


def refusal(method: str, identity: Identity) -> str | None:
    """Why ``identity`` may not call ``method`` (None: it may)."""
    rule = rule_for(method)
    if rule is None:
        return f"rule default-deny: no rule admits {method.lstrip('/')}"
    if principals(identity) & rule.admits:
        return None
    return (
        f"rule {rule.name}: {rule.says}; {identity.role} identity {identity.name!r} "
        f"may not call {method.lstrip('/')}"
    )


async def _identify(context: grpc.aio.ServicerContext[Any, Any], method: str) -> Identity:
    pems = context.auth_context().get("x509_pem_cert") or []
    if not pems:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED, "no client certificate: the cluster requires one"
        )
    try:
        identity = identity_of(bytes(pems[0]))
    except (CredentialsError, ValueError) as exc:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
    if (why := refusal(method, identity)) is not None:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
    return identity


class Authorize(WrappingInterceptor):
    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        return _wrap(handler, method)


def _wrap(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    kinds = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler),
        ("unary_stream", grpc.unary_stream_rpc_method_handler),
        ("stream_unary", grpc.stream_unary_rpc_method_handler),
        ("stream_stream", grpc.stream_stream_rpc_method_handler),
    )
    for attribute, make in kinds:
        behavior = getattr(handler, attribute)
        if behavior is not None:
            return make(
                _checked(behavior, method),
                handler.request_deserializer,
                handler.response_serializer,
            )
    return handler


def _checked(behavior: Any, method: str) -> Any:
    if inspect.isasyncgenfunction(behavior):

        async def stream(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            _caller.set(await _identify(context, method))
            async for response in behavior(request, context):
                yield response

        return stream

    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        _caller.set(await _identify(context, method))
        return await behavior(request, context)

    return call
