"""Policy registry, keyed by the names of DESIGN.md §6."""

from __future__ import annotations

from .base import Policy
from .baselines import BASELINES
from .ours import StateBudget, StateBudgetLease

REGISTRY: dict[str, type[Policy]] = dict(BASELINES)
REGISTRY.update({p.name: p for p in (StateBudget, StateBudgetLease)})


def make_policy(name: str) -> Policy:
    try:
        return REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(REGISTRY)})") from None
