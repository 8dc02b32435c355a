"""The online planner's lead for the MILP's rolling horizon: a replay of `statebudget-lease` read at
each MILP slot (`planner_guide`), so the offline schedule starts warm from what the online planner
would hold."""

from __future__ import annotations

import numpy as np

from ..policies import REGISTRY
from ..policies.oracle import Oracle, state_keys
from ..solvers.milp import Guide, affinity
from .config import SimConfig
from .engine import Simulator


def planner_guide(cluster, catalog, trace, cost, inst, index, policy: str = "statebudget-lease", seed: int = 0):
    """Replay `policy` (the online planner) in the simulator and read, at the first call of each
    MILP slot, the tier it holds every MILP object in, and the group each program's first call of
    a model ran on: a `Guide` for the warm start of the rolling horizon (`greedy_schedule`)."""
    # each object's first key stands for it: the weights (its pages follow them) or the KV
    keys = [(state_keys(o.name, catalog, Oracle.hot_touch)[0], o.gpus, o.node) for o in inst.objects]
    slot_of = {key: inst.calls[ci].slot for ci, key in enumerate(index["calls"])}
    calls_of = {key: ci for ci, key in enumerate(index["calls"])}
    tiers = np.full((len(inst.objects), inst.T), -1, dtype=np.int8)
    choice: dict[int, int] = {}
    seen: set[int] = set()

    class Watched(REGISTRY[policy]):
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

    Simulator(cluster, catalog, trace, Watched(), cost=cost, config=SimConfig(seed=seed)).run()
    for t in range(inst.T):  # a slot whose first call never came (cancelled): the tiers before it
        if tiers[0, t] < 0:
            tiers[:, t] = tiers[:, t - 1] if t > 0 else 2
    return Guide(tiers, choice)


def planner_lead(cluster, catalog, trace, cost):
    """`oracle_summary`'s `guide_from` for a warm start led by the online planner, simulated with
    the trace's own seed."""
    seed = trace.header.seed if trace.header.seed is not None else 0
    return lambda inst, index: planner_guide(cluster, catalog, trace, cost, inst, index, seed=seed)
