"""Queue disciplines under compute contention: fcfs, plas and atlas on mixed-tenants and
mapreduce at 8x their preset load on hetero16, with one prefill slot per GPU (calls queue for
compute; with the default compute model they never do and the disciplines tie). Seeds 1-3, a
process pool; prints the means, the largest overtaking window seen, and plas and atlas paired
against fcfs seed by seed (mean change with a bootstrap 95 % interval: `paired.py`).

    python benchmarks/bench_queues.py [--seeds 1,2,3] [--traces mixed-tenants,mapreduce] [--hours 1] [--load 8]
        [--queues plas,atlas,auto] [--prefill-slots 1|none] [--max-batch 32] [--admit-starve 60|none]
        [--json out/bench_queues.json]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from paired import fmt, paired_change, save, series
from statebudget.models.load import load_catalog, load_cluster
from statebudget.core.programs import overtaking_window_s, parse_admit_starve
from statebudget.sim.config import SimConfig
from statebudget.sim.runner import replay
from statebudget.traces.generators import generate


def run(args) -> list[dict]:
    trace_name, seed, hours, load, slots, max_batch, starve, specs = args
    tr = generate(trace_name, seed, hours, load=load)
    rep = replay(load_cluster("hetero16"), load_catalog("agent-team"), tr, specs,
                 SimConfig(prefill_slots=slots, max_batch=max_batch, admit_starve_s=starve))
    rows = []
    for spec in specs:
        b = rep.report.policies[spec]
        res = rep.results[spec]
        service = {}
        for c in res.calls:
            if c.end >= 0 and c.start >= 0:
                service[c.program] = service.get(c.program, 0.0) + c.end - c.start
        worst = 0.0  # how much later than a call the latest call started before it arrived
        by_group: dict = {}
        for c in res.calls:
            if c.start >= 0 and c.group is not None:
                by_group.setdefault(c.group, []).append(c)
        for calls in by_group.values():
            calls.sort(key=lambda c: c.arrive)
            for i, c in enumerate(calls):
                for d in calls[i + 1:]:
                    if c.ready <= d.start < c.start:
                        worst = max(worst, (d.arrive - c.arrive) / max(overtaking_window_s(service.get(c.program, 0.0)), 1e-9))
        rows.append({"trace": trace_name, "seed": seed, "spec": spec,
                     "program_latency_p50": b.program_latency_s.p50, "program_latency_mean": b.program_latency_s.mean,
                     "program_latency_p95": b.program_latency_s.p95,
                     "slowdown_p99": b.slowdown.p99, "slowdown_max": b.slowdown.max, "max_wait_p99": b.max_wait_s.p99,
                     "max_wait_max": b.max_wait_s.max, "ttft_p95": b.ttft_s.p95, "programs_per_hour": b.programs_per_hour,
                     "tenant_service_share": b.tenant_service_share, "overtaking_vs_window": round(worst, 3)})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--traces", default="mixed-tenants,mapreduce", help="trace presets, e.g. long-tail")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--load", type=float, default=8.0)
    ap.add_argument("--queues", default="plas,atlas", help="disciplines paired against fcfs, e.g. plas,atlas,auto")
    ap.add_argument("--prefill-slots", default="1", help="prefills a GPU runs at once, or 'none' (no limit)")
    ap.add_argument("--max-batch", type=int, default=32, help="calls a GPU runs at once")
    ap.add_argument("--admit-starve", default="60", help="seconds before a call waiting for HBM holds its GPUs, or 'none'")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    slots = None if a.prefill_slots == "none" else int(a.prefill_slots)
    starve = parse_admit_starve(a.admit_starve)
    traces = a.traces.split(",")
    specs = ["statebudget"] + [f"statebudget:{q}" for q in a.queues.split(",") if q != "fcfs"]
    jobs = [(t, int(s), a.hours, a.load, slots, a.max_batch, starve, specs) for t in traces for s in a.seeds.split(",")]
    with ProcessPoolExecutor() as pool:
        rows = [r for rs in pool.map(run, jobs) for r in rs]
    keys = ["program_latency_p50", "program_latency_mean", "program_latency_p95", "slowdown_p99", "slowdown_max", "max_wait_max", "ttft_p95", "programs_per_hour",
            "overtaking_vs_window"]
    print("trace          spec                  " + "  ".join(f"{k:>20}" for k in keys))
    for t in traces:
        for spec in specs:
            sel = [r for r in rows if r["trace"] == t and r["spec"] == spec]
            means = [np.mean([r[k] for r in sel]) if k != "overtaking_vs_window" else max(r[k] for r in sel) for k in keys]
            print(f"{t:14} {spec:20} " + "  ".join(f"{m:>20.3f}" for m in means))
    seeds = [int(s) for s in a.seeds.split(",")]
    paired = {}
    print("\npaired against fcfs over the seeds (mean change, bootstrap 95 % interval):")
    for t in traces:
        for spec in specs[1:]:
            for key in ("program_latency_p95", "program_latency_mean", "slowdown_max"):
                c = paired[f"{t} {spec} {key}"] = paired_change(series(rows, seeds, key, trace=t, spec=specs[0]),
                                                                series(rows, seeds, key, trace=t, spec=spec))
                print(f"  {t:14} {spec:20} {key:22} {fmt(c)}")
    save(a.json, rows, paired)


if __name__ == "__main__":
    main()
