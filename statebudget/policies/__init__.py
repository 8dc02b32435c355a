"""Policy registry, keyed by the names of DESIGN.md §6."""

from __future__ import annotations

from .base import Policy
from .baselines import BASELINES
from .swaps import SWAPS
from .oracle import MilpStatic, Oracle
from .ours import StateBudget, StateBudgetLease, StateBudgetTrack
from .foresight import Foresight

# Order: the baselines in the order the report lists them, then ours, then the two that see the
# future (the oracle, and `foresight`: our planner told the future). The
# call-share placement (`baselines.Static`, named `static-share`) serves tests only: not registered.
BASELINES.update(SWAPS)
REGISTRY: dict[str, type[Policy]] = {}
for _p in ("ondemand", "lru-keepwarm", "frequency", "prefetch-all"):
    REGISTRY[_p] = BASELINES[_p]
REGISTRY["static"] = MilpStatic
for _p in ("llama-swap", "sleep-swap", "forecast-prewarm", "ray-multiplex"):
    REGISTRY[_p] = BASELINES[_p]
REGISTRY.update({p.name: p for p in (StateBudget, StateBudgetLease, StateBudgetTrack, Oracle, Foresight)})
SEES_FUTURE = tuple(n for n, p in REGISTRY.items() if p.sees_future)
OURS = tuple(n for n, p in REGISTRY.items() if issubclass(p, StateBudget) and not p.sees_future)
BASELINE_NAMES = tuple(n for n in REGISTRY if n not in OURS and n not in SEES_FUTURE)


def make_policy(name: str) -> Policy:
    try:
        return REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(REGISTRY)})") from None
