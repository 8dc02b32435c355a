"""The MILP instance of a trace on a cluster and catalog (`build_instance`)."""

from __future__ import annotations

import numpy as np

from ...core.costs import page_touch_probs
from ...traces.timeline import nominal_timeline
from .instance import Call, Instance, Obj


def _group_name(g: tuple[int, ...]) -> str:
    return "-".join(str(i) for i in g)


def build_instance(cluster, catalog, trace, cost, max_slots: int | None = None, lam: float = 1e-12,
                   hot_touch: float = 0.5, replicas: int = 2) -> tuple[Instance, dict]:
    """The MILP instance of a whole trace. Slots are aligned to call arrivals of the zero-stall
    timeline: one slot per distinct arrival time, or `max_slots` cut at arrival quantiles; a call
    spans the slots from its arrival to its end there. Each model gets up to `replicas` candidate
    GPU groups, spread like homes (largest models first, each replica onto the fitting group with
    most HBM left); its object on a group is its dense weights plus the expert pages a call
    touches with P >= `hot_touch`. A program's KV for a model is an object per candidate group,
    from that model's first call in the program to the program's end; its "NVMe" restore is a
    recompute. A call's options are the candidate groups (weights and KV there), chosen once per
    program and model, and waiting (stall: its zero-stall duration plus a cold load of its
    weights). Returns (instance, index) where index maps names back to trace entities."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    tl = nominal_timeline(trace, catalog)
    calls = sorted(((tl[(p.program, n.id)][0], p.program, n.id, n) for p in trace.programs for n in p.nodes
                    if n.kind == "call" and (p.program, n.id) in tl), key=lambda c: (c[0], c[1], c[2]))
    times = np.array([c[0] for c in calls]) if calls else np.zeros(1)  # no call: one empty slot
    if max_slots is None:
        edges = np.unique(times)
    else:
        edges = np.unique(np.quantile(times, np.linspace(0, 1, max_slots + 1)[:-1], method="lower"))
    end = max((e for (_, e) in tl.values()), default=0.0)
    bounds = np.append(edges, max(end, edges[-1] + 1.0))
    slot_s = tuple(float(x) for x in np.diff(bounds))
    slot_of = lambda t: int(np.searchsorted(edges, t, side="right") - 1)  # noqa: E731
    T = len(slot_s)
    gpus = cluster.gpus
    left = [cluster.usable_hbm_bytes(g) for g in gpus]
    homes: dict[str, list] = {}
    objs, index = [], {"objects": [], "calls": [], "homes": homes}
    max_kv: dict[str, float] = {}  # a home must hold the model with its largest call's KV
    for _, _, _, n in calls:
        kv = (n.context_tokens + n.output_tokens) * catalog.by_name[n.model].kv_bytes_per_token
        max_kv[n.model] = max(max_kv.get(n.model, 0.0), kv)
    w_index: dict[tuple, int] = {}
    for r in range(replicas):
        for m in sorted(catalog.models, key=lambda m: (-m.total_bytes, m.name)):
            if r > 0 and m.name not in homes:
                continue
            hot = int((page_touch_probs(m.moe) >= hot_touch).sum()) if m.moe else 0
            nbytes = m.dense_bytes + hot * (m.moe.page_bytes if m.moe else 0.0)
            need = (nbytes + max_kv.get(m.name, 0.0)) / m.tp
            taken = {i for g in homes.get(m.name, ()) for i in g}
            fit = [g for g in cluster.model_groups(m) if not taken & set(g)
                   and all(need <= cluster.usable_hbm_bytes(gpus[i]) for i in g)]
            if not fit:
                continue
            g = max(fit, key=lambda g: (min(left[i] for i in g), [-i for i in g]))
            for i in g:
                left[i] -= nbytes / m.tp
            homes.setdefault(m.name, []).append(g)
            node = gpus[g[0]].node
            extra = nbytes - m.dense_bytes
            w_index[(m.name, g)] = len(objs)
            objs.append(Obj(f"w:{m.name}@{_group_name(g)}", g, node, nbytes,
                            # from host: the engine sleeps on its home group (a wake; optimistic, so the bound holds)
                            cost.weights_restore_s(m, "host", node, g, extra, wake=True),
                            cost.weights_restore_s(m, "nvme", node, g, extra), (0, T - 1)))
    prog_end = {}
    for p in trace.programs:
        ends = [tl[(p.program, n.id)][1] for n in p.nodes if (p.program, n.id) in tl]
        prog_end[p.program] = slot_of(max(ends)) if ends else 0
    kv_calls: dict[tuple, list] = {}
    for t0, prog, nid, n in calls:
        kv_calls.setdefault((prog, n.model), []).append((slot_of(t0), nid, n))
    kv_index: dict[tuple, int] = {}
    for (prog, model), cs in sorted(kv_calls.items()):
        m = catalog.by_name[model]
        tokens = max(n.context_tokens + n.output_tokens for _, _, n in cs)
        nbytes = tokens * m.kv_bytes_per_token
        first = cs[0][0]
        for g in homes.get(model, ()):
            kv_index[(prog, model, g)] = len(objs)
            recompute = cost.prefill_s(m, tokens, g)
            # from DRAM: onboard it, or recompute it where that is quicker (R^h <= R^n, as (6) assumes)
            objs.append(Obj(f"kv:{prog}:{model}@{_group_name(g)}", g, gpus[g[0]].node, nbytes,
                            min(cost.group_transfer_s(nbytes, "host", gpus[g[0]].node, g), recompute), recompute,
                            (first, max(first, prog_end[prog]))))
    affinities: dict[tuple, int] = {}
    out_calls = []
    for t0, prog, nid, n in calls:
        groups = homes.get(n.model)
        if not groups:
            continue
        first = (prog, n.model) not in affinities
        a = affinities.setdefault((prog, n.model), len(affinities))
        options = [(w_index[(n.model, g)], kv_index[(prog, n.model, g)]) for g in groups]
        produces = tuple(kv_index[(prog, n.model, g)] for g in groups) if first else ()
        t1 = tl[(prog, nid)][1]
        wait_s = (t1 - t0) + max(objs[w_index[(n.model, g)]].restore_nvme_s for g in groups)
        out_calls.append(Call(f"{prog}/{nid}", slot_of(t0), options[0], produces,
                              end=max(slot_of(t0), slot_of(max(t0, t1 - 1e-9))), alts=tuple(options[1:]),
                              affinity=a, wait_s=wait_s))
        index["calls"].append((prog, nid))
    nodes = {nd.name: nd for nd in cluster.nodes}
    inst = Instance(slot_s=slot_s, objects=tuple(objs), calls=tuple(out_calls),
                    hbm=tuple(cluster.usable_hbm_bytes(g) for g in gpus),
                    h2d=tuple(cost.link_bw[f"h2d:{g.id}"] for g in gpus),
                    dram={n: nd.host_dram_gb * 1e9 for n, nd in nodes.items()},
                    root={n: cost.link_bw[f"root:{n}"] for n in nodes},
                    nvme={n: cost.link_bw[f"nvme_r:{n}"] for n in nodes}, lam=lam)
    index["objects"] = [o.name for o in objs]
    index["slot_starts"] = [float(x) for x in edges]
    return inst, index
