"""The simulator's commands: replay, oracle, sweep, layout, bench planner, presets."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

from .common import (CatalogOpt, ClusterOpt, LayoutOpt, TraceOpt, check_outputs, console, err, fail, guard,
                     layout_text, load_layout_checked, load_trace_warned, progress_bar, write_json)
from .render import print_by_model, print_oracle, print_replay, print_sweep


def _policy_list(spec: str) -> list[str]:
    """Comma-separated specs `POLICY[:QUEUE[:KV]]`, each checked."""
    from ..core.programs import parse_spec
    from ..policies import REGISTRY

    names = [p.strip() for p in spec.split(",") if p.strip()]
    if not names:
        raise ValueError("--policy names no policy")
    for n in names:
        try:
            parse_spec(n, REGISTRY)
        except ValueError as e:
            raise ValueError(f"--policy: {e}") from None
    return names


def _layout_maker(homes: tuple | None, names: list[str], holds: bool = False):
    """The policy factory of a replay: our planners with the layout `homes` (and `layout_holds`;
    none: the registry's policies as they are); the baselines have no use for one, and a note says so."""
    from ..core.programs import parse_spec
    from ..policies import REGISTRY, make_policy
    from ..policies.ours import StateBudget
    from ..sim.sweep import policy_maker

    if homes is None:
        return make_policy
    ours = {parse_spec(n, REGISTRY)[0] for n in names} & {n for n, c in REGISTRY.items() if issubclass(c, StateBudget)}
    if not ours:
        raise ValueError("--layout: none of the policies takes a layout (our planners do: statebudget, "
                         "statebudget-lease, statebudget-track)")
    others = [n for n in names if parse_spec(n, REGISTRY)[0] not in ours]
    if others:
        err.print(f"note: --layout is for our planners; {', '.join(others)} place models as they always do", highlight=False)
    return lambda base: policy_maker({"policy": base, "planner": {"homes": homes, "layout_holds": holds}})(base)


@guard
def replay(
    cluster: ClusterOpt,
    catalog: CatalogOpt,
    trace: TraceOpt,
    policy: Annotated[str, typer.Option(help="comma-separated POLICY[:QUEUE[:KV]]; queues fcfs|plas|atlas|auto, "
                                              "tool-wait KV preserve|swap|discard|adaptive")] = "ondemand",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the §8 report here")] = None,
    plots: Annotated[Optional[Path], typer.Option(help="write plots (PNG) into this folder")] = None,
    html_out: Annotated[Optional[Path], typer.Option("--html", help="write one self-contained HTML page (table and "
                                                                   "plots embedded) here")] = None,
    seed: Annotated[Optional[int], typer.Option(help="simulator seed (MoE page sampling); default: the trace's seed "
                                                     "(its header), as `sweep` does, else 0", min=0)] = None,
    check: Annotated[bool, typer.Option(help="check capacity invariants after every event (slower)")] = False,
    profile: Annotated[Optional[Path], typer.Option(help="a `statebudget profile` file: measured bandwidths replace the presets'")] = None,
    prefill_slots: Annotated[Optional[int], typer.Option(help="prefills a GPU runs at once (default: any number, sharing its FLOP/s); "
                                                              "with a limit calls queue for compute and --policy's QUEUE matters", min=1)] = None,
    max_batch: Annotated[int, typer.Option(help="calls a GPU runs at once (an engine's max_num_seqs); calls past it "
                                                "queue, in --policy's QUEUE order", min=1)] = 32,
    admit_starve: Annotated[str, typer.Option(help="seconds a call waits for HBM before it holds its GPUs "
                                                   "(backfill still allowed), or 'none' for no reservation")] = "60",
    call_failure_rate: Annotated[float, typer.Option(help="chance that a call attempt fails while it runs (its KV on "
                                                          "that GPU is lost; it is retried, keeping its service)",
                                                     min=0.0, max=0.99)] = 0.0,
    kv_reserve: Annotated[str, typer.Option(help="KV room an admitted call holds: asked (for its max_tokens), written "
                                                 "(for the tokens it will write, never preempted) or paged (taken "
                                                 "as it writes; the engine preempts its newest call)")] = "asked",
    start: Annotated[str, typer.Option(help="state at t = 0: warm (every model's weights in host DRAM of every node "
                                            "that holds them, no engine awake) or cold (all weights on NVMe)")] = "warm",
    warmup: Annotated[float, typer.Option("--warmup", help="seconds simulated first: the calls of programs that "
                                                           "start in them are left out of every metric", min=0.0)] = 0.0,
    by_model: Annotated[bool, typer.Option("--by-model", help="also print, per policy, each model's stall, TTFT P95, "
                                                              "SLO attainment at 5 and the GPU groups its calls ran on")] = False,
    timeline: Annotated[Optional[Path], typer.Option(help="write every load, eviction and engine stop of models' "
                                                          "weights, with its cause, here (JSON lines, one per event)")] = None,
    layout: LayoutOpt = None,
):
    """Replay a trace against policies; print a table, write the report and plots."""
    check_outputs(files=[("--json", json_out), ("--html", html_out), ("--timeline", timeline)], folders=[("--plots", plots)])
    from ..models.load import check_compatible, load_catalog, load_cluster
    from ..core.programs import parse_admit_starve
    from ..sim.config import SimConfig
    from ..sim.runner import replay as run_replay
    from ..sim.runner import report_json

    names = _policy_list(policy)
    starve = parse_admit_starve(admit_starve)
    from ..sim.config import KV_RESERVES, START_MODES
    if start not in START_MODES:
        raise ValueError(f"--start must be one of {', '.join(START_MODES)}, got {start!r}")
    if kv_reserve not in KV_RESERVES:
        raise ValueError(f"--kv-reserve must be one of {', '.join(KV_RESERVES)}, got {kv_reserve!r}")
    cl, cat, tr = load_cluster(cluster), load_catalog(catalog), load_trace_warned(trace)
    check_compatible(cl, cat, tr, str(trace))
    homes, holds = load_layout_checked(layout, cl, cat)
    make = _layout_maker(homes, names, holds)
    if seed is None:
        seed = tr.header.seed if tr.header.seed is not None else 0
    last = max(p.start for p in tr.programs)
    if warmup > last:  # the metrics count the programs that start at or after the warm-up
        fail(f"--warmup {warmup:g} s leaves nothing of {trace} to measure: its last program starts at {last:g} s")
    horizon = last + 1.0
    t0 = time.perf_counter()
    with progress_bar(TextColumn("{task.description:<14}"), BarColumn(), TextColumn("sim {task.fields[t]:>7.0f} s"),
                   TimeElapsedColumn()) as prog:
        tasks = {n: prog.add_task(n, total=horizon, t=0.0) for n in names}

        def progress(name, t):
            prog.update(tasks[name], completed=min(t, horizon), t=t)

        prof = None
        if profile is not None:
            from ..engine_adapters.local.profile import load_profile
            prof = load_profile(profile, cl)
        config = SimConfig(seed=seed, check_invariants=check, prefill_slots=prefill_slots, max_batch=max_batch,
                           admit_starve_s=starve, call_failure_rate=call_failure_rate, start=start, warmup_s=warmup,
                           kv_reserve=kv_reserve,
                           timeline=timeline is not None)
        result = run_replay(cl, cat, tr, names, config, progress=progress, profile=prof, make=make)
        for n in names:
            prog.update(tasks[n], completed=horizon)
    wall = time.perf_counter() - t0
    rep = result.report
    print_replay(rep, tr, cl, cat, wall)
    if by_model:
        print_by_model(rep, cl)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(report_json(rep))
        console.print(f"report: {json_out}")
    if timeline:
        timeline.parent.mkdir(parents=True, exist_ok=True)
        with timeline.open("w") as f:
            for n in names:
                for e in result.results[n].timeline:
                    f.write(json.dumps({"policy": n, **e}) + "\n")
        console.print(f"timeline: {timeline} ({sum(len(result.results[n].timeline) for n in names)} events)")
    if plots:
        from ..sim.plots import write_plots

        paths = write_plots(result.results, plots)
        console.print(f"plots: {', '.join(str(p) for p in paths)}")
    if html_out:
        from ..sim.html import replay_page

        console.print(f"page: {replay_page(rep, result.results, html_out, trace.name)}")


@guard
def oracle(
    cluster: ClusterOpt,
    catalog: CatalogOpt,
    trace: TraceOpt,
    time_limit: Annotated[float, typer.Option(help="seconds per rolling-horizon window", min=0.1)] = 10.0,
    backend: Annotated[str, typer.Option(help="scip | cp-sat | highs | cbc")] = "scip",
    window: Annotated[int, typer.Option(help="slots per window", min=2)] = 24,
    overlap: Annotated[int, typer.Option(help="slots re-planned by the next window", min=0)] = 8,
    warm_start: Annotated[bool, typer.Option(help="start each window from the greedy schedule")] = True,
    lead: Annotated[str, typer.Option(help="planner: the greedy warm start follows the online planner's decisions "
                                           "(statebudget-lease replayed first); none: the greedy rule alone")] = "planner",
    replicas: Annotated[int, typer.Option(help="candidate GPU groups per model a call may run on", min=1)] = 2,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the oracle block and windows here")] = None,
):
    """Solve the offline MILP (full future knowledge) over a trace, window by window."""
    check_outputs(files=[("--json", json_out)])
    from ..models.load import check_compatible, load_catalog, load_cluster
    from ..core.costs import CostModel
    from ..solvers.milp import oracle_summary

    cl, cat, tr = load_cluster(cluster), load_catalog(catalog), load_trace_warned(trace)
    check_compatible(cl, cat, tr, str(trace))
    if lead not in ("planner", "none"):
        fail(f"--lead: expected planner or none, got {lead!r}")
    cost = CostModel(cl, cat)
    guide_from = None
    if lead == "planner":
        from ..sim.lead import planner_lead

        guide_from = planner_lead(cl, cat, tr, cost)
    with progress_bar(TextColumn("MILP windows"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} slots"),
                   TimeElapsedColumn()) as prog:
        task = prog.add_task("milp", total=1)
        out = oracle_summary(cl, cat, tr, cost, window, overlap, backend, time_limit,
                             progress=lambda done, total: prog.update(task, completed=done, total=total),
                             warm_start=warm_start, replicas=replicas, guide_from=guide_from)
    print_oracle(out)
    if json_out:
        write_json(json_out, out)


@guard
def sweep(
    traces: Annotated[str, typer.Option(help="comma-separated trace presets")] = "swe-team,swe-team-shuffled",
    seeds: Annotated[str, typer.Option(help="comma-separated seeds")] = "1,2,3",
    policy: Annotated[str, typer.Option(help="comma-separated policies; all: every registered policy but the "
                                              "two that see the future (oracle, foresight)")] = "all",
    clusters: Annotated[str, typer.Option(help="comma-separated cluster presets or files")] = "hetero16",
    catalog: CatalogOpt = "agent-team",
    hours: Annotated[float, typer.Option(help="trace length")] = 2.0,
    start: Annotated[str, typer.Option(help="state at t = 0: cold (weights on NVMe) or warm (weights in host DRAM, "
                                            "as an operator preloads them); docs/model.md")] = "warm",
    warmup: Annotated[float, typer.Option("--warmup", help="seconds simulated first: the calls of programs that "
                                                           "start in them are left out of every metric", min=0.0)] = 0.0,
    workers: Annotated[Optional[int], typer.Option(help="local processes (default: one per core)", min=1)] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", help="run on a Ray cluster: auto or HOST:PORT")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write all rows here")] = None,
):
    """Replay a grid (clusters x traces x seeds x policies) into one table."""
    check_outputs(files=[("--json", json_out)])
    from ..models.load import load_catalog, load_cluster
    from ..sim import sweep as sw
    from ..traces.generators import PRESETS

    from ..policies import REGISTRY, SEES_FUTURE

    names = [p for p in REGISTRY if p not in SEES_FUTURE] if policy.strip() == "all" else _policy_list(policy)
    if start not in ("cold", "warm"):
        raise ValueError(f"--start: expected cold or warm, got {start!r}")
    if not (math.isfinite(hours) and hours > 0):  # an infinite trace never ends; nan passes comparisons
        raise ValueError(f"--hours: expected a positive, finite number of hours, got {hours:g}")
    if warmup >= hours * 3600.0:
        raise ValueError(f"--warmup {warmup:g} s leaves nothing of a {hours:g} h trace to measure")
    trace_list = [t.strip() for t in traces.split(",") if t.strip()]
    for t in trace_list:
        if t not in PRESETS:
            raise ValueError(f"--traces: unknown trace preset {t!r} (known: {', '.join(PRESETS)})")
    try:
        seed_list = [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds: expected comma-separated integers, got {seeds!r}") from None
    if not seed_list or min(seed_list) < 0:
        raise ValueError(f"--seeds: expected comma-separated seeds of 0 or more, got {seeds!r}")
    if not trace_list:
        raise ValueError(f"--traces names no trace preset (known: {', '.join(PRESETS)})")
    cluster_list = [c.strip() for c in clusters.split(",") if c.strip()]
    for c in cluster_list:
        load_cluster(c)
    load_catalog(catalog)
    todo = sw.jobs(cluster_list, trace_list, seed_list, names, catalog, hours, start=start, warmup_s=warmup)
    with progress_bar(TextColumn("sweep"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} replays"),
                   TimeElapsedColumn()) as prog:
        task = prog.add_task("sweep", total=len(todo))
        report = lambda done, total: prog.update(task, completed=done)  # noqa: E731
        rows = sw.run_ray(todo, ray, report) if ray else sw.run_local(todo, workers, report)
    print_sweep(rows, [c for c in sw.COLUMNS if all(r.get(c) is not None for r in rows)], ray, start, warmup)
    empty = sum(1 for r in rows if not r.get("calls_completed"))
    if empty:
        why = f"--hours {hours:g} is too short" + (f", or --warmup {warmup:g} s too long" if warmup else "")
        err.print(f"[yellow]warning:[/] {empty} of {len(rows)} replays measured no call: {why}", highlight=False)
    if json_out:
        write_json(json_out, {"start": start, "warmup_s": warmup, "hours": hours, "rows": rows})


@guard
def bench_planner_cmd(
    cluster: ClusterOpt = "hetero16",
    catalog: CatalogOpt = "agent-team",
    programs: Annotated[str, typer.Option(help="comma-separated numbers of live programs to reach")] = "200,1000",
    policy: Annotated[str, typer.Option(help="comma-separated policies to time")] = "statebudget-lease,statebudget",
    trace: Annotated[str, typer.Option("--trace", help="trace preset whose arrival rate is scaled")] = "swe-team",
    window: Annotated[float, typer.Option(help="simulated seconds whose hooks are timed", min=10.0)] = 300.0,
    seed: Annotated[int, typer.Option(help="trace and simulator seed", min=0)] = 0,
    repeat: Annotated[int, typer.Option(help="replays of the timed window (the same decisions each time): "
                                             "with more than one, each hook's least time is reported too, "
                                             "most of the machine's noise taken out", min=1)] = 1,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the results here")] = None,
):
    """Wall time of whole policy hooks during a replay with about N live programs (BENCHMARKS.md, "Decision time")."""
    check_outputs(files=[("--json", json_out)])
    from ..models.load import check_compatible, load_catalog, load_cluster
    from ..sim.bench import bench_planner
    from ..traces.generators import PRESETS

    try:
        counts = [int(x) for x in programs.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--programs: expected comma-separated integers, got {programs!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"--programs: expected positive integers, got {programs!r}")
    if trace not in PRESETS:
        raise ValueError(f"--trace: unknown trace preset {trace!r} (known: {', '.join(PRESETS)})")
    names = _policy_list(policy)
    cl, cat = load_cluster(cluster), load_catalog(catalog)
    check_compatible(cl, cat)
    out = []
    for n in counts:
        for name in names:
            res = bench_planner(cl, cat, n, policy=name, preset=trace, seed=seed, window_s=window, repeat=repeat)
            out.append(res)
            fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
            runs = "; ".join(f"p50 {fmt(d['p50'])} ms, p99 {fmt(d['p99'])} ms" for d in res["decision_ms_runs"])
            console.print(f"{name}, {n} programs asked, {res['live_mean']:.0f} live on average "
                          f"(max {res['live_max']}), {res['hooks']} hooks ({window:g} s of {trace} at load "
                          f"x{res['load']:.2f}): decision {runs}")
            if repeat > 1 and res["decisions_differ"]:
                console.print(f"  [yellow]the {repeat} runs decided differently (a solver on a wall-clock limit?): "
                              "no least time per hook[/yellow]")
            elif repeat > 1:
                d = res["decision_ms_least"]
                console.print(f"  each hook's least time over the {repeat} runs: p50 {fmt(d['p50'])} ms, "
                              f"p99 {fmt(d['p99'])} ms, max {fmt(d['max'])} ms")
            console.print(f"  reference loop on this machine (`sim/bench.py`, Python {res['python']}): "
                          f"{res['machine_reference_ms']:.2f} ms (lower is faster; a rough indicator of its speed)")
            slow = sorted(res["decision_ms_by_hook"].items(), key=lambda kv: -(kv[1]["p99"] or 0.0))
            console.print("  by hook (p99): " + ", ".join(f"{n} {fmt(d['p99'])} ms ({d['hooks']})" for n, d in slow))
    if json_out:
        write_json(json_out, {"results": out})


@guard
def layout(
    cluster: ClusterOpt,
    catalog: CatalogOpt,
    history: Annotated[list[Path], typer.Option("--history", help="a trace of the deployment's past calls "
                                                                   "(JSONL, format v1); repeat for more")],
    policy: Annotated[str, typer.Option(help="the planner the layout is for")] = "statebudget-lease",
    budget: Annotated[int, typer.Option(help="layouts replayed at most", min=2)] = 24,
    tolerance: Annotated[float, typer.Option(help="how much worse than no layout (or --against) a kept layout's "
                                                  "TTFT P95 and program-latency P95 may be (0.05: 5 %)", min=0.0)] = 0.05,
    against: Annotated[str, typer.Option(help="comma-separated baselines (what you would run instead, e.g. "
                                              "sleep-swap,forecast-prewarm): a kept layout's TTFT and program P95 "
                                              "are held to the best of theirs on the history, not to no layout's")] = "",
    warmup: Annotated[float, typer.Option("--warmup", help="seconds of each replay no figure counts",
                                          min=0.0)] = 1800.0,
    workers: Annotated[Optional[int], typer.Option(help="local processes (default: one per core)", min=1)] = None,
    holds: Annotated[bool, typer.Option("--holds", help="replay every layout holding: a model in it is homed on its "
                                                        "group even while it has a copy elsewhere (the file says "
                                                        "`holds: true`)")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write every layout tried here")] = None,
):
    """Choose an operator's layout (a GPU group per model, `PlannerConfig.homes`) by replaying the
    history's traces with candidate layouts (docs/tracking.md, "A layout fixed in advance")."""
    check_outputs(files=[("--json", json_out)])
    from ..models.load import check_compatible, load_catalog, load_cluster
    from ..sim.layouts import METRICS, search

    from ..core.programs import parse_spec
    from ..policies import BASELINE_NAMES, OURS, REGISTRY

    name = _policy_list(policy)[0]
    if parse_spec(name, REGISTRY)[0] not in OURS:
        raise ValueError(f"--policy {name}: a layout is for our planners ({', '.join(OURS)}); the baselines "
                         "do not take one")
    refs = _policy_list(against) if against else []
    for ref in refs:
        if parse_spec(ref, REGISTRY)[0] not in BASELINE_NAMES:
            raise ValueError(f"--against {ref}: name baselines (what would run instead of our planner)")
    cl, cat = load_cluster(cluster), load_catalog(catalog)
    jobs = []
    for path in history:
        tr = load_trace_warned(path)  # a bad file fails here, naming it, before any replay
        check_compatible(cl, cat, tr, str(path))
        last = max((p.start for p in tr.programs), default=0.0)
        if warmup >= last:
            raise ValueError(f"--warmup {warmup:g} s: no program of {path} starts after it (the last at {last:g} s)")
        jobs.append({"cluster": cluster, "catalog": catalog, "trace": str(path), "trace_file": str(path),
                     "seed": tr.header.seed or 0, "hours": tr.header.hours or 0.0, "start": "warm",
                     "warmup_s": float(warmup)})
    with progress_bar(TextColumn("{task.description}"), TimeElapsedColumn()) as prog:
        task = prog.add_task("replaying no layout and a first one")
        found = search(cl, cat, jobs, name, budget, tolerance, workers,
                       lambda msg: prog.update(task, description=escape(msg)), against=refs, holds=holds)
    ref = f"the best of {', '.join(found.against)}" if refs else "no layout's"
    for p, n in found.dropped.items():
        err.print(f"note: {escape(p)} drops {n:g} calls a trace, more than the others: not a reference "
                  "(dropped calls flatter its latencies)", highlight=False)
    console.print(f"{len(found.tried) - 1} layouts and no layout replayed on {len(jobs)} trace(s), means (handoff P95, TTFT P95, "
                  f"program P95, s); * acceptable within {tolerance:.0%} of {ref} TTFT and program P95:")

    def row(means: dict) -> str:
        return " ".join("     n/a" if means[m] is None else f"{means[m]:8.{d}f}" for m, d in zip(METRICS, (3, 2, 1)))

    for p, means in found.against.items():
        console.print(f"   {row(means)}  {escape(p)} (baseline)", highlight=False)
    for s in sorted(found.tried, key=lambda s: math.inf if s.means[METRICS[0]] is None else s.means[METRICS[0]]):
        what = "no layout" if s.layout is None else layout_text(s.layout)
        mark = "*" if s.acceptable else " "
        console.print(f" {mark} {row(s.means)}  {escape(what)}", highlight=False)
    if found.chosen.layout is None:
        some = any(t.acceptable for t in found.tried if t.layout is not None)
        console.print("kept: no layout (" + ("no acceptable layout has a lower handoff P95 than no layout on this "
                                             "history" if some else "no layout tried is acceptable")
                      + ("" if found.none.acceptable else "; no layout itself is over the limits") + ")")
    else:
        where = f"--layout {escape(str(json_out))}" if json_out else "--layout FILE, a FILE with"
        import yaml

        text = yaml.safe_dump({"homes": {m: list(g) for m, g in found.chosen.layout}, **({"holds": True} if holds else {})},
                              default_flow_style=None, sort_keys=False)
        console.print(f"kept (`replay` and `serve` take it as {where}):\n{escape(text)}", end="", highlight=False)
    if json_out:
        write_json(json_out, {"cluster": cl.name, "catalog": cat.name, "policy": name, "budget": budget,
                              "tolerance": tolerance, "warmup_s": warmup,
                              "against": found.against, "not_references": found.dropped,
                              "history": [str(p) for p in history], "kept": found.chosen.layout, "holds": holds,
                              "tried": [{"layout": s.layout, "acceptable": s.acceptable, **s.means}
                                        for s in found.tried]})


def presets():
    """List the built-in cluster, catalog and trace presets."""
    from ..models.load import preset_names
    from ..traces.generators import PRESETS

    console.print(f"clusters: {', '.join(preset_names('clusters'))}")
    console.print(f"catalogs: {', '.join(preset_names('catalogs'))}")
    console.print(f"traces:   {', '.join(PRESETS)}")


@guard
def evidence(
    out: Annotated[Path, typer.Option(help="folder for index.html (self-contained) and evidence.json")] = Path("out/evidence"),
    quick: Annotated[bool, typer.Option(help="5 evaluation seeds instead of 10 (both on fair ground: 2-hour traces, "
                                             "30-minute warm-up); a few minutes on 2 cores")] = False,
    workers: Annotated[Optional[int], typer.Option(help="local processes (default: one per core)", min=1)] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", help="run on a Ray cluster: auto or HOST:PORT")] = None,
    data: Annotated[Path, typer.Option(help="real workload data (azure-llm-2023/, tracelab/, servegen/): imported "
                                            "and replayed under every policy; skipped, and said so, if absent")]
    = Path("../shared/data/real"),
    profile: Annotated[Optional[Path], typer.Option(help="a `statebudget profile` of the target machine: the "
                                                         "restore-versus-recompute answer uses its rates")] = None,
):
    """Measure the seed documents' claims on fair ground and write one report to read in a browser."""
    check_outputs(folders=[("--out", out)])
    from ..sim import evidence as ev

    prof = None
    if profile is not None:  # checked against hetero16, the cluster the crossover answer is for
        from ..engine_adapters.local.profile import load_profile
        from ..models.load import load_cluster
        prof = load_profile(profile, load_cluster("hetero16"))

    cfg, todo = ev.plan(quick)
    err.print(f"evidence: {len(todo)} replays on the presets, then the real traces found under {data} "
              f"({'quick' if quick else 'full'}: seeds {cfg['seeds'][0]}-{cfg['seeds'][-1]}, {cfg['hours']:g} h traces)")
    with progress_bar() as bar:
        task = bar.add_task("replays", total=len(todo))
        res = ev.run(out, quick, workers, ray, progress=lambda done, total: bar.update(task, completed=done, total=total),
                     data=data, profile=prof)
    console.print(f"{res['replays']} replays in {res['wall_s']:.0f} s ({len(res['answers']['real_traces'])} real "
                  f"traces); open {out / 'index.html'}")
    a = res["answers"]
    if a.get("no_real_traces"):
        err.print(f"[yellow]warning:[/] {escape(a['no_real_traces'])}", highlight=False)
    console.print("  H4 against static: " + "; ".join(f"{o} {v}" for o, v in a["h4"]["verdict"].items()))
    console.print(f"  against the best baseline per metric: {a['best_baseline']['verdict']}; wins: "
                  f"{', '.join(a['best_baseline']['wins']) or 'none'}")
    console.print(f"  re-plan: {a['replan']['verdict']}")
