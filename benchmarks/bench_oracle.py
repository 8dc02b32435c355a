"""The replayed `oracle` on fair ground (DESIGN.md §4): hetero16 + agent-team, 2-hour traces,
warm start with a 30-minute warm-up, evaluation seeds 100.. , beside the best online policies
of the fair table and the lower bound on total stall (`solvers/bound.py`).

    .venv/bin/python benchmarks/bench_oracle.py [--traces swe-team,mapreduce] [--seeds 100-102]
        [--json out/bench_oracle.json] [--tuning]   # --tuning: seeds 1-10 allowed, to judge a change

Per trace and seed: each policy's total stall and handoff-stall P95, the oracle's solve, the
bound, and where the replay is behind another policy, why (the report's `oracle.behind`); then
the means over seeds, and the oracle's calls and stall by how they were placed against its schedule.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench_policies import parse_seeds
from statebudget.models.load import load_catalog, load_cluster
from statebudget.sim.config import SimConfig
from statebudget.sim.runner import replay
from statebudget.traces.generators import generate

POLICIES = ["oracle", "forecast-prewarm", "sleep-swap", "statebudget", "statebudget-lease"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default="swe-team,mapreduce")
    ap.add_argument("--seeds", default="100,101,102")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=1800.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--tuning", action="store_true", help="allow seeds below 100 (tuning seeds 1-10)")
    args = ap.parse_args()
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as e:
        ap.error(f"--seeds {args.seeds!r}: {e}")
    if min(seeds) < 100 and not args.tuning:
        ap.error("figures come from evaluation seeds >= 100 (seeds 1-10 are for tuning: pass --tuning)")
    if args.tuning:
        print("TUNING SEEDS: not figures for docs", flush=True)
    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    out = {}
    for preset in args.traces.split(","):
        rows = {}
        for seed in seeds:
            cfg = SimConfig(seed=seed, start="warm", warmup_s=args.warmup)
            rep = replay(cl, cat, generate(preset, seed, args.hours), POLICIES, cfg).report
            rows[seed] = {p: {"stall_total_s": r.stall_total_s, "handoff_p95_s": r.handoff_stall_s.p95}
                          for p, r in rep.policies.items()}
            rows[seed]["oracle_solve"] = rep.oracle.model_dump()
            print(preset, seed, {p: (round(v["stall_total_s"], 1), round(v["handoff_p95_s"], 2))
                                 for p, v in rows[seed].items() if p in POLICIES},
                  f"bound {rep.oracle.bound_total_stall_s:.1f} s ({rep.oracle.bound_status}),"
                  f" MILP {rep.oracle.solve_s:.1f} s", flush=True)
            if rep.oracle.behind is not None:  # where the replay's calls ran against the schedule
                print("  " + rep.oracle.behind.why, flush=True)
        mean = {p: {k: float(np.mean([r[p][k] for r in rows.values()])) for k in ("stall_total_s", "handoff_p95_s")}
                for p in POLICIES}
        print(f"{preset}: means " + "; ".join(f"{p} total {v['stall_total_s']:.0f} s, P95 {v['handoff_p95_s']:.2f} s"
                                               for p, v in mean.items()), flush=True)
        behind = [r["oracle_solve"]["behind"] for r in rows.values() if r["oracle_solve"].get("behind")]
        if behind:  # summed over the seeds where the replay is behind
            calls = {k: sum(b["calls"][k] for b in behind) for k in behind[0]["calls"]}
            stall = {k: sum(b["stall_s"][k] for b in behind) for k in behind[0]["stall_s"]}
            n, total = sum(calls.values()), sum(stall.values())
            print(f"{preset}: the replay is behind on {len(behind)} of {len(rows)} seeds; there, of its calls / "
                  "stall: " + ", ".join(f"{k} {calls[k] / n:.0%} / {stall[k] / total:.0%}" for k in calls), flush=True)
        out[preset] = {"per_seed": rows, "mean": mean}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
