"""Plots of a replay: stall and TTFT CDFs per policy, HBM occupancy over time by state kind,
bytes per link class."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .engine import SimResult  # noqa: E402


def _cdf(ax, values, label):
    v = np.sort(np.asarray(values, dtype=float))
    if v.size:
        ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label, drawstyle="steps-post")


def _cdf_figure(path: Path | None, title: str, ylabel: str, series: dict[str, list], ax=None) -> None:
    """One CDF per policy on a symlog x axis: on `ax`, or in its own figure saved at `path`."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, vals in series.items():
        _cdf(ax, vals, name)
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel(title)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}: CDF per policy", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if fig is not None:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def write_plots(results: dict[str, SimResult], out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric, title, fn in (
        ("handoff_stall", "Handoff stall (s)", lambda c: c.ready - c.arrive if c.handoff else None),
        ("ttft", "TTFT (s)", lambda c: c.first_token - c.arrive),
    ):
        p = out / f"{metric}_cdf.png"
        _cdf_figure(p, title, "fraction of calls",
                    {name: [v for c in res.calls if c.state == "done" and (v := fn(c)) is not None]
                     for name, res in results.items()})
        paths.append(p)

    # Programs (seed 003): how long each took end to end, and the longest any of its calls waited
    # to start (the starvation view: a queue discipline that starves a program shows a long tail).
    # Over the programs that ended, as the report's program figures are; the legend says how many.
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    done = {name: [pr for pr in res.programs.values() if pr.end >= 0] for name, res in results.items()}
    label = {name: f"{name} ({len(prs)}/{len(results[name].programs)} ended)" for name, prs in done.items()}
    _cdf_figure(None, "Program latency (s)", "fraction of programs that ended",
                {label[name]: [pr.end - pr.prog.start for pr in prs] for name, prs in done.items()}, ax=axes[0])
    _cdf_figure(None, "Longest wait of a program's call (s)", "fraction of programs that ended",
                {label[name]: [max(c.start - c.arrive for c in cs) for pr in prs
                               if (cs := [c for c in pr.calls.values() if c.state == "done"])]
                 for name, prs in done.items()}, ax=axes[1])
    fig.tight_layout()
    p = out / "program_latency_cdf.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    # Tool-wait KV: what each policy's rule did, and the suspended KV it held in HBM meanwhile.
    rules = ("preserve", "swap", "discard")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(rules)
    names = list(results)
    for k, rule in enumerate(rules):
        ax.bar(np.arange(len(names)) + k * width, [results[n].kv_actions.get(rule, 0) for n in names], width,
               label=rule)
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2,
                  [f"{n}\n{results[n].kv_hbm_byte_s / 1e12:.2f} TB·s held" for n in names], fontsize=8)
    ax.set_ylabel("KV actions at tool waits")
    ax.set_title("Tool-wait KV rule: actions per policy, and suspended KV held in HBM")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out / "kv_actions.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    n = len(results)
    fig, axes = plt.subplots(n, 1, figsize=(8, 1.9 * n + 0.6), sharex=True, squeeze=False)
    for ax, (name, res) in zip(axes[:, 0], results.items()):
        if res.hbm_samples:
            s = np.asarray(res.hbm_samples)
            ax.stackplot(s[:, 0] / 60, s[:, 1] / res.hbm_total, s[:, 2] / res.hbm_total, s[:, 3] / res.hbm_total,
                         labels=["weights", "experts", "KV"], step="post", alpha=0.85)
        ax.set_ylim(0, 1)
        ax.set_ylabel(name, fontsize=8)
    axes[0, 0].legend(loc="upper right", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("minutes")
    fig.suptitle("HBM occupancy by state kind (fraction of cluster HBM)")
    fig.tight_layout()
    p = out / "hbm_occupancy.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    classes = ["nvme_r", "nvme_w", "root", "h2d", "d2h"]
    width = 0.8 / max(n, 1)
    for k, (name, res) in enumerate(results.items()):
        per_class = Counter()
        for link, b in res.bytes_by_link.items():
            per_class[link.split(":")[0]] += b
        ax.bar(np.arange(len(classes)) + k * width, [per_class[c] / 1e12 for c in classes], width, label=name)
    ax.set_xticks(np.arange(len(classes)) + 0.4 - width / 2, classes)
    ax.set_ylabel("TB moved")
    ax.set_title("Bytes per link class")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out / "bytes_per_link.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths
