"""What the live view (`GET /ui`) shows, read off the books: per GPU its HBM by kind of state and
its engines, per node DRAM and NVMe, the transfers in flight, the leases, and the stall histogram
of the last hour. An operator sees everything; a runtime token sees the cluster's totals, the
transfers of weights and expert pages, and only its own tenant's KV, leases and calls."""

from __future__ import annotations

import bisect
import math

from ..models.cluster import GB
from .journal import gpu_tier
from .programs import unscoped

STALL_EDGES_S = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
WINDOW_S = 3600.0
KIND = {"w": "weights", "kv": "kv", "e": "experts"}


def ui_state(p, tenant: str | None = None) -> dict:
    """The view of live planner `p`; `tenant` set: a runtime's view (its own programs only)."""
    mine = (lambda prog: True) if tenant is None else (lambda prog: _tenant_of(p, prog) == tenant)
    gpus = []
    for g in p.cluster.gpus:
        by_kind = {"weights": 0.0, "kv": 0.0, "experts": 0.0}
        loading = 0.0
        for (key, _group), c in p.tiers.on_gpu[g.index].items():
            if c.ready:
                by_kind[KIND[key[0]]] += c.nbytes
            else:
                loading += c.nbytes
        used = p.tiers.hbm_used[g.index]
        gpus.append({"index": g.index, "id": g.id, "node": g.node, "kind": g.kind, "capacity": p.tiers.hbm_cap[g.index],
                     "used": used, **by_kind, "loading": loading,
                     "engine": max(0.0, used - loading - sum(by_kind.values())),
                     "engines": [{"model": k[1], "group": gpu_tier(grp), "state": _engine_state(p, k, grp, e)}
                                 for (k, grp), e in sorted(p.tiers.engines.items(), key=lambda x: (x[0][1], x[0][0]))
                                 if g.index in grp]})
    store = sum(b for m in p.catalog.models for _, b in p.object_sizes(m))  # on every node's NVMe (DESIGN.md §4)
    nodes = []
    for n in p.cluster.nodes:
        host = {"weights": 0.0, "kv": 0.0, "experts": 0.0}
        for (key, node), hc in p.tiers.host.items():
            if node == n.name:
                host[KIND[key[0]]] += hc.nbytes
        nodes.append({"name": n.name, "dram_capacity": p.tiers.host_cap[n.name], "dram_used": p.tiers.host_used[n.name],
                      **{f"dram_{k}": v for k, v in host.items()},
                      "nvme_capacity": n.nvme_gb * GB, "nvme_used": store})
    transfers = []
    for rec in sorted(p.ops.values(), key=lambda r: r.order):
        op = rec.op
        if op.object[0] == "kv" and not mine(op.object[1]):
            continue
        expected = p.cost.transfer_s(op.bytes, op.src, op.dst) if op.src != "none" and op.dst != "none" else 0.0
        elapsed = max(0.0, p.now - rec.issued_s)
        obj = [op.object[0], unscoped(op.object[1]), *op.object[2:]] if op.object[0] == "kv" and tenant else op.object
        transfers.append({"op": op.op_id, "kind": op.kind, "object": obj, "src": op.src, "dst": op.dst,
                          "bytes": op.bytes, "node": rec.node, "elapsed_s": round(elapsed, 3),
                          "expected_s": round(expected, 3),
                          "progress": round(min(1.0, elapsed / expected), 3) if expected > 0 else None})
    leases = []
    for lease in sorted(p.ledger.leases.values(), key=lambda x: x.created_s, reverse=True):
        req = lease.request
        if tenant is not None and req.tenant != tenant:
            continue
        program = unscoped(req.program) if tenant else req.program
        leases.append({"lease_id": lease.lease_id, "program": program, "model": req.model,
                       "state": lease.state.name.lower(),
                       "deadline_in_s": round(req.deadline_s - p.now, 3), "confidence": req.confidence,
                       "reason": lease.reason.replace(req.program, program)})
        if len(leases) >= 200:
            break
    return {"now": p.now, "plan_version": p.plan_version, "cluster": p.cluster.name, "gpus": gpus, "nodes": nodes,
            "transfers": transfers, "leases": leases, "stalls": _stalls(p, mine), "scope": tenant or "all"}


def _engine_state(p, key, group, engine) -> str:
    """asleep, starting (its weights still loading onto the group) or awake."""
    if engine.asleep:
        return "asleep"
    c = p.tiers.gpu.get((key, group))
    return "starting" if c is not None and not c.ready else "awake"


def _tenant_of(p, program: str) -> str | None:
    rec = p.programs.get(program)
    return rec.tenant if rec is not None else None


def _stalls(p, mine) -> dict:
    """Calls started in the last hour, by stall (the histogram's last bin is open-ended)."""
    counts, handoff = [0] * len(STALL_EDGES_S), [0] * len(STALL_EDGES_S)
    since = p.now - WINDOW_S
    for rec in p.programs.values():
        if not mine(rec.program):
            continue
        for row in rec.calls.values():
            if row.get("started_s") is None or row["started_s"] < since or "stall_s" not in row:
                continue
            stall = row["stall_s"]
            i = max(0, bisect.bisect_right(STALL_EDGES_S, stall) - 1) if math.isfinite(stall) else len(counts) - 1
            counts[i] += 1
            if row.get("handoff"):
                handoff[i] += 1
    return {"edges_s": list(STALL_EDGES_S), "counts": counts, "handoff_counts": handoff, "window_s": WINDOW_S,
            "n": sum(counts)}
