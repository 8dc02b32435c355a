"""Simulator speed: events per second and the wall time of `make demo`'s replay.

    .venv/bin/python benchmarks/bench_sim.py [--hours 2] [--repeat 3] [--json out/bench_sim.json]

Runs the demo's replay (hetero16 + agent-team + swe-team seed 1, every baseline) `--repeat`
times in this process and reports the best wall time and events/s of each policy and of the
whole replay, side by side in one run (this machine is shared and noisy: compare within a run).
Events include flow completions superseded when a link's sharing changed (cheap no-ops); the
figure without them is reported too.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from statebudget.models.load import load_catalog, load_cluster
from statebudget.sim.engine import Simulator
from statebudget.policies import make_policy
from statebudget.core.costs import CostModel
from statebudget.traces.generators import generate

DEMO_POLICIES = ["ondemand", "lru-keepwarm", "frequency", "prefetch-all", "static", "llama-swap", "ray-multiplex"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    t0 = time.perf_counter()
    tr = generate("swe-team", 1, args.hours)
    gen_s = time.perf_counter() - t0
    cost = CostModel(cl, cat)
    best: dict[str, tuple[float, int]] = {}
    totals = []
    for _ in range(args.repeat):
        total = 0.0
        for name in DEMO_POLICIES:
            sim = Simulator(cl, cat, tr, make_policy(name), cost=cost)
            t = time.perf_counter()
            res = sim.run()
            dt = time.perf_counter() - t
            total += dt
            if name not in best or dt < best[name][0]:
                best[name] = (dt, res.events, res.stale_events)
        totals.append(total)
    events = sum(e for _, e, _ in best.values())
    live = sum(e - s for _, e, s in best.values())
    wall = sum(t for t, _, _ in best.values())
    out = {
        "trace": {"preset": "swe-team", "seed": 1, "hours": args.hours, "programs": len(tr.programs), "calls": tr.n_calls},
        "generate_s": round(gen_s, 3),
        "per_policy": {n: {"wall_s": round(t, 3), "events": e, "superseded": s, "events_per_s": round(e / t)}
                       for n, (t, e, s) in best.items()},
        "replay_wall_s_best": round(min(totals), 3),
        "replay_wall_s_all": [round(t, 3) for t in totals],
        "events_per_s": round(events / wall),
        "events_per_s_without_superseded": round(live / wall),
        "calls_per_s": round(tr.n_calls * len(best) / wall),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
