"""The policy manager: runs rounds of configured policies, one at a time, each from a fresh view.

Rounds of different policies never overlap (one lock), as in the original: each round plans
against the cluster as the previous round left it. A trigger that arrives while a round runs
waits for it. The last plan of each policy is kept for ``ListPolicies``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from services import metrics
from services.rescheduler.framework import ClusterView
from services.rescheduler.round import PLANNED, Policy, RoundPlan, RoundRunner

log = structlog.get_logger(__name__)

# Builds the view of the cluster for a node scope (label selector), current as of the call.
ViewSource = Callable[[Mapping[str, str]], Awaitable[ClusterView]]
# Carries out a planned round (Movements, eviction batch by batch).
Execute = Callable[[Policy, RoundPlan, ClusterView], Awaitable[None]]
# Prepares the store for a policy's new executed round (its previous Movements go).
Prepare = Callable[[Policy], Awaitable[None]]


class PausedError(RuntimeError):
    """The kill switch is on: no round starts."""


class UnknownPolicyError(KeyError):
    def __init__(self, name: str, known: Sequence[str]) -> None:
        super().__init__(name)
        self.message = f"unknown policy {name!r} (known: {', '.join(known) or 'none'})"

    def __str__(self) -> str:
        return self.message


@dataclass
class PolicyState:
    policy: Policy
    last: RoundPlan | None = None
    last_run_ms: int = 0
    running: bool = False


class PolicyManager:
    def __init__(
        self,
        policies: Sequence[Policy],
        view_source: ViewSource,
        runner: RoundRunner | None = None,
        *,
        execute: Execute | None = None,
        prepare: Prepare | None = None,
    ) -> None:
        self.states = {p.name: PolicyState(p) for p in policies}
        self._view_source = view_source
        self._runner = runner or RoundRunner()
        self._execute = execute
        self._prepare = prepare
        self._lock = asyncio.Lock()
        self.paused = False
        # The round counter, over all policies. Starts from the clock so that rounds after a
        # restart never reuse a generation (Movements and throttle history are keyed by it).
        self.generation = int(time.time() * 1000)

    def names(self) -> list[str]:
        return list(self.states)

    def state(self, name: str) -> PolicyState:
        state = self.states.get(name)
        if state is None:
            raise UnknownPolicyError(name, self.names())
        return state

    async def run(self, name: str, *, trigger: str, dry_run: bool) -> RoundPlan:
        """One round of policy ``name``, after any round already running. A round that is not a
        dry run is executed (when an executor is configured); paused, only dry runs start."""
        state = self.state(name)
        if self.paused and not dry_run:
            raise PausedError("the rescheduler is paused: no round starts until it is resumed")
        async with self._lock:
            state.running = True
            try:
                view = await self._view_source(state.policy.scope_labels)
                self.generation += 1
                # Planning is CPU work over the round's own copy: keep the loop serving.
                plan = await asyncio.to_thread(
                    self._runner.run,
                    state.policy,
                    view,
                    generation=self.generation,
                    dry_run=dry_run,
                    trigger=trigger,
                )
                if self._prepare is not None and not dry_run:
                    await self._prepare(state.policy)
                if self._execute is not None and not dry_run and plan.outcome == PLANNED:
                    await self._execute(state.policy, plan, view)
                    # Not the moves dropped before eviction (their room was not reserved).
                    dropped = {m.pod for m, _ in plan.rejected}
                    executed = [
                        m
                        for batch in plan.batches[: len(plan.movements)]
                        for m in batch
                        if m.pod not in dropped
                    ]
                    for check in state.policy.checks:
                        check.record(executed, view, plan.generation, time.time())
            finally:
                state.running = False
            state.last = plan
            state.last_run_ms = plan.started_ms
        metrics.RESCHEDULER_ROUNDS.labels(name, plan.outcome, str(dry_run).lower()).inc()
        if plan.evicted:
            metrics.RESCHEDULER_PODS_EVICTED.labels(name).inc(plan.evicted)
        log.info(
            "round",
            policy=name,
            trigger=trigger,
            dry_run=dry_run,
            generation=plan.generation,
            outcome=plan.outcome,
            moves=len(plan.moves),
            batches=len(plan.batches),
            duration_ms=plan.duration_ms,
            message=plan.message,
        )
        return plan
