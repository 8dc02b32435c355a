"""Policies made from the offline MILP (`solvers/milp.py`).

`oracle` replays the MILP schedule in the closed-loop simulator. The schedule's slots are the
call arrivals of the zero-stall timeline; in the closed loop the clock shifts, so the replay is
keyed on calls, not seconds: when the call of slot t arrives, the state the schedule holds in HBM
for slot t+1 is promoted (prefetched as planned), what it holds in neither slot is demoted (to
host DRAM where the schedule keeps it there), and eviction under pressure goes by the schedule's
next use (Belady with the MILP's foresight). A call runs on the GPU group the MILP chose for its
program and model; one the MILP let wait, or that finds no room there now (the closed loop's
clock and compute differ from the zero-stall timeline), goes to the default placement.

`static` is the best single placement for the whole trace from the same model with time
collapsed: a knapsack per GPU that keeps the models whose restores the trace would pay most often.
"""

from __future__ import annotations

import math

from ...models.state import expert_key, kv_key, weights_key
from ...solvers.costs import page_touch_probs
from ...solvers.milp import build_instance, chosen, object_model, solve_rolling, solve_static
from .base import Policy, default_place
from .baselines import Static


def _state_keys(name: str, catalog, hot_touch: float) -> list[tuple]:
    """The simulator's state keys behind a MILP object name."""
    kind, prog, model = object_model(name)
    if kind == "kv":
        return [kv_key(prog, model)]
    m = catalog.by_name[model]
    pages = [expert_key(m.name, p) for p, t in enumerate(page_touch_probs(m.moe)) if t >= hot_touch] if m.moe else []
    return [weights_key(m.name)] + pages


class Oracle(Policy):
    name = "oracle"
    demote_to = "host"
    hot_touch = 0.5

    def __init__(self, backend: str = "scip", window: int = 24, overlap: int = 8, time_limit_s: float = 10.0):
        self.backend, self.window, self.overlap, self.time_limit_s = backend, window, overlap, time_limit_s
        self.result = None
        self.ptr = -1

    def _prepare(self, sim):
        if self.result is not None:
            return
        inst, index = build_instance(sim.cluster, sim.catalog, sim.trace, sim.cost, hot_touch=self.hot_touch)
        self.inst, self.index = inst, index
        self.result = solve_rolling(inst, self.window, self.overlap, self.backend, self.time_limit_s)
        sol = self.result.solution
        self.x, self.y = sol.x, sol.y
        self.slot_of = {key: inst.calls[ci].slot for ci, key in enumerate(index["calls"])}
        self.group_for = {key: inst.objects[chosen(inst, sol, ci)[0]].gpus
                          for ci, key in enumerate(index["calls"]) if not sol.waits(ci)}
        self.keys = [_state_keys(o.name, sim.catalog, self.hot_touch) for o in inst.objects]
        self.group_of = [o.gpus for o in inst.objects]
        self.obj_of = {(k, g): i for i, (ks, g) in enumerate(zip(self.keys, self.group_of)) for k in ks}
        # next slot (>= t) where each object is in HBM, for eviction by next use
        T = inst.T
        self.next_use = []
        for o in range(len(inst.objects)):
            nxt, row = [math.inf] * (T + 1), self.x[o]
            for t in range(T - 1, -1, -1):
                nxt[t] = t if row[t] > 0.5 else nxt[t + 1]
            self.next_use.append(nxt)

    def on_program_start(self, sim, program):
        self._prepare(sim)

    def place(self, sim, call):
        """The group the MILP chose; calls it let wait, or that find no room there now, go to
        wherever the default placement finds room."""
        self._prepare(sim)
        g = self.group_for.get((call.program, call.node))
        if g is not None and sim.could_ever_fit(call, g) and sim.has_room_now(call, g):
            return g
        return default_place(sim, call)

    def on_call_arrive(self, sim, call):
        self._prepare(sim)
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
            if self.x[o, t] > 0.5:
                out += [("promote", k, g) for k in ks]
            elif self.x[o, t - 1] < 0.5:
                to = "host" if self.y[o, t] > 0.5 else "none"
                out += [("demote", k, g, to) for k in ks if (k, g) in sim.tiers.gpu]
            if self.y[o, t] > 0.5 and ks[0][0] != "kv":
                out += [("promote_host", k, sim.gpus[g[0]].node) for k in ks]
        return out

    def evict_priority(self, sim, copy):
        o = self.obj_of.get((copy.key, copy.group)) if self.result is not None else None
        if o is None:
            return (-math.inf, copy.last_use)  # nothing the schedule keeps: first to go
        nxt = self.next_use[o][min(self.ptr + 1, self.inst.T)] if self.ptr + 1 <= self.inst.T else math.inf
        return (-nxt, copy.last_use)  # needed later -> lower -> evicted first


class MilpStatic(Static):
    """`static`: the best single placement for the whole trace from the MILP with time collapsed
    (`solve_static`), loaded at time 0 and never changed. It replaced the call-share heuristic,
    which stays registered as `static-share` for comparison."""
    name = "static"

    def plan(self, sim) -> dict[str, tuple]:
        inst, _ = build_instance(sim.cluster, sim.catalog, sim.trace, sim.cost, hot_touch=0.5, replicas=1)
        keep = solve_static(inst, 1.0 - self.kv_headroom)
        return {object_model(inst.objects[o].name)[2]: inst.objects[o].gpus for o in keep}


def planner_guide(cluster, catalog, trace, cost, inst, index, policy: str = "statebudget-lease", seed: int = 0):
    """Replay `policy` (the online planner) in the simulator and read, at the first call of each
    MILP slot, the tier it holds every MILP object in, and the group each program's first call of
    a model ran on: a `Guide` for the warm start of the rolling horizon (`greedy_schedule`)."""
    import numpy as np

    from ...solvers.milp import Guide, affinity
    from ..engine import Simulator
    from . import REGISTRY

    # each object's first key stands for it: the weights (its pages follow them) or the KV
    keys = [(_state_keys(o.name, catalog, Oracle.hot_touch)[0], o.gpus, o.node) for o in inst.objects]
    slot_of = {key: inst.calls[ci].slot for ci, key in enumerate(index["calls"])}
    calls_of = {key: ci for ci, key in enumerate(index["calls"])}
    tiers = np.full((len(inst.objects), inst.T), -1, dtype=np.int8)
    choice: dict[int, int] = {}
    seen: set[int] = set()

    class Recorder(REGISTRY[policy]):
        def on_call_arrive(self, sim, call):
            t = slot_of.get((call.program, call.node))
            if t is not None and tiers[0, t] < 0:
                gpu, host = sim.tiers.gpu, sim.tiers.host
                tiers[:, t] = [0 if (k, g) in gpu else 1 if (k, n) in host else 2 for k, g, n in keys]
            return super().on_call_arrive(sim, call)

        def place(self, sim, call):
            group = super().place(sim, call)
            ci = calls_of.get((call.program, call.node))
            if ci is not None and affinity(ci, inst.calls[ci]) not in seen:  # the affinity's first call
                c = inst.calls[ci]
                seen.add(affinity(ci, c))
                groups = [inst.objects[opt[0]].gpus for opt in c.options]
                if group in groups:  # else the planner ran it off the MILP's candidates: no lead
                    choice[affinity(ci, c)] = groups.index(group)
            return group

    Simulator(cluster, catalog, trace, Recorder(), cost=cost, seed=seed).run()
    for t in range(inst.T):  # a slot whose first call never came (cancelled): the tiers before it
        if tiers[0, t] < 0:
            tiers[:, t] = tiers[:, t - 1] if t > 0 else 2
    return Guide(tiers, choice)


def planner_lead(cluster, catalog, trace, cost):
    """`oracle_summary`'s `guide_from` for a warm start led by the online planner, simulated with
    the trace's own seed."""
    seed = trace.header.seed if trace.header.seed is not None else 0
    return lambda inst, index: planner_guide(cluster, catalog, trace, cost, inst, index, seed=seed)
