"""Paged List's snapshots (services/dispatcher/api/listing.py): tokens, snapshot keeping and
expiry as plain state, table-driven; and the dispatcher's List paging through one."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.api.listing import (
    ListingSnapshots,
    MalformedTokenError,
    decode_token,
    encode_token,
)
from store import Store
from tests import factories as f
from tests.dispatcher_harness import Running, dispatcher_config, run_dispatcher


@pytest.fixture
async def dispatcher(store_url: str, cluster_name: str, tmp_path: Path) -> AsyncIterator[Running]:
    async with run_dispatcher(dispatcher_config(store_url, cluster_name, tmp_path)) as running:
        yield running


def nodes(*names: str) -> list[pb.Node]:
    return [f.node(n) for n in names]


@pytest.mark.parametrize(
    ("snapshot", "name"),
    [("abc123", "n-1"), ("", "n-1"), ("abc", "a.b-c")],
)
def test_a_token_carries_its_snapshot_and_last_name(snapshot: str, name: str) -> None:
    assert decode_token(encode_token(snapshot, name)) == (snapshot, name)


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        pytest.param(base64.urlsafe_b64encode(b"n-7").decode(), ("", "n-7"), id="older: a name"),
        pytest.param("%%%", MalformedTokenError, id="not base64"),
        pytest.param(
            base64.urlsafe_b64encode(b"snap:").decode(), MalformedTokenError, id="no name"
        ),
        pytest.param("", MalformedTokenError, id="empty"),
    ],
)
def test_decoding_tokens(token: str, expected: object) -> None:
    if expected is MalformedTokenError:
        with pytest.raises(MalformedTokenError):
            decode_token(token)
    else:
        assert decode_token(token) == expected


# (case, after, size, expected names)
@pytest.mark.parametrize(
    ("after", "size", "expected"),
    [
        ("", 2, ["a", "b"]),
        ("a", 2, ["b", "c"]),
        ("b", 5, ["c", "d"]),
        ("bb", 1, ["c"]),  # a name between two: the next one after it
        ("d", 3, []),
    ],
)
def test_a_window_starts_after_the_name(after: str, size: int, expected: list[str]) -> None:
    snapshots = ListingSnapshots()
    sid = snapshots.keep("k", nodes("a", "b", "c", "d"), revision=7, now=0)
    window = snapshots.window(sid, "k", after, size, now=1)
    assert window is not None
    objects, revision = window
    assert [o.metadata.name for o in objects] == expected  # type: ignore[attr-defined]
    assert revision == 7


def test_a_snapshot_serves_only_its_request_and_expires_unread() -> None:
    snapshots = ListingSnapshots(ttl_seconds=10, max_snapshots=2)
    sid = snapshots.keep("mine", nodes("a", "b"), revision=1, now=0)
    assert snapshots.window(sid, "another caller's", "", 1, now=1) is None
    assert snapshots.window("unknown", "mine", "", 1, now=1) is None
    assert snapshots.window(sid, "mine", "", 1, now=9) is not None  # read: renewed to 19
    assert snapshots.window(sid, "mine", "", 1, now=18) is not None
    assert snapshots.window(sid, "mine", "", 1, now=29) is None  # 11 s unread: gone
    assert len(snapshots) == 0


def test_the_least_recently_read_snapshot_goes_first_and_a_finished_one_at_once() -> None:
    snapshots = ListingSnapshots(max_snapshots=2)
    first = snapshots.keep("k", nodes("a"), revision=1, now=0)
    second = snapshots.keep("k", nodes("a"), revision=2, now=0)
    assert snapshots.window(first, "k", "", 1, now=1) is not None  # first read more recently
    third = snapshots.keep("k", nodes("a"), revision=3, now=2)
    assert snapshots.window(second, "k", "", 1, now=2) is None
    assert snapshots.window(first, "k", "", 1, now=2) is not None
    snapshots.drop(third)
    assert len(snapshots) == 1


async def test_paging_is_consistent_at_the_first_pages_revision(
    dispatcher: Running, store: Store
) -> None:
    """An object created after the first page, named to sort into a later one, is not in the
    listing; every page reports the first page's revision; the last page lets the snapshot go."""
    for i in range(5):
        await store.create(f.node(f"n{i}"))
    api = dispatcher.api

    first = await api.List(api_pb2.ListRequest(kind="Node", limit=2))
    await store.create(f.node("n9"))
    names = [o.node.metadata.name for o in first.items]
    token, revisions = first.continue_token, {first.resource_version}
    while token:
        page = await api.List(api_pb2.ListRequest(kind="Node", limit=2, continue_token=token))
        names += [o.node.metadata.name for o in page.items]
        revisions.add(page.resource_version)
        token = page.continue_token
    assert names == [f"n{i}" for i in range(5)]
    assert len(revisions) == 1
    assert len(dispatcher.service.api.snapshots) == 0
    # A fresh listing sees the new node.
    again = await api.List(api_pb2.ListRequest(kind="Node"))
    assert [o.node.metadata.name for o in again.items][-1] == "n9"
