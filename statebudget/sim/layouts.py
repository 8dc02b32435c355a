"""Choosing an operator's layout (`PlannerConfig.homes`) from a deployment's history.

Which model gets which GPUs moves handoff stall more than any homing rule the planner has, and
trades against TTFT: a layout suits one workload (docs/tracking.md, "A layout fixed in advance").
So the layout is searched for by replaying the history with our planner:

1. two first layouts: the models the history calls, the widest first, then those with the fewest
   groups, then by calls, each on the fastest group no other model of the layout holds; and in
   the same order, each on the group most of its calls ran on in the planner's own best replay
   of the history (least handoff P95, no layout), what an operator would freeze by hand; the
   descent starts from the better of the two;
2. its neighbours: two models swapping groups, a model moved to a free group of another GPU kind,
   a model left to the planner's own homing, and the models homed off the fastest GPU kind of the
   layout (then off the fastest two kinds, ...) left to it: the planner's own homing can put a
   small model on whichever faster GPU is free, which a fixed slow home rules out;
3. steepest descent, one batch of neighbours at a time, within a budget of replayed layouts: the
   descent moves to the best neighbour (acceptable ones first, then by handoff-stall P95) while
   it improves on the layout it stands on, even one worse than no layout.

A layout is acceptable when its TTFT P95 and program-latency P95 (means over the history) are
within `tolerance` of no layout's or, with `against`, of the best of the named policies' (what
the operator would run instead: a layout may then give back TTFT the planner gained over them, and
none that they would have kept; a policy that drops more calls than the others is not the best,
as in the fair table). Of the acceptable layouts, the one with the least handoff-stall P95 is
kept if that is less than no layout's, whether or not no layout is acceptable: the search's aim
is handoff stall, and a layout that meets the limits only by giving it back has given back more
on evaluation seeds than it bought (docs/tracking.md, swe-team). Every figure comes from replays
of the history alone: no layout sees the traces it is later judged on.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from ..models.catalog import Catalog
from ..models.cluster import GB, Cluster
from ..models.load import load_trace
from ..models.trace import Trace
from ..policies.baselines import hot_bytes
from ..traces.generators import generate
from .sweep import run_local

METRICS = ("handoff_p95_s", "ttft_p95_s", "program_p95_s")

Layout = tuple  # ((model, (GPU index, ...)), ...) in catalog order: `PlannerConfig.homes`


def call_shares(traces: list[Trace]) -> Counter:
    """Calls per model over the history's traces."""
    return Counter(n.model for tr in traces for p in tr.programs for n in p.nodes if n.kind == "call")


def _groups(cluster: Cluster, catalog: Catalog) -> dict[str, list[tuple[int, ...]]]:
    """Per model, the groups it may run on whose GPUs hold its dense part and the expert pages
    half its calls touch (what `static` keeps resident): a MoE model's calls need them there."""
    hbm = [cluster.gpu_kinds[g.kind].hbm_gb * GB for g in cluster.gpus]
    need = {m.name: hot_bytes(m) / m.tp for m in catalog.models}
    return {m.name: [g for g in cluster.model_groups(m) if need[m.name] <= min(hbm[i] for i in g)]
            for m in catalog.models}


def _speed(cluster: Cluster, g: tuple[int, ...]) -> tuple:
    """Faster first: the group's slowest GPU's TFLOP/s, then its least HBM, then its index."""
    kinds = [cluster.gpu_kinds[cluster.gpus[i].kind] for i in g]
    return (-min(k.tflops for k in kinds), -min(k.hbm_gb for k in kinds), g)


def _kind(cluster: Cluster, g: tuple[int, ...]) -> str:
    return cluster.gpus[g[0]].kind


def _ordered(catalog: Catalog, homes: dict) -> Layout:
    return tuple((m.name, homes[m.name]) for m in catalog.models if m.name in homes)


def first_layout(cluster: Cluster, catalog: Catalog, shares: Counter) -> Layout:
    """Step 1 of the module: the called models, widest first, each on the fastest free group."""
    groups = _groups(cluster, catalog)
    taken: set[int] = set()
    homes = {}
    called = [m for m in catalog.models if shares.get(m.name, 0) > 0 and groups[m.name]]
    for m in sorted(called, key=lambda m: (-m.tp, len(groups[m.name]), -shares[m.name], m.name)):
        free = [g for g in groups[m.name] if not taken.intersection(g)]
        if free:
            g = min(free, key=lambda g: _speed(cluster, g))
            taken.update(g)
            homes[m.name] = g
    return _ordered(catalog, homes)


def learned_layout(cluster: Cluster, catalog: Catalog, rows: list[dict]) -> Layout:
    """Step 1's second layout, from the no-layout replays of the history (sweep rows with
    `groups_by_model`): on the best of them, each called model on the free group most of its
    calls ran on (then the next most used; of two as used, the faster), in `first_layout`'s order."""
    groups = _groups(cluster, catalog)
    best = min(rows, key=lambda r: (math.inf if r["handoff_p95_s"] is None else r["handoff_p95_s"], r["seed"]))
    ran = {m: c for m, c in (best.get("groups_by_model") or {}).items() if m in groups and c}
    taken: set[int] = set()
    homes = {}
    for m in sorted((m for m in catalog.models if m.name in ran),
                    key=lambda m: (-m.tp, len(groups[m.name]), -sum(ran[m.name].values()), m.name)):
        ran_on = {tuple(int(i) for i in label.split(",")): n for label, n in ran[m.name].items()}
        for g in sorted(ran_on, key=lambda g: (-ran_on[g], _speed(cluster, g))):  # ties: the faster
            if g in groups[m.name] and not taken.intersection(g):
                taken.update(g)
                homes[m.name] = g
                break
    return _ordered(catalog, homes)


def neighbours(cluster: Cluster, catalog: Catalog, lay: Layout) -> list[Layout]:
    """Swaps of two models' groups (each fits the other's), moves of one model to the fastest free
    group of each other GPU kind, each model dropped from the layout, and the models off the
    fastest GPU kind dropped (then those off the fastest two kinds, ...); no duplicates."""
    groups = _groups(cluster, catalog)
    homes = dict(lay)
    # first, as a budget may cut the list: only the models on the fastest kind kept, then on the
    # fastest two, ...
    speeds = sorted({_speed(cluster, g)[:2] for g in homes.values()})  # fastest first
    out: list[Layout] = [_ordered(catalog, {n: g for n, g in homes.items() if _speed(cluster, g)[:2] < cut})
                         for cut in speeds[1:]]
    names = list(homes)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if homes[b] in groups[a] and homes[a] in groups[b] and homes[a] != homes[b]:
                out.append(_ordered(catalog, {**homes, a: homes[b], b: homes[a]}))
    for a in names:
        taken = {i for n, g in homes.items() if n != a for i in g}
        by_kind: dict[str, tuple] = {}
        for g in sorted(groups[a], key=lambda g: _speed(cluster, g)):
            k = _kind(cluster, g)
            if k != _kind(cluster, homes[a]) and not taken.intersection(g):
                by_kind.setdefault(k, g)
        out += [_ordered(catalog, {**homes, a: g}) for g in by_kind.values()]
        out.append(_ordered(catalog, {n: g for n, g in homes.items() if n != a}))
    seen, unique = {lay}, []
    for cand in out:
        if cand not in seen:
            seen.add(cand)
            unique.append(cand)
    return unique


@dataclass
class Scored:
    layout: Layout | None          # None: no layout (the planner's own homing)
    means: dict[str, float]        # METRICS, means over the history's replays
    acceptable: bool = True
    rows: list = field(default_factory=list, repr=False)  # the replays' sweep rows


@dataclass
class Search:
    chosen: Scored
    none: Scored
    tried: list[Scored] = field(default_factory=list)
    against: dict[str, dict] = field(default_factory=dict)  # policy -> its METRICS means on the history
    dropped: dict[str, float] = field(default_factory=dict)  # policy left out of `against` -> calls it drops a trace
    holds: bool = False  # the layouts were replayed holding (`PlannerConfig.layout_holds`)

    def planner_arg(self) -> str:
        """The `--planner` argument that sets the chosen layout ('' for none)."""
        if self.chosen.layout is None:
            return ""
        return f"homes={self.chosen.layout!r}" + (",layout_holds=True" if self.holds else "")


def _s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f} s"


def _means(rows: list[dict]) -> dict[str, float | None]:
    """Each metric's mean over the replays that measured it (None: none did)."""
    out = {}
    for m in METRICS:
        v = [r[m] for r in rows if r.get(m) is not None]
        out[m] = sum(v) / len(v) if v else None
    return out


def search(cluster: Cluster, catalog: Catalog, history: list[dict], policy: str = "statebudget-lease",
           budget: int = 24, tolerance: float = 0.05, workers: int | None = None, progress=None,
           against: list[str] = (), holds: bool = False) -> Search:
    """Steepest descent over layouts (see the module). `history`: sweep jobs (a policy in them is
    replaced by `policy`), each a trace (`trace` and `seed`, or `trace_file`) with its cluster, catalog, start and
    warm-up; every candidate is replayed on all of them. `budget` counts replayed layouts, no
    layout included. `against`: policies whose best TTFT and program P95 bound an acceptable
    layout's, in place of no layout's (replayed on the history first). `holds`: every layout is
    replayed holding (`PlannerConfig.layout_holds`). `progress(message)` after each batch."""
    if budget < 2:
        raise ValueError(f"budget must be >= 2 (no layout and a first one), got {budget}")
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    traces = [load_trace(j["trace_file"]) if j.get("trace_file") else generate(j["trace"], j["seed"], j["hours"])
              for j in history]

    def score(batch: list[Layout | None]) -> list[Scored]:
        jobs = [dict(j, policy=policy, planner={"homes": lay, "layout_holds": holds} if lay is not None else {})
                for lay in batch for j in history]
        rows = run_local(jobs, workers)
        out = []
        for lay in batch:
            mine = [r for r in rows if (r.get("planner") or {}).get("homes") == lay]
            out.append(Scored(lay, _means(mine), rows=mine))
        return out

    others: dict[str, dict] = {}
    dropped: dict[str, float] = {}
    against = list(dict.fromkeys(against))
    if against:
        rows = run_local([dict(j, policy=p, planner={}) for p in against for j in history], workers)
        dropped = {p: sum(r.get("unplaceable_calls") or 0 for r in rows if r["policy"] == p) / len(history)
                   for p in against}
        fewest = min(dropped.values())
        # a policy that drops more calls than the others is not the best: dropped calls flatter it
        others = {p: _means([r for r in rows if r["policy"] == p]) for p in against if dropped[p] <= fewest + 0.5}
        dropped = {p: d for p, d in dropped.items() if p not in others}
    [none] = score([None])
    starts = [first_layout(cluster, catalog, call_shares(traces))]
    learned = learned_layout(cluster, catalog, none.rows)
    if learned and learned not in starts:
        starts.append(learned)
    starts = score(starts)
    refs = list(others.values()) or [none.means]
    limit = {m: min((r[m] for r in refs if r[m] is not None), default=math.inf) * (1 + tolerance)
             for m in METRICS[1:]}

    def judge(s: Scored) -> Scored:  # a metric no replay measured is no evidence for the layout
        s.acceptable = all(s.means[m] is not None and s.means[m] <= limit[m] for m in limit)
        return s

    def rank(s: Scored) -> tuple:  # the descent's order: acceptable layouts first, then handoff P95
        h = s.means[METRICS[0]]
        return (not s.acceptable, math.inf if h is None else h)

    tried = [judge(none)] + [judge(s) for s in starts]
    best, current = none, min(starts, key=rank)  # `best`: what is kept; `current`: where the descent stands

    def keep(s: Scored) -> Scored:  # an acceptable layout with less handoff P95 than no layout's and `best`'s
        return s if s.acceptable and rank(s)[1] < rank(best)[1] else best

    for s in starts:
        best = keep(s)
    while len(tried) < budget + 1:
        seen = {s.layout for s in tried}
        # an empty layout is no layout, replayed already
        batch = [c for c in neighbours(cluster, catalog, current.layout) if c and c not in seen]
        batch = batch[:budget + 1 - len(tried)]
        if not batch:
            break
        scored = [judge(s) for s in score(batch)]
        tried += scored
        step = min(scored, key=rank)
        best = keep(step)
        if progress:
            progress(f"{len(tried) - 1}/{budget} layouts replayed; handoff P95 {_s(best.means[METRICS[0]])} "
                     f"kept (no layout {_s(none.means[METRICS[0]])})")
        if rank(step) >= rank(current):  # no neighbour improves on where the descent stands
            break
        current = step
    return Search(best, none, tried, others, dropped, holds)
