"""Online tracks offline: every `replan_s` seconds a MILP over the next horizon, built from the
forecast alone, gives the target home of each model's engine, weights and hot expert pages
(`solvers/target.py`); between solves the greedy step (`core.py`) repairs toward it on every event.

The forecast of model m: its call rate λ_m, the larger of an EWMA of arrivals over the solve
windows and the calls the live programs are expected to make within the planner's horizon (the
switch matrix and the tool-wait model, `Predictor.need_within`). No future knowledge: only what
arrived, what live programs are doing, and their hints where the policy takes hints.

The one objective, per second of the horizon, of model m ready on group g:

    value(m, g) = λ_m x ( min over g' of restore_s(m, g') - ttft_weight x (prefill_s(m, ctx_m, g) - best prefill_s) )
                  - (m not on g now, nor its target) x move_price x restore_s(m, g) / replan_s

a call's expected TTFT saved on the group it would run on (the restore it would otherwise wait
for, on the group where that is cheapest: a wake where its engine is held or sleeps, else a cold
start; less the prefill it loses on a slower group, at the model's mean context so far), less a
move's cost spread over the interval. A solve is charged `charge_s` of simulated time (at least its time limit) before
its target takes effect: it runs off the event path, on the state of the moment it started.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..core.costs import touched_pages
from ..models.state import weights_key
from ..solvers.target import TargetProblem, solve_target


@dataclass
class TrackConfig:
    replan_s: float = 60.0       # R: how often the MILP re-plans
    charge_s: float = 1.0        # simulated time a solve takes before its target applies (>= time limit)
    time_limit_s: float = 1.0
    alpha: float = 0.5           # EWMA weight of the latest window's arrival rate
    ttft_weight: float = 1.0     # prefill seconds lost on a slow group, against restore seconds
    move_price: float = 3.0      # a move costs this many restores, spread over the interval
    share: float = 1.0           # share of the cluster's HBM the target may hold
    gpu_share: float = 0.45      # share of each GPU's HBM (less the KV on it) the target may hold
    page_min_touch: float = 0.2  # expert pages that travel with a model's weights
    target_p: float = 1.0        # a target model counts as needed at least this likely (1: kept for sure)
    # The target's group homes a target model with no copy. Off: the target says which models to
    # keep ready, the greedy step where (held copy, asleep engine, `homes.home_of`). On hetero16 the
    # share holds only the 7-8B models, and only on the L40/A100 GPUs that coder, reviewer and the
    # MoE models (which the MILP does not see) need: homed there they evict those (seeds 1-10).
    target_homes: bool = False


class TargetTracker:
    def __init__(self, catalog, cost, cfg: TrackConfig | None = None):
        self.catalog, self.cost = catalog, cost
        self.cfg = cfg or TrackConfig()
        if self.cfg.charge_s < self.cfg.time_limit_s:
            raise ValueError(f"charge_s ({self.cfg.charge_s}) must be at least time_limit_s ({self.cfg.time_limit_s})")
        self.models = [m.name for m in catalog.models]
        self.count: Counter = Counter()
        self.rate: dict[str, float] = {}
        self.ctx: dict[str, float] = {}
        self.last_solve: float | None = None
        self.pending: tuple[float, dict] | None = None
        self.active: dict[str, tuple] = {}
        self.solves: list[dict] = []
        self._pages = {m.name: touched_pages(m, self.cfg.page_min_touch) for m in catalog.models}

    def call_arrived(self, model: str, context_tokens: float) -> None:
        self.count[model] += 1
        prev = self.ctx.get(model)
        self.ctx[model] = context_tokens if prev is None else 0.8 * prev + 0.2 * context_tokens

    def target(self, now: float) -> dict[str, tuple]:
        """model -> its target group, as of the last solve whose charge has passed."""
        if self.pending is not None and now >= self.pending[0]:
            self.active = self.pending[1]
            self.pending = None
        return self.active

    def replan(self, view, live_calls: np.ndarray, live_horizon_s: float, now: float) -> dict:
        """One solve on the state now, in line (the simulator): its target applies from
        now + charge_s. `live_calls[m]`: the calls live programs are expected to make to model m
        within `live_horizon_s`."""
        prob = self.prepare(view, live_calls, live_horizon_s, now)
        return self.adopt(prob, solve_target(prob, self.cfg.time_limit_s), now, now + self.cfg.charge_s)

    def prepare(self, view, live_calls: np.ndarray, live_horizon_s: float, now: float) -> TargetProblem:
        """The rates move on and the problem is built from the books: the part that must hold the
        books still. `solve_target` on it may then run anywhere (the service: a worker thread)."""
        cfg = self.cfg
        dt = cfg.replan_s if self.last_solve is None else max(now - self.last_solve, 1e-9)
        for name in self.models:
            r = self.count[name] / dt
            self.rate[name] = r if name not in self.rate else cfg.alpha * r + (1 - cfg.alpha) * self.rate[name]
        self.count.clear()
        self.last_solve = now
        return self.problem(view, live_calls, live_horizon_s)

    def adopt(self, prob: TargetProblem, sol, now: float, at: float) -> dict:
        """The solve's target becomes the one tracked from `at` on."""
        target = {self.models[prob.model[i]]: prob.groups[i] for i in sol.chosen}
        self.pending = (at, target)
        rec = {"t": now, "status": sol.status, "solve_s": sol.solve_s, "objective": sol.objective,
               "bound": sol.bound, "options": len(prob.model), "models": len(target)}
        self.solves.append(rec)
        del self.solves[:-1000]  # a live planner runs for months
        return rec

    def problem(self, view, live_calls: np.ndarray, live_horizon_s: float) -> TargetProblem:
        cfg, cost, tiers = self.cfg, self.cost, view.tiers
        n_gpu = len(tiers.hbm_cap)
        cap = np.asarray(tiers.hbm_cap, float) * cfg.gpu_share
        for (key, group), c in tiers.gpu.items():
            if key[0] == "kv":
                for i in group:
                    cap[i] -= c.per_gpu
        for group, b in tiers.private.values():
            for i in group:
                cap[i] -= b
        cap = np.maximum(cap, 0.0)
        model, groups, per_gpu, value = [], [], [], []
        for mi, m in enumerate(self.catalog.models):
            lam = max(self.rate.get(m.name, 0.0), float(live_calls[mi]) / live_horizon_s)
            if lam <= 0:
                continue
            wk = weights_key(m.name)
            pages = len(self._pages[m.name]) * (m.moe.page_bytes if m.moe else 0.0)
            opts = [g for g in view.model_groups(m)
                    if (m.dense_bytes + pages) / len(g) + max(tiers.engine_overhead[i] for i in g) <= min(cap[i] for i in g)]
            if not opts:
                continue
            ctx = self.ctx.get(m.name, 0.0)
            prefill = {g: cost.prefill_s(m, ctx, g) for g in opts}
            best = min(prefill.values())
            held = tiers.groups_of.get(wk, ())

            def restore_s(g, on):
                node = view.gpus[g[0]].node
                return cost.weights_restore_s(m, "host", node, g, extra_bytes=pages,
                                              wake=on or tiers.asleep_on(wk, g))

            # What being ready saves a call: the restore it would otherwise wait for, where it
            # would go without the target (a wake where its engine is held or sleeps, else a cold
            # start), whichever group the target picks. Not the restore onto g: that would value
            # most the groups where the model is cold, and a move there is what the target pays.
            saved = min(restore_s(g, g in held) for g in view.model_groups(m))
            for g in opts:
                on = g in held or self.active.get(m.name) == g
                restore = restore_s(g, on)
                v = lam * (saved - cfg.ttft_weight * (prefill[g] - best))
                if not on:
                    v -= cfg.move_price * restore / cfg.replan_s
                model.append(mi)
                groups.append(g)
                per_gpu.append((m.dense_bytes + pages) / len(g) + max(tiers.engine_overhead[i] for i in g))
                value.append(v)
        return TargetProblem(model, groups, np.asarray(per_gpu, float), np.asarray(value, float), cap,
                             total=cfg.share * float(np.sum(tiers.hbm_cap)))


def summary(solves: list[dict]) -> dict:
    """What a run's solves cost and how they ended: counts by status, solve seconds p50/p99/max/total."""
    if not solves:
        return {"solves": 0}
    s = np.asarray([r["solve_s"] for r in solves])
    return {"solves": len(solves), "status": dict(Counter(r["status"] for r in solves)),
            "solve_s": {"p50": float(np.percentile(s, 50)), "p99": float(np.percentile(s, 99)),
                        "max": float(s.max()), "total": float(s.sum())},
            "models_mean": float(np.mean([r["models"] for r in solves]))}

