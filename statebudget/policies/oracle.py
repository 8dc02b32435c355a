"""Policies made from the offline solvers (`solvers/bound.py`, `solvers/milp/`).

`oracle` replays an offline schedule in the closed-loop simulator. On a trace small enough for the
lower bound's relaxation (`solvers/bound.py`, up to `max_calls` calls) the schedule is that
relaxation's optimum: each call's group and the order in which calls hold each group. The replay
places each call on its group, keeps the next call of each group's order prefetched (its weights,
the expert pages it touches, its program's KV), sleeps what it evicts, and evicts by the
schedule's next use. It often reaches the bound where the relaxation is tight (BENCHMARKS.md).

On larger traces the schedule is the rolling MILP's (`solvers/milp/`). Its slots are the
call arrivals of the zero-stall timeline; in the closed loop the clock shifts, so the replay is
keyed on calls, not seconds: when the call of slot t arrives, the state the schedule holds in HBM
in any of the next `lead` slots is promoted (ahead of the plan, whose slots are the zero-stall
timeline's: in the closed loop one slot's notice leaves loads on the critical path; the lead is
measured, BENCHMARKS.md), what it holds neither in slot t nor in those is demoted (to host DRAM
where the schedule keeps it there), and eviction, under pressure or for a prefetch onto a group,
goes by the schedule's next use there (Belady with the MILP's foresight). A call runs on the GPU
group the MILP chose for its program and model; one the MILP let wait, or that finds no room there
now (the closed loop's clock and compute differ from the zero-stall timeline), goes to the default
placement.

`static` is the best single placement for the whole trace from the same model with time
collapsed: a knapsack per GPU that keeps the models whose restores the trace would pay most often.
"""

from __future__ import annotations

import math

from ..models.state import expert_key, kv_key, weights_key
from ..core.costs import page_touch_probs
from ..solvers.bound import lower_bound
from ..solvers.milp import build_instance, chosen, object_model, solve_rolling, solve_static
from .base import Policy, default_place
from .follow import FollowSchedule
from .baselines import Static
from ..core.decisions import Demote, Promote, PromoteHost


def state_keys(name: str, catalog, hot_touch: float) -> list[tuple]:
    """The simulator's state keys behind a MILP object name."""
    kind, prog, model = object_model(name)
    if kind == "kv":
        return [kv_key(prog, model)]
    m = catalog.by_name[model]
    pages = [expert_key(m.name, p) for p, t in enumerate(page_touch_probs(m.moe)) if t >= hot_touch] if m.moe else []
    return [weights_key(m.name)] + pages


# How `Oracle.place` placed a call, as the report's `oracle.behind` counts and words it: on the
# schedule's group with room when it came, or without (the default placement kept it there); or
# elsewhere, because its group had no room, the schedule gives it none (the MILP let it wait), or
# its group could never hold it.
PLACED = {"schedule": "with room", "no_room_there": "without room when they came",
          "no_room": "their group had no room", "no_group": "the schedule gives them no group",
          "never_fits": "their group could never hold them"}
ON_GROUP = ("schedule", "no_room_there")  # the labels of calls that ran on the schedule's group


class Oracle(Policy):
    name = "oracle"
    demote_to = "host"
    sees_future = True
    hot_touch = 0.5
    tick_s = 1e9

    def __init__(self, backend: str = "scip", window: int = 24, overlap: int = 8, time_limit_s: float = 10.0,
                 max_calls: int = 60, lead: int = 128):
        self.lead = lead  # slots ahead whose state an arrival prefetches (tuning seeds 1-3, BENCHMARKS.md)
        self.backend, self.window, self.overlap, self.time_limit_s = backend, window, overlap, time_limit_s
        self.max_calls = max_calls
        self.result = None  # the MILP's, on a large trace
        self.bound = None   # the relaxation's, on a small one
        self.ptr = -1
        self.placed: dict[tuple, str] = {}  # (program, node) -> how its call was placed (`PLACED`)

    def _prepare(self, sim):
        if self.result is not None or self.bound is not None:
            return
        if sim.trace.n_calls <= self.max_calls:
            self.bound = lower_bound(sim.cluster, sim.catalog, sim.trace, sim.cost, start=getattr(sim, "start", "warm"),
                                     max_calls=self.max_calls)
            self.follow = FollowSchedule(self.bound.schedule, sim)
            return
        inst, index = build_instance(sim.cluster, sim.catalog, sim.trace, sim.cost, hot_touch=self.hot_touch)
        self.inst, self.index = inst, index
        self.result = solve_rolling(inst, self.window, self.overlap, self.backend, self.time_limit_s)
        sol = self.result.solution
        self.x, self.y = sol.x, sol.y
        self.slot_of = {key: inst.calls[ci].slot for ci, key in enumerate(index["calls"])}
        self.group_for = {key: inst.objects[chosen(inst, sol, ci)[0]].gpus
                          for ci, key in enumerate(index["calls"]) if not sol.waits(ci)}
        self.keys = [state_keys(o.name, sim.catalog, self.hot_touch) for o in inst.objects]
        self.group_of = [o.gpus for o in inst.objects]
        self.obj_of = {(k, g): i for i, (ks, g) in enumerate(zip(self.keys, self.group_of)) for k in ks}
        self.next_use = next_uses(self.x)

    def on_program_start(self, sim, program):
        self._prepare(sim)
        return self.follow.next_states(sim) if self.bound is not None else None

    def on_tick(self, sim):
        """One tick at t = 0: the schedule's first loads start before any program does."""
        self._prepare(sim)
        return self.follow.next_states(sim) if self.bound is not None else None

    def on_call_end(self, sim, call):
        return self.follow.next_states(sim) if self.bound is not None else None

    def on_tool_start(self, sim, program, node, tool):
        return self.follow.next_states(sim) if self.bound is not None else None

    def on_call_cancelled(self, sim, call):
        return self.follow.next_states(sim) if self.bound is not None else None

    def demote_tier(self, sim, copy) -> str:
        return "host"

    def may_evict_for_prefetch(self, sim, victim, key, group) -> bool:
        """A prefetch evicts only what the schedule needs later than what it brings (Belady over
        the schedule): with `lead` slots prefetched, a later slot's state must not push out a
        sooner one's."""
        if self.bound is not None:
            return self.follow.may_evict(sim, victim, key, group)
        o, brought = self.obj_of.get((victim.key, victim.group)), self.obj_of.get((key, group))
        if o is None or brought is None:  # the victim, or what the prefetch brings, is not the schedule's there
            return True
        return self.next_use[o][self._slot()] > self.next_use[brought][self._slot()]

    def _slot(self) -> int:
        """The next slot of the schedule, from the latest call arrived (`next_use`'s index)."""
        return min(self.ptr + 1, self.inst.T)

    def place(self, sim, call):
        """The group the schedule chose; calls the MILP let wait, that find no room there now, or
        that could never fit there go to wherever the default placement puts them. The replay of
        the relaxation does not fall back for room: it waits for its group."""
        self._prepare(sim)
        g = self.follow.group(call) if self.bound is not None else self.group_for.get((call.program, call.node))
        if g is None:
            why = "no_group"
        elif not sim.fits_at_all(call, g):
            why = "never_fits"
        elif self.bound is None and not sim.has_room_now(call, g):
            why = "no_room"
        else:
            why = "schedule"
        to = g if why == "schedule" else default_place(sim, call)
        if why == "no_room" and to == g:
            why = "no_room_there"
        self.placed[(call.program, call.node)] = why
        return to

    def on_call_arrive(self, sim, call):
        self._prepare(sim)
        if self.bound is not None:
            return self.follow.next_states(sim)
        t = self.slot_of.get((call.program, call.node))
        if t is None:
            return None
        self.ptr = max(self.ptr, t)
        return self._plan_for(sim, self.ptr + 1)

    def _plan_for(self, sim, t: int) -> list:
        if t >= self.inst.T:
            return []
        out = []
        for o, ks in enumerate(self.keys):
            g = self.group_of[o]
            if self.next_use[o][t] < t + self.lead:  # held in a slot of t .. t + lead - 1
                out += [Promote(k, g) for k in ks]
            elif self.x[o, t - 1] < 0.5:
                to = "host" if self.y[o, t] > 0.5 else "none"
                out += [Demote(k, g, to) for k in ks if (k, g) in sim.tiers.gpu]
            if self.y[o, t] > 0.5 and ks[0][0] != "kv":
                out += [PromoteHost(k, sim.gpus[g[0]].node) for k in ks]
        return out

    def evict_priority(self, sim, copy):
        if self.bound is not None:
            return self.follow.evict_priority(sim, copy)
        o = self.obj_of.get((copy.key, copy.group)) if self.result is not None else None
        if o is None:
            return (-math.inf, copy.last_use)  # nothing the schedule keeps: first to go
        nxt = self.next_use[o][self._slot()]
        return (-nxt, copy.last_use)  # needed later -> lower -> evicted first


def next_uses(x) -> list[list[float]]:
    """Per object, per slot t (0..T): the first slot >= t where the schedule `x` [objects x T]
    holds it in HBM (inf: never again)."""
    T = x.shape[1]
    out = []
    for row in x:
        nxt = [math.inf] * (T + 1)
        for t in range(T - 1, -1, -1):
            nxt[t] = t if row[t] > 0.5 else nxt[t + 1]
        out.append(nxt)
    return out


class MilpStatic(Static):
    """`static`: the best single placement for the whole trace from the MILP with time collapsed
    (`solve_static`), loaded at time 0 and never changed: the static baseline. `baselines.Static` places by
    call share instead and is kept for comparison in tests.

    Follows static multi-model placement (AlpaServe, OSDI '23: place models once by expected
    load). Departs: the placement reads the trace's restore counts (offline knowledge an operator
    only estimates), there is no model-parallel search, and models left out run on demand in the
    HBM it leaves free."""
    name = "static"

    def plan(self, sim) -> dict[str, tuple]:
        inst, _ = build_instance(sim.cluster, sim.catalog, sim.trace, sim.cost, hot_touch=0.5, replicas=1)
        keep = solve_static(inst, 1.0 - self.kv_headroom)
        return {object_model(inst.objects[o].name)[2]: inst.objects[o].gpus for o in keep}
