"""H1-H3 of seed 002 for `statebudget evidence`, each labelled with how it is measured.

- H1 (simulator replay): does pooling KV across models gain < 15 % long-context capacity over
  independent per-model allocation? From the replays evidence already runs (swe-team under
  statebudget-lease), the KV bytes of running calls per model, cluster-wide, as a step function
  of time over the evaluated window (after the warm-up). Independent allocation reserves each
  model's own quantile, a pool the quantile of the sum: capacity ratio = sum_m Q(KV_m) / Q(sum_m
  KV_m), at Q95 and at the peak (Q100). No pooled allocator is simulated: the rejection rates are
  read off the replay's timeline (open loop), at the budget pooling needs for 95 % of the time.
- H2 (cost model, not measured on hardware): attention/FFN disaggregation hops the hidden state
  between GPUs twice per layer per decode token; against the same model's roofline decode step.
- H3 (cost-model arithmetic, KV from the replay): K = 1, 2, ... warm models placed on tensor-
  parallel groups; the first K where weights alone, or weights plus each model's P95 KV, no
  longer fit; the next model's cold load from DRAM and NVMe.
"""

from __future__ import annotations

import numpy as np

from ..core.costs import LATENCY_S, CostModel
from ..models.catalog import Catalog, ModelSpec, MoESpec
from ..models.cluster import GB, Cluster
from . import html as H
from .paired import ratio_of_means

H1_MAX_RATIO = 1.15
H1_MIN_ACTIVE_P95 = 4
H2_PCIE_MIN_SHARE, H2_NVLINK_MAX_SHARE, H2_TPOT = 0.30, 0.10, (1.4, 2.0)
H3_MAX_K, H3_SHARE, H3_COLD_S = 3, (0.60, 0.80), 10.0
H3_HBM_GB = (400, 800)  # "total HBM of about 400-800 GB": the clusters H3 speaks of

# Hidden size and layers by `ModelSpec.version`: each model's Hugging Face config.json
# (hidden_size, num_hidden_layers). A catalog entry may carry `hidden_size` and `layers` itself.
SHAPES = {
    "llama-3.1-8b": (4096, 32), "qwen2.5-coder-32b": (5120, 64), "qwen2.5-14b": (5120, 48),
    "qwen3-235b-a22b": (4096, 94), "qwen3-30b-a3b": (2048, 48), "qwen2.5-7b": (3584, 28),
    "qwen2.5-vl-7b": (3584, 28), "deepseek-v3": (7168, 61), "glm-4.5-air": (4096, 46),
}
HIDDEN_BYTES = 2  # activations travel in bf16, fp8 weights or not
# NVLink, which no cluster file describes: A100 NVLink 3, 600 GB/s both directions (datasheet), 300
# one way; GPU-to-GPU latency 8-16 us on NVLink against 15-25 us on PCIe in one node (a vendor FAQ,
# jarvislabs.ai/ai-faqs/what-are-the-key-differences-between-nvlink-and-pcie; the cost model's PCIe
# copy latency, LATENCY_S["gpu"], is 20 us). Not measured here.
NVLINK = (300.0, 10e-6)
H2_CONTEXT, H2_BATCHES = 4096, (1, 8)

# Large MoE models with the figures of shared/data/hardware.md (no preset has one): the nearest
# sourced stand-ins for "DeepSeek V4 Pro + GLM-5.2". MoE: weights_gb is the dense part.
FRONTIER = [
    dict(name="deepseek-v3", version="deepseek-v3-fp8", weights_gb=17.7, kv_bytes_per_token=70246,
         active_params_b=37.0, moe=dict(experts=256, active=8, layers=58, expert_gb=0.044, pages=16)),
    dict(name="glm-4.5-air", version="glm-4.5-air-bf16", weights_gb=14.7, kv_bytes_per_token=188416,
         active_params_b=12.0, moe=dict(experts=128, active=8, layers=45, expert_gb=0.0346, pages=16)),
    dict(name="qwen3-235b", version="qwen3-235b-a22b-fp8", weights_gb=8.0, kv_bytes_per_token=192512,
         active_params_b=22.0, moe=dict(experts=128, active=8, layers=94, expert_gb=0.0189, pages=16)),
]


# ---- H1: per-model KV demand ---------------------------------------------------------------------
def _wq(values: np.ndarray, w: np.ndarray, q: float) -> float:
    """Time-weighted quantile of a step function (`values` held for `w` seconds each)."""
    if values.size == 0:
        return 0.0
    order = np.argsort(values, kind="stable")
    cw = np.cumsum(w[order])
    return float(values[order][min(int(np.searchsorted(cw, q * cw[-1] * (1 - 1e-12))), values.size - 1)])


def steps(intervals, t0: float, t1: float, models: list[str]):
    """Per-model demand on each segment between breakpoints: (levels [model, segment], seconds
    per segment, segment starts). `intervals`: (start, end, model, bytes), clipped to [t0, t1)."""
    iv = [(max(s, t0), min(e, t1), m, b) for s, e, m, b in intervals if min(e, t1) > max(s, t0)]
    ts = np.unique(np.array([t0, t1] + [x for s, e, _, _ in iv for x in (s, e)], float))
    idx = {m: i for i, m in enumerate(models)}
    diff = np.zeros((len(models), ts.size))
    if iv:
        rows = np.array([idx[m] for _, _, m, _ in iv])
        b = np.array([x[3] for x in iv], float)
        np.add.at(diff, (rows, np.searchsorted(ts, [x[0] for x in iv])), b)
        np.add.at(diff, (rows, np.searchsorted(ts, [x[1] for x in iv])), -b)
    return np.cumsum(diff, axis=1)[:, :-1], np.diff(ts), ts[:-1]


def capacity(intervals, t0: float, t1: float, models: list[str]) -> dict:
    """Independent against pooled KV reservation for one demand timeline: each model's Q95 and
    Q100, those of the sum, their ratios, and the share of calls (interval starts) that each
    scheme would turn away at the pooled Q95 budget (split in proportion to the per-model Q95s
    when independent)."""
    lv, w, ts = steps(intervals, t0, t1, models)
    tot = lv.sum(axis=0)
    out = {"models": list(models), "active_models_p95": int(_wq((lv > 0).sum(axis=0).astype(float), w, 0.95))}
    for q, tag in ((0.95, "q95"), (1.0, "q100")):
        per = [_wq(lv[i], w, q) for i in range(len(models))]
        pooled = _wq(tot, w, q)
        out[f"per_model_{tag}"] = dict(zip(models, per))
        out[f"independent_{tag}"], out[f"pooled_{tag}"] = float(sum(per)), pooled
        out[f"ratio_{tag}"] = float(sum(per) / pooled) if pooled > 0 else None
    budget, indep = out["pooled_q95"], out["independent_q95"]
    share = {m: budget * v / indep if indep > 0 else 0.0 for m, v in out["per_model_q95"].items()}
    starts = [(s, m) for s, e, m, _ in intervals if t0 <= s < t1 and e > s]
    seg = np.searchsorted(ts, [s for s, _ in starts], side="right") - 1
    eps = 1e-9 * max(budget, 1.0)
    rej_pool = sum(tot[j] > budget + eps for j in seg)
    rej_ind = sum(lv[models.index(m), j] > share[m] + eps for j, (_, m) in zip(seg, starts))
    n = max(len(starts), 1)
    out["rejected_at_pooled_q95"] = {"pooled": round(rej_pool / n, 6), "independent": round(rej_ind / n, 6),
                                     "calls": len(starts)}
    return out


def kv_demand(res, catalog: Catalog) -> dict:
    """H1's figures of one replay (`SimResult`), run in the sweep's worker: running calls' KV
    ((context + output) x KV bytes/token, start to end) per model, cluster-wide, over the
    evaluated window; the same for sessions (a program's KV on a model held from its first call
    there to its last one's end, at its largest); and the number of live programs."""
    t0, t1 = res.warmup_s, res.sim_end
    models = [m.name for m in catalog.models]
    kvb = {m.name: m.kv_bytes_per_token for m in catalog.models}
    calls = [c for c in res.calls if c.start >= 0 and c.end > c.start]
    iv = [(c.start, c.end, c.model, (c.context_tokens + c.output_tokens) * kvb[c.model]) for c in calls]
    sess: dict = {}
    for c, (_, _, _, nb) in zip(calls, iv):
        s, e, b = sess.get((c.program, c.model), (c.start, c.end, 0.0))
        sess[(c.program, c.model)] = (min(s, c.start), max(e, c.end), max(b, nb))
    progs = [(p.prog.start, p.end, "p", 1.0) for p in res.programs.values() if p.end > p.prog.start]
    lv, w, _ = steps(progs, t0, t1, ["p"])
    out = {"window_s": round(t1 - t0, 3), "calls": capacity(iv, t0, t1, models),
           "sessions": capacity([(s, e, m, b) for (_, m), (s, e, b) in sess.items()], t0, t1, models),
           "live_programs": {"mean": round(float((lv[0] * w).sum() / w.sum()), 3) if w.sum() > 0 else 0.0,
                             "p95": _wq(lv[0], w, 0.95)}}
    return out


def _summary(per: list[dict]) -> dict:
    out = {}
    for kind in ("calls", "sessions"):
        c = [p[kind] for p in per]
        out[kind] = {tag: ratio_of_means([x[f"pooled_{tag}"] for x in c], [x[f"independent_{tag}"] for x in c])
                     for tag in ("q95", "q100")}
        out[kind]["per_seed_ratio_q95"] = [x["ratio_q95"] for x in c]
        out[kind]["pooled_q95_gb"] = round(float(np.mean([x["pooled_q95"] for x in c])) / GB, 3)
        out[kind]["independent_q95_gb"] = round(float(np.mean([x["independent_q95"] for x in c])) / GB, 3)
        out[kind]["rejected_at_pooled_q95"] = {k: round(float(np.mean([x["rejected_at_pooled_q95"][k] for x in c])), 4)
                                               for k in ("pooled", "independent")}
    out["live_programs"] = {"mean": round(float(np.mean([p["live_programs"]["mean"] for p in per])), 2),
                            "p95": max(p["live_programs"]["p95"] for p in per)}
    out["active_models_p95"] = max(p["calls"]["active_models_p95"] for p in per)
    return out


def h1(rows: list[dict], seeds: list[int], active: dict, enough: bool, load: float, tag: str = "") -> tuple[dict, str]:
    """The H1 answer over seeds from the rows that carry `kv_demand`: at `load` (the swe-team
    arrival rate scaled to H1's ~10 live sessions; the verdict) and at the evidence's own 1x.
    `tag` prefixes a verdict given on fewer seeds than figures are quoted from."""
    by: dict = {}
    for r in rows:
        if "kv_demand" in r:
            by.setdefault(r["load"], {})[r["seed"]] = r["kv_demand"]
    per = {x: [by[x][s] for s in seeds] for x in sorted(by)}
    ans = {"method": f"simulator replay (swe-team at {load:g}x and 1x load, statebudget-lease), running calls' KV "
                     "per model, cluster-wide", "load": load,
           "predicted": {"ratio_q95_below": H1_MAX_RATIO, "active_models_p95_at_least": H1_MIN_ACTIVE_P95},
           **_summary(per[load]), "at_load_1": _summary(per[1.0]),
           "active_models_p95_zero_stall_1x": active["p95"]}
    r = ans["calls"]["q95"]
    gain_ok, gain_no = r["ci95"][1] < H1_MAX_RATIO, r["ci95"][0] >= H1_MAX_RATIO
    act_ok = ans["active_models_p95"] >= H1_MIN_ACTIVE_P95
    ans["holds"] = bool(enough and gain_ok and act_ok)
    verdict = ("too few seeds for a verdict" if not enough else tag + ("holds" if gain_ok and act_ok else
               "does not hold" if gain_no or not act_ok else "not shown"))
    ans["verdict"] = verdict
    one = ans["at_load_1"]
    rej = ans["calls"]["rejected_at_pooled_q95"]
    reading = (f"Simulator replay, swe-team under statebudget-lease at {load:g}x its arrival rate (live programs: "
               f"mean {ans['live_programs']['mean']:.1f}, P95 {ans['live_programs']['p95']:g}; H1 assumes ~10), "
               f"evaluated window only; KV of running calls per model, cluster-wide. Independent reservation over "
               f"pooled, at Q95: {_x(r)} (predicted < {H1_MAX_RATIO}); at the peak: {_x(ans['calls']['q100'])}. "
               f"Pooled Q95 {ans['calls']['pooled_q95_gb']:.1f} GB against {ans['calls']['independent_q95_gb']:.1f}"
               f" GB. At the pooled Q95 budget the pool turns away {100 * rej['pooled']:.1f} % of calls, "
               f"independent shares {100 * rej['independent']:.1f} % (open loop, read off the replay). Sessions' "
               f"KV (held from a program's first call on a model to its last): {_x(ans['sessions']['q95'])}. "
               f"Models with a running call at once, P95 {ans['active_models_p95']} (predicted >= "
               f"{H1_MIN_ACTIVE_P95}). At 1x (mean {one['live_programs']['mean']:.1f} live programs): calls "
               f"{_x(one['calls']['q95'])}, sessions {_x(one['sessions']['q95'])}, active models P95 "
               f"{one['active_models_p95']} in the replay, {active['p95']} on the zero-stall timeline (the CDF "
               f"below).")
    rows_t = [[f"{x:g}x", s, round(d["calls"]["ratio_q95"] or 0, 3), round(d["calls"]["ratio_q100"] or 0, 3),
               d["calls"]["pooled_q95"] / GB, d["calls"]["independent_q95"] / GB,
               round(d["sessions"]["ratio_q95"] or 0, 3), d["calls"]["active_models_p95"]]
              for x in (load, 1.0) for s, d in zip(seeds, per[x])]
    fig = _h1_fig(seeds, per, load)
    return ans, H.section("h1", "H1: KV pooling against independent allocation (seed 002) - simulator replay", reading,
                          [fig], H.table(["load", "seed", "ratio Q95 (calls)", "ratio Q100", "pooled Q95 GB",
                                          "independent Q95 GB", "ratio Q95 (sessions)", "active models P95"], rows_t,
                                         "h1"), verdict=verdict)


def _x(c: dict) -> str:
    return f"{c['ratio']:.2f}x [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]"


def _h1_fig(seeds, per, load) -> str:
    fig, ax = H.plt.subplots(figsize=(6.5, 3.4))
    x = np.arange(len(seeds))
    for i, (lv, tone) in enumerate(((load, ("#3b6fb6", "#9db7dd")), (1.0, ("#b36b3b", "#ddb79d")))):
        ax.bar(x - 0.3 + 0.4 * i, [p["calls"]["independent_q95"] / GB for p in per[lv]], 0.2, color=tone[0],
               label=f"{lv:g}x: independent, sum of Q95s")
        ax.bar(x - 0.1 + 0.4 * i, [p["calls"]["pooled_q95"] / GB for p in per[lv]], 0.2, color=tone[1],
               label=f"{lv:g}x: pooled, Q95 of the sum")
    ax.set_xticks(x, [str(s) for s in seeds])
    ax.set_xlabel("seed")
    ax.set_ylabel("KV of running calls (GB)")
    ax.legend(fontsize=7)
    return H.png_uri(fig)


# ---- H2: hidden-state hops against the decode step -----------------------------------------------
def shape(m: ModelSpec) -> tuple[int, int] | None:
    """(hidden size, layers) of a model: its own fields, else `SHAPES` by version (None: unknown)."""
    extra = m.model_extra or {}
    if "hidden_size" in extra and "layers" in extra:
        return int(extra["hidden_size"]), int(extra["layers"])
    for v, hl in SHAPES.items():
        if m.version.startswith(v):
            return hl
    return None


def disagg(cost: CostModel, m: ModelSpec, group: tuple[int, ...], peer: int, batch: int,
           link: tuple[float, float] | None, context: int = H2_CONTEXT) -> dict:
    """One decode token of `m` on `group` with its FFNs on GPU `peer` (CrossPool/Weaver-style):
    2 hops per layer of batch x hidden x 2 bytes, none hidden behind compute (a decode step's
    layers depend on each other), against the all-local roofline step on the same group."""
    hidden, layers = shape(m)
    nbytes = batch * hidden * HIDDEN_BYTES
    hop = cost.hop_s(nbytes, group[0], peer, link)
    exposed = 2 * layers * hop
    local = cost.decode_step_s(m, batch, context, group)
    # the per-hop latency at which the exposed share reaches H2's 30 %
    latency = LATENCY_S["gpu"] if link is None else link[1]
    lat_30 = H2_PCIE_MIN_SHARE / (1 - H2_PCIE_MIN_SHARE) * local / (2 * layers) - (hop - latency)
    return {"hop_bytes": nbytes, "hop_s": hop, "exposed_s": exposed, "local_s": local,
            "share": exposed / (local + exposed), "tpot_ratio": (local + exposed) / local, "latency_for_30pct_s": lat_30}


def h2(cluster: Cluster, catalog: Catalog) -> tuple[dict, str]:
    cost = CostModel(cluster, catalog)
    rows, skipped = [], []
    for m in catalog.models:
        if shape(m) is None:
            skipped.append(m.name)
            continue
        by_kind = {}
        for g in cluster.model_groups(m):
            by_kind.setdefault(cluster.gpus[g[0]].kind, g)
        for kind, g in sorted(by_kind.items()):
            # the peer: the first GPU of another kind (a mixed pair, as 3090 + A100), else of another node
            peer = next((x.index for x in cluster.gpus if x.kind != kind),
                        next((x.index for x in cluster.gpus if x.node != cluster.gpus[g[0]].node), g[-1]))
            row = {"model": m.name, "gpu": kind, "peer": cluster.gpus[peer].kind}
            for b in H2_BATCHES:
                for name, link in (("pcie", None), ("nvlink", NVLINK)):
                    d = disagg(cost, m, g, peer, b, link)
                    row[f"{name}_b{b}"] = {k: round(v, 9) for k, v in d.items()}
            rows.append(row)
    pcie = [r["pcie_b1"]["share"] for r in rows]
    nvl = [r["nvlink_b1"]["share"] for r in rows]
    over = sum(s > H2_PCIE_MIN_SHARE for s in pcie)
    where = sorted({r["model"] for r in rows if r["pcie_b1"]["share"] > H2_PCIE_MIN_SHARE})
    verdict = ("not shown (no model with a known shape)" if not rows else
               "holds" if over == len(rows) and max(nvl) < H2_NVLINK_MAX_SHARE else
               "does not hold" if over == 0 else
               f"does not hold in general (PCIe share > 30 % on {over} of {len(rows)} rows: {', '.join(where)})")
    ans = {"method": "cost model, not measured on hardware", "context_tokens": H2_CONTEXT, "batches": list(H2_BATCHES),
           "nvlink": {"gbps": NVLINK[0], "latency_s": NVLINK[1]},
           "pcie_latency_s": LATENCY_S["gpu"], "rows": rows, "skipped": skipped,
           "predicted": {"pcie_share_above": H2_PCIE_MIN_SHARE, "nvlink_share_below": H2_NVLINK_MAX_SHARE,
                         "tpot_ratio": list(H2_TPOT)},
           "pcie_share_b1": [round(min(pcie), 4), round(max(pcie), 4)] if rows else None,
           "nvlink_share_b1": [round(min(nvl), 4), round(max(nvl), 4)] if rows else None,
           "tpot_ratio_pcie_b1": [round(min(r["pcie_b1"]["tpot_ratio"] for r in rows), 4),
                                  round(max(r["pcie_b1"]["tpot_ratio"] for r in rows), 4)] if rows else None,
           "verdict": verdict}
    lat = [r["pcie_b1"]["latency_for_30pct_s"] for r in rows]
    reading = (f"Cost model, not measured on hardware. Per decode token, 2 hidden-state hops per layer (attention "
               f"here, FFN on a GPU of another kind), batch x hidden x {HIDDEN_BYTES} bytes each, priced by "
               f"CostModel.hop_s (PCIe: the cluster's GPU-host-GPU path and the cost model's "
               f"{LATENCY_S['gpu'] * 1e6:g} us copy latency; NVLink: {NVLINK[0]:g} GB/s, {NVLINK[1] * 1e6:g} us, "
               f"a vendor figure), none hidden behind compute; against the "
               f"roofline decode step at {H2_CONTEXT} tokens of context. Batch 1: exposed share on PCIe "
               + (f"{100 * min(pcie):.1f}-{100 * max(pcie):.1f} % (predicted 30-50 %), NVLink {100 * min(nvl):.1f}-"
                  f"{100 * max(nvl):.1f} % (predicted < 10 %); TPOT {ans['tpot_ratio_pcie_b1'][0]:.2f}-"
                  f"{ans['tpot_ratio_pcie_b1'][1]:.2f}x all-local (predicted 1.4-2.0x). The hops are latency-bound "
                  f"(KB each): PCIe's share would reach 30 % at {1e6 * min(lat):.0f}-{1e6 * max(lat):.0f} us per hop."
                  if rows else "no model with a known shape.")
               + (f" No shape for {', '.join(skipped)}." if skipped else ""))
    body = H.table(["model", "GPU kind", "FFN on", "PCIe share b1", "NVLink share b1", "TPOT ratio PCIe b1",
                    f"PCIe share b{H2_BATCHES[-1]}", f"TPOT ratio PCIe b{H2_BATCHES[-1]}", "hop us for 30 %"],
                   [[r["model"], r["gpu"], r["peer"], r["pcie_b1"]["share"], r["nvlink_b1"]["share"],
                     r["pcie_b1"]["tpot_ratio"], r[f"pcie_b{H2_BATCHES[-1]}"]["share"],
                     r[f"pcie_b{H2_BATCHES[-1]}"]["tpot_ratio"], 1e6 * r["pcie_b1"]["latency_for_30pct_s"]]
                    for r in rows], "h2")
    figs = [_h2_fig(rows)] if rows else []
    return ans, H.section("h2", "H2: hidden-state disaggregation on PCIe (seed 002) - cost model, not measured on "
                          "hardware", reading, figs, body, verdict=verdict)


def _h2_fig(rows) -> str:
    fig, ax = H.plt.subplots(figsize=(8, 3.6))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [100 * r["pcie_b1"]["share"] for r in rows], 0.4, label="PCIe")
    ax.bar(x + 0.2, [100 * r["nvlink_b1"]["share"] for r in rows], 0.4, label="NVLink")
    ax.axhline(100 * H2_PCIE_MIN_SHARE, color="#b33", ls="--", lw=1, label="H2: PCIe > 30 %")
    ax.set_xticks(x, [f"{r['model']}\n{r['gpu']}" for r in rows], fontsize=6, rotation=60)
    ax.set_ylabel("exposed share of a token, batch 1 (%)")
    ax.legend(fontsize=8)
    return H.png_uri(fig)


# ---- H3: warm models against HBM -----------------------------------------------------------------
def frontier_catalog(cluster: Cluster) -> Catalog:
    """`FRONTIER` with each model's tp the largest group of the cluster (all of a node's GPUs of
    one kind), as such models are served (tensor/expert parallel over the node): the smallest
    group that holds one alone would leave no room beside it for the next."""
    tp = max(len(g) for t in range(1, 17) for g in cluster.groups(t))
    return Catalog(name="frontier-moe", models=[ModelSpec(**{**d, "moe": MoESpec(**d["moe"]), "tp": tp})
                                                for d in FRONTIER])


def place(cluster: Cluster, models: list[ModelSpec], kv: dict[str, float]) -> dict | None:
    """First-fit-decreasing with best fit: each model's whole weights (dense + every expert),
    its engine overhead and its `kv` bytes split over one of its groups (`Cluster.model_groups`).
    {model: group}, or None when they do not all fit."""
    free = [cluster.usable_hbm_bytes(g) for g in cluster.gpus]
    where = {}
    for m in sorted(models, key=lambda m: (-(m.total_bytes + kv.get(m.name, 0.0)), m.name)):
        best = None
        for g in cluster.model_groups(m):
            need = (m.total_bytes + kv.get(m.name, 0.0)) / len(g) + \
                cluster.gpu_kinds[cluster.gpus[g[0]].kind].engine_overhead_gb * GB
            left = min(free[i] for i in g) - need
            if left >= 0 and (best is None or left < best[0]):
                best = (left, g, need)
        if best is None:
            return None
        for i in best[1]:
            free[i] -= best[2]
        where[m.name] = best[1]
    return where


def warm_sweep(cluster: Cluster, catalog: Catalog, order: list[str], kv: dict[str, float]) -> dict:
    """K = 1 .. all warm models (the first K of `order`): do their weights fit, and with their
    KV? The first K that fails and by what; each K's weights share of HBM and the cold load of
    the K-th model onto its group (or, if it fits nowhere, its largest group)."""
    cost = CostModel(cluster, catalog)
    hbm = cluster.total_hbm_bytes
    rows, first = [], None
    for k in range(1, len(order) + 1):
        ms = [catalog.by_name[n] for n in order[:k]]
        w_ok = place(cluster, ms, {}) is not None
        placed = place(cluster, ms, kv) if w_ok else None
        killer = None if placed else "weights" if not w_ok else "kv"
        m = ms[-1]
        g = placed[m.name] if placed else max(cluster.model_groups(m), key=lambda g: sum(
            cluster.usable_hbm_bytes(cluster.gpus[i]) for i in g))
        node = cluster.gpus[g[0]].node
        copy_h = cost.group_transfer_s(m.total_bytes, "host", node, g)
        row = {"k": k, "added": m.name, "fits": placed is not None, "killer": killer,
               "fits_alone": place(cluster, [m], {}) is not None,
               "weights_gb": round(sum(x.total_bytes for x in ms) / GB, 3),
               "kv_gb": round(sum(kv.get(x.name, 0.0) for x in ms) / GB, 3),
               "weights_share_hbm": round(sum(x.total_bytes for x in ms) / hbm, 4),
               "load": {"group": list(g), "copy_host_s": round(copy_h, 3),
                        "host_wake_s": round(copy_h + cost.reconfig_s(g, "host", wake=True), 3),
                        "host_cold_s": round(copy_h + cost.reconfig_s(g, "host"), 3),
                        "nvme_cold_s": round(cost.group_transfer_s(m.total_bytes, "nvme", node, g) +
                                             cost.reconfig_s(g, "nvme"), 3)}}
        rows.append(row)
        if killer and first is None:
            first = {"k": k, "killer": killer, "model": m.name, "fits_alone": row["fits_alone"]}
    return {"cluster": cluster.name, "catalog": catalog.name, "hbm_gb": round(hbm / GB, 1),
            "usable_hbm_gb": round(sum(cluster.usable_hbm_bytes(g) for g in cluster.gpus) / GB, 1),
            "order": list(order), "rows": rows, "first_failure": first}


def h3(kv_q95: dict[str, float], order: list[str], kv_from: str) -> tuple[dict, str]:
    """Three sweeps: hetero16 x agent-team (KV: each model's replay Q95, mean over seeds), and
    the frontier MoE stand-ins on hetero16 and on h200x8 (KV: the replay's largest per-model
    Q95 in tokens, at each model's bytes per token)."""
    from ..models.load import load_catalog, load_cluster

    cat = load_catalog("agent-team")
    tok = max((kv_q95.get(m.name, 0.0) / m.kv_bytes_per_token for m in cat.models), default=0.0)
    sweeps = [warm_sweep(load_cluster("hetero16"), cat, order, kv_q95)]
    for cname in ("hetero16", "h200x8"):
        cl = load_cluster(cname)
        fc = frontier_catalog(cl)
        sweeps.append(warm_sweep(cl, fc, [m.name for m in fc.models],
                                 {m.name: tok * m.kv_bytes_per_token for m in fc.models}))
    main = sweeps[0]
    f = main["first_failure"]
    third = main["rows"][2]["load"] if len(main["rows"]) > 2 else None
    # H3's condition is frontier MoE models on 10-20 GPUs with ~400-800 GB of HBM: the verdict reads
    # the frontier stand-ins on every cluster in that range; agent-team is context.
    judged = [s for s in sweeps[1:] if H3_HBM_GB[0] <= s["hbm_gb"] <= H3_HBM_GB[1]]
    verdict = "; ".join(f"{s['cluster']} x frontier: {_h3_verdict(s)}" for s in judged) or \
        "not shown (no cluster in H3's HBM range)"
    ans = {"method": f"cost-model arithmetic: placement on tensor-parallel groups, KV at each model's Q95 in {kv_from}",
           "predicted": {"first_killer": "weights", "k_at_most": H3_MAX_K, "two_frontier_share": list(H3_SHARE),
                         "third_cold_load_s_above": H3_COLD_S},
           "sweeps": sweeps,
           "kv_tokens_frontier": round(tok, 1), "verdict": verdict,
           "frontier": [{"cluster": s["cluster"], "first_failure": s["first_failure"],
                         "two_weights_share_hbm": s["rows"][1]["weights_share_hbm"], "third_load": s["rows"][2]["load"]}
                        for s in sweeps[1:]]}
    ff = [s["first_failure"] for s in sweeps]
    reading = (f"Cost-model arithmetic, not a replay: K warm models (agent-team in swe-team's call-share order), "
               f"each with all its weights resident (dense + every expert) on one of its tensor-parallel groups, "
               f"the engine overhead and usable HBM of the cluster file, then with its KV at its Q95 in {kv_from}. "
               f"hetero16 x agent-team ({main['hbm_gb']:g} GB HBM): "
               + (f"first fails at K = {f['k']} ({f['model']}), by {f['killer']}" if f else "all fit")
               + (f" ({f['model']}'s whole weights fit none of its groups even alone: the per-group ceiling, "
                  f"not the sum)" if f and not f["fits_alone"] else "")
               + (f"; the third model ({main['rows'][2]['added']}) loads in {third['copy_host_s']:.1f} s from DRAM "
                  f"({third['host_wake_s']:.1f} s with an asleep engine's wake, {third['host_cold_s']:.1f} s with a fresh "
                  f"engine), "
                  f"{third['nvme_cold_s']:.1f} s from NVMe (predicted > {H3_COLD_S:g} s)" if third else "")
               + ". Frontier MoE stand-ins (DeepSeek-V3 fp8, GLM-4.5-Air, Qwen3-235B fp8; shared/data/hardware.md): "
               + "; ".join(f"{s['cluster']} ({s['hbm_gb']:g} GB): "
                           + (f"first fails at K = {x['k']} by {x['killer']}" if x else "all fit")
                           + f", two take {100 * s['rows'][1]['weights_share_hbm']:.0f} % of HBM (predicted 60-80 "
                           "%), the third loads "
                           f"from DRAM in {s['rows'][2]['load']['host_wake_s']:.1f} s with a wake, "
                           f"{s['rows'][2]['load']['host_cold_s']:.1f} s with a fresh engine"
                           for s, x in zip(sweeps[1:], ff[1:]))
               + f". The verdict reads the frontier sweeps on clusters of {H3_HBM_GB[0]}-{H3_HBM_GB[1]} GB HBM "
               "(H3's condition); a cold load is a fresh engine's (DRAM copy plus engine start), the one H3's "
               "'cold load TTFT' names. A MoE model whose whole "
               "weights fit no group still runs in the replays, its expert pages streamed from DRAM: the weight "
               "tiering H3 argues for.")
    body = "".join(f"<p><b>{s['cluster']} x {s['catalog']}</b> ({s['hbm_gb']:g} GB HBM, {s['usable_hbm_gb']:g} "
                   "usable)</p>" + H.table(["K", "added", "weights GB", "KV GB", "weights / HBM", "fits", "first killer",
                            "copy from DRAM s", "DRAM + wake s", "NVMe + engine start s"],
                           [[r["k"], r["added"], r["weights_gb"], r["kv_gb"], r["weights_share_hbm"],
                             "yes" if r["fits"] else "no", r["killer"] or "", r["load"]["copy_host_s"],
                             r["load"]["host_wake_s"], r["load"]["nvme_cold_s"]] for r in s["rows"]],
                           f"h3 h3-{s['cluster']}-{s['catalog']}") for s in sweeps)
    return ans, H.section("h3", "H3: weights or KV, which hits HBM first (seed 002) - cost-model arithmetic",
                          reading, [_h3_fig(sweeps)], body, verdict=verdict)


def _h3_verdict(s: dict) -> str:
    """H3 on one sweep: weights, not KV, fail first, and at K <= 3."""
    f = s["first_failure"]
    if f is None:
        return "does not hold (all fit)"
    if f["killer"] == "kv":
        return f"does not hold (KV first, at K = {f['k']})"
    if not f["fits_alone"]:
        return (f"not shown ({f['model']} fits no group whole even alone: the ceiling is one group's HBM, "
                "not a working set of warm models)")
    if f["k"] <= H3_MAX_K:
        return f"holds (weights first, at K = {f['k']})"
    return f"does not hold (weights first, but at K = {f['k']} > {H3_MAX_K})"


def _h3_fig(sweeps) -> str:
    fig, axes = H.plt.subplots(1, len(sweeps), figsize=(9, 3.4))
    for ax, s in zip(axes, sweeps):
        k = [r["k"] for r in s["rows"]]
        ax.bar(k, [r["weights_gb"] for r in s["rows"]], label="weights")
        ax.bar(k, [r["kv_gb"] for r in s["rows"]], bottom=[r["weights_gb"] for r in s["rows"]], label="KV (Q95)")
        ax.axhline(s["usable_hbm_gb"], color="#b33", ls="--", lw=1, label="usable HBM")
        ax.set_title(f"{s['cluster']} x {s['catalog']}", fontsize=9)
        ax.set_xlabel("warm models K")
    axes[0].set_ylabel("GB")
    axes[0].legend(fontsize=7)
    return H.png_uri(fig)
