"""Nodes' measured load: what each node really carries in CPU, memory and network bandwidth,
reported beside the heartbeats for the rescheduler's LoadBalance (and `godel get nodes -o wide`).

- **process** node (this machine): from the OS. CPU is the machine's busy time over the time
  since the last report (psutil), memory what is in use (total − available), network the bytes
  received plus sent on every interface but loopback, from ``/proc/net/dev`` deltas over the
  same time. Bandwidth: the summed link speed of the interfaces that report one in
  ``/sys/class/net/*/speed``, else the agent's ``--network-bandwidth-bytes-per-second``. What
  its pods use (``pods_milli_cpu``, ``pods_memory_bytes``: what moving them can take away; the
  machine runs more than pods) is measured on their process trees, as the tidal loop measures
  them (``tidal.ProcessUsage``; a pod without a process counts by the hollow model).
- **hollow** node: from its pods' usage model. A pod uses its requests × its template's
  ``hollow_usage_percent`` when set, else guaranteed pods follow the agent's usage curve
  (``--tidal-usage-curve``; none: 100 %) and best-effort pods use all they requested. The
  agent's first ``--hollow-hot-nodes`` nodes are hot machines: there the guaranteed pods use
  ``--hollow-hot-percent`` of their requests instead of the curve's percent (a noisy
  neighbour, a slow disk: the pods on them work harder for the same job). CPU and memory never
  exceed the node's allocatable (a machine is busy at most all of the time). Network
  follows CPU: ``bandwidth × CPU used ÷ CPU allocatable × the node's network percent``, a
  percent drawn per node, deterministically from its name, within
  ``--hollow-network-percent-min .. -max`` (so two nodes with the same CPU load differ in network
  load, and a restarted agent reports the same).

A load is written (one HSET for every node that moved, ``Store.record_node_loads``, outside the
change feed) when some dimension moved by at least ``REPORT_CHANGE_PERCENT`` of the node's
capacity, or when the last report is ``REFRESH_SECONDS`` old: readers take a load older than a
few refreshes as no load at all (a dead agent's nodes fall back to their requests).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil
from google.protobuf.message import Message

from protos.godel.v1 import objects_pb2 as pb
from services.nodeagent.nodes import PROCESS
from services.nodeagent.tidal import Usage, UsageCurve, gives_way
from store import Store
from store.informer import Handlers

LOOPBACK = "lo"
# 10 Gbit/s.
DEFAULT_NETWORK_BANDWIDTH = 1_250_000_000
REPORT_CHANGE_PERCENT = 1
REFRESH_SECONDS = 30.0
NET_DEV = Path("/proc/net/dev")
SYS_CLASS_NET = Path("/sys/class/net")


# ---------------------------------------------------------------------------------------------
# The OS side (process nodes)
# ---------------------------------------------------------------------------------------------


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """``/proc/net/dev`` → interface → (bytes received, bytes sent). The two header lines are
    skipped; a line that does not parse is an error naming it (the kernel's format is fixed)."""
    counters: dict[str, tuple[int, int]] = {}
    for line in text.splitlines()[2:]:
        if not line.strip():
            continue
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 16:
            raise ValueError(f"/proc/net/dev: unexpected line {line.strip()!r}")
        # Receive: bytes packets errs drop fifo frame compressed multicast; transmit: bytes ...
        counters[name.strip()] = (int(fields[0]), int(fields[8]))
    return counters


def network_bytes(counters: Mapping[str, tuple[int, int]]) -> int:
    """Bytes received plus sent over every interface but loopback (traffic between processes of
    this machine never loads its network)."""
    return sum(rx + tx for name, (rx, tx) in counters.items() if name != LOOPBACK)


def link_speed(sys_class_net: Path = SYS_CLASS_NET) -> int:
    """The summed speed of the interfaces (loopback aside) that report one, bytes per second;
    0 when none does (virtual interfaces say -1 or refuse the read)."""
    total = 0
    try:
        entries = sorted(sys_class_net.iterdir())
    except OSError:
        return 0
    for entry in entries:
        if entry.name == LOOPBACK:
            continue
        try:
            mbits = int((entry / "speed").read_text().strip())
        except (OSError, ValueError):
            continue
        if mbits > 0:
            total += mbits * 1_000_000 // 8
    return total


class NetworkMeter:
    """Network throughput in bytes per second over the time between two reads. The first read
    has no interval yet and says 0; a counter that went back (an interface reset) counts 0."""

    def __init__(self, path: Path = NET_DEV, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        self._last: tuple[float, int] | None = None

    def rate(self) -> int:
        now, total = self.clock(), network_bytes(parse_net_dev(self.path.read_text()))
        last, self._last = self._last, (now, total)
        if last is None or now <= last[0]:
            return 0
        return max(0, total - last[1]) * 1000 // max(1, int((now - last[0]) * 1000))


class MachineLoad:
    """This machine's load from the OS (the process node's)."""

    def __init__(self, bandwidth: int, net: NetworkMeter | None = None) -> None:
        self.bandwidth = link_speed() or bandwidth
        self.net = net or NetworkMeter()
        self.cpus = psutil.cpu_count() or 1
        psutil.cpu_percent(None)  # starts the interval the first report measures over

    def measure(self, now_ms: int, pods: Usage) -> pb.NodeLoad:
        """The machine's load now; ``pods``: what its pods use of it, measured."""
        memory = psutil.virtual_memory()
        try:
            network = self.net.rate()
        except (OSError, ValueError):
            network = 0  # no /proc/net/dev (another OS): the CPU and memory still count
        return pb.NodeLoad(
            milli_cpu=int(psutil.cpu_percent(None) * self.cpus * 10),
            memory_bytes=memory.total - memory.available,
            network_bytes_per_second=network,
            network_capacity_bytes_per_second=self.bandwidth,
            measured_ms=now_ms,
            pods_milli_cpu=pods.milli_cpu,
            pods_memory_bytes=pods.memory_bytes,
        )


# ---------------------------------------------------------------------------------------------
# The model (hollow nodes)
# ---------------------------------------------------------------------------------------------


def network_percent(node: str, low: int, high: int) -> int:
    """A hollow node's network load as a percent of its CPU load, in ``low..high``: the same for
    the same name on every run."""
    return low + zlib.crc32(node.encode()) % (high - low + 1)


@dataclass(frozen=True, slots=True)
class _Use:
    """A pod's part of its node's load: requests following the curve, and fixed usage."""

    node: str
    curve_cpu: int
    curve_mem: int
    fixed_cpu: int
    fixed_mem: int


# One _Use per node and shape, shared by the pods that have them (a node's pods are mostly of
# a few jobs): an agent of 250,000 pods held as many records (0.1 KiB each with its memory
# amount). Found by a plain tuple of its fields (a frozen dataclass built per pod only to look
# up its shared twin was ~1 µs of an agent's start, a pod). Cleared when full, as
# ``placement.nodeinfo``'s shared amounts: the distinct (node, shape) pairs of an agent are its
# nodes times a few shapes.
_SHARED_USES: dict[tuple[str, int, int, int, int], _Use] = {}
_SHARED_USES_MAX = 65536


def pod_use(pod: pb.Pod) -> _Use:
    t = pod.spec.template
    r = t.requests
    node = pod.spec.node_name
    if t.hollow_usage_percent > 0:
        pct = t.hollow_usage_percent
        key = (node, 0, 0, r.milli_cpu * pct // 100, r.memory_bytes * pct // 100)
    elif pod.spec.qos == pb.QOS_BEST_EFFORT:
        key = (node, 0, 0, r.milli_cpu, r.memory_bytes)
    else:
        key = (node, r.milli_cpu, r.memory_bytes, 0, 0)
    shared = _SHARED_USES.get(key)
    if shared is None:
        if len(_SHARED_USES) >= _SHARED_USES_MAX:
            _SHARED_USES.clear()
        shared = _SHARED_USES[key] = _Use(*key)
    return shared


class HollowUsage:
    """Per node, what its pods use by the model: kept per informer event (O(1) each), so a
    report costs one pass over the nodes, not over the pods."""

    def __init__(self) -> None:
        self._pods: dict[str, _Use] = {}
        # The string to key a pod by, equal to its name: the runner's (``PodRunner.name_of``),
        # so the agent holds one string per pod, not one here too (58 bytes a pod).
        self.name_of: Callable[[str], str] = lambda name: name
        self._nodes: dict[str, list[int]] = {}  # node -> [curve cpu, curve mem, fixed cpu, mem]
        # Nodes whose sums changed since the reporter last took this set (``take_changed``).
        self._changed: set[str] = set()

    def handlers(self) -> Handlers:
        return Handlers(
            lambda _kind, pod: self.on_pod(pod),
            lambda _kind, _old, pod: self.on_pod(pod),
            lambda _kind, pod: self.on_pod(pod, gone=True),
            frozenset({"Pod"}),
        )

    def on_pod(self, pod: Message, *, gone: bool = False) -> None:
        # ``type() is``: an isinstance that fails is ~0.2 µs (the message classes' metaclass).
        if type(pod) is not pb.Pod:
            return
        name = pod.metadata.name
        new = None if gone or not gives_way(pod) else pod_use(pod)
        pods = self._pods
        old = pods.get(name)
        if old is new or (old is not None and old == new):  # shared: mostly the same record
            return
        if old is not None:
            self._add(old, -1)
            del pods[name]
        if new is not None:
            pods[self.name_of(name)] = new
            self._add(new, 1)

    def _add(self, use: _Use, sign: int) -> None:
        self._changed.add(use.node)
        sums = self._nodes.setdefault(use.node, [0, 0, 0, 0])
        sums[0] += sign * use.curve_cpu
        sums[1] += sign * use.curve_mem
        sums[2] += sign * use.fixed_cpu
        sums[3] += sign * use.fixed_mem

    def names(self) -> Collection[str]:
        """The pods counted (their usage in their node's sums)."""
        return self._pods.keys()

    def take_changed(self) -> set[str]:
        """The nodes whose pods' usage changed since the last call."""
        changed, self._changed = self._changed, set()
        return changed

    def changed_again(self, nodes: set[str]) -> None:
        """Nodes taken by ``take_changed`` whose new load was not written after all."""
        self._changed |= nodes

    def used(self, node: str, percent: float) -> tuple[int, int]:
        """(milli-CPU, memory bytes) the node's pods use with the curve at ``percent``."""
        curve_cpu, curve_mem, fixed_cpu, fixed_mem = self._nodes.get(node, (0, 0, 0, 0))
        return int(curve_cpu * percent / 100) + fixed_cpu, int(
            curve_mem * percent / 100
        ) + fixed_mem


# ---------------------------------------------------------------------------------------------
# The reporter
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadSettings:
    network_bandwidth: int = DEFAULT_NETWORK_BANDWIDTH
    hollow_network_percent_min: int = 50
    hollow_network_percent_max: int = 100
    # Hot hollow nodes, and the percent of their requests their guaranteed pods use there.
    hot_nodes: frozenset[str] = frozenset()
    hot_percent: int = 100


def moved(old: pb.NodeLoad, new: pb.NodeLoad, allocatable: pb.Resources) -> bool:
    """Whether some dimension moved by at least REPORT_CHANGE_PERCENT of the node's capacity."""
    pairs = (
        (old.milli_cpu, new.milli_cpu, allocatable.milli_cpu),
        (old.memory_bytes, new.memory_bytes, allocatable.memory_bytes),
        (
            old.network_bytes_per_second,
            new.network_bytes_per_second,
            new.network_capacity_bytes_per_second,
        ),
    )
    return old.network_capacity_bytes_per_second != new.network_capacity_bytes_per_second or any(
        abs(a - b) * 100 >= REPORT_CHANGE_PERCENT * max(1, cap) for a, b, cap in pairs
    )


class LoadReporter:
    """Measures this agent's nodes and writes the loads that moved (module docstring)."""

    def __init__(
        self,
        store: Store,
        nodes: Mapping[str, pb.Node],
        curve: UsageCurve | None,
        settings: LoadSettings,
        machine: Callable[[], MachineLoad],
        process_pods: Callable[[str, float], Usage] = lambda _node, _percent: Usage(),
    ) -> None:
        self.store = store
        self.nodes = nodes  # as registered: their mode and allocatable
        self.curve = curve
        self.settings = settings
        self.usage = HollowUsage()
        self._machine_factory = machine
        # What the pods of a process node use (node, the curve's percent for simulated ones).
        self.process_pods = process_pods
        self._machine: MachineLoad | None = None
        self.reported: dict[str, pb.NodeLoad] = {}  # last written per node
        # The Node object each node's written load was measured against (its allocatable).
        self._reported_for: dict[str, pb.Node] = {}
        self.writes = 0  # nodes written, for tests and metrics
        self.measured = 0  # node loads measured, for tests

    def measure(
        self, now: float | None = None, names: Iterable[str] | None = None
    ) -> dict[str, pb.NodeLoad]:
        """Every node's load now (``names``: those nodes' only)."""
        now = time.time() if now is None else now
        now_ms = int(now * 1000)
        percent = self.curve.percent_at(now) if self.curve else 100.0
        s = self.settings
        out: dict[str, pb.NodeLoad] = {}
        nodes = self.nodes
        for name, node in (
            nodes.items() if names is None else ((n, nodes[n]) for n in names if n in nodes)
        ):
            if node.spec.mode == PROCESS:
                if self._machine is None:
                    self._machine = self._machine_factory()
                out[name] = self._machine.measure(now_ms, self.process_pods(name, percent))
                continue
            own = s.hot_percent if name in s.hot_nodes else percent
            cpu, mem = self.usage.used(name, own)
            alloc = node.status.allocatable.milli_cpu
            cpu = min(cpu, alloc)
            mem = min(mem, node.status.allocatable.memory_bytes)
            net_pct = network_percent(
                name, s.hollow_network_percent_min, s.hollow_network_percent_max
            )
            network = s.network_bandwidth * cpu * net_pct // (max(1, alloc) * 100)
            out[name] = pb.NodeLoad(
                milli_cpu=cpu,
                memory_bytes=mem,
                network_bytes_per_second=min(network, s.network_bandwidth),
                network_capacity_bytes_per_second=s.network_bandwidth,
                measured_ms=now_ms,
                pods_milli_cpu=cpu,
                pods_memory_bytes=mem,
            )
        self.measured += len(out)
        return out

    async def report(self, now: float | None = None) -> int:
        """Measure, and write the loads that moved or are due a refresh (one round trip).
        Returns how many were written."""
        now = time.time() if now is None else now
        if self.curve is not None:  # the curve moves every hollow node's load
            return await self._write_due(self.measure(now))
        changed = self.usage.take_changed()
        try:
            return await self._write_due(self.measure(now, self._may_have_moved(now, changed)))
        except BaseException:
            self.usage.changed_again(changed)
            raise

    def _may_have_moved(self, now: float, changed: set[str]) -> list[str]:
        """Without a usage curve a hollow node's load is a function of its pods and its Node
        alone: only a node whose pods' usage changed, whose Node object was replaced, never
        written or due a refresh can be written now, and only those are measured (measuring all
        5,000 nodes of an agent every heartbeat, a NodeLoad built and compared per node, was a
        fifth of the agent's CPU while pods streamed in). A process node is measured always."""
        refresh_ms = REFRESH_SECONDS * 1000
        now_ms = int(now * 1000)
        reported, reported_for = self.reported, self._reported_for
        names: list[str] = []
        for name, node in self.nodes.items():
            last = reported.get(name)
            if (
                last is None
                or name in changed
                or reported_for.get(name) is not node
                or now_ms - last.measured_ms >= refresh_ms
                or node.spec.mode == PROCESS
            ):
                names.append(name)
        return names

    async def _write_due(self, loads: dict[str, pb.NodeLoad]) -> int:
        due: dict[str, pb.NodeLoad] = {}
        for name, load in loads.items():
            last = self.reported.get(name)
            if (
                last is None
                or load.measured_ms - last.measured_ms >= REFRESH_SECONDS * 1000
                or moved(last, load, self.nodes[name].status.allocatable)
            ):
                due[name] = load
        await self.store.record_node_loads(due)
        self.reported.update(due)
        for name in due:
            self._reported_for[name] = self.nodes[name]
        self.writes += len(due)
        return len(due)

    def totals(self) -> tuple[int, int, int, int]:
        """Over the last reported loads: total and highest milli-CPU, total and highest network
        bytes/s (the agent's metrics)."""
        loads = self.reported.values()
        cpu = [load.milli_cpu for load in loads] or [0]
        net = [load.network_bytes_per_second for load in loads] or [0]
        return sum(cpu), max(cpu), sum(net), max(net)
