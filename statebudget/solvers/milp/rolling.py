"""The MILP over a whole trace: a rolling horizon of overlapping windows (`solve_rolling`), and
the summary the oracle reports (`oracle_summary`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bound import lower_bound
from ...models.report import Dist
from ...traces.graph import handoff_calls
from .build import build_instance
from .heuristics import Guide, evaluate, greedy_schedule
from .instance import STATUS_FEASIBLE, STATUS_NOT_SOLVED, STATUS_OPTIMAL, Call, Instance, Obj, Solution, affinity
from .model import solve


@dataclass
class RollingResult:
    solution: Solution                 # stitched over the whole instance
    windows: list[dict]                # per window: slots, status, objective, bound, gap, solve_s
    violations: list[str]              # the checker on the stitched solution


def solve_rolling(inst: Instance, window: int = 24, overlap: int = 8, backend: str = "scip",
                  time_limit_s: float = 10.0, threads: int = 1, progress=None, warm_start: bool = True,
                  guide: Guide | None = None) -> RollingResult:
    """Rolling horizon: solve overlapping windows of `window` slots in order, keep the first
    `window - overlap` slots of each, and start the next window from the tiers they left. Each
    window holds the objects alive in it; its first slot cannot be prefetched into (the previous
    window's plan already decided what is there). With `warm_start` each window starts from the
    greedy schedule of that window (`greedy_schedule`), led by the online planner's decisions when
    a `guide` is given (`sim/lead.py:planner_guide`); the window reports its objective
    beside the solver's. The stitched schedule is checked by `evaluate` on the whole instance."""
    if window <= overlap:
        raise ValueError(f"window ({window}) must exceed overlap ({overlap})")
    O, T = len(inst.objects), inst.T
    full = Solution(*(np.zeros((O, T)) for _ in range(5)), np.zeros(len(inst.calls)), wait=np.zeros(len(inst.calls)))
    tiers = [inst.init_tier(o) for o in range(O)]
    windows = []
    start = 0
    while start < T:
        end = min(T, start + window)
        keep_to = end if end == T else start + window - overlap
        objs = [o for o, ob in enumerate(inst.objects) if ob.live[1] >= start and ob.live[0] < end]
        remap = {o: k for k, o in enumerate(objs)}
        sub_objs = tuple(Obj(ob.name, ob.gpus, ob.node, ob.bytes, ob.restore_host_s, ob.restore_nvme_s,
                             (max(ob.live[0] - start, 0), min(ob.live[1], end - 1) - start))
                         for ob in (inst.objects[o] for o in objs))
        # calls arriving in the window, and calls still running into it from earlier windows
        # (those hold their state and cannot wait any more; one that waited holds nothing); an
        # affinity decided in an earlier window keeps its option
        call_ids, sub_calls = [], []
        for ci, c in enumerate(inst.calls):
            if not (c.slot < end and c.last >= start) or (c.slot < start and full.waits(ci)):
                continue
            a = affinity(ci, c)
            opts = c.options if a not in full.choice else (c.options[full.choice[a]],)
            mapped = [tuple(remap[o] for o in opt) for opt in opts]
            sub_calls.append(Call(c.name, c.slot - start, mapped[0], tuple(remap[o] for o in c.produces if o in remap),
                                  min(c.last, end - 1) - start, tuple(mapped[1:]), a,
                                  c.wait_s if c.slot >= start else None))
            call_ids.append(ci)
        sub_calls = tuple(sub_calls)
        sub = Instance(slot_s=inst.slot_s[start:end], objects=sub_objs, calls=sub_calls, hbm=inst.hbm, h2d=inst.h2d,
                       dram=inst.dram, root=inst.root, nvme=inst.nvme, lam=inst.lam,
                       init=tuple(tiers[o] for o in objs), lead_s=inst.window_s(start))
        greedy = greedy_schedule(sub, guide.window(objs, start, end) if guide is not None else None) \
            if warm_start else None
        usable = greedy if greedy is not None and greedy.status == STATUS_FEASIBLE else None
        sol = solve(sub, backend, time_limit_s, threads, hint=usable)
        windows.append({"slots": [start, end], "status": sol.status, "objective": sol.objective,
                        "bound": sol.bound, "gap": sol.gap, "solve_s": round(sol.solve_s, 3),
                        "greedy_objective": usable.objective if usable is not None else None})
        if sol.status not in (STATUS_OPTIMAL, STATUS_FEASIBLE):
            break
        n_keep = keep_to - start
        for k, o in enumerate(objs):
            for arr, part in ((full.x, sol.x), (full.y, sol.y), (full.u, sol.u), (full.d, sol.d), (full.v, sol.v)):
                arr[o, start:keep_to] = part[k, :n_keep]
            tiers[o] = 0 if sol.x[k, n_keep - 1] else 1 if sol.y[k, n_keep - 1] else 2
        for k, ci in enumerate(call_ids):
            c = inst.calls[ci]
            if start <= c.slot < keep_to:
                full.stall[ci] = sol.stall[k]
                a = affinity(ci, c)
                if a not in full.choice:
                    full.choice[a] = sol.choice.get(a, 0)
                full.wait[ci] = float(sol.waits(k))
        for o in range(O):
            if o not in remap:
                tiers[o] = 2  # not alive in this window: dead already, or not born yet
        if progress is not None:
            progress(keep_to, T)
        start = keep_to
    ok = all(w["status"] in (STATUS_OPTIMAL, STATUS_FEASIBLE) for w in windows)
    bad, obj = evaluate(inst, full) if ok else (["a window found no feasible solution"], float("nan"))
    # Each window is solved to its own optimum, but the stitched schedule is only feasible: no
    # global bound follows from overlapping windows (NaN), and the gap reported is the worst window's.
    full.status = STATUS_FEASIBLE if ok and not bad else STATUS_NOT_SOLVED
    if len(windows) == 1 and windows[0]["status"] == STATUS_OPTIMAL and not bad:
        full.status, full.bound = STATUS_OPTIMAL, windows[0]["bound"]
    else:
        full.bound = float("nan")
    full.objective = obj
    full.gap = max((w["gap"] for w in windows), default=0.0)
    full.solve_s = sum(w["solve_s"] for w in windows)
    full.backend = backend
    return RollingResult(full, windows, bad)


def oracle_summary(cluster, catalog, trace, cost, window: int = 24, overlap: int = 8, backend: str = "scip",
                   time_limit_s: float = 10.0, progress=None, warm_start: bool = True, replicas: int = 2,
                   guide_from=None) -> dict:
    """Solve a trace window by window and summarise it: the §8 `oracle` block, the instance's
    size, the stall distributions of the schedule, every window and the checker's findings."""
    inst, index = build_instance(cluster, catalog, trace, cost, replicas=replicas)
    guide = guide_from(inst, index) if guide_from is not None and warm_start else None
    res = solve_rolling(inst, window, overlap, backend, time_limit_s, progress=progress, warm_start=warm_start,
                        guide=guide)
    sol = res.solution
    handoffs = {(p.program, c) for p in trace.programs for c in handoff_calls(p)}
    stalls = list(sol.stall)
    handoff_stalls = [s for s, key in zip(stalls, index["calls"]) if key in handoffs]
    block = {"status": sol.status, "objective": sol.objective, "bound": sol.bound if sol.bound == sol.bound else None,
             "gap": sol.gap, "solve_s": round(sol.solve_s, 3)}
    lb = lower_bound(cluster, catalog, trace, cost)
    block.update(bound_total_stall_s=lb.total_stall_s, bound_status=lb.status)
    trace_calls = sum(1 for p in trace.programs for n in p.nodes if n.kind == "call")
    return {"oracle": block, "backend": backend, "replicas": replicas, "objects": len(inst.objects),
            "calls": len(inst.calls), "trace_calls": trace_calls, "waits": int(sol.wait.sum()) if sol.wait is not None else 0,
            "slots": inst.T, "stall_s": Dist.of(stalls).model_dump(), "handoffs": len(handoff_stalls),
            "handoff_stall_s": Dist.of(handoff_stalls).model_dump(), "windows": res.windows,
            "greedy_vs_oracle": _greedy_ratio(res.windows), "violations": res.violations[:20]}


def _greedy_ratio(windows: list[dict]) -> float | None:
    """The greedy warm start's objective over the solver's, summed over windows: how far the greedy
    rule is from the optimum inside the model (>= 1 when every window is solved to optimality)."""
    g = [w["greedy_objective"] for w in windows]
    if not windows or any(x is None for x in g):
        return None
    opt = sum(w["objective"] for w in windows)
    return round(sum(g) / opt, 6) if opt > 0 else None
