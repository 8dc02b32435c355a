"""The offline MILP oracle: with the whole trace known, where should each state object be in each
time slot, to minimise total stall plus λ x bytes moved?

Data (an `Instance`)
    slots t = 0..T-1, durations Δ_t (slot boundaries at call arrivals of the zero-stall timeline)
    objects o: a model's weights (dense + hot expert pages) on one of its candidate GPU groups
        (replicas), or a program's KV for a model on one of those groups; bytes b_o,
        tensor-parallel width k_o
    per object: restore seconds R^h_o from host DRAM, R^n_o from NVMe (weights: transfer +
        cold start; KV: recompute); live slots L_o (KV exists from its first call to the program end)
    calls c: arrival slot t_c and span S_c = t_c..e_c (the slots it runs in the zero-stall
        timeline); options k = 1..K_c, each the objects N_ck it needs on one GPU group (the model's
        weights and the program's KV there); W_c the stall of waiting instead (for calls that may);
        P_c the objects it produces (its KV's first appearance: no stall, but HBM)
    affinities a: calls of one program and model share one choice (a program's KV stays on the
        group it was made on); a(c) the call's affinity
    per GPU i: HBM H_i, H2D bandwidth B_i; per node n: DRAM D_n, root bandwidth B^root_n,
        NVMe read bandwidth B^nvme_n; λ (seconds per byte moved)

Variables (binary unless said)
    x[o,t] o in HBM during slot t          y[o,t] o in host DRAM (and not in HBM) during t
    u[o,t] o prefetched into HBM for t (moved during slot t-1)
    d[o,t] o loaded on demand at t by a call that needs it      v[o,t] o staged NVMe -> DRAM for t
    z[a,k] affinity a runs on option k (a constant 1 where a has one option)
    q_c    call c waits: it holds nothing, and stalls W_c (its load may still start at t_c)
    s_c >= 0 (continuous) the stall of call c

Constraints
    (0) sum_k z[a,k] = 1                                       one option per affinity
    (1) x[o,t] + y[o,t] <= 1                                   one tier at a time
    (2) x[o,t] <= x[o,t-1] + u[o,t] + d[o,t]                    HBM residency needs a promotion
        (x[o,-1], y[o,-1] from the initial tiers: by default every object starts on NVMe, as
        every policy does; a rolling-horizon window starts where the previous one left off)
    (3) y[o,t] <= y[o,t-1] + x[o,t-1] + v[o,t]                  DRAM residency: demotion or staging
    (3b) u[o,t] <= y[o,t-1]                                      prefetch reads DRAM (NVMe is staged
        first, at the NVMe's rate; only an on-demand load streams from NVMe, and pays R^n)
    (4) d[o,t] <= sum over calls c arriving at t and options k with o in N_ck of z[a(c),k];
        outside L_o: x = y = 0; u[o,0] = v[o,0] = 0 unless the instance has a lead time before
        slot 0 (Δ_{-1}, a rolling window's predecessor)
    (5) x[o,t] >= z[a(c),k] - q_c  for o in N_ck, t in S_c       a call runs with its state, all along
    (6) s_c >= R^n_o d[o,t_c] - (R^n_o - R^h_o) y[o,t_c-1] - R^n_o (1 - z[a(c),k] + q_c)
                                                               for o in N_ck \\ P_c
    (6b) s_c >= W_c q_c                                         a call that waits
    (7) sum_{o on i} b_o/k_o x[o,t] <= H_i                      HBM per GPU
    (8) sum_{o on n} b_o y[o,t] <= D_n                          DRAM per node
    (9) sum_{o on i} b_o/k_o u[o,t] <= B_i Δ_{t-1}              prefetch within the H2D link
    (10) sum_{o on n} b_o u[o,t] <= B^root_n Δ_{t-1}            ... and the node's root complex
    (11) sum_{o on n} b_o v[o,t] <= B^nvme_n Δ_{t-1}            staging within the NVMe read rate
Objective
    min  sum_c s_c + λ sum_{o,t} b_o (u[o,t] + d[o,t] + v[o,t])

Compute is not modelled: overlapping calls share a GPU for free (the simulator's batching), so
the MILP's stall is state stall only.

Backends: OR-Tools (SCIP by default, or CP-SAT) and PuLP (HiGHS or CBC) to cross-check. Every
solve reports status, objective, best bound and gap; at the time limit the best feasible solution
is kept. `evaluate` checks a solution against every constraint and recomputes the objective
without a solver.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from .backends import BACKENDS
from .instance import (STATUS_FEASIBLE, STATUS_OPTIMAL, Call, Instance, Solution, active, affinity,
                       needers)


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
        lead = 1 if inst.lead_s > 0 else 0
        U = [[be.var(f"u_o{o}_t{t}", 0, 1 if t > 0 else lead, True) for t in range(T)] for o in range(O)]
        D = [[be.var(f"d_o{o}_t{t}", 0, 1 if (o, t) in need else 0, True) for t in range(T)] for o in range(O)]
        V = [[be.var(f"v_o{o}_t{t}", 0, 1 if t > 0 else lead, True) for t in range(T)] for o in range(O)]
        S = [be.var(f"s_c{ci}", 0, None, False) for ci in range(len(inst.calls))]
        for o, ob in enumerate(inst.objects):
            for t in range(T):
                be.add(X[o][t] + Y[o][t] <= 1, f"c1_o{o}_t{t}")  # Constraint (1)
                xp = X[o][t - 1] if t > 0 else int(inst.init_tier(o) == 0)
                yp = Y[o][t - 1] if t > 0 else int(inst.init_tier(o) == 1)
                be.add(X[o][t] - xp - U[o][t] - D[o][t] <= 0, f"c2_o{o}_t{t}")  # Constraint (2)
                be.add(Y[o][t] - yp - xp - V[o][t] <= 0, f"c3_o{o}_t{t}")  # Constraint (3)
                be.add(U[o][t] - yp <= 0, f"c3b_o{o}_t{t}")  # Constraint (3b)
                if not (ob.live[0] <= t <= ob.live[1]):  # Constraint (4)
                    be.add(X[o][t] + Y[o][t] <= 0, f"c4_o{o}_t{t}")
        Z: dict[int, list] = {}  # affinity -> one binary per option, where there is a choice
        for ci, c in enumerate(inst.calls):
            a = affinity(ci, c)
            if len(c.options) > 1 and a not in Z:
                Z[a] = [be.var(f"z_a{a}_k{k}", 0, 1, True) for k in range(len(c.options))]
                be.add(be.sum(Z[a]) == 1, f"c0_a{a}")  # Constraint (0)

        def z(ci, k):
            zs = Z.get(affinity(ci, inst.calls[ci]))
            return 1 if zs is None else zs[k]

        Q = {ci: be.var(f"q_c{ci}", 0, 1, True) for ci, c in enumerate(inst.calls)
             if c.wait_s is not None and 0 <= c.slot < T}

        for (o, t), pairs in need.items():  # Constraint (4): an on-demand load serves a call that chose o
            if 0 <= t < T and all(affinity(ci, inst.calls[ci]) in Z for ci, _ in pairs):
                be.add(D[o][t] - be.sum(z(ci, k) for ci, k in pairs) <= 0, f"c4d_o{o}_t{t}")
        for ci, c in enumerate(inst.calls):
            t = c.slot
            q = Q.get(ci, 0)
            if ci in Q:
                be.add(S[ci] - c.wait_s * q >= 0, f"c6b_c{ci}")  # Constraint (6b)
            for k, opt in enumerate(c.options):
                for o in opt:
                    for tt in range(max(t, 0), min(c.last, T - 1) + 1):
                        be.add(X[o][tt] - z(ci, k) + q >= 0, f"c5_c{ci}_k{k}_o{o}_t{tt}")  # Constraint (5)
                    if o in c.produces or not 0 <= t < T:
                        continue
                    ob = inst.objects[o]
                    yp = Y[o][t - 1] if t > 0 else int(inst.init_tier(o) == 1)
                    # Constraint (6)
                    slack = ob.restore_nvme_s * (1 - z(ci, k) + q)
                    be.add(S[ci] - ob.restore_nvme_s * D[o][t] + (ob.restore_nvme_s - ob.restore_host_s) * yp
                           + slack >= 0, f"c6_c{ci}_k{k}_o{o}")
        n_gpu = len(inst.hbm)
        nodes = sorted({ob.node for ob in inst.objects})
        for t in range(T):
            window = inst.window_s(t)
            for i in range(n_gpu):
                on = [(o, ob.bytes / len(ob.gpus)) for o, ob in enumerate(inst.objects) if i in ob.gpus]
                if not on:
                    continue
                be.add(be.sum(b * X[o][t] for o, b in on) <= inst.hbm[i], f"c7_g{i}_t{t}")  # Constraint (7)
                if window > 0:
                    be.add(be.sum(b * U[o][t] for o, b in on) <= inst.h2d[i] * window, f"c9_g{i}_t{t}")  # (9)
            for n in nodes:
                on = [(o, ob.bytes) for o, ob in enumerate(inst.objects) if ob.node == n]
                be.add(be.sum(b * Y[o][t] for o, b in on) <= inst.dram.get(n, 0.0), f"c8_{n}_t{t}")  # (8)
                if window > 0:
                    be.add(be.sum(b * U[o][t] for o, b in on) <= inst.root.get(n, 0.0) * window, f"c10_{n}_t{t}")
                    be.add(be.sum(b * V[o][t] for o, b in on) <= inst.nvme.get(n, 0.0) * window, f"c11_{n}_t{t}")
        moved = be.sum(inst.objects[o].bytes * (U[o][t] + D[o][t] + V[o][t]) for o in range(O) for t in range(T))
        be.minimize(be.sum(S) + inst.lam * moved)
        return X, Y, U, D, V, S, Z, Q


def _gap(obj: float, bound: float) -> float:
    return abs(obj - bound) / max(abs(obj), 1e-9) if obj or bound else 0.0


def solve(inst: Instance, backend: str = "scip", time_limit_s: float = 60.0, threads: int = 1,
          hint: Solution | None = None) -> Solution:
    """Solve one instance. One thread by default: ties between optimal schedules then break the
    same way every run (same inputs, same report). `hint`: a feasible schedule to start from
    (`greedy_schedule`); at the time limit the solver keeps the better of it and what it found."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown MILP backend {backend!r} (known: {', '.join(BACKENDS)})")
    t0 = time.perf_counter()
    be = BACKENDS[backend]()
    X, Y, U, D, V, S, Z, Q = _Builder(inst, be).build()
    if hint is not None:
        O, T = len(inst.objects), inst.T
        pairs = [(grid[o][t], val[o, t]) for grid, val in ((X, hint.x), (Y, hint.y), (U, hint.u), (D, hint.d), (V, hint.v))
                 for o in range(O) for t in range(T)]
        pairs += [(zk, float(k == hint.choice.get(a, 0))) for a, zs in Z.items() for k, zk in enumerate(zs)]
        pairs += [(q, float(hint.waits(ci))) for ci, q in Q.items()]
        be.hint(pairs + [(S[ci], hint.stall[ci]) for ci in range(len(inst.calls))])
    status, obj, bound = be.solve(time_limit_s, threads)
    O, T = len(inst.objects), inst.T
    val = be.value

    def grid(vs):
        return np.array([[round(val(vs[o][t])) for t in range(T)] for o in range(O)], dtype=float).reshape(O, T)

    if status in (STATUS_OPTIMAL, STATUS_FEASIBLE):
        sol = Solution(grid(X), grid(Y), grid(U), grid(D), grid(V), np.array([max(val(s), 0.0) for s in S]) + 0.0,  # + 0.0: max(-0.0, 0.0) is -0.0
                       choice={a: int(np.argmax([val(zk) for zk in zs])) for a, zs in Z.items()},
                       wait=np.array([float(ci in Q and val(Q[ci]) > 0.5) for ci in range(len(inst.calls))]))
    else:
        z = np.zeros((O, T))
        sol = Solution(z, z.copy(), z.copy(), z.copy(), z.copy(), np.zeros(len(inst.calls)))
    sol.status, sol.objective, sol.backend = status, obj, backend
    # the objective is never negative, so 0 is always a valid bound (a solver stopped early may
    # report -infinity)
    sol.bound = max(bound, 0.0) if bound == bound else (obj if status == STATUS_OPTIMAL else 0.0)
    sol.gap = _gap(obj, sol.bound) if status in (STATUS_OPTIMAL, STATUS_FEASIBLE) else float("nan")
    sol.solve_s = time.perf_counter() - t0
    return sol


def brute_force(inst: Instance) -> float:
    """The exact optimum of a tiny instance: every assignment of options to affinities and of
    waiting to the calls that may wait, and for each a dynamic program over slots whose state is
    the tier of every object (HBM, DRAM, neither). An independent check of the MILP
    (options^A x 2^W x 3^O states)."""
    keys = sorted({affinity(ci, c): len(c.options) for ci, c in enumerate(inst.calls)}.items())
    may_wait = [ci for ci, c in enumerate(inst.calls) if c.wait_s is not None and 0 <= c.slot < inst.T]
    best = np.inf
    for pick in itertools.product(*(range(n) for _, n in keys)):
        choice = {a: k for (a, _), k in zip(keys, pick)}
        for waiting in itertools.product((False, True), repeat=len(may_wait)):
            waits = {ci for ci, w in zip(may_wait, waiting) if w}
            calls, loads, waited = [], set(), 0.0
            for ci, c in enumerate(inst.calls):
                objs = c.options[choice[affinity(ci, c)]]
                if ci in waits:  # holds nothing; its load may still start
                    waited += c.wait_s
                    loads |= {(o, c.slot) for o in objs}
                else:
                    calls.append(Call(c.name, c.slot, objs, tuple(o for o in c.produces if o in objs), c.end))
            fixed = Instance(inst.slot_s, inst.objects, tuple(calls), inst.hbm, inst.h2d, inst.dram, inst.root,
                             inst.nvme, inst.lam, inst.init, inst.lead_s)
            best = min(best, waited + _brute_force_fixed(fixed, loads))
    return best


def _brute_force_fixed(inst: Instance, loads: set = frozenset()) -> float:
    """`brute_force` for calls of one option each that all run; `loads`: more (object, slot)
    pairs where an on-demand load may happen (the loads of waiting calls)."""
    O, T = len(inst.objects), inst.T
    need = set(needers(inst)) | set(loads)
    running = active(inst)
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
        for ci in running.get(t, ()):
            if any(cur[o] != 0 for o in inst.calls[ci].needs):
                return np.inf
        window = inst.window_s(t)
        moved = 0.0
        nv: dict[str, float] = {}
        promote = []  # objects entering HBM
        for o in range(O):
            ob = inst.objects[o]
            if cur[o] == 0 and prev[o] != 0:
                promote.append(o)
            if cur[o] == 1 and prev[o] == 2:  # staging from NVMe
                if window <= 0:
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
                if window <= 0 or prev[o] != 1:  # a prefetch reads DRAM
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

    start = tuple(inst.init_tier(o) for o in range(O))
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
