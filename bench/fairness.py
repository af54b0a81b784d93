"""Fairness between queues on a full cluster: two queues compete, one submitting ten times more
work than the other; their dominant shares are sampled over the run.

    python -m bench.fairness                     # 1:1 weights (DRF), 100 nodes, full size
    python -m bench.fairness --weights 1:3       # FairShare: shares should converge to 1:3
    python -m bench.fairness --quick             # a short run (what the e2e test runs)

Every hollow node has one cpu and every pod asks for one, so a queue's dominant share is the
fraction of nodes its pods hold. Pods run for a while (a duration per job, spread so they do not
all finish at once) and finish, so the room keeps freeing and the dispatcher's fairness decides
who gets it. A sample counts while both queues want at least their weighted share of the
cluster (what they hold plus what they have pending; "once both have work") and the first pods'
longest duration has passed: until some pods finish, an empty cluster is simply filled in the
order the work arrived (nothing is taken from anyone; DRF is work-conserving), and only the room
that frees afterwards is the dispatcher's to share. The report gives, over those samples, each
queue's mean share, the mean and worst relative gap between the weighted shares, and the ratio
of the mean shares. Results go to ``--out`` as JSON.

The contention itself (``apply_queues``, ``submit_work``, ``sample``, ``summarise``) is shared
with ``tests/e2e/test_queues.py``, which runs the quick form against its own cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from godel import local
from godel.client import ProtoClient
from protos.godel.v1 import objects_pb2 as pb

LIGHT, HEAVY = "light", "heavy"
# Hollow nodes of one cpu: one 1-cpu pod per node.
ONE_CPU_NODES = ("nodeagent", ("--hollow-cpu-milli", "1000", "--hollow-memory-bytes", str(4 << 30)))


@dataclass(frozen=True)
class Contention:
    nodes: int = 100
    # (light, heavy) queue weights; 1:1 runs DRF, anything else FairShare.
    weights: tuple[int, int] = (1, 1)
    light_jobs: int = 60
    # The heavy queue submits this many times the light queue's work.
    heavy_factor: int = 10
    pods_per_job: int = 5
    # Pod durations spread over [duration_ms, 2 * duration_ms) by job.
    duration_ms: int = 4000
    sample_seconds: float = 0.5
    timeout_seconds: float = 600.0

    @property
    def fairness(self) -> str:
        return "drf" if self.weights[0] == self.weights[1] else "fair-share"

    @classmethod
    def quick(cls, weights: tuple[int, int] = (1, 1)) -> Contention:
        return cls(weights=weights, light_jobs=40, duration_ms=2500)


@dataclass(frozen=True)
class Sample:
    seconds: float
    # Dominant shares in thousandths (Queue.status.dominant_share_permille), pending pods.
    light: int
    heavy: int
    light_pending: int
    heavy_pending: int

    def contended(self, c: Contention) -> bool:
        """Both queues want at least their fair share (what they hold plus what they have
        pending), and the first pods have had time to finish. A queue whose last few pods are
        pending holds less than its share by choice, not by the dispatcher's unfairness: DRF
        hands what it leaves to the other queue."""
        warm = self.seconds * 1000 >= 2 * c.duration_ms
        pod_permille = 1000 / c.nodes  # one pod fills one node (module docstring)
        total_weight = sum(c.weights)
        light_wants = self.light + self.light_pending * pod_permille
        heavy_wants = self.heavy + self.heavy_pending * pod_permille
        wants = (
            light_wants * total_weight >= 1000 * c.weights[0]
            and heavy_wants * total_weight >= 1000 * c.weights[1]
        )
        return warm and self.light_pending > 0 and self.heavy_pending > 0 and wants


@dataclass
class Summary:
    samples: int
    light_mean: float
    heavy_mean: float
    # |light/wl - heavy/wh| / max(light/wl, heavy/wh) over the contended samples.
    gap_mean: float
    gap_max: float
    # mean(heavy) / mean(light): the weights' ratio when fair.
    ratio: float
    # The fraction of contended samples with a gap of at most 10 %.
    within_ten_percent: float = 0.0
    # The mean gap over the later half of the contended samples (after convergence).
    late_gap_mean: float = 0.0
    timeline: list[Sample] = field(default_factory=list)


def apply_queues(client: ProtoClient, c: Contention) -> None:
    queues = [
        pb.Queue(metadata=pb.ObjectMeta(name=name), spec=pb.QueueSpec(weight=weight))
        for name, weight in ((LIGHT, c.weights[0]), (HEAVY, c.weights[1]))
    ]
    client.apply([("Queue", q) for q in queues])


def _jobs(queue: str, count: int, c: Contention) -> list[pb.Job]:
    jobs = []
    for i in range(count):
        job = pb.Job(metadata=pb.ObjectMeta(name=f"{queue}-{i}"))
        job.spec.queue = queue
        job.spec.replicas = c.pods_per_job
        job.spec.min_member = 1
        job.spec.template.requests.milli_cpu = 1000
        job.spec.template.requests.memory_bytes = 100 << 20
        job.spec.template.duration_ms = c.duration_ms + (i * 397) % c.duration_ms
        jobs.append(job)
    return jobs


def submit_work(client: ProtoClient, c: Contention) -> None:
    """Both queues' work at once: the light queue's jobs, and ten times as many heavy ones."""
    light = _jobs(LIGHT, c.light_jobs, c)
    heavy = _jobs(HEAVY, c.light_jobs * c.heavy_factor, c)
    for chunk in range(0, max(len(light), len(heavy)), 100):
        batch = light[chunk : chunk + 100] + heavy[chunk : chunk + 100]
        if batch:
            response = client.submit(batch)
            bad = [r for r in response.results if r.violations]
            if bad:
                raise RuntimeError(f"submission refused: {bad[0]}")


def sample(client: ProtoClient, c: Contention) -> list[Sample]:
    """Queue status every ``sample_seconds`` until the light queue has nothing pending and
    nothing running (its work is done), or the timeout."""
    start = time.monotonic()
    out: list[Sample] = []
    seen_work = False
    while time.monotonic() - start < c.timeout_seconds:
        status = {q.metadata.name: q.status for q in client.list(pb.Queue)}
        light, heavy = status.get(LIGHT), status.get(HEAVY)
        if light is not None and heavy is not None:
            s = Sample(
                round(time.monotonic() - start, 2),
                light.dominant_share_permille,
                heavy.dominant_share_permille,
                light.pending_pods,
                heavy.pending_pods,
            )
            out.append(s)
            seen_work = seen_work or s.light > 0 or s.light_pending > 0
            if seen_work and s.light == 0 and s.light_pending == 0:
                break
        time.sleep(c.sample_seconds)
    return out


def clean_up(client: ProtoClient) -> None:
    """Delete both queues' jobs (their pods go with them) and wait until no pod is left."""
    for job in client.list(pb.Job):
        name = job.metadata.name
        if name.startswith((f"{LIGHT}-", f"{HEAVY}-")):
            client.delete("Job", name)
    deadline = time.monotonic() + 120
    while client.list("Pod") and time.monotonic() < deadline:
        time.sleep(0.5)


def summarise(samples: list[Sample], c: Contention) -> Summary:
    contended = [s for s in samples if s.contended(c) and (s.light or s.heavy)]
    if not contended:
        return Summary(0, 0.0, 0.0, 0.0, 0.0, 0.0, timeline=samples)
    wl, wh = c.weights
    gaps = []
    for s in contended:
        a, b = s.light / wl, s.heavy / wh
        gaps.append(abs(a - b) / max(a, b))
    light = statistics.fmean(s.light for s in contended)
    heavy = statistics.fmean(s.heavy for s in contended)
    late = gaps[len(gaps) // 2 :]
    return Summary(
        len(contended),
        light,
        heavy,
        statistics.fmean(gaps),
        max(gaps),
        heavy / light if light else float("inf"),
        sum(1 for g in gaps if g <= 0.10) / len(gaps),
        statistics.fmean(late),
        samples,
    )


def run(c: Contention) -> Summary:
    """A whole run on a fresh local cluster (stopped in every case)."""
    home = local.GodelHome(Path(tempfile.mkdtemp(prefix="godel-fairness-")))
    spec = local.ClusterSpec(
        hollow_nodes=c.nodes,
        process_node=False,
        fsync="everysec",
        service_args=(ONE_CPU_NODES, ("dispatcher", ("--queue-fairness", c.fairness))),
    )
    state = local.up(home, spec)
    try:
        with ProtoClient(state.address_of("dispatcher"), home=home.path) as client:
            deadline = time.monotonic() + 120
            while len(client.list("Node")) < c.nodes and time.monotonic() < deadline:
                time.sleep(0.5)
            apply_queues(client, c)
            submit_work(client, c)
            return summarise(sample(client, c), c)
    finally:
        with contextlib.suppress(Exception):
            local.down(home)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--weights", default="1:1", help="light:heavy queue weights (1:1)")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    light_w, heavy_w = (int(x) for x in args.weights.split(":"))
    base = Contention.quick((light_w, heavy_w)) if args.quick else Contention()
    c = Contention(**{**asdict(base), "weights": (light_w, heavy_w), "nodes": args.nodes})
    summary = run(c)
    print(
        f"fairness={c.fairness} weights={light_w}:{heavy_w} nodes={c.nodes} "
        f"contended samples={summary.samples}\n"
        f"mean share light={summary.light_mean / 10:.1f}% heavy={summary.heavy_mean / 10:.1f}% "
        f"ratio heavy/light={summary.ratio:.2f} (weights {heavy_w / light_w:.2f})\n"
        f"weighted-share gap mean={summary.gap_mean:.1%} worst={summary.gap_max:.1%} "
        f"late mean={summary.late_gap_mean:.1%}; samples within 10%: "
        f"{summary.within_ten_percent:.0%}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = f"fairness-{light_w}to{heavy_w}{'-quick' if args.quick else ''}-{stamp}.json"
    (args.out / name).write_text(
        json.dumps({"contention": asdict(c), "summary": asdict(summary)}, indent=1)
    )
    return 0 if summary.samples else 1


if __name__ == "__main__":
    sys.exit(main())
