"""Making many instances of a frozen dataclass with slots quickly: ``positional_maker``.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (its own
``__setattr__`` refuses), a call per field; setting the slots through their descriptors is a
call per field too. A shard restarting over a million bound pods makes two such records per pod
(``placement.nodeinfo.PodRequest``, ``placement.preemption.VictimCandidate``), and those calls
were a tenth of its restart. An unfrozen class with the very same slots sets them with plain
attribute stores, the fastest there is; the instance is then given the frozen class as its
class, which CPython allows between classes of one layout. What comes out is an ordinary,
frozen instance of the dataclass: equal to one made by its constructor, and refusing changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

T = TypeVar("T")


def positional_maker(cls: type[T]) -> Callable[..., T]:
    """A function making ``cls`` from every field's value, positionally, in ``__slots__``
    order; ``cls`` must be a frozen dataclass with slots and nothing else to set up (no
    ``__post_init__``, no other base with fields of its own)."""
    params = getattr(cls, "__dataclass_params__", None)
    slots: tuple[str, ...] = getattr(cls, "__slots__", ())
    if params is None or not params.frozen or not slots:
        raise TypeError(f"{cls.__name__}: not a frozen dataclass with slots")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: its __post_init__ would not run")
    if tuple(getattr(cls, "__dataclass_fields__", {})) != slots:
        raise TypeError(f"{cls.__name__}: its slots are not its fields")
    stores = "\n".join(f"    self.{name} = {name}" for name in slots)
    source = f"def __init__(self, {', '.join(slots)}):\n{stores}\n    self.__class__ = _frozen\n"
    namespace: dict[str, Any] = {"_frozen": cls}
    exec(source, namespace)  # (text made here, over the class's own slot names)
    twin = type(
        f"_{cls.__name__}Maker", (), {"__slots__": slots, "__init__": namespace["__init__"]}
    )
    made = twin(*range(len(slots)))
    if type(made) is not cls:  # pragma: no cover (CPython allows it for one layout)
        raise TypeError(f"{cls.__name__}: its layout is not a plain class's with its slots")
    return cast("Callable[..., T]", twin)
