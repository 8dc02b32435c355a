"""Schedules without the MILP solver: `evaluate` (the model's checker), the greedy schedule (the
warm start and in-model yardstick, optionally led by the online planner's decisions as a `Guide`)
and the static placement (the model with time collapsed into one knapsack)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .instance import STATUS_FEASIBLE, STATUS_NOT_SOLVED, Instance, Solution, affinity, chosen


def evaluate(inst: Instance, sol: Solution, tol: float = 1e-6) -> tuple[list[str], float]:
    """Check every constraint of the model in `model.py`'s docstring; returns (violations, the
    objective recomputed from the variables)."""
    bad: list[str] = []
    O, T = len(inst.objects), inst.T
    x, y, u, d, v, s = sol.x, sol.y, sol.u, sol.d, sol.v, sol.stall
    for arr, name in ((x, "x"), (y, "y"), (u, "u"), (d, "d"), (v, "v")):
        if arr.shape != (O, T):
            return [f"{name} has shape {arr.shape}, expected {(O, T)}"], float("nan")
        if np.any((np.abs(arr) > tol) & (np.abs(arr - 1) > tol)):
            bad.append(f"{name} is not binary")
    options: dict[int, int] = {}
    for ci, c in enumerate(inst.calls):
        a = affinity(ci, c)
        if options.setdefault(a, len(c.options)) != len(c.options):
            bad.append(f"(0) call {c.name}: its affinity's calls have different numbers of options")
        if not 0 <= sol.choice.get(a, 0) < len(c.options):
            bad.append(f"(0) call {c.name}: option {sol.choice.get(a, 0)} does not exist")
            return bad, float("nan")
    need = {(o, c.slot) for ci, c in enumerate(inst.calls) for o in chosen(inst, sol, ci)}
    for o, ob in enumerate(inst.objects):
        for t in range(T):
            xp = x[o, t - 1] if t > 0 else float(inst.init_tier(o) == 0)
            yp = y[o, t - 1] if t > 0 else float(inst.init_tier(o) == 1)
            if x[o, t] + y[o, t] > 1 + tol:
                bad.append(f"(1) {ob.name} t={t}: in HBM and DRAM")
            if x[o, t] > xp + u[o, t] + d[o, t] + tol:
                bad.append(f"(2) {ob.name} t={t}: in HBM without a promotion")
            if y[o, t] > yp + xp + v[o, t] + tol:
                bad.append(f"(3) {ob.name} t={t}: in DRAM without staging or demotion")
            if u[o, t] > yp + tol:
                bad.append(f"(3b) {ob.name} t={t}: prefetched from NVMe")
            if d[o, t] > tol and (o, t) not in need:
                bad.append(f"(4) {ob.name} t={t}: on-demand load with no call needing it")
            if t == 0 and inst.lead_s <= 0 and (u[o, t] > tol or v[o, t] > tol):
                bad.append(f"(4) {ob.name}: prefetch before time 0")
            if not (ob.live[0] <= t <= ob.live[1]) and (x[o, t] > tol or y[o, t] > tol):
                bad.append(f"(4) {ob.name} t={t}: resident outside its life")
    stall_total = 0.0
    for ci, c in enumerate(inst.calls):
        t = c.slot
        objs = chosen(inst, sol, ci)
        if sol.waits(ci):
            if c.wait_s is None or not 0 <= t < T:
                bad.append(f"(6b) call {c.name}: waits, which it may not")
            elif s[ci] < c.wait_s - tol:
                bad.append(f"(6b) call {c.name}: waits but stalls {s[ci]:.3f} < {c.wait_s:.3f}")
            objs = ()
        for o in objs:
            for tt in range(max(t, 0), min(c.last, T - 1) + 1):
                if x[o, tt] < 1 - tol:
                    bad.append(f"(5) call {c.name}: {inst.objects[o].name} not in HBM at t={tt}")
            if o in c.produces or not 0 <= t < T:
                continue
            ob = inst.objects[o]
            yp = y[o, t - 1] if t > 0 else float(inst.init_tier(o) == 1)
            need_s = ob.restore_nvme_s * d[o, t] - (ob.restore_nvme_s - ob.restore_host_s) * yp
            if s[ci] < need_s - tol:
                bad.append(f"(6) call {c.name}: stall {s[ci]:.3f} < {need_s:.3f} for {ob.name}")
        if s[ci] < -tol:
            bad.append(f"call {c.name}: negative stall")
        stall_total += s[ci]
    n_gpu = len(inst.hbm)
    for t in range(T):
        hbm = np.zeros(n_gpu)
        pre = np.zeros(n_gpu)
        dram: dict[str, float] = {}
        root: dict[str, float] = {}
        nv: dict[str, float] = {}
        for o, ob in enumerate(inst.objects):
            share = ob.bytes / len(ob.gpus)
            for i in ob.gpus:
                hbm[i] += share * x[o, t]
                pre[i] += share * u[o, t]
            dram[ob.node] = dram.get(ob.node, 0.0) + ob.bytes * y[o, t]
            root[ob.node] = root.get(ob.node, 0.0) + ob.bytes * u[o, t]
            nv[ob.node] = nv.get(ob.node, 0.0) + ob.bytes * v[o, t]
        window = inst.window_s(t)
        for i in range(n_gpu):
            if hbm[i] > inst.hbm[i] * (1 + tol) + 1:
                bad.append(f"(7) GPU {i} t={t}: {hbm[i]:.0f} B > {inst.hbm[i]:.0f} B")
            if pre[i] > inst.h2d[i] * window * (1 + tol) + 1:
                bad.append(f"(9) GPU {i} t={t}: prefetch {pre[i]:.0f} B > link {inst.h2d[i] * window:.0f} B")
        for n, b in dram.items():
            if b > inst.dram.get(n, 0.0) * (1 + tol) + 1:
                bad.append(f"(8) node {n} t={t}: DRAM {b:.0f} B > {inst.dram.get(n, 0.0):.0f} B")
        for n, b in root.items():
            if b > inst.root.get(n, 0.0) * window * (1 + tol) + 1:
                bad.append(f"(10) node {n} t={t}: root {b:.0f} B over the slot")
        for n, b in nv.items():
            if b > inst.nvme.get(n, 0.0) * window * (1 + tol) + 1:
                bad.append(f"(11) node {n} t={t}: NVMe {b:.0f} B over the slot")
    moved = sum(inst.objects[o].bytes * (u[o].sum() + d[o].sum() + v[o].sum()) for o in range(O))
    return bad, float(stall_total + inst.lam * moved)


@dataclass
class Guide:
    """What the online planner did, slot by slot, in the MILP's terms (`planner_guide`): the tier
    it held each object in at each slot's first call (0 HBM, 1 DRAM, 2 neither) and the option
    each affinity's first call ran on."""
    tiers: np.ndarray                     # [O x T]
    choice: dict = field(default_factory=dict)

    def window(self, objs: list[int], start: int, end: int) -> "Guide":
        return Guide(self.tiers[objs, start:end], self.choice)


def greedy_schedule(inst: Instance, guide: Guide | None = None) -> Solution:
    """A feasible schedule by the greedy rule, for warm starts and as the in-model yardstick.

    The rule: a call's affinity takes, at its first call, the option that fits beside the calls
    running now and misses the fewest bytes; a call whose option does not fit waits; load
    what a call needs on demand, keep it in HBM while it runs, and when a GPU is full demote the
    resident whose next use is farthest away (the oracle may look ahead), into DRAM when it
    fits, else drop it. Without a guide it never prefetches, so it satisfies (2), (3), (3b) and
    (9)-(11) by construction; status is FEASIBLE when the rest holds too.

    With a `guide` (the online planner's decisions) it follows the planner where the model
    allows: an affinity takes the planner's option when it fits; what the planner held in HBM is
    prefetched from DRAM within the link budgets (9), (10) and the GPU's room; what it held in
    DRAM is staged within (11) and (8); and eviction takes what the planner did not hold in HBM
    first."""
    O, T = len(inst.objects), inst.T
    x, y, u, d, v = (np.zeros((O, T)) for _ in range(5))
    stall = np.zeros(len(inst.calls))
    wait = np.zeros(len(inst.calls))
    choice: dict[int, int] = {}
    uses: dict[int, list[int]] = {}
    for c in inst.calls:
        for o in {o for opt in c.options for o in opt}:
            uses.setdefault(o, []).append(c.slot)
    for ts in uses.values():
        ts.sort()
    cursor = {o: 0 for o in uses}

    def next_use(o: int, t: int) -> float:
        ts = uses.get(o, [])
        k = cursor.get(o, 0)
        while k < len(ts) and ts[k] < t:
            k += 1
        cursor[o] = k
        return ts[k] if k < len(ts) else float("inf")

    n_gpu = len(inst.hbm)
    cap = np.asarray(inst.hbm, dtype=float) + 1

    def hbm_of(objs) -> np.ndarray:
        used = np.zeros(n_gpu)
        for o in objs:
            ob = inst.objects[o]
            for i in ob.gpus:
                used[i] += ob.bytes / len(ob.gpus)
        return used

    def dram_now() -> dict[str, float]:
        dram: dict[str, float] = {}
        for o, ob in enumerate(inst.objects):
            if tier[o] == 1:
                dram[ob.node] = dram.get(ob.node, 0.0) + ob.bytes
        return dram

    tier = [inst.init_tier(o) for o in range(O)]
    arrivals: dict[int, list[int]] = {}
    running: list[tuple[int, tuple[int, ...]]] = []  # (last slot, objects)
    for ci, c in enumerate(inst.calls):
        if c.slot < 0:  # arrived in an earlier window: runs on, on its (fixed) first option
            running.append((c.last, c.options[0]))
        else:
            arrivals.setdefault(c.slot, []).append(ci)
    for t in range(T):
        prev = list(tier)
        for o, ob in enumerate(inst.objects):
            if not (ob.live[0] <= t <= ob.live[1]):
                tier[o] = 2
        running = [r for r in running if r[0] >= t]
        held = {o for _, objs in running for o in objs}
        if guide is not None and (t > 0 or inst.lead_s > 0):  # the planner's moves first: a call then
            _follow(inst, guide, t, prev, tier,                 # finds what it prefetched already there
                    hbm_of(o for o in range(O) if tier[o] == 0), dram_now(), u, v)
        for ci in arrivals.get(t, ()):
            c = inst.calls[ci]
            a = affinity(ci, c)
            if a not in choice:
                ranked = sorted((not np.all(hbm_of(held | set(opt)) <= cap),
                                 guide is None or k != guide.choice.get(a, -1),
                                 sum(inst.objects[o].bytes for o in opt if tier[o] != 0), k)
                                for k, opt in enumerate(c.options))
                choice[a] = ranked[0][-1]
            objs = c.options[choice[a]]
            if c.wait_s is not None and not np.all(hbm_of(held | set(objs)) <= cap):
                wait[ci] = 1
                continue
            running.append((c.last, objs))
            held |= set(objs)
            for o in objs:
                if tier[o] != 0:
                    d[o, t] = 1
                    tier[o] = 0
        used = hbm_of(o for o in range(O) if tier[o] == 0)
        dram = dram_now()
        over = [i for i in range(n_gpu) if used[i] > cap[i]]
        if over:
            unheld = (lambda o: guide.tiers[o, t] != 0) if guide is not None else (lambda o: False)
            victims = sorted((o for o in range(O) if tier[o] == 0 and o not in held
                              and any(i in over for i in inst.objects[o].gpus)),
                             key=lambda o: (not unheld(o), -next_use(o, t), o))
            for o in victims:
                if np.all(used <= cap):
                    break
                ob = inst.objects[o]
                if not any(used[i] > cap[i] for i in ob.gpus):
                    continue
                for i in ob.gpus:
                    used[i] -= ob.bytes / len(ob.gpus)
                # a demotion into DRAM needs the object in HBM in the previous slot (3)
                if prev[o] == 0 and dram.get(ob.node, 0.0) + ob.bytes <= inst.dram.get(ob.node, 0.0):
                    tier[o] = 1
                    dram[ob.node] = dram.get(ob.node, 0.0) + ob.bytes
                else:
                    tier[o] = 2
        for o in range(O):
            x[o, t] = tier[o] == 0
            y[o, t] = tier[o] == 1
        for ci in arrivals.get(t, ()):
            c = inst.calls[ci]
            if wait[ci]:
                stall[ci] = c.wait_s
                continue
            objs = c.options[choice[affinity(ci, c)]]
            worst = 0.0
            for o in objs:
                if o in c.produces:
                    continue
                ob = inst.objects[o]
                yp = y[o, t - 1] if t > 0 else float(inst.init_tier(o) == 1)
                worst = max(worst, ob.restore_nvme_s * d[o, t] - (ob.restore_nvme_s - ob.restore_host_s) * yp)
            stall[ci] = worst
    sol = Solution(x, y, u, d, v, stall, backend="greedy", choice=choice, wait=wait)
    bad, sol.objective = evaluate(inst, sol)
    sol.status = STATUS_FEASIBLE if not bad else STATUS_NOT_SOLVED
    return sol


def _follow(inst: Instance, guide: Guide, t: int, prev: list, tier: list, used: np.ndarray, dram: dict,
            u: np.ndarray, v: np.ndarray) -> None:
    """One slot of the planner's lead (`greedy_schedule` with a guide): prefetch from DRAM what it
    held in HBM, and stage from NVMe what it held in DRAM, within the slot's link budgets and the
    room left."""
    window = inst.window_s(t)
    pre = np.zeros(len(inst.hbm))
    root: dict[str, float] = {}
    nv: dict[str, float] = {}
    for o, ob in enumerate(inst.objects):
        want = guide.tiers[o, t]
        if want == 2 or tier[o] == 0 or not (ob.live[0] <= t <= ob.live[1]):
            continue
        share = ob.bytes / len(ob.gpus)
        if want == 0 and prev[o] == 1 and tier[o] == 1:  # (3b): a prefetch reads DRAM
            if (all(pre[i] + share <= inst.h2d[i] * window and used[i] + share <= inst.hbm[i] for i in ob.gpus)
                    and root.get(ob.node, 0.0) + ob.bytes <= inst.root.get(ob.node, 0.0) * window):
                for i in ob.gpus:
                    pre[i] += share
                    used[i] += share
                root[ob.node] = root.get(ob.node, 0.0) + ob.bytes
                dram[ob.node] -= ob.bytes
                u[o, t], tier[o] = 1, 0
        elif want == 1 and tier[o] == 2 and prev[o] == 2:
            if (nv.get(ob.node, 0.0) + ob.bytes <= inst.nvme.get(ob.node, 0.0) * window
                    and dram.get(ob.node, 0.0) + ob.bytes <= inst.dram.get(ob.node, 0.0)):
                nv[ob.node] = nv.get(ob.node, 0.0) + ob.bytes
                dram[ob.node] = dram.get(ob.node, 0.0) + ob.bytes
                v[o, t], tier[o] = 1, 1


def solve_static(inst: Instance, fill: float = 0.75, backend: str = "scip", time_limit_s: float = 30.0) -> list[int]:
    """The same model with time collapsed: one set of weights objects held in HBM for the whole
    trace (z_o binary), filling at most `fill` of each GPU (the rest for KV and on-demand models),
    minimising the restores the trace's calls would pay from host DRAM for models left out:

        min  sum_c sum_{o in N_c, o weights} R^h_o (1 - z_o)
        s.t. sum_{o on i} b_o / k_o z_o <= fill x H_i      for every GPU i

    Returns the indices of the objects kept."""
    from ortools.linear_solver import pywraplp

    if backend not in ("scip", "cp-sat"):
        raise ValueError(f"the static placement solves with OR-Tools (scip or cp-sat), not {backend!r}")
    weights = [o for o, ob in enumerate(inst.objects) if ob.name.startswith("w:")]
    value = {o: 0.0 for o in weights}
    for c in inst.calls:
        for o in c.needs:
            if o in value:
                value[o] += inst.objects[o].restore_host_s
    s = pywraplp.Solver.CreateSolver("SCIP" if backend == "scip" else "CP-SAT")
    z = {o: s.BoolVar(f"z_o{o}") for o in weights}
    for i, cap in enumerate(inst.hbm):
        on = [o for o in weights if i in inst.objects[o].gpus]
        if on:
            s.Add(sum(inst.objects[o].bytes / len(inst.objects[o].gpus) * z[o] for o in on) <= fill * cap)
    s.Maximize(sum(value[o] * z[o] for o in weights))
    s.SetTimeLimit(int(time_limit_s * 1000))
    if s.Solve() not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return []
    return [o for o in weights if z[o].solution_value() > 0.5]
