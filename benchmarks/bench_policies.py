"""The fair policy table (DESIGN.md §4): every registered policy but the two that see the future
(the oracle, left out; `foresight`, a reference row when asked for), on hetero16 +
agent-team, traces `swe-team`, `swe-team-shuffled`, `mixed-tenants`, `mapreduce` and
`real-sessions` (TraceLab's real rounds resampled, docs/traces.md; left out of the default, with a
note, where `shared/data/real` is not found), 2-hour traces, evaluation seeds 100..109, every run
`warm` (operator-preloaded host DRAM) with a 1800 s warm-up that no metric counts; `--cold` adds
the same table from a cold start beside it.

    .venv/bin/python benchmarks/bench_policies.py [--hours 2] [--seeds 100-109] [--warmup 1800] [--cold] [--restart 2]
        [--traces ...] [--policies ...] [--workers N] [--json out/bench_policies.json] [--markdown out/bench_policies.md]
        [--planner "scale_out_calls=3"]   # PlannerConfig fields for our planners, to judge a knob on fair ground
    .venv/bin/python benchmarks/bench_policies.py --from out/a.json,out/b.json [--seeds ...] [--markdown ...]
        # no replays: the rows of runs with the same settings tabled together, paired by seed

One job = one (start, trace, seed, policy) replay, run on the sweep's local process pool
(`statebudget/sim/sweep.py`), progress on stderr. The oracle (the offline MILP) is left out: it
takes minutes per replay and sees the future, so it is no baseline (`benchmarks/bench_oracle.py`).

Per trace and start, for every policy: the mean over seeds of each metric in `METRICS` with its
95 % Student t interval over the per-seed values (`paired.t_interval`).

Ours against the best baseline. Baselines = every registered policy that is neither ours
(`statebudget`, `statebudget-lease`, `statebudget-track`) nor sees the future, prefetch-all included. For each metric
separately the best baseline is the one with the best mean over the seeds (lower is better,
except SLO attainment), among the baselines that drop no more calls than the policy that drops
fewest (a dropped call ends its program early, which flatters latencies). The comparison is the
PAIRED DIFFERENCE ours - best, seed by seed on the same traces, with its 95 % t interval
(`paired.paired_diff`); it is defined when the baseline's value is 0 (wasted bytes of ondemand),
where a per-seed ratio is not. For reading, it is also shown
as a ratio of means, ours/best = 1 + diff/mean(best), whose interval is the difference's interval
divided by mean(best) (the best baseline's mean taken as fixed); there is no ratio when that mean
is 0. Verdict per metric: `wins` when the difference's interval lies wholly on the better side of
0, `loses` when wholly on the worse side, else `tie` (`n/a` with one seed). Picking the best
baseline by its mean on the same seeds favours the baseline, so a `wins` is conservative.

Decision p99 is wall time per whole policy hook, measured while the pool runs other replays on
the other cores: compare policies within one run, not across machines.

Seeds 1-10 are for tuning knobs; figures quoted in docs come from seeds >= 100, so seeds below 100
are refused unless `--tuning` is given (the output then says TUNING)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from paired import load_rows, paired_diff, ratio_of_means, t_interval
from statebudget import __version__
from statebudget.policies import REGISTRY, SEES_FUTURE
from statebudget.models.errors import InputError
from statebudget.planner.config import check_fields
from statebudget.sim import sweep as sw
from statebudget.sim.claims import Rows, call_order_worth
from statebudget.sim.config import KV_RESERVES
from statebudget.traces.generators import PRESETS
from statebudget.traces.real_sessions import rounds_path

TRACES = ("swe-team", "swe-team-shuffled", "mixed-tenants", "mapreduce", "real-sessions")
OURS = ("statebudget-lease", "statebudget", "statebudget-track")
EXCLUDED = ("oracle",)
# Allowed as reference rows (`foresight`: what perfect prediction gives our planner), never as the
# best baseline: they see the future.
REFERENCES = tuple(p for p in SEES_FUTURE if p not in EXCLUDED)
# row key -> (label, better). Keys are the sweep's row figures (`sweep.METRICS`).
METRICS = {
    "handoff_p95_s": ("handoff stall P95 (s)", "lower"),
    "handoff_p99_s": ("handoff stall P99 (s)", "lower"),
    "ttft_p95_s": ("TTFT P95 (s)", "lower"),
    "slo_at5": ("SLO attainment @5", "higher"),
    "program_p95_s": ("program latency P95 (s)", "lower"),
    "wasted_tb": ("wasted (TB)", "lower"),
    "warm_tax": ("warm tax", "lower"),
    "stall_total_s": ("total stall (s)", "lower"),
    "decision_p99_ms": ("decision p99 (ms)", "lower"),
    # a call no group can hold is dropped with the rest of its program: a policy that drops work
    # shortens its latencies, so the count stands beside them
    "unplaceable_calls": ("unplaceable calls", "lower"),
}
# Bounds our planners are held to: (row key, factor, against), against = "best" (the best
# baseline for that metric) or a policy; met when the upper end of the ratio of means' bootstrap
# 95 % interval (`paired.ratio_of_means`, as the evidence report's claims test theirs) is at most
# the factor.
TARGETS = (("handoff_p95_s", 0.6, "best"), ("wasted_tb", 0.5, "prefetch-all"),
           ("lease_late_p99_s", 0.5, "prefetch-all"))
# Shown per policy, never compared: where the handoff stall comes from, not how good it is.
DESCRIBED = {"handoff_hbm_wait_share": "handoff stall waiting for HBM room (share)"}


def parse_seeds(spec: str) -> list[int]:
    """`100-109`, `100..109` or `100,101,105`, or a mix: `1-3,7`."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        sep = ".." if ".." in part else ("-" if "-" in part[1:] else None)
        if sep:
            a, b = part.split(sep, 1)
            out += list(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    if not out:
        raise ValueError(f"--seeds names no seed: {spec!r}")
    return sorted(set(out))


def _names(spec: str | None, known, what: str) -> list[str]:
    if spec is None:
        return list(known)
    names = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [n for n in names if n not in known]
    if bad:
        raise SystemExit(f"{what}: unknown {', '.join(bad)} (known: {', '.join(known)})")
    return names


def git_commit() -> str | None:
    """HEAD's short hash, with "+dirty" when tracked files differ from it (what the replays ran)."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=here).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=here).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def _baselines(policies: list[str]) -> list[str]:
    """Neither ours nor one that sees the future."""
    return [p for p in policies if p not in OURS and p not in SEES_FUTURE]


def summarise(rows: list[dict], seeds: list[int], policies: list[str]) -> dict:
    """One (start, trace) group of rows -> per-policy intervals, best baselines, ours vs best."""
    val = {(r["policy"], r["seed"]): r for r in rows}
    per = {p: {m: [val[p, s][m] for s in seeds] for m in METRICS if all(val[p, s].get(m) is not None for s in seeds)}
           for p in policies}
    for p in policies:  # a described figure over the seeds that have it (a share of no stall has none)
        for m in DESCRIBED:
            got = [val[p, s][m] for s in seeds if val[p, s].get(m) is not None]
            if got:
                per[p][m] = got
    table = {p: {m: dict(t_interval(v), per_seed=v) for m, v in per[p].items()} for p in policies}
    baselines = _baselines(policies)
    # A policy that drops calls (unplaceable, and with them the rest of their programs) serves
    # less work, which flatters its latencies: a baseline that drops more than the policy that
    # drops fewest is no best baseline, and ours are flagged when they do.
    drops = {p: float(np.mean(per[p]["unplaceable_calls"])) for p in policies
             if "unplaceable_calls" in per[p] and p not in REFERENCES}
    fewest = min(drops.values(), default=0.0)
    serves_all = [p for p in baselines if drops.get(p, 0.0) <= fewest + 0.5] or baselines
    best, vs = {}, {}
    for m, (_, better) in METRICS.items():
        cands = [p for p in (baselines if m == "unplaceable_calls" else serves_all) if m in per[p]]
        if not cands:
            continue
        sign = 1.0 if better == "lower" else -1.0
        best[m] = min(cands, key=lambda p: (sign * table[p][m]["mean"], p))
    for ours in [p for p in OURS if p in policies]:
        vs[ours] = {}
        for m, b in best.items():
            if m not in per[ours]:
                continue
            d = paired_diff(per[b][m], per[ours][m])
            bm = table[b][m]["mean"]
            ci = d["ci95"]
            ratio = 1.0 + d["mean"] / bm if bm else None
            ratio_ci = [1.0 + ci[0] / bm, 1.0 + ci[1] / bm] if (bm and ci) else None
            better = METRICS[m][1]
            verdict = "n/a"  # one seed: no interval, no verdict
            if ci is not None:
                good, bad = (ci[1] < 0, ci[0] > 0) if better == "lower" else (ci[0] > 0, ci[1] < 0)
                verdict = "wins" if good else ("loses" if bad else "tie")
            vs[ours][m] = {"baseline": b, "ours_mean": table[ours][m]["mean"], "best_mean": bm,
                           "diff_mean": d["mean"], "diff_ci95": ci, "ratio": ratio, "ratio_ci95": ratio_ci,
                           "better_on_seeds": d["lower_on"] if better == "lower" else len(seeds) - d["lower_on"],
                           "verdict": verdict}
    return {"policies": table, "baselines": baselines, "best_baseline": best, "ours_vs_best": vs,
            "targets": _targets(val, seeds, policies, best),
            "drop_more_calls": [p for p in policies if drops.get(p, 0.0) > fewest + 0.5]}


def _targets(val: dict, seeds: list[int], policies: list[str], best: dict) -> list[dict]:
    """Each of `TARGETS` that this group's rows can test: against whom, and per policy of ours the
    ratio of means, its interval and whether it is met (None: one seed, or a reference mean of 0)."""
    out = []
    for key, factor, against in TARGETS:
        ref = best.get(key) if against == "best" else (against if against in policies else None)
        if ref is None:
            continue
        got = {}
        for ours in [p for p in OURS if p in policies]:
            pairs = [(val[ref, s].get(key), val[ours, s].get(key)) for s in seeds]
            if all(a is not None and b is not None for a, b in pairs):
                r = ratio_of_means([a for a, _ in pairs], [b for _, b in pairs])
                hi = r["ci95"][1]
                got[ours] = dict(r, met=None if len(seeds) < 2 or not np.isfinite(hi) else bool(hi <= factor))
        if got:
            out.append({"metric": key, "factor": factor, "against": ref, "ours": got})
    return out


def _target_lines(targets: list[dict]) -> list[str]:
    ours = [p for p in OURS if any(p in t["ours"] for t in targets)]
    if not ours:
        return []
    lines = ["Targets: ratio of means [bootstrap 95 % interval]; met when its upper end is within the factor.",
             "", "| target | " + " | ".join(ours) + " |", "|---|" + "---|" * len(ours)]
    for t in targets:
        cells = []
        for o in ours:
            r = t["ours"].get(o)
            if r is None or not np.isfinite(r["ratio"]):
                cells.append("n/a (reference mean 0)" if r is not None else "n/a")
                continue
            ci = f" [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]" if r["met"] is not None else ""
            cells.append(f"{r['ratio']:.2f}{ci} " + {True: "**met**", False: "not met", None: "(one seed)"}[r["met"]])
        lines.append(f"| {t['metric']} ≤ {t['factor']:g} × {t['against']} | " + " | ".join(cells) + " |")
    return lines + [""]


def _cell(s: dict | None) -> str:
    if s is None:
        return "n/a"
    if s["ci95"] is None:
        return f"{s['mean']:.3g}"
    return f"{s['mean']:.3g} ± {(s['ci95'][1] - s['ci95'][0]) / 2:.2g}"


def _where_it_went(rows: list[dict], policies, top: int = 3) -> list[str]:
    """One line per policy (in `policies` order): the models with the most handoff stall over all
    seeds, each as waiting for HBM room + loading (the rows' `handoff_by_model`)."""
    by: dict[str, dict[str, list[float]]] = {p: {} for p in policies}
    for r in rows:
        acc = by.setdefault(r["policy"], {})
        for model, (wait, load) in (r.get("handoff_by_model") or {}).items():
            a = acc.setdefault(model, [0.0, 0.0])
            a[0] += wait
            a[1] += load
    out = ["Handoff stall summed over the seeds, by model (s waiting for HBM room + s loading):", ""]
    for p, acc in by.items():
        ranked = sorted(acc.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:top]
        out.append(f"- {p}: " + ("; ".join(f"{m} {w:.0f} + {ld:.0f}" for m, (w, ld) in ranked) or "none"))
    return out


def _tails(rows: list[dict], policies, top: int = 3) -> list[str]:
    """One line per policy: the calls that set its handoff-stall P95 (the rows' `handoff_tail`),
    summed over the seeds, as shares by what held each most (HBM room, else the state it loaded
    last) and by model, beside the median P95 over the seeds. Rows written before the field have
    none: the policy is left out."""
    out = ["What sets the handoff-stall P95: its calls (at or above it) summed over the seeds, by what held "
           "each most (HBM room, else the state it loaded last) and by model:", ""]
    for p in policies:
        mine = [r for r in rows if r["policy"] == p and r.get("handoff_tail")]
        if not mine:
            continue
        causes, models = Counter(), Counter()
        for r in mine:
            causes.update(r["handoff_tail"]["by_cause"])
            models.update(r["handoff_tail"]["models"])
        n = sum(causes.values())
        median = float(np.median([r["handoff_p95_s"] for r in mine if r["handoff_p95_s"] is not None] or [0.0]))
        out.append(f"- {p}: P95 median {median:.3g} s; {n} calls: {_shares(causes, n)}; {_shares(models, n, top)}")
    return out if len(out) > 2 else []


def _shares(counts: Counter, n: int, k: int | None = None) -> str:
    """The `k` largest counts as shares of `n`: "room 60%, pages 21%"."""
    return ", ".join(f"{name} {c / (n or 1):.0%}" for name, c in counts.most_common(k))


def markdown(out: dict) -> str:
    seeds = out["seeds"]
    lines = []
    tag = " — TUNING SEEDS, not for docs" if out["tuning"] else ""
    for start, by_trace in out["tables"].items():
        for trace, g in by_trace.items():
            load = f", {out['load']:g}x load" if out.get("load", 1.0) != 1.0 else ""
            if out.get("history_hours"):
                load += f", restarted with {out['history_hours']:g} h learnt the day before"
            if out.get("kv_reserve", "asked") != "asked":
                load += f", KV room: {out['kv_reserve']}"
            lines += [f"### {trace}, {start} start{load}, warm-up {out['warmup_s']:g} s{tag}", "",
                      f"{out['cluster']} + {out['catalog']}, {out['hours']:g} h traces, seeds {seeds[0]}..{seeds[-1]} "
                      f"({len(seeds)}); mean ± half-width of the 95 % t interval over seeds.", ""]
            labels = {**{m: lab for m, (lab, _) in METRICS.items()}, **DESCRIBED}
            ms = [m for m in labels if any(m in g["policies"][p] for p in g["policies"])]
            lines.append("| policy | " + " | ".join(labels[m] for m in ms) + " |")
            lines.append("|---|" + "---:|" * len(ms))
            for p, t in g["policies"].items():
                name = f"**{p}**" if p in OURS else f"{p} (sees the future)" if p in REFERENCES else p
                lines.append(f"| {name} | " + " | ".join(_cell(t.get(m)) for m in ms) + " |")
            lines.append("")
            here = [r for r in out["rows"] if r["start"] == start and r["trace"] == trace]
            lines += _where_it_went(here, g["policies"]) + [""]
            tails = _tails(here, g["policies"])
            lines += tails + [""] if tails else []
            if g.get("drop_more_calls"):
                lines += [f"Drop more calls than the policy that drops fewest (no best baseline): "
                          f"{', '.join(g['drop_more_calls'])}.", ""]
            ours = list(g["ours_vs_best"])
            if ours:
                lines.append("| metric | best baseline (mean) | " + " | ".join(f"{o} / best [95 % CI]" for o in ours) + " |")
                lines.append("|---|---|" + "---|" * len(ours))
                for m, b in g["best_baseline"].items():
                    cells = []
                    for o in ours:
                        c = g["ours_vs_best"][o].get(m)
                        if c is None:
                            cells.append("n/a")
                        elif c["ratio"] is not None and c["ratio_ci95"] is not None:
                            cells.append(f"{c['ratio']:.3f} [{c['ratio_ci95'][0]:.3f}, {c['ratio_ci95'][1]:.3f}] "
                                         f"**{c['verdict']}**")
                        elif c["diff_ci95"] is not None:
                            cells.append(f"diff {c['diff_mean']:+.3g} [{c['diff_ci95'][0]:+.3g}, {c['diff_ci95'][1]:+.3g}] "
                                         f"**{c['verdict']}**")
                        else:
                            cells.append(f"diff {c['diff_mean']:+.3g} (one seed, no interval)")
                    lines.append(f"| {METRICS[m][0]} | {b} ({g['policies'][b][m]['mean']:.3g}) | " + " | ".join(cells) + " |")
                lines.append("")
            lines += _target_lines(g.get("targets", []))
    lines += _call_graph_lines(out.get("call_graph") or {})
    lines.append(f"Command: `{out['command']}` (commit {out['git']}, {out['date']}). Best baseline per metric over "
                 f"{', '.join(out['baselines'])}; oracle left out (offline MILP). Verdict `wins` only when the paired "
                 f"difference's 95 % interval excludes parity.")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--seeds", default=None, help="evaluation seeds (>= 100): 100-109 (the default), 100..109 or 100,101")
    ap.add_argument("--tuning", action="store_true", help="allow seeds below 100 (tuning seeds 1-10)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds simulated but left out of every metric (default 1800, or a quarter of a shorter trace)")
    ap.add_argument("--cold", action="store_true", help="add the cold-start table (same warm-up) beside the warm one")
    ap.add_argument("--traces", default=None, help=f"comma-separated subset of {','.join(TRACES)} (or any preset)")
    ap.add_argument("--policies", default=None, help="comma-separated subset of the registered policies but oracle "
                                                       "(default: all of them but foresight)")
    ap.add_argument("--load", type=float, default=1.0, help="multiply the presets' arrival rates (3: three times the load)")
    ap.add_argument("--restart", type=float, default=None, metavar="HOURS",
                    help="a restart: every policy first takes up what it learnt (`Policy.learnt`) over HOURS of "
                         "the day before (the same preset at seed + 1000); with --warmup 0, the first hours after it")
    ap.add_argument("--planner", default="", help='PlannerConfig fields for our planners, e.g. "scale_out_calls=3" '
                    "(the baselines are unchanged)")
    ap.add_argument("--kv-reserve", default="asked", choices=KV_RESERVES,
                    help="KV room an admitted call holds: for its max_tokens (the fair table's), for the tokens "
                         "it will write (never preempted), or taken as it writes, with preemption "
                         "(SimConfig.kv_reserve)")
    ap.add_argument("--cluster", default="hetero16")
    ap.add_argument("--catalog", default="agent-team")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument("--from", dest="rows_from", default=None, metavar="JSON[,JSON...]",
                    help="no replays: table the rows of earlier runs' --json files together, paired by seed "
                         "(each trace with the policies that have every seed; --seeds, --traces, --policies filter)")
    args = ap.parse_args(argv)
    if args.rows_from:
        return tabulate_saved(args)
    seeds = parse_seeds(args.seeds or "100-109")
    if min(seeds) < 100 and not args.tuning:
        raise SystemExit(f"--seeds {args.seeds}: seeds below 100 are tuning seeds (DESIGN.md §4); figures for docs "
                         f"come from seeds >= 100. Pass --tuning to run them anyway.")
    if len(seeds) < 10 and not args.tuning:
        print(f"note: {len(seeds)} seeds; figures quoted in docs need at least ten", file=sys.stderr)
    traces = _names(args.traces, PRESETS, "--traces") if args.traces else list(TRACES)
    if "real-sessions" in traces:
        try:
            rounds_path()
        except InputError as e:  # before any replay: named, it is an error; by default, a note
            if args.traces:
                raise SystemExit(f"--traces real-sessions: {e}") from None
            traces.remove("real-sessions")
            print(f"note: real-sessions left out: {e}", file=sys.stderr)
    allowed = [p for p in REGISTRY if p not in EXCLUDED]
    policies = (_names(args.policies, allowed, "--policies (the oracle is left out of the fair table)")
                if args.policies else [p for p in allowed if p not in REFERENCES])
    span = args.hours * 3600.0
    warmup = args.warmup if args.warmup is not None else min(1800.0, span / 4)
    if warmup >= span:
        raise SystemExit(f"--warmup {warmup:g} s leaves nothing of a {args.hours:g} h trace to measure")
    try:
        planner = sw.parse_fields(args.planner)
        check_fields(planner)
    except ValueError as e:
        raise SystemExit(f"--planner {args.planner!r}: {e}") from None
    starts = ["warm"] + (["cold"] if args.cold else [])
    try:  # bad settings (an unknown planner field among them) fail here, not in a worker
        todo = [j for st in starts
                for j in sw.jobs([args.cluster], traces, seeds, policies, args.catalog, args.hours, start=st,
                                 warmup_s=warmup, load=args.load, planner=planner, history_hours=args.restart,
                                 sim={"kv_reserve": args.kv_reserve} if args.kv_reserve != "asked" else None)]
    except ValueError as e:
        raise SystemExit(str(e)) from None
    # The slowest replays first, so the pool's tail is short: our planners and prefetch-all, long traces.
    todo.sort(key=lambda j: (j["policy"] not in OURS + ("prefetch-all",), j["trace"] != "mixed-tenants"))
    t0, commit = time.time(), git_commit()  # the code the replays run: HEAD may move while they do

    def progress(done, total):
        el = time.time() - t0
        print(f"\r[{done}/{total}] {el:6.0f} s elapsed, ~{el / done * (total - done):6.0f} s left", end="",
              file=sys.stderr, flush=True)

    print(f"{len(todo)} replays on {args.workers} processes", file=sys.stderr)
    rows = sw.run_local(todo, args.workers, progress)
    print(file=sys.stderr)
    wall = time.time() - t0
    out = _output(rows, seeds, starts, traces, policies, commit, python=sys.executable, cluster=args.cluster,
                  catalog=args.catalog, hours=args.hours, load=args.load, tuning=args.tuning, warmup_s=warmup,
                  workers=args.workers, wall_s=round(wall, 1), history_hours=args.restart, kv_reserve=args.kv_reserve)
    _write(out, args)
    print(f"{len(rows)} replays in {wall:.0f} s", file=sys.stderr)
    return out


def call_graph(rows: list[dict], seeds: list[int], start: str = "warm") -> dict:
    """What the call order is worth (issue 22, seed 001), for each of our planners with rows on
    both swe-team traces beside frequency's (`claims.call_order_worth`)."""
    rows = [r for r in rows if r["start"] == start]
    have = {(r["trace"], r["policy"]) for r in rows}
    R = Rows(rows, seeds, ["frequency"], list(OURS))
    out = {}
    for p in OURS:
        if not all((t, q) in have for t in ("swe-team", "swe-team-shuffled") for q in ("frequency", p)):
            continue  # not asked for: no note
        try:
            g, shrink = call_order_worth(R, p)
        except (KeyError, ValueError) as e:
            print(f"note: call-graph figure of {p} left out: {e}", file=sys.stderr)
            continue
        out[p] = {"over_frequency": g, "shrink": shrink}
    return out


def _call_graph_lines(cg: dict) -> list[str]:
    if not cg:
        return []
    cells = []
    for p, c in cg.items():
        a, b, d = c["over_frequency"]["swe-team"], c["over_frequency"]["swe-team-shuffled"], c["shrink"]
        cells.append(f"{p} {a['ratio']:.2f} → {b['ratio']:.2f} "
                     f"({d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}])")
    return ["Call-graph information, handoff-stall P95 ÷ frequency's, swe-team → shuffled (the move, paired "
            "95 % interval; above 0: the gain shrinks without the call order): " + "; ".join(cells) + ".", ""]


def _output(rows: list[dict], seeds: list[int], starts: list[str], traces: list[str], policies: list[str],
            git: str | None, **fields) -> dict:
    """The run's JSON: the fair table per start and trace (each with the policies that have a row
    for every seed, in `policies` order), what it compares and how, and `fields`."""
    tables = {}
    for st in starts:
        tables[st] = {}
        for tr in [t for t in traces if any(r["start"] == st and r["trace"] == t for r in rows)]:
            group = [r for r in rows if r["start"] == st and r["trace"] == tr]
            have = {(r["policy"], r["seed"]) for r in group}
            pols = [p for p in policies if all((p, s) in have for s in seeds)]
            left = sorted({r["policy"] for r in group} - set(pols))
            if left:
                print(f"note: {st} {tr}: left out {', '.join(left)} (not every seed)", file=sys.stderr)
            tables[st][tr] = summarise(group, seeds, pols)
    return {"benchmark": "bench_policies", "statebudget": __version__,
            "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git": git, **fields, "seeds": seeds, "starts": starts, "traces": traces, "policies": policies, "ours": [p for p in OURS if p in policies],
            "baselines": _baselines(policies),
            "references": [p for p in policies if p in REFERENCES], "excluded": list(EXCLUDED),
            "metrics": {m: {"label": lab, "better": b} for m, (lab, b) in METRICS.items()}, "described": DESCRIBED,
            "comparison": "paired difference ours - best baseline per seed, 95 % Student t interval; ratio = "
                          "1 + diff / mean(best); verdict wins/loses only when the interval excludes 0",
            "tables": tables, "call_graph": call_graph(rows, seeds) if "warm" in starts else {}, "rows": rows}


def _write(out: dict, args) -> None:
    """The fair table as markdown on stdout, and to `--json` / `--markdown` where given."""
    md = markdown(out)
    print(md)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(md)


def tabulate_saved(args) -> dict:
    """`--from`: the fair table of rows saved by earlier runs (warm and cold as they have them)."""
    try:
        rows = load_rows(args.rows_from)
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"--from {args.rows_from}: {e}") from None
    if args.seeds:
        keep = set(parse_seeds(args.seeds))
        rows = [r for r in rows if r["seed"] in keep]
    if args.traces:
        rows = [r for r in rows if r["trace"] in args.traces.split(",")]
    if args.policies:
        rows = [r for r in rows if r["policy"] in args.policies.split(",")]
    seen = set()
    for r in rows:
        k = (r["start"], r["trace"], r["policy"], r["seed"], r.get("load", 1.0), r.get("history_hours"))
        if k in seen:
            raise SystemExit(f"--from: two rows for {k}: the files overlap; name fewer files or filter with --seeds")
        seen.add(k)
    if not rows:
        raise SystemExit(f"--from {args.rows_from}: no rows left to table")
    same = ("cluster", "catalog", "hours", "warmup_s", "load", "history_hours")
    if len({str(r.get("sim")) for r in rows}) > 1:
        raise SystemExit(f"--from: the rows differ in their simulator settings "
                         f"({sorted({str(r.get('sim')) for r in rows})}); filter them")
    for f in same:  # a table pairs like with like
        if len({r.get(f) for r in rows}) > 1:
            raise SystemExit(f"--from: the rows differ in {f} ({sorted({str(r.get(f)) for r in rows})}); filter them")
    seeds = sorted({r["seed"] for r in rows})
    starts = [st for st in ("warm", "cold") if any(r["start"] == st for r in rows)]
    out = _output(rows, seeds, starts, sorted({r["trace"] for r in rows}), sorted({r["policy"] for r in rows}),
                  git_commit(), **{"from": args.rows_from}, **{f: rows[0].get(f) for f in same},
                  kv_reserve=(rows[0].get("sim") or {}).get("kv_reserve", "asked"),
                  tuning=min(seeds) < 100)
    _write(out, args)
    return out


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
