"""The zero-stall timeline of a trace: when each node would start and end if every state object
were always ready and no call queued. Used by `trace stats` (concurrently active models) and by
the offline oracle (slots aligned to events)."""

from __future__ import annotations

import heapq

from ..models.catalog import Catalog
from ..models.cluster import Cluster, GpuKind, Node
from ..models.trace import Trace
from ..core.costs import CostModel
from .graph import children_of, reachable

# A reference machine for nominal call durations: 8 A100-40G on one node.
REFERENCE = Cluster(name="reference", gpu_kinds={"A100-40G": GpuKind(
    hbm_gb=40, hbm_gbps=1555, h2d_gbps=25, d2h_gbps=25, tflops=312, wake_s=0.5, cold_start_s=35)},
    nodes=[Node(name="ref", host_dram_gb=1024, nvme_gb=8000, nvme_read_gbps=7, nvme_write_gbps=5, root_gbps=50,
                gpus={"A100-40G": 8})])


def nominal_timeline(trace: Trace, catalog: Catalog | None, cluster: Cluster = REFERENCE) -> dict:
    """{(program, node): (start, end)} with cancels applied (a cancelled node never runs). Calls on
    models missing from the catalog take a nominal 8B-model time."""
    cost = CostModel(cluster, catalog) if catalog is not None else None
    out = {}
    for p in trace.programs:
        by_id = {n.id: n for n in p.nodes}
        children = children_of(p)
        deps = {n.id: len(n.after) for n in p.nodes}
        cancels: dict[str, list[str]] = {}
        for c in p.cancel:
            cancels.setdefault(c.at_after, []).append(c.node)
        cancelled: set[str] = set()
        heap = [(p.start, n.id) for n in p.nodes if not n.after]
        heapq.heapify(heap)
        ready_at: dict[str, float] = {}
        while heap:
            t, nid = heapq.heappop(heap)
            if nid in cancelled:
                continue
            n = by_id[nid]
            dur = n.duration if n.kind == "tool" else _call_s(cost, catalog, n)
            out[(p.program, nid)] = (t, t + dur)
            for v in cancels.get(nid, ()):
                if v in out and out[(p.program, v)][1] > t + dur:
                    del out[(p.program, v)]
                cancelled.update(reachable(children, v))
            for ch in children.get(nid, ()):
                deps[ch] -= 1
                ready_at[ch] = max(ready_at.get(ch, 0.0), t + dur)
                if deps[ch] == 0:
                    heapq.heappush(heap, (ready_at[ch], ch))
    return out


def _call_s(cost: CostModel | None, catalog: Catalog | None, n) -> float:
    if cost is None or n.model not in catalog.by_name:
        return n.context_tokens * 2 * 8e9 / 156e12 + n.output_tokens * 16e9 / 1555e9
    m = catalog.by_name[n.model]
    group = tuple(range(min(m.tp, 8)))
    return cost.call_s(m, n.context_tokens, n.output_tokens, group)
