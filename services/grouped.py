"""Names grouped by a key (a job's pods), for indexes that hold an entry per job.

Most jobs of a stream of one-pod jobs have one pod, and an empty set already costs about 220
bytes and an object the cyclic collector walks: a million one-pod jobs held 220 MB per such
index. A group of one is therefore held as the name itself, and becomes a set when a second
name joins it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, KeysView


class GroupedNames:
    """key -> the names grouped under it; a key with no names left is removed."""

    __slots__ = ("_groups",)

    def __init__(self) -> None:
        self._groups: dict[str, str | set[str]] = {}

    def add(self, key: str, name: str) -> None:
        group = self._groups.get(key)
        # A set first: the usual case when a job's pods come in one after the other (every
        # placed pod of a Binder's start).
        if isinstance(group, set):
            group.add(name)
        elif group is None:
            self._groups[key] = name
        elif group != name:
            self._groups[key] = {group, name}

    def add_all(self, key: str, names: list[str]) -> None:
        """``add`` of each of ``names`` (distinct), in one step (a listing's groups)."""
        if not names:
            return
        group = self._groups.get(key)
        if group is None and len(names) == 1:
            self._groups[key] = names[0]
            return
        merged = {group} if isinstance(group, str) else (group or set())
        merged.update(names)
        self._groups[key] = merged if len(merged) > 1 else next(iter(merged))

    def discard(self, key: str, name: str) -> None:
        group = self._groups.get(key)
        if group is None:
            return
        if isinstance(group, str):
            if group == name:
                del self._groups[key]
            return
        group.discard(name)
        if len(group) == 1:
            self._groups[key] = next(iter(group))

    def get(self, key: str) -> Collection[str]:
        """The names under ``key`` (empty if none); a view to read, never to change."""
        group = self._groups.get(key)
        if group is None:
            return ()
        return (group,) if isinstance(group, str) else group

    def count(self, key: str) -> int:
        group = self._groups.get(key)
        if group is None:
            return 0
        return 1 if isinstance(group, str) else len(group)

    def keys(self) -> KeysView[str]:
        return self._groups.keys()

    def __contains__(self, key: object) -> bool:
        return key in self._groups

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)
