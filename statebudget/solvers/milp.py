"""The offline MILP oracle: with the whole trace known, where should each state object be in each
time slot, to minimise total stall plus λ x bytes moved?

Data (an `Instance`)
    slots t = 0..T-1, durations Δ_t (slot boundaries at call arrivals of the zero-stall timeline)
    objects o: a model's weights (dense + hot expert pages) on its home GPU group, or a program's
        KV for a model, on that model's home group; bytes b_o, tensor-parallel width k_o
    per object: restore seconds R^h_o from host DRAM, R^n_o from NVMe (weights: transfer +
        cold start; KV: recompute); live slots L_o (KV exists from its first call to the program end)
    calls c: slot t_c, the objects N_c it needs; P_c ⊆ N_c the objects it produces (its KV's first
        appearance: no stall, but it occupies HBM)
    per GPU i: HBM H_i, H2D bandwidth B_i; per node n: DRAM D_n, root bandwidth B^root_n,
        NVMe read bandwidth B^nvme_n; λ (seconds per byte moved)

Variables (binary unless said)
    x[o,t] o in HBM during slot t          y[o,t] o in host DRAM (and not in HBM) during t
    u[o,t] o prefetched into HBM for t (moved during slot t-1)
    d[o,t] o loaded on demand at t by a call that needs it      v[o,t] o staged NVMe -> DRAM for t
    s_c >= 0 (continuous) the stall of call c

Constraints
    (1) x[o,t] + y[o,t] <= 1                                   one tier at a time
    (2) x[o,t] <= x[o,t-1] + u[o,t] + d[o,t]                    HBM residency needs a promotion
        (x[o,-1] = y[o,-1] = 0: every policy starts with the weights on NVMe)
    (3) y[o,t] <= y[o,t-1] + x[o,t-1] + v[o,t]                  DRAM residency: demotion or staging
    (4) d[o,t] = 0 unless a call at t needs o; u[o,0] = v[o,0] = 0; outside L_o: x = y = 0
    (5) x[o,t_c] = 1 for o in N_c                               a call runs with its state
    (6) s_c >= R^n_o d[o,t_c] - (R^n_o - R^h_o) y[o,t_c-1]      for o in N_c \\ P_c
    (7) sum_{o on i} b_o/k_o x[o,t] <= H_i                      HBM per GPU
    (8) sum_{o on n} b_o y[o,t] <= D_n                          DRAM per node
    (9) sum_{o on i} b_o/k_o u[o,t] <= B_i Δ_{t-1}              prefetch within the H2D link
    (10) sum_{o on n} b_o u[o,t] <= B^root_n Δ_{t-1}            ... and the node's root complex
    (11) sum_{o on n} b_o v[o,t] <= B^nvme_n Δ_{t-1}            staging within the NVMe read rate
Objective
    min  sum_c s_c + λ sum_{o,t} b_o (u[o,t] + d[o,t] + v[o,t])

Backends: OR-Tools (SCIP by default, or CP-SAT) and PuLP (HiGHS or CBC) to cross-check. Every
solve reports status, objective, best bound and gap; at the time limit the best feasible solution
is kept. `evaluate` checks a solution against every constraint and recomputes the objective
without a solver.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

STATUS_OPTIMAL, STATUS_FEASIBLE, STATUS_INFEASIBLE, STATUS_NOT_SOLVED = "OPTIMAL", "FEASIBLE", "INFEASIBLE", "NOT_SOLVED"


@dataclass(frozen=True)
class Obj:
    name: str            # e.g. "w:coder" or "kv:p17:coder"
    gpus: tuple[int, ...]
    node: str
    bytes: float
    restore_host_s: float
    restore_nvme_s: float
    live: tuple[int, int]  # first and last slot (inclusive) where the object exists


@dataclass(frozen=True)
class Call:
    name: str
    slot: int
    needs: tuple[int, ...]     # object indices
    produces: tuple[int, ...]  # subset of needs: created by this call (no stall)


@dataclass(frozen=True)
class Instance:
    slot_s: tuple[float, ...]      # slot durations Δ_t
    objects: tuple[Obj, ...]
    calls: tuple[Call, ...]
    hbm: tuple[float, ...]         # per GPU
    h2d: tuple[float, ...]         # per GPU, bytes/s
    dram: dict = field(default_factory=dict)   # node -> bytes
    root: dict = field(default_factory=dict)   # node -> bytes/s
    nvme: dict = field(default_factory=dict)   # node -> bytes/s
    lam: float = 1e-12             # seconds of objective per byte moved

    @property
    def T(self) -> int:
        return len(self.slot_s)


@dataclass
class Solution:
    x: np.ndarray  # [O x T]
    y: np.ndarray
    u: np.ndarray
    d: np.ndarray
    v: np.ndarray
    stall: np.ndarray  # per call
    status: str = STATUS_NOT_SOLVED
    objective: float = 0.0
    bound: float = 0.0
    gap: float = 0.0
    solve_s: float = 0.0
    backend: str = ""


def _gap(obj: float, bound: float) -> float:
    return abs(obj - bound) / max(abs(obj), 1e-9) if obj or bound else 0.0


def needers(inst: Instance) -> dict[tuple[int, int], list[int]]:
    """(object, slot) -> calls at that slot that need it."""
    out: dict[tuple[int, int], list[int]] = {}
    for ci, c in enumerate(inst.calls):
        for o in c.needs:
            out.setdefault((o, c.slot), []).append(ci)
    return out


def evaluate(inst: Instance, sol: Solution, tol: float = 1e-6) -> tuple[list[str], float]:
    """Check every constraint of the model in the module docstring; returns (violations, the
    objective recomputed from the variables)."""
    bad: list[str] = []
    O, T = len(inst.objects), inst.T
    x, y, u, d, v, s = sol.x, sol.y, sol.u, sol.d, sol.v, sol.stall
    need = needers(inst)
    for arr, name in ((x, "x"), (y, "y"), (u, "u"), (d, "d"), (v, "v")):
        if arr.shape != (O, T):
            return [f"{name} has shape {arr.shape}, expected {(O, T)}"], float("nan")
        if np.any((np.abs(arr) > tol) & (np.abs(arr - 1) > tol)):
            bad.append(f"{name} is not binary")
    for o, ob in enumerate(inst.objects):
        for t in range(T):
            xp = x[o, t - 1] if t > 0 else 0.0
            yp = y[o, t - 1] if t > 0 else 0.0
            if x[o, t] + y[o, t] > 1 + tol:
                bad.append(f"(1) {ob.name} t={t}: in HBM and DRAM")
            if x[o, t] > xp + u[o, t] + d[o, t] + tol:
                bad.append(f"(2) {ob.name} t={t}: in HBM without a promotion")
            if y[o, t] > yp + xp + v[o, t] + tol:
                bad.append(f"(3) {ob.name} t={t}: in DRAM without staging or demotion")
            if d[o, t] > tol and (o, t) not in need:
                bad.append(f"(4) {ob.name} t={t}: on-demand load with no call needing it")
            if t == 0 and (u[o, t] > tol or v[o, t] > tol):
                bad.append(f"(4) {ob.name}: prefetch before time 0")
            if not (ob.live[0] <= t <= ob.live[1]) and (x[o, t] > tol or y[o, t] > tol):
                bad.append(f"(4) {ob.name} t={t}: resident outside its life")
    stall_total = 0.0
    for ci, c in enumerate(inst.calls):
        t = c.slot
        for o in c.needs:
            if x[o, t] < 1 - tol:
                bad.append(f"(5) call {c.name}: {inst.objects[o].name} not in HBM at t={t}")
            if o in c.produces:
                continue
            ob = inst.objects[o]
            yp = y[o, t - 1] if t > 0 else 0.0
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
        window = inst.slot_s[t - 1] if t > 0 else 0.0
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


# ---- the model, written once against a tiny solver-neutral interface ---------------------------
class _Builder:
    """Adds the constraints of the module docstring to a backend that offers `var(name, lb, ub,
    integer)`, `add(expr <= / >= / == …, name)`, `minimize(expr)`."""

    def __init__(self, inst: Instance, be):
        self.inst, self.be = inst, be

    def build(self):
        inst, be = self.inst, self.be
        O, T = len(inst.objects), inst.T
        need = needers(inst)
        X = [[be.var(f"x_o{o}_t{t}", 0, 1, True) for t in range(T)] for o in range(O)]
        Y = [[be.var(f"y_o{o}_t{t}", 0, 1, True) for t in range(T)] for o in range(O)]
        U = [[be.var(f"u_o{o}_t{t}", 0, 1 if t > 0 else 0, True) for t in range(T)] for o in range(O)]
        D = [[be.var(f"d_o{o}_t{t}", 0, 1 if (o, t) in need else 0, True) for t in range(T)] for o in range(O)]
        V = [[be.var(f"v_o{o}_t{t}", 0, 1 if t > 0 else 0, True) for t in range(T)] for o in range(O)]
        S = [be.var(f"s_c{ci}", 0, None, False) for ci in range(len(inst.calls))]
        for o, ob in enumerate(inst.objects):
            for t in range(T):
                be.add(X[o][t] + Y[o][t] <= 1, f"c1_o{o}_t{t}")  # Constraint (1)
                xp = X[o][t - 1] if t > 0 else 0
                yp = Y[o][t - 1] if t > 0 else 0
                be.add(X[o][t] - xp - U[o][t] - D[o][t] <= 0, f"c2_o{o}_t{t}")  # Constraint (2)
                be.add(Y[o][t] - yp - xp - V[o][t] <= 0, f"c3_o{o}_t{t}")  # Constraint (3)
                if not (ob.live[0] <= t <= ob.live[1]):  # Constraint (4)
                    be.add(X[o][t] + Y[o][t] <= 0, f"c4_o{o}_t{t}")
        for ci, c in enumerate(inst.calls):
            t = c.slot
            for o in c.needs:
                be.add(X[o][t] >= 1, f"c5_c{ci}_o{o}")  # Constraint (5)
                if o in c.produces:
                    continue
                ob = inst.objects[o]
                yp = Y[o][t - 1] if t > 0 else 0
                # Constraint (6)
                be.add(S[ci] - ob.restore_nvme_s * D[o][t] + (ob.restore_nvme_s - ob.restore_host_s) * yp >= 0,
                       f"c6_c{ci}_o{o}")
        n_gpu = len(inst.hbm)
        nodes = sorted({ob.node for ob in inst.objects})
        for t in range(T):
            window = inst.slot_s[t - 1] if t > 0 else 0.0
            for i in range(n_gpu):
                on = [(o, ob.bytes / len(ob.gpus)) for o, ob in enumerate(inst.objects) if i in ob.gpus]
                if not on:
                    continue
                be.add(be.sum(b * X[o][t] for o, b in on) <= inst.hbm[i], f"c7_g{i}_t{t}")  # Constraint (7)
                if t > 0:
                    be.add(be.sum(b * U[o][t] for o, b in on) <= inst.h2d[i] * window, f"c9_g{i}_t{t}")  # (9)
            for n in nodes:
                on = [(o, ob.bytes) for o, ob in enumerate(inst.objects) if ob.node == n]
                be.add(be.sum(b * Y[o][t] for o, b in on) <= inst.dram.get(n, 0.0), f"c8_{n}_t{t}")  # (8)
                if t > 0:
                    be.add(be.sum(b * U[o][t] for o, b in on) <= inst.root.get(n, 0.0) * window, f"c10_{n}_t{t}")
                    be.add(be.sum(b * V[o][t] for o, b in on) <= inst.nvme.get(n, 0.0) * window, f"c11_{n}_t{t}")
        moved = be.sum(inst.objects[o].bytes * (U[o][t] + D[o][t] + V[o][t]) for o in range(O) for t in range(T))
        be.minimize(be.sum(S) + inst.lam * moved)
        return X, Y, U, D, V, S


class _OrTools:
    def __init__(self, solver_id: str):
        from ortools.linear_solver import pywraplp

        self.s = pywraplp.Solver.CreateSolver(solver_id)
        if self.s is None:
            raise RuntimeError(f"OR-Tools has no {solver_id} solver here")
        self.inf = self.s.infinity()

    def var(self, name, lb, ub, integer):
        ub = self.inf if ub is None else ub
        return self.s.IntVar(lb, ub, name) if integer else self.s.NumVar(lb, ub, name)

    def add(self, ct, name):
        self.s.Add(ct, name)

    def sum(self, terms):
        from ortools.linear_solver import pywraplp
        return pywraplp.SumArray(list(terms))

    def minimize(self, expr):
        self.s.Minimize(expr)

    def solve(self, time_limit_s: float, threads: int):
        from ortools.linear_solver import pywraplp

        self.s.SetTimeLimit(int(time_limit_s * 1000))
        self.s.SetNumThreads(threads)
        code = self.s.Solve()
        status = {pywraplp.Solver.OPTIMAL: STATUS_OPTIMAL, pywraplp.Solver.FEASIBLE: STATUS_FEASIBLE,
                  pywraplp.Solver.INFEASIBLE: STATUS_INFEASIBLE}.get(code, STATUS_NOT_SOLVED)
        if status in (STATUS_OPTIMAL, STATUS_FEASIBLE):
            obj = self.s.Objective().Value()
            bound = self.s.Objective().BestBound()
            return status, obj, bound
        return status, float("nan"), float("nan")

    @staticmethod
    def value(v):
        return v.solution_value()


class _Pulp:
    def __init__(self, solver_name: str):
        import pulp

        self.pulp = pulp
        self.m = pulp.LpProblem("statebudget", pulp.LpMinimize)
        self.solver_name = solver_name

    def var(self, name, lb, ub, integer):
        cat = "Integer" if integer else "Continuous"
        if hasattr(self.m, "add_variable"):  # PuLP >= 3.3
            return self.m.add_variable(name, lb, ub, cat=cat)
        return self.pulp.LpVariable(name, lb, ub, cat=cat)

    def add(self, ct, name):
        if isinstance(ct, bool):  # a constant constraint (no variables): must hold
            if not ct:
                raise ValueError(f"constraint {name} cannot hold")
            return
        self.m += ct, name

    def sum(self, terms):
        return self.pulp.lpSum(list(terms))

    def minimize(self, expr):
        self.m += expr

    def solve(self, time_limit_s: float, threads: int):
        pulp = self.pulp
        if self.solver_name == "HiGHS":
            solver = pulp.getSolver("HiGHS", msg=False, timeLimit=time_limit_s, threads=threads)
        else:
            solver = pulp.getSolver("PULP_CBC_CMD", msg=False, timeLimit=time_limit_s, threads=threads)
        self.m.solve(solver)
        st = pulp.LpStatus[self.m.status]
        obj = pulp.value(self.m.objective)
        if st == "Optimal":
            return STATUS_OPTIMAL, float(obj), float(obj)
        if obj is not None and st == "Not Solved":
            return STATUS_FEASIBLE, float(obj), float("nan")
        return (STATUS_INFEASIBLE if st == "Infeasible" else STATUS_NOT_SOLVED), float("nan"), float("nan")

    @staticmethod
    def value(v):
        return v.value() or 0.0


BACKENDS = {"scip": lambda: _OrTools("SCIP"), "cp-sat": lambda: _OrTools("CP-SAT"),
            "highs": lambda: _Pulp("HiGHS"), "cbc": lambda: _Pulp("CBC")}


def solve(inst: Instance, backend: str = "scip", time_limit_s: float = 60.0, threads: int = 2) -> Solution:
    if backend not in BACKENDS:
        raise ValueError(f"unknown MILP backend {backend!r} (known: {', '.join(BACKENDS)})")
    t0 = time.perf_counter()
    be = BACKENDS[backend]()
    X, Y, U, D, V, S = _Builder(inst, be).build()
    status, obj, bound = be.solve(time_limit_s, threads)
    O, T = len(inst.objects), inst.T
    val = be.value

    def grid(vs):
        return np.array([[round(val(vs[o][t])) for t in range(T)] for o in range(O)], dtype=float).reshape(O, T)

    if status in (STATUS_OPTIMAL, STATUS_FEASIBLE):
        sol = Solution(grid(X), grid(Y), grid(U), grid(D), grid(V), np.array([max(val(s), 0.0) for s in S]))
    else:
        z = np.zeros((O, T))
        sol = Solution(z, z.copy(), z.copy(), z.copy(), z.copy(), np.zeros(len(inst.calls)))
    sol.status, sol.objective, sol.backend = status, obj, backend
    sol.bound = bound if bound == bound else obj
    sol.gap = _gap(obj, sol.bound) if status in (STATUS_OPTIMAL, STATUS_FEASIBLE) else float("nan")
    sol.solve_s = time.perf_counter() - t0
    return sol


def brute_force(inst: Instance) -> float:
    """The exact optimum of a tiny instance by dynamic programming over slots, the state being the
    tier of every object (HBM, DRAM, neither): an independent check of the MILP (3^O states)."""
    import itertools

    O, T = len(inst.objects), inst.T
    need = needers(inst)
    states = list(itertools.product((0, 1, 2), repeat=O))  # 0 HBM, 1 DRAM, 2 neither
    n_gpu = len(inst.hbm)

    def fits(state, t) -> bool:
        hbm = np.zeros(n_gpu)
        dram: dict[str, float] = {}
        for o, tier in enumerate(state):
            ob = inst.objects[o]
            if tier != 2 and not (ob.live[0] <= t <= ob.live[1]):
                return False
            if tier == 0:
                for i in ob.gpus:
                    hbm[i] += ob.bytes / len(ob.gpus)
            elif tier == 1:
                dram[ob.node] = dram.get(ob.node, 0.0) + ob.bytes
        if np.any(hbm > np.asarray(inst.hbm) + 1):
            return False
        return all(b <= inst.dram.get(n, 0.0) + 1 for n, b in dram.items())

    calls_at: dict[int, list[Call]] = {}
    for c in inst.calls:
        calls_at.setdefault(c.slot, []).append(c)

    def step_cost(prev, cur, t) -> float:
        """Cheapest way (stall + λ bytes) to go from tiers `prev` to `cur` into slot t; inf if none."""
        for c in calls_at.get(t, ()):
            if any(cur[o] != 0 for o in c.needs):
                return np.inf
        window = inst.slot_s[t - 1] if t > 0 else 0.0
        moved = 0.0
        nv: dict[str, float] = {}
        promote = []  # objects entering HBM
        for o in range(O):
            ob = inst.objects[o]
            if cur[o] == 0 and prev[o] != 0:
                promote.append(o)
            if cur[o] == 1 and prev[o] == 2:  # staging from NVMe
                if t == 0:
                    return np.inf
                nv[ob.node] = nv.get(ob.node, 0.0) + ob.bytes
                moved += ob.bytes
        if any(b > inst.nvme.get(n, 0.0) * window + 1 for n, b in nv.items()):
            return np.inf
        best = np.inf
        # each promotion is a prefetch (u) or, when a call at t needs it, an on-demand load (d)
        options = [(0, 1) if (o, t) in need else (0,) for o in promote]
        for choice in itertools.product(*options):
            pre = np.zeros(n_gpu)
            root: dict[str, float] = {}
            ok = True
            for o, on_demand in zip(promote, choice):
                if on_demand:
                    continue
                if t == 0:
                    ok = False
                    break
                ob = inst.objects[o]
                for i in ob.gpus:
                    pre[i] += ob.bytes / len(ob.gpus)
                root[ob.node] = root.get(ob.node, 0.0) + ob.bytes
            if not ok or np.any(pre > np.asarray(inst.h2d) * window + 1):
                continue
            if any(b > inst.root.get(n, 0.0) * window + 1 for n, b in root.items()):
                continue
            demand = {o for o, on_demand in zip(promote, choice) if on_demand}
            stall = 0.0
            for c in calls_at.get(t, ()):
                worst = 0.0
                for o in c.needs:
                    if o in demand and o not in c.produces:
                        ob = inst.objects[o]
                        worst = max(worst, ob.restore_host_s if prev[o] == 1 else ob.restore_nvme_s)
                stall += worst
            cost = stall + inst.lam * (moved + sum(inst.objects[o].bytes for o in promote))
            best = min(best, cost)
        return best

    start = tuple([2] * O)
    cost = {start: 0.0}
    for t in range(T):
        nxt: dict[tuple, float] = {}
        for cur in states:
            if not fits(cur, t):
                continue
            best = min((c0 + step_cost(prev, cur, t) for prev, c0 in cost.items()), default=np.inf)
            if best < np.inf:
                nxt[cur] = best
        cost = nxt
    return min(cost.values()) if cost else np.inf
