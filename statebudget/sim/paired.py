"""Paired comparisons over seeds: how much a figure changes from one policy to another on the same
traces, with a 95 % interval over the seeds (bootstrap: `paired_change`; Student t: `t_interval`,
`paired_diff`), so that "lower by how much" comes with how sure. Used by `evidence` and by the
benchmarks (benchmarks/paired.py)."""

from __future__ import annotations

import numpy as np


# Two-sided 95 % Student t quantiles t(0.975, df), df = 1..30 (no scipy in the environment);
# beyond 30, `_t975` expands about the normal's quantile.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.959964


def _t975(df: int) -> float:
    """t(0.975, df): the table up to 30; beyond, the Cornish-Fisher expansion in 1/df (within
    1e-4 there; the normal's 1.96 alone is 3 % narrow at df 39)."""
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


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


def t_interval(values: list[float]) -> dict:
    """Mean of per-seed values and its 95 % Student t interval (None with fewer than 2 values)."""
    a = np.asarray(values, float)
    if a.size == 0:
        raise ValueError("t_interval needs at least one value")
    m = float(a.mean())
    if a.size < 2:
        return {"mean": m, "ci95": None, "n": 1}
    t = _t975(a.size - 1)
    hw = t * float(a.std(ddof=1)) / np.sqrt(a.size)
    return {"mean": m, "ci95": [float(m - hw), float(m + hw)], "n": int(a.size)}


def paired_diff(base: list[float], other: list[float]) -> dict:
    """Seed by seed difference other - base: its mean and 95 % t interval (`t_interval`), and on
    how many seeds `other` is below `base`."""
    b, o = np.asarray(base, float), np.asarray(other, float)
    if b.shape != o.shape or b.size == 0:
        raise ValueError(f"paired_diff needs equal, non-empty lists (got {b.size} and {o.size})")
    return dict(t_interval(list(o - b)), lower_on=int((o < b).sum()))


def fmt(c: dict) -> str:
    """'-3.1 % [-5.0, -1.2], lower on 8/10 seeds'."""
    return (f"{100 * c['mean']:+.1f} % [{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}], "
            f"lower on {c['lower_on']}/{c['seeds']} seeds")


def series(rows: list[dict], seeds: list[int], key: str, **where) -> list[float]:
    """`key` of the row matching `where` for each seed, in the order of `seeds` (the per-seed list
    `paired_change` takes). Two rows for one seed are refused: `where` did not pin the run down."""
    by = {}
    for r in rows:
        if _matches(r, where):
            if r["seed"] in by:
                raise ValueError(f"two rows match {where} for seed {r['seed']}: name the field that tells them apart")
            by[r["seed"]] = r[key]
    return [by[s] for s in seeds]


def _matches(row: dict, where: dict) -> bool:
    return all(row.get(k) == v for k, v in where.items())  # a key a row lacks matches None


def ratio_of_means(base: list[float], other: list[float], resamples: int = 10_000, seed: int = 0) -> dict:
    """mean(other) / mean(base) over the same seeds, with a bootstrap 95 % interval (seeds
    resampled together, so the pairing holds): steadier than the mean of per-seed ratios when a
    seed's base is near zero. `lower_on`: seeds where `other` is below `base`."""
    b, o = np.asarray(base, float), np.asarray(other, float)
    if b.shape != o.shape or b.size == 0:
        raise ValueError(f"ratio_of_means needs equal, non-empty lists (got {b.size} and {o.size})")
    idx = np.random.default_rng(seed).integers(0, b.size, size=(resamples, b.size))
    bm, om = b[idx].mean(axis=1), o[idx].mean(axis=1)
    r = np.divide(om, bm, out=np.full_like(om, np.nan), where=bm > 0)
    lo, hi = np.nanpercentile(r, [2.5, 97.5]) if np.isfinite(r).any() else (float("nan"), float("nan"))
    return {"ratio": float(o.mean() / b.mean()) if b.mean() > 0 else float("nan"), "ci95": [float(lo), float(hi)],
            "lower_on": int((o < b).sum()), "seeds": int(b.size)}


def difference_of_ratios(base_a, other_a, base_b, other_b, resamples: int = 10_000, seed: int = 0) -> dict:
    """(mean(other_b) / mean(base_b)) - (mean(other_a) / mean(base_a)) over the same seeds, each
    resample drawing one set of seeds for all four series (they are paired by seed)."""
    arr = [np.asarray(x, float) for x in (base_a, other_a, base_b, other_b)]
    if len({a.size for a in arr}) != 1 or arr[0].size == 0:
        raise ValueError("difference_of_ratios needs four equal, non-empty lists")
    idx = np.random.default_rng(seed).integers(0, arr[0].size, size=(resamples, arr[0].size))
    m = [a[idx].mean(axis=1) for a in arr]
    with np.errstate(divide="ignore", invalid="ignore"):
        d = m[3] / m[2] - m[1] / m[0]
    d = d[np.isfinite(d)]
    lo, hi = np.percentile(d, [2.5, 97.5]) if d.size else (float("nan"), float("nan"))
    point = arr[3].mean() / arr[2].mean() - arr[1].mean() / arr[0].mean() if arr[0].mean() > 0 and arr[2].mean() > 0 \
        else float("nan")
    return {"diff": float(point), "ci95": [float(lo), float(hi)], "seeds": int(arr[0].size)}
