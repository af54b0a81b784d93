"""JobLevelAffinity: a gang's pods together in one topology domain (Gödel's job-level affinity
locating/grouping unit plugin, reference/godel-scheduler.md §3.8).

A job's ``JobAffinity`` names node label keys. Nodes with equal values of every *required* key
form one domain (a rack, a mainnet): every placed pod of the job must be in one of them. The
grouping step turns that into the node groups the unit search tries in order, each on its own:

1. If pods of the job are already placed, only their domain (the rest must join them).
2. Otherwise every domain, nodes lacking a key left out, cut off when its free room in the pods'
   pool (cpu, memory, GPUs, pod slots) is below what the gang needs at least (the ``needed``
   smallest requests), then sorted best fit first: the least free cpu, memory, GPUs — the
   tightest domain that can still hold the gang, so large domains stay for large gangs.
3. Within each domain, the *preferred* keys (coarse to fine, e.g. ``[switch]``) subdivide it:
   its finest subdomains first (cut off and sorted the same way), then coarser ones, then the
   whole required domain. So the gang spills from a preferred domain only within its required
   one, never across it. With preferred keys only, the last group is every node.

A unit that fits no domain gets a reason that says so (``godel explain``). The grouping only
orders and confines; the filters still judge every pod on every node. The Binder re-checks the
required rule across the batch (``domain_violations``), as does ``godel audit``.

Differences from Gödel: no node selector or sort rules in the affinity (pods' own node
selectors apply), free room (not capacity) orders domains.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

from placement.framework import (
    GroupingPlugin,
    JobAffinity,
    NoArgs,
    NodeGroups,
    PluginSpec,
    UnitInfo,
)
from placement.nodeinfo import NodeInfo

NAME = "JobLevelAffinity"

Domain = tuple[str, ...]


def domain_of(labels: Mapping[str, str], keys: Iterable[str]) -> Domain | None:
    """The node's domain over ``keys`` (their values in order); None if it lacks one."""
    values = []
    for key in keys:
        value = labels.get(key)
        if value is None:
            return None
        values.append(value)
    return tuple(values)


def describe_domain(keys: tuple[str, ...], domain: Domain) -> str:
    return ",".join(f"{k}={v}" for k, v in zip(keys, domain, strict=True))


def _needs(unit: UnitInfo) -> tuple[str, list[int]]:
    """The pods' pool, and what the gang needs at least: the ``needed`` smallest requests per
    resource, and as many pod slots."""
    pods = unit.pods
    pool = pods[0].req.pool if pods else "g"
    n = unit.needed
    cpu = sorted(p.req.requests.cpu for p in pods)[:n]
    mem = sorted(p.req.requests.mem for p in pods)[:n]
    gpu = sorted(p.req.requests.gpus for p in pods)[:n]
    total = [sum(cpu), sum(mem), sum(gpu), n]
    return pool, total


def _free(nodes: list[NodeInfo], pool: str) -> list[int]:
    free = [0, 0, 0, 0]
    for node in nodes:
        cpu, mem, gpu = node.free(pool)
        free[0] += cpu
        free[1] += mem
        free[2] += gpu
        free[3] += node.max_pods - len(node.pods)
    return free


def _split(
    nodes: list[NodeInfo], keys: tuple[str, ...]
) -> tuple[dict[Domain, list[NodeInfo]], int]:
    """Nodes by domain over ``keys``, and how many lack a key."""
    domains: dict[Domain, list[NodeInfo]] = {}
    lacking = 0
    for node in nodes:
        d = domain_of(node.labels, keys)
        if d is None:
            lacking += 1
        else:
            domains.setdefault(d, []).append(node)
    return domains, lacking


def _best_fit_first(
    domains: dict[Domain, list[NodeInfo]], pool: str, need: list[int]
) -> list[tuple[Domain, list[NodeInfo]]]:
    """Domains with room for the gang, the tightest first."""
    sized = []
    for d, members in domains.items():
        free = _free(members, pool)
        if all(f >= n for f, n in zip(free, need, strict=True)):
            sized.append((free, d, members))
    sized.sort(key=lambda t: (t[0], t[1]))
    return [(d, members) for _, d, members in sized]


class JobLevelAffinity:
    NAME: ClassVar[str] = NAME

    def group(self, unit: UnitInfo, nodes: list[NodeInfo]) -> NodeGroups | None:
        affinity = unit.affinity
        if affinity is None:
            return None  # no opinion: one group, the search's own scan order
        required = affinity.required
        pool, need = _needs(unit)
        groups: list[list[NodeInfo]] = []
        if required:
            domains, lacking = _split(nodes, required)
            if unit.placed_nodes:
                fixed = self._placed_domain(unit, nodes, required)
                if fixed is None:
                    return NodeGroups([], self._placed_reason(len(nodes), required))
                domains = {fixed: domains.get(fixed, [])}
                need = [0, 0, 0, 0]  # the gang already holds its domain: no cut-off
            fitting = _best_fit_first(domains, pool, need)
            if not fitting:
                return NodeGroups([], _no_domain(len(nodes), required, lacking, unit.needed))
            for _, members in fitting:
                groups += _preferred_groups(members, affinity, pool, need)
                groups.append(members)
            reason = f"the gang's pods must share one {'/'.join(required)} domain"
            return NodeGroups(_distinct(groups), reason)
        groups = _preferred_groups(nodes, affinity, pool, need)
        groups.append(nodes)
        return NodeGroups(_distinct(groups))

    def _placed_domain(
        self, unit: UnitInfo, nodes: list[NodeInfo], keys: tuple[str, ...]
    ) -> Domain | None:
        by_name = {n.name: n for n in nodes}
        for name in unit.placed_nodes:
            node = by_name.get(name)
            if node is not None:
                return domain_of(node.labels, keys)
        return None

    def _placed_reason(self, total: int, keys: tuple[str, ...]) -> str:
        return (
            f"0/{total} nodes fit: {total} outside the {'/'.join(keys)} domain of the job's "
            "placed pods (their nodes are gone or lack the label)"
        )


def _no_domain(total: int, keys: tuple[str, ...], lacking: int, needed: int) -> str:
    label = "/".join(keys)
    parts = []
    if total - lacking:
        parts.append(
            f"{total - lacking} in no single {label} domain with room for the whole gang "
            f"({needed} pods)"
        )
    if lacking:
        parts.append(f"{lacking} without label {label}")
    return f"0/{total} nodes fit: " + ", ".join(parts)


def _preferred_groups(
    members: list[NodeInfo], affinity: JobAffinity, pool: str, need: list[int]
) -> list[list[NodeInfo]]:
    """Within one domain: its preferred subdomains, finest first, each level best fit first."""
    out: list[list[NodeInfo]] = []
    preferred = affinity.preferred
    for depth in range(len(preferred), 0, -1):
        domains, _ = _split(members, preferred[:depth])
        out += [m for _, m in _best_fit_first(domains, pool, need)]
    return out


def _distinct(groups: list[list[NodeInfo]]) -> list[list[NodeInfo]]:
    """Each node set once (a switch that is its whole rack is tried once), order kept."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for g in groups:
        key = tuple(n.name for n in g)
        if g and key not in seen:
            seen.add(key)
            out.append(g)
    return out


def domain_violations(
    affinity: JobAffinity,
    placed: Iterable[tuple[str, Mapping[str, str] | None]],
) -> dict[str, str]:
    """The required rule over a job's placed pods, in order (earlier ones first: bound pods,
    then a batch's placements): the first pod's domain is the job's; each pod elsewhere, on a
    node lacking a key, or on an unknown node (labels None) → why. Used by the Binder's
    cross-node check and by ``godel audit``."""
    keys = affinity.required
    if not keys:
        return {}
    label = "/".join(keys)
    home: Domain | None = None
    out: dict[str, str] = {}
    for pod, labels in placed:
        d = domain_of(labels, keys) if labels is not None else None
        if d is None:
            out[pod] = f"{NAME}: node has no {label} label"
        elif home is None:
            home = d
        elif d != home:
            out[pod] = (
                f"{NAME}: node is in {describe_domain(keys, d)}, the job's pods are in "
                f"{describe_domain(keys, home)}"
            )
    return out


def new(_args: NoArgs) -> JobLevelAffinity:
    return JobLevelAffinity()


_check: type[GroupingPlugin] = JobLevelAffinity
SPEC = PluginSpec(NAME, NoArgs, new)
