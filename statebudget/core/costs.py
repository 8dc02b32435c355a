"""The one cost model (DESIGN.md §3). The simulator, the policies and the planner all price
transfers, restores and compute here; nothing else divides bytes by bandwidth.

Links and paths (each link shared fairly by the transfers on it):

    nvme:<n> ──nvme_r:<n>──▶ host:<n> ──root:<n>──h2d:<gpu>──▶ gpu:<gpu>
    nvme:<n> ◀─nvme_w:<n>─── host:<n> ◀─root:<n>──d2h:<gpu>─── gpu:<gpu>

nvme→gpu streams through host at the rate of the slowest link on the path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..models.catalog import Catalog, ModelSpec
from ..models.cluster import GB, Cluster
from ..models.state import expert_key

# Fixed per-transfer latency by source tier (DMA set-up, file open); small against GB transfers.
LATENCY_S = {"gpu": 20e-6, "host": 20e-6, "nvme": 200e-6}
# A call touches MoE page i with probability min(1, PAGE_TOUCH x pages x popularity_i): the
# hottest pages almost always, the tail now and then.
PAGE_TOUCH = 0.4


def page_touch_probs(moe) -> np.ndarray:
    """Per page of a MoE model: the probability that one call needs it resident."""
    return np.minimum(1.0, PAGE_TOUCH * moe.pages * moe.page_popularity)


def page_count_cdf(moe) -> np.ndarray:
    """[P(a call touches at most n pages of a MoE model) for n = 0 .. pages]: each page touched
    independently by `page_touch_probs` (a Poisson binomial). What a runtime knows of a call's
    page count before its router runs."""
    pmf = np.ones(1)
    for p in page_touch_probs(moe):
        pmf = np.append(pmf * (1.0 - p), 0.0) + np.append(0.0, pmf * p)
    return np.cumsum(pmf)


def median_page_count(m) -> int:
    """The median of how many pages a call of model `m` touches (`page_count_cdf`; 0 for a dense
    model): a call touches at most this many more likely than not."""
    return int(np.searchsorted(page_count_cdf(m.moe), 0.5)) if m.moe else 0


def expected_missing_pages(m, group, gpu_copies) -> float:
    """Pages of model `m` a call is expected to find missing on `group`: the touch probabilities
    of those with no copy there (`gpu_copies`: keyed by (state key, group)). What a policy can
    count on before the call runs, its router choosing its experts as its tokens run."""
    if m.moe is None:
        return 0.0
    return float(sum(t for p, t in enumerate(page_touch_probs(m.moe))
                     if (expert_key(m.name, p), group) not in gpu_copies))


def touched_pages(m, min_touch: float) -> list[tuple[int, float]]:
    """The expert pages of model `m` that at least `min_touch` of its calls touch, with that
    probability, most popular first (none for a dense model)."""
    if m.moe is None:
        return []
    return [(int(i), float(t)) for i, t in enumerate(page_touch_probs(m.moe)) if t >= min_touch]


@dataclass
class CostModel:
    cluster: Cluster
    catalog: Catalog
    mfu: float = 0.5  # fraction of peak FLOP/s prefill reaches
    profile: dict | None = None  # measured overrides: {"links": {name: bytes/s}, "prefill_tok_s": {...}}
    link_bw: dict[str, float] = field(init=False)
    _restore_memo: dict = field(init=False, default_factory=dict, repr=False)
    _flops_memo: dict = field(init=False, default_factory=dict, repr=False)
    _hbm_memo: dict = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self):
        bw: dict[str, float] = {}
        for n in self.cluster.nodes:
            bw[f"nvme_r:{n.name}"] = n.nvme_read_gbps * GB
            bw[f"nvme_w:{n.name}"] = n.nvme_write_gbps * GB
            bw[f"root:{n.name}"] = n.root_gbps * GB
        for g in self.cluster.gpus:
            k = self.cluster.gpu_kinds[g.kind]
            bw[f"h2d:{g.id}"] = k.h2d_gbps * GB
            bw[f"d2h:{g.id}"] = k.d2h_gbps * GB
        if self.profile:
            bw.update({k: float(v) for k, v in self.profile.get("links", {}).items() if k in bw})
        self.link_bw = bw
        self._gpu = self.cluster.gpus

    # ---- paths and transfers ----------------------------------------------------------------
    def path(self, src: str, dst: str) -> tuple[str, ...]:
        """Links crossed from tier `src` to tier `dst` (`gpu:<idx>`, `host:<node>`, `nvme:<node>`)."""
        sk, sv = src.split(":", 1)
        dk, dv = dst.split(":", 1)
        if sk == "gpu":
            g = self._gpu[int(sv)]
            up = (f"d2h:{g.id}", f"root:{g.node}")
            if dk == "host":
                return up
            if dk == "nvme":
                return up + (f"nvme_w:{g.node}",)
            g2 = self._gpu[int(dv)]
            return up + (f"root:{g2.node}", f"h2d:{g2.id}") if g2.node != g.node else up + (f"h2d:{g2.id}",)
        if dk == "gpu":
            g = self._gpu[int(dv)]
            down = (f"root:{g.node}", f"h2d:{g.id}")
            return (f"nvme_r:{sv}",) + down if sk == "nvme" else down
        if sk == "nvme" and dk == "host":
            return (f"nvme_r:{sv}",)
        if sk == "host" and dk == "nvme":
            return (f"nvme_w:{sv}",)
        raise ValueError(f"no path from {src} to {dst}")

    def latency_s(self, src: str) -> float:
        return LATENCY_S[src.split(":", 1)[0]]

    def transfer_s(self, nbytes: float, src: str, dst: str) -> float:
        """Uncontended transfer time: bytes over the slowest link on the path, plus latency."""
        if nbytes <= 0:
            return 0.0
        return nbytes / min(self.link_bw[l] for l in self.path(src, dst)) + self.latency_s(src)

    def group_transfer_s(self, nbytes: float, src_kind: str, src_node: str, group: tuple[int, ...]) -> float:
        """Bytes split evenly over a tensor-parallel group, each GPU's share in parallel; the
        group's GPUs share their node's root complex (and NVMe when reading from disk)."""
        if nbytes <= 0:
            return 0.0
        k = len(group)
        g0 = self._gpu[group[0]]
        per_gpu_rate = min(self.link_bw[f"h2d:{self._gpu[i].id}"] for i in group)
        rate = min(per_gpu_rate * k, self.link_bw[f"root:{g0.node}"])
        if src_kind == "nvme":
            rate = min(rate, self.link_bw[f"nvme_r:{src_node}"])
        return nbytes / rate + LATENCY_S[src_kind]

    # ---- engine reconfiguration and compute --------------------------------------------------
    def gpu_kind(self, gpu_index: int):
        return self.cluster.gpu_kinds[self._gpu[gpu_index].kind]

    def reconfig_s(self, group: tuple[int, ...], src_kind: str, wake: bool = False) -> float:
        """Engine time on top of the weight copy (DESIGN.md §3): `wake_s` for an asleep engine
        waking on its own group from its host copy (`wake`), else `cold_start_s` for a new engine,
        whether its weights come from a host cache or from NVMe."""
        if src_kind == "gpu":
            return 0.0
        kinds = [self.gpu_kind(i) for i in group]
        return max(k.wake_s if wake and src_kind == "host" else k.cold_start_s for k in kinds)

    def prefill_s(self, model: ModelSpec, tokens, group):
        """Prefill of `tokens`. Numbers or arrays (the same arithmetic per element); with an array,
        `group` may be a list of groups, one per element (calls waiting on several groups)."""
        array = isinstance(tokens, np.ndarray)
        if not array and tokens <= 0:
            return 0.0
        if self.profile and model.name in self.profile.get("prefill_tok_s", {}):
            s = tokens / self.profile["prefill_tok_s"][model.name]
        else:
            flops = np.array([self._flops(g) for g in group]) if isinstance(group, list) else self._flops(group)
            s = tokens * 2 * model.active_params_b * 1e9 / flops
        return np.where(tokens > 0, s, 0.0) if array else s

    def _flops(self, group: tuple[int, ...]) -> float:
        """The group's prefill FLOP/s (fixed; asked for every KV candidate and call)."""
        key = (group, self.mfu)
        flops = self._flops_memo.get(key)
        if flops is None:
            flops = self._flops_memo[key] = min(self.gpu_kind(i).tflops for i in group) * 1e12 * self.mfu * len(group)
        return flops

    def active_bytes(self, model: ModelSpec) -> float:
        """Weight bytes one decode step reads (dense part + the active experts)."""
        if model.moe:
            return model.dense_bytes + model.moe.active * model.moe.layers * model.moe.expert_gb * GB
        return model.dense_bytes

    def _hbm_bps(self, group: tuple[int, ...]) -> float:
        """The group's HBM bandwidth in bytes/s, its slowest GPU's times its size (fixed; asked for
        every call's expected end at every placement and planning step)."""
        bps = self._hbm_memo.get(group)
        if bps is None:
            bps = self._hbm_memo[group] = min(self.gpu_kind(i).hbm_gbps for i in group) * GB * len(group)
        return bps

    def decode_s(self, model: ModelSpec, output_tokens, kv_tokens, group):
        """Roofline decode: each step reads the active weights and the KV once, split over the group.
        Numbers or arrays (the same arithmetic per element); `group` as in `prefill_s`."""
        array = isinstance(output_tokens, np.ndarray)
        if not array and output_tokens <= 0:
            return 0.0
        hbm = np.array([self._hbm_bps(g) for g in group]) if isinstance(group, list) else self._hbm_bps(group)
        mean_kv = (kv_tokens + output_tokens / 2) * model.kv_bytes_per_token
        s = output_tokens * (self.active_bytes(model) + mean_kv) / hbm
        return np.where(output_tokens > 0, s, 0.0) if array else s

    def decode_step_s(self, model: ModelSpec, batch: int, kv_tokens: float, group: tuple[int, ...]) -> float:
        """One decode step of `batch` sequences of `kv_tokens` each, the roofline of `decode_s`:
        the active weights once, each sequence's KV once, split over the group."""
        hbm = self._hbm_bps(group)
        return (self.active_bytes(model) + batch * kv_tokens * model.kv_bytes_per_token) / hbm

    def hop_s(self, nbytes: float, src_gpu: int, dst_gpu: int, link: tuple[float, float] | None = None) -> float:
        """A GPU-to-GPU copy of `nbytes` (a hidden state between two halves of a model): over the
        cluster's PCIe path (`transfer_s`), or over a direct `link` (GB/s, latency s) that no
        cluster file describes (NVLink)."""
        if link is None:
            return self.transfer_s(nbytes, f"gpu:{src_gpu}", f"gpu:{dst_gpu}")
        return nbytes / (link[0] * GB) + link[1]

    def call_s(self, model: ModelSpec, context_tokens: float, output_tokens: float, group: tuple[int, ...]) -> float:
        """A call alone on `group`: prefill of its whole context, then its decode."""
        return self.prefill_s(model, context_tokens, group) + self.decode_s(model, output_tokens, context_tokens, group)

    def kv_restore(self, model: ModelSpec, tokens: float, src: str, group: tuple[int, ...]) -> tuple[str, float]:
        """Load-vs-recompute crossover for a program's KV: ('onboard', s) or ('recompute', s)."""
        recompute = self.prefill_s(model, tokens, group)
        if src == "none":
            return "recompute", recompute
        nbytes = tokens * model.kv_bytes_per_token
        kind, where = src.split(":", 1)
        if kind == "gpu":
            onboard = self.transfer_s(nbytes / len(group), src, f"gpu:{group[0]}")
        else:
            onboard = self.group_transfer_s(nbytes, kind, where, group)
        return ("onboard", onboard) if onboard <= recompute else ("recompute", recompute)

    def weights_restore_s(self, model: ModelSpec, src_kind: str, src_node: str, group: tuple[int, ...],
                          extra_bytes: float = 0.0, wake: bool = False) -> float:
        """Uncontended restore of a model's dense weights (plus `extra_bytes`, e.g. expert pages):
        the copy plus a wake (`wake`: an asleep engine on this group) or a cold start.
        Memoised: placement asks it for every candidate group of every call."""
        if src_kind == "gpu":
            return 0.0
        key = (model.name, src_kind, src_node, group, extra_bytes, wake)
        hit = self._restore_memo.get(key)
        if hit is None:
            hit = self._restore_memo[key] = self.group_transfer_s(model.dense_bytes + extra_bytes, src_kind, src_node,
                                                                  group) + self.reconfig_s(group, src_kind, wake)
        return hit
