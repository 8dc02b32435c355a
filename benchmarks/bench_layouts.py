"""A layout from history, judged on fair ground (`statebudget/sim/layouts.py`). For each trace,
the layout search replays that preset's tuning seeds (its history) with the first of
`--policies`; the layout it keeps, if any, then runs on the evaluation seeds beside no layout,
for each policy, paired seed by seed. hetero16 + agent-team, 2-hour traces, warm start, 1800 s
warm-up, as the fair table.

    .venv/bin/python benchmarks/bench_layouts.py --history 1-10 --seeds 100-139 --workers 2 \\
        [--traces mapreduce,mixed-tenants] [--policies statebudget-lease] [--budget 24] \\
        [--tolerance 0.05] [--against sleep-swap,forecast-prewarm] [--holds] [--json out/bench_layouts.json]

Per trace: the layout kept, the search's means (no layout, first layout, kept), and on the
evaluation seeds the mean per-seed change [bootstrap 95 %] and seeds lower, for handoff-stall
P95 and P99, TTFT P95, program P95, SLO attainment at 5 and total stall.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench_policies import TRACES, parse_seeds
from statebudget.models.load import load_catalog, load_cluster
from statebudget.policies import BASELINE_NAMES
from statebudget.sim.layouts import search
from statebudget.sim.paired import fmt, paired_change
from statebudget.sim.sweep import jobs, run_local

METRICS = ("handoff_p95_s", "handoff_p99_s", "ttft_p95_s", "program_p95_s", "slo_at5", "stall_total_s")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--history", default="1-10", help="tuning seeds the search replays (< 100)")
    ap.add_argument("--seeds", default="100-139", help="evaluation seeds (>= 100)")
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--policies", default="statebudget-lease")
    ap.add_argument("--budget", type=int, default=24, help="layouts the search may replay")
    ap.add_argument("--tolerance", type=float, default=0.05,
                    help="how much worse than no layout (or --against's best) a kept layout's TTFT P95 and "
                         "program P95 may be")
    ap.add_argument("--against", default="", help="baselines whose best TTFT and program P95 on the history bound "
                                                 "a kept layout's, in place of no layout's")
    ap.add_argument("--holds", action="store_true", help="replay and run every layout holding (`holds: true`)")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=1800.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    history, seeds = parse_seeds(args.history), parse_seeds(args.seeds)
    if any(s >= 100 for s in history) or any(s < 100 for s in seeds):
        ap.error("--history takes tuning seeds (< 100), --seeds evaluation seeds (>= 100)")
    traces = [t for t in args.traces.split(",") if t]
    policies = [p for p in args.policies.split(",") if p]
    against = [p for p in args.against.split(",") if p]
    if set(against) - set(BASELINE_NAMES):
        ap.error(f"--against takes baselines: {', '.join(BASELINE_NAMES)}")
    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    common = dict(catalog="agent-team", hours=args.hours, warmup_s=args.warmup)
    t0 = time.time()
    out = {"benchmark": "bench_layouts", "history": history, "seeds": seeds, "policies": policies,
           "budget": args.budget, "tolerance": args.tolerance, "against": against, "holds": args.holds,
           "traces": {}}
    for trace in traces:
        def say(msg, trace=trace):
            print(f"[{time.time() - t0:.0f} s] {trace}: {msg}", file=sys.stderr, flush=True)

        hist = jobs(["hetero16"], [trace], history, policies[:1], **common)
        found = search(cl, cat, hist, policies[0], args.budget, args.tolerance, args.workers, say, against,
                       args.holds)
        lay = found.chosen.layout
        say(f"kept {lay!r}")
        todo = [] if lay is None else jobs(["hetero16"], [trace], seeds, policies, **common) + jobs(
            ["hetero16"], [trace], seeds, policies, planner={"homes": lay, "layout_holds": args.holds}, **common)
        rows = run_local(todo, args.workers) if todo else []  # nothing kept: nothing to judge
        rec = {"layout": lay, "planner_arg": found.planner_arg(),
               "search": [{"layout": s.layout, "acceptable": s.acceptable, **s.means} for s in found.tried],
               "against": found.against,
               "evaluation": {}, "rows": rows}
        print(f"\n{trace}: layout {found.planner_arg() or 'none'}; search, handoff / TTFT / program P95 means: "
              + "; ".join(f"{name} {s.means['handoff_p95_s']:.3f} / {s.means['ttft_p95_s']:.2f} / "
                          f"{s.means['program_p95_s']:.0f}" for name, s in
                          (("none", found.none), ("first", found.tried[1]), ("kept", found.chosen))))
        for p in policies:
            if lay is None:
                break
            base = sorted((r for r in rows if r["policy"] == p and not r.get("planner")), key=lambda r: r["seed"])
            mine = sorted((r for r in rows if r["policy"] == p and r.get("planner")), key=lambda r: r["seed"])
            rec["evaluation"][p] = {}
            for m in METRICS:
                b, o = [r[m] or 0.0 for r in base], [r[m] or 0.0 for r in mine]
                pos = [(x, y) for x, y in zip(b, o) if x > 0]  # a relative change needs a base above 0
                c = paired_change([x for x, _ in pos], [y for _, y in pos]) if pos else None
                rec["evaluation"][p][m] = {"before": sum(b) / len(b), "after": sum(o) / len(o), "change": c}
                print(f"  {p:18} {m:14} {sum(b) / len(b):10.3f} -> {sum(o) / len(o):10.3f}  "
                      + (fmt(c) if c else "(no base above 0)"))
        out["traces"][trace] = rec
    out["wall_s"] = round(time.time() - t0, 1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=list) + "\n")


if __name__ == "__main__":
    main()
