"""Online tracks offline: `statebudget-track` (statebudget-lease repairing toward a forecast MILP
solved every R seconds, `planner/target.py`) swept over R, beside statebudget-lease and the
baselines given with `--against`, on hetero16 + agent-team, 2-hour traces, warm start with a
1800 s warm-up, seeds on a process pool. Seed 001's "how often to re-plan".

    .venv/bin/python benchmarks/bench_track.py --replan 30,60,120,300,600 --seeds 100-109 \\
        [--trace swe-team] [--track "move_price=1.0"] [--against statebudget-lease,forecast-prewarm]
        [--json out/bench_track.json]

Per R: the mean over seeds of handoff-stall P95, TTFT P95, SLO attainment at 5, program-latency
P95, wasted bytes, total stall, and the solves' cost (count, p99 and total seconds, status); each
against the best of `--against` per metric as a ratio of means with a paired bootstrap 95 %
interval (`sim/paired.py`). Seeds below 100 are tuning seeds and need `--tuning`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench_policies import parse_seeds
from statebudget.core.costs import CostModel
from statebudget.models.load import load_catalog, load_cluster
from statebudget.planner.target import TrackConfig, summary
from statebudget.policies import make_policy
from statebudget.policies.ours import StateBudgetTrack
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.sim.metrics import policy_report
from statebudget.sim.paired import ratio_of_means
from statebudget.sim.sweep import parse_fields
from statebudget.traces.generators import generate
from statebudget.traces.timeline import nominal_timeline

METRICS = {"handoff_p95_s": "lower", "ttft_p95_s": "lower", "slo5": "higher", "program_p95_s": "lower",
           "wasted_tb": "lower", "stall_total_s": "lower"}


def run(job: dict) -> dict:
    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    tr = generate(job["trace"], job["seed"], job["hours"])
    if job["policy"] == "statebudget-track":
        pol = StateBudgetTrack(track=TrackConfig(**dict(job["track"], replan_s=job["replan_s"])))
    else:
        pol = make_policy(job["policy"])
    res = Simulator(cl, cat, tr, pol, cost=CostModel(cl, cat),
                    config=SimConfig(seed=job["seed"], start="warm", warmup_s=job["warmup"])).run()
    b = policy_report(res, tr.header.slo_classes, nominal_timeline(tr, cat))
    row = dict(job, handoff_p95_s=b.handoff_stall_s.p95, ttft_p95_s=b.ttft_s.p95,
               slo5=b.slo_attainment.get("5", float("nan")), program_p95_s=b.program_latency_s.p95,
               wasted_tb=b.wasted_bytes / 1e12, stall_total_s=b.stall_total_s)
    if isinstance(pol, StateBudgetTrack) and pol.tracker is not None:
        row["solves"] = summary(pol.tracker.solves)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replan", default="30,60,120,300,600", help="R values in seconds")
    ap.add_argument("--seeds", default="100-109")
    ap.add_argument("--tuning", action="store_true", help="allow seeds below 100")
    ap.add_argument("--trace", default="swe-team")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=1800.0)
    ap.add_argument("--track", default="", help='TrackConfig overrides, e.g. "move_price=0.5, share=0.45"')
    ap.add_argument("--against", default="statebudget-lease,forecast-prewarm,sleep-swap,frequency")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    if any(s < 100 for s in seeds) and not args.tuning:
        ap.error("seeds below 100 are tuning seeds: pass --tuning, and quote only seeds >= 100")
    try:
        track = parse_fields(args.track)
        TrackConfig(**track)  # a bad field fails here, not in a worker
    except (TypeError, ValueError) as e:
        ap.error(f"--track {args.track!r}: {e}")
    rs = [float(r) for r in args.replan.split(",") if r]
    base = dict(trace=args.trace, hours=args.hours, warmup=args.warmup, track=track)
    todo = [dict(base, policy="statebudget-track", replan_s=r, seed=s) for r in rs for s in seeds]
    against = [p for p in args.against.split(",") if p]
    todo += [dict(base, policy=p, replan_s=None, seed=s) for p in against for s in seeds]
    t0 = time.time()
    rows = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for k, row in enumerate(pool.map(run, todo), 1):
            rows.append(row)
            print(f"[{k}/{len(todo)} {time.time() - t0:.0f} s] {row['policy']} R={row['replan_s']} seed {row['seed']}: "
                  f"handoff p95 {row['handoff_p95_s']:.2f} s, TTFT p95 {row['ttft_p95_s']:.2f} s", file=sys.stderr, flush=True)

    def col(policy, key, r=None):
        return [next(x[key] for x in rows if x["policy"] == policy and x["replan_s"] == r and x["seed"] == s)
                for s in seeds]

    def mean(xs):
        return sum(xs) / len(xs)

    best = {k: (min if d == "lower" else max)(against, key=lambda p: mean(col(p, k))) for k, d in METRICS.items()} \
        if against else {}
    out = {"benchmark": "bench_track", "trace": args.trace, "seeds": seeds, "track": track, "wall_s": time.time() - t0,
           "against": {p: {k: mean(col(p, k)) for k in METRICS} for p in against}, "best": best, "replan": []}
    print(f"\n{args.trace}, seeds {args.seeds}, track {track or 'defaults'}; best of {','.join(against)} per metric")
    print("| R (s) | " + " | ".join(METRICS) + " | solves | solve p99 (s) | solve total (s) |")
    print("|---:|" + "---:|" * (len(METRICS) + 3))
    for r in rs:
        rec = {"replan_s": r}
        cells = []
        for k in METRICS:
            ours = col("statebudget-track", k, r)
            rec[k] = mean(ours)
            cell = f"{mean(ours):.3g}"
            if k in best:
                ratio = ratio_of_means(col(best[k], k), ours)
                rec[k + "_vs_best"] = ratio
                lo, hi = ratio["ci95"]
                cell += f" ({ratio['ratio']:.2f}× [{lo:.2f}, {hi:.2f}])"
            cells.append(cell)
        sv = [x["solves"] for x in rows if x["policy"] == "statebudget-track" and x["replan_s"] == r and "solves" in x]
        rec["solves"] = sv
        n = mean([s["solves"] for s in sv]) if sv else 0
        p99 = max((s["solve_s"]["p99"] for s in sv if s["solves"]), default=0.0)
        total = mean([s["solve_s"]["total"] for s in sv if s["solves"]]) if sv else 0.0
        print(f"| {r:g} | " + " | ".join(cells) + f" | {n:.0f} | {p99:.3f} | {total:.2f} |")
        out["replan"].append(rec)
    for p in against:
        print(f"| {p} | " + " | ".join(f"{mean(col(p, k)):.3g}" for k in METRICS) + " | | | |")
    out["rows"] = rows
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
