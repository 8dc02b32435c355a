"""A lower bound on total stall (DESIGN.md §4 `stall_total_s`, §8 `bound_total_stall_s`): the
optimum of a relaxation of the simulator's physics, solved with OR-Tools CP-SAT. Every schedule the
simulator can run is a feasible point of the relaxation, so no policy, the oracle's replay
included, comes out below it on the same trace and start.

The relaxation keeps, per call c with its choice of GPU group g (any group of its model's width on
which its weights and the KV it asks room for fit at all):
    arrive(c) = the program's start for a root, else the max over its dependencies of their end
        (a tool ends `duration` after it starts);
    ready(c) >= arrive(c);  ready(c) >= first(m): no engine exists at t = 0, so the first copy
        of model m anywhere needs its weights over a GPU's H2D link and a cold start;
    end(c) - ready(c) in [lo, hi]: lo is its decode and the prefill of the tokens its model never
        saw (reusing all the KV it could have); hi is the prefill of its whole context and its decode
        on g, plus the compute of every other call (and its KV recompute) that could share a GPU of g
        (a GPU's fair share delays c by at most the others' work: queueing and batching included).
    Two calls whose HBM needs on a shared GPU i (their weights' share, the KV they ask room for,
    each engine's overhead; one copy of the weights when the model is the same) exceed i's
    capacity do not hold i at once: one's [ready, end] precedes the other's, and when the
    earlier call's needs leave no room for the later model's weights, the later one's weights
    come in after the earlier ends: at least their share over i's H2D link, plus a wake-up or
    cold start unless another GPU could hold a copy to take them from.
Everything else (link sharing, KV restores, expert pages, eviction, the admission order, three-way
HBM conflicts) is relaxed away, which is what makes it a bound and why it is loose where
contention is spread over many GPUs and programs.

Times are integers of `UNIT_S`; every lower side is rounded down and every upper side up, so the
floor of any real schedule's times is feasible, and each call's stall is taken as one unit less
than its integer stall (floor(r) - floor(a) <= r - a + 1 unit). Assumed: no call attempt fails
(`call_failure_rate` 0), and a GPU computes only calls and their KV recomputes (at most one per
call). Instances with more than `max_calls` calls get the relaxation without the pairwise HBM
terms and without interference (each call's stall >= first(m) - arrive where arrive is fixed:
a program's root calls), solved in closed form.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from ..core.costs import LATENCY_S, CostModel
from ..models.cluster import GB
from ..models.trace import Trace
from ..traces.graph import children_of, reachable

UNIT_S = 1e-3
_SLACK_B = 1.0  # bytes: the books' tolerance on a capacity check
HORIZON_UNITS = 10 ** 12


@dataclass(frozen=True)
class Bound:
    """`total_stall_s`: the bound; `status`: OPTIMAL (the relaxation solved to optimality),
    FEASIBLE (the solver's proven bound at its time limit: still valid), or CLOSED_FORM (too large
    for the pairwise model); `counted`: calls in it (those that surely count: not cancellable,
    of programs that start after the warm-up); `solve_s`; `schedule`: the relaxation's optimal point, per call
    (program, node) its group and ready and end times (s), for a replay to follow (empty in
    closed form)."""
    total_stall_s: float
    status: str
    counted: int
    solve_s: float
    schedule: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass
class _Call:
    key: tuple[str, str]
    model: str
    ctx: int
    out: int
    room: int           # the KV tokens the simulator allocates room for (context + requested)
    reuse: int          # most KV tokens of this program and model an earlier call can leave, <= ctx
    prior: int          # the KV tokens an earlier call of this program and model leaves (a recompute's size)
    groups: list[tuple[int, ...]]
    counted: bool
    cancellable: bool
    ancestors: frozenset


def _calls(trace: Trace, catalog, cost: CostModel, warmup_s: float) -> tuple[list[_Call], dict]:
    hbm = [cost.cluster.usable_hbm_bytes(g) for g in cost.cluster.gpus]
    ovh = [cost.cluster.gpu_kinds[g.kind].engine_overhead_gb * GB for g in cost.cluster.gpus]
    out = []
    for p in trace.programs:
        children = children_of(p)
        below = {n.id: reachable(children, n.id) - {n.id} for n in p.nodes}  # descendants
        anc = {n.id: {d for d in below if n.id in below[d]} for n in p.nodes}
        cancellable = set()
        for cz in p.cancel:  # what has ended when `at_after` ends (it, its ancestors) stays done
            cancellable |= ({cz.node} | below[cz.node]) - ({cz.at_after} | anc[cz.at_after])
        calls = [n for n in p.nodes if n.kind == "call"]
        # Any call of the program and model that is not a descendant may have ended first and
        # left its KV (sibling branches too): what a call can reuse, and what a recompute holds.
        left = {n.id: max((o.context_tokens + o.output_tokens for o in calls
                           if o.model == n.model and o.id != n.id and n.id not in anc[o.id]), default=0)
                for n in calls}
        unsure: set[str] = set()  # calls the simulator might find no room for at all, and their descendants
        for n in calls:
            m = catalog.by_name[n.model]
            pages = m.moe.pages * m.moe.page_bytes if m.moe else 0.0
            most = (m.dense_bytes + pages + max(left[n.id], n.context_tokens + n.requested_tokens)
                    * m.kv_bytes_per_token) / m.tp
            if not any(all(most + ovh[i] <= hbm[i] for i in g) for g in cost.cluster.model_groups(m)):
                unsure |= {n.id} | below[n.id]
        for n in calls:
            m = catalog.by_name[n.model]
            room = n.context_tokens + n.requested_tokens
            groups = [g for g in cost.cluster.model_groups(m)
                      if all((m.dense_bytes + room * m.kv_bytes_per_token) / m.tp + ovh[i] <= hbm[i] + _SLACK_B
                             for i in g)]
            prior = left[n.id]
            out.append(_Call((p.program, n.id), m.name, n.context_tokens, n.output_tokens, room,
                             min(prior, n.context_tokens), prior, groups,
                             p.start >= warmup_s and n.id not in unsure, n.id in cancellable,
                             frozenset((p.program, a) for a in anc[n.id])))
    return out, {"hbm": hbm, "ovh": ovh}


class _Physics:
    """The relaxation's constants from the cost model (seconds, bytes)."""

    def __init__(self, cost: CostModel, catalog, caps: dict):
        self.cost, self.catalog, self.hbm, self.ovh = cost, catalog, caps["hbm"], caps["ovh"]
        self.gpus = cost.cluster.gpus
        self.h2d = [cost.link_bw[f"h2d:{g.id}"] for g in self.gpus]
        self.kind = [cost.cluster.gpu_kinds[g.kind] for g in self.gpus]
        self.lat = min(LATENCY_S.values())

    def share(self, model: str) -> float:
        m = self.catalog.by_name[model]
        return m.dense_bytes / m.tp

    def need(self, c: _Call, i: int) -> float:
        m = self.catalog.by_name[c.model]
        return (m.dense_bytes + c.room * m.kv_bytes_per_token) / m.tp + self.ovh[i]

    def first(self, model: str, cold: bool) -> float:
        """The earliest a copy of `model` can be ready anywhere: no engine at t = 0, and from a cold
        start a model the cluster does not preload comes off its node's NVMe."""
        m = self.catalog.by_name[model]
        return min(self.first_on(model, g, cold) for g in self.cost.cluster.model_groups(m))

    def first_on(self, model: str, g, cold: bool) -> float:
        """A cold start of `model` on group g: its share over each GPU's H2D link (from a cold
        start, all its bytes off the node's NVMe unless the cluster preloads it), then the engine."""
        m = self.catalog.by_name[model]
        s = max(self.share(model) / self.h2d[i] for i in g)
        if cold and model not in self.cost.cluster.preload:
            s = max(s, m.dense_bytes / self.cost.link_bw[f"nvme_r:{self.gpus[g[0]].node}"])
        return s + self.lat + max(self.kind[i].cold_start_s for i in g)

    def switch_in(self, model: str, i: int) -> float:
        """The least time to bring `model`'s share onto GPU i: over i's H2D link, plus a wake-up or
        cold start unless a GPU outside i's group could hold a copy to copy from."""
        m = self.catalog.by_name[model]
        peer = any(i not in g for g in self.cost.cluster.model_groups(m)
                   if all(self.share(model) + self.ovh[j] <= self.hbm[j] for j in g))
        engine = 0.0 if peer else min(self.kind[i].wake_s, self.kind[i].cold_start_s)
        return self.share(model) / self.h2d[i] + self.lat + engine

    def lo(self, c: _Call, g) -> float:
        m = self.catalog.by_name[c.model]
        return self.cost.prefill_s(m, c.ctx - c.reuse, g) + self.cost.decode_s(m, c.out, c.ctx, g)

    def work(self, c: _Call, g) -> float:
        """The most GPU time c can take on g: its whole prefill, its decode, one KV recompute."""
        m = self.catalog.by_name[c.model]
        return self.cost.call_s(m, c.ctx, c.out, g) + self.cost.prefill_s(m, c.prior, g)

    def pair(self, a: _Call, b: _Call, i: int) -> tuple[bool, float]:
        """Whether a and b cannot hold GPU i at once, and the gap when b follows a."""
        same = a.model == b.model
        shared = self.share(a.model) + self.ovh[i] if same else 0.0
        if self.need(a, i) + self.need(b, i) - shared <= self.hbm[i] + _SLACK_B:
            return False, 0.0
        if same or self.need(a, i) + self.share(b.model) + self.ovh[i] <= self.hbm[i] + _SLACK_B:
            return True, 0.0
        return True, self.switch_in(b.model, i)


def _down(s: float) -> int:
    return int(math.floor(s / UNIT_S + 1e-9))


def _up(s: float) -> int:
    return int(math.ceil(s / UNIT_S - 1e-9))


def lower_bound(cluster, catalog, trace: Trace, cost: CostModel | None = None, warmup_s: float = 0.0,
                start: str = "warm", max_calls: int = 60, time_limit_s: float = 30.0, workers: int = 1) -> Bound:
    """The bound on `stall_total_s` for `trace` on `cluster` from `start` (DESIGN.md §4: `warm`,
    weights in host DRAM, or `cold`, on NVMe; no engine either way). A `warm` bound holds for a
    cold run too."""
    if start not in ("warm", "cold"):
        raise ValueError(f"lower_bound: start must be 'warm' or 'cold', got {start!r}")
    cold = start == "cold"
    cost = cost or CostModel(cluster, catalog)
    t0 = time.perf_counter()
    calls, caps = _calls(trace, catalog, cost, warmup_s)
    ph = _Physics(cost, catalog, caps)
    counted = [c for c in calls if c.counted and not c.cancellable and c.groups]
    if len(calls) > max_calls:
        return _closed_form(trace, counted, ph, cold, t0)
    m = cp_model.CpModel()
    H = HORIZON_UNITS

    def var(name):
        return m.NewIntVar(0, H, name)
    begin, end = {}, {}  # every node's start and end
    for p in trace.programs:
        for n in p.nodes:
            k = (p.program, n.id)
            begin[k], end[k] = var(f"s{k}"), var(f"e{k}")
    for p in trace.programs:
        for n in p.nodes:
            k = (p.program, n.id)
            if not n.after:
                m.Add(begin[k] == _down(p.start))
            else:
                m.AddMaxEquality(begin[k], [end[(p.program, d)] for d in n.after])
            if n.kind == "tool":
                m.Add(end[k] >= begin[k] + _down(n.duration))
                m.Add(end[k] <= begin[k] + _up(n.duration))
    ready, place = {}, {}
    for c in calls:
        k = c.key
        r = ready[k] = var(f"r{k}")
        m.Add(r >= begin[k])
        if not c.groups:  # never placeable: the simulator ends it unrun; nothing to bound
            continue
        m.Add(r >= _down(ph.first(c.model, cold)))
        zs = [m.NewBoolVar(f"z{k}{g}") for g in c.groups]
        m.AddExactlyOne(zs)
        for g, z in zip(c.groups, zs):
            place[(k, g)] = z
            others = sum(ph.work(o, og) for o in calls if o is not c and k not in o.ancestors
                         and o.key not in c.ancestors for og in [_slowest(ph, o, g)] if og is not None)
            m.Add(end[k] >= r + _down(ph.lo(c, g))).OnlyEnforceIf(z)
            m.Add(end[k] <= r + _up(ph.work(c, g) + others)).OnlyEnforceIf(z)
    pairs = [(a, b) for ai, a in enumerate(calls) for b in calls[ai + 1:]
             if a.groups and b.groups and not a.cancellable and not b.cancellable
             and (a.key[0], a.model) != (b.key[0], b.model)]  # one program's KV of a model is shared
    for a, b in pairs:
        order = None
        for ga in a.groups:
            for gb in b.groups:
                shared = set(ga) & set(gb)
                conflicts = [(ph.pair(a, b, i), ph.pair(b, a, i)) for i in shared]
                if not any(ab[0] for ab, _ in conflicts):
                    continue
                if order is None:
                    order = m.NewBoolVar(f"o{a.key}{b.key}")
                gap_ab = max(ab[1] for ab, _ in conflicts)
                gap_ba = max(ba[1] for _, ba in conflicts)
                both = [place[(a.key, ga)], place[(b.key, gb)]]
                m.Add(ready[b.key] >= end[a.key] + _down(gap_ab)).OnlyEnforceIf([order] + both)
                m.Add(ready[a.key] >= end[b.key] + _down(gap_ba)).OnlyEnforceIf([order.Not()] + both)
    _first_engines(m, ph, calls, ready, end, place, cold)
    stalls = []
    for c in counted:
        s = m.NewIntVar(0, H, f"t{c.key}")
        m.Add(s >= ready[c.key] - begin[c.key] - 1)
        stalls.append(s)
    m.Minimize(sum(stalls))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    # The disjunctions are enforced literals; their LP relaxation (level 2) is what proves the
    # optimum of small instances in well under a second where the default level stalls for minutes.
    solver.parameters.linearization_level = 2
    st = solver.Solve(m)
    if st == cp_model.OPTIMAL:
        status, units = "OPTIMAL", solver.ObjectiveValue()
    elif st == cp_model.FEASIBLE:
        status, units = "FEASIBLE", solver.BestObjectiveBound()
    else:  # no proof within the time limit: the closed form still holds
        return _closed_form(trace, counted, ph, cold, t0)
    # Cancellable calls are left out: the relaxation does not constrain where or when they run.
    schedule = {c.key: (g, solver.Value(ready[c.key]) * UNIT_S, solver.Value(end[c.key]) * UNIT_S)
                for c in calls if not c.cancellable for g in c.groups if solver.BooleanValue(place[(c.key, g)])}
    floor_s = _closed_form(trace, counted, ph, cold, t0).total_stall_s  # a FEASIBLE proof may be weaker
    return Bound(round(max(0.0, units * UNIT_S, floor_s), 6), status, len(counted), round(time.perf_counter() - t0, 3),
                 schedule)


def _first_engines(m, ph: "_Physics", calls: list[_Call], ready, end, place, cold: bool) -> None:
    """The first engine of each model starts cold on some group h, at some time S >= 0, and holds
    its weights' share of HBM there from S to S + its load: that window cannot overlap a call on
    a GPU of h whose needs leave no room for those weights, and no call of the model is ready
    before it ends. (Started ahead and put to sleep, it makes later loads wake-ups.)"""
    live = [c for c in calls if c.groups and not c.cancellable]
    windows = []  # (model, group, literal, start, load)
    for model in sorted({c.model for c in live}):
        mine = [c for c in live if c.model == model]
        spec = ph.catalog.by_name[model]
        hs = [h for h in ph.cost.cluster.model_groups(spec)
              if all(ph.share(model) + ph.ovh[i] <= ph.hbm[i] + _SLACK_B for i in h)]
        if not hs:
            continue
        s0 = m.NewIntVar(0, HORIZON_UNITS, f"first:{model}")
        picks = [m.NewBoolVar(f"first:{model}{h}") for h in hs]
        m.AddExactlyOne(picks)
        for h, ph_h in zip(hs, picks):
            load = _down(ph.first_on(model, h, cold))
            windows.append((model, h, ph_h, s0, load))
            for c in mine:
                m.Add(ready[c.key] >= s0 + load).OnlyEnforceIf(ph_h)
            for c1 in live:
                if c1.model == model:
                    continue
                for g1 in c1.groups:
                    shared = set(g1) & set(h)
                    if not any(ph.need(c1, i) + ph.share(model) + ph.ovh[i] > ph.hbm[i] + _SLACK_B for i in shared):
                        continue
                    before = m.NewBoolVar(f"fb:{model}{h}{c1.key}{g1}")
                    both = [ph_h, place[(c1.key, g1)]]
                    m.Add(s0 + load <= ready[c1.key]).OnlyEnforceIf([before] + both)
                    m.Add(s0 >= end[c1.key]).OnlyEnforceIf([before.Not()] + both)
    # Two first loads whose weights cannot share a GPU do not overlap there.
    for wi, (ma, ha, la, sa, pa) in enumerate(windows):
        for mb, hb, lb, sb, pb in windows[wi + 1:]:
            if ma == mb or not any(ph.share(ma) + ph.share(mb) + 2 * ph.ovh[i] > ph.hbm[i] + _SLACK_B
                                   for i in set(ha) & set(hb)):
                continue
            first_a = m.NewBoolVar(f"ff:{ma}{ha}{mb}{hb}")
            m.Add(sa + pa <= sb).OnlyEnforceIf([first_a, la, lb])
            m.Add(sb + pb <= sa).OnlyEnforceIf([first_a.Not(), la, lb])


def _slowest(ph: _Physics, o: _Call, g) -> tuple | None:
    """The group of `o` sharing a GPU with `g` on which it would compute longest (None: none)."""
    near = [og for og in o.groups if set(og) & set(g)]
    return max(near, key=lambda og: ph.work(o, og)) if near else None


def _closed_form(trace: Trace, counted: list[_Call], ph: _Physics, cold: bool, t0: float) -> Bound:
    """Root calls arrive at their program's start whatever the schedule: each stalls at least
    until its model's first copy can be ready."""
    starts = {p.program: p for p in trace.programs}
    total = 0.0
    for c in counted:
        p = starts[c.key[0]]
        node = next(n for n in p.nodes if n.id == c.key[1])
        if not node.after:
            total += max(0.0, _down(ph.first(c.model, cold)) - _up(p.start) - 1) * UNIT_S
    return Bound(round(total, 6), "CLOSED_FORM", len(counted), round(time.perf_counter() - t0, 3))
