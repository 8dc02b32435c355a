"""Where statebudget-lease's wasted bytes come from (an unmet goal: at most 25 % of
prefetch-all's), and the P95 / wasted-bytes frontier of the two knobs that make most of them.

    .venv/bin/python benchmarks/bench_waste.py [--trace swe-team] [--seeds 1,2,3] [--config "promote_min_p=0.9"] [--grid]

Wasted bytes (DESIGN.md) are bytes promoted into HBM for copies evicted or cancelled before any
use. Each wasted copy is put in one class:
  - what asked for it: a lease (`lease`), a planner promotion (`speculative`), a call (`demand`);
  - the kind of state: weights `w`, expert page `e`, KV `kv`;
  - who removed it: the planner's demotion (`planner`) or the mechanism making room for a call
    or a promotion (`room`), or a cancel;
  - what happened meanwhile: no call of its model ran (`no call`), one ran on its group and did
    not touch it (`same group`: an expert page the router skipped), or ran elsewhere (`elsewhere`).
`--grid` adds the frontier: `promote_min_p` (speculation) x `lease_page_min_touch` (the expert
pages a lease prepares), mean over seeds of handoff P95 and wasted bytes.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict

import numpy as np

from statebudget.models.load import load_catalog, load_cluster
from statebudget.planner.config import check_fields, lease_config
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.sim.metrics import policy_report
from statebudget.sim.sweep import parse_fields
from statebudget.policies import REGISTRY
from statebudget.policies.ours import StateBudgetLease
from statebudget.core.costs import CostModel
from statebudget.core.decisions import Cancel, Demote
from statebudget.traces.generators import generate
from statebudget.traces.timeline import nominal_timeline



class WasteSim(Simulator):
    """The simulator, classifying each wasted promotion as it is counted (behaviour unchanged)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.leased: dict[int, object] = {}  # id -> copy (held, so that ids are not reused)
        self.uses: dict[str, list] = defaultdict(list)  # model -> [(t, group)] of admitted calls
        self.by_class: Counter = Counter()
        self._remover = "room"

    def _prefetch(self, key, group, lease=None, **kw):
        ok = super()._prefetch(key, group, lease, **kw)
        c = self.tiers.gpu.get((key, group))
        if ok and lease is not None and c is not None:
            self.leased[id(c)] = c
        return ok

    def _admit(self, c):
        ok = super()._admit(c)
        if ok:
            self.uses[c.model].append((self.now, c.group))
        return ok

    def _apply(self, decisions):
        for d in decisions or ():
            self._remover = "planner" if isinstance(d, Demote) else "cancel" if isinstance(d, Cancel) else "room"
            super()._apply([d])
        self._remover = "room"

    def _count(self, copy, before):
        wasted = self.recorder.wasted_bytes - before
        if wasted <= 0:
            return
        origin = "lease" if id(copy) in self.leased else "speculative" if copy.from_prefetch else "demand"
        model = copy.key[2] if copy.key[0] == "kv" else copy.key[1]
        ran = [g for t, g in self.uses[model] if copy.created <= t <= self.now]
        meanwhile = "no call" if not ran else "same group" if copy.group in ran else "elsewhere"
        self.by_class[(origin, copy.key[0], self._remover, meanwhile)] += wasted

    def _evict(self, copy, to, **kw):
        before = self.recorder.wasted_bytes
        out = super()._evict(copy, to, **kw)
        self._count(copy, before)
        return out

    def _drop_gpu_copy(self, copy):
        before = self.recorder.wasted_bytes
        super()._drop_gpu_copy(copy)
        self._count(copy, before)

    def cancel_load(self, copy):
        before = self.recorder.wasted_bytes
        out = super().cancel_load(copy)
        self._count(copy, before)
        return out


def run(cl, cat, trace, seed, policy):
    sim = WasteSim(cl, cat, trace, policy, cost=CostModel(cl, cat), config=SimConfig(seed=seed))
    res = sim.run()
    return policy_report(res, trace.header.slo_classes, nominal_timeline(trace, cat)), sim.by_class


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="swe-team")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--config", default="", help='overrides of the lease defaults (planner.config.lease_config) for the breakdown, e.g. "promote_min_p=0.9"')
    args = ap.parse_args()
    try:
        overrides = parse_fields(args.config)
        check_fields(overrides)
    except ValueError as e:
        ap.error(f"--config {args.config!r}: {e}")
    cfg = lease_config(**overrides)
    seeds = [int(s) for s in args.seeds.split(",")]
    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    traces = {s: generate(args.trace, s, args.hours) for s in seeds}
    total, classes, pa = 0.0, Counter(), []
    for s in seeds:
        rep, by = run(cl, cat, traces[s], s, StateBudgetLease(cfg))
        total += rep.wasted_bytes
        classes.update(by)
        pa.append(run(cl, cat, traces[s], s, REGISTRY["prefetch-all"]())[0].wasted_bytes)
    n = len(seeds)
    print(f"{args.trace}, seeds {args.seeds}, {args.config or 'the lease defaults'}: statebudget-lease wastes {total / n / 1e12:.3f} TB a run, "
          f"prefetch-all {np.mean(pa) / 1e12:.3f} TB")
    print("| asked by | state | removed by | meanwhile | TB a run | share |\n|---|---|---|---|---|---|")
    for (origin, kind, remover, meanwhile), b in classes.most_common():
        print(f"| {origin} | {kind} | {remover} | {meanwhile} | {b / n / 1e12:.3f} | {b / total:.0%} |")
    sys.stdout.flush()
    if not args.grid:
        return
    print("\n| promote_min_p | lease_page_min_touch | handoff P95 s (per seed) | wasted TB (per seed) |\n|---|---|---|---|")
    for p in (0.35, 0.6, 0.8, 1.01):
        for t in (0.4, 0.7, 0.99):
            reps = [run(cl, cat, traces[s], s, StateBudgetLease(lease_config(promote_min_p=p, lease_page_min_touch=t)))[0]
                    for s in seeds]
            p95 = [r.handoff_stall_s.p95 for r in reps]
            w = [r.wasted_bytes / 1e12 for r in reps]
            print(f"| {p} | {t} | {np.mean(p95):.2f} ({', '.join(f'{x:.2f}' for x in p95)}) | "
                  f"{np.mean(w):.3f} ({', '.join(f'{x:.3f}' for x in w)}) |", flush=True)


if __name__ == "__main__":
    main()
