"""Throttle and GroupThrottle: limit how often the pods sharing a label value are moved.

Throttle counts moves per value inside a sliding window (past rounds' moves plus those admitted in
this round); GroupThrottle counts distinct rounds that moved any pod with the value, so a service
is disturbed by at most N rounds per window however many of its pods each round moves. The value
is the pod's ``label_key`` label, or its job's name when ``label_key`` is empty (the default).

``preemptible`` limits a throttle to the pods that may be preempted (true) or to those that may
not (false), as the original's ``canBePreempted`` item does; omitted, it throttles every pod. A
pod is preemptible as preemption reads it: its ``spec.preemptible`` (its job's, else its queue's
default). Pods a throttle does not apply to are neither limited nor counted by it. (A policy lists
each check once: a Throttle may limit one kind while a GroupThrottle limits the other.)
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from placement.framework import PluginSpec
from services.rescheduler.framework import Check, ClusterView, Move

THROTTLE = "Throttle"
GROUP_THROTTLE = "GroupThrottle"


@dataclass(frozen=True)
class ThrottleArgs:
    # Pods with equal values of this template label share a limit; "" = the job name.
    label_key: str = ""
    window_seconds: int = 3600
    # Moves (Throttle) or rounds (GroupThrottle) allowed per value and window.
    max_moves: int = 1
    # Only preemptible pods (true), only the others (false), or every pod (omitted).
    preemptible: bool | None = None

    def validate(self) -> None:
        if self.window_seconds <= 0:
            raise ValueError("window_seconds must be > 0")
        if self.max_moves < 0:
            raise ValueError("max_moves must be >= 0")
        if self.preemptible is not None and not isinstance(self.preemptible, bool):
            raise ValueError(
                f"preemptible must be true, false or omitted (every pod), got {self.preemptible!r}"
            )


def throttle_value(view: ClusterView, move: Move, args: ThrottleArgs) -> str | None:
    """The value the move is throttled under; None when the throttle does not apply to the pod
    (it lacks the label, or is not of the preemptibility the throttle is limited to)."""
    if not args.label_key and args.preemptible is None:
        return move.job
    running = view.pods.get(move.pod)
    if running is None:
        return None
    pod = running.pod  # decoded once for both questions
    if args.preemptible is not None and pod.spec.preemptible != args.preemptible:
        return None
    if not args.label_key:
        return move.job
    return pod.spec.template.labels.get(args.label_key)


class _History:
    """(time, round) of past moves per value; forgets what left the window."""

    def __init__(self, window_seconds: int) -> None:
        self.window = window_seconds
        self._events: dict[str, deque[tuple[float, int]]] = defaultdict(deque)

    def add(self, value: str, now: float, generation: int) -> None:
        self._events[value].append((now, generation))

    def within(self, value: str, now: float) -> list[tuple[float, int]]:
        events = self._events.get(value)
        if events is None:
            return []
        while events and events[0][0] <= now - self.window:
            events.popleft()
        if not events:
            del self._events[value]
            return []
        return list(events)


class Throttle:
    NAME: ClassVar[str] = THROTTLE

    def __init__(self, args: ThrottleArgs) -> None:
        self.args = args
        self.history = _History(args.window_seconds)
        self._now = 0.0
        self._admitted: dict[str, int] = defaultdict(int)
        # Per pod, its value in this round (checks ask about one pod once per candidate node).
        self._values: dict[str, str | None] = {}

    def start_round(self, view: ClusterView, now: float) -> None:
        self._now = now
        self._admitted.clear()
        self._values.clear()

    def _value(self, view: ClusterView, move: Move) -> str | None:
        if move.pod not in self._values:
            self._values[move.pod] = throttle_value(view, move, self.args)
        return self._values[move.pod]

    def _used(self, value: str) -> int:
        return len(self.history.within(value, self._now)) + self._admitted[value]

    def check(self, view: ClusterView, move: Move) -> str | None:
        value = self._value(view, move)
        if value is None:
            return None
        if self._used(value) >= self.args.max_moves:
            return (
                f"{self.NAME}: {self._describe(value)} already moved {self._used(value)} time(s) "
                f"in the last {self.args.window_seconds}s (max {self.args.max_moves})"
            )
        return None

    def _describe(self, value: str) -> str:
        key = self.args.label_key
        return f"{key}={value}" if key else f"job {value}"

    def admit(self, view: ClusterView, move: Move) -> None:
        value = self._value(view, move)
        if value is not None:
            self._admitted[value] += 1

    def retract(self, view: ClusterView, move: Move) -> None:
        value = self._value(view, move)
        if value is not None and self._admitted[value] > 0:
            self._admitted[value] -= 1

    def record(self, moves: Sequence[Move], view: ClusterView, generation: int, now: float) -> None:
        for move in moves:
            value = throttle_value(view, move, self.args)
            if value is not None:
                self.history.add(value, now, generation)


class GroupThrottle(Throttle):
    NAME: ClassVar[str] = GROUP_THROTTLE

    def _used(self, value: str) -> int:
        rounds = {generation for _, generation in self.history.within(value, self._now)}
        # Moves admitted in this round all belong to one more round.
        return len(rounds) + (1 if self._admitted[value] else 0)

    def check(self, view: ClusterView, move: Move) -> str | None:
        value = self._value(view, move)
        if value is None or self._admitted[value]:
            return None  # this round already counts against the value: more of it costs nothing
        if self._used(value) >= self.args.max_moves:
            return (
                f"{self.NAME}: {self._describe(value)} was moved by {self._used(value)} round(s) "
                f"in the last {self.args.window_seconds}s (max {self.args.max_moves})"
            )
        return None


def new_throttle(args: ThrottleArgs) -> Throttle:
    return Throttle(args)


def new_group_throttle(args: ThrottleArgs) -> GroupThrottle:
    return GroupThrottle(args)


_check: type[Check] = Throttle
_check_group: type[Check] = GroupThrottle
THROTTLE_SPEC = PluginSpec(THROTTLE, ThrottleArgs, new_throttle)
GROUP_THROTTLE_SPEC = PluginSpec(GROUP_THROTTLE, ThrottleArgs, new_group_throttle)
