"""Validation shared by the plugins' Args: resource weights, percentages, pools.

The registry's type check covers int/float/bool/str fields only, so the ``dict[str, int]``
weights are checked here in full (type, names, signs)."""

from __future__ import annotations

from placement.nodeinfo import POOLS
from services.rescheduler.framework import RESOURCE_INDEX


def default_weights() -> dict[str, int]:
    """The original's default: CPU and memory, equally weighted."""
    return {"cpu": 1, "memory": 1}


def validate_weights(field: str, weights: object) -> None:
    """``weights`` maps resource names (cpu, memory, gpu) to ints >= 0, not all 0 (the original
    refuses a zero sum: it would divide by it)."""
    if not isinstance(weights, dict) or not weights:
        raise ValueError(f"{field} must be a non-empty mapping of resource to weight")
    for name, weight in weights.items():
        if name not in RESOURCE_INDEX:
            known = ", ".join(RESOURCE_INDEX)
            raise ValueError(f"{field}: unknown resource {name!r} (known: {known})")
        if not isinstance(weight, int) or isinstance(weight, bool) or weight < 0:
            raise ValueError(f"{field}: weight of {name} must be an int >= 0, got {weight!r}")
    if sum(weights.values()) == 0:
        raise ValueError(f"{field}: at least one weight must be > 0")


def validate_percentage(field: str, value: int) -> None:
    if not 0 <= value <= 100:
        raise ValueError(f"{field} must be within 0..100, got {value}")


def validate_pool(field: str, value: str) -> None:
    if value not in POOLS:
        raise ValueError(f"{field} must be one of {', '.join(POOLS)}, got {value!r}")
