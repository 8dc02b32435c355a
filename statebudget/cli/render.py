"""The tables and summaries the commands print; each takes what its command computed."""

from __future__ import annotations

from rich.table import Column, Table

from .common import console


def print_trace_stats(trace, s: dict) -> None:
    """`trace stats`: the statistics of `trace_stats` for the file `trace`."""
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
    share = ", ".join(f"{k}: {v:.1%}" for k, v in am["time_share"].items())
    console.print(f"Concurrently active models (zero-stall timeline), share of time by how many: {share}; P95 {am['p95']}")
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


def print_replay(rep, tr, cl, cat, wall: float) -> None:
    """`replay`: one row per policy of the report `rep` on trace `tr`, then the auto queue's switches."""
    t = Table(Column("policy", no_wrap=True), "handoff stall p50/p95/p99 s", "stall mean s", "TTFT p95 s",
              "lease late p99 s", "non-lease TTFT p99 s", "program p95 s", "moved TB", "wasted TB", "warm tax", "SLO viol.",
              "SLO@5",
              title=f"{tr.n_calls} calls, {rep.trace.handoffs} handoffs on {cl.name} + {cat.name} ({wall:.1f} s wall)")
    for n, r in rep.policies.items():
        h = r.handoff_stall_s
        t.add_row(n, f"{h.p50:.2f} / {h.p95:.2f} / {h.p99:.2f}", f"{r.stall_s.mean:.2f}", f"{r.ttft_s.p95:.2f}",
                  f"{r.lease_lateness_s.p99:.2f}", f"{r.nonlease_ttft_s.p99:.2f}", f"{r.program_latency_s.p95:.1f}",
                  f"{r.bytes_moved / 1e12:.2f}",
                  f"{r.wasted_bytes / 1e12:.2f}", f"{r.warm_tax:.2f}", f"{r.slo_violations:.1%}",
                  f"{r.slo_attainment['5']:.1%}" if "5" in r.slo_attainment else "-")
    console.print(t)
    if rep.run is not None:
        console.print(f"seed {rep.run.seed}, start {rep.run.start}, warm-up {rep.run.warmup_s:g} s"
                      + (": calls of programs that start in the warm-up are left out" if rep.run.warmup_s > 0 else "")
                      + (f"; KV room: {rep.run.kv_reserve}" if rep.run.kv_reserve != "asked" else "")
                      + "; SLO@5: share of calls with TTFT <= 5 x their ideal TTFT", highlight=False)
    o = rep.oracle
    if o is not None and o.bound_total_stall_s is not None:
        totals = ", ".join(f"{n} {r.stall_total_s:.1f}" for n, r in rep.policies.items())
        console.print(f"lower bound on total stall: {o.bound_total_stall_s:.2f} s ({o.bound_status}); total stall s: "
                      f"{totals}; the oracle replayed the {o.schedule} schedule"
                      + (" (weak on large traces: docs/milp.md)" if o.schedule == "milp" else ""), highlight=False)
    if o is not None and o.behind is not None:
        console.print(o.behind.why, highlight=False)
    for n, r in rep.policies.items():
        if r.queue_switches:
            console.print(f"{n}: the auto queue ordered by " + ", then ".join(
                f"{s['to']} from {s['at_s']:.0f} s ({s['programs']} programs finished)" for s in r.queue_switches))


def print_by_model(rep, cl, top: int = 3) -> None:
    """`replay --by-model`: per policy, each model's calls, stall, TTFT P95 and SLO attainment at
    5, and the groups they ran on (GPU indices and kind, most used first): where a policy's stall
    sits, which model pays for it, and why."""
    from ..sim.metrics import short_of_room  # the simulator loads only for this command

    def where(label: str) -> str:
        idx = [int(i) for i in label.split(",")]
        return f"{label} ({cl.gpus[idx[0]].kind})"

    for n, r in rep.policies.items():
        t = Table(Column("model", no_wrap=True), "calls", "stall total s", "HBM wait s", "stall p95 s",
                  "handoff p95 s", "TTFT p95 s", "SLO@5", "calls by GPU group", title=f"{n}: stall by model")
        for model, s in r.stall_by_model.items():
            groups = list(s.groups.items())
            shown = ", ".join(f"{where(g)} {k}" for g, k in groups[:top])
            more = sum(k for _, k in groups[top:])
            att = s.slo_attainment.get("5")
            t.add_row(model, str(s.calls), f"{s.stall_total_s:.1f}", f"{s.hbm_wait_total_s:.1f}", f"{s.stall_s.p95:.2f}",
                      f"{s.handoff_stall_s.p95:.2f}" if s.handoff_stall_s.n else "-",
                      f"{s.ttft_s.p95:.2f}" if s.ttft_s.n else "-", f"{att:.3f}" if att is not None else "-",
                      shown + (f", {more} elsewhere" if more else ""))
        console.print(t)
        for model in short_of_room(r.stall_by_model, r.stall_total_s):
            s = r.stall_by_model[model]
            console.print(f"  {model}: {s.hbm_wait_total_s:.0f} of its {s.stall_total_s:.0f} s of stall waited for HBM room, "
                          f"running mostly on {where(next(iter(s.groups)))}: it needs room (a replica, a bigger GPU), "
                          f"not earlier prefetch", highlight=False)
        if r.handoff_tail.calls:
            console.print(f"  handoff-stall P95 {r.handoff_tail.p95_s:.2f} s, set by {tail_text(r.handoff_tail)}", highlight=False)


def tail_text(tail) -> str:
    """A `HandoffTail` in words: its calls by cause and by model, with the seconds of each part."""
    causes = ", ".join(f"{k} {n}" for k, n in tail.by_cause.items())
    models = ", ".join(f"{m} {n}" for m, n in tail.models.items())
    parts = ", ".join(f"{k} {getattr(tail, k + '_s'):.1f}" for k in ("room", "weights", "pages", "kv") if getattr(tail, k + "_s") > 0)
    return f"{tail.calls} calls (by what held them most: {causes}; by model: {models}; seconds: {parts})"


def print_oracle(out: dict) -> None:
    """`oracle`: the solver's result in one line, and the first broken constraint if any."""
    block = out["oracle"]
    bound = f"{block['bound']:.3f}" if block["bound"] is not None else "none (rolling horizon: each window has its own)"
    n_opt = sum(1 for w in out["windows"] if w["status"] == "OPTIMAL")
    status = block["status"] + (f" (stitched; {n_opt}/{len(out['windows'])} windows OPTIMAL)"
                                if block["bound"] is None and out["windows"] else "")
    console.print(f"{status}: objective {block['objective']:.3f}, the solver's bound on it {bound}, max window gap "
                  f"{block['gap']:.2e}, {len(out['windows'])} windows, {block['solve_s']:.1f} s solving; {out['waits']} of "
                  f"{out['calls']} calls wait"
                  + (f" ({out['trace_calls'] - out['calls']} calls the trace cancels are left out)"
                     if out['trace_calls'] > out['calls'] else "") + "; "
                  f"handoff stall p95 {out['handoff_stall_s']['p95']:.3f} s over {out['handoffs']} handoffs"
                  + (f"; the greedy warm start's objective is {out['greedy_vs_oracle']:.3f}x the solver's"
                     if out["greedy_vs_oracle"] else ""))
    if block.get("bound_total_stall_s") is not None:
        console.print(f"lower bound on total stall (any policy, either start): {block['bound_total_stall_s']:.3f} s "
                      f"({block['bound_status']})")
    if out["violations"]:
        console.print(f"[red]the stitched schedule breaks {len(out['violations'])} constraints[/], first: {out['violations'][0]}")


def print_sweep(rows: list[dict], columns, ray, start: str, warmup_s: float) -> None:
    """`sweep`: one row per replay, the figures `columns` of each; where a cluster, trace and
    policy ran on several seeds, their mean after them (the figure a reader compares)."""
    from ..sim.sweep import LABELS

    t = Table(title=f"{len(rows)} replays ({'Ray ' + ray if ray else 'local processes'})")
    for name in ("cluster", "trace", "seed", "policy"):
        t.add_column(name, no_wrap=True)  # names are never cut; the figures' headers wrap instead
    for c in columns:
        t.add_column(LABELS.get(c, c.replace("_", " ")), justify="right", overflow="fold")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["cluster"], r["trace"], r["policy"]), []).append(r)
    for (cluster, trace, policy), rs in groups.items():
        for r in rs:
            t.add_row(cluster, trace, str(r["seed"]), policy, *[f"{r[c]:.3f}" for c in columns])
        if len(rs) > 1:
            t.add_row(cluster, trace, f"mean of {len(rs)}", policy,
                      *[f"{sum(r[c] for r in rs) / len(rs):.3f}" for c in columns], style="bold", end_section=True)
    console.print(t)
    console.print(f"start {start}, warm-up {warmup_s:g} s" + (": calls of programs that start in the warm-up are "
                                                               "left out" if warmup_s > 0 else ""), highlight=False)


def print_residency(body: dict) -> None:
    """`residency`: every copy a live planner holds, and its tool-wait KV rule's actions."""
    t = Table("tier", "object", "GB", "state", "version", "pins",
              title=f"plan version {body['plan_version']}, {body['open_ops']} open ops; "
                    f"leases {counts_text(body['leases'])}; "
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


def print_profile(prof: dict, cl, cat, nominal: dict, repeats: int) -> None:
    """`profile`: the measured figures, the links next to the cluster file's, the prefill estimates."""
    m, mach = prof["measured"], prof["machine"]
    t = Table("figure", "measured", title=f"{mach['hostname']} ({mach['device']}; {mach['size_mb']:.0f} MiB x {repeats})")
    for key, label in [("file_to_host_Bps", "file -> host (page cache)"), ("host_to_file_Bps", "host -> file (fsync)"),
                       ("host_to_device_Bps", "host -> device"), ("device_to_host_Bps", "device -> host")]:
        t.add_row(label, f"{m[key] / 1e9:.2f} GB/s")
    t.add_row(f"prefill, {m['small_model_params'] / 1e6:.1f} M params", f"{m['prefill_tok_s_small']:,.0f} tok/s")
    console.print(t)
    t = Table("link", "measured GB/s", f"{cl.name} file GB/s", title="Links (as CostModel reads them)")
    for name, bw in prof["links"].items():
        t.add_row(name, f"{bw / 1e9:.2f}", f"{nominal[name] / 1e9:.2f}")
    console.print(t)
    if prof["prefill_tok_s"]:
        t = Table("model", "prefill tok/s (estimate)", title=f"Prefill, scaled by active params ({cat.name})")
        for name, v in prof["prefill_tok_s"].items():
            t.add_row(name, f"{v:,.1f}")
        console.print(t)


def counts_text(d) -> str:
    """{'accepted': 62, 'ready': 60} as "62 accepted, 60 ready" (a plain value as it is)."""
    return ", ".join(f"{v} {k}" for k, v in d.items()) if isinstance(d, dict) else str(d)
