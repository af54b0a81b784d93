"""Objects held as their serialized bytes, decoded on each read.

Python's protobuf (upb) gives every decoded message its own arena, and an arena costs at least
half a KiB: a bound Pod of about 180 bytes on the wire takes about 2.6 KiB as a message. At the
paper's scale (a million pods) every process that watches pods held 2.5 GiB of them, nearly all
of its memory. Kept encoded, the same pod is a bytes object of about 0.2 KiB, and reading it
back costs about half a microsecond (upb decodes ~400 MB/s), less than the work any reader
does with it.

A read returns a fresh message each time: mutating it changes nothing stored, and two reads are
equal but not the same object. Holders of many objects of one kind (the informer's Pod cache,
the Binder's pods) use this instead of a dict of messages; anything that must stay small also
must not keep the decoded message (keep a compact record of the fields it needs instead).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from typing import Generic, TypeVar, overload

from google.protobuf.message import Message

M = TypeVar("M", bound=Message)
T = TypeVar("T")


class EncodedObjects(MutableMapping[str, M], Generic[M]):
    """A name -> message mapping that stores each message serialized."""

    __slots__ = ("_data", "_message")

    def __init__(self, message: type[M]) -> None:
        self._message = message
        self._data: dict[str, bytes] = {}

    def __getitem__(self, name: str) -> M:
        return self._message.FromString(self._data[name])

    @overload
    def get(self, name: str, /) -> M | None: ...

    @overload
    def get(self, name: str, default: M | T, /) -> M | T: ...

    def get(self, name: str, default: object = None) -> object:
        # Mapping.get goes through __getitem__ and a KeyError: on every watch event, that was
        # most of the informer's lookup of the object before.
        data = self._data.get(name)
        return default if data is None else self._message.FromString(data)

    def __setitem__(self, name: str, obj: M) -> None:
        self._data[name] = obj.SerializeToString()

    def __delitem__(self, name: str) -> None:
        del self._data[name]

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def get_encoded(self, name: str) -> bytes | None:
        """The stored bytes (equal bytes: an equal object), without decoding."""
        return self._data.get(name)

    def put_encoded(self, name: str, data: bytes) -> None:
        self._data[name] = data

    def put_many_encoded(self, items: Iterable[tuple[str, bytes]]) -> None:
        """``put_encoded`` for each (name, bytes): a listing's objects in one call."""
        self._data.update(items)

    def encoded_items(self) -> Iterator[tuple[str, bytes]]:
        """Each name and its stored bytes, not decoded (a reader decoding them all at once:
        ``message_class.FromString``, without a method call per object)."""
        return iter(self._data.items())

    @property
    def message_class(self) -> type[M]:
        return self._message

    def copy(self) -> EncodedObjects[M]:
        """A copy sharing the bytes (a pointer per object): safe to read on another thread
        while this one keeps changing."""
        other: EncodedObjects[M] = EncodedObjects(self._message)
        other._data = dict(self._data)
        return other

    def __repr__(self) -> str:
        return f"EncodedObjects({self._message.DESCRIPTOR.name}, {len(self._data)} objects)"


class EncodedList(Sequence[M], Generic[M]):
    """Messages sorted by name, held encoded: what a paged listing of a million pods keeps
    between its pages (decoded, they were 2.6 GiB). Indexing decodes; a slice is a list."""

    __slots__ = ("_data", "_message", "_names")

    def __init__(self, message: type[M], objects: Iterable[M]) -> None:
        self._message = message
        entries = sorted(
            ((o.metadata.name, o.SerializeToString()) for o in objects),  # type: ignore[attr-defined]  # M: a stored kind's message (all have metadata), Message where the API's List picks the kind at run time
            key=lambda e: e[0],
        )
        self._names: list[str] = [name for name, _ in entries]
        self._data: list[bytes] = [data for _, data in entries]

    @overload
    def __getitem__(self, index: int) -> M: ...

    @overload
    def __getitem__(self, index: slice) -> list[M]: ...

    def __getitem__(self, index: int | slice) -> M | list[M]:
        if isinstance(index, slice):
            return [self._message.FromString(d) for d in self._data[index]]
        return self._message.FromString(self._data[index])

    def __len__(self) -> int:
        return len(self._data)

    def position_after(self, name: str) -> int:
        """The index of the first object named after ``name`` (no decoding)."""
        return bisect_right(self._names, name)
