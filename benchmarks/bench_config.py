"""statebudget-lease with overrides of its `PlannerConfig` (`lease_config`): hetero16 + agent-team,
2-hour traces, tuning seeds 1-10 (simulator seed = trace seed), warm start with a 1800 s warm-up,
each seed a sweep job (`sim/sweep.py`, with the job's `planner` fields) on a process pool. Seeds
>= 100 are for evaluation (`bench_policies.py`), never for tuning. The P95 / wasted-bytes frontier
and the stall / TTFT trade-off of placement come from it.

    .venv/bin/python benchmarks/bench_config.py "promote_min_p=1.01, page_min_touch=1.01" [--trace swe-team] [--load 3]

Prints, per seed and then their mean, handoff-stall P95, total stall, wasted bytes, warm tax and
TTFT P95.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

from statebudget.planner.config import check_fields
from statebudget.sim import sweep as sw
from statebudget.sim.sweep import parse_fields


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
    try:
        kw = parse_fields(args.overrides)
        check_fields(kw)  # a misspelt field or a refused value fails here, in one line
    except ValueError as e:
        ap.error(f"overrides {args.overrides!r}: {e}")
    todo = sw.jobs(["hetero16"], [args.trace], seeds, ["statebudget-lease"], "agent-team", args.hours,
                   start=args.start, warmup_s=args.warmup, load=args.load, planner=kw)
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        rows = [_figures(r) for r in pool.map(sw.run_job, todo)]
    for seed, b in zip(seeds, rows):
        print(f"{args.trace} seed {seed} {kw}: handoff p95 {b['p95']:.3f} s, total stall {b['total']:.0f} s, wasted "
              f"{b['wasted']:.3f} TB, warm tax {b['warm_tax']:.3f}, TTFT p95 {b['ttft']:.2f} s", flush=True)
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    print(f"MEAN {args.trace} {kw}: handoff p95 {mean['p95']:.3f} s, total stall {mean['total']:.0f} s, wasted "
          f"{mean['wasted']:.3f} TB, warm tax {mean['warm_tax']:.3f}, TTFT p95 {mean['ttft']:.2f} s")


def _figures(row: dict) -> dict:
    return {"p95": row["handoff_p95_s"], "total": row["stall_total_s"], "wasted": row["wasted_tb"],
            "warm_tax": row["warm_tax"], "ttft": row["ttft_p95_s"]}


if __name__ == "__main__":
    main()
