"""The hard rules: the Filter plugins of the default profile as one framework without scores.

A shard may run a custom profile, but a hard rule binds every placement whatever proposed it: the
Binder re-checks each decision with these filters, and the rescheduler and ``godel audit`` judge
"may this pod run there" by them too. A filter added to the default profile constrains them all.
"""

from __future__ import annotations

from collections.abc import Sequence

from placement.framework import Framework, Profile
from placement.framework.profile import DEFAULT_FILTERS
from placement.plugins import new_in_tree_registry


def hard_rules(filters: Sequence[str] = DEFAULT_FILTERS) -> Framework:
    """A framework running ``filters`` (default: every default filter) and no score plugin."""
    return Framework(Profile(filters=tuple(filters), scores=()), new_in_tree_registry())
