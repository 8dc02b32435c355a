"""The planner loop: predictor + greedy solver (+ leases) over a residency view.

The view is whatever holds the books: the simulator in a replay, the service's ledger live. It
answers `catalog`, `cost`, `gpus`, `model_groups(model)`, `tiers` (copies in HBM and DRAM, capacities),
`kv_tokens`, `best_source(key, group)` and `link_backlog()`. The planner reads it and returns
decisions; it never changes the books itself.

One planning step (`plan`), at every event that changes what is likely next:

    predictor ─▶ P(model m needed within h), P(program k needs its KV of m within h)
              ─▶ candidates: each model's weights (+ hot expert pages) on the group it is on or
                 would go to, each live program's KV — value = P(need) x restore seconds,
                 less (1 - P(need)) x the bytes a promotion would waste x their price
              ─▶ greedy.solve: target HBM set by stall saved per byte, promotions within the
                 per-link budget
              ─▶ decisions: promote targets, demote idle residents to host (warm tax)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import compress, repeat

import numpy as np

from ..models.state import expert_key, kv_key, weights_key
from ..core.costs import page_touch_probs, touched_pages
from ..solvers.greedy import Candidates, solve
from .leases import LeaseLedger, LeaseRequest, LeaseState, Quote, decide, rank_key, rejection_reason
from .homes import home_of, idle_room, layout, pages_owed, resident_by_model, scale_out
from .config import PlannerConfig
from .overload import Pressure
from .predictor import Predictor
from ..core.decisions import Demote, Promote, PromoteHost


@dataclass(frozen=True)
class _ModelStatic:
    """What a planning step reads of one model that only its spec and the config decide."""
    wk: tuple
    page_bytes: float
    touch: tuple[float, ...]   # per expert page: P(a call touches it)
    hot: frozenset             # pages that are candidates wherever the model goes
    expert_keys: tuple         # its expert pages' keys, in page order
    stage: tuple               # what host DRAM stages for it: weights, then every page

    @classmethod
    def of(cls, m, hot_pages) -> "_ModelStatic":
        pages = tuple(expert_key(m.name, p) for p in range(m.moe.pages)) if m.moe else ()
        return cls(weights_key(m.name), m.moe.page_bytes if m.moe else 0.0,
                   tuple(page_touch_probs(m.moe).tolist()) if m.moe else (), frozenset(p for p, _ in hot_pages),
                   pages, (weights_key(m.name),) + pages)


class PlannerCore:
    def __init__(self, catalog, cost, config: PlannerConfig | None = None, use_hints: bool = False):
        self.catalog, self.cost = catalog, cost
        self.cfg = config or PlannerConfig()
        self.use_hints = use_hints
        self.models = [m.name for m in catalog.models]
        self.predictor = Predictor(self.models)
        self.predictor.lookahead = self.cfg.lookahead
        self.ledger = LeaseLedger()
        self.density: dict[tuple, float] = {}  # (key, group) -> last computed density
        self.lease_of_call: dict[tuple, str] = {}  # (program, call) -> lease id
        self._kv_rate_cache: dict[tuple, tuple[float, float]] = {}
        self._group_ids: dict[tuple, int] = {}      # group -> its row of `_group_rows`
        self._group_rows = np.zeros((0, 0), bool)    # [groups seen x GPUs]: membership
        self._kv_sources: dict[tuple, tuple] = {}  # `_kv_source`
        self._kv_view = None
        self.target: dict[str, tuple] = {}  # model -> group the tracked MILP wants it on (`target.py`)
        self.target_p = 0.0                 # a target model counts as needed at least this likely (1: kept for sure)
        self.target_homes = False           # the target's group homes a target model that has no copy
        self._homes = layout(catalog, cost.cluster, self.cfg.homes)  # {model: group}, checked
        self._hot_pages = {m.name: touched_pages(m, self.cfg.page_min_touch) for m in catalog.models}
        self._lease_pages = {m.name: touched_pages(m, self.cfg.lease_page_min_touch) for m in catalog.models}
        self._model_index = {name: i for i, name in enumerate(self.models)}
        self._static = [_ModelStatic.of(m, self._hot_pages[m.name]) for m in catalog.models]
        self._moe = [(st.wk, st.expert_keys, st.hot, st.page_bytes) for st in self._static if st.expert_keys]  # `pages_owed`
        self._links: dict[tuple, tuple[str, ...]] = {}  # (src, group) -> links crossed, one run per GPU
        self._shared_paths: dict[tuple, dict] = {}      # (src, group, per_gpu) -> `_path_bytes`
        self._stage_at: dict[tuple, tuple] = {}         # (model index, node) -> host keys it stages
        self._link_key: tuple | None = None             # `_link_window`
        self._link_base: dict[str, float] = {}
        self._link_gbps: float | None = None            # `admit`: mean link bandwidth, GB/s

    def set_homes(self, homes, holds: bool) -> None:
        """A new operator's layout (`homes`, `layout_holds`; checked as at the start): the next step homes by it."""
        self._homes = layout(self.catalog, self.cost.cluster, homes)
        self.cfg = replace(self.cfg, homes=tuple(homes) if homes else None, layout_holds=holds)

    # ---- the greedy step ------------------------------------------------------------------------
    def plan(self, view, now: float) -> list:
        cfg = self.cfg
        pred = self.predictor
        pred.prepare(now, (cfg.horizon_s, cfg.idle_horizon_s), self.use_hints)
        p_model = pred.model_need_within(now, cfg.horizon_s, self.use_hints).tolist()
        p_idle = pred.model_need_within(now, cfg.idle_horizon_s, self.use_hints).tolist()
        progs, p_prog = pred.need_within(now, cfg.horizon_s, self.use_hints)
        tiers = view.tiers
        gpu_copies = tiers.gpu
        keys, groups, per_gpu, values, copies, paths, probs = [], [], [], [], [], [], []

        waste_price = cfg.waste_price_s_per_gb / 1e9  # seconds per byte

        def push(key, group, c, p, value, new_per_gpu, path):
            """One candidate: a resident copy `c` brings its own bytes and needs no path. A copy to
            be moved pays for the bytes it wastes if it is not needed (`waste_price_s_per_gb`);
            one resident has paid already."""
            keys.append(key)
            groups.append(group)
            copies.append(c)
            probs.append(p)
            if c is None and waste_price and not self._leased(key):  # a lease's state is asked for
                value -= (1.0 - p) * new_per_gpu * len(group) * waste_price
            values.append(value)
            per_gpu.append(c.per_gpu if c is not None else new_per_gpu)
            paths.append({} if c is not None else path)

        # Weights and expert pages: each model on the group it was last used on (its home), or
        # where it would go; extra copies are worth their keep only while calls overlap.
        homes: dict[str, tuple] = {}
        by_model = None  # `resident_by_model`, read once a step, with `home_reclaim` set
        home_room = None  # per GPU, bytes a new home counts as free beside the free ones (`_home_room`)
        for mi, m in enumerate(self.catalog.models):
            st = self._static[mi]
            wk = st.wk
            held = sorted(tiers.groups_of.get(wk, ()), key=lambda g: (-gpu_copies[(wk, g)].last_use, g))
            # One held stays where its calls run (with `layout_holds`, one in the operator's layout on its
            # group there). One with no copy goes, with `target_homes`, to its target group (the MILP sees
            # only the models its share holds), else to its group in the layout (`homes`), else where its
            # engine sleeps, else to the most free HBM (`home_of`; `home_reclaim`: clear of others' weights).
            home = held[0] if held else (self.target.get(m.name) if self.target_homes else None)
            if self._homes and (home is None or held and cfg.layout_holds):
                home = self._homes.get(m.name, home)
            if home is None:
                if by_model is None and cfg.home_reclaim is not None:
                    by_model = resident_by_model(view, [s.stage for s in self._static])
                if home_room is None:
                    home_room = self._home_room(view, now) if cfg.home_reclaim is None else ()
                home = home_of(view, m, p_idle, cfg.home_reclaim, self._model_index, by_model, home_room)
            if home is None:
                continue
            # A model in the target is needed for sure on its home: it is promoted and kept there
            # whatever the short-horizon forecast says.
            p_m = max(p_model[mi], self.target_p) if m.name in self.target else p_model[mi]
            homes[m.name] = home
            node = view.gpus[home[0]].node
            pm = p_model[mi]
            # Evicted, a held copy sleeps on its group (a wake); one not held wakes only where its
            # engine sleeps, else it pays a cold start.
            restore = self.cost.weights_restore_s(m, "host", node, home,
                                                  wake=home in held or tiers.asleep_on(wk, home))
            c = gpu_copies.get((wk, home))
            dense = m.dense_bytes / len(home)
            push(wk, home, c, p_m, p_m * restore, dense,
                 None if c is not None else self._path_bytes(view.best_source(wk, home), home, dense, shared=True))
            for g in (g for g in held if g != home):  # held: a copy is there
                push(wk, g, gpu_copies[(wk, g)], 0.0, 0.25 * pm * restore, 0.0, None)
            if m.moe:
                page_bytes = st.page_bytes
                fault = page_bytes / len(home) / self.cost.link_bw[f"h2d:{view.gpus[home[0]].id}"]
                esrc = f"nvme:{node}"
                epath = None
                for page, ek in enumerate(st.expert_keys):
                    # hot pages are candidates anywhere; the tail only where a call left it
                    c = gpu_copies.get((ek, home))
                    if c is None and page not in st.hot:
                        continue
                    pt = p_m * st.touch[page]
                    if c is None and epath is None:
                        epath = self._path_bytes(esrc, home, page_bytes / len(home), shared=True)
                    push(ek, home, c, pt, pt * fault, page_bytes / len(home), epath)
        n_state = len(keys)  # candidates before this index are weights and pages
        # KV out of HBM that a live program is likely to need soon, brought next to its model's
        # weights: value = P(needed) x the cheaper of onboarding it from host DRAM and recomputing
        # it. KV already in HBM is not a candidate: it stays unless the mechanism needs room, and
        # then goes in density order (`evict_priority`, computed from the same estimates).
        self._kv_view = (view, progs, p_prog, None)
        kv_tokens = view.kv_tokens
        groups_of = tiers.groups_of
        names = self.models
        ks, mis = np.nonzero(p_prog >= cfg.promote_min_p)
        ks, mis = ks.tolist(), mis.tolist()
        kvks = list(zip(repeat("kv"), map(progs.__getitem__, ks), map(names.__getitem__, mis)))
        kv_T, kv_rates = [], []
        # most pairs hold no KV: C-level passes of lookups drop them (none recorded, or 0 tokens)
        for j in compress(range(len(kvks)), map(kv_tokens.get, kvks)):
            kvk = kvks[j]
            if kvk in groups_of:
                continue
            T, k, mi = kv_tokens[kvk], ks[j], mis[j]
            m = self.catalog.models[mi]
            group = homes.get(m.name)
            if group is None:
                continue
            nbytes = T * m.kv_bytes_per_token
            keys.append(kvk)
            groups.append(group)
            copies.append(None)
            per_gpu.append(nbytes / len(group))
            probs.append(p_prog[k, mi])
            path, rates = self._kv_source(view, kvk, m, group, T, per_gpu[-1])
            paths.append(path)
            kv_T.append(nbytes)
            kv_rates.append(rates)
        if len(keys) > n_state:
            rates = np.asarray(kv_rates)
            nbytes = np.asarray(kv_T)
            restore = np.minimum(nbytes / rates[:, 0], nbytes * rates[:, 1])
            p_kv = np.asarray(probs[n_state:])
            value = p_kv * restore
            if waste_price:
                priced = np.array([not self._leased(k) for k in keys[n_state:]])
                value = value - priced * (1.0 - p_kv) * nbytes * waste_price
            values.extend(value.tolist())
        if not keys:
            return []
        n_gpu = len(tiers.hbm_cap)
        member = self._membership(groups, n_gpu)
        pinned = [0.0] * n_gpu
        cand = set(zip(keys, groups))
        for kg, c in gpu_copies.items():
            if c.pins > 0 or kg not in cand:
                b = c.per_gpu
                for i in kg[1]:
                    pinned[i] += b
        for group, b in tiers.private.values():
            for i in group:
                pinned[i] += b
        resident = [c is not None for c in copies]
        res_arr = np.asarray(resident)
        # Residents a call pins are not candidates for the budget: they stay whatever the solver
        # says. A prefetch still loading is a resident like any other (it cannot be demoted yet).
        pins = [c is not None and c.pins > 0 for c in copies]
        is_pinned = np.array(pins)
        cap = np.asarray(tiers.hbm_cap)
        budget = cap * (1 - cfg.gpu_headroom) - np.asarray(pinned)
        backlog = view.link_backlog()
        link_budget = dict(self._link_window())
        for l, b in backlog.items():  # few links carry a backlog: the rest keep the whole window
            if l in link_budget:
                link_budget[l] -= b
        cands = Candidates(keys, groups, member & ~is_pinned[:, None], np.asarray(per_gpu), np.asarray(values),
                           res_arr & ~is_pinned, paths)
        plan = solve(cands, budget, link_budget, cfg.hysteresis)
        density = plan.density.tolist()
        self.density = dict(zip(zip(keys, groups), density))
        # The warm tax is spent, not minimised: idle state (weights and pages with no running call
        # on their group, resident or about to be promoted) holds HBM in density order —
        # P(needed within the idle horizon) x restore seconds per byte — up to `warm_budget` of
        # the cluster's HBM. Residents past it go one tier down, only once host DRAM holds a copy
        # (the demotion moves nothing, a restore is a wake); candidates past it are not promoted.
        promote = {i for i in plan.promote if probs[i] >= cfg.promote_min_p}
        running = view.running_models
        midx = self._model_index
        idle = []
        for i in range(n_state):
            k, g, c = keys[i], groups[i], copies[i]
            if pins[i] or running.get((k[1], g), 0):
                continue
            if not resident[i] and i not in promote:
                continue
            mi = midx[k[1]]
            # A second copy of a model's weights competes like any other on its density, which its
            # candidate value already discounts (0.25x): calls of one model overlap, and a second
            # replica demoted at once is reloaded from DRAM by the next overlapping call.
            leased = self._leased(k) or (c is not None and (not c.ready or now - c.created < cfg.min_dwell_s)) \
                or (self.target_p >= 1.0 and k[1] in self.target and g == homes.get(k[1]) and k[0] == "w")
            keep = math.inf if leased else density[i] * (p_idle[mi] / max(p_model[mi], 1e-9))
            idle.append((keep, i))
        room, out = cfg.warm_budget * float(cap.sum()), []
        for keep, i in sorted(idle, key=lambda x: (-x[0], x[1])):
            k, g = keys[i], groups[i]
            nbytes = per_gpu[i] * len(g)
            if keep == math.inf or (keep > 0 and room >= nbytes):  # leased state always stays
                room -= nbytes
                continue
            if not resident[i]:
                promote.discard(i)
                continue
            hc = tiers.host.get((k, view.gpus[g[0]].node))
            if hc is not None and hc.ready:
                out.append(Demote(k, g, "host"))
        # Speculation yields past capacity: a promote onto a group with a queue takes HBM and link
        # from the calls already waiting there, and the next call goes elsewhere (`overload.py`).
        # The queue is read only when there is something to promote.
        load = self.pressure(view) if promote else None
        if load is not None:  # a step's candidates share a few groups
            past = {g: load.past_capacity(g) for g in {groups[i] for i in promote}}
            promote = {i for i in promote if not past[groups[i]]}
        out = [Promote(keys[i], groups[i]) for i in plan.promote if i in promote] + out
        if cfg.scale_out_wait_s is not None or cfg.scale_out_calls is not None:
            out += scale_out(view, self.catalog, now, cfg.scale_out_wait_s, cfg.scale_out_calls,
                             cfg.scale_out_fits_typical)
        # Stage in host DRAM what a restore would read (weights, expert pages of the home node) for
        # models likely to be used at all: a restore from DRAM is a wake, from NVMe a cold start.
        if cfg.stage_host:
            host = tiers.host
            for mi, m in enumerate(self.catalog.models):
                home = homes.get(m.name)
                if home is None or p_idle[mi] < cfg.idle_threshold / 2:
                    continue
                node = view.gpus[home[0]].node
                at = self._stage_at.get((mi, node))
                if at is None:
                    at = self._stage_at[(mi, node)] = tuple((k, node) for k in self._static[mi].stage)
                for kn in at:
                    if kn not in host:
                        out.append(PromoteHost(*kn))
        return out

    def _home_room(self, view, now: float) -> list[float] | tuple:
        """Per GPU, bytes a new home counts as free: uncalled models' idle state (`uncalled_room_after_s`)
        less resident MoE models' missing hot pages, a never-called one's too (`home_keeps_pages`)."""
        after, first = self.cfg.uncalled_room_after_s, self.predictor.first_call_s
        room: list[float] | tuple = ()
        if after is not None and first is not None and now - first >= after:
            called = self.predictor.called
            room = idle_room(view, [st.stage for st, m in zip(self._static, self.catalog.models) if m.name not in called])
        if not self.cfg.home_keeps_pages:
            return room
        owed = pages_owed(view, self._moe)
        return [r - o for r, o in zip(room or [0.0] * len(owed), owed)]

    def pressure(self, view) -> Pressure | None:
        """The admission queue now (`overload.py`); None when overload handling is off or no call
        waits for HBM (then nothing past capacity changes any decision). A view that keeps the
        queue summed per GPU (`queue_load`, the simulator's) is read in O(GPUs)."""
        threshold = self.cfg.overload_wait_s
        if threshold is None:
            return None
        kept = getattr(view, "queue_load", None)
        if kept is not None:
            load = kept()
            return None if load is None else Pressure.at(load, view.running_on, view.now, threshold)
        queue = view.admission_queue()
        return Pressure.of(view, threshold, queue) if queue else None

    def _link_window(self) -> dict[str, float]:
        """Each link's promotion budget over the window before what is queued on it (the links'
        bandwidths are fixed; the config is read again if it changed)."""
        key = (self.cfg.window_s, self.cfg.link_headroom)
        if self._link_key != key:
            self._link_key = key
            self._link_base = {l: bw * self.cfg.window_s * (1 - self.cfg.link_headroom)
                               for l, bw in self.cost.link_bw.items()}
        return self._link_base

    def _membership(self, groups: list, n_gpu: int) -> np.ndarray:
        """[len(groups) x GPUs] bool: GPU i is in groups[k] (one gather from the groups seen)."""
        if self._group_rows.shape[1] != n_gpu:
            self._group_ids, self._group_rows = {}, np.zeros((0, n_gpu), bool)
        ids = self._group_ids
        for g in groups:
            if g not in ids:
                row = np.zeros((1, n_gpu), bool)
                row[0, list(g)] = True
                ids[g] = len(self._group_rows)
                self._group_rows = np.concatenate((self._group_rows, row))
        return self._group_rows[list(map(ids.__getitem__, groups))]

    def _kv_source(self, view, kvk, m, group, tokens: int, per_gpu: float) -> tuple[dict, tuple]:
        """(`_path_bytes` from `view.best_source`, `_kv_rates`) of KV with no copy in HBM: functions
        of its model, length, group and whether host DRAM and NVMe hold it, so kept per those (asked
        for every KV candidate at every step; a program's KV grows only when its calls end). The
        path is shared: the solver only reads it."""
        node = view.gpus[group[0]].node
        hc = view.tiers.host.get((kvk, node))
        key = (kvk[2], tokens, group, hc is not None and hc.ready, (kvk, node) in view.tiers.nvme)
        hit = self._kv_sources.get(key)
        if hit is None:
            if len(self._kv_sources) > 100_000:  # lengths keep growing: bound the memory
                self._kv_sources.clear()
            src = view.best_source(kvk, group)
            hit = self._kv_sources[key] = (self._path_bytes(src, group, per_gpu), self._kv_rates(m, group))
        return hit

    def _kv_rates(self, m, group) -> tuple[float, float]:
        """(bytes/s onboarding KV from host DRAM onto `group`, seconds per token recomputing it)."""
        key = (m.name, group)
        r = self._kv_rate_cache.get(key)
        if r is None:
            onboard = self.cost.group_transfer_s(1e9, "host", "", group)  # seconds for 1 GB
            r = self._kv_rate_cache[key] = (1e9 / onboard, self.cost.prefill_s(m, 1.0, group))
        return r

    def _leased(self, key) -> bool:
        return self.ledger.held(key)

    def _path_bytes(self, src: str | None, group, per_gpu: float, shared: bool = False) -> dict:
        """Bytes a transfer of `per_gpu` onto each GPU of `group` puts on every link it crosses.
        `shared`: the caller only reads the dict, so one made for the same sizes is reused (the
        weights and pages of a model, whose sizes do not change)."""
        if src is None or src.startswith("none"):
            return {}
        if shared:
            out = self._shared_paths.get((src, group, per_gpu))
            if out is None:
                out = self._shared_paths[(src, group, per_gpu)] = self._path_bytes(src, group, per_gpu)
            return out
        links = self._links.get((src, group))
        if links is None:
            links = self._links[(src, group)] = tuple(l for i in group for l in self.cost.path(src, f"gpu:{i}"))
        out: dict[str, float] = {}
        for link in links:  # a link shared by the group's GPUs adds once per GPU, in GPU order
            out[link] = out.get(link, 0.0) + per_gpu
        return out

    # ---- eviction order for the mechanism -------------------------------------------------------
    def evict_priority(self, copy) -> float:
        """Lower leaves HBM first: the density of the last plan (leased state never)."""
        if self._leased(copy.key):
            return math.inf
        d = self.density.get((copy.key, copy.group))
        if d is None and copy.key[0] == "kv" and self._kv_view is not None:
            d = self._kv_density(copy)
        return d if d is not None else -1.0 / (1.0 + copy.last_use)

    def _kv_density(self, copy) -> float | None:
        view, progs, p_prog, row_of = self._kv_view
        if row_of is None:  # built on the first eviction after a plan, not at every plan
            row_of = {p: k for k, p in enumerate(progs)}
            self._kv_view = (view, progs, p_prog, row_of)
        k = row_of.get(copy.key[1])
        if k is None:
            return 0.0  # its program is over or unknown: first to go
        m = self.catalog.by_name[copy.key[2]]
        p = p_prog[k, self._model_index[m.name]]
        nbytes = view.kv_tokens.get(copy.key, 0) * m.kv_bytes_per_token
        onboard_bps, recompute_s_per_token = self._kv_rates(m, copy.group)
        restore = min(nbytes / onboard_bps, view.kv_tokens.get(copy.key, 0) * recompute_s_per_token)
        return p * restore / max(nbytes, 1.0) * (1.0 + self.cfg.hysteresis)

    # ---- leases ---------------------------------------------------------------------------------
    def quote(self, view, req: LeaseRequest, group, now: float) -> Quote:
        """P50/P95 ready time of a lease's objects on `group` from the cost model and the bytes
        already queued on the links (P50 assumes half the queue is ahead of us, P95 all of it)."""
        m = self.catalog.by_name[req.model]
        objects = [weights_key(m.name)] + [expert_key(m.name, p) for p, _ in self._lease_pages[m.name]]
        if req.kv_version is not None:
            objects.append(kv_key(req.program, m.name))
        backlog = view.link_backlog()
        on_link: dict[str, float] = {}      # bytes this lease puts on each link (objects share them)
        w_link: dict[str, float] = {}       # the same for weights and pages alone
        compute = reconf = total = 0.0
        need = []
        for key in objects:
            c = view.tiers.gpu.get((key, group))
            if c is not None:
                if not c.ready:
                    # still being written: the lease waits for its commit, whose bytes are on the
                    # links already (the backlog the quote counts on those links)
                    need.append(key)
                    for link in self._path_bytes(view.best_source(key, group), group, 0.0):
                        on_link.setdefault(link, 0.0)
                        if key[0] != "kv":
                            w_link.setdefault(link, 0.0)
                continue
            src = view.best_source(key, group)
            per_gpu = view.size_of(key) / len(group)
            need.append(key)
            if src == "none":  # KV to recompute: compute time, no link
                compute = max(compute, self.cost.prefill_s(m, view.kv_tokens.get(key, 0), group))
                continue
            total += per_gpu * len(group)
            kind = src.split(":", 1)[0]
            if key[0] == "w":
                reconf = self.cost.reconfig_s(group, kind, wake=view.tiers.asleep_on(key, group))
            for link, b in self._path_bytes(src, group, per_gpu).items():
                on_link[link] = on_link.get(link, 0.0) + b
                if key[0] != "kv":
                    w_link[link] = w_link.get(link, 0.0) + b

        def finish(loads: dict, ahead: float) -> float:
            return max((((ahead * backlog.get(l, 0.0)) + b) / self.cost.link_bw[l] for l, b in loads.items()), default=0.0)

        p50 = max(finish(on_link, 0.5) + reconf, compute)
        p95 = max(finish(on_link, 1.0) + reconf, compute)
        w95 = finish(w_link, 1.0) + reconf
        return Quote(p50_s=p50, p95_s=p95, weights_p95_s=w95, bytes=total, stall_saved_s=p50, objects=tuple(need))

    def lease_budget_ok(self, view, quote: Quote, group, deadline_s: float, now: float, committed: dict) -> bool:
        """Background bandwidth must leave the SLO margin: the lease's bytes, plus what leases
        already committed, fit in (1 - margin) of each link's capacity until the deadline."""
        window = max(deadline_s - now, 1e-3)
        src_bytes = quote.bytes / max(len(group), 1)
        for i in group:
            gpu = view.gpus[i]
            for link in (f"h2d:{gpu.id}", f"root:{gpu.node}"):
                cap = self.cost.link_bw[link] * window * (1 - self.cfg.lease_slo_margin)
                if committed.get(link, 0.0) + src_bytes > cap:
                    return False
        return True

    def admit(self, view, requests: list[tuple[LeaseRequest, tuple]], now: float) -> list:
        """Quote, rank and decide a batch of competing lease requests [(request, group)]."""
        quoted = [(req, g, self.quote(view, req, g, now)) for req, g in requests]
        if self._link_gbps is None:  # the links' bandwidths are fixed
            self._link_gbps = np.mean(list(self.cost.link_bw.values())) / 1e9
        link = self._link_gbps
        quoted.sort(key=lambda x: (-rank_key(x[0], x[2], link), x[0].cancel_token))
        committed: dict[str, float] = {}
        load = self.pressure(view)
        out = []
        for req, group, q in quoted:
            if load is not None and load.past_capacity(group):
                # The lease's state would wait behind the queue there while its bytes take link and
                # HBM from calls already waiting: the runtime is told when to ask again.
                lease = self.ledger.submit(req, q, LeaseState.REJECTED, now)
                lease.reason, lease.retry_after_s = load.reason(group)
                out.append((lease, group))
                continue
            ok = self.lease_budget_ok(view, q, group, req.deadline_s, now, committed)
            state = decide(req, q, now, ok)
            lease = self.ledger.submit(req, q, state, now)
            if state == LeaseState.REJECTED:
                lease.reason = rejection_reason(req, q, now, ok)
            if state.live:
                for i in group:
                    gpu = view.gpus[i]
                    for l in (f"h2d:{gpu.id}", f"root:{gpu.node}"):
                        committed[l] = committed.get(l, 0.0) + q.bytes / len(group)
                if req.for_call is not None:
                    self.lease_of_call[(req.program, req.for_call)] = lease.lease_id
            out.append((lease, group))
        return out
