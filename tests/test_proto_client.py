"""The protobuf-level client (``godel.client.ProtoClient``, what the benchmarks and tools use)
against the real dispatcher (in-process, real store, real gRPC)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from godel.client import ProtoClient
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.api.submit import REQUEST_ID_ANNOTATION
from store import Store
from tests import factories as f
from tests.dispatcher_harness import dispatcher_config, run_dispatcher


async def test_submit_without_a_request_id_sends_a_fresh_one_so_a_resend_is_recognised(
    store: Store, store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    """gRPC's retry policy resends a Submit whose reply was lost; without an id, the resend of
    jobs the first attempt had stored came back AlreadyExists (a 1,000,000-pod bench run failed
    on it). Each call now carries its own id: stored on its jobs, it makes a resend of the same
    request report them as existing, while a new call stays a new request."""
    async with run_dispatcher(dispatcher_config(store_url, cluster_name, tmp_path)) as running:
        with ProtoClient(running.host.address, insecure=True) as client:
            first = await asyncio.to_thread(client.submit, [f.job("a")])
            second = await asyncio.to_thread(client.submit, [f.job("b")])
            ids = [
                (await store.get(pb.Job, name)).metadata.annotations[REQUEST_ID_ANNOTATION]
                for name in ("a", "b")
            ]
            # What the channel's resend of the first call is: the same id, the same job.
            resent = await asyncio.to_thread(client.submit, [f.job("a")], request_id=ids[0])
            # A new call of the same job is a new request: the name is taken, and it says so.
            again = await asyncio.to_thread(client.submit, [f.job("a")])
    assert first.results[0].created and second.results[0].created
    assert all(ids) and ids[0] != ids[1]
    assert resent.results[0].existing and not resent.results[0].violations
    assert not again.results[0].existing
    assert "AlreadyExists" in again.results[0].violations[0].description
