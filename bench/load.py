"""The load generator: submits a workload's measured pods through the Dispatcher's public API.

    python -m bench.load --plan PLAN.json

A separate process on purpose: its CPU is measured on its own and it does not share the
harness's interpreter (GIL) with the sampler. The plan names the dispatcher, the job prefix and
the pod phase (see :class:`bench.workload.PodPhase`). It builds every job first, then prints one
JSON line ``{"event": "started", ...}`` to stdout, submits (as fast as possible, or paced at
``rate`` pods/s), and prints ``{"event": "done", ...}``. Exit code 1 if a submit is refused.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.workload import PodPhase, job_template, share_shapes
from godel.client import ClientError, ProtoClient
from placement.gpufrag import TaskShape
from protos.godel.v1 import objects_pb2 as pb

MAX_PODS_PER_REQUEST = 1000
"""Pods per Submit request when jobs are small: batching is how a real client keeps up."""


def build_jobs(prefix: str, phase: PodPhase, nodes: Sequence[str] = ()) -> list[pb.Job]:
    """The jobs of a pod phase: ``<prefix>-<i>``, ``job_size`` pods each (the last one smaller
    if count is not a multiple), gang jobs spread evenly by ``gang_percent``, round-robin over
    the phase's queues."""
    queues = phase.queue_names()
    if phase.per_node:
        if len(nodes) < phase.count:
            raise ValueError(f"per_node needs {phase.count} nodes, found {len(nodes)}")
        jobs = []
        for i, node in enumerate(nodes[: phase.count]):
            job = job_template(phase.template, 1, 1, node=node, job=phase.job)
            job.metadata.name = f"{prefix}-{i}"
            if queues:
                job.spec.queue = queues[i % len(queues)]
            jobs.append(job)
        return jobs
    base = job_template(phase.template, phase.job_size, phase.min_member, job=phase.job)
    jobs = []
    for i, start in enumerate(range(0, phase.count, phase.job_size)):
        job = pb.Job()
        job.CopyFrom(base)
        job.metadata.name = f"{prefix}-{i}"
        job.spec.replicas = min(phase.job_size, phase.count - start)
        gang = (i + 1) * phase.gang_percent // 100 > i * phase.gang_percent // 100
        job.spec.min_member = (
            job.spec.replicas if gang else min(phase.min_member, job.spec.replicas)
        )
        if queues:
            job.spec.queue = queues[i % len(queues)]
        jobs.append(job)
    if phase.gpu_shares:
        draw_gpu_shares(jobs, share_shapes(phase.gpu_shares), random.Random(prefix))
    return jobs


def draw_gpu_shares(
    jobs: Sequence[pb.Job], shapes: Sequence[TaskShape], rng: random.Random
) -> None:
    """Each job's pods become one of ``shapes`` (drawn at random, so as often as the trace has
    it): its cpu and memory, one card and its share of it."""
    for job in jobs:
        shape = rng.choice(shapes)
        template = job.spec.template
        template.requests.milli_cpu = shape.cpu_milli
        template.requests.memory_bytes = shape.memory
        template.requests.gpus = 1
        template.gpu_milli = shape.gpu_milli


def create_queues(client: ProtoClient, phase: PodPhase) -> None:
    """The phase's tenant queues, equal and without quotas (unchanged if they exist)."""
    names = phase.queue_names()
    if names:
        client.apply([("Queue", pb.Queue(metadata=pb.ObjectMeta(name=n))) for n in names])


def batches(jobs: Sequence[pb.Job], rate: float) -> Iterator[list[pb.Job]]:
    """Jobs grouped into Submit requests of up to MAX_PODS_PER_REQUEST pods (at a paced rate,
    about 20 requests a second, so the offered load stays smooth)."""
    limit = MAX_PODS_PER_REQUEST if rate <= 0 else max(1, min(MAX_PODS_PER_REQUEST, int(rate / 20)))
    batch: list[pb.Job] = []
    pods = 0
    for job in jobs:
        if batch and pods + job.spec.replicas > limit:
            yield batch
            batch, pods = [], 0
        batch.append(job)
        pods += job.spec.replicas
    if batch:
        yield batch


def submit_all(client: ProtoClient, jobs: Sequence[pb.Job], rate: float) -> dict[str, Any]:
    started = time.monotonic()
    submitted = requests = 0
    for batch in batches(jobs, rate):
        if rate > 0:
            # Send a request when its first pod is due at the offered rate.
            due = started + submitted / rate
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
        response = client.submit(batch)
        requests += 1
        for job, result in zip(batch, response.results, strict=True):
            if not (result.created or result.existing):  # existing: a retried call
                violations = "; ".join(f"{v.field}: {v.description}" for v in result.violations)
                raise RuntimeError(f"job {job.metadata.name} refused: {violations}")
        submitted += sum(j.spec.replicas for j in batch)
    return {"submitted": submitted, "requests": requests, "seconds": time.monotonic() - started}


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, "wall": time.time(), **fields}) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Submit a benchmark's measured pods.")
    parser.add_argument("--plan", type=Path, required=True, help="JSON plan written by the harness")
    opts = parser.parse_args(argv)
    plan = json.loads(opts.plan.read_text())
    phase = PodPhase.from_json(plan["phase"])
    home = Path(plan["home"]) if "home" in plan else None  # its credentials: home/tls
    with ProtoClient(
        plan["dispatcher"], timeout=float(plan.get("timeout", 120)), home=home
    ) as client:
        nodes: list[str] = []
        if phase.per_node:
            nodes = sorted(n.metadata.name for n in client.list(pb.Node))
        jobs = build_jobs(plan["prefix"], phase, nodes)
        create_queues(client, phase)
        _emit("started", jobs=len(jobs), pods=sum(j.spec.replicas for j in jobs))
        try:
            result = submit_all(client, jobs, phase.rate)
        except (ClientError, RuntimeError) as exc:
            _emit("failed", error=str(exc))
            return 1
    _emit("done", **result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
