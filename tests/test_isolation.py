"""Process pods kept apart (services/nodeagent/isolation.py): the rules table by table, then the
real kernel — uids held through a machine-wide lock and skipped while a process or a file has
them, a pod uid's leftovers killed in one pass, cgroups made with the requests as limits, joined
and removed (skipped, saying why, where the kernel or the user does not allow it)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.nodeagent.isolation import (
    CFS_PERIOD_US,
    V1,
    V2,
    CgroupDirs,
    Cgroups,
    NoFreeUid,
    PodCgroup,
    PodUids,
    UidClaims,
    cgroup_name,
    cgroup_version,
    cpu_quota_us,
    kill_every_process_of,
    limit_files,
    own_cgroup_dirs,
    parse_pids,
    parse_uid_range,
    resolve_uid_range,
    status_uids,
    uid_candidates,
)

# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------

UID_RANGE_CASES: list[tuple[str, str, range | str]] = [
    ("default shape", "200000-265535", range(200000, 265536)),
    ("one uid, spaces", " 300000 - 300000 ", range(300000, 300001)),
    ("not a range", "200000", "is not FIRST-LAST"),
    ("negative", "-5-10", "is not FIRST-LAST"),
    ("root in it", "0-100", "holds uid 0, root"),
    ("backwards", "20-10", "ends before it starts"),
    ("past the last uid", "4294967290-4294967295", "goes past the highest uid 4294967294"),
]


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in UID_RANGE_CASES], ids=[c[0] for c in UID_RANGE_CASES]
)
def test_parse_uid_range(text: str, expected: range | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            parse_uid_range(text)
    else:
        assert parse_uid_range(text) == expected


USERS = {0: "root", 65534: "nobody", 1000: "dev", 300005: "svc"}
RESOLVE_CASES: list[tuple[str, str, int, str, range | str | None]] = [
    ("root agent: the default range", "", 0, "", range(200000, 265536)),
    ("root agent: a range given", "400000-400009", 0, "", range(400000, 400010)),
    ("one user asked for", "", 0, "nobody", None),
    ("unprivileged agent: its own user", "", 1000, "", None),
    ("both asked for", "400000-400009", 0, "nobody", "not both"),
    ("unprivileged agent given a range", "400000-400009", 1000, "", "needs the node agent to start as root"),
    ("a machine user in the range", "300000-300010", 0, "", "holds uid 300005, user 'svc'"),
    ("nobody in the range", "60000-70000", 0, "", "holds uid 65534, user 'nobody'"),
    ("bad text", "lots", 0, "", "is not FIRST-LAST"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "agent_uid", "run_as", "expected"),
    [c[1:] for c in RESOLVE_CASES],
    ids=[c[0] for c in RESOLVE_CASES],
)
def test_resolve_uid_range(
    text: str, agent_uid: int, run_as: str, expected: range | str | None
) -> None:
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            resolve_uid_range(text, agent_uid=agent_uid, run_as=run_as, machine_users=USERS)
    else:
        got = resolve_uid_range(text, agent_uid=agent_uid, run_as=run_as, machine_users=USERS)
        assert got == expected


@pytest.mark.parametrize(
    ("status", "uids"),
    [
        ("Name:\tsleep\nUid:\t200001\t200001\t200001\t200001\nGid:\t5\t5\t5\t5\n", {200001}),
        ("Uid:\t200001\t0\t0\t0\n", {200001, 0}),  # a set-uid program the pod ran
        ("Name:\tgone\n", set()),
    ],
    ids=["a pod's process", "set-uid", "no Uid line"],
)
def test_status_uids(status: str, uids: set[int]) -> None:
    assert status_uids(status) == uids


CANDIDATE_CASES: list[tuple[str, range, set[int], int, list[int]]] = [
    ("from the start", range(10, 14), set(), 10, [10, 11, 12, 13]),
    ("round from the last handed out", range(10, 14), set(), 12, [12, 13, 10, 11]),
    ("taken ones skipped", range(10, 14), {11, 13}, 12, [12, 10]),
    ("a start outside the range", range(10, 14), {10}, 99, [11, 12, 13]),
    ("everything taken", range(10, 12), {10, 11}, 10, []),
]


@pytest.mark.parametrize(
    ("uids", "taken", "start", "order"),
    [c[1:] for c in CANDIDATE_CASES],
    ids=[c[0] for c in CANDIDATE_CASES],
)
def test_uid_candidates(uids: range, taken: set[int], start: int, order: list[int]) -> None:
    assert list(uid_candidates(uids, taken, start)) == order


@pytest.mark.parametrize(
    ("milli_cpu", "quota"),
    [(0, None), (-1, None), (1, 1_000), (100, 10_000), (1500, 150_000), (4000, 400_000)],
)
def test_cpu_quota_us(milli_cpu: int, quota: int | None) -> None:
    assert cpu_quota_us(milli_cpu) == quota


LIMIT_CASES: list[tuple[str, int, int, int, dict[str, dict[str, str]]]] = [
    ("v2 limits", V2, 250, 64 << 20,
     {"": {"cpu.max": "25000 100000", "memory.max": str(64 << 20)}}),
    ("v2 no requests", V2, 0, 0, {"": {"cpu.max": "max 100000", "memory.max": "max"}}),
    ("v1 limits", V1, 2000, 1 << 30,
     {"cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "200000"},
      "memory": {"memory.limit_in_bytes": str(1 << 30)}}),
    ("v1 no requests", V1, 0, 0,
     {"cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1"},
      "memory": {"memory.limit_in_bytes": "-1"}}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("version", "milli_cpu", "memory_bytes", "files"),
    [c[1:] for c in LIMIT_CASES],
    ids=[c[0] for c in LIMIT_CASES],
)
def test_limit_files(
    version: int, milli_cpu: int, memory_bytes: int, files: dict[str, dict[str, str]]
) -> None:
    got = limit_files(version, milli_cpu, memory_bytes)
    assert got == files
    # The order of writing: v1's period before the quota counted in it.
    assert [list(f) for f in got.values()] == [list(f) for f in files.values()]


HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_SELF = "4:memory:/sandbox/abc\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n"
V2_MOUNTS = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
V2_SELF = "0::/system.slice/godel-agent.service\n"
# A container: each hierarchy mounted showing only the container's cgroup as its root.
DOCKER_MOUNTS = """\
700 690 0:40 /docker/c0ffee /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct
701 690 0:41 /docker/c0ffee /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
"""
DOCKER_SELF = "5:memory:/docker/c0ffee\n3:cpu,cpuacct:/docker/c0ffee/agent\n"
SPACED_MOUNTS = "29 23 0:26 / /mnt/my\\040cgroups rw - cgroup2 cgroup2 rw\n"

DIRS_CASES: list[tuple[str, str, str, CgroupDirs]] = [
    ("hybrid: v1 controllers, empty unified", HYBRID_MOUNTS, HYBRID_SELF,
     CgroupDirs(Path("/sys/fs/cgroup/unified"),
                {"cpu": Path("/sys/fs/cgroup/cpu"),
                 "memory": Path("/sys/fs/cgroup/memory/sandbox/abc")})),
    ("pure v2", V2_MOUNTS, V2_SELF,
     CgroupDirs(Path("/sys/fs/cgroup/system.slice/godel-agent.service"), {})),
    ("container: below each mount's root", DOCKER_MOUNTS, DOCKER_SELF,
     CgroupDirs(None, {"cpu": Path("/sys/fs/cgroup/cpu,cpuacct/agent"),
                       "memory": Path("/sys/fs/cgroup/memory")})),
    ("our cgroup not shown by the mount", DOCKER_MOUNTS, "5:memory:/elsewhere\n",
     CgroupDirs(None, {})),
    ("escaped mount point", SPACED_MOUNTS, "0::/a\n", CgroupDirs(Path("/mnt/my cgroups/a"), {})),
    ("no cgroups at all", "", "", CgroupDirs(None, {})),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mountinfo", "proc_cgroup", "dirs"),
    [c[1:] for c in DIRS_CASES],
    ids=[c[0] for c in DIRS_CASES],
)
def test_own_cgroup_dirs(mountinfo: str, proc_cgroup: str, dirs: CgroupDirs) -> None:
    got = own_cgroup_dirs(mountinfo, proc_cgroup)
    assert (got.v2, dict(got.v1)) == (dirs.v2, dict(dirs.v1))


BOTH_V1 = {"cpu": Path("/c"), "memory": Path("/m")}
VERSION_CASES: list[tuple[str, CgroupDirs, str, int | None]] = [
    ("v2 with cpu and memory", CgroupDirs(Path("/u"), {}), "cpuset cpu io memory pids", V2),
    ("v2 wins over v1", CgroupDirs(Path("/u"), BOTH_V1), "cpu memory", V2),
    ("empty unified: v1", CgroupDirs(Path("/u"), BOTH_V1), "", V1),
    ("v2 without memory, no v1", CgroupDirs(Path("/u"), {}), "cpu io", None),
    ("v1 without memory", CgroupDirs(None, {"cpu": Path("/c")}), "", None),
    ("none", CgroupDirs(None, {}), "", None),
]


@pytest.mark.parametrize(
    ("dirs", "controllers", "version"),
    [c[1:] for c in VERSION_CASES],
    ids=[c[0] for c in VERSION_CASES],
)
def test_cgroup_version(dirs: CgroupDirs, controllers: str, version: int | None) -> None:
    assert cgroup_version(dirs, controllers) == version


def test_parse_pids() -> None:
    assert parse_pids("12\n345\n\n") == [12, 345]
    assert parse_pids("") == []


# --------------------------------------------------------------------------------------------
# The real kernel
# --------------------------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")
# Far from the default range, so an agent of another test on this machine is not met.
TEST_UIDS = range(290_100, 290_104)


def sleeper_as(uid: int | None) -> subprocess.Popen[bytes]:
    """A process of ``uid`` (run as another user from this single-threaded test; None: ours)."""
    if uid is None:
        return subprocess.Popen(["sleep", "60"])
    return subprocess.Popen(
        ["sleep", "60"], user=uid, group=uid, extra_groups=[], start_new_session=True
    )


def joiner(cgroup: PodCgroup) -> subprocess.Popen[bytes]:
    """A process that joins ``cgroup`` by writing its own pid, as the launcher does, then
    sleeps."""
    joins = repr([str(p) for p in cgroup.procs_files])
    join = f"import os\nfor p in {joins}:\n    open(p, 'w').write(str(os.getpid()))\n"
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", join + "os.execv('/bin/sleep', ['sleep', '60'])"]
    )


@needs_root
def test_a_uid_is_one_holders_until_released(tmp_path: Path) -> None:
    """Two agents (one lock file, two open descriptions: as two processes would) never get one
    uid; a uid a live process has, or that owns an entry of the work dir, is skipped; a
    released uid comes back only after the rest of the range went round."""
    lock = tmp_path / "uids.lock"
    work = tmp_path / "pods"
    work.mkdir()
    first = PodUids(TEST_UIDS, work, UidClaims(lock))
    second = PodUids(TEST_UIDS, work, UidClaims(lock))
    live = sleeper_as(TEST_UIDS[0])
    try:
        (work / "left-behind").mkdir()
        os.chown(work / "left-behind", TEST_UIDS[1], TEST_UIDS[1])
        got = first.allocate()
        assert got == TEST_UIDS[2]  # [0] runs a process, [1] owns a work dir
        assert second.allocate() == TEST_UIDS[3]  # the first's claim is seen
        with pytest.raises(NoFreeUid, match="no free pod uid in 290100-290103"):
            second.allocate()
        first.release(got)
        assert second.allocate() == got
    finally:
        live.kill()
        live.wait()


@needs_root
async def test_every_process_of_a_pod_uid_is_killed_even_outside_its_session() -> None:
    uid = TEST_UIDS[0]
    escaped = [sleeper_as(uid) for _ in range(2)]  # each in a session of its own
    bystander = sleeper_as(None)  # ours: untouched
    try:
        await kill_every_process_of(uid)
        for proc in escaped:
            assert await asyncio.to_thread(proc.wait, 10) == -9
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def usable_cgroups() -> Cgroups | None:
    return Cgroups.detect() if os.geteuid() == 0 else None


@pytest.mark.skipif(
    usable_cgroups() is None,
    reason="no usable cgroups here: neither v2 with cpu and memory nor writable v1 cpu and "
    "memory hierarchies (or not root)",
)
async def test_a_pod_cgroup_holds_its_requests_as_limits_and_goes_with_its_processes() -> None:
    cgroups = usable_cgroups()
    assert cgroups is not None
    milli_cpu, memory = 250, 96 << 20  # a whole number of pages: the kernel rounds down
    cgroup = cgroups.create(cgroup_name(f"test-{os.getpid()}"), milli_cpu, memory)
    child = None
    try:
        limits = cgroup.limits()
        if cgroups.version == V2:
            assert limits["cpu.max"] == f"{milli_cpu * 100} {CFS_PERIOD_US}"
            assert limits["memory.max"] == str(memory)
        else:
            assert limits["cpu.cfs_quota_us"] == str(milli_cpu * 100)
            assert limits["cpu.cfs_period_us"] == str(CFS_PERIOD_US)
            assert limits["memory.limit_in_bytes"] == str(memory)
        # A process joins by writing its own pid, as the launcher does before it execs.
        child = joiner(cgroup)

        async def joined() -> bool:
            return all(child.pid in parse_pids(p.read_text()) for p in cgroup.procs_files)

        for _ in range(200):
            if await joined():
                break
            await asyncio.sleep(0.05)
        assert await joined()
        await cgroups.remove(cgroup)  # kills what is in it
        assert await asyncio.to_thread(child.wait, 10) == -9
        assert not any(d.exists() for d in cgroup.dirs)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        await cgroups.remove(cgroup)
