"""Running the pods bound to this agent's nodes, and reporting their phases in batches.

A pod is taken on when the informer shows it ``POD_BOUND`` to one of our nodes. Hollow pods are a
timer (``template.duration_ms``; 0 runs until deleted); process pods are a child process in its
own session (so the whole tree can be killed), output in ``<work_dir>/<pod>.log``.

Every phase change is a *patch* queued in ``pending`` (one per pod; a later patch merges over an
earlier unflushed one) and written by the flusher: every ``flush_interval`` or as soon as
``flush_max`` are pending, the batch's pods are read (one ``get_many``: the agent keeps no copy of
a hollow pod, only its run's record) and written with one ``commit_many``, each pod a
compare-and-set on the version read (``Release`` for terminal phases, which returns the node
claim). A conflict re-reads the pods that lost (one ``get_many``) and queues the patch again if it
still applies. No per-pod round trip: the hot path is one read and one write round trip per
batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import pwd
import shutil
import signal
import sys
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import structlog

from foundation.retry import Backoff, Retry
from placement.claims import TERMINAL_PHASES
from protos.godel.v1 import objects_pb2 as pb
from services.nodeagent.gpus import gpu_env
from services.nodeagent.isolation import (
    Cgroups,
    PodCgroup,
    PodUids,
    cgroup_name,
    kill_every_process_of,
)
from services.nodeagent.nodes import HOLLOW, PROCESS, now_ms
from store import CommitError, ConflictError, NotFoundError, Store, StoreError
from store.client import Op, Release, Update, pod_started_hint
from store.errors import StoreUnavailableError
from store.informer import Handlers

log = structlog.get_logger(__name__)

# How long a child gets between SIGTERM and SIGKILL, unless its template says otherwise
# (``termination_grace_seconds``).
KILL_GRACE_SECONDS = 3.0
# Pod status writes while the store is unavailable: 50 ms doubled up to 2 s.
_STORE_RETRY = Backoff(0.05, cap=2.0)
# The last writes at stop: a few tries, 200 ms apart.
_FINAL_FLUSH_RETRY = Backoff(0.2)
# Passed through from the agent's environment; everything else a pod sees is its own.
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "USER")


@dataclass(slots=True)
class Patch:
    """A phase change to write; fields left at zero/None are not touched."""

    phase: pb.PodPhase.ValueType
    started_ms: int = 0
    finished_ms: int = 0
    exit_code: int | None = None
    reason: str = ""
    message: str = ""

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    def then(self, later: Patch) -> Patch:
        """This patch followed by ``later`` (both unflushed): the later phase wins, the earliest
        start is kept (RUNNING then SUCCEEDED in one write)."""
        return Patch(
            later.phase,
            self.started_ms or later.started_ms,
            later.finished_ms or self.finished_ms,
            later.exit_code if later.exit_code is not None else self.exit_code,
            later.reason or self.reason,
            later.message or self.message,
        )

    def applied_to(self, pod: pb.Pod) -> pb.Pod | None:
        """A copy of ``pod`` with the patch applied, or None if it no longer applies (the pod
        already ended or already runs)."""
        phase = pod.status.phase
        if phase in TERMINAL_PHASES or (phase == pb.POD_RUNNING and self.phase == pb.POD_RUNNING):
            return None
        out = pb.Pod()
        out.CopyFrom(pod)
        status = out.status
        status.phase = self.phase
        if self.started_ms and not status.started_ms:
            status.started_ms = self.started_ms
        if self.terminal:
            status.finished_ms = self.finished_ms or now_ms()
            if not status.started_ms:
                status.started_ms = status.finished_ms
            status.exit_code = self.exit_code or 0
            status.reason = self.reason
            status.message = self.message
        return out


@dataclass(slots=True)
class PodRun:
    """What running a hollow pod needs, and all an agent keeps of one: no bytes of it (an
    agent of 250,000 hollow pods held each encoded, ~0.2 KiB a pod with its informer's key,
    and a record of 14 fields, 136 bytes, most of them a process's); its status writes read
    the pod from the store, a batch at a time. A process pod's run is a ``ProcessRun``."""

    name: str
    node: str
    # The pod's uid, hashed: tells a pod deleted and created again under the same name (a
    # relist) from the one this run runs, without its 36-character string (~85 bytes a pod).
    uid_key: int
    timer: asyncio.TimerHandle | None = None
    # Set once we queued the terminal patch (so our own write is not mistaken for another's).
    finished: bool = False

    @classmethod
    def of(cls, pod: pb.Pod, name: str) -> PodRun:
        """``name``: the pod's, as the runner keys it (one string for both)."""
        return cls(name, sys.intern(pod.spec.node_name), uid_key(pod))  # one string per node

    @property
    def mode(self) -> str:
        return HOLLOW

    def runs(self, pod: pb.Pod) -> bool:
        """Whether ``pod`` is the one this run runs (not another of the same name)."""
        return uid_key(pod) == self.uid_key

    def keep(self, pod: pb.Pod, encoded: bytes | None = None) -> None:
        """Remember ``pod`` as the latest known (a hollow run keeps nothing of it)."""


@dataclass(slots=True)
class ProcessRun(PodRun):
    """A process pod's run: its child, its log, and the pod's latest known stored copy."""

    # Encoded: its command, environment, requests, NUMA nodes, grace and tenant are read from
    # it while it runs (the informer's own bytes where they are the same version).
    encoded: bytes = b""
    version: int = 0
    started_ms: int = 0
    task: asyncio.Task[None] | None = None
    log_path: Path | None = None
    # Set when the process has exited (log followers stop here: they poll it). A flag, not an
    # asyncio.Event (0.9 KiB each).
    exited: bool = False
    # Why the child is being killed: "" (deleted / ended by someone else: write nothing) or the
    # reason to report, e.g. "AgentStopped".
    kill_reason: str = ""
    pid: int | None = None  # its process while it runs (tidal usage measures it)

    @classmethod
    def of_process(
        cls, pod: pb.Pod, started_ms: int, name: str, encoded: bytes | None = None
    ) -> ProcessRun:
        """``encoded``: the pod's bytes if the caller holds them (shared, not encoded again)."""
        return cls(
            name,
            sys.intern(pod.spec.node_name),
            uid_key(pod),
            encoded=pod.SerializeToString() if encoded is None else encoded,
            version=pod.metadata.resource_version,
            started_ms=started_ms,
        )

    @property
    def mode(self) -> str:
        return PROCESS

    @property
    def pod(self) -> pb.Pod:
        return pb.Pod.FromString(self.encoded)

    @property
    def uid(self) -> str:
        """The pod's uid (its cgroup's name), read from the copy held."""
        return self.pod.metadata.uid

    def keep(self, pod: pb.Pod, encoded: bytes | None = None) -> None:
        """Remember ``pod`` if it is newer than the copy held; ``encoded``: its bytes, if the
        caller holds them (the informer's), taken for the same version too: the copy the
        agent's own write left is the informer's once the informer delivers it."""
        version = pod.metadata.resource_version
        if version > self.version:
            self.encoded = pod.SerializeToString() if encoded is None else encoded
            self.version = version
        elif encoded is not None and version == self.version:
            self.encoded = encoded


def _update_op(stored: pb.Pod, new: pb.Pod) -> Update:
    """The write of a non-terminal patch over ``stored``, a compare-and-set on its version. A
    start (BOUND to RUNNING, ``Patch.applied_to`` changing the phase and the start time alone)
    says so in the change feed (``POD_STARTED``): the shards take the start time from the hint
    and the Binders and agents pass over it undecoded — this agent its own write's echo."""
    if stored.status.phase == pb.POD_BOUND and new.status.phase == pb.POD_RUNNING:
        return Update(new, hint=pod_started_hint(new.status.started_ms))
    return Update(new)


def uid_key(pod: pb.Pod) -> int:
    """A pod's uid as a run remembers it (``PodRun.uid_key``)."""
    return hash(pod.metadata.uid)


class RunNames(Collection[str]):
    """The names of the pods some holders know, as one collection (each name once): what the
    agent's informer asks for the pods it keeps no bytes of (``Informer(held_elsewhere=)``)."""

    __slots__ = ("_holders",)

    def __init__(self, *holders: Collection[str]) -> None:
        self._holders = holders

    def __contains__(self, name: object) -> bool:
        return any(name in holder for holder in self._holders)

    def __iter__(self) -> Iterator[str]:
        for i, holder in enumerate(self._holders):
            earlier = self._holders[:i]
            for name in holder:
                if not any(name in other for other in earlier):
                    yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True, slots=True)
class RunAs:
    """The unprivileged user a process-mode pod runs as."""

    name: str
    uid: int
    gid: int

    @classmethod
    def own_uid(cls, uid: int) -> RunAs:
        """A uid of the pod's own (from the agent's range): no user of the machine's, its group
        the same number."""
        return cls(f"pod-{uid}", uid, uid)


def resolve_run_as(wanted: str, agent_uid: int) -> RunAs | None:
    """The one user every pod runs as, given ``--run-as`` (a user name or uid); None: empty (a
    root agent then gives each pod a uid of its own, see isolation.py; another runs them as
    itself). Raises ValueError naming the rule when the wish cannot be honoured: pods never run
    as root, and only a root agent can switch to another user."""
    if not wanted:
        return None
    try:
        entry = pwd.getpwuid(int(wanted)) if wanted.isdigit() else pwd.getpwnam(wanted)
    except (KeyError, OverflowError):
        raise ValueError(f"no user {wanted!r} on this machine") from None
    if entry.pw_uid == 0:
        raise ValueError(f"{wanted!r} is root: process-mode pods never run as root")
    if agent_uid == 0:
        return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid)
    if entry.pw_uid == agent_uid:
        return None
    raise ValueError(
        f"running pods as {wanted!r} needs the node agent to start as root "
        f"(it runs as uid {agent_uid}; leave run_as empty to run them as that user)"
    )


@dataclass(slots=True)
class Confinement:
    """What keeps one process pod apart, recorded as it is taken so that all of it is handed
    back when the pod ends: its user, whether that uid is the pod's alone, its cgroup."""

    user: RunAs | None = None
    own_uid: bool = False
    cgroup: PodCgroup | None = None


class PodRunner:
    def __init__(
        self,
        store: Store,
        node_modes: Mapping[str, str],
        work_dir: Path,
        *,
        flush_interval: float = 0.05,
        flush_max: int = 500,
        run_as: RunAs | None = None,
        pod_uids: PodUids | None = None,
        cgroups: Cgroups | None = None,
        numa_cpus: Mapping[int, tuple[int, ...]] | None = None,
    ) -> None:
        self._store = store
        # This machine's CPUs per NUMA id: a process pod holding NUMA nodes runs on theirs.
        self.numa_cpus = dict(numa_cpus or {})
        self.node_modes = dict(node_modes)
        self.work_dir = work_dir
        # Who process pods run as: a uid of their own each (``pod_uids``), else ``run_as`` for
        # all of them, else (both None) the agent's own non-root user.
        self.run_as = run_as
        self.pod_uids = pod_uids
        # None: pods run without CPU and memory limits (no usable cgroups).
        self.cgroups = cgroups
        self.flush_interval = flush_interval
        self.flush_max = flush_max
        self.runs: dict[str, PodRun] = {}
        # The informer's bytes of a pod it delivers (``Informer.encoded``; set by the agent):
        # a run shares them. Read only within a delivery, when they are the pod delivered.
        self.informed: Callable[[str], bytes | None] = lambda _name: None
        self.pending: dict[str, Patch] = {}
        # Version of our terminal write per finished pod no longer tracked in ``runs``, so a
        # late informer event for an older version does not start it again.
        self._finished: dict[str, int] = {}
        self._has_work = asyncio.Event()
        self._full = asyncio.Event()
        self._stopping = False
        # Round trips and pods written, for tests and metrics.
        self.commit_calls = 0
        self.pods_written = 0

    # -----------------------------------------------------------------------------------------
    # Informer side (synchronous, quick)
    # -----------------------------------------------------------------------------------------

    def known(self) -> Collection[str]:
        """The pods the runner knows exist: those it runs and those it finished (whose late
        events it ignores)."""
        return RunNames(self.runs, self._finished)

    def name_of(self, name: str) -> str:
        """The string the runner keys the pod by (``name`` itself if it runs no such pod): a
        holder keyed by pod shares it rather than keep a copy of every name."""
        run = self.runs.get(name)
        return name if run is None else run.name

    def handlers(self) -> Handlers:
        return Handlers.of(
            pb.Pod,
            on_add=lambda _k, pod: self.observe(pod),
            on_update=lambda _k, _old, pod: self.observe(pod),
            on_delete=lambda _k, pod: self.deleted(pod),
        )

    def observe(self, pod: pb.Pod) -> None:
        name = pod.metadata.name
        version = pod.metadata.resource_version
        run = self.runs.get(name)
        if run is not None and not run.runs(pod):
            self.deleted_named(name)  # deleted and created again between two events (a relist)
            run = None
        if run is not None:
            if isinstance(run, ProcessRun):
                run.keep(pod, self.informed(name))
            if pod.spec.node_name != run.node or (
                pod.status.phase in TERMINAL_PHASES and not run.finished
            ):
                # Ended by someone else (node lost, evicted): stop it, write nothing.
                log.info("pod ended elsewhere; stopping it", pod=name, phase=pod.status.phase)
                self._stop_run(run, kill_reason="")
                self.pending.pop(name, None)
                run.finished = True
                if run.mode == HOLLOW:
                    self.runs.pop(name, None)
            return
        if self._stopping or self._finished.get(name, 0) >= version:
            return
        mode = self.node_modes.get(pod.spec.node_name)
        if mode is None:
            return
        if pod.status.phase == pb.POD_BOUND:
            self._start(pod, mode)
        elif pod.status.phase == pb.POD_RUNNING:
            self._resume(pod, mode)

    def deleted(self, pod: pb.Pod) -> None:
        self.deleted_named(pod.metadata.name)

    def deleted_named(self, name: str) -> None:
        self._finished.pop(name, None)
        self.pending.pop(name, None)
        run = self.runs.pop(name, None)
        if run is not None:
            self._stop_run(run, kill_reason="")
            if isinstance(run, ProcessRun):
                # Its log and work dir live as long as the pod (as kubelet keeps a dead
                # container's logs until its pod is deleted), then go once its process has.
                if run.task is not None and not run.task.done():
                    run.task.add_done_callback(functools.partial(self._files_after, name))
                else:
                    self._remove_files(name)

    def _files_after(self, pod: str, _task: asyncio.Task[None]) -> None:
        self._remove_files(pod)

    def _remove_files(self, pod: str) -> None:
        paths = (self.work_dir / pod, self.log_path(pod))
        asyncio.get_running_loop().run_in_executor(None, _remove_paths, paths)

    # -----------------------------------------------------------------------------------------
    # Running pods
    # -----------------------------------------------------------------------------------------

    def _start(self, pod: pb.Pod, mode: str) -> None:
        name = pod.metadata.name
        if mode == PROCESS and not pod.spec.template.command:
            mode = HOLLOW  # nothing to execute: simulate it for its duration, like a hollow pod
        if mode == HOLLOW:
            run = self.runs[name] = PodRun.of(pod, name)
            self.queue(name, Patch(pb.POD_RUNNING, started_ms=now_ms()))
            if pod.spec.template.duration_ms:  # 0: runs until deleted
                self._arm_timer(run, pod.spec.template.duration_ms)
            return
        process = ProcessRun.of_process(pod, now_ms(), name, self.informed(name))
        self.runs[name] = process
        process.log_path = self.log_path(name)
        process.task = asyncio.create_task(self._run_process(process), name=f"pod:{name}")

    def _resume(self, pod: pb.Pod, mode: str) -> None:
        """A pod already RUNNING on our node that we do not track: this agent restarted."""
        name = pod.metadata.name
        if mode == PROCESS and not pod.spec.template.command:
            mode = HOLLOW  # simulated, as it was started: its timer resumes
        if mode == PROCESS:
            # Its process died with the previous agent, or runs unwatched: nothing to reattach
            # to. What may be left of it is killed.
            process = ProcessRun.of_process(pod, pod.status.started_ms, name, self.informed(name))
            process.finished = True
            self.runs[name] = process
            process.exited = True
            process.task = asyncio.create_task(self._reclaim(process), name=f"reclaim:{name}")
            self.queue(
                name,
                Patch(
                    pb.POD_FAILED,
                    finished_ms=now_ms(),
                    exit_code=-1,
                    reason="AgentRestarted",
                    message="the node agent restarted while the pod's process ran",
                ),
            )
            return
        run = self.runs[name] = PodRun.of(pod, name)
        duration = pod.spec.template.duration_ms
        if duration:
            started = pod.status.started_ms or now_ms()
            self._arm_timer(run, max(0, started + duration - now_ms()))

    def _arm_timer(self, run: PodRun, delay_ms: int) -> None:
        run.timer = asyncio.get_running_loop().call_later(delay_ms / 1000, self._hollow_done, run)

    def _hollow_done(self, run: PodRun) -> None:
        run.timer = None
        if self.runs.get(run.name) is not run:
            return
        run.finished = True
        self.queue(run.name, Patch(pb.POD_SUCCEEDED, finished_ms=now_ms(), reason="Completed"))

    async def _run_process(self, run: ProcessRun) -> None:
        cwd = self.work_dir / run.name
        proc: asyncio.subprocess.Process | None = None
        held = Confinement()  # filled as it is taken: whatever was taken is handed back
        try:
            try:
                proc = await self._spawn(run, cwd, held)
            except OSError as exc:
                await self._hand_back(held, cwd)
                self._process_ended(run, 127, "StartError", str(exc))
                return
            log.info(
                "pod process started",
                pod=run.name,
                pid=proc.pid,
                user=held.user.name if held.user else "(the agent's)",
                cgroup=bool(held.cgroup),
            )
            run.pid = proc.pid
            self.queue(run.name, Patch(pb.POD_RUNNING, started_ms=run.started_ms))
            code = await proc.wait()
        except asyncio.CancelledError:
            if proc is not None and proc.returncode is None:
                await _kill(proc, grace_seconds(run.pod))
            await self._hand_back(held, cwd)
            if run.kill_reason:
                self._process_ended(
                    run, _exit_code(proc.returncode if proc else None), run.kill_reason, ""
                )
            raise
        finally:
            run.pid = None
            run.exited = True
        # Before the end is reported: once a pod is seen ended, nothing of it runs any more.
        await self._hand_back(held, cwd)
        if code == 0:
            self._process_ended(run, 0, "Completed", "")
        else:
            message = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            self._process_ended(run, _exit_code(code), "Error", message)

    async def _spawn(
        self, run: ProcessRun, cwd: Path, held: Confinement
    ) -> asyncio.subprocess.Process:
        """Start the pod's process: its user and cgroup taken (recorded in ``held``), its work
        dir made its own, then the command through the launcher. OSError (also written to its
        log): it did not start."""
        pod = run.pod
        assert run.log_path is not None
        with _open_log(run.log_path) as out:
            try:
                held.user = self.run_as
                if self.pod_uids is not None:
                    held.user, held.own_uid = RunAs.own_uid(await self._allocate_uid()), True
                _make_work_dir(cwd, held.user)
                user = held.user
                own_home = (
                    {"HOME": str(cwd), "TMPDIR": str(cwd), "USER": user.name, "LOGNAME": user.name}
                    if user is not None
                    else {}
                )
                env = pod_env(pod, os.environ, own_home)
                if self.cgroups is not None:
                    requests = pod.spec.template.requests
                    held.cgroup = self.cgroups.create(
                        cgroup_name(run.uid), requests.milli_cpu, requests.memory_bytes
                    )
                argv = list(pod.spec.template.command)
                cpus = pinned_cpus(pod, self.numa_cpus)
                if user is not None or cpus or held.cgroup is not None:
                    joins = held.cgroup.procs_files if held.cgroup is not None else ()
                    argv = launcher(argv, user, cpus, env.get("PATH", os.defpath), joins)
                return await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=cwd,
                    env=env,
                    start_new_session=True,  # its own process group: kill the whole tree
                )
            except OSError as exc:
                out.write(f"cannot start {list(pod.spec.template.command)}: {exc}\n".encode())
                raise

    async def _allocate_uid(self) -> int:
        """A uid of the pod's own (off the event loop: it reads /proc). If the pod is cancelled
        meanwhile, the uid is released once it comes."""
        assert self.pod_uids is not None
        uids = self.pod_uids
        allocation = asyncio.get_running_loop().run_in_executor(None, uids.allocate)
        try:
            return await asyncio.shield(allocation)
        except asyncio.CancelledError:
            allocation.add_done_callback(
                lambda done: None if done.exception() else uids.release(done.result())
            )
            raise

    async def _hand_back(self, held: Confinement, cwd: Path) -> None:
        """Give back what kept a pod apart once its process has ended: whatever still runs as
        its own uid or in its cgroup is killed, the cgroup removed, its work dir handed back to
        the agent (so whoever gets the uid next cannot reach its files), the uid released."""
        user, own_uid, cgroup = held.user, held.own_uid, held.cgroup
        held.user, held.own_uid, held.cgroup = None, False, None
        if user is not None and own_uid:
            await kill_every_process_of(user.uid)
        if cgroup is not None and self.cgroups is not None:
            await self.cgroups.remove(cgroup)
        if user is not None:
            with contextlib.suppress(FileNotFoundError):
                os.chown(cwd, os.geteuid(), os.getegid(), follow_symlinks=False)
        if user is not None and own_uid and self.pod_uids is not None:
            self.pod_uids.release(user.uid)

    async def _reclaim(self, run: ProcessRun) -> None:
        """A process pod a previous agent ran (it died, kill -9): what may still run of it is
        killed and its cgroup removed, found from what that agent left — the work dir's owner
        (its uid, if this agent can claim it: nobody else holds it) and the cgroup named after
        the pod."""
        cwd = self.work_dir / run.name
        held = Confinement()
        if self.pod_uids is not None:
            with contextlib.suppress(FileNotFoundError):
                owner = cwd.stat().st_uid
                if self.pod_uids.claim(owner):
                    held.user, held.own_uid = RunAs.own_uid(owner), True
        if self.cgroups is not None:
            held.cgroup = self.cgroups.existing(cgroup_name(run.uid))
        if held.user is not None or held.cgroup is not None:
            log.info("cleaning up after a previous agent's pod", pod=run.name)
        await self._hand_back(held, cwd)

    def _process_ended(self, run: ProcessRun, code: int, reason: str, message: str) -> None:
        run.finished = True
        phase = pb.POD_SUCCEEDED if code == 0 and reason == "Completed" else pb.POD_FAILED
        log.info("pod process ended", pod=run.name, exit_code=code, reason=reason)
        self.queue(
            run.name,
            Patch(phase, finished_ms=now_ms(), exit_code=code, reason=reason, message=message),
        )

    def _stop_run(self, run: PodRun, *, kill_reason: str) -> None:
        if run.timer is not None:
            run.timer.cancel()
            run.timer = None
        if isinstance(run, ProcessRun) and run.task is not None and not run.task.done():
            run.kill_reason = kill_reason
            run.task.cancel()

    def pid_of(self, pod: str) -> int | None:
        """The running process of a process-mode pod, if any."""
        run = self.runs.get(pod)
        return run.pid if isinstance(run, ProcessRun) else None

    def log_path(self, pod: str) -> Path:
        return self.work_dir / f"{pod}.log"

    # -----------------------------------------------------------------------------------------
    # Batched status writes
    # -----------------------------------------------------------------------------------------

    def queue(self, name: str, patch: Patch) -> None:
        earlier = self.pending.get(name)
        self.pending[name] = earlier.then(patch) if earlier else patch
        self._has_work.set()
        if len(self.pending) >= self.flush_max:
            self._full.set()

    async def run_flusher(self) -> None:
        retry = Retry(_STORE_RETRY)
        while True:
            await self._has_work.wait()
            if len(self.pending) < self.flush_max:
                # Let a batch gather; flush at once when it is full.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self.flush_interval)
            self._has_work.clear()
            self._full.clear()
            try:
                await self.flush()
                retry.reset()
            except StoreUnavailableError as exc:
                log.warning("store unavailable; pod status writes wait", error=str(exc))
                await retry.sleep()
            if self.pending:
                self._has_work.set()

    async def flush(self) -> None:
        """Write up to ``flush_max`` pending patches: one read of their pods as stored, one write
        round trip (plus one read of the pods whose write conflicted)."""
        batch: list[tuple[str, Patch]] = []
        while self.pending and len(batch) < self.flush_max:
            name = next(iter(self.pending))
            batch.append((name, self.pending.pop(name)))
        writes: list[tuple[str, Patch, pb.Pod]] = []
        commits: list[list[Op]] = []
        for name, patch, pod in await self._as_stored(batch):
            new = patch.applied_to(pod)
            if new is None:
                continue
            writes.append((name, patch, new))
            commits.append([Release(new)] if patch.terminal else [_update_op(pod, new)])
        if not writes:
            return
        self.commit_calls += 1
        try:
            results = await self._store.commit_many(commits)
        except (StoreUnavailableError, asyncio.CancelledError):
            for name, patch, _ in writes:  # ambiguous outcome: CAS makes a repeat harmless
                self._requeue(name, patch)
            raise
        conflicts: list[tuple[str, Patch]] = []
        for (name, patch, new), result in zip(writes, results, strict=True):
            cause = result.cause if isinstance(result, CommitError) else result
            if isinstance(cause, ConflictError):
                conflicts.append((name, patch))
            elif isinstance(cause, NotFoundError):
                self._forget(name)  # deleted meanwhile
            elif isinstance(cause, StoreError):
                log.error("pod status write failed", pod=name, error=str(cause))
            else:
                self.pods_written += 1
                self._written(name, patch, new)
        if conflicts:
            await self._reread(conflicts)

    async def _as_stored(self, batch: list[tuple[str, Patch]]) -> list[tuple[str, Patch, pb.Pod]]:
        """The batch's pods as stored now, each beside its patch (one ``get_many``): a run
        keeps no copy of a hollow pod to write over. A pod gone is forgotten; one of another
        uid or node (the informer has yet to say) is left to the informer's event."""
        runs = [(name, patch) for name, patch in batch if name in self.runs]
        if not runs:
            return []
        try:
            stored = await self._store.get_many(pb.Pod, [name for name, _ in runs])
        except (StoreUnavailableError, asyncio.CancelledError):
            for name, patch in runs:
                self._requeue(name, patch)
            raise
        out: list[tuple[str, Patch, pb.Pod]] = []
        for (name, patch), pod in zip(runs, stored, strict=True):
            run = self.runs.get(name)
            if run is None:
                continue
            if pod is None:
                self._forget(name)  # deleted meanwhile
                continue
            if run.runs(pod) and pod.spec.node_name == run.node:
                run.keep(pod)
                out.append((name, patch, pod))
        return out

    def _written(self, name: str, patch: Patch, new: pb.Pod) -> None:
        run = self.runs.get(name)
        if run is None:
            return
        run.keep(new)
        if patch.terminal and run.mode == HOLLOW:
            # Nothing left to serve for it; remember the write so late events are ignored.
            self.runs.pop(name, None)
            self._finished[name] = new.metadata.resource_version

    async def _reread(self, conflicts: list[tuple[str, Patch]]) -> None:
        fresh = await self._store.get_many(pb.Pod, [name for name, _ in conflicts])
        for (name, patch), pod in zip(conflicts, fresh, strict=True):
            run = self.runs.get(name)
            if run is None:
                continue
            if pod is None:
                self._forget(name)
                continue
            run.keep(pod)
            if pod.spec.node_name == run.node and patch.applied_to(pod) is not None:
                self._requeue(name, patch)

    def _requeue(self, name: str, patch: Patch) -> None:
        later = self.pending.get(name)
        self.pending[name] = patch.then(later) if later else patch
        self._has_work.set()

    def _forget(self, name: str) -> None:
        run = self.runs.pop(name, None)
        if run is not None:
            self._stop_run(run, kill_reason="")

    # -----------------------------------------------------------------------------------------
    # Stop
    # -----------------------------------------------------------------------------------------

    async def stop(self, *, final_flush_attempts: int = 5) -> None:
        """Kill process-mode children (their pods → FAILED "AgentStopped"), write what is
        pending. Hollow pods stay RUNNING: a restarted agent resumes their timers."""
        self._stopping = True
        tasks = []
        for run in list(self.runs.values()):
            if run.timer is not None:
                run.timer.cancel()
                run.timer = None
            if isinstance(run, ProcessRun) and run.task is not None and not run.task.done():
                self._stop_run(run, kill_reason="AgentStopped")
                tasks.append(run.task)
        await asyncio.gather(*tasks, return_exceptions=True)
        retry = Retry(_FINAL_FLUSH_RETRY)
        for _ in range(final_flush_attempts):
            if not self.pending:
                break
            try:
                await self.flush()
            except StoreUnavailableError as exc:
                log.warning("final pod status flush failed", error=str(exc))
                await retry.sleep()
        if self.pending:
            log.warning("pod status writes lost at stop", pods=len(self.pending))


# Run by the pod's own interpreter process, which then becomes the pod's command (same pid, same
# process group). Joining the cgroup, pinning and dropping root happen inside the child, rather
# than through subprocess's ``preexec_fn`` or ``user=``: either makes CPython fork() instead of
# vfork(), and a fork of this multi-threaded gRPC process can crash the child before it execs
# (``preexec_fn`` also runs Python code between fork and exec, which is unsafe with threads);
# uvloop does not take ``extra_groups`` either. The cgroup is joined and the CPUs are set first,
# while still root, so the command and everything it starts are in them (a call on its pid
# afterwards would race); uid -1: no drop. A dropped pod's files are its own only (umask 077),
# wherever it writes them.
_LAUNCH = (
    "import os, sys\n"
    "uid, gid, cpus, cgroups = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]\n"
    "program, argv = sys.argv[5], sys.argv[6:]\n"
    "try:\n"
    "    for procs in filter(None, cgroups.split('\\n')):\n"
    "        with open(procs, 'w') as joined:\n"
    "            joined.write(str(os.getpid()))\n"
    "    if cpus:\n"
    "        os.sched_setaffinity(0, [int(c) for c in cpus.split(',')])\n"
    "    if uid >= 0:\n"
    "        os.setgroups([]); os.setgid(gid); os.setuid(uid); os.umask(0o077)\n"
    "    os.execv(program, argv)\n"
    "except OSError as exc:\n"
    "    sys.stderr.write(f'cannot start {argv}: {exc}\\n'); sys.exit(127)\n"
)


def launcher(
    argv: list[str],
    user: RunAs | None,
    cpus: tuple[int, ...],
    path: str,
    cgroup_procs: tuple[Path, ...] = (),
) -> list[str]:
    """``argv`` run through an isolated interpreter that joins the cgroup whose ``cgroup.procs``
    files are ``cgroup_procs`` (none: stays in the agent's), pins it to ``cpus`` (none:
    unpinned), drops root to ``user`` (None: stays the agent's user) — supplementary groups,
    group, user, in that order, or the later calls are refused — and execs it. The program is
    looked up here, with root's view of the file system: the unprivileged child may not read the
    interpreter's own library any more. One that is not there is refused here, as an exec of it
    would be (OSError: StartError)."""
    program = shutil.which(argv[0], path=path)
    if program is None:
        raise FileNotFoundError(errno.ENOENT, "no such executable", argv[0])
    return [
        sys.executable,
        "-I",
        "-S",
        "-c",
        _LAUNCH,
        str(user.uid) if user is not None else "-1",
        str(user.gid) if user is not None else "-1",
        ",".join(map(str, cpus)),
        "\n".join(map(str, cgroup_procs)),
        program,
        *argv,
    ]


def pinned_cpus(pod: pb.Pod, numa_cpus: Mapping[int, tuple[int, ...]]) -> tuple[int, ...]:
    """The CPUs of the NUMA nodes the Binder assigned the pod, where this OS can pin a process
    (os.sched_setaffinity: Linux); () to run it unpinned."""
    if not pod.spec.numa_nodes or not hasattr(os, "sched_setaffinity"):
        return ()
    return tuple(sorted({c for i in pod.spec.numa_nodes for c in numa_cpus.get(i, ())}))


def pod_env(
    pod: pb.Pod, agent_env: Mapping[str, str], own_home: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A pod's environment: a few basics of the agent's (PATH, HOME, ...), its own HOME and user
    where it runs as a user of its own (``own_home``), the pod's identity (GODEL_POD, GODEL_JOB,
    GODEL_POD_INDEX, GODEL_NODE), then the template's env, and last its GPU cards
    (CUDA_VISIBLE_DEVICES, GODEL_GPU_MILLI: ``gpus.gpu_env``), which the template cannot widen."""
    env = {k: agent_env[k] for k in _INHERITED_ENV if k in agent_env}
    env.setdefault("PATH", os.defpath)
    env.update(own_home or {})
    env.update(
        GODEL_POD=pod.metadata.name,
        GODEL_JOB=pod.spec.job,
        GODEL_POD_INDEX=str(pod.spec.index),
        GODEL_NODE=pod.spec.node_name,
    )
    env.update(pod.spec.template.env)
    env.update(gpu_env(pod))
    return env


def _exit_code(returncode: int | None) -> int:
    """The shell's convention: 128 + signal for a signalled child."""
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


def grace_seconds(pod: pb.Pod) -> float:
    """Between SIGTERM and SIGKILL: the pod's ``termination_grace_seconds``, else the default."""
    return float(pod.spec.template.termination_grace_seconds or KILL_GRACE_SECONDS)


async def _kill(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), wait)
            return
        except TimeoutError:
            continue


def _make_work_dir(cwd: Path, user: RunAs | None) -> None:
    """The pod's work dir; run as another user, its own (0700) and its only writable place. The
    agent's directories above it stay private: the child enters it before it drops root."""
    cwd.mkdir(parents=True, exist_ok=True)
    if user is not None:
        os.chown(cwd, user.uid, user.gid)
        cwd.chmod(0o700)


def _open_log(path: Path) -> BinaryIO:
    """A pod's log, new and readable by the agent only (the work dir it is in is private too)."""
    return os.fdopen(
        os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "wb"
    )


def _remove_paths(paths: tuple[Path, ...]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
