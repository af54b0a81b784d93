"""Audit a cluster's state against the invariants of ARCHITECTURE §5 (1–3, and 6 for
preemption), the hard topology rules (4–5, 7–8) and the queues' maxima (9):

1. no node is over-committed, per resource and per pool, counting bound and running pods;
2. a pod is bound to at most one node, once (the store's claim agrees with the pod);
3. a unit that has never been scheduled has either at least ``min_member`` pods placed or none;
4. no placed pod shares a domain of a required anti-affinity term's topology key with a pod its
   term selects (whichever pod declared the term);
5. every ``DoNotSchedule`` spread constraint of a placed pod holds: over the domains its pod may
   use, the pods its selector matches differ by at most ``maxSkew`` between the fullest and the
   emptiest domain. (Kubernetes promises this as pods are placed; pods that end, or matching pods
   without the constraint, can break it later, and are reported too.)
6. a pod evicted by preemption (reason ``Preempted``) was preemptible and names its preemptor,
   which (while it exists) is of the same pool, of strictly higher priority, was placed on
   the victim's node, and may preempt (its ``preemptionPolicy`` is not Never:
   ``placement.preemption.can_preempt``);
7. every NUMA-bound pod (policy single or exclusive) holds NUMA nodes its node reports, that
   fit it by its policy, and no NUMA node is held exclusively by one pod and used by another
   (``placement.plugins.numatopology.verify``, as the Binder checks a decision);
8. every job with a job-level affinity has all its placed pods in one domain of its required
   keys (``placement.plugins.joblevelaffinity.domain_violations``, as the Binder checks);
9. no queue's bound and running pods (with those of the queues below it) hold more than its max,
   ``spec.quota``, in any resource (``placement.quotas``, as the Binder checks). A max lowered
   below what a queue already holds is reported too: nothing is evicted for it;
10. GPU cards (``placement.gpu.card_problems``): no card holds over 1000 milli-GPU, no whole
   card is shared with anything, every card a pod holds is within 0..n-1 of its node's and it
   holds as many as it asks (one for a share), and its node's model is one the pod accepts.
11. no node is over-committed counting live reservations' holds beside its pods (each hold is
   room kept for its owner, ``placement.reservations``), and no reservation holds room on a node
   that does not exist.

Reads one consistent snapshot of the store; used by the end-to-end tests after every run and by
``godel audit`` on a live cluster.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from placement.claims import CLAIM_PHASES, holds_claim
from placement.framework import JobAffinity, PodInfo
from placement.gpu import card_problems
from placement.labelselector import matches
from placement.nodeinfo import (
    NodeInfo,
    PodRequest,
    pool_of,
    port_conflict,
    resource_fit_failures,
)
from placement.plugins import joblevelaffinity, numatopology
from placement.plugins.podtopologyspread import eligible_domains
from placement.preemption import can_preempt
from placement.quotas import SubtreeUsage, format_amount, queue_of
from placement.reservations import hold_request, holds_room
from placement.resources import Quantities
from placement.topology import TopologyIndex
from protos.godel.v1 import objects_pb2 as pb
from store import Store

PREEMPTED = "Preempted"  # services.eviction.PREEMPTED (the CLI does not import the services)


@dataclass
class AuditReport:
    nodes: int = 0
    pods: int = 0
    bound: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


async def audit(store: Store) -> AuditReport:
    # The claims in the same snapshot as the pods: on a busy cluster, read apart, a pod bound
    # in between would show as a claim held by no bound pod.
    listing = await store.list_kinds(["Node", "Pod", "Job", "Queue", "Reservation"], claims=True)
    claims = listing.claims
    nodes = {n.metadata.name: n for n in listing.items_of(pb.Node)}
    pods = listing.items_of(pb.Pod)
    jobs = {j.metadata.name: j for j in listing.items_of(pb.Job)}
    queues = {q.metadata.name: q for q in listing.items_of(pb.Queue)}
    report = AuditReport(nodes=len(nodes), pods=len(pods))
    infos = {name: NodeInfo.from_node(n) for name, n in nodes.items()}
    # One check per invariant family, in this order (the report lists violations as found).
    _audit_room(report, infos, pods)
    _audit_topology(report, infos, pods)
    _audit_claims(report, pods, claims)
    _audit_gangs(report, pods, jobs)
    _audit_job_affinity(report, infos, pods, jobs)
    _audit_preemptions(report, pods)
    _audit_quotas(report, pods, queues)
    _audit_cards(report, infos)
    # Last: the holds join the nodes the other checks read as their pods left them.
    _audit_reservations(report, infos, listing.items_of(pb.Reservation))
    return report


def _audit_reservations(
    report: AuditReport, infos: dict[str, NodeInfo], reservations: list[pb.Reservation]
) -> None:
    """10: every live reservation's hold added to its node after its pods (the fit rule every
    judge of room uses); one that does not fit over-commits the node."""
    for rsv in sorted(reservations, key=lambda r: r.metadata.name):
        if not holds_room(rsv):
            continue
        name, node = rsv.metadata.name, rsv.status.node
        info = infos.get(node)
        if info is None:
            report.violations.append(f"reservation {name} holds room on unknown node {node}")
            continue
        hold = hold_request(rsv)
        failures = resource_fit_failures(info, hold)
        if port_conflict(info, hold):
            failures.append("host port in use")
        if failures:
            report.violations.append(
                f"node {node} over-committed by reservation {name}: " + ", ".join(failures)
            )
        info.add_pod(hold)


def _audit_room(report: AuditReport, infos: dict[str, NodeInfo], pods: list[pb.Pod]) -> None:
    """1 and 7: re-add every holding pod to its fresh ``NodeInfo`` (counted in
    ``report.bound``); any addition that does not fit is an over-commit (the same fit rule the
    scheduler and binder use), and its NUMA nodes are verified against the NUMA-bound pods
    counted before it."""
    for pod in pods:
        if not holds_claim(pod):
            continue
        report.bound += 1
        info = infos.get(pod.spec.node_name)
        if info is None:
            report.violations.append(
                f"pod {pod.metadata.name} holds unknown node {pod.spec.node_name}"
            )
            continue
        request = PodRequest.from_pod(pod)
        failures = resource_fit_failures(info, request)
        if failures:
            report.violations.append(
                f"node {info.name} over-committed by pod {pod.metadata.name}: "
                + ", ".join(failures)
            )
        if request.numa_policy or request.numa_nodes:
            why = numatopology.verify(info, request, request.numa_nodes)
            if why is not None:
                report.violations.append(
                    f"pod {pod.metadata.name} on {info.name}: NUMA assignment "
                    f"{list(request.numa_nodes)} broken: {why}"
                )
        info.add_pod(request)


def _audit_cards(report: AuditReport, infos: dict[str, NodeInfo]) -> None:
    """10: every node's GPU cards, over the holding pods ``_audit_room`` put on it."""
    for info in infos.values():
        if info.card_used or any(r.requests.gpus for r in info.pods.values()):
            report.violations.extend(card_problems(info))


def _audit_claims(report: AuditReport, pods: list[pb.Pod], claims: Mapping[str, str]) -> None:
    """2: claims and pods agree: each holding pod has exactly its claim; nothing else has one."""
    holding = {p.metadata.name: p for p in pods if holds_claim(p)}
    for name, pod in holding.items():
        claim = claims.get(name)
        if claim is None:
            report.violations.append(f"pod {name} is bound to {pod.spec.node_name} without claim")
        elif claim.split()[0] != pod.spec.node_name:
            report.violations.append(
                f"pod {name} is bound to {pod.spec.node_name} but claims {claim.split()[0]}"
            )
    for name in claims.keys() - holding.keys():
        report.violations.append(f"claim of {name} is held by no bound or running pod")


def _audit_gangs(report: AuditReport, pods: list[pb.Pod], jobs: dict[str, pb.Job]) -> None:
    """3: every job whose pods were ever placed got at least min_member of them placed."""
    placed: dict[str, int] = defaultdict(int)
    for pod in pods:
        if pod.spec.node_name:
            placed[pod.spec.job] += 1
    for job_name, count in placed.items():
        job = jobs.get(job_name)
        if job is not None and count < job.spec.min_member:
            report.violations.append(
                f"job {job_name} has {count} pod(s) placed, fewer than min_member "
                f"{job.spec.min_member}"
            )


def _audit_job_affinity(
    report: AuditReport, infos: dict[str, NodeInfo], pods: list[pb.Pod], jobs: dict[str, pb.Job]
) -> None:
    """8: each job's placed pods share one domain of its required keys."""
    placed_by_job: dict[str, list[pb.Pod]] = defaultdict(list)
    for pod in pods:
        if holds_claim(pod):
            placed_by_job[pod.spec.job].append(pod)
    for job_name, members in placed_by_job.items():
        job = jobs.get(job_name)
        affinity = JobAffinity.from_job(job) if job is not None else None
        if affinity is None or not affinity.required:
            continue
        members.sort(key=lambda p: (p.status.bound_ms, p.metadata.name))
        broken = joblevelaffinity.domain_violations(
            affinity,
            [
                (p.metadata.name, infos[p.spec.node_name].labels)
                if p.spec.node_name in infos
                else (p.metadata.name, None)
                for p in members
            ],
        )
        for name, why in sorted(broken.items()):
            report.violations.append(f"job {job_name}: pod {name} breaks job-level affinity: {why}")


def _audit_preemptions(report: AuditReport, pods: list[pb.Pod]) -> None:
    """6: preemption evicted only lower-priority, preemptible pods of the preemptor's pool."""
    by_name = {p.metadata.name: p for p in pods}
    for victim in pods:
        if victim.status.reason != PREEMPTED:
            continue
        name, by = victim.metadata.name, victim.status.preempted_by
        if not victim.spec.preemptible or not by:
            report.violations.append(
                f"pod {name} was preempted but is not preemptible or names no preemptor"
            )
            continue
        preemptor = by_name.get(by)
        if preemptor is None:
            continue  # deleted since: nothing left to compare
        if not can_preempt(preemptor):
            report.violations.append(
                f"pod {name} was preempted by {by}, whose preemptionPolicy is Never"
            )
            continue
        if (
            preemptor.spec.priority <= victim.spec.priority
            or pool_of(preemptor.spec.qos) != pool_of(victim.spec.qos)
            or preemptor.spec.node_name != victim.spec.node_name
        ):
            report.violations.append(
                f"pod {name} was preempted by {by}, which is not a higher-priority pod of its "
                "pool placed on its node"
            )


def _audit_quotas(report: AuditReport, pods: list[pb.Pod], queues: dict[str, pb.Queue]) -> None:
    """9: what each queue's holding pods ask, against every max (a parent's counting the queues
    below it)."""
    held: dict[str, Quantities] = defaultdict(Quantities)
    for pod in pods:
        if holds_claim(pod):
            held[queue_of(pod)].add(Quantities.shared_request(pod.spec.template))
    for found in SubtreeUsage(queues.get, held).over_max(sorted(queues)):
        e = found.excess
        report.violations.append(
            f"queue {found.queue} holds {format_amount(e.resource, e.want)} of {e.resource} "
            f"in bound pods, over its max {format_amount(e.resource, e.limit)}"
        )


def _audit_topology(report: AuditReport, infos: dict[str, NodeInfo], pods: list[pb.Pod]) -> None:
    """4 and 5, from one topology index of every holding pod (as the shards and Binder count)."""
    holding = [
        p
        for p in pods
        if p.spec.node_name in infos
        and p.status.phase in CLAIM_PHASES
        and (
            p.spec.template.affinity.pod_anti_affinity.required
            or p.spec.template.topology_spread_constraints
        )
    ]
    if not holding:
        return
    index = TopologyIndex()
    index.activate(infos.values())
    checked: set[tuple[object, ...]] = set()
    for pod in holding:
        info = PodInfo.from_pod(pod, keyed=False)
        node = infos[pod.spec.node_name]
        for term in info.req.anti_terms:
            domain = node.labels.get(term.topology_key)
            if domain is None:
                continue
            others = index.domain_counts(term.selector, term.topology_key).get(domain, 0)
            others -= 1 if matches(term.selector, info.labels) else 0
            if others > 0:
                report.violations.append(
                    f"pod {pod.metadata.name} on {node.name}: required anti-affinity broken, "
                    f"{others} matching pod(s) in {term.topology_key}={domain}"
                )
        for c in info.spread:
            key = (c.selector, c.topology_key, c.max_skew, info.node_selector, info.required_terms)
            if not c.hard or key in checked:
                continue
            checked.add(key)
            counts = index.domain_counts(c.selector, c.topology_key)
            eligible = eligible_domains(info, c.topology_key, index)
            per_domain = [counts.get(d, 0) for d in eligible]
            if per_domain and max(per_domain) - min(per_domain) > c.max_skew:
                fullest = max(eligible, key=lambda d: counts.get(d, 0))
                report.violations.append(
                    f"spread of job {pod.spec.job} over {c.topology_key} broken: skew "
                    f"{max(per_domain) - min(per_domain)} > maxSkew {c.max_skew} "
                    f"({c.topology_key}={fullest} holds {max(per_domain)}, the emptiest "
                    f"{min(per_domain)})"
                )
