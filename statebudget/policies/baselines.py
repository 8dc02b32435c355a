"""The baselines users run today (DESIGN.md §6), each a few decisions on top of `Policy`."""

from __future__ import annotations

import math
from collections import Counter

from ..models.state import expert_key, kv_key, weights_key
from ..core.costs import touched_pages
from .base import NEVER, Policy, default_place
from ..core.decisions import Demote, Promote


class OnDemand(Policy):
    """Load on use, evict least recently used, evicted state is dropped (a cold engine start)."""
    name = "ondemand"


class LruKeepWarm(Policy):
    """Keep everything warm as long as HBM allows; evicted weights sleep in host DRAM (vLLM sleep
    level 1) and evicted KV is offloaded to host, so a restore is a wake, not a cold start."""
    name = "lru-keepwarm"
    demote_to = "host"


class Frequency(Policy):
    """Historical hotness: exponentially decayed call counts per model; every `tick_s` the hottest
    models not in HBM are prefetched where they would be placed, evicting only colder models."""
    name = "frequency"
    demote_to = "host"
    tick_s = 30.0

    def __init__(self, half_life_s: float = 600.0, top_k: int = 4):
        self.half_life_s, self.top_k = half_life_s, top_k
        self.score: dict[str, float] = {}
        self.t_score: dict[str, float] = {}

    def hotness(self, model: str, now: float) -> float:
        s = self.score.get(model, 0.0)
        return s * 0.5 ** ((now - self.t_score.get(model, now)) / self.half_life_s)

    def on_call_arrive(self, sim, call):
        self.score[call.model] = self.hotness(call.model, sim.now) + 1.0
        self.t_score[call.model] = sim.now

    def evict_priority(self, sim, copy):
        model = copy.key[2] if copy.key[0] == "kv" else copy.key[1]
        return (self.hotness(model, sim.now), copy.last_use)

    def may_evict_for_prefetch(self, sim, victim, key):
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
    000's full prefetch: "blindly prefetching every candidate fills PCIe, DRAM and the GPU"."""
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
    from the time-collapsed MILP, the static baseline; this one is kept for comparison in tests."""
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
            need = (m.dense_bytes + len(hot_page_ids(m)) * (m.moe.page_bytes if m.moe else 0)) / m.tp
            fits = [g for g in sim.groups(m.tp) if all(budget[i] >= need for i in g)]
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

    def may_evict_for_prefetch(self, sim, victim, key):
        return (victim.key, victim.group) not in self.pinned


def hot_page_ids(m) -> list[int]:
    """The pages of a MoE model that at least half of its calls touch (none for a dense model):
    what a static placement keeps resident and what prefetch-all brings with the weights."""
    return [p for p, _ in touched_pages(m, 0.5)]


class LlamaSwap(Policy):
    """llama-swap: each model has a fixed home GPU group (one process per model); models whose
    homes share a GPU form a swap group, and starting one stops the others (swap: true); a model
    idle for `ttl_s` is unloaded. A stopped process loses its weights (a cold start next time)."""
    name = "llama-swap"
    tick_s = 10.0

    def __init__(self, ttl_s: float = 300.0):
        self.ttl_s = ttl_s
        self.home: dict[str, tuple] = {}

    def _homes(self, sim):
        if self.home:
            return self.home
        load = [0.0] * len(sim.gpus)
        for m in sorted(sim.catalog.models, key=lambda m: (-m.total_bytes, m.name)):
            groups = sim.groups(m.tp)
            if not groups:
                continue
            # A process needs its whole model on its GPUs; the largest groups when nothing holds it.
            whole = [g for g in groups if all(m.total_bytes / m.tp <= sim.tiers.hbm_cap[i] for i in g)]
            biggest = max(min(sim.tiers.hbm_cap[i] for i in g) for g in groups)
            roomy = whole or [g for g in groups if min(sim.tiers.hbm_cap[i] for i in g) == biggest]
            g = min(roomy, key=lambda g: (max(load[i] for i in g), g))
            for i in g:
                load[i] += m.total_bytes / m.tp
            self.home[m.name] = g
        return self.home

    def place(self, sim, call):
        return home_or_default(sim, call, self._homes(sim).get(call.model))

    def on_call_arrive(self, sim, call):
        home = set(self._homes(sim).get(call.model, ()))
        out = []
        for (k, g), copy in sorted(sim.tiers.gpu.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            model = k[2] if k[0] == "kv" else k[1]
            if model != call.model and home.intersection(g) and k[0] != "kv":
                out.append(Demote(k, g, "none"))
        return out

    def on_tick(self, sim):
        out = []
        for (k, g), copy in sorted(sim.tiers.gpu.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            if k[0] == "kv":
                continue
            if sim.now - sim.last_use.get(k[1], -math.inf) > self.ttl_s and sim.running_models.get((k[1], g), 0) == 0:
                out.append(Demote(k, g, "none"))
        return out


class RayMultiplex(Policy):
    """Ray Serve model multiplexing: each GPU group is a replica holding at most `cap` models;
    requests go to a replica that has the model, else to the least loaded one, which unloads its
    least recently used model when full. Unloaded models are dropped."""
    name = "ray-multiplex"

    def __init__(self, cap: int = 3):
        self.cap = cap

    def place(self, sim, call):
        m = sim.catalog.by_name[call.model]
        groups = sim.groups(m.tp)
        have = [c.group for c in sim.copies_of(call.model) if c.group in groups]
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


def home_or_default(sim, call, home):
    """A policy's home group for the call's model if the call fits it at all, else the default."""
    if home is not None and sim.could_ever_fit(call, home):
        return home
    return default_place(sim, call)


def place_model(sim, model: str, program: str | None = None):
    """Where a prefetch of `model` should go: a group already holding the program's KV for it, else
    one already holding the model's weights (the most recently used), else the group with the
    most free HBM among those its dense weights fit."""
    m = sim.catalog.by_name[model]
    groups = sim.groups(m.tp)
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


BASELINES = {p.name: p for p in (OnDemand, LruKeepWarm, Frequency, PrefetchAll, Static, LlamaSwap, RayMultiplex)}
