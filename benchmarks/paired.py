"""Paired comparisons over seeds: how much a figure changes from one policy to another on the same
traces, with a bootstrap 95 % interval over the seeds, so that "lower by how much" comes with how
sure. Used by bench_queues.py, bench_kv_rules.py and bench_failures.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def paired_change(base: list[float], other: list[float], resamples: int = 10_000, seed: int = 0) -> dict:
    """Per-seed relative change other/base - 1: its mean, a bootstrap 95 % interval of that mean
    (seeds resampled with replacement), and on how many seeds `other` is below `base`."""
    b, o = np.asarray(base, float), np.asarray(other, float)
    if b.shape != o.shape or b.size == 0:
        raise ValueError(f"paired_change needs equal, non-empty lists (got {b.size} and {o.size})")
    rel = o / b - 1.0
    idx = np.random.default_rng(seed).integers(0, rel.size, size=(resamples, rel.size))
    lo, hi = np.percentile(rel[idx].mean(axis=1), [2.5, 97.5])
    return {"mean": float(rel.mean()), "ci95": [float(lo), float(hi)], "lower_on": int((o < b).sum()),
            "seeds": int(rel.size)}


def fmt(c: dict) -> str:
    """'-3.1 % [-5.0, -1.2], lower on 8/10 seeds'."""
    return (f"{100 * c['mean']:+.1f} % [{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}], "
            f"lower on {c['lower_on']}/{c['seeds']} seeds")


def series(rows: list[dict], seeds: list[int], key: str, **where) -> list[float]:
    """`key` of the row matching `where` for each seed, in the order of `seeds` (the per-seed list
    `paired_change` takes)."""
    by = {r["seed"]: r[key] for r in rows if all(r[k] == v for k, v in where.items())}
    return [by[s] for s in seeds]


def save(path: Path | None, rows: list[dict], paired: dict) -> None:
    """Write a benchmark's rows and paired comparisons as JSON (nothing if no path was given)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rows": rows, "paired": paired}, indent=1) + "\n")
