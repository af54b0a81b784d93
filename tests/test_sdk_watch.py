"""The SDK's watch resumption against the real dispatcher (in-process, real store, real gRPC),
stopped and started again on the same port while a watcher is in the middle of its initial
listing: the resumed watch delivers each object once, changes made meanwhile as MODIFIED,
deletions as DELETED, and then the live changes."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

from godel.client import AsyncGodelClient, Event
from protos.godel.v1 import objects_pb2 as pb
from store import Store
from store.client import Create
from tests.dispatcher_harness import dispatcher_config, run_dispatcher

COUNT = 4000


def queue(name: str) -> pb.Queue:
    return pb.Queue(metadata=pb.ObjectMeta(name=name, annotations={"pad": "x" * 2000}))


async def test_a_listing_broken_by_a_restart_is_completed_without_repeats(
    store: Store, store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    # Big enough (about 8 MB) that the listing cannot sit whole in the stream's buffers when
    # the dispatcher stops: the watcher is cut off inside it and has to list again.
    names = [f"q{i:04d}" for i in range(COUNT)]
    for chunk in range(0, COUNT, 500):
        await store.commit([Create(queue(n)) for n in names[chunk : chunk + 500]])
    config = dispatcher_config(store_url, cluster_name, tmp_path)
    seen: list[Event] = []
    async with run_dispatcher(config) as first:
        address = first.host.address
        client = AsyncGodelClient(address, reconnect_timeout=30, insecure=True)
        requests: list[int] = []
        watch = client._api.Watch

        def recorded(request: Any) -> Any:
            requests.append(request.from_revision)
            return watch(request)

        client._api.Watch = recorded
        events = client._events("Queue")
        while len(seen) < 3:
            item = await asyncio.wait_for(anext(events), 10)
            assert not isinstance(item, int), "the listing holds more than 3 objects"
            seen.append(item)
    assert [e.object.name for e in seen] == names[:3]
    # While the dispatcher is down: one delivered object goes, one changes, one is new.
    await store.delete(pb.Queue, names[0])
    changed = await store.get(pb.Queue, names[1])
    changed.metadata.labels["v"] = "2"
    await store.update(changed)
    await store.create(queue("new"))
    port = int(address.rsplit(":", 1)[1])
    async with run_dispatcher(dispatcher_config(store_url, cluster_name, tmp_path, port=port)):
        # Whether cut off inside the listing (listed again) or after it (resumed from its
        # revision), the watcher must end up with the same events.
        while len(seen) < COUNT + 3:
            item = await asyncio.wait_for(anext(events), 30)
            if not isinstance(item, int):
                seen.append(item)
        await store.create(queue("live"))
        while isinstance(item := await asyncio.wait_for(anext(events), 10), int):
            pass
        seen.append(item)
        await events.aclose()
        await client.close()
    # The point of this test: the watcher was cut off inside the listing and listed again.
    assert requests[:2] == [0, 0], f"the listing was not interrupted ({requests}): make it bigger"
    got = Counter((e.type, e.object.name) for e in seen)
    want = Counter({("ADDED", n): 1 for n in [*names, "new", "live"]})
    want.update({("MODIFIED", names[1]): 1, ("DELETED", names[0]): 1})
    assert got == want
    assert seen[-1].object.name == "live"
    modified = next(e for e in seen if e.type == "MODIFIED")
    assert modified.object.labels == {"v": "2"}
