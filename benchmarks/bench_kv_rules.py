"""Tool-wait KV rules: preserve, swap, discard and adaptive on mixed-tenants and
mapreduce, hetero16 + agent-team, seeds 1-3, at the preset load and at `--load` times it; a
process pool. Prints means: programs/hour, suspended-KV TB*s held in HBM, recomputed tokens,
program latency p95; then adaptive's programs/hour, and its `capacity_per_hour` (`window_rate`:
the completion rate over the last three quarters of the arrival window), paired seed by seed
against each rule and against each seed's best rule (`paired.py`).

    python benchmarks/bench_kv_rules.py [--seeds 1,2,3] [--hours 1] [--loads 1,4] [--traces mixed-tenants,mapreduce]
        [--rules preserve,swap,discard,adaptive] [--json out/bench_kv_rules.json]
    python benchmarks/bench_kv_rules.py --from RUN1.json,RUN2.json [--json OUT]   (tables of earlier runs)

`--rules` runs a subset (e.g. only adaptive, to pair a changed rule against an earlier run's
JSON with `paired.py`); the paired table then compares adaptive only with the rules it ran.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from paired import fmt, load_rows, paired_change, save, series
from statebudget.models.load import load_catalog, load_cluster
from statebudget.sim.config import SimConfig
from statebudget.sim.runner import replay
from statebudget.traces.generators import generate

RULES = ["preserve", "swap", "discard", "adaptive"]


def run(args) -> list[dict]:
    trace_name, seed, hours, load, rules = args
    specs = [f"statebudget::{r}" for r in rules]
    out = replay(load_cluster("hetero16"), load_catalog("agent-team"), generate(trace_name, seed, hours, load=load),
                 specs, SimConfig(seed=seed))
    return [{"trace": trace_name, "load": load, "seed": seed, "rule": s.split("::")[1],
             "programs_per_hour": b.programs_per_hour, "capacity_per_hour": window_rate(out.results[s], hours),
             "kv_hbm_tb_s": b.kv_hbm_byte_s / 1e12,
             "recomputed_tokens": b.recomputed_tokens, "program_latency_p95": b.program_latency_s.p95}
            for s, b in out.report.policies.items()]


def window_rate(res, hours: float) -> float:
    """Programs completed per hour over the last three quarters of the arrival window. Once
    arrivals outrun the cluster the queue never empties there, so this is its capacity, free of
    the drain after the last arrival (when the last few programs end), which `programs_per_hour`
    counts. Below capacity it is the arrival rate."""
    t0, t1 = 0.25 * hours * 3600.0, hours * 3600.0
    done = sum(1 for pr in res.programs.values() if t0 <= pr.end < t1)
    return done / ((t1 - t0) / 3600.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--loads", default="1,4")
    ap.add_argument("--traces", default="mixed-tenants,mapreduce")
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--from", dest="from_", metavar="A.json,B.json",
                    help="run nothing: print the tables for the rows of these runs' JSON; a row of a later file "
                         "replaces one of an earlier file for the same trace, load, seed and rule (e.g. the rules "
                         "of one run, adaptive of a newer one); the seeds are those every row group has")
    a = ap.parse_args()
    if a.from_:
        latest = {(r["trace"], r["load"], r["seed"], r["rule"]): r for r in load_rows(a.from_)}
        rows = list(latest.values())
        traces = sorted({r["trace"] for r in rows})
        rules = [r for r in RULES if any(row["rule"] == r for row in rows)]
        groups = {(r["trace"], r["load"], r["rule"]) for r in rows}
        seeds = sorted(set.intersection(*({r["seed"] for r in rows if (r["trace"], r["load"], r["rule"]) == g}
                                          for g in groups)))
        rows = [r for r in rows if r["seed"] in seeds]
    else:
        traces = a.traces.split(",")
        rules = a.rules.split(",")
        unknown = sorted(set(rules) - set(RULES))
        if unknown or not rules:
            ap.error(f"--rules: unknown rule(s) {', '.join(unknown)} (known: {', '.join(RULES)})")
        seeds = [int(s) for s in a.seeds.split(",")]
        jobs = [(t, s, a.hours, float(l), rules) for t in traces for l in a.loads.split(",") for s in seeds]
        with ProcessPoolExecutor() as pool:
            rows = [r for rs in pool.map(run, jobs) for r in rs]
    print(f"{'trace':14} {'load':>4} {'rule':9} {'programs/h':>11} {'KV TB*s in HBM':>15} {'recomputed tok':>15} {'latency p95 s':>14}")
    for t in traces:
        for load in sorted({r["load"] for r in rows}):
            for rule in rules:
                sel = [r for r in rows if r["trace"] == t and r["load"] == load and r["rule"] == rule]
                print(f"{t:14} {load:>4g} {rule:9} {np.mean([r['programs_per_hour'] for r in sel]):>11.3f} "
                      f"{np.mean([r['kv_hbm_tb_s'] for r in sel]):>15.3f} {np.mean([r['recomputed_tokens'] for r in sel]):>15.0f} "
                      f"{np.mean([r['program_latency_p95'] for r in sel]):>14.1f}")
    print(f"({len(seeds)} seeds: {','.join(map(str, seeds))})")
    paired = {}
    for metric in ("programs_per_hour", "capacity_per_hour"):
        print(f"\nadaptive's {metric} paired against each rule, and against the best rule of each seed")
        print("(mean change, bootstrap 95 % interval; 'lower on' counts the seeds where adaptive is below):")
        for t in traces:
            for load in sorted({r["load"] for r in rows}):
                pph = {rule: series(rows, seeds, metric, trace=t, load=load, rule=rule) for rule in rules}
                if "adaptive" not in pph or len(pph) < 2:
                    continue
                ours = pph.pop("adaptive")
                pph["best"] = [max(v) for v in zip(*pph.values())]
                for rule, base in pph.items():
                    key = f"{t} {load:g} {rule}" + ("" if metric == "programs_per_hour" else f" {metric}")
                    c = paired[key] = paired_change(base, ours)
                    print(f"  {t:14} {load:>4g} vs {rule:9} {fmt(c)}")
    save(a.json, rows, paired)


if __name__ == "__main__":
    main()
