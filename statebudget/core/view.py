"""The residency view that policies and the planner core read: the same methods over the same
books (`Tiers`), whether a simulator or the live planner service holds them.

A subclass provides `cluster`, `catalog`, `cost`, `gpus`, `tiers`, `kv_tokens` and `policy`;
this mixin answers where state would come from, how big it is, and what to evict for room.
"""

from __future__ import annotations

from ..models.catalog import ModelSpec
from ..models.state import expert_key, weights_key
from .books import Engine, HostCopy


class ResidencyView:
    _groups: dict

    def model_groups(self, model) -> list[tuple[int, ...]]:
        """The groups `model` (a ModelSpec) may run on (`Cluster.model_groups`; cached: asked on
        every placement)."""
        g = self._groups.get(model.name)
        if g is None:
            g = self._groups[model.name] = self.cluster.model_groups(model)
        return g

    def stock_model_store(self, preload: bool | str = True) -> None:
        """The model store: every model's weights and experts on every node's NVMe. `preload`
        says what host DRAM holds too (DESIGN.md §4 start): True or "cold", the cluster's
        `preload` models; "warm", every model (weights and expert pages together) on every node
        whose DRAM can hold it, in catalog order, skipping one that no longer fits there; False,
        nothing. Host copies are a page cache: no engine is awake."""
        if preload not in (True, False, "cold", "warm"):
            raise ValueError(f"stock_model_store: preload must be a bool, 'cold' or 'warm', got {preload!r}")
        warm = preload == "warm"
        for node in self.cluster.nodes:
            for m in self.catalog.models:
                objs = list(self.object_sizes(m))
                for key, nbytes in objs:
                    if not self.tiers.alloc_nvme(key, node.name, nbytes):
                        raise ValueError(f"node {node.name}: NVMe too small for the model store ({m.name})")
                if warm:
                    if sum(nb for _, nb in objs) > self.tiers.host_cap[node.name] - self.tiers.host_used[node.name]:
                        continue  # the model does not fit what is left of this node's DRAM
                elif not (preload and m.name in self.cluster.preload):
                    continue
                for key, nbytes in objs:
                    if self.tiers.alloc_host(node.name, nbytes):
                        self.tiers.host[(key, node.name)] = HostCopy(key, node.name, nbytes, True, 0.0)

    def object_sizes(self, m: ModelSpec):
        """The model store's objects of one model: its weights and its expert pages, with bytes."""
        yield weights_key(m.name), m.dense_bytes
        if m.moe:
            for p in range(m.moe.pages):
                yield expert_key(m.name, p), m.moe.page_bytes

    def size_of(self, key) -> float:
        if key[0] == "kv":
            return self.kv_tokens.get(key, 0) * self.catalog.by_name[key[2]].kv_bytes_per_token
        m = self.catalog.by_name[key[1]]
        return m.dense_bytes if key[0] == "w" else m.moe.page_bytes

    def best_source(self, key, group) -> str:
        """Where a state object would come from for `group`: `gpu:<i>`, `host:<node>`,
        `nvme:<node>` or `none` (KV that must be recomputed). Same-node copies only; KV prefers the
        cost model's choice between onboarding and recomputing."""
        node = self.gpus[group[0]].node
        hc = self.tiers.host.get((key, node))
        if key[0] != "kv":
            return f"host:{node}" if hc is not None and hc.ready else f"nvme:{node}"
        candidates = []
        for g in sorted(self.tiers.groups_of.get(key, ())):
            if g != group and self.tiers.gpu[(key, g)].ready and self.gpus[g[0]].node == node:
                candidates.append(f"gpu:{g[0]}")
        if hc is not None and hc.ready:
            candidates.append(f"host:{node}")
        if (key, node) in self.tiers.nvme:
            candidates.append(f"nvme:{node}")
        m = self.catalog.by_name[key[2]]
        T = self.kv_tokens.get(key, 0)
        best, best_s = "none", self.cost.prefill_s(m, T, group)
        for src in candidates:
            mode, s = self.cost.kv_restore(m, T, src, group)
            if mode == "onboard" and s < best_s:
                best, best_s = src, s
        return best

    def admission_queue(self) -> list[tuple[str, tuple[int, ...], float, float]]:
        """(model, group, expected run seconds, seconds waited) of each call waiting for HBM now: what tells the planner
        it is past capacity (`planner/overload.py`). None here: a view that knows its waiting
        calls reports them (the simulator's admission, the live planner's arrived calls)."""
        return []

    def copies_of(self, model: str) -> list:
        """The model's weights copies in HBM (ready or loading)."""
        key = weights_key(model)
        return [self.tiers.gpu[(key, g)] for g in sorted(self.tiers.groups_of.get(key, ()))]

    def plan_eviction(self, group, per_gpu: float, protect=frozenset(), allow=None, cancel=None) -> list | None:
        """The copies to evict, in the policy's order, so that `per_gpu` bytes fit on every GPU of
        `group`; None if pinned or loading copies leave too little room. `cancel(copy)`: which
        loads still in flight may go too (the simulator's speculative ones, `_cancel_rule`), before
        any ready copy: the room is the caller's, and their bytes are not usable yet. Asleep
        engines (`books.Engine`) on those GPUs go before any copy: evicting one stops it."""
        deficit = {i: self.tiers.hbm_used[i] + per_gpu - self.tiers.hbm_cap[i] for i in group}
        if all(d <= 1.0 for d in deficit.values()):
            return []
        cands, asleep = {}, {}
        for (k, g), e in self.tiers.engines.items():  # an asleep engine is the cheapest room: a wake becomes a cold start
            if e.host is not None and e.per_gpu and (k, g) not in protect and any(deficit.get(i, 0) > 1.0 for i in g) \
                    and (allow is None or allow(e)):
                asleep[(k, g)] = e
        for i in group:
            if deficit[i] > 1.0:
                for k, copy in self.tiers.on_gpu[i].items():
                    if copy.pins == 0 and k not in protect and (copy.ready or (cancel is not None and cancel(copy))) \
                            and (allow is None or allow(copy)):
                        cands[k] = copy
        if _short_whatever_goes(deficit, asleep.values(), cands.values(), self.tiers.engines):
            return None
        order = sorted(asleep.values(), key=lambda e: (e.last_use, e.key, e.group)) + \
            sorted(cands.values(), key=lambda cp: (cp.ready, self.policy.evict_priority(self, cp), cp.key, cp.group))
        victims = []
        for copy in order:
            if all(d <= 1.0 for d in deficit.values()):
                break
            if not any(deficit.get(i, 0) > 1.0 for i in copy.group):
                continue
            victims.append(copy)
            for i in copy.group:
                if i in deficit:
                    deficit[i] -= copy.per_gpu
        # Still short: the engines of evicted weights stop rather than sleep (their overhead too).
        for copy in list(victims):
            if all(d <= 1.0 for d in deficit.values()):
                break
            e = _stops_with(copy, self.tiers.engines)
            if e is not None and any(deficit.get(i, 0) > 1.0 for i in e.group):
                victims.append(e)
                for i in e.group:
                    if i in deficit:
                        deficit[i] -= e.per_gpu
        if not all(d <= 1.0 for d in deficit.values()):
            return None
        return _prune(victims, deficit, self.tiers.engines)


# Bytes by which `_short_whatever_goes` must find a GPU short before it answers for the exact pass:
# far above any rounding of sums of GB-sized floats taken in another order.
_SHORT_MARGIN = 1024.0


def _short_whatever_goes(deficit: dict, asleep, cands, engines: dict) -> bool:
    """Whether a GPU stays short of room even if every candidate went, with the awake engines of
    the weights among them: then `plan_eviction`, which takes some of them, finds no room in any
    order, and need not rank them (most placements ask of groups full of pinned state)."""
    left = dict(deficit)
    for unit in (asleep, cands):
        for v in unit:
            for i in v.group:
                if i in left:
                    left[i] -= v.per_gpu
    for v in cands:
        e = _stops_with(v, engines)
        if e is not None:
            for i in e.group:
                if i in left:
                    left[i] -= e.per_gpu
    return any(d > 1.0 + _SHORT_MARGIN for d in left.values())


def _stops_with(victim, engines: dict):
    """The awake engine that `plan_eviction` may stop with an evicted weights copy (its overhead
    freed too), else None. One rule for the exact pass and `_short_whatever_goes`: were the bound to
    free less than the pass may, it would answer 'no room' wrongly."""
    e = engines.get((victim.key, victim.group)) if victim.key[0] == "w" else None
    return e if e is not None and e.host is None and e.per_gpu else None


def _prune(victims: list, deficit: dict, engines: dict) -> list:
    """Drop the victims the room does not need, in the order they were chosen (asleep engines
    first): a greedy pick can stop an engine that a copy chosen later makes needless. A weights
    copy is kept or dropped together with its engine when that engine was to stop too."""
    chosen = {id(v) for v in victims}
    for v in victims:
        if id(v) not in chosen:
            continue
        unit = [v]
        if not isinstance(v, Engine) and v.key[0] == "w":
            e = engines.get((v.key, v.group))
            if e is not None and id(e) in chosen:
                unit.append(e)
        if all(deficit[i] + sum(u.per_gpu for u in unit if i in u.group) <= 1.0 for i in deficit):
            for u in unit:
                chosen.discard(id(u))
                for i in u.group:
                    if i in deficit:
                        deficit[i] += u.per_gpu
    return [v for v in victims if id(v) in chosen]
