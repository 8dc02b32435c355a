"""The forecast MILP behind online tracking: which models' engines, weights and hot expert pages
should be in HBM, on which GPU group, for the next horizon.

    maximise  sum over options (m, g) of  x[m,g] * value[m,g]
    s.t.      sum over g of x[m,g] <= 1                                  (one target home per model)
              sum over options whose group holds GPU i of x * per_gpu <= cap[i]     (every GPU)
              sum over options of x * per_gpu * |g| <= total                      (the cluster)
              x binary

`value[m,g]` is what the planner expects to save over the horizon by having model m ready on g
(`planner/target.py` builds it from the forecast: restore seconds a call would otherwise wait,
TTFT lost on a slow group, bytes a move would cost). It is small (models x groups binaries), so
SCIP proves it optimal in milliseconds; the greedy's answer is the fallback when it cannot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class TargetProblem:
    model: list[int]                # per option: the model's index
    groups: list[tuple[int, ...]]   # per option: its GPU group
    per_gpu: np.ndarray             # per option: bytes on each GPU of the group
    value: np.ndarray               # per option: seconds saved over the horizon if chosen
    cap: np.ndarray                 # per GPU: bytes the target may use
    total: float = float("inf")     # bytes the target may use over the whole cluster


@dataclass
class TargetSolution:
    chosen: list[int]               # option indices
    status: str                     # "optimal", "feasible" or "greedy"
    objective: float
    bound: float                    # the solver's proven upper bound on the objective
    solve_s: float
    stats: dict = field(default_factory=dict)


def greedy_target(p: TargetProblem) -> list[int]:
    """Options by value per byte, each taken while its model has none and its GPUs have room."""
    nbytes = p.per_gpu * np.array([len(g) for g in p.groups], float)
    order = sorted(range(len(p.model)), key=lambda i: (-p.value[i] / max(nbytes[i], 1.0), i))
    left = p.cap.astype(float).copy()
    total = p.total
    taken, out = set(), []
    for i in order:
        g = list(p.groups[i])
        if p.value[i] <= 0 or p.model[i] in taken or (left[g] < p.per_gpu[i]).any() or nbytes[i] > total:
            continue
        left[g] -= p.per_gpu[i]
        total -= nbytes[i]
        taken.add(p.model[i])
        out.append(i)
    return sorted(out)


def solve_target(p: TargetProblem, time_limit_s: float = 1.0) -> TargetSolution:
    """The MILP with SCIP (one thread: same input, same answer), started from the greedy answer."""
    from ortools.linear_solver import pywraplp

    t0 = time.perf_counter()
    seed = greedy_target(p)
    seed_obj = float(sum(p.value[i] for i in seed))
    useful = [i for i in range(len(p.model)) if p.value[i] > 0]
    if not useful:  # nothing is worth its bytes: the empty target is optimal
        return TargetSolution([], "optimal", 0.0, 0.0, time.perf_counter() - t0)
    s = pywraplp.Solver.CreateSolver("SCIP")
    if s is None:
        return TargetSolution(seed, "greedy", seed_obj, float("nan"), time.perf_counter() - t0)
    x = {i: s.BoolVar(f"x{i}") for i in useful}
    for m in sorted({p.model[i] for i in useful}):
        s.Add(sum(x[i] for i in useful if p.model[i] == m) <= 1)
    for gpu in range(len(p.cap)):
        on = [i for i in useful if gpu in p.groups[i]]
        if on:
            s.Add(sum(float(p.per_gpu[i]) * x[i] for i in on) <= float(p.cap[gpu]))
    if np.isfinite(p.total):
        s.Add(sum(float(p.per_gpu[i]) * len(p.groups[i]) * x[i] for i in useful) <= float(p.total))
    s.Maximize(sum(float(p.value[i]) * x[i] for i in useful))
    s.SetHint([x[i] for i in useful], [1.0 if i in seed else 0.0 for i in useful])
    s.SetNumThreads(1)
    s.SetTimeLimit(int(time_limit_s * 1000))
    code = s.Solve()
    solve_s = time.perf_counter() - t0
    if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return TargetSolution(seed, "greedy", seed_obj, float("nan"), solve_s)
    chosen = sorted(i for i in useful if x[i].solution_value() > 0.5)
    obj = float(sum(p.value[i] for i in chosen))
    if obj < seed_obj:  # a time-limited incumbent worse than its hint: keep the hint
        return TargetSolution(seed, "greedy", seed_obj, s.Objective().BestBound(), solve_s)
    status = "optimal" if code == pywraplp.Solver.OPTIMAL else "feasible"
    return TargetSolution(chosen, status, obj, s.Objective().BestBound(), solve_s,
                          {"options": len(useful), "greedy_objective": seed_obj})
