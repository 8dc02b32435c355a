"""The page floor beside the fair table (`statebudget/solvers/floor.py`): per trace, the expected
handoff-stall P95 and total stall that expert-page faults alone force on a policy that cannot
foresee a call's pages, against the best baseline's and ours, from a `bench_policies.py` JSON
(same traces, seeds, warm-up).

    .venv/bin/python benchmarks/bench_floor.py --from out/all40.json [--json out/bench_floor.json]

Where the floor is above the target (0.6 x the best baseline's P95), no such policy meets it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench_policies import OURS, TARGETS
from statebudget.models.load import load_catalog, load_cluster
from statebudget.solvers.floor import page_floor
from statebudget.traces.generators import generate

FACTOR = next(f for metric, f, _ in TARGETS if metric == "handoff_p95_s")  # x the best baseline's P95


def floors(d: dict, trace: str, seeds: list[int]) -> list:
    cl, cat = load_cluster(d["cluster"]), load_catalog(d["catalog"])
    return [page_floor(cl, cat, generate(trace, s, d["hours"], load=d["load"]), warmup_s=d["warmup_s"], seed=s)
            for s in seeds]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="src", type=Path, required=True, help="a bench_policies.py --json output")
    ap.add_argument("--traces", default="", help="a subset of the JSON's traces")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    d = json.loads(args.src.read_text())
    tables = d["tables"].get("warm") or next(iter(d["tables"].values()))
    traces = [t for t in (args.traces.split(",") if args.traces else tables) if t]
    out, t0 = {}, time.time()
    lines = ["| trace | page floor: handoff P95 / total stall (s) | best baseline P95 (s) | 0.6 x best | floor / best | "
             + " / ".join(o.removeprefix("statebudget-") if o != "statebudget" else "plain" for o in OURS)
             + " P95 | best total stall (s) | floor / best total |", "|---|---|---|---|---|---|---|---|"]
    for trace in traces:
        if trace not in tables:
            sys.exit(f"--traces: {trace} is not in {args.src}")
        pol = tables[trace]["policies"]
        best = tables[trace]["best_baseline"]
        seeds = sorted({r["seed"] for r in d["rows"] if r["trace"] == trace})
        fl = floors(d, trace, seeds)
        p95 = float(np.mean([f.handoff_p95_s for f in fl]))
        total = float(np.mean([f.stall_total_s for f in fl]))
        b95, btot = pol[best["handoff_p95_s"]]["handoff_p95_s"]["mean"], pol[best["stall_total_s"]]["stall_total_s"]["mean"]
        ours = {o: pol[o]["handoff_p95_s"]["mean"] for o in OURS if o in pol}
        out[trace] = {"seeds": seeds, "floor_handoff_p95_s": p95, "floor_stall_total_s": total,
                      "kept": fl[0].kept, "best_handoff_p95": [best["handoff_p95_s"], b95],
                      "best_stall_total": [best["stall_total_s"], btot], "ours_handoff_p95_s": ours,
                      "per_seed": [{"seed": s, "handoff_p95_s": f.handoff_p95_s, "stall_total_s": f.stall_total_s}
                                   for s, f in zip(seeds, fl)]}
        lines.append(f"| {trace} | {p95:.3f} / {total:.1f} | {b95:.3f} ({best['handoff_p95_s']}) | {FACTOR * b95:.3f} | "
                     f"{p95 / b95:.2f} | " + " / ".join(f"{v:.3f}" for v in ours.values())
                     + f" | {btot:.1f} ({best['stall_total_s']}) | {total / btot:.2f} |")
        print(f"{trace}: {len(seeds)} seeds", file=sys.stderr)
    print("\n".join(lines))
    print(f"\nfrom {args.src} ({d.get('git', '?')}); pages kept at most, seconds a page: "
          + "; ".join(f"{m} {k} / {t:.3f}" for m, (k, t) in next(iter(out.values()))["kept"].items())
          + f"; {time.time() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "floor", "from": str(args.src), "traces": out}, indent=1))


if __name__ == "__main__":
    main()
