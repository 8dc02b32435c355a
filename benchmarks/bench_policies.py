"""The policy comparison: every policy on hetero16 + agent-team, `swe-team` and
`swe-team-shuffled`, 2 hours, seeds 1-3, side by side in one run.

    .venv/bin/python benchmarks/bench_policies.py [--hours 2] [--seeds 1,2,3] [--json out/bench_policies.json]

Prints, per trace, the mean over seeds of each metric and the ratios the issue asks for:
statebudget-lease handoff-stall P95 against the best of the reactive baselines, its warm tax
against static's, its lease-lateness P99 against prefetch-all's and frequency's, its wasted bytes
against prefetch-all's, its non-lease TTFT P99 against ondemand's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from statebudget.models.load import load_catalog, load_cluster
from statebudget.policies import REGISTRY
from statebudget.sim.config import SimConfig
from statebudget.sim.runner import replay
from statebudget.traces.generators import generate

REACTIVE = ["ondemand", "lru-keepwarm", "frequency", "static", "llama-swap", "ray-multiplex"]
METRICS = {
    "handoff_p95": lambda r: r.handoff_stall_s.p95,
    "handoff_p99": lambda r: r.handoff_stall_s.p99,
    "stall_mean": lambda r: r.stall_s.mean,
    "lease_late_p99": lambda r: r.lease_lateness_s.p99,
    "nonlease_ttft_p99": lambda r: r.nonlease_ttft_s.p99,
    "warm_tax": lambda r: r.warm_tax,
    "wasted_tb": lambda r: r.wasted_bytes / 1e12,
    "moved_tb": lambda r: r.bytes_moved / 1e12,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    policies = list(REGISTRY)
    out = {}
    for preset in ("swe-team", "swe-team-shuffled"):
        per_seed = {}
        for seed in seeds:
            rep = replay(cl, cat, generate(preset, seed, args.hours), policies, SimConfig(seed=seed)).report
            per_seed[seed] = {p: {k: f(r) for k, f in METRICS.items()} for p, r in rep.policies.items()}
        mean = {p: {k: float(np.mean([per_seed[s][p][k] for s in seeds])) for k in METRICS} for p in policies}
        ours = mean["statebudget-lease"]
        best = min(REACTIVE, key=lambda p: mean[p]["handoff_p95"])
        ratios = {
            "best_reactive": best,
            "handoff_p95_vs_best_reactive": ours["handoff_p95"] / mean[best]["handoff_p95"],
            "warm_tax_vs_static": ours["warm_tax"] / mean["static"]["warm_tax"],
            "lease_late_p99_vs_prefetch_all": ours["lease_late_p99"] / mean["prefetch-all"]["lease_late_p99"],
            "lease_late_p99_vs_frequency": ours["lease_late_p99"] / mean["frequency"]["lease_late_p99"],
            "wasted_vs_prefetch_all": ours["wasted_tb"] / max(mean["prefetch-all"]["wasted_tb"], 1e-12),
            "nonlease_ttft_p99_vs_ondemand": ours["nonlease_ttft_p99"] / mean["ondemand"]["nonlease_ttft_p99"],
            "statebudget_handoff_p95_vs_frequency": mean["statebudget"]["handoff_p95"] / mean["frequency"]["handoff_p95"],
        }
        out[preset] = {"per_seed": per_seed, "mean": mean, "ratios": ratios}
        print(f"\n## {preset} (hetero16 + agent-team, {args.hours} h, seeds {args.seeds}; mean over seeds)\n")
        print("| policy | " + " | ".join(METRICS) + " |")
        print("|---|" + "---|" * len(METRICS))
        for p in policies:
            print(f"| {p} | " + " | ".join(f"{mean[p][k]:.3f}" for k in METRICS) + " |")
        print()
        for k, v in ratios.items():
            print(f"- {k}: {v if isinstance(v, str) else round(v, 3)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
