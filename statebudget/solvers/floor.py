"""The page floor: the stall that expert-page faults alone force on a policy that cannot foresee
which expert pages a call will touch (no real router can: a call's experts are chosen as its
tokens run).

A call of a MoE model touches page i with probability `page_touch_probs(moe)[i]`, drawn per call
(`sim/programs.py`), independently of what is resident when it arrives. Whatever a policy keeps,
the pages resident or loading on the group where the call runs number at most `k`: those that fit
one GPU of its best group beside the dense part and the engine (usable HBM, `hbm_reserve_frac`
held back), the KV left out. Each touched page outside them crosses the link at full bandwidth
after the call arrives, `t` seconds a page (its bytes at `CostModel.group_transfer_s`'s rate from
host DRAM, the fastest source). Keeping the `k` most touched pages makes the number of such pages stochastically
smallest, so for every call, whatever the policy did before,

    stall >= t x (touched pages outside the k most touched)      in distribution.

Summed over calls that gives a floor on the expected total stall, and, since a percentile only
grows with its values, a floor on the expected handoff-stall P95: every other stall taken as 0.
Each model gets its own best group, even where two models' best groups overlap, which only lowers
the floor.

What it leaves out, so that it stays a floor: calls that a cancel may drop (counted as 0 in the
P95, left out of the total), and dropped (unplaceable) calls, which are assumed not to happen. It
does not hold for a policy whose placement reads the call's pages to choose between copies that
hold different pages (no router can; this simulator's policies do not, docs/model.md). Counted
calls are those of programs that start at or after `warmup_s`, as in every report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.costs import LATENCY_S, CostModel, page_touch_probs
from ..models.catalog import Catalog
from ..models.cluster import Cluster
from ..models.trace import Trace
from ..traces.graph import children_of, handoff_calls, reachable


@dataclass(frozen=True)
class PageFloor:
    handoff_p95_s: float      # expected P95 of handoff stall from page faults alone
    stall_total_s: float      # expected total stall from page faults alone
    handoff_calls: int        # counted handoff calls (those a cancel may drop count as 0)
    moe_calls: int            # counted calls of MoE models that no cancel can drop
    kept: dict = field(default_factory=dict)  # MoE model -> (pages kept at most, seconds a missing page)


def most_pages(cluster: Cluster, cost: CostModel, m) -> tuple[int, float]:
    """(pages, seconds a page): the most expert pages of `m` one group can hold beside its dense
    part and engine, and the time one more takes from host DRAM there; of the groups holding the
    most, the fastest."""
    best = None
    for g in cluster.model_groups(m):
        gpus = [cluster.gpus[i] for i in g]
        room = min(cluster.usable_hbm_bytes(x) - cluster.gpu_kinds[x.kind].engine_overhead_gb * 1e9 for x in gpus)
        pages = max(0, int((room - m.dense_bytes / m.tp) // (m.moe.page_bytes / m.tp)))
        # bytes over the link alone: pages loaded together pay the link's latency once
        t = cost.group_transfer_s(m.moe.page_bytes, "host", gpus[0].node, g) - LATENCY_S["host"]
        if best is None or (pages, -t) > (best[0], -best[1]):
            best = (min(pages, m.moe.pages), t)
    return best if best is not None else (0, 0.0)


def page_floor(cluster: Cluster, catalog: Catalog, trace: Trace, cost: CostModel | None = None,
               warmup_s: float = 0.0, draws: int = 400, seed: int = 0) -> PageFloor:
    """The page floor of `trace` (see the module), the P95 expected over `draws` page draws."""
    cost = cost or CostModel(cluster, catalog)
    kept, tail = {}, {}
    for m in catalog.models:
        if m.moe is not None and cluster.model_groups(m):
            k, t = most_pages(cluster, cost, m)
            kept[m.name] = (k, round(t, 6))
            tail[m.name] = (np.sort(page_touch_probs(m.moe))[::-1][k:], t)
    handoff, moe = [], []  # (model or None: a call a cancel may drop), in program order
    for p in trace.programs:
        if p.start < warmup_s:
            continue
        kids = children_of(p)
        maybe = set().union(*(reachable(kids, c.node) for c in p.cancel)) if p.cancel else set()
        hand = handoff_calls(p)
        for n in p.nodes:
            if n.kind != "call":
                continue
            sure = n.id not in maybe
            if n.id in hand:
                handoff.append(n.model if sure else None)
            if sure and n.model in tail:
                moe.append(n.model)
    total = sum(float(tail[m][0].sum()) * tail[m][1] for m in moe)
    p95 = 0.0
    if handoff:
        rng = np.random.default_rng(seed)
        stall = np.zeros((draws, len(handoff)))
        for name, (probs, t) in tail.items():
            idx = [i for i, m in enumerate(handoff) if m == name]
            if idx and len(probs):
                stall[:, idx] = (rng.random((draws, len(idx), len(probs))) < probs).sum(axis=2) * t
        p95 = float(np.percentile(stall, 95, axis=1).mean())
    return PageFloor(round(p95, 6), round(total, 6), len(handoff), len(moe), kept)
