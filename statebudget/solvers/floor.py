"""The page floor: the stall that expert-page faults alone force on a policy that cannot foresee
which expert pages a call will touch (no real router can: a call's experts are chosen as its
tokens run).

A call of a MoE model touches page i with probability `page_touch_probs(moe)[i]`, drawn per call
(`sim/programs.py`), independently of everything before it. On the group where it runs, at most
`k` of the model's pages are resident or loading when it arrives: as many as one GPU of any of
the model's groups holds beside its share of the dense part (usable HBM, `hbm_reserve_frac` held
back; no engine or KV counted). Each page it touches beyond those crosses the links after it
arrives, at least `t` seconds a page: the page's bytes at the fastest host-to-GPU rate of any of
the model's groups (`CostModel.group_transfer_s`, latency left out). Of all sets of at most `k`
pages the `k` most touched leave the fewest touched pages out, in distribution, so with S the
pages missing beyond the `k` most touched,

    stall >= t x S      for each call, in distribution, whatever the policy did before.

The expected total follows by summing over the counted calls. For the P95: each call's draw is
independent of what came before it, so the calls can be coupled one by one, in arrival order,
with independent copies of S that are at most their own t x (pages found missing); a percentile
only grows with its values, hence the expected handoff-stall P95 is at least that of the vector
t x S over the handoffs, every other stall taken as 0.

What keeps it a floor: `k` and `t` are each the best over the model's groups, even where no group
has both, and each model gets them even where two models' best groups overlap. Calls that a
cancel may drop count 0 in the P95 and are left out of the total; dropped (unplaceable) calls are
assumed not to happen. Placement must not read which pages the call will touch, nor how many:
this simulator's policies do not (docs/model.md). A call routed again after a refusal is known to
touch more than the refusing group holds; given the count the `k` most touched pages still leave
the fewest out on average, so the total's floor stands for it, while the P95's coupling assumes
its group is chosen without it. Counted calls are those of programs that start at or after
`warmup_s`, as in every report.
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
    """(pages, seconds a page): the most expert pages of `m` one GPU of any of its groups holds
    beside its share of the dense part (no engine counted), and the least time a page takes from
    host DRAM onto any of its groups, each taken over the groups separately."""
    pages, t = 0, None
    for g in cluster.model_groups(m):
        gpus = [cluster.gpus[i] for i in g]
        room = min(cluster.usable_hbm_bytes(x) for x in gpus) - m.dense_bytes / m.tp
        pages = max(pages, int(room // (m.moe.page_bytes / m.tp)))
        # bytes over the links alone: pages loaded together pay the link's latency once
        tg = cost.group_transfer_s(m.moe.page_bytes, "host", gpus[0].node, g) - LATENCY_S["host"]
        t = tg if t is None else min(t, tg)
    return (min(pages, m.moe.pages), t) if t is not None else (0, 0.0)


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
