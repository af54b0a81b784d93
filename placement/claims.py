"""When a pod holds a claim on its node: the one home of that rule.

A pod claims room on a node from the Binder's commit (``POD_BOUND``, with ``spec.node_name``
set in the same write) until it finishes (``POD_SUCCEEDED`` / ``POD_FAILED``: the store returns
the claim with that write). Every judge of room (the shards' cache, the Binder's state, the
dispatcher's queues and partitions, the dashboard, tidal reclaim, budgets, preemption, audit)
asks here, so a new phase changes them all at once.
"""

from __future__ import annotations

from protos.godel.v1 import objects_pb2 as pb

# The phases in which a pod with a node holds room on it.
CLAIM_PHASES = frozenset({pb.POD_BOUND, pb.POD_RUNNING})
# The phases a pod never leaves; its claim, if it had one, has been returned.
TERMINAL_PHASES = frozenset({pb.POD_SUCCEEDED, pb.POD_FAILED})


def holds_claim(pod: pb.Pod) -> bool:
    """Whether the pod occupies room on its node (bound, and neither finished nor pending)."""
    return bool(pod.spec.node_name) and pod.status.phase in CLAIM_PHASES


def is_terminal(phase: int) -> bool:
    """Whether a pod in ``phase`` has finished for good."""
    return phase in TERMINAL_PHASES
