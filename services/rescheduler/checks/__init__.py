"""Check plugins, one module each; any policy may name any of them."""

from placement.framework import Registry
from services.rescheduler.checks import disruptionbudget, pendingchecker, protection, throttle


def new_check_registry() -> Registry:
    return Registry(
        [
            protection.SPEC,
            disruptionbudget.SPEC,
            throttle.THROTTLE_SPEC,
            throttle.GROUP_THROTTLE_SPEC,
            pendingchecker.SPEC,
        ]
    )


__all__ = ["new_check_registry"]
