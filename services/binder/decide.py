"""Checking one DecisionBatch against the authoritative state: which pods may bind, and which
victims are evicted for them.

Order, after the per-pod checks (STALE / ERROR): victims claimed serially in batch order
(``victims.py``: one preemptor per victim, re-validated, disruption budgets charged), then
single-node checks grouped per node (each node's placements are checked against a clone of its
NodeInfo, taking off a preemptor's victims just before it and adding accepted pods one by one;
nodes do not depend on each other), then the cross-node rules serially: inter-pod affinity and
topology spread (every placement the node checks accepted, in batch order, against the cluster's
pods plus the batch's placements accepted before it — so two shards' anti-affine pods sent into
one zone at once cannot both bind), job-level affinity, the queues' maxima (each placement
against what its queue's bound pods hold plus the batch's placements accepted before it, less
its own victims: the dispatcher's admission is not the last word), then the gang rule. A gang
rejection frees the room its pods took tentatively (and gives back their victims), so the nodes
it touched are checked again until nothing changes.

Synchronous and free of I/O: the service reads the pods, the victims they name and the jobs,
plans here, then commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from google.protobuf.message import Message

from placement import gpu
from placement.claims import TERMINAL_PHASES
from placement.framework import Framework, JobAffinity, PodInfo
from placement.nodeinfo import NodeInfo, PodRequest
from placement.plugins import gpucards, joblevelaffinity, numatopology
from placement.quotas import SubtreeUsage, queue_of, quota_of
from placement.reservations import hold_for, reservation_of
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.binder.state import ClusterState
from services.binder.victims import VictimClaims
from services.eviction import PREEMPTED, Eviction, EvictionOps
from store.client import Bind, Delete, Op, Update

BOUND = ipb.BOUND
CONFLICT = ipb.CONFLICT
GANG_REJECTED = ipb.GANG_REJECTED
STALE = ipb.STALE
ERROR = ipb.ERROR
NOT_LEADER = ipb.NOT_LEADER


# A job of at most this many pods is deleted in one commit with all its pods: the dispatcher's
# JobDeleter splits only deletions of more objects than one store script carries (about 1,000).
ATOMIC_DELETE_REPLICAS = 100


def informed_jobs(
    batch: ipb.DecisionBatch, informed: Callable[[str], Message | None], revision: int
) -> dict[str, pb.Job]:
    """The batch's jobs whose informer copy (``informed``, as of ``revision``) is as good as a
    fresh read from the store; the caller reads the others. A stream of one-pod jobs otherwise
    costs a Job read per pod.

    What a plan reads of a job of ``min_member`` 1 is whether it exists, its deletion mark and
    its immutable spec (``ever_scheduled`` matters to gangs only). Such a job, when small, is
    deleted in one commit with its pods, so a deletion after ``revision`` — or a deletion and a
    new job of the same name — took the decided pods with it, and their fresh read refuses them.
    The copy must be no older than the pods as decided (``revision`` at least each placement's
    ``pod_resource_version``): an older cache could still hold a deleted job of that name. A
    job marked for deletion is read fresh, as are gangs and big jobs."""
    known: dict[str, pb.Job] = {}
    for unit in batch.units:
        job = informed(unit.job) if unit.job else None
        if (
            isinstance(job, pb.Job)
            and job.spec.min_member <= 1
            and job.spec.replicas <= ATOMIC_DELETE_REPLICAS
            and not job.metadata.deletion_timestamp_ms
            and all(p.pod_resource_version <= revision for p in unit.placements)
        ):
            known[unit.job] = job
    return known


@dataclass(frozen=True, slots=True)
class Rejection:
    code: ipb.VerdictCode.ValueType
    reason: str


NO_NAME = Rejection(ERROR, "placement without a pod name")
DUPLICATE = Rejection(ERROR, "pod appears more than once in the batch")


@dataclass(slots=True)
class Candidate:
    # The pod's and its node's names as read once from the placement: every stage of the plan
    # asks them of every candidate (a protobuf field read is ~0.3 µs, a new string each time).
    name: str
    node: str
    job: str
    placement: ipb.Placement
    pod: pb.Pod
    info: PodInfo
    # The NUMA nodes the pod binds with: the decision's, verified, or chosen here.
    numa_nodes: tuple[int, ...] = ()
    # The GPU cards the pod binds with: the decision's, verified, or chosen here.
    gpu_cards: tuple[int, ...] = ()
    # The reservations' holds the pod may take (hold name -> node), and the one it takes on its
    # node, if any: consumed (the reservation deleted) in the commit that binds it.
    holds: dict[str, str] = field(default_factory=dict)
    hold: str | None = None


class BatchPlan:
    """The verdicts of one batch as they are decided, and the commit that carries the accepted."""

    def __init__(
        self,
        batch: ipb.DecisionBatch,
        pods: dict[str, pb.Pod | None],
        jobs: dict[str, pb.Job | None],
        state: ClusterState,
        rules: Framework,
        victims: Mapping[str, pb.Pod | None],
    ) -> None:
        """``pods``: the batch's pods, ``victims``: the victims it names, ``jobs``: its jobs,
        each as read for this batch (None: gone)."""
        self.batch = batch
        self.jobs = jobs
        self.state = state
        self.rules = rules
        # Every placement in batch order: (job, pod name, node, verdict if malformed).
        self.order: list[tuple[str, str, str, Rejection | None]] = []
        # Well-formed placements per node, in batch order (so a node's check is not a scan of
        # the whole batch: that made a batch of n placements on n nodes cost n²).
        self.on_node: dict[str, list[str]] = {}
        self.candidates: dict[str, Candidate] = {}
        self.rejected: dict[str, Rejection] = {}
        self.gang_rejected: set[str] = set()  # jobs
        # The verdicts other than BOUND, once ``verdicts`` made them.
        self.refused: list[ipb.PodVerdict] = []
        self._precheck(pods)
        self.now_ms = int(time.time() * 1000)
        self.claims = VictimClaims(state, victims, self.now_ms)
        self._claim_victims()

    # --- checks -----------------------------------------------------------------------------

    def _precheck(self, pods: dict[str, pb.Pod | None]) -> None:
        order, on_node, rejected, candidates = (
            self.order,
            self.on_node,
            self.rejected,
            self.candidates,
        )
        owned = self.state.reservations.owned
        for unit in self.batch.units:
            job_name = unit.job
            # What refuses every pod of the unit, judged once for the unit (its pods share it).
            refusal = _unit_refusal(job_name, self.jobs.get(job_name) if job_name else None)
            for p in unit.placements:
                name, node = p.pod, p.node
                if not name:
                    order.append((job_name, name, node, NO_NAME))
                    continue
                if name in rejected or name in candidates:
                    # The first occurrence keeps its verdict; each repeat is an error.
                    order.append((job_name, name, node, DUPLICATE))
                    continue
                order.append((job_name, name, node, None))
                on_node.setdefault(node, []).append(name)
                pod = pods.get(name)
                reason = _invalid(job_name, refusal, p, node, pod)
                if reason is not None:
                    rejected[name] = reason
                    continue
                assert pod is not None
                info = PodInfo.from_pod(pod, keyed=False)
                candidates[name] = Candidate(name, node, job_name, p, pod, info, holds=owned(pod))

    def _claim_victims(self) -> None:
        """Serially, in batch order: each preemptor's victims, or CONFLICT with the reason."""
        for name, cand in list(self.candidates.items()):
            if not cand.placement.victims:
                continue
            why = self.claims.claim(cand.info, cand.node, cand.placement.victims)
            if why is not None:
                self._remove(name, Rejection(CONFLICT, f"preemption on {cand.node!r}: {why}"))

    def _remove(self, name: str, rejection: Rejection) -> None:
        """Refuse an accepted candidate: its verdict, and its victims given back."""
        self.candidates.pop(name, None)
        self.rejected[name] = rejection
        self.claims.release(name)

    def run(self) -> None:
        """Single-node checks per node, then the gang rule, until no gang rejection frees room."""
        node_results: dict[str, dict[str, str | None]] = {}
        dirty = {c.node for c in self.candidates.values()}
        while dirty:
            for node in dirty:
                node_results[node] = self._check_node(node)
            self._topology_check(node_results)
            self._job_affinity_check(node_results)
            self._quota_check(node_results)
            newly = self._gang_check(node_results)
            dirty = {c.node for c in self.candidates.values() if c.job in newly} & set(node_results)
            for job in newly:
                own = {
                    c.name: node_results[c.node].get(c.name)
                    for c in self.candidates.values()
                    if c.job == job
                }
                self._reject_job(job, own)
        for results in node_results.values():
            for name, reason in results.items():
                if reason is not None and name not in self.rejected:
                    self._remove(name, Rejection(CONFLICT, reason))

    def _check_node(self, node: str) -> dict[str, str | None]:
        """Each live candidate on ``node`` → None (fits) or why not, in batch order. Every hard
        rule is re-checked with the placement library's filters (the shard's decision is a
        proposal, never an authority), against the node as bound pods and this batch's earlier
        acceptances leave it."""
        names = [n for n in self.on_node.get(node, ()) if n in self.candidates]
        obj = self.state.nodes.get(node)
        if obj is None:
            return dict.fromkeys(names, f"node {node!r} not found")
        # Judged against the authoritative NodeInfo itself until something must change on
        # it for this batch (a victim or a hold taken off, an accepted pod added for the next
        # one to see): only then a clone, which the batch changes instead. Most nodes get one
        # pod of a batch, which changes nothing there: no clone, no copy of its pod map.
        base = self.state.info_for(node)
        info = base
        last = len(names) - 1
        results: dict[str, str | None] = {}
        for i, name in enumerate(names):
            cand = self.candidates[name]
            failures: list[str] = []
            victims = self.claims.evict.get(name, ())
            if (victims or cand.holds) and info is base:
                info = base.clone()
            # The victims leave just before their preemptor is checked, and come back if it
            # does not fit: earlier placements never get room a later preemptor frees.
            freed = [r for v in victims if (r := info.remove_pod(v.metadata.name)) is not None]
            # So does the reservation's hold it may take here (the one the shard's filters
            # lent it: ``hold_for``), consumed when it binds.
            cand.hold = hold_for(cand.holds, info) if cand.holds else None
            if cand.hold is not None and (held := info.remove_pod(cand.hold)) is not None:
                freed.append(held)
            status = self.rules.run_filters(cand.info, info)
            if status is not None:
                failures.append(f"{status.plugin}: {', '.join(status.reasons)}")
            req = cand.info.req
            if status is None:
                numa = numa_nodes_for(info, req, tuple(cand.placement.numa_nodes))
                if isinstance(numa, str):
                    failures.append(f"{numatopology.NAME}: {numa}")
                else:
                    cand.numa_nodes = numa
                    req = req.pinned(numa) if numa else req
            if status is None and req.requests.gpus:
                cards = gpu_cards_for(info, req, tuple(cand.placement.gpu_cards))
                if isinstance(cards, str):
                    failures.append(f"{gpucards.NAME}: {cards}")
                else:
                    cand.gpu_cards = cards
                    req = req.with_cards(cards)
            if failures:
                _put_back(info, freed)
                cand.hold = None
                results[name] = f"node {node!r}: {'; '.join(failures)}"
            else:
                if i < last:
                    # Holding its NUMA nodes and cards: a later claim on them is refused.
                    if info is base:
                        info = base.clone()
                    info.add_pod(req)
                results[name] = None
        return results

    def _topology_check(self, node_results: dict[str, dict[str, str | None]]) -> None:
        """Inter-pod affinity and spread, serially in batch order: each placement the node checks
        accepted is judged against the bound pods and the batch's placements accepted before it
        (then counted itself); a failure is recorded as its node result (CONFLICT, naming the
        rule). The batch's tentative counts are taken back afterwards: committed binds come back
        through the state's bookkeeping."""
        rules, state = self.rules, self.state
        if not rules.topology_filters:
            return
        live = [
            c
            for c in self.candidates.values()
            if c.job not in self.gang_rejected and node_results.get(c.node, {}).get(c.name) is None
        ]
        if not state.anti_placed and not any(c.info.has_topology for c in live):
            return  # no rule concerns any pod of the batch: no index needed
        counts = state.pod_counts()
        added: list[str] = []
        evicted: list[tuple[str, PodRequest]] = []
        try:
            # Victims leave in the same commit: they no longer count.
            for cand in live:
                for victim in self.claims.evict.get(cand.name, ()):
                    vname = victim.metadata.name
                    vnode = state.pod_node.get(vname)
                    req = counts.pods_on(vnode).get(vname) if vnode is not None else None
                    if vnode is not None and req is not None:
                        counts.remove(vname)
                        evicted.append((vnode, req))
            for cand in live:
                name, node = cand.name, cand.node
                info = cand.info
                if (info.has_topology or counts.has_anti) and rules.prepare(info, counts):
                    target = state.info_for(node)
                    for check in rules.topology_filters:
                        status = check(info, target)
                        if status is not None:
                            node_results[node][name] = (
                                f"node {node!r}: {status.plugin}: {', '.join(status.reasons)} "
                                "(counting bound pods and this batch's earlier placements)"
                            )
                            break
                    info.topology = None
                    if node_results[node][name] is not None:
                        continue
                counts.add(node, info.req)
                added.append(name)
        finally:
            for name in added:
                counts.remove(name)
            for vnode, req in evicted:
                counts.add(vnode, req)

    def _job_affinity_check(self, node_results: dict[str, dict[str, str | None]]) -> None:
        """Job-level affinity, serially: all placed pods of a job with required keys share one
        domain — its bound pods' domain, else that of its first placement the node checks
        accepted in this batch. A placement elsewhere (or on a node lacking the label) is a
        CONFLICT naming both domains, and counts as a failure for the gang rule."""
        live: dict[str, list[Candidate]] = {}
        for cand in self.candidates.values():
            if (
                cand.job not in self.gang_rejected
                and node_results.get(cand.node, {}).get(cand.name) is None
            ):
                live.setdefault(cand.job, []).append(cand)
        nodes = self.state.nodes
        for job_name, cands in live.items():
            job = self.jobs.get(job_name)
            affinity = JobAffinity.from_job(job) if job is not None else None
            if affinity is None or not affinity.required:
                continue
            pod_node = self.state.pod_node
            placed: list[tuple[str, dict[str, str] | None]] = [
                (n, _labels(nodes.get(pod_node[n]))) for n in self.state.job_pods.get(job_name)
            ]
            placed += [(c.name, _labels(nodes.get(c.node))) for c in cands]
            violations = joblevelaffinity.domain_violations(affinity, placed)
            for cand in cands:
                why = violations.get(cand.name)
                if why is not None:
                    node = cand.node
                    node_results[node][cand.name] = f"node {node!r}: {why}"

    def _quota_check(self, node_results: dict[str, dict[str, str | None]]) -> None:
        """The queues' maxima over every placement the earlier checks accepted (recorded as its
        node result, CONFLICT naming the rule; it counts for the gang rule). Judged afresh on
        each pass: a gang rejected since gives back what it took."""
        live = [
            c
            for c in self.candidates.values()
            if c.job not in self.gang_rejected and node_results.get(c.node, {}).get(c.name) is None
        ]
        for name, why in self._over_quota(live).items():
            node_results[self.candidates[name].node][name] = why

    def _over_quota(self, live: list[Candidate]) -> dict[str, str]:
        """Each of ``live`` (in batch order) that would take its queue, or a queue above it, past
        its max → why (``placement.quotas``, every resource of the vector). Serially: each is
        judged against what the queues' bound pods hold plus the placements of ``live``
        accepted before it, its own victims taken off just before (so an earlier placement
        never gets quota a later preemptor frees, and a refused preemptor frees none)."""
        state = self.state
        if not any(quota_of(q) is not None for q in state.queues.values()):
            return {}  # no queue has a max
        # What each queue and the queues below it hold as the batch is judged: bound pods, then
        # the accepted placements.
        usage = SubtreeUsage(state.queues.get, state.queue_usage)
        refused: dict[str, str] = {}
        for cand in live:
            name = cand.name
            queue = queue_of(cand.pod)
            freed = [
                h
                for v in self.claims.evict.get(name, ())
                if (h := state.held_by(v.metadata.name)) is not None
            ]
            for q, amount in freed:
                usage.charge(q, amount, -1)
            if not usage.maxima(queue):
                continue  # no max above it: what it takes is read by no check
            request = cand.info.req.requests
            found = usage.excess(queue, request)
            if found is not None:
                for q, amount in freed:
                    usage.charge(q, amount)
                refused[name] = (
                    f"{found.describe(queue)} (counting its bound pods and this batch's "
                    "earlier placements)"
                )
                continue
            usage.charge(queue, request)
        return refused

    def _gang_check(self, node_results: dict[str, dict[str, str | None]]) -> set[str]:
        """Jobs that have never been scheduled and cannot reach min_member with this batch."""
        accepted: dict[str, int] = {}
        for cand in self.candidates.values():
            if cand.job in self.gang_rejected:
                continue
            accepted.setdefault(cand.job, 0)
            if node_results.get(cand.node, {}).get(cand.name) is None:
                accepted[cand.job] += 1
        return {job for job, n in accepted.items() if not self._gang_ok(job, n)}

    def _gang_ok(self, job_name: str, accepted: int) -> bool:
        job = self.jobs.get(job_name)
        if job is None or job.spec.min_member <= 1 or job.status.ever_scheduled:
            return True  # min_member 1 has no partial state to avoid: plain CONFLICTs say more
        return self.state.bound_count(job_name) + accepted >= job.spec.min_member

    def _reject_job(self, job_name: str, own: dict[str, str | None]) -> None:
        """GANG_REJECTED for every live placement of the job (stale ones stay STALE); ``own``
        holds each pod's own failure, if any, which the reason repeats."""
        self.gang_rejected.add(job_name)
        job = self.jobs.get(job_name)
        need = job.spec.min_member if job is not None else 0
        members = [c.name for c in self.candidates.values() if c.job == job_name]
        fits = self.state.bound_count(job_name) + sum(own.get(n) is None for n in members)
        for name in members:
            reason = (
                f"gang: only {fits} of min_member {need} pods of job {job_name!r} could bind; "
                "none was bound"
            )
            if (failure := own.get(name)) is not None:
                reason += f" (this pod: {failure})"
            self._remove(name, Rejection(GANG_REJECTED, reason))

    # --- after a failed commit --------------------------------------------------------------

    def drop(self, name: str, code: ipb.VerdictCode.ValueType, reason: str) -> None:
        """Take an accepted pod out (the store refused it) and re-apply the gang rule to its
        job; a conflicting pod of a gang that falls short is GANG_REJECTED like the rest. Then
        the queues' maxima again: a refused preemptor's victims stay, and the quota they
        freed with them."""
        self._drop(name, code, reason)
        self._recheck_quotas()

    def _drop(self, name: str, code: ipb.VerdictCode.ValueType, reason: str) -> None:
        cand = self.candidates.get(name)
        if cand is None:
            return
        n = sum(1 for c in self.candidates.values() if c.job == cand.job and c is not cand)
        if code == CONFLICT and not self._gang_ok(cand.job, n):
            self._reject_job(cand.job, {name: reason})
            return
        self._remove(name, Rejection(code, reason))
        if not self._gang_ok(cand.job, n):
            self._reject_job(cand.job, {})

    def drop_job(self, job_name: str, code: ipb.VerdictCode.ValueType, reason: str) -> None:
        for cand in [c for c in self.candidates.values() if c.job == job_name]:
            self._remove(cand.name, Rejection(code, reason))
        self._recheck_quotas()

    def _recheck_quotas(self) -> None:
        """After accepted pods were taken out, the rest judged by the queues' maxima again
        (each refusal is a CONFLICT that re-applies the gang rule) until all hold."""
        while over := self._over_quota(list(self.candidates.values())):
            for name, why in over.items():
                self._drop(name, CONFLICT, why)

    def hold_gone(self, name: str) -> str | None:
        """The reservation pod ``name`` was to consume is gone already (expired, released):
        its room is free, so the pod binds without consuming it. Returns that reservation."""
        cand = self.candidates.get(name)
        if cand is None or cand.hold is None:
            return None
        gone, cand.hold = reservation_of(cand.hold), None
        return gone

    def consumed(self) -> dict[str, str]:
        """The reservations this plan's commit consumes: reservation -> the pod that took it."""
        return {
            reservation_of(c.hold): name
            for name, c in self.candidates.items()
            if c.hold is not None
        }

    def reject_all(self, code: ipb.VerdictCode.ValueType, reason: str) -> None:
        for name in list(self.candidates):
            self._remove(name, Rejection(code, reason))

    # --- the commit -------------------------------------------------------------------------

    def ops(self) -> tuple[list[Op], list[tuple[str, str]]]:
        """The commit: every victim's eviction (with its replacement, if its job replaces lost
        pods) first, so the room it frees is there for the binds; the Bind ops of every
        accepted pod; the Update marking each job that reaches min_member for the first time.
        Each pod that takes a reservation's hold deletes that reservation just before its
        Bind. With, per op, ("Victim" | "Reservation" (naming the pod) | "Pod" | "Job", name)."""
        now = int(time.time() * 1000)
        evictions = EvictionOps(self.state.jobs.get, self.state.names_of_job)
        ops: list[Op] = []
        targets: list[tuple[str, str]] = []
        jobs: dict[str, None] = {}  # in order; a batch of one-pod jobs names thousands
        for name, cand in self.candidates.items():
            node = cand.node
            for victim in self.claims.evict.get(name, ()):
                message = (
                    f"preempted by pod {name!r} (priority {cand.info.priority}) "
                    f"to make room on node {node!r}"
                )
                start = len(evictions.ops)
                evictions.add(Eviction(victim, PREEMPTED, message, by=name), now)
                targets += [("Victim", name)] * (len(evictions.ops) - start)
        ops += evictions.ops
        for cand in self.candidates.values():
            if cand.hold is not None:
                # Consumed with the bind, whatever version it is at: its room is the pod's now.
                ops.append(Delete("Reservation", reservation_of(cand.hold)))
                targets.append(("Reservation", cand.name))
            ops.append(
                Bind(
                    bound_pod(
                        cand.pod,
                        cand.placement,
                        self.batch.shard,
                        now,
                        cand.numa_nodes,
                        cand.gpu_cards,
                    )
                )
            )
            targets.append(("Pod", cand.name))
            jobs[cand.job] = None
        for job_name in jobs:
            job = self.jobs.get(job_name)
            # Only a gang needs the mark (its later pods may then bind one by one); a job of
            # min_member 1 never waits for its siblings, and a write per one-pod job would cost
            # a store write and a change event for every informer, per pod.
            if job is None or job.spec.min_member <= 1 or job.status.ever_scheduled:
                continue
            marked = pb.Job()
            marked.CopyFrom(job)
            marked.status.ever_scheduled = True
            ops.append(Update(marked))
            targets.append(("Job", job_name))
        return ops, targets

    def verdicts(self, bound: dict[str, pb.Pod]) -> ipb.VerdictBatch:
        """One verdict per placement, in batch order; those other than BOUND also kept in
        ``refused`` (what the metrics and the events read: not every verdict again)."""
        out = ipb.VerdictBatch(batch_id=self.batch.batch_id)
        refused = self.refused
        for job, name, node, bad in self.order:
            v = out.verdicts.add(pod=name, job=job, node=node)
            if bad is not None:
                v.code = bad.code
                v.reason = bad.reason
            elif name in bound:
                v.code = BOUND
                v.resource_version = bound[name].metadata.resource_version
                continue
            elif (r := self.rejected.get(name)) is not None:
                v.code = r.code
                v.reason = r.reason
            else:  # accepted but not committed: only if the caller gave up
                v.code = ERROR
                v.reason = "not committed"
            refused.append(v)
        return out


def _unit_refusal(job_name: str, job: pb.Job | None) -> Rejection | None:
    """Why every placement of the unit of ``job_name`` is refused, whatever its pod: no job
    name, its job gone, being deleted or timed out (None: the pods are judged each)."""
    if not job_name:
        return Rejection(ERROR, "unit without a job name")
    if job is None:
        return Rejection(STALE, f"job {job_name!r} not found")
    if job.metadata.deletion_timestamp_ms:
        return Rejection(STALE, f"job {job_name!r} is being deleted")
    if job.status.phase == pb.JOB_TIMEOUT:
        # Timeout is final, as the original's PodGroup: a decision still in flight when the
        # gang timed out binds nothing. (The gang's first bind also writes the job, compare-
        # and-set, so a Timeout written meanwhile fails that commit and it is judged again.)
        return Rejection(
            STALE,
            f"job {job_name!r} timed out waiting to be scheduled "
            f"(`godel retry job/{job_name}` starts it again)",
        )
    return None


def _invalid(
    job_name: str,
    refusal: Rejection | None,
    p: ipb.Placement,
    node: str,
    pod: pb.Pod | None,
) -> Rejection | None:
    """Why placement ``p`` (of a pod named, on ``node``) is refused before any check of room,
    its unit's ``refusal`` (``_unit_refusal``) counted in the order the checks always had."""
    if refusal is not None and refusal.code == ERROR:
        return refusal  # no job name
    if not node:
        return Rejection(ERROR, "placement without a node")
    if pod is None:
        return Rejection(STALE, f"pod {p.pod!r} not found")
    spec = pod.spec
    if spec.job != job_name:
        return Rejection(ERROR, f"pod {p.pod!r} belongs to job {spec.job!r}")
    if refusal is not None:
        return refusal
    meta = pod.metadata
    if meta.deletion_timestamp_ms:
        return Rejection(STALE, "pod is being deleted")
    if spec.node_name:
        return Rejection(STALE, f"pod already bound to {spec.node_name!r}")
    if pod.status.phase in TERMINAL_PHASES:
        return Rejection(STALE, "pod already finished")
    if meta.resource_version != p.pod_resource_version:
        return Rejection(
            STALE,
            f"pod changed: decided at resource_version {p.pod_resource_version}, "
            f"now {meta.resource_version}",
        )
    return None


def bound_pod(
    pod: pb.Pod,
    placement: ipb.Placement,
    shard: str,
    now_ms: int,
    numa_nodes: tuple[int, ...] | None = None,
    gpu_cards: tuple[int, ...] | None = None,
) -> pb.Pod:
    """The pod as the Binder writes it when binding (see services/README.md); ``numa_nodes``
    and ``gpu_cards`` (default: the placement's) are the NUMA nodes and GPU cards the Binder
    verified or chose."""
    out = pb.Pod()
    out.CopyFrom(pod)
    # Each submessage read once, and a repeated or text field written only if it changes: a
    # bind is written per pod, and most pods hold no NUMA nodes, cards, reason or conditions.
    spec, status = out.spec, out.status
    status.scheduler = shard  # the shard whose decision this is
    spec.node_name = placement.node
    numa = placement.numa_nodes if numa_nodes is None else numa_nodes
    if numa or spec.numa_nodes:
        del spec.numa_nodes[:]
        spec.numa_nodes.extend(numa)
    cards = placement.gpu_cards if gpu_cards is None else gpu_cards
    if cards or spec.gpu_cards:
        del spec.gpu_cards[:]
        spec.gpu_cards.extend(cards)
    status.phase = pb.POD_BOUND
    status.bound_ms = now_ms
    if status.reason:
        status.reason = ""
    if status.message:
        status.message = ""
    if status.nominated_node:
        status.nominated_node = ""
    if placement.movement:
        status.movement = placement.movement
    conditions = status.conditions
    if conditions:
        kept = [c for c in conditions if c.type != "PodScheduled"]
        del conditions[:]
        conditions.extend(kept)
    conditions.add(type="PodScheduled", status="True", last_transition_ms=now_ms)
    return out


def numa_nodes_for(
    info: NodeInfo, req: PodRequest, proposed: tuple[int, ...]
) -> tuple[int, ...] | str:
    """The NUMA nodes ``req`` binds with on ``info``: the decision's proposal if it still holds
    (a claim on a NUMA node held exclusively by another pod is refused, never moved), the
    Binder's own choice when the decision named none, or why neither works."""
    if proposed or not req.numa_policy:
        why = numatopology.verify(info, req, proposed)
        return why if why is not None else proposed
    found = numatopology.choose(info, req)
    return found.reason if isinstance(found, numatopology.NumaFailure) else found


def gpu_cards_for(
    info: NodeInfo, req: PodRequest, proposed: tuple[int, ...]
) -> tuple[int, ...] | str:
    """The GPU cards ``req`` binds with on ``info``: the decision's proposal if those cards
    still hold it (a card another shard's pod took since is refused, never moved: the shard
    retries against a refreshed view), the Binder's own choice (``gpu.choose_cards``) when the
    decision named none, or why neither works."""
    if proposed:
        why = gpu.verify_cards(info, req, proposed)
        return why if why is not None else proposed
    found = gpu.choose_cards(info, req)
    return found.reason if isinstance(found, gpu.GpuFailure) else found


def _labels(node: pb.Node | None) -> dict[str, str] | None:
    return dict(node.metadata.labels) if node is not None else None


def _put_back(info: NodeInfo, reqs: list[PodRequest]) -> None:
    for r in reqs:
        info.add_pod(r)


def uniform(
    batch: ipb.DecisionBatch, code: ipb.VerdictCode.ValueType, reason: str
) -> ipb.VerdictBatch:
    """The same verdict for every placement of the batch (e.g. NOT_LEADER)."""
    out = ipb.VerdictBatch(batch_id=batch.batch_id)
    for unit in batch.units:
        for p in unit.placements:
            out.verdicts.add(pod=p.pod, job=unit.job, node=p.node, code=code, reason=reason)
    return out
