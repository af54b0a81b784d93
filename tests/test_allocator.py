"""foundation.allocator: jemalloc preloaded into the processes the package starts, when installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from foundation.allocator import (
    ALLOCATOR_ENV,
    AllocatorError,
    find_jemalloc,
    jemalloc_env,
    jemalloc_wanted,
    preloaded,
)

JEMALLOC = find_jemalloc()


@pytest.mark.parametrize(
    ("setting", "wanted"),
    [(None, True), ("auto", True), ("libc", False)],
)
def test_the_setting_says_whether_jemalloc_is_wanted(setting: str | None, wanted: bool) -> None:
    env = {} if setting is None else {ALLOCATOR_ENV: setting}
    assert jemalloc_wanted(env) is wanted
    out = jemalloc_env(env)
    assert preloaded(out) is (wanted and JEMALLOC is not None)


@pytest.mark.parametrize("setting", ["jemalloc", "tcmalloc", "", "AUTO"])
def test_an_unknown_setting_is_refused_by_name(setting: str) -> None:
    with pytest.raises(AllocatorError, match=f"{ALLOCATOR_ENV} must be one of 'auto', 'libc'"):
        jemalloc_env({ALLOCATOR_ENV: setting})


def test_an_existing_preload_is_kept_and_jemalloc_not_added_twice() -> None:
    out = jemalloc_env({"LD_PRELOAD": "/opt/other.so"})
    assert "/opt/other.so" in out["LD_PRELOAD"].split()
    if JEMALLOC is not None:
        assert out["LD_PRELOAD"].split() == [JEMALLOC, "/opt/other.so"]
        assert jemalloc_env(out)["LD_PRELOAD"] == out["LD_PRELOAD"]


@pytest.mark.skipif(JEMALLOC is None, reason="needs jemalloc installed (CI installs it)")
def test_a_child_started_with_the_environment_runs_on_jemalloc() -> None:
    maps = subprocess.run(
        [sys.executable, "-c", "print(open('/proc/self/maps').read())"],
        env=jemalloc_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "libjemalloc" in maps
