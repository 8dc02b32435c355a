"""Failed call attempts and attained service (seed 003 §16, §26): call attempts fail with
chance P while they run and are retried. Under plas, a retry keeps the service its program had
(`keep`, the simulator's rule) or starts again from none, as a retry under a new program id would
(`reset`, the ablation). Seed 003 §16 says that reset lets failing programs jump the queue at the
others' expense. This measures it: hetero16 + agent-team, a 1-hour mixed-tenants trace at 4x with
4 calls a GPU (calls queue for a batch slot), paired seed by seed.

    python benchmarks/bench_failures.py [--seeds 1,2,3,4,5,6] [--rate 0.2] [--load 4] [--json out/bench_failures.json]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from paired import fmt, paired_change, save, series
from statebudget.models.load import load_catalog, load_cluster
from statebudget.sim.config import SimConfig
from statebudget.sim.runner import replay
from statebudget.traces.generators import generate

VARIANTS = {"fcfs": ("statebudget", True), "plas keep": ("statebudget:plas", True),
            "plas reset": ("statebudget:plas", False)}


def run(args) -> list[dict]:
    seed, rate, load, hours = args
    tr = generate("mixed-tenants", seed, hours, load=load)
    rows = []
    for name, (spec, keep) in VARIANTS.items():
        cfg = SimConfig(seed=seed, max_batch=4, call_failure_rate=rate, retry_keeps_service=keep)
        rep = replay(load_cluster("hetero16"), load_catalog("agent-team"), tr, [spec], cfg)
        b, res = rep.report.policies[spec], rep.results[spec]
        failed = {c.program for c in res.calls if c.attempt > 0}
        lat = {p: pr.end - pr.prog.start for p, pr in res.programs.items() if pr.end >= 0}
        hit = [v for p, v in lat.items() if p in failed]
        clean = [v for p, v in lat.items() if p not in failed]
        rows.append({"seed": seed, "variant": name, "failed_attempts": b.failed_attempts,
                     "failed_service_s": round(b.failed_service_s, 1), "programs_failed": len(failed),
                     "p95": b.program_latency_s.p95, "mean": b.program_latency_s.mean,
                     "mean_failed": float(np.mean(hit)) if hit else 0.0,
                     "mean_clean": float(np.mean(clean)) if clean else 0.0})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1,2,3,4,5,6")
    ap.add_argument("--rate", type=float, default=0.2)
    ap.add_argument("--load", type=float, default=4.0)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    with ProcessPoolExecutor(2) as pool:
        rows = [r for rs in pool.map(run, [(s, a.rate, a.load, a.hours) for s in seeds]) for r in rs]
    print(f"mixed-tenants {a.load:g}x, 4 calls a GPU, call failure rate {a.rate:g}, seeds {a.seeds}; means:")
    print(f"{'variant':<11} {'failed att.':>11} {'lost s':>8} {'progs hit':>9} {'P95 s':>7} {'mean s':>7} "
          f"{'mean, hit':>9} {'mean, clean':>11}")
    for name in VARIANTS:
        rs = [r for r in rows if r["variant"] == name]
        m = {k: float(np.mean([r[k] for r in rs])) for k in rs[0] if k not in ("seed", "variant")}
        print(f"{name:<11} {m['failed_attempts']:>11.1f} {m['failed_service_s']:>8.0f} {m['programs_failed']:>9.1f} "
              f"{m['p95']:>7.1f} {m['mean']:>7.1f} {m['mean_failed']:>9.1f} {m['mean_clean']:>11.1f}")
    print("\nplas reset against plas keep, paired (mean change [bootstrap 95 %], seeds where reset is lower):")
    paired = {}
    for k in ("p95", "mean", "mean_failed", "mean_clean"):
        paired[k] = paired_change(series(rows, seeds, k, variant="plas keep"), series(rows, seeds, k, variant="plas reset"))
        print(f"  {k:<12} {fmt(paired[k])}")
    save(a.json, rows, paired)


if __name__ == "__main__":
    main()
