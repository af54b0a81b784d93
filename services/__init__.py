"""The cluster's services, one package each (``python -m services.<kind>``), and what they share.

This package is the first thing a service process imports, so it decides what the process's
imports cost before any of them run: structlog loads ``rich`` (with ``pygments`` and ``attrs``,
~4 MiB of every process's heap) when it is installed, for the console's pretty tracebacks. The
project depends on rich for the bench's tables only; a service renders its exceptions as JSON,
or on a terminal as plain tracebacks, so structlog is loaded here with rich out of its sight.
A later ``import rich`` (the bench, in a process that imported services first) finds it as
usual.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

# Packages structlog imports only if they are there, and which no service uses.
_OPTIONAL_FOR_STRUCTLOG = ("rich",)


class _Unavailable(importlib.abc.MetaPathFinder):
    """A finder that says the named packages are not installed (an ImportError, which the
    libraries that try them take as "absent")."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] in self.names:
            raise ImportError(f"{fullname} is not loaded by services", name=fullname)
        return None


def _load_structlog_without_rich() -> None:
    if "structlog" in sys.modules or any(name in sys.modules for name in _OPTIONAL_FOR_STRUCTLOG):
        return  # loaded already, by whoever imported it first: nothing to choose
    finder = _Unavailable(_OPTIONAL_FOR_STRUCTLOG)
    sys.meta_path.insert(0, finder)
    try:
        import structlog  # noqa: F401  (its dev and tracebacks modules try rich on import)
    finally:
        sys.meta_path.remove(finder)


_load_structlog_without_rich()
