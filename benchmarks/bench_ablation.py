"""Ablations of the online planner (`statebudget` or `statebudget-lease`) on hetero16 + agent-team,
2-hour traces, seeds 1-3: which part of the planner the gain comes from.

    .venv/bin/python benchmarks/bench_ablation.py [--policy statebudget] [--traces swe-team,swe-team-shuffled]
"""

from __future__ import annotations

import argparse

import numpy as np

from statebudget.models.load import load_catalog, load_cluster
from statebudget.planner.config import PlannerConfig
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.sim.metrics import policy_report
from statebudget.policies.ours import StateBudget, StateBudgetLease
from statebudget.traces.generators import generate

VARIANTS = {
    "default": {},
    "no host staging": {"stage_host": False},
    "1-call lookahead": {"lookahead": 1},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="statebudget", choices=["statebudget", "statebudget-lease"])
    ap.add_argument("--traces", default="swe-team,swe-team-shuffled")
    ap.add_argument("--seeds", default="1,2,3")
    args = ap.parse_args()
    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    cls = StateBudget if args.policy == "statebudget" else StateBudgetLease
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"| variant ({args.policy}) | " + " | ".join(args.traces.split(",")) + " |")
    print("|---|" + "---|" * len(args.traces.split(",")))
    traces = {(t, s): generate(t, s, 2.0) for t in args.traces.split(",") for s in seeds}
    for name, cfg in VARIANTS.items():
        cells = []
        for t in args.traces.split(","):
            p95 = []
            for s in seeds:
                tr = traces[(t, s)]
                res = Simulator(cl, cat, tr, cls(PlannerConfig(**cfg)), config=SimConfig(seed=s)).run()
                p95.append(policy_report(res, tr.header.slo_classes).handoff_stall_s.p95)
            cells.append(f"{np.mean(p95):.2f} s")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
