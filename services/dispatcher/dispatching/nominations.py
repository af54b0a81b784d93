"""Preemptors in flight: which pending pods a shard has nominated to a node, evicting which
victims, while the Binder has the decision.

Kept in the dispatcher's memory, not in the store: the shard's decision names the pod's resource
version, so writing the nomination onto the pod would make the decision stale. The dispatcher is
where ``explain`` and ``get pods`` are served, and it already hears from every shard about every
unit it dispatched; a unit's nominations last until its outcome (bound, unschedulable), its shard
is lost, or it is revoked.
"""

from __future__ import annotations

from protos.godel.v1 import internal_pb2 as ipb


class Nominations:
    def __init__(self) -> None:
        self._by_job: dict[str, dict[str, ipb.Nomination]] = {}

    def record(self, message: ipb.Nominations) -> None:
        """The unit's latest decision: its nominations replace the previous ones."""
        if message.pods:
            self._by_job[message.job] = {n.pod: n for n in message.pods}
        else:
            self._by_job.pop(message.job, None)

    def clear(self, job: str) -> None:
        self._by_job.pop(job, None)

    def of(self, job: str, pod: str) -> ipb.Nomination | None:
        """The pod's nomination, if its unit's decision is in flight with one."""
        pods = self._by_job.get(job)
        return None if pods is None else pods.get(pod)

    def __len__(self) -> int:
        return sum(len(pods) for pods in self._by_job.values())
