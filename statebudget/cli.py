"""The `statebudget` command. Bad input prints one line naming the file, the place and the
problem, and exits 2 (no traceback)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from .models.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
trace_app = typer.Typer(no_args_is_help=True, help="Generate, inspect and fit traces.")
app.add_typer(trace_app, name="trace")
bench_app = typer.Typer(no_args_is_help=True, help="Measure the planner itself.")
app.add_typer(bench_app, name="bench")
# Reports are read in logs and CI too: keep tables whole when there is no terminal to size them to.
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


# The options every command that reads a cluster, a catalog or a trace file shares.
ClusterOpt = Annotated[str, typer.Option(help="cluster file or preset (hetero16, hetero8, h200x8, single-a100, toy2)")]
CatalogOpt = Annotated[str, typer.Option(help="catalog file or preset (agent-team, solo, toy)")]
TraceOpt = Annotated[Path, typer.Option(help="trace file (JSONL, format v1)")]


def _fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _outputs(files=(), folders=()) -> None:
    """Refuse, before any work, output paths that cannot be written: a file option naming a
    folder, a folder option naming a file. `files`, `folders`: (option, path or None)."""
    for want_folder, pairs in ((False, files), (True, folders)):
        for option, path in pairs:
            if path is None:
                continue
            if path.exists() and path.is_dir() != want_folder:
                raise InputError(str(path), "", f"is a folder; {option} takes a file path" if path.is_dir()
                                 else f"is a file; {option} takes a folder")
            parent = next((p for p in path.parents if p.exists()), None)
            if parent is not None and not parent.is_dir():
                raise InputError(str(path), "", f"{parent} is a file, so {option} cannot be written there")


PLANNER_WAIT_S = 10.0  # how long `drive` waits for a planner that refuses connections (still starting)


def _check_planner(url: str) -> None:
    """GET /healthz before a long run, so that a wrong URL fails now: a refused connection is
    retried for PLANNER_WAIT_S (a planner still starting), any answer but 200 means it is not one."""
    import httpx

    deadline = time.monotonic() + PLANNER_WAIT_S
    while True:
        try:
            r = httpx.get(url.rstrip("/") + "/healthz", timeout=5.0)
            break
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    if r.status_code != 200:
        raise InputError(url, "", f"GET /healthz answered {r.status_code}: not a StateBudget planner's base URL")


def _check_port(host: str, port: int) -> None:
    """Bind each address `host` names, as uvicorn's asyncio server will (IPv6 v6-only, address
    families the machine lacks skipped), and fail in one line if one is taken or refused."""
    import errno
    import socket

    try:
        addrs = {a[4]: a[0] for a in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)}
    except socket.gaierror as e:
        _fail(f"--host {host}: {e.strerror}")
    for addr, family in addrs.items():
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(addr)
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:
                    continue
                hint = " (another server there? pick --port)" if e.errno == errno.EADDRINUSE else ""
                _fail(f"cannot listen on {host}:{port}: {e.strerror or e}{hint}")


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n")


def _guard(fn):
    """Turn bad input into one clear line and exit code 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        import httpx

        try:
            return fn(*a, **kw)
        except (InputError, ValueError, PermissionError) as e:
            _fail(str(e))
        except OSError as e:  # a path that cannot be written; any other OSError keeps its traceback
            if e.filename is None:
                raise
            _fail(f"{e.filename}: {e.strerror or e}")
        except httpx.HTTPError as e:  # a planner URL that is wrong, or a server that is down
            try:
                where = f" at {e.request.url}"
            except RuntimeError:  # an error raised before any request was made
                where = ""
            _fail(f"cannot reach the planner{where}: {e or type(e).__name__} (is the URL right, with http://, "
                  f"and the server up?)")
    return wrapper


@trace_app.command("gen")
@_guard
def trace_gen(
    preset: Annotated[str, typer.Option(help="swe-team | swe-team-shuffled | mapreduce | mixed-tenants | long-tail")],
    out: Annotated[Path, typer.Option(help="JSONL file to write")],
    seed: Annotated[int, typer.Option()] = 1,
    hours: Annotated[float, typer.Option(help="trace length; fractions allowed")] = 2.0,
    load: Annotated[float, typer.Option(help="multiply the preset's program arrival rate", min=0.01)] = 1.0,
    tenant_weights: Annotated[str, typer.Option(help="TENANT=WEIGHT,...: the fair share plas and atlas give each "
                                                "tenant (written to the header; 1 for a tenant not named)")] = "",
    catalog: Annotated[Optional[str], typer.Option(help="write the calls for this catalog (preset or file): a model "
                                                   "it lacks becomes its model at the same rank by size (e.g. toy, "
                                                   "for a toy2 service on a laptop)")] = None,
):
    """Generate a deterministic trace (same preset, seed, hours and load: same bytes)."""
    _outputs(files=[("--out", out)])
    from .models.load import load_catalog, write_trace
    from .core.programs import parse_tenant_weights
    from .traces.generators import for_catalog, generate

    weights = parse_tenant_weights(tenant_weights)
    trace = generate(preset, seed, hours, load)
    if catalog is not None:
        trace, renames = for_catalog(trace, load_catalog("agent-team"), load_catalog(catalog))
        if renames:
            console.print("models renamed for the catalog: " + ", ".join(f"{a} -> {b}" for a, b in sorted(renames.items())))
    if weights:
        tenants = sorted({p.tenant for p in trace.programs})
        unknown = sorted(set(weights) - set(tenants))
        if unknown:
            raise InputError("--tenant-weights", "", f"{', '.join(unknown)}: {preset} has no programs of that "
                             f"tenant (its tenants: {', '.join(tenants)})")
        trace = trace.model_copy(update={"header": trace.header.model_copy(update={"tenant_weights": weights})})
    out.parent.mkdir(parents=True, exist_ok=True)
    write_trace(trace, out)
    console.print(f"wrote {out}: {len(trace.programs)} programs, {trace.n_calls} calls")


@trace_app.command("stats")
@_guard
def trace_stats_cmd(
    trace: Annotated[Path, typer.Argument(help="trace file (JSONL, format v1)")],
    catalog: Annotated[Optional[str], typer.Option(help="catalog file or preset, for nominal call times")] = "agent-team",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the statistics as JSON")] = None,
):
    """What seed 001 asks to measure: call shares, switch matrix, concurrency, hotness, waits."""
    from .models.load import load_catalog, load_trace
    from .traces.stats import trace_stats

    tr = load_trace(trace)
    cat = load_catalog(catalog) if catalog else None
    s = trace_stats(tr, cat)
    if json_out:
        json_out.write_text(json.dumps(s, indent=1) + "\n")
    console.print(f"[bold]{trace}[/]: {s['programs']} programs, {s['calls']} calls, {s['handoffs']} handoffs")
    t = Table("model", "call share", title="Call share")
    for m, v in s["call_share"].items():
        t.add_row(m, f"{v:.1%}")
    console.print(t)
    models = list(s["switch_matrix"])
    t = Table("from \\ to", *models, title="Model switch matrix (previous call in the thread -> call)")
    for a in models:
        t.add_row(a, *[str(s["switch_matrix"][a][b]) for b in models])
    console.print(t)
    am = s["active_models"]
    console.print(f"Concurrently active models (zero-stall timeline): time share {am['time_share']}, P95 {am['p95']}")
    hl = s["hotness_half_life_s"]
    console.print(f"Hotness half-life: {hl:.0f} s" if hl else "Hotness half-life: longer than the trace allows to measure")
    t = Table("tool", "n", "p50 s", "p95 s", "p99 s", "max s", title="Tool waits")
    for tool, d in s["tool_wait_s"].items():
        t.add_row(tool, str(d["n"]), f"{d['p50']:.2f}", f"{d['p95']:.2f}", f"{d['p99']:.2f}", f"{d['max']:.1f}")
    console.print(t)
    c = s["context_tokens"]
    console.print(f"Context tokens: p50 {c['p50']:.0f}, p95 {c['p95']:.0f}, p99 {c['p99']:.0f}, max {c['max']:.0f}")
    h = s["hints"]
    console.print(f"Hints: {h['count']}, naming the wrong model {h['wrong_model']}, for cancelled calls {h['cancelled_targets']}")


@trace_app.command("fit")
@_guard
def trace_fit(
    data: Annotated[Path, typer.Option(help="folder with azure-llm-2023/ and tracelab/")] = Path("../shared/data/real"),
    out: Annotated[Optional[Path], typer.Option(help="where to write (default: the package's fitted.json)")] = None,
):
    """Refit the generators' token-length and tool-latency shapes to the real data."""
    from .traces.fit import FITTED_PATH, fit_real

    if not data.is_dir():
        raise InputError(str(data), "", "no such folder")
    res = fit_real(data)
    target = out or FITTED_PATH
    target.write_text(json.dumps(res, indent=1) + "\n")
    console.print(f"wrote {target}")


def _policy_list(spec: str) -> list[str]:
    """Comma-separated specs `POLICY[:QUEUE[:KV]]`, each checked."""
    from .core.programs import parse_spec
    from .policies import REGISTRY

    names = [p.strip() for p in spec.split(",") if p.strip()]
    if not names:
        raise ValueError("--policy names no policy")
    for n in names:
        try:
            parse_spec(n, REGISTRY)
        except ValueError as e:
            raise ValueError(f"--policy: {e}") from None
    return names


@app.command()
@_guard
def replay(
    cluster: ClusterOpt,
    catalog: CatalogOpt,
    trace: TraceOpt,
    policy: Annotated[str, typer.Option(help="comma-separated POLICY[:QUEUE[:KV]]; queues fcfs|plas|atlas|auto, "
                                              "tool-wait KV preserve|swap|discard|adaptive")] = "ondemand",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the §8 report here")] = None,
    plots: Annotated[Optional[Path], typer.Option(help="write plots (PNG) into this folder")] = None,
    seed: Annotated[Optional[int], typer.Option(help="simulator seed (MoE page sampling); default: the trace's seed "
                                                     "(its header), as `sweep` does, else 0")] = None,
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
):
    """Replay a trace against policies; print a table, write the report and plots."""
    _outputs(files=[("--json", json_out)], folders=[("--plots", plots)])
    from .models.load import check_compatible, load_catalog, load_cluster, load_trace
    from .core.programs import parse_admit_starve
    from .sim.runner import replay as run_replay
    from .sim.runner import report_json

    names = _policy_list(policy)
    starve = parse_admit_starve(admit_starve)
    cl, cat, tr = load_cluster(cluster), load_catalog(catalog), load_trace(trace)
    check_compatible(cl, cat, tr, str(trace))
    if seed is None:
        seed = tr.header.seed if tr.header.seed is not None else 0
    horizon = max(p.start for p in tr.programs) + 1.0
    t0 = time.perf_counter()
    with Progress(TextColumn("{task.description:<14}"), BarColumn(), TextColumn("sim {task.fields[t]:>7.0f} s"),
                  TimeElapsedColumn(), console=err, transient=not sys.stderr.isatty()) as prog:
        tasks = {n: prog.add_task(n, total=horizon, t=0.0) for n in names}

        def progress(name, t):
            prog.update(tasks[name], completed=min(t, horizon), t=t)

        prof = None
        if profile is not None:
            from .engine_adapters.local.profile import load_profile
            prof = load_profile(profile, cl)
        result = run_replay(cl, cat, tr, names, seed=seed, check_invariants=check, progress=progress, profile=prof,
                            prefill_slots=prefill_slots, max_batch=max_batch, admit_starve_s=starve,
                            call_failure_rate=call_failure_rate)
        for n in names:
            prog.update(tasks[n], completed=horizon)
    wall = time.perf_counter() - t0
    rep = result.report
    t = Table(Column("policy", no_wrap=True), "handoff stall p50/p95/p99 s", "stall mean s", "TTFT p95 s",
              "lease late p99 s", "non-lease TTFT p99 s", "program p95 s", "moved TB", "wasted TB", "warm tax", "SLO viol.",
              title=f"{tr.n_calls} calls, {rep.trace.handoffs} handoffs on {cl.name} + {cat.name} ({wall:.1f} s wall)")
    for n, r in rep.policies.items():
        h = r.handoff_stall_s
        t.add_row(n, f"{h.p50:.2f} / {h.p95:.2f} / {h.p99:.2f}", f"{r.stall_s.mean:.2f}", f"{r.ttft_s.p95:.2f}",
                  f"{r.lease_lateness_s.p99:.2f}", f"{r.nonlease_ttft_s.p99:.2f}", f"{r.program_latency_s.p95:.1f}",
                  f"{r.bytes_moved / 1e12:.2f}",
                  f"{r.wasted_bytes / 1e12:.2f}", f"{r.warm_tax:.2f}", f"{r.slo_violations:.1%}")
    console.print(t)
    for n, r in rep.policies.items():
        if r.queue_switches:
            console.print(f"{n}: the auto queue ordered by " + ", then ".join(
                f"{s['to']} from {s['at_s']:.0f} s ({s['programs']} programs finished)" for s in r.queue_switches))
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(report_json(rep))
        console.print(f"report: {json_out}")
    if plots:
        from .sim.plots import write_plots

        paths = write_plots(result.results, plots)
        console.print(f"plots: {', '.join(str(p) for p in paths)}")


@app.command()
@_guard
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
    _outputs(files=[("--json", json_out)])
    from .models.load import check_compatible, load_catalog, load_cluster, load_trace
    from .core.costs import CostModel
    from .solvers.milp import oracle_summary

    cl, cat, tr = load_cluster(cluster), load_catalog(catalog), load_trace(trace)
    check_compatible(cl, cat, tr, str(trace))
    if lead not in ("planner", "none"):
        _fail(f"--lead: expected planner or none, got {lead!r}")
    cost = CostModel(cl, cat)
    guide_from = None
    if lead == "planner":
        from .sim.lead import planner_lead

        guide_from = planner_lead(cl, cat, tr, cost)
    with Progress(TextColumn("MILP windows"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} slots"),
                  TimeElapsedColumn(), console=err, transient=not sys.stderr.isatty()) as prog:
        task = prog.add_task("milp", total=1)
        out = oracle_summary(cl, cat, tr, cost, window, overlap, backend, time_limit,
                             progress=lambda done, total: prog.update(task, completed=done, total=total),
                             warm_start=warm_start, replicas=replicas, guide_from=guide_from)
    block = out["oracle"]
    bound = f"{block['bound']:.3f}" if block["bound"] is not None else "none (rolling horizon)"
    n_opt = sum(1 for w in out["windows"] if w["status"] == "OPTIMAL")
    status = block["status"] + (f" (stitched; {n_opt}/{len(out['windows'])} windows OPTIMAL)"
                                if block["bound"] is None and out["windows"] else "")
    console.print(f"{status}: objective {block['objective']:.3f}, bound {bound}, max window gap "
                  f"{block['gap']:.2e}, {len(out['windows'])} windows, {block['solve_s']:.1f} s solving; {out['waits']} of "
                  f"{out['calls']} calls wait"
                  + (f" ({out['trace_calls'] - out['calls']} calls the trace cancels are left out)"
                     if out['trace_calls'] > out['calls'] else "") + "; "
                  f"handoff stall p95 {out['handoff_stall_s']['p95']:.3f} s over {out['handoffs']} handoffs"
                  + (f"; the greedy warm start's objective is {out['greedy_vs_oracle']:.3f}x the solver's"
                     if out["greedy_vs_oracle"] else ""))
    if out["violations"]:
        console.print(f"[red]the stitched schedule breaks {len(out['violations'])} constraints[/], first: {out['violations'][0]}")
    if json_out:
        _write_json(json_out, out)


@app.command()
@_guard
def sweep(
    traces: Annotated[str, typer.Option(help="comma-separated trace presets")] = "swe-team,swe-team-shuffled",
    seeds: Annotated[str, typer.Option(help="comma-separated seeds")] = "1,2,3",
    policy: Annotated[str, typer.Option(help="comma-separated policies")] = "ondemand,lru-keepwarm,frequency,prefetch-all,static,llama-swap,ray-multiplex,statebudget,statebudget-lease",
    clusters: Annotated[str, typer.Option(help="comma-separated cluster presets or files")] = "hetero16",
    catalog: CatalogOpt = "agent-team",
    hours: Annotated[float, typer.Option(help="trace length")] = 2.0,
    workers: Annotated[Optional[int], typer.Option(help="local processes (default: one per core)")] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", help="run on a Ray cluster: auto or HOST:PORT")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write all rows here")] = None,
):
    """Replay a grid (clusters x traces x seeds x policies) into one table."""
    _outputs(files=[("--json", json_out)])
    from .models.load import load_catalog, load_cluster
    from .sim import sweep as sw
    from .traces.generators import PRESETS

    names = _policy_list(policy)
    trace_list = [t.strip() for t in traces.split(",") if t.strip()]
    for t in trace_list:
        if t not in PRESETS:
            raise ValueError(f"--traces: unknown trace preset {t!r} (known: {', '.join(PRESETS)})")
    try:
        seed_list = [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds: expected comma-separated integers, got {seeds!r}") from None
    cluster_list = [c.strip() for c in clusters.split(",") if c.strip()]
    for c in cluster_list:
        load_cluster(c)
    load_catalog(catalog)
    todo = sw.jobs(cluster_list, trace_list, seed_list, names, catalog, hours)
    with Progress(TextColumn("sweep"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} replays"),
                  TimeElapsedColumn(), console=err, transient=not sys.stderr.isatty()) as prog:
        task = prog.add_task("sweep", total=len(todo))
        report = lambda done, total: prog.update(task, completed=done)  # noqa: E731
        rows = sw.run_ray(todo, ray, report) if ray else sw.run_local(todo, workers, report)
    t = Table(title=f"{len(rows)} replays ({'Ray ' + ray if ray else 'local processes'})")
    for name in ("cluster", "trace", "seed", "policy"):
        t.add_column(name, no_wrap=True)  # names are never cut; the figures' headers wrap instead
    for c in sw.COLUMNS:
        t.add_column(c.replace("_", " "), justify="right", overflow="fold")
    for r in rows:
        t.add_row(r["cluster"], r["trace"], str(r["seed"]), r["policy"], *[f"{r[c]:.3f}" for c in sw.COLUMNS])
    console.print(t)
    if json_out:
        _write_json(json_out, {"rows": rows})


@bench_app.command("planner")
@_guard
def bench_planner_cmd(
    cluster: ClusterOpt = "hetero16",
    catalog: CatalogOpt = "agent-team",
    programs: Annotated[int, typer.Option(help="live programs", min=1)] = 200,
    iterations: Annotated[int, typer.Option(help="timed decisions", min=10)] = 500,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the result here")] = None,
):
    """Wall time of one online planning decision with N live programs."""
    _outputs(files=[("--json", json_out)])
    from .models.load import check_compatible, load_catalog, load_cluster
    from .sim.bench import bench_planner

    cl, cat = load_cluster(cluster), load_catalog(catalog)
    check_compatible(cl, cat)
    res = bench_planner(cl, cat, programs, iterations)
    console.print(f"{programs} live programs: decision p50 {res['decision_ms']['p50']:.3f} ms, "
                  f"p99 {res['decision_ms']['p99']:.3f} ms ({iterations} decisions)")
    if json_out:
        _write_json(json_out, res)


@app.command()
@_guard
def serve(
    db: Annotated[Path, typer.Option(help="SQLite ledger (created if missing; a restart resumes from it)")] = Path("statebudget.db"),
    cluster: ClusterOpt = "hetero16",
    catalog: CatalogOpt = "agent-team",
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on", min=0, max=65535)] = 8700,
    tokens: Annotated[Optional[Path], typer.Option(help="token file (default: <db>.tokens.json, created with an admin token if missing)")] = None,
    profile: Annotated[Optional[Path], typer.Option(help="a `statebudget profile` file: measured bandwidths replace the presets'")] = None,
    tick_s: Annotated[float, typer.Option(help="planning step at least this often (seconds)", min=0.01)] = 5.0,
    queue: Annotated[str, typer.Option(help="fcfs | plas | atlas | auto (atlas while finished programs are "
                                            "heavy-tailed, else fcfs): the discipline whose priority call_arrived "
                                            "answers (pass it to the engine, e.g. vLLM's `priority`)")] = "fcfs",
    kv_rule: Annotated[str, typer.Option(help="preserve | swap | discard | adaptive: what happens to a program's KV "
                                              "in HBM while it waits on a tool (the simulator's rule, as ops)")] = "preserve",
    tenant_weights: Annotated[str, typer.Option(help="TENANT=WEIGHT,...: each tenant's fair share in the plas/atlas "
                                                "priority (1 for a tenant not named)")] = "",
    stage_host: Annotated[bool, typer.Option(help="stage weights in host DRAM ahead of use (off for vLLM/SGLang "
                                                  "adapters: their engines reach host DRAM only by sleeping)")] = True,
    log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
):
    """Run the planner service: runtimes post events and leases, adapters poll plans (DESIGN.md §7).
    On a restart with the same --db the cluster and catalog come from the ledger."""
    import uvicorn

    from .api.app import create_app, setup_logging
    from .api.auth import Auth, create_token_file
    from .models.load import check_compatible, load_catalog, load_cluster
    from .service.ledger import Store
    from .service.live import LivePlanner

    from .core.toolwait import KV_RULES
    from .core.programs import QUEUES, parse_tenant_weights

    for name, value, known in (("--queue", queue, QUEUES), ("--kv-rule", kv_rule, KV_RULES)):
        if value not in known:
            _fail(f"{name} {value!r}: expected one of {', '.join(known)}")
    try:
        weights = parse_tenant_weights(tenant_weights)
    except ValueError as e:
        _fail(str(e))
    setup_logging(log_level)
    _check_port(host, port)  # before anything is written
    cl, cat = load_cluster(cluster), load_catalog(catalog)  # bad input fails before anything is written
    check_compatible(cl, cat)
    prof = None
    if profile is not None:
        from .engine_adapters.local.profile import load_profile
        prof = load_profile(profile, cl)
        if prof.get("machine", {}).get("device") == "arena":
            err.print(f"[yellow]warning:[/] {profile} was measured without a GPU (device arena in RAM): its h2d/d2h "
                      "links are host copies, not PCIe", highlight=False)
    if tokens is None and not os.environ.get("STATEBUDGET_TOKENS_FILE") and not os.environ.get("STATEBUDGET_TOKENS"):
        tokens = db.with_name(db.name + ".tokens.json")
        if not tokens.exists():
            create_token_file(tokens)
            err.print(f"created {tokens} with an admin token; add runtime and adapter tokens with "
                      f"`statebudget token add --tokens {tokens} --role runtime --tenant NAME`")
    auth = Auth.load(tokens)
    from .planner.core import lease_config

    planner = LivePlanner(cl, cat, Store(db), profile=prof, queue=queue, config=lease_config(stage_host=stage_host),
                          kv_rule=kv_rule, tenant_weights=weights)
    if (planner.cluster.name, planner.catalog.name) != (cl.name, cat.name):
        err.print(f"[yellow]warning:[/] {db} was started with cluster {planner.cluster.name} and catalog "
                  f"{planner.catalog.name}; they win over --cluster {cl.name} --catalog {cat.name} (serve a fresh --db, or "
                  f"PUT /v1/cluster while the planner holds no state)", highlight=False)
    err.print(f"planner on http://{host}:{port}: cluster {planner.cluster.name}, catalog {planner.catalog.name}, "
              f"queue {queue}, tool-wait KV {kv_rule}, ledger {db} (plan version {planner.plan_version}, {len(planner.ops)} open ops)")
    uvicorn.run(create_app(planner, auth, tick_s=tick_s), host=host, port=port, log_level="warning")


@app.command()
@_guard
def adapter(
    kind: Annotated[str, typer.Argument(help="local | vllm | sglang (lmcache: from Python, it needs KV token ids)")],
    planner: Annotated[str, typer.Option(help="planner URL, e.g. http://127.0.0.1:8700")],
    node: Annotated[str, typer.Option(help="the node (host) this adapter serves")],
    token: Annotated[str, typer.Option(envvar="STATEBUDGET_TOKEN", help="an adapter token for this node")],
    root: Annotated[Path, typer.Option(help="local: data directory (NVMe tier = safetensors files under ROOT/NODE/nvme)")] = Path("statebudget-data"),
    arena_mb: Annotated[Optional[float], typer.Option(help="local: device arena per GPU in MB (1e6 B) when there is no CUDA (default 1 GiB)")] = None,
    inventory: Annotated[Optional[Path], typer.Option(help="local: after each poll, write the ops executed and the copies held here (JSON)")] = None,
    engines: Annotated[Optional[Path], typer.Option(help="vllm, sglang: JSON file {endpoints: {MODEL@gpu:I: URL}, model_paths, cpu_backup, api_key}")] = None,
    catalog: Annotated[Optional[str], typer.Option(help="local: create this catalog's model store under ROOT first")] = None,
    bytes_scale: Annotated[float, typer.Option(help="local: objects get this fraction of their real size (e.g. 0.001 "
                                                    "to run a real catalog's plan on a laptop)")] = 1.0,
    wait_s: Annotated[float, typer.Option(help="long-poll wait")] = 10.0,
    log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
):
    """Run an engine adapter: poll the plan of NODE, execute its ops, report them."""
    from .api.app import setup_logging
    from .engine_adapters import adapter_class

    setup_logging(log_level)
    cls = adapter_class(kind)  # an unknown kind fails here, naming the known ones
    if kind == "lmcache":
        _fail("the lmcache adapter needs the token ids of each program's KV from the runtime: start it from Python "
              "(statebudget.engine_adapters.lmcache.LMCacheAdapter, tokens_of=...) or pass it to a vllm/sglang adapter")
    if kind in ("vllm", "sglang"):
        from .engine_adapters.http import load_engine_file

        if engines is None:
            _fail(f"adapter {kind} needs --engines FILE: where each (model, GPU group) server listens")
        cfg = load_engine_file(engines)
        extra = {"model_paths": cfg.model_paths, "cpu_backup": cfg.cpu_backup} if kind == "sglang" else {}
        a = cls(planner, node, token, cfg.endpoint_map(), engine_client=cfg.engine_client(), **extra)
        err.print(f"{kind} adapter of {node} polling {planner}; {len(cfg.endpoints)} engine servers")
        a.run(wait_s=wait_s)
        return
    if not 0 < bytes_scale <= 1:
        _fail(f"--bytes-scale must be in (0, 1], got {bytes_scale}")
    a = cls(planner, node, token, root=root / node, arena_bytes=int(arena_mb * 1e6) if arena_mb else None,
            bytes_scale=bytes_scale)
    if catalog is not None:
        from .models.load import load_catalog

        from .engine_adapters.local import DataPlaneError

        try:
            err.print(f"model store: {a.plane.stock(load_catalog(catalog))} objects under {root / node}")
        except DataPlaneError as e:
            _fail(str(e))

    def write_inventory(_n: int) -> None:
        tmp = inventory.with_name(inventory.name + ".tmp")
        tmp.write_text(json.dumps(a.inventory()))
        tmp.replace(inventory)

    err.print(f"local adapter of {node} polling {planner}; data under {root / node} ({a.plane.device})")
    a.run(wait_s=wait_s, on_step=write_inventory if inventory else None)


@app.command()
@_guard
def drive(
    planner: Annotated[str, typer.Option(help="planner URL, e.g. http://127.0.0.1:8700")],
    token: Annotated[str, typer.Option(envvar="STATEBUDGET_TOKEN", help="a runtime token")],
    trace: TraceOpt,
    speed: Annotated[float, typer.Option(help="trace seconds per wall second", min=0.001)] = 20.0,
    call_s: Annotated[float, typer.Option(help="wall seconds each call runs (no engine here)", min=0.0)] = 0.05,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the summary here")] = None,
):
    """Replay a trace against a live planner as an agent runtime: events, leases from the hints,
    and whether each lease was ready when its call came."""
    _outputs(files=[("--json", json_out)])
    import asyncio

    from .api.driver import Driver
    from .models.load import load_trace

    tr = load_trace(trace)
    _check_planner(planner)
    try:
        out = asyncio.run(Driver(planner, token, speed, call_s).replay(tr))
    except PermissionError as e:
        _fail(f"the planner refused the token ({e}); a runtime token comes from "
              f"`statebudget token add --tokens FILE --role runtime --tenant NAME`")
    late = out["rejected_quoted_after_deadline"]
    why = (f" ({late} rejected because the quote's P95 came after the deadline: deadlines shrink with "
           f"--speed, transfers do not)") if late else ""
    console.print(f"{out['events']} events; leases {out['leases']}{why}; ready when the quote promised: "
                  f"{out['ready_when_promised']}/{out['promised_by_quote']}; request p99 {out['request_ms']['p99']} ms; "
                  f"{out['n_errors']} errors")
    if json_out:
        _write_json(json_out, out)
    if out["n_errors"]:
        err.print(f"[bold red]{out['n_errors']} requests failed[/], the first: {out['errors'][0]}", highlight=False)
        raise typer.Exit(1)


@app.command()
@_guard
def residency(
    planner: Annotated[str, typer.Option(help="planner URL, e.g. http://127.0.0.1:8700")],
    token: Annotated[str, typer.Option(envvar="STATEBUDGET_TOKEN", help="an admin token")],
    json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the raw answer here")] = None,
):
    """What a live planner holds: every copy per tier (ready or in flight), open ops, leases."""
    _outputs(files=[("--json", json_out)])
    import httpx

    r = httpx.get(planner.rstrip("/") + "/v1/residency", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    if r.status_code != 200:
        _fail(f"{planner}: {r.status_code} {r.json().get('detail', r.text) if r.headers.get('content-type', '').startswith('application/json') else r.text}")
    body = r.json()
    t = Table("tier", "object", "GB", "state", "version", "pins",
              title=f"plan version {body['plan_version']}, {body['open_ops']} open ops; leases {body['leases']}; "
                    f"programs {body['programs']}")
    kv = body.get("tool_wait_kv") or {}
    suspended = {tuple(obj) for obj in kv.get("suspended", ())}  # objects, as the copies name them
    for c in body["copies"]:
        state = "ready" if c["ready"] else "[yellow]in flight[/]"
        if c["ready"] and tuple(c["object"]) in suspended and c["tier"].startswith("gpu:"):
            state = "ready, tool wait"
        t.add_row(c["tier"], "/".join(c["object"]), f"{c['bytes'] / 1e9:.2f}", state, str(c["version"]), str(c["pins"]))
    console.print(t)
    if kv:
        acts = ", ".join(f"{k} {v}" for k, v in sorted(kv.get("actions", {}).items())) or "none yet"
        console.print(f"tool-wait KV rule {kv.get('rule')}: {acts}; {len(kv.get('suspended', ()))} KV held through a tool wait",
                      highlight=False)
    if json_out:
        _write_json(json_out, body)


token_app = typer.Typer(no_args_is_help=True, help="Manage the service's bearer tokens.")
app.add_typer(token_app, name="token")


@token_app.command("add")
@_guard
def token_add(
    tokens: Annotated[Path, typer.Option(help="token file (created if missing)")],
    role: Annotated[str, typer.Option(help="runtime | adapter | admin")],
    tenant: Annotated[Optional[str], typer.Option(help="runtime: the tenant the token speaks for")] = None,
    node: Annotated[Optional[str], typer.Option(help="adapter: the node the token serves")] = None,
):
    """Add a token to a token file and print it (a running `serve` takes it on its next request)."""
    from pydantic import ValidationError

    from .api.auth import add_token

    try:
        console.print(add_token(tokens, role, tenant, node))
    except ValidationError as e:
        _fail(f"{tokens}: {e.errors()[0]['msg']}")


@app.command("profile")
@_guard
def profile_cmd(
    cluster: ClusterOpt,
    out: Annotated[Path, typer.Option(help="JSON profile to write (for the --profile options)")],
    catalog: Annotated[Optional[str], typer.Option(help="catalog file or preset: adds per-model prefill tok/s")] = None,
    size_mb: Annotated[float, typer.Option(help="MiB moved by each transfer probe", min=0.001)] = 256,
    repeats: Annotated[int, typer.Option(help="probes per figure (the median is kept)", min=1)] = 3,
):
    """Measure this machine's file, host<->device and prefill rates into a cost-model profile."""
    _outputs(files=[("--out", out)])
    from .models.load import load_catalog, load_cluster
    from .engine_adapters.local.profile import measure_profile, nominal_links

    cl = load_cluster(cluster)
    cat = load_catalog(catalog) if catalog else None
    with Progress(TextColumn("{task.description:<16}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f}"),
                  TimeElapsedColumn(), console=err, transient=not sys.stderr.isatty()) as prog:
        task = prog.add_task("profiling", total=1)
        prof = measure_profile(cl, size_mb=size_mb, repeats=repeats, catalog=cat,
                               progress=lambda step, done, total: prog.update(task, description=step, completed=done,
                                                                               total=total))
    m, mach = prof["measured"], prof["machine"]
    if mach["device"] == "arena":
        err.print("[yellow]warning:[/] no CUDA device here: the h2d/d2h figures are RAM copies into the local "
                  "adapter's device arena and prefill runs on the CPU. Right for `adapter local` without a GPU; "
                  "measure on the GPU host for anything else.", highlight=False)
    t = Table("figure", "measured", title=f"{mach['hostname']} ({mach['device']}; {mach['size_mb']:.0f} MiB x {repeats})")
    for key, label in [("file_to_host_Bps", "file -> host (page cache)"), ("host_to_file_Bps", "host -> file (fsync)"),
                       ("host_to_device_Bps", "host -> device"), ("device_to_host_Bps", "device -> host")]:
        t.add_row(label, f"{m[key] / 1e9:.2f} GB/s")
    t.add_row(f"prefill, {m['small_model_params'] / 1e6:.1f} M params", f"{m['prefill_tok_s_small']:,.0f} tok/s")
    console.print(t)
    nominal = nominal_links(cl)
    t = Table("link", "measured GB/s", f"{cl.name} file GB/s", title="Links (as CostModel reads them)")
    for name, bw in prof["links"].items():
        t.add_row(name, f"{bw / 1e9:.2f}", f"{nominal[name] / 1e9:.2f}")
    console.print(t)
    if prof["prefill_tok_s"]:
        t = Table("model", "prefill tok/s (estimate)", title=f"Prefill, scaled by active params ({cat.name})")
        for name, v in prof["prefill_tok_s"].items():
            t.add_row(name, f"{v:,.1f}")
        console.print(t)
    _write_json(out, prof)
    console.print(f"wrote {out}")


@app.command()
def presets():
    """List the built-in cluster, catalog and trace presets."""
    from .models.load import preset_names
    from .traces.generators import PRESETS

    console.print(f"clusters: {', '.join(preset_names('clusters'))}")
    console.print(f"catalogs: {', '.join(preset_names('catalogs'))}")
    console.print(f"traces:   {', '.join(PRESETS)}")


if __name__ == "__main__":
    app()
