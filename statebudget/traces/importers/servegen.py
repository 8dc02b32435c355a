"""ServeGen per-model rates (alibaba/ServeGen, aggregated as `model_rates.csv`: `model,
window_start_s, rate_rps, active_clients, rate_weighted_cv`). Real: each model's rate per
600 s window, so the models' shares and their drift over the days. Drawn: arrivals, a Poisson
process of that rate within each window (seeded; the windows' CV is not used, so real
burstiness within a window is flattened), and each request's tokens, from the Azure
conversation shape fitted in `fitted.json`. Each request is a one-call program."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from ...models.errors import InputError
from ..fit import QUANTILES, load_fitted
from .common import BadRows, Session, Turn, csv_rows, number, open_input

COLUMNS = ("model", "window_start_s", "rate_rps")
MAX_PROGRAMS = 2_000_000  # a draw past this is refused: ask for a smaller --rate-scale or --hours


def _windows(paths: list[Path], bad: BadRows) -> dict[str, list[tuple[float, float]]]:
    """model -> [(window start s, rate rps)], in file order, per model increasing."""
    out: dict[str, list[tuple[float, float]]] = {}
    for path in map(open_input, paths):
        for lineno, r in csv_rows(path, bad, COLUMNS, ("active_clients", "rate_weighted_cv")):
            try:
                if not r["model"]:
                    raise ValueError("no model")
                start, rate = number(r, "window_start_s"), number(r, "rate_rps")
            except ValueError as e:
                bad(str(path), lineno, str(e))
                continue
            ws = out.setdefault(r["model"], [])
            if ws and start <= ws[-1][0]:
                bad(str(path), lineno, f"window_start_s {start:g} of {r['model']} is not after its previous "
                                       f"window ({ws[-1][0]:g})")
                continue
            ws.append((start, rate))
    return out


def _spans(ws: list[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """(start, end, rate) of each window; the last lasts as long as the one before (600 s alone)."""
    out = []
    for i, (s, rate) in enumerate(ws):
        if i + 1 < len(ws):
            e = ws[i + 1][0]
        else:
            e = s + (s - ws[i - 1][0] if i else 600.0)
        out.append((s, e, rate))
    return out


def read_servegen(paths: list[Path], bad: BadRows, seed: int, rate_scale: float, hours: float | None) -> list[Session]:
    windows = _windows(paths, bad)
    end = hours * 3600.0 if hours is not None else float("inf")
    spans = {m: [(s, min(e, end), r * rate_scale) for s, e, r in _spans(ws) if s < end] for m, ws in windows.items()}
    expected = sum((e - s) * r for sp in spans.values() for s, e, r in sp)
    if expected > MAX_PROGRAMS:
        span_s = max((sp[-1][1] for sp in spans.values() if sp), default=1.0)
        per_s = expected / span_s
        raise InputError("--rate-scale", "", f"would draw about {expected:,.0f} programs ({per_s:,.1f} per second); "
                         f"ServeGen's rates are production rates: pass a smaller --rate-scale (e.g. "
                         f"{max(1e-6, rate_scale * 5 / per_s):.2g} for about 5 per second) or fewer --hours")
    tok = load_fitted()["tokens"]["conv"]
    cq, oq = tok["context_quantiles"], tok["output_quantiles"]
    sessions = []
    for model, sp in spans.items():
        rng = np.random.default_rng([seed, zlib.crc32(model.encode())])  # a model's draws whatever the others
        times = []
        for s, e, r in sp:
            n = int(rng.poisson(r * (e - s)))
            times.append(np.sort(s + rng.random(n) * (e - s)))
        t = np.concatenate(times) if times else np.zeros(0)
        ctx = np.interp(rng.random(len(t)), QUANTILES, cq).astype(int)
        out = np.interp(rng.random(len(t)), QUANTILES, oq).astype(int)
        pid = model.replace("/", "-")
        sessions += [Session(pid=f"{pid}-{k:07d}", start_s=float(t[k]),
                             turns=[Turn(keys=(model,), context=int(ctx[k]), output=int(out[k]))])
                     for k in range(len(t))]
    return sessions
