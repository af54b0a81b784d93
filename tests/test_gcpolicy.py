"""The service processes' garbage collection policy (services/runtime/gcpolicy.py).

What changes the collector runs in a child interpreter, so the test runner's own collector is
never frozen or re-tuned."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from services.runtime import gcpolicy

ROOT = Path(__file__).resolve().parent.parent


def run_child(body: str) -> dict[str, Any]:
    """Run ``body`` (which sets ``result``) in a fresh interpreter; returns ``result``."""
    script = "import gc, json\n" + textwrap.dedent(body) + "\nprint(json.dumps(result))\n"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return parsed


def test_a_full_collection_frees_the_garbage_then_freezes_the_survivors() -> None:
    result = run_child(
        """
        import weakref
        from services.runtime import gcpolicy

        class Node:
            pass

        def in_sight(obj):  # gc.get_objects does not list the permanent generation
            return any(o is obj for o in gc.get_objects())

        gcpolicy.tune_for_service()
        cache = [[i] for i in range(50_000)]  # long-lived (lists are tracked; atomic dicts not)
        a, b = Node(), Node()
        a.other, b.other = b, a  # a reference cycle, then dropped: garbage only gc can find
        gone = weakref.ref(a)
        del a, b
        seen_before = in_sight(cache[-1])
        frozen = gcpolicy.settle()
        result = {
            "frozen": frozen,
            "cycle_collected": gone() is None,
            "seen_before": seen_before,
            "seen_after": in_sight(cache[-1]),
            "in_sight": len(gc.get_objects()),
        }
        """
    )
    assert result["seen_before"] and not result["seen_after"]
    assert result["frozen"] >= 50_000
    assert result["cycle_collected"]  # collected by the collection, not frozen with the rest
    assert result["in_sight"] < 1_000  # almost nothing left for the collector to walk


def test_later_full_collections_walk_only_what_came_since_and_freeze_it_too() -> None:
    result = run_child(
        """
        from services.runtime import gcpolicy

        gcpolicy.tune_for_service()
        gcpolicy.settle()
        first = gc.get_freeze_count()
        later = [[i] for i in range(20_000)]  # long-lived objects that arrive afterwards
        gc.collect()  # as the collector's own full collections do
        result = {"first": first, "second": gc.get_freeze_count(), "later": len(later)}
        """
    )
    assert result["first"] > 0
    assert result["second"] >= result["first"] + 20_000


def test_every_collection_is_timed_by_generation_and_nothing_frozen_unless_asked() -> None:
    def count(generation: str) -> float:
        value = REGISTRY.get_sample_value(
            "godel_gc_pause_seconds_count", {"generation": generation}
        )
        return value or 0.0

    hooks = gcpolicy.CollectorHooks(freeze=False)  # the test runner's objects stay in sight
    frozen = gc.get_freeze_count()
    before = {g: count(g) for g in ("0", "1", "2")}
    hooks.install()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        hooks.remove()
    assert hooks not in gc.callbacks
    assert count("0") >= before["0"] + 1
    assert count("2") >= before["2"] + 1
    # The longest full collection in CPU time, kept by the hooks and in the gauge.
    assert hooks.longest_cpu[2] > 0.0
    assert REGISTRY.get_sample_value(
        "godel_gc_pause_cpu_max_seconds", {"generation": "2"}
    ) == pytest.approx(hooks.longest_cpu[2])
    assert gc.get_freeze_count() == frozen
    # Removed: further collections are not counted by it.
    after = count("2")
    gc.collect(2)
    assert count("2") == after


def test_a_service_freezes_what_its_listing_builds_and_nothing_collectable_before(
    store_url: str, cluster_name: str
) -> None:
    """A service process (``tune_for_service``) freezes the records its informer's listing
    builds as the listing ends: no collection walks them afterwards (a restart over a million
    pods walked them twice before its first health check was answered). A cycle dropped
    before the listing is collected first, not frozen with them."""
    result = run_child(
        f"""
        import asyncio, weakref
        from protos.godel.v1 import objects_pb2 as pb
        from services.runtime import gcpolicy
        from store.client import Store
        from store.informer import Handlers, Informer

        class Node:
            pass

        def in_sight(obj):  # gc.get_objects does not list the permanent generation
            return any(o is obj for o in gc.get_objects())

        async def main():
            gcpolicy.tune_for_service()
            store = await Store.connect({store_url!r}, cluster={cluster_name!r})
            await store.create_many(
                [pb.Queue(metadata=pb.ObjectMeta(name=f"q{{i}}")) for i in range(500)]
            )
            records = []  # what a handler builds of each listed object
            informer = Informer(store, ["Queue"], block_ms=100)
            informer.add_handlers(Handlers(on_add=lambda _k, o: records.append([o.metadata.name])))
            a, b = Node(), Node()
            a.other, b.other = b, a  # a reference cycle, then dropped
            gone = weakref.ref(a)
            del a, b
            informer.start()
            await informer.wait_synced(30)
            result = {{
                "records": len(records),
                "record_in_sight": any(in_sight(r) for r in (records[0], records[-1])),
                "cycle_collected": gone() is None,
            }}
            await informer.stop()
            await store.close()
            return result

        result = asyncio.run(main())
        """
    )
    assert result["records"] == 500
    assert not result["record_in_sight"]
    assert result["cycle_collected"]
