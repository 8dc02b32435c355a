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
    slot: int                  # arrival slot t_c (< 0 in a rolling window: it arrived in an earlier one)
    needs: tuple[int, ...]     # object indices of its first option
    produces: tuple[int, ...]  # objects created by this call (no stall), in any option
    end: int | None = None     # last slot it runs in (inclusive); None: its arrival slot only
    alts: tuple[tuple[int, ...], ...] = ()  # further options: the same state on other GPU groups
    affinity: int | None = None  # calls sharing an affinity choose the same option; None: its own
    wait_s: float | None = None  # W_c: the call may wait instead of running (q_c), at this stall

    @property
    def options(self) -> tuple[tuple[int, ...], ...]:
        return (self.needs,) + self.alts

    @property
    def last(self) -> int:
        return self.slot if self.end is None else max(self.end, self.slot)


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
    init: tuple[int, ...] = ()     # tier of each object before slot 0: 0 HBM, 1 DRAM, 2 neither (default)
    lead_s: float = 0.0            # link time before slot 0 for prefetching into it (a window's predecessor)

    @property
    def T(self) -> int:
        return len(self.slot_s)

    def init_tier(self, o: int) -> int:
        return self.init[o] if self.init else 2

    def window_s(self, t: int) -> float:
        """Link time for moves into slot t: the previous slot's duration."""
        return self.slot_s[t - 1] if t > 0 else self.lead_s


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
    choice: dict = field(default_factory=dict)  # affinity -> option index (absent: option 0)
    wait: np.ndarray | None = None  # per call, 1 where it waits (q_c); None: none waits

    def waits(self, ci: int) -> bool:
        return self.wait is not None and self.wait[ci] > 0.5


def affinity(ci: int, c: Call) -> int:
    """The key of a call's choice: its affinity, or its own (negative) key when it has none."""
    return c.affinity if c.affinity is not None else -1 - ci


def chosen(inst: Instance, sol: Solution, ci: int) -> tuple[int, ...]:
    """The objects of the option call `ci`'s affinity chose in `sol` (where it runs, or loads
    and waits)."""
    c = inst.calls[ci]
    return c.options[sol.choice.get(affinity(ci, c), 0)]


def _gap(obj: float, bound: float) -> float:
    return abs(obj - bound) / max(abs(obj), 1e-9) if obj or bound else 0.0


def needers(inst: Instance) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(object, slot) -> (call, option) pairs of the calls arriving at that slot whose option needs it."""
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for ci, c in enumerate(inst.calls):
        for k, opt in enumerate(c.options):
            for o in opt:
                out.setdefault((o, c.slot), []).append((ci, k))
    return out


def active(inst: Instance) -> dict[int, list[int]]:
    """slot -> the calls running in it (their span S_c, cut to the instance)."""
    out: dict[int, list[int]] = {}
    for ci, c in enumerate(inst.calls):
        for t in range(max(c.slot, 0), min(c.last, inst.T - 1) + 1):
            out.setdefault(t, []).append(ci)
    return out


def evaluate(inst: Instance, sol: Solution, tol: float = 1e-6) -> tuple[list[str], float]:
    """Check every constraint of the model in the module docstring; returns (violations, the
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

    def hint(self, pairs) -> None:
        """A starting solution for the search (SCIP and CP-SAT take it as an incumbent to improve)."""
        pairs = list(pairs)
        self.s.SetHint([v for v, _ in pairs], [float(x) for _, x in pairs])

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

    def hint(self, pairs) -> None:
        """Ignored. HiGHS through PuLP takes no start. CBC takes one (`warmStart`), but with it CBC
        3.x returned schedules up to 2,000x the optimum still marked optimal (a 15-minute swe-team
        window: 121.7 against 0.13 without the start, and HiGHS's 0.13)."""

    def solve(self, time_limit_s: float, threads: int):
        pulp = self.pulp
        if self.solver_name == "HiGHS":
            solver = pulp.getSolver("HiGHS", msg=False, timeLimit=time_limit_s, threads=threads)
        else:
            solver = pulp.getSolver("PULP_CBC_CMD", msg=False, timeLimit=time_limit_s, threads=threads)
        self.m.solve(solver)
        st = pulp.LpStatus[self.m.status]
        obj = pulp.value(self.m.objective)
        # PuLP's status says "Optimal" also for a solver stopped at its time limit with a solution;
        # the solution status tells a proven optimum from a merely feasible one
        proven = getattr(self.m, "sol_status", pulp.LpSolutionOptimal) == pulp.LpSolutionOptimal
        if st == "Optimal" and proven:
            return STATUS_OPTIMAL, float(obj), float(obj)
        if obj is not None and st in ("Optimal", "Not Solved"):
            return STATUS_FEASIBLE, float(obj), float("nan")
        return (STATUS_INFEASIBLE if st == "Infeasible" else STATUS_NOT_SOLVED), float("nan"), float("nan")

    @staticmethod
    def value(v):
        return v.value() or 0.0


BACKENDS = {"scip": lambda: _OrTools("SCIP"), "cp-sat": lambda: _OrTools("CP-SAT"),
            "highs": lambda: _Pulp("HiGHS"), "cbc": lambda: _Pulp("CBC")}


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
        sol = Solution(grid(X), grid(Y), grid(U), grid(D), grid(V), np.array([max(val(s), 0.0) for s in S]),
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
    import itertools

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
    import itertools

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


def object_model(name: str) -> tuple[str, str | None, str]:
    """("w" or "kv", program or None, model) of a MILP object name (`w:MODEL@G` or
    `kv:PROGRAM:MODEL@G`, G the GPU group as `0-1`)."""
    kind, rest = name.split(":", 1)
    rest = rest.rsplit("@", 1)[0]
    if kind == "kv":
        prog, model = rest.rsplit(":", 1)
        return kind, prog, model
    return kind, None, rest


def _group_name(g: tuple[int, ...]) -> str:
    return "-".join(str(i) for i in g)


def build_instance(cluster, catalog, trace, cost, max_slots: int | None = None, lam: float = 1e-12,
                   hot_touch: float = 0.5, replicas: int = 2) -> tuple[Instance, dict]:
    """The MILP instance of a whole trace. Slots are aligned to call arrivals of the zero-stall
    timeline: one slot per distinct arrival time, or `max_slots` cut at arrival quantiles; a call
    spans the slots from its arrival to its end there. Each model gets up to `replicas` candidate
    GPU groups, spread like homes (largest models first, each replica onto the fitting group with
    most HBM left); its object on a group is its dense weights plus the expert pages a call
    touches with P >= `hot_touch`. A program's KV for a model is an object per candidate group,
    from that model's first call in the program to the program's end; its "NVMe" restore is a
    recompute. A call's options are the candidate groups (weights and KV there), chosen once per
    program and model, and waiting (stall: its zero-stall duration plus a cold load of its
    weights). Returns (instance, index) where index maps names back to trace entities."""
    from ..traces.timeline import nominal_timeline
    from ..core.costs import page_touch_probs

    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    tl = nominal_timeline(trace, catalog)
    calls = sorted(((tl[(p.program, n.id)][0], p.program, n.id, n) for p in trace.programs for n in p.nodes
                    if n.kind == "call" and (p.program, n.id) in tl), key=lambda c: (c[0], c[1], c[2]))
    times = np.array([c[0] for c in calls]) if calls else np.zeros(1)  # no call: one empty slot
    if max_slots is None:
        edges = np.unique(times)
    else:
        edges = np.unique(np.quantile(times, np.linspace(0, 1, max_slots + 1)[:-1], method="lower"))
    end = max((e for (_, e) in tl.values()), default=0.0)
    bounds = np.append(edges, max(end, edges[-1] + 1.0))
    slot_s = tuple(float(x) for x in np.diff(bounds))
    slot_of = lambda t: int(np.searchsorted(edges, t, side="right") - 1)  # noqa: E731
    T = len(slot_s)
    gpus = cluster.gpus
    left = [cluster.usable_hbm_bytes(g) for g in gpus]
    homes: dict[str, list] = {}
    objs, index = [], {"objects": [], "calls": [], "homes": homes}
    max_kv: dict[str, float] = {}  # a home must hold the model with its largest call's KV
    for _, _, _, n in calls:
        kv = (n.context_tokens + n.output_tokens) * catalog.by_name[n.model].kv_bytes_per_token
        max_kv[n.model] = max(max_kv.get(n.model, 0.0), kv)
    w_index: dict[tuple, int] = {}
    for r in range(replicas):
        for m in sorted(catalog.models, key=lambda m: (-m.total_bytes, m.name)):
            if r > 0 and m.name not in homes:
                continue
            hot = int((page_touch_probs(m.moe) >= hot_touch).sum()) if m.moe else 0
            nbytes = m.dense_bytes + hot * (m.moe.page_bytes if m.moe else 0.0)
            need = (nbytes + max_kv.get(m.name, 0.0)) / m.tp
            taken = {i for g in homes.get(m.name, ()) for i in g}
            fit = [g for g in cluster.groups(m.tp) if not taken & set(g)
                   and all(need <= cluster.usable_hbm_bytes(gpus[i]) for i in g)]
            if not fit:
                continue
            g = max(fit, key=lambda g: (min(left[i] for i in g), [-i for i in g]))
            for i in g:
                left[i] -= nbytes / m.tp
            homes.setdefault(m.name, []).append(g)
            node = gpus[g[0]].node
            extra = nbytes - m.dense_bytes
            w_index[(m.name, g)] = len(objs)
            objs.append(Obj(f"w:{m.name}@{_group_name(g)}", g, node, nbytes,
                            cost.weights_restore_s(m, "host", node, g, extra),
                            cost.weights_restore_s(m, "nvme", node, g, extra), (0, T - 1)))
    prog_end = {}
    for p in trace.programs:
        ends = [tl[(p.program, n.id)][1] for n in p.nodes if (p.program, n.id) in tl]
        prog_end[p.program] = slot_of(max(ends)) if ends else 0
    kv_calls: dict[tuple, list] = {}
    for t0, prog, nid, n in calls:
        kv_calls.setdefault((prog, n.model), []).append((slot_of(t0), nid, n))
    kv_index: dict[tuple, int] = {}
    for (prog, model), cs in sorted(kv_calls.items()):
        m = catalog.by_name[model]
        tokens = max(n.context_tokens + n.output_tokens for _, _, n in cs)
        nbytes = tokens * m.kv_bytes_per_token
        first = cs[0][0]
        for g in homes.get(model, ()):
            kv_index[(prog, model, g)] = len(objs)
            recompute = cost.prefill_s(m, tokens, g)
            # from DRAM: onboard it, or recompute it where that is quicker (R^h <= R^n, as (6) assumes)
            objs.append(Obj(f"kv:{prog}:{model}@{_group_name(g)}", g, gpus[g[0]].node, nbytes,
                            min(cost.group_transfer_s(nbytes, "host", gpus[g[0]].node, g), recompute), recompute,
                            (first, max(first, prog_end[prog]))))
    affinities: dict[tuple, int] = {}
    out_calls = []
    for t0, prog, nid, n in calls:
        groups = homes.get(n.model)
        if not groups:
            continue
        first = (prog, n.model) not in affinities
        a = affinities.setdefault((prog, n.model), len(affinities))
        options = [(w_index[(n.model, g)], kv_index[(prog, n.model, g)]) for g in groups]
        produces = tuple(kv_index[(prog, n.model, g)] for g in groups) if first else ()
        t1 = tl[(prog, nid)][1]
        wait_s = (t1 - t0) + max(objs[w_index[(n.model, g)]].restore_nvme_s for g in groups)
        out_calls.append(Call(f"{prog}/{nid}", slot_of(t0), options[0], produces,
                              end=max(slot_of(t0), slot_of(max(t0, t1 - 1e-9))), alts=tuple(options[1:]),
                              affinity=a, wait_s=wait_s))
        index["calls"].append((prog, nid))
    nodes = {nd.name: nd for nd in cluster.nodes}
    inst = Instance(slot_s=slot_s, objects=tuple(objs), calls=tuple(out_calls),
                    hbm=tuple(cluster.usable_hbm_bytes(g) for g in gpus),
                    h2d=tuple(cost.link_bw[f"h2d:{g.id}"] for g in gpus),
                    dram={n: nd.host_dram_gb * 1e9 for n, nd in nodes.items()},
                    root={n: cost.link_bw[f"root:{n}"] for n in nodes},
                    nvme={n: cost.link_bw[f"nvme_r:{n}"] for n in nodes}, lam=lam)
    index["objects"] = [o.name for o in objs]
    index["slot_starts"] = [float(x) for x in edges]
    return inst, index


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


def oracle_summary(cluster, catalog, trace, cost, window: int = 24, overlap: int = 8, backend: str = "scip",
                   time_limit_s: float = 10.0, progress=None, warm_start: bool = True, replicas: int = 2,
                   guide_from=None) -> dict:
    """Solve a trace window by window and summarise it: the §8 `oracle` block, the instance's
    size, the stall distributions of the schedule, every window and the checker's findings."""
    from ..models.report import Dist
    from ..traces.graph import handoff_calls

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
