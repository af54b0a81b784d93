"""A spare shard's takeover at scale: a Binder, a shard and a spare standing by for it (each a
process of its own) over a store filled by ``bench.service_start fill``; the shard killed with
SIGKILL, timed until the spare has registered as that shard and until it binds a probe job
(services/scheduler/README.md, "Standby shards").

    python -m bench.service_start fill --store-url URL --cluster C --nodes 2000 --jobs 100 --pods 1000
    python -m bench.shard_takeover --store-url URL --cluster C [--rounds 3]

Each round adds a probe job of one pending pod, starts the three processes (``lease_ms`` 3000,
as `godel up` runs them) and waits until the shard serves as ``takeover-shard``, the spare
serves (its informer has listed the whole state: it builds its view while it waits) and the
Binder leads. Then the shard is killed with SIGKILL (no release of its name's lease) and, as
the dispatcher does once the record names the spare, the probe unit is dispatched to the spare
until it answers UNIT_DONE. Prints one JSON line per round: ``registered_s``, from the kill to
the record naming the spare; ``bound_s``, to the probe's outcome (``outcome``: UNIT_DONE); and
``listing_s``, what the spare's start took (its listing: a restart's cost, which the takeover
does not pay again).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import grpc

from bench.binder_takeover import store_probe_job
from foundation.netutil import free_ports
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services.runtime.healthcheck import probe
from store import NotFoundError, Store

SCHEDULER_SERVICE = ipb.DESCRIPTOR.services_by_name["Scheduler"].full_name
BINDER_SERVICE = ipb.DESCRIPTOR.services_by_name["Binder"].full_name
SHARD = "takeover-shard"
DEADLINE_SECONDS = 300.0


def unit_of(job: pb.Job, pods: list[pb.Pod]) -> ipb.Unit:
    """The unit the dispatcher sends a shard for a stored job and its pods."""
    refs = [
        ipb.PodRef(
            name=p.metadata.name,
            uid=p.metadata.uid,
            resource_version=p.metadata.resource_version,
            index=p.spec.index,
        )
        for p in pods
    ]
    return ipb.Unit(job=job, pods=refs)


async def probe_unit(url: str, cluster: str, name: str) -> ipb.Unit:
    """A stored probe job's unit (as the dispatcher sends it)."""
    return unit_of(*await store_probe_job(url, cluster, name))


async def record_address(url: str, cluster: str) -> str:
    store = await Store.connect(url, cluster=cluster)
    try:
        inst = await store.get(pb.SchedulerInstance, SHARD)
        return str(inst.spec.address)
    except NotFoundError:
        return ""
    finally:
        await store.close()


async def dispatch_until_done(address: str, unit: ipb.Unit) -> str:
    """Dispatch ``unit`` to the shard at ``address`` until it answers with its outcome (a
    standby refuses the stream with FAILED_PRECONDITION); the outcome's code name."""
    while True:
        async with grpc.aio.insecure_channel(address) as channel:
            call: Any = internal_pb2_grpc.SchedulerStub(channel).Dispatch()
            try:
                await call.write(ipb.DispatchMessage(units=ipb.UnitBatch(units=[unit])))
                while True:
                    msg = await asyncio.wait_for(call.read(), 30)
                    if msg is grpc.aio.EOF:
                        break
                    if msg.HasField("outcomes"):
                        for outcome in msg.outcomes.outcomes:
                            if outcome.job == unit.job.metadata.name:
                                return str(ipb.UnitOutcomeCode.Name(outcome.code))
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, TimeoutError):
                pass  # not the shard yet: ask again
            finally:
                call.cancel()
        await asyncio.sleep(0.02)


def _start(kind: str, name: str, port: int, url: str, cluster: str, home: str, *extra: str) -> Any:
    """One service process; its output to ``$home/<name>.log`` (the ``--logs`` directory)."""
    with open(f"{home}/{name}.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", f"services.{kind}", "--name", name, "--port", str(port),
             "--host", "127.0.0.1", "--store-url", url, "--cluster", cluster, "--home", home,
             "--insecure", "true", "--metrics-port", "-1", *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def _wait(what: str, ready: Any, deadline: float) -> float:
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"error: {what} not in time")
        time.sleep(0.1)
    return time.monotonic()


def round_once(url: str, cluster: str, index: int, logs: str) -> dict[str, float | str]:
    unit = asyncio.run(probe_unit(url, cluster, f"shard-takeover-{int(time.time())}-{index}"))
    binder_port, shard_port, spare_port = free_ports(3)
    shard, spare = f"127.0.0.1:{shard_port}", f"127.0.0.1:{spare_port}"
    home = tempfile.mkdtemp(prefix="shard-takeover-", dir=logs or None)
    try:
        # A name of its own each round: the lease of an earlier round's binder (killed) may still
        # stand, and the same holder would only extend it, at its old address.
        binder = f"takeover-binder-{index}-{int(time.time())}"
        procs = [_start("binder", binder, binder_port, url, cluster, home)]
        started = time.monotonic()
        procs.append(_start("scheduler", SHARD, shard_port, url, cluster, home))
        deadline = started + DEADLINE_SECONDS
        try:
            # The spare after the shard holds the name (a spare takes only names held before).
            _wait(
                "the shard",
                lambda: probe(shard, SCHEDULER_SERVICE, 1) == "SERVING",
                deadline,
            )
            spare_started = time.monotonic()
            procs.append(
                _start("scheduler", "takeover-spare", spare_port, url, cluster, home,
                       "--standby-for", SHARD)
            )  # fmt: skip
            spare_ready = _wait("the spare", lambda: probe(spare, "", 1) == "SERVING", deadline)
            _wait("a binder", lambda: probe(f"127.0.0.1:{binder_port}", BINDER_SERVICE, 1) == (
                "SERVING"
            ), deadline)  # fmt: skip
            procs[1].send_signal(signal.SIGKILL)
            killed = time.monotonic()
            procs[1].wait(10)
            registered = _wait(
                "the spare's registration",
                lambda: asyncio.run(record_address(url, cluster)) == spare,
                deadline,
            )
            outcome = asyncio.run(
                asyncio.wait_for(dispatch_until_done(spare, unit), DEADLINE_SECONDS)
            )
            bound = time.monotonic()
            return {
                "round": index,
                "registered_s": round(registered - killed, 2),
                "bound_s": round(bound - killed, 2),
                "outcome": outcome,
                "listing_s": round(spare_ready - spare_started, 2),
            }
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
    finally:
        if not logs:
            shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--store-url", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--logs", default="", help="keep each round's service logs here")
    args = parser.parse_args()
    for index in range(args.rounds):
        print(json.dumps(round_once(args.store_url, args.cluster, index, args.logs)), flush=True)


if __name__ == "__main__":
    main()
