"""The planner's settings (`PlannerConfig`) and the lease planner's (`lease_config`): every knob of
the planning step in one place, with the reason for its default. docs/planner.md, "Knobs"."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, fields, replace


@dataclass
class PlannerConfig:
    horizon_s: float = 30.0          # value = P(needed within this) x restore seconds (less the waste price)
    idle_horizon_s: float = 90.0     # idle residents are ranked by P(needed within this)
    idle_threshold: float = 0.08     # models less likely than this within it are not staged in host
    warm_budget: float = 0.6         # share of cluster HBM that idle weights and pages may hold
    min_dwell_s: float = 0.0        # a promoted copy stays at least this long (no promote/demote ping-pong)
    promote_min_p: float = 0.35      # promote only what is at least this likely within the horizon
    # A promotion's value less (1 - P(needed)) x its GB x this: what a wasted byte costs, in stall
    # seconds. 0.04: a byte's time over a 25 GB/s link (tuning seeds 1-10, docs/planner.md "Knobs").
    waste_price_s_per_gb: float = 0.04
    hysteresis: float = 0.3          # residents' density bonus against thrashing
    gpu_headroom: float = 0.05       # fraction of each GPU left for on-demand loads
    link_headroom: float = 0.3       # fraction of each link left for on-demand traffic
    window_s: float = 10.0           # promotions are budgeted over this window
    page_min_touch: float = 0.2      # expert pages prepared with a model: touched at least this often
    lease_page_min_touch: float = 0.4  # a lease prepares the pages a call touches at least this often
    lease_deadline_q: float = 0.25   # a hint's deadline: this quantile of the remaining tool wait
    lease_slo_margin: float = 0.2    # link share leases may not take (left for non-lease calls)
    lookahead: int = 3               # calls ahead the predictor follows the switch matrix
    stage_host: bool = True          # stage weights and expert pages of models in use in host DRAM
    place_prefill_weight: float = 0.0  # place a call where restore + this x its prefill is least (1: soonest first token)
    # A call takes room on another group rather than wait for its best one unless the wait is the shorter;
    # with this (and `overload_wait_s`) the wait counts the calls queued ahead there below capacity
    # (`overload.py`). Opt-in: it cuts swe-team's handoff P95 at 3x, raises it at 1x (planner.md).
    place_queue_wait: bool = False
    # Past capacity a call goes where restore + the queue ahead is least (`place_under_load`), onto
    # another model's GPUs if need be, while the longest wait on its group is under this; past it
    # the call is placed as below capacity and its model keeps to its groups. None: always spread;
    # at or below `overload_wait_s`: never. At 3x real-sessions a bound trades the tails for SLO@5;
    # never spreading collapses swe-team at 3x (docs/planner.md, "Past capacity").
    spread_until_s: float | None = None
    # A call waiting for HBM moves to another ready copy of its model with room now when its first token
    # comes there in under this share of the time it would where it waits (`StateBudget.on_waiting`);
    # None: off. Tuning seeds, lease: real-sessions' total stall -18 %, swe-team's -11 % (planner.md).
    move_waiting_share: float | None = 0.5
    overload_wait_s: float | None = 90.0  # a group whose queued calls would keep a new one waiting this long is past capacity (`overload.py`); None: off
    # A call of a dense model that has waited this long for HBM at its group, with no group clear of
    # the queue holding the model, adds a replica there (`homes.scale_out`); None: off (planner.md).
    scale_out_wait_s: float | None = 20.0
    # ... and so do this many calls of one model waiting at one group, however briefly; None: off.
    # Opt-in: neither its gain nor its cost is outside the interval on seeds 100-109 (planner.md).
    scale_out_calls: int | None = None
    # Either way only onto a group that holds the model's typical call beside its weights; False:
    # anywhere its weights and engine fit (experiments.md, "Where the wasted bytes go").
    scale_out_fits_typical: bool = True
    # A call whose model has a ready copy waits for it rather than evict another model's weights: True
    # always; a number k > 0 (1 is k = 1.0) only if their model's next home prefills over k x slower.
    place_keeps_weights: bool | float = False  # opt-in (planner.md, "Placement")
    # A home for a model with no copy avoids GPUs holding weights of models at least this x as likely,
    # and counts the idle state of less likely ones as room (`homes.home_of`); None: the most free HBM.
    # Off: 0.2 won on tuning seeds, lost on evaluation seeds (docs/experiments.md).
    home_reclaim: float | None = None
    # Once this long has passed since the first call (None: never), a model with no copy is homed counting
    # never-called models' idle copies as room, and with `home_keeps_pages` the hot pages the other MoE
    # models lack as taken (`homes.home_of`, `pages_owed`; not with `home_reclaim`). planner.md.
    uncalled_room_after_s: float | None = 0.0
    home_keeps_pages: bool = True
    # The operator's layout: ((model, (GPU index, ...)), ...), a group a model with no copy is homed
    # on, whatever the view says; models left out are homed as before. None (no layout) by default:
    # a layout suits one workload and trades against TTFT (docs/tracking.md, "A layout fixed in advance").
    homes: tuple | None = None
    layout_holds: bool = False  # a model in `homes` is homed there even with a copy elsewhere (tracking.md)

    def __post_init__(self):
        if not isinstance(k := self.place_keeps_weights, bool) and not (isinstance(k, (int, float)) and 0 < k < math.inf):
            raise ValueError(f"place_keeps_weights: True, False or a number k > 0, got {k!r}")


def lease_config(**overrides) -> PlannerConfig:
    """The planner's settings when leases drive it (statebudget-lease, the service): a lease
    prepares only the expert pages nearly every call touches (`lease_page_min_touch` 0.99); the
    planner still promotes on its own predictions as without hints (`promote_min_p` 0.35), since
    honest hints miss. Tuned on seeds 1-10, warm start (docs/planner.md, "Knobs")."""
    return replace(PlannerConfig(lease_page_min_touch=0.99), **overrides)


def check_fields(overrides: dict) -> None:
    """A ValueError naming the first of `overrides` that `PlannerConfig` has no field for (with the
    nearest name, else the list), or the value it refuses: a switch takes True or False only (a
    string such as 'false' would be true)."""
    types = {f.name: f.type for f in fields(PlannerConfig)}
    for name, value in overrides.items():
        if name not in types:
            near = difflib.get_close_matches(name, list(types), n=1)
            raise ValueError(f"no field {name!r}" + (f" (did you mean {near[0]!r}?)" if near else
                                                    f"; the fields: {', '.join(types)}"))
        if types[name] == "bool" and not isinstance(value, bool):  # annotations are strings here
            raise ValueError(f"{name}: True or False, got {value!r}")
    PlannerConfig(**overrides)
