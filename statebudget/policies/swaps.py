"""Baselines that swap whole engines the way operators configure them today (DESIGN.md §6):
`llama-swap` (homes and swap groups, stopped engines), `sleep-swap` (the same groups, swapped-out
engines sleep, vLLM sleep level 1) and `forecast-prewarm` (WarmServe-style rate forecast)."""

from __future__ import annotations

import math
from collections import Counter

from ..core.decisions import Demote, Promote, PromoteHost
from ..models.state import expert_key, weights_key
from .base import Policy, saved_rates
from .baselines import home_or_default, hot_bytes, hot_page_ids


def _model_of(key) -> str:
    return key[2] if key[0] == "kv" else key[1]


def resident_bytes(sim, m, budget: list[float]) -> float:
    """Bytes a model's engine keeps in HBM, as an operator sizes it: the whole model when it fits
    some group of its width within `budget`, else (a MoE model whose experts are paged) its dense
    weights and the expert pages most of its calls touch."""
    groups = sim.model_groups(m)
    if groups and m.total_bytes / m.tp <= max(min(budget[i] for i in g) for g in groups):
        return m.total_bytes
    return hot_bytes(m)


def plan_homes(sim, kv_headroom: float = 0.1):
    """The homes a careful operator writes into a llama-swap config, and the swap groups they imply.

    Each GPU gets a budget: its usable HBM less `kv_headroom` of it (the KV cache the engines
    need). Models are placed biggest first (`resident_bytes`, then name), each on a group of its
    width where its bytes per GPU plus the engine overhead fit: first a group no home touches yet
    (the one with the biggest GPUs: big models on big GPUs; ties to the lower index), else a group
    where it fits next to the homes already there (the most room left after it), and only when
    nothing fits, a group whose homes it will swap with (the one displacing the smallest homes,
    then the fewest bytes). Returns (home: model -> group, swaps: model -> models it swaps with);
    models sharing a GPU without a swap entry fit there together."""
    cap = sim.tiers.hbm_cap
    over = sim.tiers.engine_overhead
    budget = [c * (1.0 - kv_headroom) for c in cap]
    free = list(budget)
    on: list[list[str]] = [[] for _ in cap]
    size: dict[str, float] = {}
    home: dict[str, tuple] = {}
    swaps: dict[str, set] = {}
    models = sorted(sim.catalog.models, key=lambda m: (-resident_bytes(sim, m, budget), m.name))
    for m in models:
        groups = sim.model_groups(m)
        if not groups:
            continue
        size[m.name] = rb = resident_bytes(sim, m, budget)
        need = {i: rb / m.tp + over[i] for g in groups for i in g}
        fit = [g for g in groups if all(free[i] >= need[i] for i in g)]
        empty = [g for g in fit if not any(on[i] for i in g)]
        if empty:
            g = max(empty, key=lambda g: (min(budget[i] for i in g), [-i for i in g]))
        elif fit:
            g = max(fit, key=lambda g: (min(free[i] - need[i] for i in g), [-i for i in g]))
        else:  # nothing holds it next to the homes already placed: it swaps with the smallest ones
            alone = [g for g in groups if all(budget[i] >= need[i] for i in g)] or groups
            g = min(alone, key=lambda g: (max((size[x] for i in g for x in on[i]), default=0.0),
                                          sum(budget[i] - free[i] for i in g), g))
            rivals = {x for i in g for x in on[i]}
            swaps.setdefault(m.name, set()).update(rivals)
            for x in rivals:
                swaps.setdefault(x, set()).add(m.name)
        for i in g:
            free[i] -= need[i]
            on[i].append(m.name)
        home[m.name] = g
    return home, swaps


class LlamaSwap(Policy):
    """llama-swap (github.com/mostlygeek/llama-swap) with a config that fits. Each model is one
    engine process with a fixed home GPU group (`plan_homes`: models sharing a GPU fit together in
    its usable HBM, less `kv_headroom`, wherever the cluster allows); models whose homes had to
    overlap form a swap group (`groups: {swap: true}`): a request for one stops the others there
    (`Demote(..., "none")`: a stopped process loses its weights, its KV and its expert pages, so
    the next use is a cold start). `ttl_s`: unload a model idle that long; llama-swap's default
    `ttl: 0` never unloads, and so does `math.inf` here.

    Departs from the tool: the homes are computed from the catalog rather than written by hand; a
    swap stops a rival only once it has no running call (the mechanism declines a demote of pinned
    state, so the call waits for room, as llama-swap waits for in-flight requests); a call that
    could never fit its home (a long context) runs where the default placement puts it, and
    llama-swap would refuse it; state evicted for room (KV, cold expert pages) goes by LRU."""
    name = "llama-swap"
    swap_to = "none"  # what a swap does to the rival engine: stop it

    def __init__(self, ttl_s: float = math.inf, kv_headroom: float = 0.1, tick_s: float = 10.0):
        self.ttl_s, self.kv_headroom = ttl_s, kv_headroom
        self.tick_s = tick_s if math.isfinite(ttl_s) else None
        self.home: dict[str, tuple] = {}
        self.swaps: dict[str, set] = {}
        self.active: dict[str, float] = {}  # model -> last request arrival or end
        self._planned = False

    def _homes(self, sim):
        if not self._planned:
            self.home, self.swaps = plan_homes(sim, self.kv_headroom)
            self._planned = True
        return self.home

    def place(self, sim, call):
        return home_or_default(sim, call, self._homes(sim).get(call.model))

    def _unload(self, sim, model: str, group) -> list:
        """Decisions that stop (llama-swap) or put to sleep (sleep-swap) `model`'s engine on `group`:
        its weights, its expert pages and the KV it holds there."""
        out = []
        for (k, g) in sorted(sim.tiers.gpu):
            if g == group and _model_of(k) == model:
                out.append(Demote(k, g, self.swap_to))
        return out

    def on_call_arrive(self, sim, call):
        self.active[call.model] = sim.now
        home = self._homes(sim).get(call.model)
        if home is None or not sim.could_ever_fit(call, home):
            return None
        rivals = self.swaps.get(call.model, set())
        gpus = set(home)
        out = []
        for model, g in sorted({(_model_of(k), g) for (k, g) in sim.tiers.gpu if gpus.intersection(g)}):
            if model == call.model:
                continue
            # a swap-group rival, or an engine llama-swap would not run here (placed off its home)
            if model in rivals or self.home.get(model) != g:
                out += self._unload(sim, model, g)
        return out

    def on_call_end(self, sim, call):
        self.active[call.model] = sim.now
        return None

    def on_tick(self, sim):
        if not math.isfinite(self.ttl_s):
            return None
        out = []
        for model, g in sorted({(k[1], g) for (k, g) in sim.tiers.gpu if k[0] == "w"}):
            if sim.now - self.active.get(model, -math.inf) > self.ttl_s and sim.running_models.get((model, g), 0) == 0:
                out += self._unload(sim, model, g)
        return out


class SleepSwap(LlamaSwap):
    """llama-swap with vLLM sleep mode level 1, as careful operators run it today (engines started
    with `--enable-sleep-mode`; a swap calls `POST /sleep?level=1` on the rival and
    `POST /wake_up` on the model asked for): the same homes and swap groups as `llama-swap`, but a
    swapped-out engine sleeps on its group (`Demote(weights, group, "host")`: its weights go to
    that node's DRAM, pinned for it) and wakes in an H2D copy + `wake_s` when its home is used
    again. Its KV and expert pages, and anything evicted for room, go to host DRAM too
    (`demote_to = "host"`). `ttl_s` (default never) puts an idle engine to sleep.

    Departs from the tools: vLLM level 1 discards the KV cache, here it is offloaded to host as an
    LMCache-style CPU tier would; the mechanism may stop an asleep engine when the GPU needs its
    overhead (DESIGN.md §3), and its host copy then serves a cold start."""
    name = "sleep-swap"
    swap_to = "host"
    demote_to = "host"


class ForecastPrewarm(Policy):
    """WarmServe-style prewarming for multi-LLM serving: a per-model request-rate forecast (an EWMA,
    weight `alpha`, of arrivals per `tick_s` window) and, every tick, the models with the highest
    forecast (above `min_rate` calls/s) that no GPU holds are promoted into HBM on the group
    `place_model` would give (the most free HBM among those that hold their weights, counting what
    this tick already promotes), evicting only state of models with a lower forecast that no call
    is running; evicted engines sleep and evicted KV goes to host DRAM (`demote_to = "host"`).
    With `stage_host`, the forecast models that found no HBM are staged in the DRAM of that node.
    No hints: it never overrides `on_hint`/`on_hints`.

    Departs from WarmServe: an EWMA stands in for its workload predictor, there is no
    GPU-sharing/partitioning of prewarmed engines, and a staged host copy is a cache (a cold start),
    not an asleep engine: the decisions cannot start an engine asleep."""
    name = "forecast-prewarm"
    demote_to = "host"

    def __init__(self, tick_s: float = 10.0, alpha: float = 0.5, min_rate: float = 1e-3, stage_host: bool = True):
        self.tick_s, self.alpha, self.min_rate, self.stage_host = tick_s, alpha, min_rate, stage_host
        self.rate: dict[str, float] = {}
        self.count: Counter = Counter()

    def learnt(self, now: float) -> dict:
        return {"policy": self.name, "rate": dict(sorted(self.rate.items()))}

    def take_up(self, state: dict, now: float) -> None:
        self.rate = saved_rates(self, state, "rate")

    def forecast(self, model: str) -> float:
        return self.rate.get(model, 0.0)

    def on_call_arrive(self, sim, call):
        self.count[call.model] += 1
        return None

    def evict_priority(self, sim, copy):
        return (self.forecast(_model_of(copy.key)), copy.last_use)

    def may_evict_for_prefetch(self, sim, victim, key, group):
        v, m = _model_of(victim.key), _model_of(key)
        return v != m and self.forecast(v) < self.forecast(m) and sim.running_models.get((v, victim.group), 0) == 0

    def _group(self, sim, m, planned):
        """`place_model`'s group for a model no GPU holds, less the bytes this tick already promotes."""
        fits = [g for g in sim.model_groups(m) if all(m.dense_bytes / m.tp <= sim.tiers.hbm_cap[i] for i in g)]
        if not fits:
            return None
        return max(fits, key=lambda g: (min(sim.tiers.gpu_free(i) - planned[i] for i in g), [-i for i in g]))

    def on_tick(self, sim):
        for model in set(self.rate) | set(self.count):
            self.rate[model] = self.alpha * self.count[model] / self.tick_s + (1 - self.alpha) * self.rate.get(model, 0.0)
        self.count.clear()
        ranked = sorted((-r, name) for name, r in self.rate.items() if r > self.min_rate and name in sim.catalog.by_name)
        planned = [0.0] * len(sim.tiers.hbm_cap)
        out = []
        for _, model in ranked:
            if sim.copies_of(model):
                continue
            m = sim.catalog.by_name[model]
            g = self._group(sim, m, planned)
            if g is None:
                continue
            pages = hot_page_ids(m)
            per_gpu = (m.dense_bytes + len(pages) * (m.moe.page_bytes if m.moe else 0.0)) / m.tp \
                + sim.tiers.engine_need(weights_key(model), g)
            if min(sim.tiers.gpu_free(i) - planned[i] for i in g) < per_gpu and not self._evictable(sim, model, g, per_gpu):
                if self.stage_host:
                    node = sim.gpus[g[0]].node
                    if (weights_key(model), node) not in sim.tiers.host:
                        out.append(PromoteHost(weights_key(model), node))
                continue
            for i in g:
                planned[i] += per_gpu
            out.append(Promote(weights_key(model), g))
            out += [Promote(expert_key(model, p), g) for p in pages]
        return out

    def _evictable(self, sim, model, group, per_gpu) -> bool:
        """Whether evicting lower-forecast, idle state would make room for `model` on `group`."""
        key = weights_key(model)
        return sim.plan_eviction(group, per_gpu, protect={(key, group)},
                                 allow=lambda v: self.may_evict_for_prefetch(sim, v, key, group)) is not None


SWAPS = {p.name: p for p in (LlamaSwap, SleepSwap, ForecastPrewarm)}
