"""Process pods kept apart from each other: a uid of their own, and a cgroup holding their
requests as limits.

A root agent gives each running process pod a uid from ``pod_uid_range`` (its gid is the same
number: a group of its own). A uid is one pod's from its start until its processes are all gone:
``PodUids`` claims it with a lock every agent on the machine sees (an open-file-description lock
on one byte of ``UID_LOCK_FILE``, dropped by the kernel if the agent dies), and skips a uid that a
live process or an entry of the agent's work dir still has — so a restarted agent, whose locks
died with it, does not hand a pod's uid to another while that pod's orphans run or its files are
reachable. Uids go round the range: while an agent runs, a uid comes back to another pod only
after the rest of the range has been handed out (a restarted agent starts again at its start).

A pod's cgroup (``Cgroups``: v2 where the agent's cgroup2 directory has the cpu and memory
controllers, else v1's cpu and memory hierarchies, else none) is made under the agent's own
cgroup, named after the pod's uid in the store; the launcher joins it before it drops root.

Plain functions hold the rules (tested table by table in tests/test_isolation.py); the classes
(``UidClaims``, ``PodUids``, ``Cgroups``) only hold the kernel state that applies them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import re
import signal
import struct
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

# Outside every distribution's system users (< 65536) and the usual /etc/subuid ranges of the
# first users (100000-165535): 65,536 uids.
DEFAULT_UID_RANGE = "200000-265535"
# The highest uid: (uid_t)-1 means "unchanged" to setuid and chown.
MAX_UID = 2**32 - 2
# One lock file for the machine (not per agent home): agents of different clusters on one
# machine must not hand out the same uid either.
UID_LOCK_FILE = Path("/run/godel-pod-uids.lock")

# CFS bandwidth: the period a pod's quota is per, and the kernel's least quota.
CFS_PERIOD_US = 100_000
MIN_CFS_QUOTA_US = 1_000
V1, V2 = 1, 2
# The v1 hierarchies a pod's limits need (v2 has both in one directory, keyed "").
V1_CONTROLLERS = ("cpu", "memory")
# Every file ``limit_files`` writes, of either version.
LIMIT_FILE_NAMES = (
    "cpu.max",
    "memory.max",
    "cpu.cfs_period_us",
    "cpu.cfs_quota_us",
    "memory.limit_in_bytes",
)


# ---------------------------------------------------------------------------------------------
# Rules (plain functions)
# ---------------------------------------------------------------------------------------------


def parse_uid_range(text: str) -> range:
    """``FIRST-LAST`` (inclusive) as a range; ValueError naming the rule otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if match is None:
        raise ValueError(f"{text!r} is not FIRST-LAST (e.g. {DEFAULT_UID_RANGE})")
    first, last = int(match[1]), int(match[2])
    if first == 0:
        raise ValueError(f"{text!r} holds uid 0, root: pods never run as root")
    if last < first:
        raise ValueError(f"{text!r} ends before it starts")
    if last > MAX_UID:
        raise ValueError(f"{text!r} goes past the highest uid {MAX_UID}")
    return range(first, last + 1)


def resolve_uid_range(
    text: str, *, agent_uid: int, run_as: str, machine_users: Mapping[int, str]
) -> range | None:
    """The uids pods get one each of: ``text`` (``pod_uid_range``), by default
    ``DEFAULT_UID_RANGE`` for a root agent; None when pods run as one user (``run_as`` given, or
    an agent that is not root and so cannot switch users). ValueError naming the rule when the
    wish cannot be honoured. A range may not hold a user of this machine (``machine_users``, uid
    → name): a pod would be that user."""
    if run_as:
        if text:
            raise ValueError(
                "give run_as (every pod runs as that one user) or pod_uid_range (each pod a uid "
                "of its own), not both"
            )
        return None
    if agent_uid != 0:
        if text:
            raise ValueError(
                f"a uid per pod needs the node agent to start as root (it runs as uid "
                f"{agent_uid}; leave pod_uid_range empty to run pods as that user)"
            )
        return None
    uids = parse_uid_range(text or DEFAULT_UID_RANGE)
    taken = sorted(uid for uid in machine_users if uid in uids)
    if taken:
        uid = taken[0]
        raise ValueError(
            f"{uids.start}-{uids.stop - 1} holds uid {uid}, user {machine_users[uid]!r} of this "
            "machine: a pod would run as it"
        )
    return uids


def status_uids(status: str) -> set[int]:
    """The real, effective, saved and file-system uids in a ``/proc/<pid>/status`` text."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return {int(field) for field in line.split()[1:]}
    return set()


def uid_candidates(uids: range, taken: Set[int], start: int) -> Iterator[int]:
    """The uids of ``uids`` not in ``taken``, from ``start`` round to just before it (least
    recently handed out first, when ``start`` follows the last one handed out)."""
    if start not in uids:
        start = uids.start
    for uid in (*range(start, uids.stop), *range(uids.start, start)):
        if uid not in taken:
            yield uid


def cpu_quota_us(milli_cpu: int) -> int | None:
    """The CFS quota per ``CFS_PERIOD_US`` that ``milli_cpu`` allows (the kernel's least at
    least); None: no limit."""
    if milli_cpu <= 0:
        return None
    return max(MIN_CFS_QUOTA_US, milli_cpu * CFS_PERIOD_US // 1000)


def limit_files(version: int, milli_cpu: int, memory_bytes: int) -> dict[str, dict[str, str]]:
    """What to write into a pod's cgroup for requests of ``milli_cpu`` and ``memory_bytes`` (0:
    no limit), per controller directory (v2: one, keyed ""), in the order to write them (v1's
    period before the quota it is the unit of)."""
    quota = cpu_quota_us(milli_cpu)
    if version == V2:
        return {
            "": {
                "cpu.max": f"{quota if quota else 'max'} {CFS_PERIOD_US}",
                "memory.max": str(memory_bytes) if memory_bytes > 0 else "max",
            }
        }
    return {
        "cpu": {
            "cpu.cfs_period_us": str(CFS_PERIOD_US),
            "cpu.cfs_quota_us": str(quota if quota else -1),
        },
        "memory": {"memory.limit_in_bytes": str(memory_bytes) if memory_bytes > 0 else "-1"},
    }


def _unescape(path: str) -> str:
    """A mountinfo path with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), path)


@dataclass(frozen=True, slots=True)
class CgroupDirs:
    """This process's own cgroup directory in each hierarchy that matters here: the cgroup2 one
    (None: no cgroup2 mount shows it) and the v1 ones of cpu and memory."""

    v2: Path | None
    v1: Mapping[str, Path]


def own_cgroup_dirs(mountinfo: str, proc_cgroup: str) -> CgroupDirs:
    """Where this process's cgroups are, from ``/proc/self/mountinfo`` and ``/proc/self/cgroup``:
    each mount's point joined with the process's path below the mount's root (a container sees
    its own cgroup as a mount's root). A hierarchy whose cgroup of ours no mount shows is left
    out."""
    paths_v1: dict[str, str] = {}
    path_v2: str | None = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and not controllers:
            path_v2 = path
        for controller in controllers.split(","):
            if controller in V1_CONTROLLERS:
                paths_v1[controller] = path
    v2: Path | None = None
    v1: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        fstype, _source, options = line.split(" - ", 1)[1].split()[:3]
        if fstype == "cgroup2" and path_v2 is not None and v2 is None:
            v2 = _below(point, root, path_v2)
        elif fstype == "cgroup":
            for controller in set(options.split(",")) & set(V1_CONTROLLERS):
                if controller in paths_v1 and controller not in v1:
                    below = _below(point, root, paths_v1[controller])
                    if below is not None:
                        v1[controller] = below
    return CgroupDirs(v2, v1)


def _below(point: str, root: str, path: str) -> Path | None:
    """The directory of cgroup ``path`` on a mount at ``point`` showing ``root``; None if the
    mount does not show it."""
    root = root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    return Path(point) / path[len(root) :].lstrip("/")


def cgroup_version(dirs: CgroupDirs, v2_controllers: str) -> int | None:
    """Which cgroups pods get: v2 where this process's cgroup2 directory offers cpu and memory
    (``v2_controllers``: its ``cgroup.controllers``), else v1 where both hierarchies show ours,
    else None."""
    if dirs.v2 is not None and {"cpu", "memory"} <= set(v2_controllers.split()):
        return V2
    if all(c in dirs.v1 for c in V1_CONTROLLERS):
        return V1
    return None


def cgroup_name(pod_uid: str) -> str:
    """A pod's cgroup directory name: its uid in the store, unique across clusters, so agents on
    one machine never meet in one directory."""
    return f"godel-pod-{pod_uid}"


def parse_pids(procs: str) -> list[int]:
    """The pids of a ``cgroup.procs`` text."""
    return [int(line) for line in procs.split() if line.isdigit()]


# ---------------------------------------------------------------------------------------------
# Uids
# ---------------------------------------------------------------------------------------------

# struct flock on 64-bit Linux: l_type, l_whence, l_start, l_len, l_pid (and padding).
_FLOCK = struct.Struct("hhqqi4x")


class NoFreeUid(OSError):
    """Every uid of the range is held (the pod cannot start: StartError)."""


class UidClaims:
    """Which uids pods on this machine hold: a lock on byte ``uid`` of one file per claim. It is
    an open-file-description lock, so it also keeps apart two agents of one process (tests), and
    the kernel drops it when the agent dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def _file(self) -> int:
        if self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            if os.fstat(fd).st_uid != os.geteuid():
                os.close(fd)
                raise PermissionError(
                    errno.EPERM, "the uid lock file belongs to someone else", str(self.path)
                )
            self._fd = fd
        return self._fd

    def claim(self, uid: int) -> bool:
        """Claim ``uid``; False if someone holds it."""
        try:
            fcntl.fcntl(self._file(), fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, 0, uid, 1, 0))
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    def release(self, uid: int) -> None:
        fcntl.fcntl(self._file(), fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, 0, uid, 1, 0))

    def close(self) -> None:
        """Drop every claim (the agent stops)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def uid_lock_file() -> Path:
    """``UID_LOCK_FILE``, or where /run is missing or not ours to write, one in the temp dir
    (created 0600 without following a link; a file someone else owns is refused)."""
    if os.access(UID_LOCK_FILE.parent, os.W_OK):
        return UID_LOCK_FILE
    return Path(tempfile.gettempdir()) / UID_LOCK_FILE.name


class PodUids:
    """Hands each process pod a uid of ``uids`` nobody else has, and takes it back.

    ``allocate`` reads /proc and the work dir (call it off the event loop; a lock orders
    concurrent calls)."""

    def __init__(self, uids: range, work_dir: Path, claims: UidClaims) -> None:
        self.uids = uids
        self.work_dir = work_dir
        self._claims = claims
        self._held: set[int] = set()
        self._next = uids.start
        self._mutex = threading.Lock()

    def allocate(self) -> int:
        with self._mutex:
            taken = self._held | uids_in_use(self.uids) | owners_in(self.work_dir, self.uids)
            for uid in uid_candidates(self.uids, taken, self._next):
                if self._claims.claim(uid):
                    self._held.add(uid)
                    self._next = uid + 1
                    return uid
        raise NoFreeUid(
            errno.EAGAIN,
            f"no free pod uid in {self.uids.start}-{self.uids.stop - 1} "
            f"({len(self._held)} held by this agent's pods)",
        )

    def claim(self, uid: int) -> bool:
        """Claim a uid found recorded (a work dir a previous agent left): False if it is held."""
        with self._mutex:
            if uid in self._held or uid not in self.uids or not self._claims.claim(uid):
                return False
            self._held.add(uid)
            return True

    def release(self, uid: int) -> None:
        with self._mutex:
            if uid in self._held:
                self._held.discard(uid)
                self._claims.release(uid)

    @property
    def held(self) -> frozenset[int]:
        return frozenset(self._held)

    def close(self) -> None:
        """Drop every claim (the agent stops, its pods gone)."""
        with self._mutex:
            self._held.clear()
            self._claims.close()


def uids_in_use(uids: range) -> set[int]:
    """The uids of ``uids`` some live process has (real, effective, saved or file-system)."""
    found: set[int] = set()
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    status = Path(entry.path, "status").read_text()
                except OSError:
                    continue  # exited meanwhile
                found |= {uid for uid in status_uids(status) if uid in uids}
    return found


def owners_in(directory: Path, uids: range) -> set[int]:
    """The uids of ``uids`` owning an entry of ``directory`` (a work dir left by a pod whose
    agent died before it ended)."""
    found: set[int] = set()
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            with contextlib.suppress(OSError):
                owner = entry.stat(follow_symlinks=False).st_uid
                if owner in uids:
                    found.add(owner)
    return found


# Run as the agent's child: becomes ``uid`` and sends SIGKILL to every process it may signal —
# exactly those of ``uid`` — in one pass of the kernel's, which a fork cannot outrun (a scan of
# /proc and a kill per pid could). ESRCH: there were none.
_KILL_EVERY_PROCESS = (
    "import os, sys\n"
    "os.setuid(int(sys.argv[1]))\n"
    "try:\n"
    "    os.kill(-1, 9)\n"
    "except ProcessLookupError:\n"
    "    pass\n"
)


async def kill_every_process_of(uid: int) -> None:
    """SIGKILL every process running as ``uid`` (a pod's leftovers: what left its session)."""
    try:
        helper = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            "-c",
            _KILL_EVERY_PROCESS,
            str(uid),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            cwd="/",
        )
    except OSError as exc:
        log.warning("killing a pod uid's processes failed", uid=uid, error=str(exc))
        return
    _, err = await helper.communicate()
    if helper.returncode:
        log.warning("killing a pod uid's processes failed", uid=uid, error=err.decode().strip())


# ---------------------------------------------------------------------------------------------
# Cgroups
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodCgroup:
    """A pod's cgroup: one directory (v2) or one per v1 hierarchy."""

    dirs: tuple[Path, ...]

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """What the launcher writes its pid into to join."""
        return tuple(d / "cgroup.procs" for d in self.dirs)

    def limits(self) -> dict[str, str]:
        """The limits it holds as the kernel shows them (file name → value): what was written,
        memory rounded down to whole pages."""
        return {
            name: (d / name).read_text().strip()
            for d in self.dirs
            for name in LIMIT_FILE_NAMES
            if (d / name).exists()
        }


# Removing a cgroup: kill what is in it, then rmdir, until it goes (a killed process leaves it
# when the kernel has finished with it).
_REMOVE_ATTEMPTS = 100
_REMOVE_PAUSE_SECONDS = 0.02


class Cgroups:
    """Makes, and removes, process pods' cgroups under this agent's own: ``bases`` per
    controller directory of ``limit_files`` ("" for v2's one)."""

    def __init__(self, version: int, bases: Mapping[str, Path]) -> None:
        self.version = version
        self.bases = dict(bases)

    @classmethod
    def detect(cls) -> Cgroups | None:
        """This machine's usable cgroups, or None (logged once, with why: pods then run without
        CPU and memory limits)."""
        try:
            dirs = own_cgroup_dirs(
                Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text()
            )
        except OSError as exc:
            log.warning("no cgroups: pods run without CPU and memory limits", reason=str(exc))
            return None
        controllers = ""
        if dirs.v2 is not None:
            with contextlib.suppress(OSError):
                controllers = (dirs.v2 / "cgroup.controllers").read_text()
        version = cgroup_version(dirs, controllers)
        if version is None:
            log.warning(
                "no cgroups: pods run without CPU and memory limits",
                reason="neither a cgroup2 directory with the cpu and memory controllers nor the "
                "v1 cpu and memory hierarchies show this process's cgroup",
            )
            return None
        bases: dict[str, Path] = (
            {"": dirs.v2} if version == V2 and dirs.v2 is not None else dict(dirs.v1)
        )
        cgroups = cls(version, bases)
        try:
            cgroups.probe()
        except OSError as exc:
            log.warning(
                "no cgroups: pods run without CPU and memory limits",
                version=version,
                reason=str(exc),
            )
            return None
        log.info("pod cgroups", version=version, under=sorted(map(str, bases.values())))
        return cgroups

    def probe(self) -> None:
        """Make and remove a cgroup under each base (v2: handing cpu and memory down first), so
        a base we may not write is found at start. OSError if not."""
        if self.version == V2:
            (self.bases[""] / "cgroup.subtree_control").write_text("+cpu +memory")
        for base in self.bases.values():
            probe = base / f"godel-probe-{os.getpid()}"
            probe.mkdir()
            probe.rmdir()

    def create(self, name: str, milli_cpu: int, memory_bytes: int) -> PodCgroup:
        """The pod's cgroup with its limits written (OSError: nothing is left made)."""
        made: list[Path] = []
        try:
            for controller, files in limit_files(self.version, milli_cpu, memory_bytes).items():
                directory = self.bases[controller] / name
                directory.mkdir()
                made.append(directory)
                for file, value in files.items():
                    (directory / file).write_text(value)
        except OSError:
            for directory in made:
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise
        return PodCgroup(tuple(made))

    def existing(self, name: str) -> PodCgroup | None:
        """The cgroup a previous agent made for a pod, if it is still there."""
        dirs = tuple(base / name for base in self.bases.values() if (base / name).is_dir())
        return PodCgroup(dirs) if dirs else None

    async def remove(self, cgroup: PodCgroup) -> None:
        """Kill whatever is still in the cgroup and remove it."""
        left = list(cgroup.dirs)
        for _ in range(_REMOVE_ATTEMPTS):
            for directory in list(left):
                for pid in _members(directory):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        log.warning("pod cgroup not removed", cgroup=str(directory), error=str(exc))
                        return
                    continue
                left.remove(directory)
            if not left:
                return
            await asyncio.sleep(_REMOVE_PAUSE_SECONDS)
        log.warning("pod cgroup not removed: processes stay in it", cgroups=sorted(map(str, left)))


def _members(directory: Path) -> list[int]:
    try:
        return parse_pids((directory / "cgroup.procs").read_text())
    except OSError:
        return []
