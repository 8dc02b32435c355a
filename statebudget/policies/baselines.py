"""The baselines users run today (DESIGN.md §6), each a few decisions on top of `Policy`. Each
docstring names the tool or paper it follows and where it departs. `llama-swap`, `sleep-swap` and
`forecast-prewarm` live in `swaps.py`."""

from __future__ import annotations

from collections import Counter

from ..models.state import expert_key, kv_key, weights_key
from ..core.costs import touched_pages
from .base import NEVER, Policy, default_place, saved_rates
from ..core.decisions import Demote, Promote


class OnDemand(Policy):
    """Load on use, evict least recently used, evicted state is dropped (a cold engine start).

    Follows Ollama's scheduler with `keep_alive: -1` (load a model when a request needs it, unload
    the least recently used one when GPU memory is short) and any plain "one engine per model,
    restart on demand" setup. Departs: eviction is per state object (weights, KV, expert pages),
    not whole runners, and there is no keep-alive timer (Ollama's default unloads after 5 min)."""
    name = "ondemand"


class LruKeepWarm(Policy):
    """Keep everything warm as long as HBM allows; evicted weights sleep in host DRAM (vLLM sleep
    level 1) and evicted KV is offloaded to host, so a restore is a wake, not a cold start.

    Follows vLLM's sleep mode (`--enable-sleep-mode`, `/sleep?level=1`, `/wake_up`) with an
    LMCache-style CPU KV tier, driven by LRU under memory pressure. Departs: no real tool decides
    when to sleep an engine; here the mechanism does it whenever HBM is short, per object."""
    name = "lru-keepwarm"
    demote_to = "host"


class Frequency(Policy):
    """Historical hotness: exponentially decayed call counts per model; every `tick_s` the hottest
    models not in HBM are prefetched where they would be placed, evicting only colder models.

    Follows popularity-driven pre-loading in serverless platforms (Shahrad et al., "Serverless in
    the Wild", ATC'20, pre-warming by invocation history) and LFU-with-aging caches. Departs: a
    decayed count (`half_life_s`) instead of inter-arrival histograms, and at most `top_k`
    prefetches per tick; evicted state sleeps in host DRAM."""
    name = "frequency"
    demote_to = "host"
    tick_s = 30.0

    def __init__(self, half_life_s: float = 600.0, top_k: int = 4):
        self.half_life_s, self.top_k = half_life_s, top_k
        self.score: dict[str, float] = {}
        self.t_score: dict[str, float] = {}

    def learnt(self, now: float) -> dict:
        return {"policy": self.name, "hotness": {m: self.hotness(m, now) for m in sorted(self.score)}}

    def take_up(self, state: dict, now: float) -> None:
        """The decayed counts, as they were when saved (not decayed over the time it was down)."""
        self.score = saved_rates(self, state, "hotness")
        self.t_score = dict.fromkeys(self.score, now)

    def hotness(self, model: str, now: float) -> float:
        s = self.score.get(model, 0.0)
        return s * 0.5 ** ((now - self.t_score.get(model, now)) / self.half_life_s)

    def on_call_arrive(self, sim, call):
        self.score[call.model] = self.hotness(call.model, sim.now) + 1.0
        self.t_score[call.model] = sim.now

    def evict_priority(self, sim, copy):
        model = copy.key[2] if copy.key[0] == "kv" else copy.key[1]
        return (self.hotness(model, sim.now), copy.last_use)

    def may_evict_for_prefetch(self, sim, victim, key, group):
        v = victim.key[2] if victim.key[0] == "kv" else victim.key[1]
        return self.hotness(v, sim.now) < self.hotness(key[1], sim.now)

    def on_tick(self, sim):
        hot = sorted(((self.hotness(m, sim.now), m) for m in self.score), reverse=True)[: self.top_k]
        out = []
        for h, model in hot:
            if h <= 0.05 or sim.copies_of(model):
                continue
            group = place_model(sim, model)
            if group is not None:
                out.append(Promote(weights_key(model), group))
        return out


class PrefetchAll(Policy):
    """Every hinted candidate is promoted as soon as it is announced, whole: its weights, the
    program's KV for that model and, for a MoE model, the expert pages most of its calls touch
    (`hot_page_ids`, as a static placement keeps them), evicting least recently used state. Seed
    000's full prefetch: "blindly prefetching every candidate fills PCIe, DRAM and the GPU".

    Follows the naive speculative prefetch agent runtimes could do with their own plans (no
    shipping tool does it); it is the upper end of hint use. Departs from any budgeted prefetcher
    on purpose: no confidence threshold, no link or HBM budget."""
    name = "prefetch-all"
    demote_to = "host"

    def on_hint(self, sim, program, hint):
        if hint.model not in sim.catalog.by_name:
            return None
        group = place_model(sim, hint.model, program=program.program)
        if group is None:
            return None
        out = [Promote(weights_key(hint.model), group)]
        kvk = kv_key(program.program, hint.model)
        if sim.kv_tokens.get(kvk, 0) > 0:
            out.append(Promote(kvk, group))
        m = sim.catalog.by_name[hint.model]
        out += [Promote(expert_key(m.name, p), group) for p in hot_page_ids(m)]
        return out


class Static(Policy):
    """One placement for the whole trace, by call share, loaded at time 0 and never changed.
    Models left out run on demand in the HBM the placement leaves free. Named `static-share`
    but not registered: `static` (`policies/oracle.py`) is the same policy with its placement
    from the time-collapsed MILP, the static baseline; this one is kept for comparison in tests.

    Follows static multi-model placement by load share (AlpaServe, OSDI'23, places models by
    expected load once per deployment). Departs: a greedy by call share over the whole trace (it
    reads the trace's call counts: offline knowledge), no model-parallel search, and a fixed
    `kv_headroom` per GPU."""
    name = "static-share"
    demote_to = "host"
    tick_s = 1e9  # one tick at t=0 loads the placement
    kv_headroom = 0.25  # fraction of each GPU kept for KV and on-demand models

    def __init__(self):
        self.home: dict[str, tuple] = {}
        self.pinned: set = set()
        self._loaded = False

    def plan(self, sim) -> dict[str, tuple]:
        shares = Counter(n.model for p in sim.trace.programs for n in p.nodes if n.kind == "call")
        budget = [cap * (1 - self.kv_headroom) for cap in sim.tiers.hbm_cap]
        home = {}
        for model, _ in sorted(shares.items(), key=lambda kv: (-kv[1], kv[0])):
            m = sim.catalog.by_name[model]
            need = hot_bytes(m) / m.tp
            fits = [g for g in sim.model_groups(m) if all(budget[i] >= need for i in g)]
            if not fits:
                continue
            g = max(fits, key=lambda g: (min(budget[i] for i in g), [-i for i in g]))
            for i in g:
                budget[i] -= need
            home[model] = g
        return home

    def on_tick(self, sim):
        if self._loaded:
            return None
        self._loaded = True
        self.home = self.plan(sim)
        out = []
        for model, g in self.home.items():
            m = sim.catalog.by_name[model]
            keys = [weights_key(model)] + [expert_key(model, p) for p in hot_page_ids(m)]
            for k in keys:
                self.pinned.add((k, g))
                out.append(Promote(k, g))
        return out

    def place(self, sim, call):
        return home_or_default(sim, call, self.home.get(call.model))

    def evict_priority(self, sim, copy):
        return NEVER if (copy.key, copy.group) in self.pinned else copy.last_use

    def may_evict_for_prefetch(self, sim, victim, key, group):
        return (victim.key, victim.group) not in self.pinned


def hot_page_ids(m) -> list[int]:
    """The pages of a MoE model that at least half of its calls touch (none for a dense model):
    what a static placement keeps resident and what prefetch-all brings with the weights."""
    return [p for p, _ in touched_pages(m, 0.5)]


def hot_bytes(m) -> float:
    """A model's dense weights and its `hot_page_ids` pages: what a static placement keeps
    resident for it, over all its GPUs."""
    return m.dense_bytes + len(hot_page_ids(m)) * (m.moe.page_bytes if m.moe else 0.0)


class RayMultiplex(Policy):
    """Ray Serve model multiplexing: each GPU group is a replica holding at most `cap` models;
    requests go to a replica that has the model, else to the least loaded one, which unloads its
    least recently used model when full. Unloaded models are dropped.

    Follows Ray Serve's `@serve.multiplexed(max_num_models_per_replica=cap)` with its router's
    preference for replicas that already hold the requested model id. Departs: a replica is a GPU
    group of the model's width (Ray's replicas are fixed deployments), "no replica has it" goes
    to the group whose state would be ready soonest (`default_place`), and the cap counts
    weights copies on a group whatever the model. A replica that could never hold the call (the
    weights with its context and `max_tokens`) is no candidate, as an operator sends long
    contexts to replicas that can serve them: otherwise such calls, and the rest of their
    programs, are dropped, and the latencies left look better for it."""
    name = "ray-multiplex"

    def __init__(self, cap: int = 3):
        self.cap = cap

    def place(self, sim, call):
        m = sim.catalog.by_name[call.model]
        groups = sim.model_groups(m)
        have = [c.group for c in sim.copies_of(call.model) if c.group in groups and sim.could_ever_fit(call, c.group)]
        if have:
            return min(have, key=lambda g: (sum(sim.running_on[i] for i in g), g))
        return default_place(sim, call)

    def on_call_arrive(self, sim, call):
        """Ray's cap applies when a replica loads a model: unload its least recently used idle models."""
        group = self.place(sim, call)
        if group is None:
            return None
        models = {k[1]: c for (k, g), c in sim.tiers.gpu.items() if k[0] == "w" and g == group}
        if call.model in models or len(models) < self.cap:
            return None
        idle = sorted((c.last_use, name) for name, c in models.items()
                      if sim.running_models.get((name, group), 0) == 0 and c.pins == 0)
        out = []
        for _, name in idle[: len(models) - self.cap + 1]:
            out.append(Demote(weights_key(name), group, "none"))
            m = sim.catalog.by_name[name]
            if m.moe:
                out += [Demote(expert_key(name, p), group, "none") for p in range(m.moe.pages)]
        return out

    def on_call_refused(self, sim, call):
        """Routed again: the cap applies on the replica it goes to next (`place` skips refusers)."""
        return self.on_call_arrive(sim, call)


def home_or_default(sim, call, home):
    """A policy's home group for the call's model if the call could fit it (`could_ever_fit`: by
    the median page count, and not a group that refused it), else the default."""
    if home is not None and sim.could_ever_fit(call, home):
        return home
    return default_place(sim, call)


def place_model(sim, model: str, program: str | None = None):
    """Where a prefetch of `model` should go: a group already holding the program's KV for it, else
    one already holding the model's weights (the most recently used), else the group with the
    most free HBM among those its dense weights fit."""
    m = sim.catalog.by_name[model]
    groups = sim.model_groups(m)
    if program is not None:
        kvk = kv_key(program, model)
        for g in groups:
            if (kvk, g) in sim.tiers.gpu:
                return g
    have = [c for c in sim.copies_of(model) if c.group in groups]
    if have:
        return max(have, key=lambda c: (c.last_use, [-i for i in c.group])).group
    fits = [g for g in groups if all(m.dense_bytes / m.tp <= sim.tiers.hbm_cap[i] for i in g)]
    if not fits:
        return None
    return max(fits, key=lambda g: (min(sim.tiers.gpu_free(i) for i in g), [-i for i in g]))


BASELINES = {p.name: p for p in (OnDemand, LruKeepWarm, Frequency, PrefetchAll, Static, RayMultiplex)}
"""This module's baselines; `policies/__init__.py` adds `swaps.SWAPS` (llama-swap, sleep-swap,
forecast-prewarm), so after `import statebudget.policies` it holds every baseline."""
