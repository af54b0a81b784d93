"""Micro-benchmark of the dispatcher's unit queue alone (services.dispatcher.dispatching.unitqueue), one
core, no services, one-pod units of two tenants' queues under DRF:

    PYTHONPATH=. python -m bench.queue_micro others-wait [--units 5000]
    PYTHONPATH=. python -m bench.queue_micro freed-room [--units 100000]
    PYTHONPATH=. python -m bench.queue_micro owed [--units 100000]
    PYTHONPATH=. python -m bench.queue_micro turns [--units 10000] [--queues 100]

``others-wait``: tenant ``b`` has ``--units`` units dispatched (at a shard), then tenant ``a``
submits as many; one round sends all of ``a``'s. Every unit a round offers while only one
queue has units ready asks whether another queue waits. Prints the round's time per unit sent.

``freed-room``: both tenants have ``--units`` units backed off in a full cluster, and room is
freed: the smallest-share queue's first units wake (what every round does while units wait for
room and pods finish). Prints the time per wake.

``owed``: tenant ``a`` has a min of 50 CPUs and ``--units`` pending units; what its min still
owes it is computed, as at the start of every round. Prints the time per computation.

``turns``: ``--units`` units spread over ``--queues`` equal queues; one round sends them all,
each turn going to the queue with the smallest dominant share. Prints the time per unit sent.
"""

from __future__ import annotations

import argparse
import time

from placement.nodeinfo import GUARANTEED
from placement.resources import Quantities
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.dispatching.queueing import FAIRNESS, PendingUnit
from services.dispatcher.dispatching.unitqueue import (
    BackoffSettings,
    UnitEntry,
    UnitQueue,
    UnitState,
)

TENANTS = ("a", "b")


class _Cluster:
    """The jobs and queues the unit queue looks up, and the queue."""

    def __init__(self, node_cpu: int) -> None:
        self.jobs: dict[str, pb.Job] = {}
        self.queues = {q: pb.Queue(metadata=pb.ObjectMeta(name=q)) for q in TENANTS}
        self.uq = UnitQueue(self.jobs.get, self.queues.get, BackoffSettings())
        self.uq.fairness = FAIRNESS["drf"]
        room = Quantities(cpu=node_cpu, mem=1 << 50, pods=1 << 30)
        self.uq.set_node("node-0", {GUARANTEED: room})

    def submit(self, name: str, queue: str) -> None:
        job = pb.Job(metadata=pb.ObjectMeta(name=name))
        job.spec.replicas = job.spec.min_member = 1
        job.spec.queue = queue
        job.spec.template.requests.milli_cpu = 100
        self.jobs[name] = job
        pod = pb.Pod(metadata=pb.ObjectMeta(name=f"{name}-0"))
        pod.spec.job, pod.spec.queue = name, queue
        pod.spec.template.CopyFrom(job.spec.template)
        pod.status.phase = pb.POD_PENDING
        self.uq.add_pod(pod, now_ms=0)

    def send_all(self) -> int:
        sent = 0

        def place(entry: UnitEntry, unit: PendingUnit) -> bool:
            nonlocal sent
            sent += 1
            self.uq.dispatched(entry, "shard-0", unit)
            return True

        self.uq.round(0.0, place, lambda: True)
        return sent


def _send_timed(cluster: _Cluster) -> tuple[int, str]:
    """One round sending every ready unit: how many, and "in X ms (Y µs per unit)"."""
    started = time.perf_counter()
    sent = cluster.send_all()
    took = time.perf_counter() - started
    return sent, f"in {took * 1000:.0f} ms ({took / max(sent, 1) * 1e6:.1f} µs per unit)"


def others_wait(units: int) -> str:
    cluster = _Cluster(node_cpu=10**12)
    for i in range(units):
        cluster.submit(f"b-{i}", "b")
    cluster.send_all()
    for i in range(units):
        cluster.submit(f"a-{i}", "a")
    sent, took = _send_timed(cluster)
    return f"others-wait: {sent} units of a sent while b has {units} at a shard {took}"


def freed_room(units: int, wakes: int = 10) -> str:
    cluster = _Cluster(node_cpu=1000)
    for i in range(units):
        cluster.submit(f"u-{i}", TENANTS[i % 2])
    for entry in list(cluster.uq.units.values()):
        cluster.uq.back_off(entry, now=0.0)
    started = time.perf_counter()
    for _ in range(wakes):
        cluster.uq._wake_for_freed_room()
    took = (time.perf_counter() - started) / wakes
    woken = sum(1 for e in cluster.uq.units.values() if e.state == UnitState.QUEUED)
    return (
        f"freed-room: {units} units backed off, {woken} woken by {wakes} wakes: "
        f"{took * 1000:.2f} ms per wake"
    )


def owed(units: int, rounds: int = 5) -> str:
    cluster = _Cluster(node_cpu=10**6)
    cluster.queues["a"].spec.min.milli_cpu = 50_000
    cluster.uq.queue_changed("a")
    for i in range(units):
        cluster.submit(f"u-{i}", "a")
    started = time.perf_counter()
    for _ in range(rounds):
        owed = cluster.uq.owed()
    took = (time.perf_counter() - started) / rounds
    cpu = owed["a"].cpu if "a" in owed else 0
    return f"owed: {units} units pending, {cpu}m CPU owed: {took * 1000:.2f} ms per round"


def turns(units: int, queues: int) -> str:
    cluster = _Cluster(node_cpu=10**9)
    names = [f"q{i}" for i in range(queues)]
    for name in names:
        cluster.queues[name] = pb.Queue(metadata=pb.ObjectMeta(name=name))
    for i in range(units):
        cluster.submit(f"u-{i}", names[i % queues])
    sent, took = _send_timed(cluster)
    return f"turns: {sent} units of {queues} queues sent {took}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("case", choices=["others-wait", "freed-room", "owed", "turns"])
    ap.add_argument("--units", type=int, default=0, help="units per tenant (others-wait) or in all")
    ap.add_argument("--queues", type=int, default=100, help="queues (turns)")
    opts = ap.parse_args(argv)
    if opts.case == "others-wait":
        print(others_wait(opts.units or 5000))
    elif opts.case == "freed-room":
        print(freed_room(opts.units or 100_000))
    elif opts.case == "owed":
        print(owed(opts.units or 100_000))
    else:
        print(turns(opts.units or 10_000, max(1, opts.queues)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
