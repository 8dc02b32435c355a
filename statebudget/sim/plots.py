"""Plots of a replay: stall and TTFT CDFs per policy, SLO attainment against k, each model's stall
split into the wait for HBM room and loading, where each model's calls ran over time, HBM
occupancy over time by state kind, bytes per link class."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .engine import SimResult  # noqa: E402
from .metrics import attainment_curve, counted_done, group_label, handoff_tail, stall_by_model, ttft_ratios  # noqa: E402

SLO_K = np.arange(1, 21)  # the k of `slo_attainment.png`: TTFT <= k x ideal TTFT


def _cdf(ax, values, label):
    v = np.sort(np.asarray(values, dtype=float))
    if v.size:
        ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label, drawstyle="steps-post")


def _cdf_axes(ax, title: str, ylabel: str, series: dict[str, list]) -> None:
    """One CDF per policy on a symlog x axis."""
    for name, vals in series.items():
        _cdf(ax, vals, name)
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel(title)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}: CDF per policy", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _grouped_bars(ax, groups: list[str], series: dict[str, list[float]], tick_fontsize=None) -> None:
    """One bar per series in each group, side by side; the groups name the x ticks."""
    width = 0.8 / max(len(series), 1)
    for k, (label, values) in enumerate(series.items()):
        ax.bar(np.arange(len(groups)) + k * width, values, width, label=label)
    many = len(groups) > 4  # long policy specs side by side overlap: slant them
    ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, groups, fontsize=tick_fontsize,
                  rotation=30 if many else 0, ha="right" if many else "center")
    ax.legend(fontsize=8)


def _save(fig, path: Path) -> Path:
    if fig.get_layout_engine() is None:  # a figure made with a layout engine lays itself out
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(results: dict[str, SimResult], out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric, title, fn in (
        ("handoff_stall", "Handoff stall (s)", lambda c: c.ready - c.arrive if c.handoff else None),
        ("ttft", "TTFT (s)", lambda c: c.first_token - c.arrive),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.set_prop_cycle(color=plt.cm.tab20.colors)  # more policies than the default 10 colours
        _cdf_axes(ax, title, "fraction of calls",
                  {name: [v for c in res.calls if c.state == "done" and (v := fn(c)) is not None]
                   for name, res in results.items()})
        paths.append(_save(fig, out / f"{metric}_cdf.png"))

    # SLO attainment (§4): the share of the counted calls with TTFT <= k x their ideal TTFT.
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)
    for name, res in results.items():
        if res.cost is not None:
            ax.plot(SLO_K, attainment_curve(ttft_ratios(res), SLO_K), marker="o", markersize=3, label=name)
    ax.set_xscale("log")
    ax.set_xticks([1, 2, 5, 10, 20], ["1", "2", "5", "10", "20"])
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("k (TTFT bound = k x ideal TTFT)")
    ax.set_ylabel("fraction of calls within the bound")
    ax.set_title("SLO attainment against k, per policy", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "slo_attainment.png"))

    # Programs (seed 003): how long each took end to end, and the longest any of its calls waited
    # to start (the starvation view: a queue discipline that starves a program shows a long tail).
    # Over the programs that ended, as the report's program figures are; the legend says how many.
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for a in axes:
        a.set_prop_cycle(color=plt.cm.tab20.colors)
    done = {name: [pr for pr in res.programs.values() if pr.end >= 0] for name, res in results.items()}
    label = {name: f"{name} ({len(prs)}/{len(results[name].programs)} ended)" for name, prs in done.items()}
    _cdf_axes(axes[0], "Program latency (s)", "fraction of programs that ended",
              {label[name]: [pr.end - pr.prog.start for pr in prs] for name, prs in done.items()})
    _cdf_axes(axes[1], "Longest wait of a program's call (s)", "fraction of programs that ended",
              {label[name]: [max(c.start - c.arrive for c in cs) for pr in prs
                             if (cs := [c for c in pr.calls.values() if c.state == "done"])]
               for name, prs in done.items()})
    paths.append(_save(fig, out / "program_latency_cdf.png"))

    # Tool-wait KV: what each policy's rule did, and the suspended KV it held in HBM meanwhile.
    fig, ax = plt.subplots(figsize=(max(8.0, 1.5 * len(results)), 5))
    _grouped_bars(ax, [f"{n}\n{res.kv_hbm_byte_s / 1e12:.2f} TB·s held" for n, res in results.items()],
                  {rule: [res.kv_actions.get(rule, 0) for res in results.values()]
                   for rule in ("preserve", "swap", "discard")}, tick_fontsize=8)
    ax.set_ylabel("KV actions at tool waits")
    ax.set_title("Tool-wait KV rule: actions per policy, and suspended KV held in HBM")
    paths.append(_save(fig, out / "kv_actions.png"))

    paths.append(_stall_by_model(results, out))
    paths.append(_handoff_tail(results, out))
    paths.append(_placement(results, out))
    if any(res.timeline for res in results.values()):  # replayed with SimConfig.timeline
        paths.append(_residency(results, out))

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
    paths.append(_save(fig, out / "hbm_occupancy.png"))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    classes = ["nvme_r", "nvme_w", "root", "h2d", "d2h"]
    per_class = {}
    for name, res in results.items():
        per_class[name] = Counter()
        for link, b in res.bytes_by_link.items():
            per_class[name][link.split(":")[0]] += b
    _grouped_bars(ax, classes, {name: [c[k] / 1e12 for k in classes] for name, c in per_class.items()})
    ax.set_ylabel("TB moved")
    ax.set_title("Bytes per link class")
    paths.append(_save(fig, out / "bytes_per_link.png"))
    return paths


def _stall_by_model(results: dict[str, SimResult], out: Path) -> Path:
    """Per policy, each model's total stall over the counted calls, split into the wait for HBM
    room and the loading after it (`stall_by_model`): a long first part asks for room, not for
    earlier prefetch."""
    split = {}
    for name, res in results.items():
        by = stall_by_model(counted_done(res))
        split[name] = ({m: s.hbm_wait_total_s for m, s in by.items()},
                       {m: s.stall_total_s - s.hbm_wait_total_s for m, s in by.items()})
    models = sorted({m for wait, _ in split.values() for m in wait})  # the same rows in every panel
    n = len(results)
    fig, axes = plt.subplots(n, 1, figsize=(8, 0.9 + 1.6 * n), sharex=True, squeeze=False)
    y = np.arange(len(models))
    for ax, (name, (wait, load)) in zip(axes[:, 0], split.items()):
        w, ld = [wait.get(m, 0.0) for m in models], [load.get(m, 0.0) for m in models]
        ax.barh(y, w, color="tab:red", label="waiting for HBM room")
        ax.barh(y, ld, left=w, color="tab:blue", label="loading")
        ax.set_yticks(y, models, fontsize=7)
        ax.invert_yaxis()  # first model on top
        ax.set_title(name, fontsize=9)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=7, ncol=2)
    axes[-1, 0].set_xlabel("stall, summed over the counted calls (s)")
    fig.suptitle("Where each model's stall goes", x=0.35)
    return _save(fig, out / "stall_by_model.png")


TAIL_CAUSES = (("room", "tab:red"), ("weights", "tab:blue"), ("pages", "tab:orange"), ("kv", "tab:green"))


def _handoff_tail(results: dict[str, SimResult], out: Path) -> Path:
    """Per policy, the handoff calls at or above its handoff-stall P95, by what held each most
    (`metrics.handoff_tail`): room asks for a replica or a bigger GPU, weights for earlier
    prefetch, pages for room beside the calls."""
    tails = {name: handoff_tail(counted_done(res)) for name, res in results.items()}
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.45 * len(tails)))
    y = np.arange(len(tails))
    left = np.zeros(len(tails))
    for cause, color in TAIL_CAUSES:
        n = np.array([t.by_cause.get(cause, 0) for t in tails.values()], float)
        if n.any():
            ax.barh(y, n, left=left, color=color, label=cause)
            left += n
    ax.set_yticks(y, [f"{name}  (P95 {t.p95_s:.2f} s)" for name, t in tails.items()], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("handoff calls at or above the P95, by what held each most")
    if left.any():  # above the bars, beside the title: never over a bar
        ax.legend(fontsize=7, ncol=len(TAIL_CAUSES), loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title("What sets the handoff-stall P95", loc="left", fontsize=10)
    return _save(fig, out / "handoff_tail.png")


STALLED_S = 5.0  # `placement.png` marks calls that stalled at least this long
KIND_MAPS = ("Blues", "Greens", "Oranges", "Purples", "Reds", "Greys")  # one family of shades per GPU kind


def placement_points(res: SimResult) -> dict[str, list[tuple[float, tuple, float, bool]]]:
    """Per model, (arrival s, group, stall s, counted) of the last attempt of every call whose state
    got ready, warm-up included, in arrival order: where a policy put the model's calls and when
    that moved. `counted`: the call completed and its program started after the warm-up, as the
    metrics count calls (`metrics.counted_done`)."""
    counted = {id(c) for c in counted_done(res)}
    out: dict[str, list] = {}
    for c in sorted((c for c in res.calls if c.group is not None and c.ready >= 0), key=lambda c: c.arrive):
        out.setdefault(c.model, []).append((c.arrive, c.group, c.ready - c.arrive, id(c) in counted))
    return out


def group_styles(groups, cluster=None) -> dict[tuple, tuple]:
    """GPU group -> (colour, legend label). With the cluster, each GPU kind gets one family of
    shades, so the kind shows at a glance and groups of a kind stay apart; without it, distinct
    hues in turn."""
    groups = sorted(groups)
    if cluster is None:
        palette = list(plt.cm.tab10.colors) + [plt.cm.tab20(i) for i in range(1, 20, 2)]
        return {g: (palette[i % len(palette)], group_label(g)) for i, g in enumerate(groups)}
    by_kind: dict[str, list] = {}
    for g in groups:
        by_kind.setdefault(cluster.gpus[g[0]].kind, []).append(g)
    out = {}
    for k, (kind, gs) in enumerate(sorted(by_kind.items())):
        cmap = plt.get_cmap(KIND_MAPS[k % len(KIND_MAPS)])
        for j, g in enumerate(gs):  # shades from mid to dark: pale ones vanish on the warm-up shading
            out[g] = (cmap(0.45 + 0.5 * j / max(len(gs) - 1, 1)), f"{group_label(g)} {kind}")
    return out


def _cost(results: dict[str, SimResult]):
    """The runs' CostModel (its cluster and catalog), None if no run kept one."""
    return next((res.cost for res in results.values() if res.cost is not None), None)


def _placement(results: dict[str, SimResult], out: Path) -> Path:
    """Per policy, each call as a tick at its arrival on its model's row, coloured by the GPU group
    it ran on, with the calls that stalled `STALLED_S` or more ringed: homes that move, replicas,
    and the cascades of cold starts they cause. The same colours in every panel; calls the metrics
    do not count (the warm-up's programs, calls that did not complete) are faint."""
    points = {name: placement_points(res) for name, res in results.items()}
    models = sorted({m for pts in points.values() for m in pts})
    cost = _cost(results)
    cluster = cost.cluster if cost is not None else None
    style = group_styles({g for pts in points.values() for calls in pts.values() for _, g, _, _ in calls}, cluster)
    n, rows = len(results), max(len(models), 1)
    fig, axes = plt.subplots(n, 1, figsize=(10, 1.2 + (0.35 * rows + 0.5) * n), sharex=True, squeeze=False,
                             layout="constrained")
    row = {m: i for i, m in enumerate(models)}
    warm = False
    for ax, (name, pts) in zip(axes[:, 0], points.items()):
        w = getattr(results[name], "warmup_s", 0.0)
        if w > 0:
            warm = True
            ax.axvspan(0, w / 60, color="0.92", zorder=0)
        for m, calls in pts.items():
            for counted, alpha in ((False, 0.3), (True, 1.0)):
                sel = [(a / 60, g, st) for a, g, st, c in calls if c == counted]
                if not sel:
                    continue
                ax.scatter([a for a, _, _ in sel], [row[m]] * len(sel), c=[style[g][0] for _, g, _ in sel],
                           marker="|", s=60, linewidths=1, alpha=alpha)
                slow = [a for a, _, st in sel if st >= STALLED_S]
                if slow:
                    ax.scatter(slow, [row[m]] * len(slow), facecolors="none", edgecolors="red", s=30,
                               linewidths=0.8, alpha=alpha)
        ax.set_yticks(range(len(models)), models, fontsize=7)
        ax.set_ylim(rows - 0.5, -0.5)
        ax.set_title(name, fontsize=9)
    handles = [plt.Line2D([], [], color=c, marker="|", linestyle="", markersize=9, label=label)
               for c, label in style.values()]
    handles.append(plt.Line2D([], [], color="red", marker="o", markerfacecolor="none", linestyle="",
                              label=f"stalled >= {STALLED_S:g} s"))
    fig.legend(handles=handles, loc="outside right center", fontsize=7, title="GPU group")
    axes[-1, 0].set_xlabel("minutes (call arrival" + ("; shaded: warm-up" if warm else "") + "; faint: not counted)")
    fig.suptitle("Where each model's calls ran")
    return _save(fig, out / "placement.png")


def residency_intervals(timeline: list[dict], end: float) -> list[tuple[int, str, float, float]]:
    """(GPU, model, from s, to s) of every stay of a model's weights on a GPU, from a replay's
    timeline (`SimResult.timeline`): from the load or prefetch that brought them to the eviction
    or cancel that took them (`end` if none did)."""
    open_at: dict[tuple, float] = {}
    out = []
    for e in timeline:
        for i in e["gpus"]:
            k = (i, e["model"])
            if e["event"] in ("load", "prefetch"):
                open_at.setdefault(k, e["t"])
            elif e["event"] in ("evict", "cancel") and k in open_at:
                out.append((i, e["model"], open_at.pop(k), e["t"]))
    out += [(i, m, t0, max(end, t0)) for (i, m), t0 in open_at.items()]
    return sorted(out, key=lambda x: (x[0], x[2]))


def _residency(results: dict[str, SimResult], out: Path) -> Path:
    """Per policy, each GPU's row with a bar for every stay of a model's weights there (one colour
    per model, a thin lane each where several shared the GPU), a cross at each cold start and a
    tick at each eviction: homes that thrash show as short bars taking turns."""
    cost = _cost(results)
    seen = {e["model"] for res in results.values() for e in res.timeline}
    # one colour per model of the catalog, so plots of different runs agree
    order = [m.name for m in cost.catalog.models] if cost is not None else sorted(seen)
    colour = {m: plt.cm.tab10.colors[i % 10] for i, m in enumerate(order)}
    models = [m for m in order if m in seen]
    cluster = cost.cluster if cost is not None else None
    n_gpu = len(cluster.gpus) if cluster is not None else \
        max((i + 1 for res in results.values() for e in res.timeline for i in e["gpus"]), default=1)
    fig, axes = plt.subplots(len(results), 1, figsize=(10, 1.2 + (0.2 * n_gpu + 0.6) * len(results)), sharex=True,
                             squeeze=False, layout="constrained")
    for ax, (name, res) in zip(axes[:, 0], results.items()):
        stays = residency_intervals(res.timeline, res.sim_end)
        lanes: dict[int, list] = {}  # GPU -> the models that ever lived there, one thin lane each
        for i, m, _, _ in stays:
            if m not in lanes.setdefault(i, []):
                lanes[i].append(m)
        for i, m, t0, t1 in stays:
            h = 0.8 / len(lanes[i])
            ax.broken_barh([(t0 / 60, max(t1 - t0, 1.0) / 60)], (i - 0.4 + h * lanes[i].index(m), h), color=colour[m])
        gone = [(e["t"] / 60, i) for e in res.timeline if e["event"] in ("evict", "cancel") for i in e["gpus"]]
        if gone:  # a stay cut short shows even where the bars meet again
            ax.scatter(*zip(*gone), marker="|", color="0.25", s=30, linewidths=0.8)
        cold = [(e["t"] / 60, i) for e in res.timeline if e.get("engine") == "cold" for i in e["gpus"]]
        if cold:
            ax.scatter(*zip(*cold), marker="x", color="black", s=14, linewidths=0.8)
        if res.warmup_s > 0:
            ax.axvspan(0, res.warmup_s / 60, color="0.92", zorder=0)
        ax.set_ylim(n_gpu - 0.5, -0.5)
        ax.set_yticks(range(n_gpu), [f"GPU {i}" for i in range(n_gpu)], fontsize=6)
        ax.set_title(name, fontsize=9)
    handles = [plt.Line2D([], [], color=colour[m], linewidth=6, label=m) for m in models]
    handles.append(plt.Line2D([], [], color="black", marker="x", linestyle="", label="cold start"))
    handles.append(plt.Line2D([], [], color="0.25", marker="|", linestyle="", label="evicted"))
    fig.legend(handles=handles, loc="outside right center", fontsize=7, title="weights of")
    axes[-1, 0].set_xlabel("minutes")
    fig.suptitle("Where each model's weights lived")
    return _save(fig, out / "residency.png")
