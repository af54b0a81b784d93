"""Every Prometheus metric the services report: the one place their names are defined.

Names follow Prometheus conventions: ``godel_<component>_<what>_<unit>``, counters end in
``_total``, durations are in seconds. Rates ("pods bound per second") are ``rate()`` of the
counters. The store's own metrics (round-trip time, informer lag) are in ``store/metrics.py``;
the HTTP endpoint that serves them all is ``services/runtime/metrics.py``.

Cost on the hot path: counters are incremented once per unit or per batch by the number of pods
(never once per pod), gauges are sampled once per ``metrics_sample_seconds`` by
``Service.sample_metrics`` off the hot path, and the only per-pod work is one histogram
observation of a bound pod's submit→bound latency (a bucket search, done after the batch's commit).

Several services started in one process (as some tests do) share these series: a process is one
service in every real deployment.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import Counter, Histogram

from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.runtime.metrics import SampledGauge

# A unit's search: sub-millisecond for a small unit on a warm cache, seconds for a huge gang.
_SCHEDULING_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0,
)  # fmt: skip
# Submit → bound: from a few milliseconds on an idle cluster to minutes in a contended queue.
_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip

# --- dispatcher ------------------------------------------------------------------------------

DISPATCHER_QUEUE_PENDING_PODS = SampledGauge(
    "godel_dispatcher_queue_pending_pods",
    "Pods waiting in each queue (not yet bound), as the dispatcher accounts them",
    ("queue",),
)
DISPATCHER_QUEUE_PENDING_UNITS = SampledGauge(
    "godel_dispatcher_queue_pending_units",
    "Scheduling units (jobs) with pods waiting in each queue",
    ("queue",),
)
DISPATCHER_SHARD_CREDITS = SampledGauge(
    "godel_dispatcher_shard_credits",
    "Pods the dispatcher may still send to each scheduler shard (credit-based flow control)",
    ("shard",),
)
DISPATCHER_SHARD_UNDECIDED_PODS = SampledGauge(
    "godel_dispatcher_shard_undecided_pods",
    "Pods dispatched to each scheduler shard and not yet decided",
    ("shard",),
)

# --- scheduler shard -------------------------------------------------------------------------

SCHEDULER_PODS_SCHEDULED = Counter(
    "godel_scheduler_pods_scheduled_total",
    "Pods a shard placed and proposed to the Binder (rate(): pods scheduled per second)",
)
SCHEDULER_UNITS_UNSCHEDULABLE = Counter(
    "godel_scheduler_units_unschedulable_total",
    "Unit attempts that found no placement reaching min_member",
)
SCHEDULER_SCHEDULING_DURATION = Histogram(
    "godel_scheduler_scheduling_duration_seconds",
    "Time to search placements for one scheduling unit (all its pods), one sample per attempt",
    buckets=_SCHEDULING_BUCKETS,
)
SCHEDULER_PENDING_UNITS = SampledGauge(
    "godel_scheduler_pending_units",
    "Units a shard holds that wait to be scheduled: ready now, or in backoff",
    ("state",),
)

# --- binder ----------------------------------------------------------------------------------

BINDER_PODS_BOUND = Counter(
    "godel_binder_pods_bound_total",
    "Pods the Binder leader committed (rate(): pods bound per second)",
)
BINDER_CONFLICTS = Counter(
    "godel_binder_conflicts_total",
    "Placements the Binder refused, by reason (the verdict): conflict (another decision took "
    "the room first), gang_rejected (too few of the unit could bind), stale (the pod changed "
    "since the decision), not_leader, error",
    ["reason"],
)
BINDER_PREEMPTIONS = Counter(
    "godel_binder_preemptions_total",
    "Victim pods evicted so that a higher-priority pod could bind",
)
BINDER_SUBMIT_TO_BOUND = Histogram(
    "godel_binder_submit_to_bound_seconds",
    "From a pod's creation (submit) to its bind commit",
    buckets=_LATENCY_BUCKETS,
)
BINDER_IS_LEADER = SampledGauge(
    "godel_binder_is_leader", "1 while this Binder leads (holds the lease and has caught up)"
)
BINDER_LEASE_EPOCH = SampledGauge(
    "godel_binder_lease_epoch", "Fencing epoch of the lease this Binder holds (0 when standby)"
)
BINDER_QUEUED_WORK = SampledGauge(
    "godel_binder_queued_batches", "Decision batches and eviction requests waiting to be decided"
)

# --- node agent ------------------------------------------------------------------------------

NODEAGENT_PODS_RUNNING = SampledGauge(
    "godel_nodeagent_pods_running",
    "Pods this agent runs now, by mode (hollow: simulated; process: a real process)",
    ("mode",),
)
NODEAGENT_NODES = SampledGauge("godel_nodeagent_nodes", "Nodes this agent serves")
NODEAGENT_STATUS_WRITES_PENDING = SampledGauge(
    "godel_nodeagent_status_writes_pending", "Pod phase changes waiting to be written to the store"
)

NODEAGENT_LOAD_MILLI_CPU = SampledGauge(
    "godel_nodeagent_load_milli_cpu",
    "Measured CPU load of this agent's nodes, milli-CPU: their total and the highest node's",
    ("stat",),
)
NODEAGENT_LOAD_NETWORK = SampledGauge(
    "godel_nodeagent_load_network_bytes_per_second",
    "Measured network load of this agent's nodes, bytes/s: their total and the highest node's",
    ("stat",),
)

# --- rescheduler -----------------------------------------------------------------------------

RESCHEDULER_ROUNDS = Counter(
    "godel_rescheduler_rounds_total",
    "Rescheduling rounds by policy and outcome (dry runs included, labelled)",
    ["policy", "outcome", "dry_run"],
)
RESCHEDULER_PODS_EVICTED = Counter(
    "godel_rescheduler_pods_evicted_total",
    "Pods evicted by executed rescheduling rounds (each got a replacement)",
    ["policy"],
)

# The cluster's GPU fragmentation as the rescheduler measures it (``placement.gpu.gpu_figures``),
# recomputed every ``gpu_figures_seconds`` from its informer, not only when a round runs.
RESCHEDULER_GPU_EXPECTED_FRAGMENTATION = SampledGauge(
    "godel_rescheduler_gpu_expected_fragmentation_ratio",
    "Expected GPU fragmentation (the GpuFragmentation score's measure over the running pods' GPU "
    "shapes): the share of free GPU a task of the mix could not use, 0..1",
)
RESCHEDULER_GPU_FRAGMENTATION = SampledGauge(
    "godel_rescheduler_gpu_fragmentation_ratio",
    "Free GPU on nodes with some GPU in use / all free GPU: what a whole-machine task cannot "
    "use, 0..1",
)
RESCHEDULER_WHOLE_FREE_GPU_NODES = SampledGauge(
    "godel_rescheduler_whole_free_gpu_nodes",
    "Nodes with GPUs, none of them in use",
)
RESCHEDULER_FREE_GPU_MILLI = SampledGauge(
    "godel_rescheduler_free_gpu_milli",
    "Free GPU of the cluster's nodes, milli-GPU (the fragmentation ratios' denominator)",
)

_VERDICT_REASONS = {
    code: ipb.VerdictCode.Name(code).lower()
    for code in ipb.VerdictCode.values()
    if code not in (ipb.BOUND, ipb.VERDICT_UNSPECIFIED)
}


def record_verdicts(
    batch: ipb.DecisionBatch,
    verdicts: ipb.VerdictBatch,
    bound: Iterable[pb.Pod],
    now_ms: int,
    *,
    refused: Iterable[ipb.PodVerdict] | None = None,
    any_victims: bool = True,
) -> None:
    """A decided batch: pods bound, refusals by verdict, victims evicted, submit→bound latency.
    Counters move once per batch (and per refusal reason present), not once per pod.
    ``refused``: the verdicts other than BOUND, when the caller holds them apart (else read
    from ``verdicts``); ``any_victims``: False when no placement of the batch names a victim
    (its placements are then not read again)."""
    bound_count = 0
    for pod in bound:
        bound_count += 1
        bound_ms = pod.status.bound_ms or now_ms
        BINDER_SUBMIT_TO_BOUND.observe(max(bound_ms - pod.metadata.creation_timestamp_ms, 0) / 1000)
    if bound_count:
        BINDER_PODS_BOUND.inc(bound_count)
    codes = [v.code for v in (verdicts.verdicts if refused is None else refused)]
    tally = Tally(code for code in codes if code in _VERDICT_REASONS)
    for code, count in tally.items():
        BINDER_CONFLICTS.labels(_VERDICT_REASONS[code]).inc(count)
    if bound_count and any_victims:
        bound_names = {v.pod for v in verdicts.verdicts if v.code == ipb.BOUND}
        victims = sum(
            len(p.victims) for u in batch.units for p in u.placements if p.pod in bound_names
        )
        if victims:
            BINDER_PREEMPTIONS.inc(victims)
