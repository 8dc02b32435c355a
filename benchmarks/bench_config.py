"""statebudget-lease with overrides of its `PlannerConfig` (`lease_config`): hetero16 + agent-team, 2-hour traces,
seeds 1-3 (simulator seed = trace seed). The P95 / wasted-bytes frontier and the stall /
TTFT trade-off of placement come from it.

    .venv/bin/python benchmarks/bench_config.py "promote_min_p=1.01, page_min_touch=1.01" [--trace swe-team]

Prints, per seed, handoff-stall P95, wasted bytes, warm tax, TTFT P95, SLO violations, non-lease
TTFT P99 and lease-lateness P99.
"""

from __future__ import annotations

import argparse
import ast

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
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--hours", type=float, default=2.0)
    args = ap.parse_args()
    kw = parse_overrides(args.overrides)
    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    for seed in (int(s) for s in args.seeds.split(",")):
        tr = generate(args.trace, seed, args.hours)
        res = Simulator(cl, cat, tr, StateBudgetLease(lease_config(**kw)), cost=CostModel(cl, cat),
                        config=SimConfig(seed=seed)).run()
        b = policy_report(res, tr.header.slo_classes, nominal_timeline(tr, cat))
        print(f"{args.trace} seed {seed} {kw}: handoff p95 {b.handoff_stall_s.p95:.3f} s, wasted "
              f"{b.wasted_bytes / 1e12:.3f} TB, warm tax {b.warm_tax:.3f}, TTFT p95 {b.ttft_s.p95:.2f} s, "
              f"SLO violations {b.slo_violations:.3f}, non-lease TTFT p99 "
              f"{b.nonlease_ttft_s.p99:.2f} s, lease lateness p99 {b.lease_lateness_s.p99:.2f} s", flush=True)


if __name__ == "__main__":
    main()
