"""The protobuf layer: the API's RPCs one to one, taking and returning the generated messages.

    from godel.client import ProtoClient
    with ProtoClient("127.0.0.1:50051") as c:
        result = c.submit([job])
        pods = c.list("Pod", job="train")

The CLI, the benchmarks and the tests use it, as they print or check exact wire objects.
Programs use the SDK (GodelClient / AsyncGodelClient), which speaks manifests instead. Both share
the channel options, retry policy and error mapping of ``_transport``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, overload

import grpc
from google.protobuf.message import Message

from foundation import tls
from godel.client._transport import (
    CHANNEL_OPTIONS,
    ClosedOnExit,
    client_error,
    resolve_credentials,
)
from protos.godel.v1 import api_pb2, api_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from store.kinds import S, StoredObject, kind_for_class, unwrap, wrap

# The generated stub of the service a client speaks to.
Stub = TypeVar("Stub")


class _Connection(ClosedOnExit, Generic[Stub]):
    """One channel to one service: its stub, closing, ``with`` support, calls with the deadline
    and errors as ClientError. A client names its service's stub (``_stub``) and its default
    deadline (``default_timeout``, used when ``timeout`` is not given)."""

    default_timeout: ClassVar[float]

    def __init__(
        self,
        address: str,
        *,
        timeout: float | None = None,
        home: Path | None = None,
        credentials: tls.Credentials | None = None,
        insecure: bool = False,
    ) -> None:
        self.address = address
        self.timeout = self.default_timeout if timeout is None else timeout
        self.credentials = resolve_credentials(credentials, insecure, home)
        self._channel = tls.channel(address, self.credentials, CHANNEL_OPTIONS)
        self._api = self._stub(self._channel)

    def _stub(self, channel: grpc.Channel) -> Stub:
        raise NotImplementedError

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Any, request: Message) -> Any:
        """The RPC's response. Untyped, as grpc is (the generated stubs name each RPC's
        response type, but through grpc's untyped callables): callers annotate it."""
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise client_error(exc, self.address, plaintext=self.credentials is None) from None


class ProtoClient(_Connection[api_pb2_grpc.DispatcherStub]):
    """The Dispatcher's API. Credentials as the SDK finds them (``discover_credentials``) unless
    given; ``insecure=True`` for a cluster started with --insecure. ``timeout``: 30 s."""

    default_timeout = 30.0

    def _stub(self, channel: grpc.Channel) -> api_pb2_grpc.DispatcherStub:
        return api_pb2_grpc.DispatcherStub(channel)

    def submit(
        self, jobs: Sequence[pb.Job], *, dry_run: bool = False, request_id: str | None = None
    ) -> api_pb2.SubmitResponse:
        """Validate and store jobs; each result says created (or existing, for a retry of the
        same ``request_id``), or lists the violations. The request id is a fresh one unless
        given, so the channel's own retry of a call whose reply was lost (the server busy past
        its keepalive, a restart) reports the jobs the first attempt stored as existing, never
        as AlreadyExists."""
        request = api_pb2.SubmitRequest(
            jobs=jobs, dry_run=dry_run, request_id=request_id or uuid.uuid4().hex
        )
        response: api_pb2.SubmitResponse = self._call(self._api.Submit, request)
        return response

    def apply(
        self,
        objects: Sequence[tuple[str, Message]],
        *,
        dry_run: bool = False,
        request_id: str | None = None,
    ) -> api_pb2.ApplyResponse:
        """Create, update or leave unchanged jobs, nodes, queues and disruption budgets; jobs
        this creates carry ``request_id`` (a fresh one unless given; see ``submit``)."""
        request = api_pb2.ApplyRequest(
            objects=[wrap(k, o) for k, o in objects],
            dry_run=dry_run,
            request_id=request_id or uuid.uuid4().hex,
        )
        response: api_pb2.ApplyResponse = self._call(self._api.Apply, request)
        return response

    # get and list name the kind by its message class, typed by it (``get(pb.Pod, name)`` is a
    # ``pb.Pod``: the API answers with the kind asked for), or by its name (any StoredObject).

    @overload
    def get(self, kind: type[S], name: str) -> S: ...

    @overload
    def get(self, kind: str, name: str) -> StoredObject: ...

    def get(self, kind: str | type[Message], name: str) -> Any:
        request = api_pb2.GetRequest(kind=_kind_name(kind), name=name)
        return unwrap(self._call(self._api.Get, request))[1]

    @overload
    def list(
        self,
        kind: type[S],
        *,
        job: str = "",
        labels: dict[str, str] | None = None,
        selector: str = "",
        page_size: int = 0,
    ) -> list[S]: ...

    @overload
    def list(
        self,
        kind: str,
        *,
        job: str = "",
        labels: dict[str, str] | None = None,
        selector: str = "",
        page_size: int = 0,
    ) -> list[StoredObject]: ...

    def list(
        self,
        kind: str | type[Message],
        *,
        job: str = "",
        labels: dict[str, str] | None = None,
        selector: str = "",
        page_size: int = 0,
    ) -> list[Any]:
        """Every object of a kind (following pages), optionally only a job's pods or those
        whose labels match (``labels``: equality; ``selector``: kubectl's grammar)."""
        items: list[Message] = []
        token = ""
        while True:
            request = api_pb2.ListRequest(
                kind=_kind_name(kind),
                job=job,
                label_selector=labels or {},
                selector=selector,
                limit=page_size,
                continue_token=token,
            )
            response = self._call(self._api.List, request)
            items += [unwrap(o)[1] for o in response.items]
            token = response.continue_token
            if not token:
                return items

    def delete(self, kind: str, name: str, *, resource_version: int = 0) -> int:
        """How many objects went (0 for a big job whose deletion goes on: see delete_object)."""
        return int(self.delete_object(kind, name, resource_version=resource_version).deleted)

    def delete_object(
        self, kind: str, name: str, *, resource_version: int = 0
    ) -> api_pb2.DeleteResponse:
        """The Delete call's answer: ``deleted`` objects, or for a job too big for one commit
        ``in_progress`` with its ``pods_remaining`` (it reads as Deleting until it is gone)."""
        request = api_pb2.DeleteRequest(kind=kind, name=name, resource_version=resource_version)
        response: api_pb2.DeleteResponse = self._call(self._api.Delete, request)
        return response

    def explain(self, pod: str) -> api_pb2.ExplainResponse:
        response: api_pb2.ExplainResponse = self._call(
            self._api.Explain, api_pb2.ExplainRequest(pod=pod)
        )
        return response

    def retry_job(self, name: str) -> pb.Job:
        """Start a gang whose scheduling timed out (phase Timeout) again; the job as stored."""
        response: api_pb2.RetryJobResponse = self._call(
            self._api.RetryJob, api_pb2.RetryJobRequest(name=name)
        )
        return response.job

    def drain(self, node: str, *, dry_run: bool = False) -> api_pb2.DrainResponse:
        """Cordon ``node`` and evict what its pods' budgets allow now (see DrainResponse)."""
        request = api_pb2.DrainRequest(node=node, dry_run=dry_run)
        response: api_pb2.DrainResponse = self._call(self._api.Drain, request)
        return response

    def watch(
        self,
        kinds: Sequence[str],
        *,
        from_revision: int = 0,
        selector: str = "",
        job: str = "",
    ) -> Iterator[api_pb2.WatchEvent]:
        """The Watch stream (no deadline: it lasts until the caller stops reading)."""
        request = api_pb2.WatchRequest(
            kinds=kinds, from_revision=from_revision, selector=selector, job=job
        )
        try:
            yield from self._api.Watch(request)
        except grpc.RpcError as exc:
            raise client_error(exc, self.address, plaintext=self.credentials is None) from None


def _kind_name(kind: str | type[Message]) -> str:
    return kind if isinstance(kind, str) else kind_for_class(kind).name


class ReschedulerClient(_Connection[api_pb2_grpc.ReschedulerStub]):
    """The Rescheduler's API: run a policy's round now (or simulate it), list the policies.
    ``timeout``: 300 s."""

    # A round on a large cluster takes seconds: the default deadline is generous.
    default_timeout = 300.0

    def _stub(self, channel: grpc.Channel) -> api_pb2_grpc.ReschedulerStub:
        return api_pb2_grpc.ReschedulerStub(channel)

    def trigger(self, policy: str = "", *, dry_run: bool = False) -> api_pb2.TriggerResponse:
        """One round of ``policy`` (every policy when empty) and its plan."""
        request = api_pb2.TriggerRequest(policy=policy, dry_run=dry_run)
        response: api_pb2.TriggerResponse = self._call(self._api.Trigger, request)
        return response

    def list_policies(self) -> api_pb2.ListPoliciesResponse:
        """The policies with their last rounds, and whether the kill switch is on."""
        response: api_pb2.ListPoliciesResponse = self._call(
            self._api.ListPolicies, api_pb2.ListPoliciesRequest()
        )
        return response

    def policies(self) -> list[api_pb2.PolicyInfo]:
        return list(self.list_policies().policies)

    def pause(self, paused: bool = True) -> bool:
        """Pause (or, with False, resume) every policy's rounds and batches; the new state."""
        response = self._call(self._api.Pause, api_pb2.PauseRequest(paused=paused))
        return bool(response.paused)


def logs(
    agent_address: str,
    pod: str,
    *,
    follow: bool = False,
    tail_lines: int = 0,
    timeout: float | None = None,
    home: Path | None = None,
    credentials: tls.Credentials | None = None,
    insecure: bool = False,
) -> Iterator[bytes]:
    """The output of a process-mode pod, from the node agent that ran it (credentials as for
    ``ProtoClient``)."""
    chosen = resolve_credentials(credentials, insecure, home)
    with tls.channel(agent_address, chosen, CHANNEL_OPTIONS) as channel:
        stub = api_pb2_grpc.NodeAgentStub(channel)
        request = api_pb2.LogsRequest(pod=pod, follow=follow, tail_lines=tail_lines)
        try:
            for chunk in stub.Logs(request, timeout=timeout):
                yield chunk.data
        except grpc.RpcError as exc:
            raise client_error(exc, agent_address, plaintext=chosen is None) from None
