"""Who may evict what through ``Binder.Evict``, by the caller's certificate.

Which identities may call ``Evict`` at all is the method rule (``services.runtime.auth``, rule
``evict``: the dispatcher, the rescheduler, node agents and the admin). Here is what each may ask
of it, checked against the Binder's own view of the pods, just before the commit that would
evict them:

| rule | who | what |
|---|---|---|
| ``evict-requester`` | every identity | ``requester`` names the caller: its kind (``rescheduler``, ``rescheduler/<instance>``), ``nodeagent/<agent>`` for a node agent, the admin's name; left empty, the Binder writes it |
| ``evict-reasons`` | services | each kind evicts for its own job only: the dispatcher ``Reclaimed`` (quota) and ``Drained``, the rescheduler ``Rescheduled``, a node agent ``Reclaimed`` (tidal pressure) |
| ``evict-own-nodes`` | node agents | only pods bound to the nodes its certificate names (``tls.Identity.nodes``); a node-agent certificate naming no agent (the one all agents shared before) evicts nothing |
| ``evict-best-effort`` | node agents | only best-effort pods: the tide takes back the reclaimable pool, never a guaranteed pod |

The admin evicts anything, for any reason. With no identity (``--insecure``) every caller may do
everything, as everywhere. A refusal refuses the whole request (``PERMISSION_DENIED`` naming the
rule) and evicts nothing. Pure and synchronous: the caller passes the pods as the Binder sees
them.
"""

from __future__ import annotations

from collections.abc import Callable

from foundation.tls import NODEAGENT, Identity
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.eviction import DRAINED, RECLAIMED, RESCHEDULED

REASONS_BY_KIND: dict[str, frozenset[str]] = {
    "dispatcher": frozenset({RECLAIMED, DRAINED}),
    "rescheduler": frozenset({RESCHEDULED}),
    NODEAGENT: frozenset({RECLAIMED}),
}
"""The eviction reasons of each service kind that calls ``Evict``: what its job needs."""


def requester_of(identity: Identity) -> str:
    """Who ``identity`` is in a request's ``requester`` (and the evicted pods' messages)."""
    if identity.role == "service" and identity.name == NODEAGENT:
        return f"{NODEAGENT}/{identity.agent}"
    return identity.name


def refusal(
    identity: Identity | None,
    request: ipb.EvictRequest,
    pod_of: Callable[[str], pb.Pod | None],
) -> str | None:
    """Why ``identity`` may not ask ``request`` (None: it may). ``pod_of(name)``: the pod as the
    Binder sees it, None when it has none (nothing to evict, nothing to judge)."""
    if identity is None:
        return None
    claimed, own = request.requester, requester_of(identity)
    if claimed and claimed != own and not claimed.startswith(own + "/"):
        return (
            f"rule evict-requester: {_who(identity)} evicts as {own!r} (or {own + '/...'!r}), "
            f"not as {claimed!r}"
        )
    if identity.role != "service":
        return None  # the admin (tenants never reach Evict: rule evict of the method rules)
    allowed = REASONS_BY_KIND.get(identity.name, frozenset())
    if request.reason not in allowed:
        return (
            f"rule evict-reasons: {_who(identity)} evicts only for "
            f"{', '.join(sorted(allowed)) or 'no reason'}, not {request.reason!r}"
        )
    if identity.name == NODEAGENT:
        return _agent_refusal(identity, request, pod_of)
    return None


def _agent_refusal(
    identity: Identity, request: ipb.EvictRequest, pod_of: Callable[[str], pb.Pod | None]
) -> str | None:
    if not identity.agent or not identity.nodes:
        return (
            "rule evict-own-nodes: this node-agent certificate names no agent or no nodes (the "
            "one all agents shared before each had its own): it evicts nothing"
        )
    for ref in request.pods:
        pod = pod_of(ref.name)
        if pod is None or (ref.uid and pod.metadata.uid != ref.uid):
            continue  # not the pod named: gone, nothing of it is evicted
        if not identity.serves(pod.spec.node_name):
            where = f"on node {pod.spec.node_name!r}" if pod.spec.node_name else "not bound"
            return (
                f"rule evict-own-nodes: {_who(identity)} evicts only pods on the nodes its "
                f"certificate names ({', '.join(identity.nodes)}); pod {ref.name!r} is {where}"
            )
        if pod.spec.qos != pb.QOS_BEST_EFFORT:
            return (
                f"rule evict-best-effort: {_who(identity)} evicts only best-effort pods (the "
                f"tide takes back the reclaimable pool); pod {ref.name!r} is guaranteed"
            )
    return None


def _who(identity: Identity) -> str:
    if identity.role == "service" and identity.name == NODEAGENT:
        return f"node agent {identity.agent!r}"
    return f"{identity.role} identity {identity.name!r}"
