"""The standby Binder's takeover at scale: two Binder processes over a store filled by
``bench.service_start fill``, the leader killed with SIGKILL, timed until the standby commits a
bind (bench/README.md, "Restart at scale").

    python -m bench.service_start fill --store-url URL --cluster C --nodes 2000 --jobs 100 --pods 1000
    python -m bench.binder_takeover --store-url URL --cluster C [--rounds 3]

Each round adds a probe job of one pending pod, starts two binders (each in a process of its
own, ``lease_ms`` 3000 as `godel up` runs them) and waits until one leads and the other serves
(its informer has listed the whole state: a standby builds its view while it waits). Then the
leader is killed with SIGKILL (no release of its lease) and, as a shard does, a decision
placing the probe pod is sent to the standby again and again until it answers BOUND: the
lease's expiry, the standby's campaign and catch-up, and its first commit. Prints one JSON line
per round: ``bound_s``, from the kill to the verdict (``verdict``: BOUND), and ``leads``, the
standby's health for the Binder service then (SERVING: only a leader caught up says so).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench.memory import _PREFIX
from foundation.netutil import free_ports
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import internal_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services.binder.config import BinderConfig
from services.binder.service import BinderService
from services.dispatcher.controllers.pods import normalise_job, pods_for
from services.runtime import ServiceHost
from services.runtime.healthcheck import probe
from store import Store, StoreError

BINDER_SERVICE = ipb.DESCRIPTOR.services_by_name["Binder"].full_name
DEADLINE_SECONDS = 120.0


async def serve(url: str, cluster: str, name: str, port: int) -> None:
    """One Binder until killed."""
    with tempfile.TemporaryDirectory() as home:
        config = BinderConfig(
            name=name, port=port, store_url=url, cluster=cluster, home=Path(home), insecure=True
        )
        async with ServiceHost(BinderService, config):
            await asyncio.Event().wait()


async def store_probe_job(url: str, cluster: str, name: str) -> tuple[pb.Job, list[pb.Pod]]:
    """A job of one pending pod of PaperScale's shape (as the dispatcher makes it), stored in
    one call; the job and its pod as stored. The probe the takeover benches bind."""
    job = pb.Job(metadata=pb.ObjectMeta(name=name))
    job.spec.replicas = job.spec.min_member = 1
    job.spec.template.requests.milli_cpu = 50
    job.spec.template.requests.memory_bytes = 200 << 20
    job = normalise_job(job)
    store = await Store.connect(url, cluster=cluster)
    try:
        objs: list[pb.Job | pb.Pod] = [job, *pods_for(job)]
        created = await store.create_many(objs)
    finally:
        await store.close()
    for outcome in created:
        if isinstance(outcome, StoreError):
            raise outcome
    stored_job, *pods = created
    if not isinstance(stored_job, pb.Job) or not all(isinstance(p, pb.Pod) for p in pods):
        raise TypeError(f"the probe job was not stored as a job and its pods: {created!r}")
    return stored_job, [p for p in pods if isinstance(p, pb.Pod)]


async def probe_pod(url: str, cluster: str, name: str) -> pb.Pod:
    """A stored probe job's one pod."""
    _, pods = await store_probe_job(url, cluster, name)
    return pods[0]


async def bind_until_bound(address: str, pod: pb.Pod, node: str) -> str:
    """Send the standby a decision placing ``pod`` on ``node`` until it answers (a standby
    refuses with FAILED_PRECONDITION); the verdict's code name."""
    decision = ipb.UnitDecision(job=pod.spec.job, min_member=1)
    decision.placements.add(
        pod=pod.metadata.name, node=node, pod_resource_version=pod.metadata.resource_version
    )
    batch = ipb.DecisionBatch(shard="takeover-probe", batch_id=1, units=[decision])
    while True:
        async with grpc.aio.insecure_channel(address) as channel:
            call = internal_pb2_grpc.BinderStub(channel).Decide()
            try:
                await call.write(batch)
                answer: ipb.VerdictBatch = await asyncio.wait_for(call.read(), 10)
                return str(ipb.VerdictCode.Name(answer.verdicts[0].code))
            except (grpc.aio.AioRpcError, grpc.aio.UsageError):
                pass  # not the leader yet: ask again
            finally:
                call.cancel()  # ended before its channel and the loop close
        await asyncio.sleep(0.02)


def round_once(url: str, cluster: str, index: int) -> dict[str, float | str]:
    pod = asyncio.run(probe_pod(url, cluster, f"takeover-{int(time.time())}-{index}"))
    ports = free_ports(2)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.binder_takeover", "serve", "--store-url", url,
             "--cluster", cluster, "--name", f"takeover-b{i}", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i, port in enumerate(ports)
    ]  # fmt: skip
    addresses = [f"127.0.0.1:{port}" for port in ports]
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            leading = [probe(a, BINDER_SERVICE, 1) == "SERVING" for a in addresses]
            serving = [probe(a, "", 1) == "SERVING" for a in addresses]
            if sum(leading) == 1 and all(serving):
                break
            if time.monotonic() > deadline:
                raise SystemExit("error: no binder led with the other serving in time")
            time.sleep(0.1)
        leader = leading.index(True)
        standby = addresses[1 - leader]
        procs[leader].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        procs[leader].wait(10)
        verdict = asyncio.run(bind_until_bound(standby, pod, f"{_PREFIX}-0"))
        bound = time.monotonic() - killed
        leads = probe(standby, BINDER_SERVICE, 1)
        return {"round": index, "bound_s": round(bound, 2), "verdict": verdict, "leads": leads}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=["measure", "serve"], default="measure")
    parser.add_argument("--store-url", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default="takeover-b0")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    if args.mode == "serve":
        asyncio.run(serve(args.store_url, args.cluster, args.name, args.port))
        return
    for index in range(args.rounds):
        print(json.dumps(round_once(args.store_url, args.cluster, index)), flush=True)


if __name__ == "__main__":
    main()
