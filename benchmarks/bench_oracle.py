"""The closed-loop comparison: the replayed MILP `oracle` against `statebudget-lease`,
`static` and `lru-keepwarm` on hetero16 + agent-team, 2-hour traces, seeds 1-3 (simulator seed =
trace seed), handoff-stall P95 per seed and the oracle's solve.

    .venv/bin/python benchmarks/bench_oracle.py [--traces swe-team,swe-team-shuffled] [--json out/bench_oracle.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from statebudget.models.load import load_catalog, load_cluster
from statebudget.sim.config import SimConfig
from statebudget.sim.runner import replay
from statebudget.traces.generators import generate

POLICIES = ["statebudget-lease", "oracle", "static", "lru-keepwarm"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default="swe-team,swe-team-shuffled")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    out = {}
    for preset in args.traces.split(","):
        rows = {}
        for seed in (int(s) for s in args.seeds.split(",")):
            rep = replay(cl, cat, generate(preset, seed, args.hours), POLICIES, SimConfig(seed=seed)).report
            rows[seed] = {p: r.handoff_stall_s.p95 for p, r in rep.policies.items()}
            rows[seed]["oracle_solve"] = rep.oracle.model_dump()
            print(preset, seed, {p: round(v, 3) for p, v in rows[seed].items() if p in POLICIES},
                  f"solve {rep.oracle.solve_s:.1f} s gap {rep.oracle.gap:.1e}", flush=True)
        mean = {p: float(np.mean([r[p] for r in rows.values()])) for p in POLICIES}
        per_seed = {p: [round(r[p] / r["oracle"], 2) for r in rows.values()] for p in ("statebudget-lease", "static")}
        print(f"{preset}: mean P95 " + ", ".join(f"{p} {v:.2f} s" for p, v in mean.items())
              + f"; lease / oracle per seed {per_seed['statebudget-lease']}; static / oracle {per_seed['static']}")
        out[preset] = {"per_seed": rows, "mean_p95": mean, "vs_oracle_per_seed": per_seed}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
