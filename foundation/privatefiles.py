"""Files and directories only their owner may read: what a cluster keeps on disk (its state with
the store's password, store data, secrets, logs) is created that way, whatever the umask of the
process that writes it.

Two layers, both needed: every file is created with an explicit mode here (a process started
with umask 022 still writes 0600), and every process a cluster spawns (services, store servers,
Sentinels) runs with ``PRIVATE_UMASK``, so that what *they* create — an AOF, a rewritten config,
a pod's log — is private too.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

PRIVATE_UMASK = 0o077
"""Group and others get nothing: files 0600, directories 0700."""
FILE_MODE = 0o600
DIR_MODE = 0o700


def make_dir(path: Path) -> None:
    """``path`` and its missing parents, 0700. An existing directory keeps its mode."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)


def write(path: Path, data: str | bytes) -> None:
    """Write ``path`` (created or truncated) readable by its owner only; an existing file is
    made 0600 too (``O_CREAT`` keeps an old file's mode)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "wb") as handle:
        _restrict(fd)
        handle.write(data.encode() if isinstance(data, str) else data)


def open_append(path: Path | str) -> BinaryIO:
    """``path`` opened for appending (a log a child process writes to), created 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        _restrict(fd)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def _restrict(fd: int) -> None:
    # A regular file only: /dev/null, say, is everyone's and stays so.
    if stat.S_ISREG(os.fstat(fd).st_mode):
        os.fchmod(fd, FILE_MODE)


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """``PRIVATE_UMASK`` for this process while inside (and for whatever it spawns then); the
    previous umask after."""
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)
