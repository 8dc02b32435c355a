"""What seed 001 asks to measure of a trace: call share per model, the model-switch matrix, the
distribution of concurrently active models, hotness half-life, tool-wait and context-length
distributions."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..models.catalog import Catalog
from ..models.report import Dist
from ..models.trace import Trace
from .graph import count_handoffs, previous_call
from .timeline import nominal_timeline


def trace_stats(trace: Trace, catalog: Catalog | None = None, window_s: float = 300.0) -> dict:
    calls = [(p, n) for p in trace.programs for n in p.nodes if n.kind == "call"]
    share = Counter(n.model for _, n in calls)
    models = sorted(share)
    switch = {a: {b: 0 for b in models} for a in models}
    for p in trace.programs:
        by_id = {n.id: n for n in p.nodes}
        for cid, prev in previous_call(p).items():
            if prev is not None:
                switch[by_id[prev].model][by_id[cid].model] += 1
    timeline = nominal_timeline(trace, catalog)
    active = _active_models(trace, timeline)
    tools: dict[str, list[float]] = {}
    for p in trace.programs:
        for n in p.nodes:
            if n.kind == "tool":
                tools.setdefault(n.tool or "?", []).append(n.duration)
    hints = [h for p in trace.programs for h in p.hints]
    by_node = {(p.program, n.id): n for p in trace.programs for n in p.nodes}
    wrong = sum(1 for p in trace.programs for h in p.hints if by_node[(p.program, h.for_)].model != h.model)
    total = sum(share.values())
    return {
        "programs": len(trace.programs),
        "calls": total,
        "handoffs": count_handoffs(trace),
        "call_share": {m: round(share[m] / total, 4) for m in models},
        "switch_matrix": switch,
        "active_models": active,
        "hotness_half_life_s": _hotness_half_life(calls, timeline, models, window_s),
        "tool_wait_s": {t: Dist.of(v).model_dump() for t, v in sorted(tools.items())},
        "context_tokens": Dist.of(n.context_tokens for _, n in calls).model_dump(),
        "output_tokens": Dist.of(n.output_tokens for _, n in calls).model_dump(),
        "hints": {"count": len(hints), "wrong_model": wrong,
                  "cancelled_targets": sum(1 for p in trace.programs for h in p.hints
                                           if (p.program, h.for_) not in timeline)},
    }


def _active_models(trace: Trace, timeline: dict) -> dict:
    """Time-weighted distribution of the number of models with a running call (zero-stall timeline)."""
    model_of = {(p.program, n.id): n.model for p in trace.programs for n in p.nodes if n.kind == "call"}
    events = []
    for key, (s, e) in timeline.items():
        if key in model_of and e > s:
            events.append((s, 1, model_of[key]))
            events.append((e, -1, model_of[key]))
    events.sort(key=lambda x: (x[0], x[1]))
    running: Counter = Counter()
    time_at: Counter = Counter()
    last = events[0][0] if events else 0.0
    for t, d, m in events:
        time_at[sum(1 for v in running.values() if v > 0)] += t - last
        last = t
        running[m] += d
    span = sum(time_at.values())
    dist = {str(k): round(v / span, 4) for k, v in sorted(time_at.items())} if span else {}
    acc, p95 = 0.0, 0
    for k, v in sorted(time_at.items()):
        acc += v / span if span else 0
        if acc >= 0.95:
            p95 = k
            break
    return {"time_share": dist, "p95": p95}


def _hotness_half_life(calls, timeline, models, window_s) -> float | None:
    """Lag (s) at which the autocorrelation of per-window call shares, averaged over models,
    first falls below 0.5: how long a model's hotness lasts."""
    starts = [(timeline.get((p.program, n.id), (None,))[0], n.model) for p, n in calls]
    starts = [(t, m) for t, m in starts if t is not None]
    if not starts:
        return None
    t_end = max(t for t, _ in starts)
    nwin = int(t_end // window_s) + 1
    if nwin < 4:
        return None
    counts = np.zeros((len(models), nwin))
    idx = {m: i for i, m in enumerate(models)}
    for t, m in starts:
        counts[idx[m], int(t // window_s)] += 1
    shares = counts / np.maximum(counts.sum(axis=0), 1)
    for lag in range(1, nwin - 1):
        cors = []
        for row in shares:
            a, b = row[:-lag], row[lag:]
            if a.std() > 0 and b.std() > 0:
                cors.append(np.corrcoef(a, b)[0, 1])
        if cors and np.mean(cors) < 0.5:
            return lag * window_s
    return None


def switch_drift(trace: Trace, catalog: Catalog | None = None, window_s: float = 900.0, t0: float = 0.0,
                 min_row: int = 20, draws: int = 200) -> dict:
    """How much the model-switch matrix moves over time: the switches (previous call -> call, by
    the call's start on the zero-stall timeline) counted per window of `window_s` from `t0`, each
    window's rows normalised, and for each pair of consecutive windows the largest total-variation
    distance between a row present in both with at least `min_row` switches (fewer: too noisy to
    call drift). `tv`: one value per consecutive pair (None where no row qualifies). `null_tv`:
    the same statistic when every window draws its switches (same counts per row) from the whole
    span's matrix, median (and `null_q95`, 95th percentile) over `draws`: what sampling noise alone
    gives, so drift is what exceeds it."""
    timeline = nominal_timeline(trace, catalog)
    models = sorted({n.model for p in trace.programs for n in p.nodes if n.kind == "call"})
    ix = {m: i for i, m in enumerate(models)}
    counts: dict[int, np.ndarray] = {}
    for p in trace.programs:
        by_id = {n.id: n for n in p.nodes}
        for cid, prev in previous_call(p).items():
            t = timeline.get((p.program, cid), (None,))[0]
            if prev is None or t is None or t < t0:
                continue
            w = int((t - t0) // window_s)
            c = counts.setdefault(w, np.zeros((len(models), len(models))))
            c[ix[by_id[prev].model], ix[by_id[cid].model]] += 1
    wins = sorted(counts)
    tv = [_max_row_tv(counts[a], counts[b], min_row) for a, b in zip(wins, wins[1:])]
    null = []
    if wins:
        whole = sum(counts.values())
        pooled = np.divide(whole, whole.sum(axis=1, keepdims=True), out=np.zeros_like(whole),
                           where=whole.sum(axis=1, keepdims=True) > 0)
        rng = np.random.default_rng(0)
        for _ in range(draws):
            drawn = [np.array([rng.multinomial(int(n), r) if n else np.zeros(len(models)) for n, r in
                               zip(counts[w].sum(axis=1), pooled)]) for w in wins]
            null += [v for a, b in zip(drawn, drawn[1:]) if (v := _max_row_tv(a, b, min_row)) is not None]
    return {"window_s": window_s, "windows": len(wins), "tv": tv,
            "null_tv": round(float(np.median(null)), 4) if null else None,
            "null_q95": round(float(np.quantile(null, 0.95)), 4) if null else None,
            "switches": [int(counts[w].sum()) for w in wins]}


def _max_row_tv(ca: np.ndarray, cb: np.ndarray, min_row: int) -> float | None:
    ok = (ca.sum(axis=1) >= min_row) & (cb.sum(axis=1) >= min_row)
    if not ok.any():
        return None
    ra, rb = ca[ok] / ca[ok].sum(axis=1, keepdims=True), cb[ok] / cb[ok].sum(axis=1, keepdims=True)
    return round(float(0.5 * np.abs(ra - rb).sum(axis=1).max()), 4)
