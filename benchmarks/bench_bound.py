"""How tight the lower bound on total stall is (`solvers/bound.py`), and how close the oracle's
replay comes to it, on random tiny instances (1-2 GPUs, 2-3 models, up to 6 calls, tool waits,
hints), evaluation seeds 100.. (one instance per seed), both starts.

    .venv/bin/python benchmarks/bench_bound.py [--seeds 100-299] [--exact-runs 3000] [--json out/bench_bound.json]

Per instance: the bound, every registered policy's `stall_total_s`, and, where the exhaustive
search over the simulator's decisions completes within `--exact-runs` replays
(`statebudget/sim/exact.py`), the exact optimum of that decision menu. Printed: violations (a
policy below the bound: must be 0), the bound over the best policy and over the exact optimum,
and how often the oracle's replay reaches the best policy, the exact optimum and the bound.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from statebudget.models import Catalog, Cluster, Program, Trace
from statebudget.models.trace import TraceHeader
from statebudget.policies import REGISTRY, SEES_FUTURE, make_policy
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.sim.exact import exact_optimum
from statebudget.sim.metrics import total_stall as stall_total
from statebudget.solvers.bound import lower_bound

TOL_S = 1e-3


def instance(seed: int):
    """One random tiny instance: a cluster, a catalog, a trace, a start."""
    r = np.random.default_rng(seed)
    cl = Cluster.model_validate({
        "name": "tiny", "gpu_kinds": {"G": {
            "hbm_gb": float(r.choice([16.0, 24.0])), "hbm_gbps": 1555, "h2d_gbps": float(r.choice([8.0, 25.0])),
            "d2h_gbps": 25.0, "tflops": 312, "wake_s": float(r.choice([0.2, 1.0])),
            "cold_start_s": float(r.choice([0.0, 3.0, 10.0])), "engine_overhead_gb": 0.0}},
        "nodes": [{"name": "n0", "host_dram_gb": 256, "nvme_gb": 4000, "nvme_read_gbps": 7, "nvme_write_gbps": 5,
                   "root_gbps": 50, "gpus": {"G": int(r.integers(1, 3))}}]})
    models = [{"name": f"m{i}", "version": "v", "weights_gb": round(float(r.uniform(4.0, 15.0)), 2),
               "kv_bytes_per_token": int(r.choice([1000, 100_000])), "active_params_b": float(r.choice([1.0, 8.0])),
               "tp": int(r.choice([1, 1, 2]))} for i in range(int(r.integers(2, 4)))]
    cat = Catalog.model_validate({"name": "tiny", "models": models})
    names = [m["name"] for m in models]
    budget, progs = int(r.integers(2, 7)), []
    for p in range(int(r.integers(1, 3))):
        nodes = []
        for k in range(int(r.integers(2, 6))):
            after = sorted({nodes[int(i)]["id"] for i in r.integers(0, len(nodes), int(r.integers(0, 3)))}) if nodes else []
            if budget > 0 and r.random() < 0.6:
                budget -= 1
                out = int(r.integers(0, 300))
                nodes.append({"id": f"n{k}", "kind": "call", "model": str(r.choice(names)), "after": after,
                              "context_tokens": int(r.integers(0, 8000)), "output_tokens": out, "max_tokens": max(out, 1)})
            else:
                nodes.append({"id": f"n{k}", "kind": "tool", "tool": "t", "duration": round(float(r.uniform(0, 15)), 3),
                              "after": after})
        calls = [n["id"] for n in nodes if n["kind"] == "call"]
        hints = [{"issued_at": str(r.choice([n["id"] for n in nodes])), "for": c, "model": str(r.choice(names)),
                  "confidence": 0.8} for c in calls if r.random() < 0.5]
        progs.append(Program.model_validate({"program": f"p{p}", "start": round(float(r.uniform(0, 20)), 3),
                                             "nodes": nodes, "hints": hints}))
    return cl, cat, Trace(header=TraceHeader(), programs=progs), str(r.choice(["warm", "cold"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="100-299")
    ap.add_argument("--exact-runs", type=int, default=3000, help="replays the exhaustive search may take per instance")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.seeds.split("-"))
    rows = []
    for seed in range(lo, hi + 1):
        cl, cat, tr, start = instance(seed)
        cfg = SimConfig(start=start)
        b = lower_bound(cl, cat, tr, start=start)
        stalls = {n: stall_total(Simulator(cl, cat, tr, make_policy(n), config=cfg).run()) for n in sorted(REGISTRY)}
        row = {"seed": seed, "start": start, "calls": tr.n_calls, "bound": b.total_stall_s, "status": b.status,
               "policies": stalls}
        ex = exact_optimum(cl, cat, tr, config=cfg, max_runs=args.exact_runs)
        row["exact"], row["exact_complete"], row["exact_runs"] = ex.stall_total_s, ex.complete, ex.runs
        rows.append(row)
        print(seed, start, tr.n_calls, f"bound {b.total_stall_s:.3f}", f"oracle {stalls['oracle']:.3f}",
              f"best {min(v for k, v in stalls.items() if k not in SEES_FUTURE):.3f}",
              f"exact {row.get('exact', float('nan')):.3f}{'' if row.get('exact_complete', True) else ' (incomplete)'}",
              flush=True)
    summary = summarise(rows)
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


def summarise(rows: list[dict]) -> dict:
    def share(xs):
        return round(float(np.mean(xs)), 3) if xs else None
    viol = [(r["seed"], n) for r in rows for n, v in r["policies"].items() if v < r["bound"] - TOL_S]
    best = [min(v for k, v in r["policies"].items() if k not in SEES_FUTURE) for r in rows]
    best_all = [min(r["policies"].values()) for r in rows]  # the oracle's replay included
    stalled = [i for i, v in enumerate(best_all) if v > TOL_S]
    exact = [r for r in rows if r.get("exact_complete")]
    out = {
        "instances": len(rows), "violations": viol,
        "bound_optimal": share([r["status"] == "OPTIMAL" for r in rows]),
        "with_stall": len(stalled),
        # over the best of every policy, the oracle's replay included, where that stalls at all
        "bound_over_best_median": round(float(np.median([rows[i]["bound"] / best_all[i] for i in stalled])), 3)
        if stalled else None,
        "bound_equals_best": share([rows[i]["bound"] >= best_all[i] - 10 * TOL_S for i in stalled]),
        "oracle_reaches_best": share([r["policies"]["oracle"] <= b + TOL_S for r, b in zip(rows, best)]),
        "oracle_reaches_bound": share([r["policies"]["oracle"] <= r["bound"] + 10 * TOL_S for r in rows]),
        "oracle_over_best_worst": round(max((r["policies"]["oracle"] - b for r, b in zip(rows, best)), default=0.0), 3),
    }
    if exact:
        out.update({
            "exact_complete": len(exact),
            "bound_equals_exact": share([r["bound"] >= r["exact"] - 10 * TOL_S for r in exact]),
            "bound_above_exact": [r["seed"] for r in exact if r["bound"] > r["exact"] + TOL_S],
            "oracle_reaches_exact": share([r["policies"]["oracle"] <= r["exact"] + 10 * TOL_S for r in exact]),
            "best_policy_reaches_exact": share([min(v for k, v in r["policies"].items() if k not in SEES_FUTURE)
                                                <= r["exact"] + 10 * TOL_S for r in exact]),
            # a policy below the search: the menu missed a better schedule, so "exact" is not
            "menu_beaten": [r["seed"] for r in exact if min(r["policies"].values()) < r["exact"] - 10 * TOL_S],
        })
    return out


if __name__ == "__main__":
    main()
