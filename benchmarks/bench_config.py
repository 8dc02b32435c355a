"""statebudget-lease with overrides of its `PlannerConfig` (`lease_config`): hetero16 + agent-team, 2-hour traces,
tuning seeds 1-10 (simulator seed = trace seed), warm start with a 1800 s warm-up, seeds on a
process pool. Seeds >= 100 are for evaluation (`bench_policies.py`), never for tuning. The P95 / wasted-bytes frontier and the stall /
TTFT trade-off of placement come from it.

    .venv/bin/python benchmarks/bench_config.py "promote_min_p=1.01, page_min_touch=1.01" [--trace swe-team] [--load 3]

Prints, per seed, handoff-stall P95, wasted bytes, warm tax, TTFT P95, SLO violations, non-lease
TTFT P99 and lease-lateness P99.
"""

from __future__ import annotations

import argparse
import ast
from concurrent.futures import ProcessPoolExecutor

from statebudget.models.load import load_catalog, load_cluster
from statebudget.planner.core import lease_config
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.sim.metrics import policy_report
from statebudget.policies.ours import StateBudgetLease
from statebudget.core.costs import CostModel
from statebudget.traces.generators import generate
from statebudget.traces.timeline import nominal_timeline


def parse_overrides(text: str) -> dict:
    """"a=1, b=0.5" -> {"a": 1, "b": 0.5} (literals only)."""
    call = ast.parse(f"f({text})", mode="eval").body
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("overrides", nargs="?", default="", help='PlannerConfig fields, e.g. "promote_min_p=1.01"')
    ap.add_argument("--trace", default="swe-team")
    ap.add_argument("--seeds", default="1,2,3,4,5,6,7,8,9,10")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--start", default="warm", choices=("warm", "cold"))
    ap.add_argument("--warmup", type=float, default=1800.0)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--load", type=float, default=1.0, help="multiplies the preset's program arrival rate")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    if any(s >= 100 for s in seeds):
        ap.error("seeds >= 100 are evaluation seeds: tune on 1-10")
    kw = parse_overrides(args.overrides)
    jobs = [(args.trace, seed, args.hours, args.start, args.warmup, kw, args.load) for seed in seeds]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        rows = list(pool.map(_one, jobs))
    for seed, b in zip(seeds, rows):
        print(f"{args.trace} seed {seed} {kw}: handoff p95 {b['p95']:.3f} s, total stall {b['total']:.0f} s, wasted "
              f"{b['wasted']:.3f} TB, warm tax {b['warm_tax']:.3f}, TTFT p95 {b['ttft']:.2f} s", flush=True)
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    print(f"MEAN {args.trace} {kw}: handoff p95 {mean['p95']:.3f} s, total stall {mean['total']:.0f} s, wasted "
          f"{mean['wasted']:.3f} TB, warm tax {mean['warm_tax']:.3f}, TTFT p95 {mean['ttft']:.2f} s")


def _one(job) -> dict:
    trace, seed, hours, start, warmup, kw, load = job
    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    tr = generate(trace, seed, hours, load=load)
    res = Simulator(cl, cat, tr, StateBudgetLease(lease_config(**kw)), cost=CostModel(cl, cat),
                    config=SimConfig(seed=seed, start=start, warmup_s=warmup)).run()
    b = policy_report(res, tr.header.slo_classes, nominal_timeline(tr, cat))
    return {"p95": b.handoff_stall_s.p95, "total": b.stall_total_s, "wasted": b.wasted_bytes / 1e12,
            "warm_tax": b.warm_tax, "ttft": b.ttft_s.p95}


if __name__ == "__main__":
    main()
