"""Where the planning step puts a model's weights when it has no copy (its home) and when calls
queue at its only copy (a replica). Both are chosen against the view now, one model at a time.

A home that takes the most free HBM lands, between calls, on GPUs another model will want back:
an idle tp-4 group whose MoE model has shed its expert pages looks free, and a 30 GB model homed
there is evicted by the next call's pages, re-homed, and evicted again (warm mapreduce, tuning
seeds 7-8: handoff P95 1.7-2.6 s against forecast-prewarm's 0.3-0.4). By default the most free
HBM is counted less the hot pages such a model lacks (`pages_owed`) and plus the idle copies of
models no call has asked for (`idle_room`). With `share` set instead, a home first avoids GPUs
that hold the weights of models at least `share` x as likely to be needed, and counts the idle
state of models less likely than that as room: roughly what the mechanism would evict for it.
Off by default: on evaluation seeds it homes bursty small models on small clear GPUs, where
their calls queue for KV room (docs/experiments.md). Replicas (`scale_out`) take the most free
HBM as it is, on a group whose empty HBM holds the model's typical call beside its weights."""

from __future__ import annotations

from collections import Counter

from ..core.decisions import Promote
from ..models.cluster import GB
from ..models.state import weights_key


def layout(catalog, cluster, homes) -> dict[str, tuple[int, ...]]:
    """An operator's layout (`PlannerConfig.homes`: ((model, (GPU index, ...)), ...)) as
    {model: group}, each entry checked against the catalog and the groups the cluster lets that
    model run on; a bad entry is named by its position."""
    out: dict[str, tuple[int, ...]] = {}
    for i, entry in enumerate(homes or ()):
        try:
            name, group = entry
            group = tuple(sorted(group))  # the same GPUs in any order
        except (TypeError, ValueError):
            group = None
        if group is None or not isinstance(name, str) or not all(type(g) is int for g in group):
            raise ValueError(f"homes[{i}]: expected (model name, (GPU index, ...)), got {entry!r}")
        m = catalog.by_name.get(name)
        if m is None:
            raise ValueError(f"homes[{i}]: no model {name!r} in catalog {catalog.name!r}")
        allowed = cluster.model_groups(m)
        if group not in allowed:
            raise ValueError(f"homes[{i}]: {name} (tp {m.tp}) cannot run on GPUs {group}; "
                             f"its groups: {', '.join(map(str, allowed))}")
        hbm = min(cluster.gpu_kinds[cluster.gpus[j].kind].hbm_gb * GB for j in group)
        if m.dense_bytes / m.tp > hbm:
            raise ValueError(f"homes[{i}]: {name}'s weights ({m.dense_bytes / m.tp / GB:.1f} GB a GPU) "
                             f"do not fit GPUs {group} ({hbm / GB:.0f} GB)")
        if name in out:
            raise ValueError(f"homes[{i}]: {name} is given a home twice")
        out[name] = group
    return out


def most_free(view, groups, need: float | None = None, extra=None):
    """Of `groups`, the one whose fullest GPU has the most free HBM (ties: the lower group), at
    least `need` bytes when given; None if none qualifies. `extra`: per GPU, bytes that count as
    free beside the free ones."""
    best, best_key = None, None
    for g in groups:
        free = min(view.tiers.hbm_cap[i] - view.tiers.hbm_used[i] + (extra[i] if extra else 0.0) for i in g)
        if (need is None or free >= need) and (best_key is None or (-free, g) < best_key):
            best, best_key = g, (-free, g)
    return best


def dense_fits(view, m) -> list:
    """The groups of `m` each of whose GPUs holds its share of the dense part, empty or not."""
    need = m.dense_bytes / m.tp
    return [g for g in view.model_groups(m) if all(need <= view.tiers.hbm_cap[i] for i in g)]


def home_of(view, m, p_idle=None, share: float | None = None, model_index=None, by_model=None, room=()):
    """Where model `m`, with no copy, would go: a group where its engine sleeps, else a group its
    dense part fits. With `share`, `p_idle` (per model, in `model_index` order, P(needed within
    the idle horizon)) and `by_model` (`resident_by_model`), in this order: the most free of the
    groups clear of the weights of the other models at least `share` x as likely as `m` with room
    for the dense part now; the same counting the idle state of the less likely models as room;
    any group with room now; the group with the most free HBM counting that idle state. Without:
    the most free, counting `room` (per GPU, bytes that count as free beside the free ones, less
    than 0 where more is owed than idle: `PlannerCore._home_room`) when given."""
    wk = weights_key(m.name)
    groups = view.model_groups(m)
    for g in groups:
        if view.tiers.asleep_on(wk, g):
            return g
    cap = view.tiers.hbm_cap
    need = m.dense_bytes / m.tp
    fits = dense_fits(view, m)
    if p_idle is None or share is None:
        return most_free(view, fits, extra=room or None)
    mi = model_index[m.name]
    p = share * p_idle[mi]
    idle = [0.0] * len(cap)
    taken: set = set()
    for oi, (idle_o, gpus_o) in enumerate(by_model):
        if oi == mi:
            continue
        if p_idle[oi] >= p:
            taken |= gpus_o
        else:
            idle = [a + b for a, b in zip(idle, idle_o)]
    clear = [g for g in fits if taken.isdisjoint(g)]
    return (most_free(view, clear, need) or most_free(view, clear, need, idle)
            or most_free(view, fits, need) or most_free(view, fits, extra=idle))


def resident_by_model(view, keys_by_model) -> list[tuple[list[float], frozenset]]:
    """Per model (`keys_by_model`: its weights key, then its expert pages' keys): the bytes per GPU
    of its copies that no call pins or runs on, and the GPUs holding its weights. Read once a
    planning step, for every model `home_of` homes in it."""
    gpu, groups_of, running = view.tiers.gpu, view.tiers.groups_of, view.running_models
    n = len(view.tiers.hbm_cap)
    out = []
    for keys in keys_by_model:
        idle = [0.0] * n
        for key in keys:
            for g in groups_of.get(key, ()):
                c = gpu[(key, g)]
                if c.pins == 0 and not running.get((key[1], g), 0):
                    for i in g:
                        idle[i] += c.per_gpu
        out.append((idle, frozenset(i for g in groups_of.get(keys[0], ()) for i in g)))
    return out


def idle_room(view, keys_by_model) -> list[float]:
    """Per GPU, the idle bytes (`resident_by_model`) of the models of `keys_by_model` together:
    state that counts as room for a new home (`PlannerConfig.uncalled_room_after_s`)."""
    room = [0.0] * len(view.tiers.hbm_cap)
    for idle, _ in resident_by_model(view, keys_by_model):
        room = [a + b for a, b in zip(room, idle)]
    return room


def pages_owed(view, moe) -> list[float]:
    """Per GPU, the bytes of hot expert pages that a MoE model whose weights are in HBM does not
    hold there: its working set, which a new home must leave free (`PlannerConfig.home_keeps_pages`).
    Between calls the step sheds such pages and the GPUs look free; a model homed into that room is
    evicted by the MoE model's next call or pushes it onto other GPUs. `moe`: per MoE model, its
    weights key, its pages' keys in page order, its hot pages' indices and one page's bytes."""
    owed = [0.0] * len(view.tiers.hbm_cap)
    gpu = view.tiers.gpu
    for wk, page_keys, hot, page_bytes in moe:
        for g in view.tiers.groups_of.get(wk, ()):
            missing = sum(1 for p in hot if (page_keys[p], g) not in gpu) * page_bytes / len(g)
            for i in g:
                owed[i] += missing
    return owed


def scale_out(view, catalog, now: float, wait_s: float | None, calls: int | None = None,
              fits_typical: bool = True) -> list:
    """A second replica where calls queue at a home that holds too few of them at once (a 40 GB
    GPU beside 30 GB of weights): a dense model with a call that has waited `wait_s` for HBM, and
    no copy on a group clear of its waiting calls' GPUs, has its weights promoted onto such a
    group with room for them now (the most free HBM), as an autoscaler adds a replica on queue
    depth. With `fits_typical`, only onto a group that, empty, would hold the weights beside the KV
    room the model's typical call asks for (`OutputEstimate.typical_asked`, from finished calls;
    none finished: the weights alone): on one with less (a 65 GB model on two 40 GB GPUs) a
    replica runs few of its calls and is evicted unused by the next call that needs those GPUs.
    With `calls`, so do `calls` of its calls waiting at one group, however briefly (either
    trigger alone when the other is None). A view that keeps each model's oldest waiting call and
    queue depth per group (`queue_oldest`, `queue_depth`, the simulator's) is read without a pass
    over the queue."""
    waited = []
    if wait_s is not None:
        oldest = getattr(view, "queue_oldest", None)
        if oldest is not None:
            waited = [(m, g) for (m, g), t in oldest().items() if now - t >= wait_s]
        else:
            waited = [(m, g) for m, g, _, w in view.admission_queue() if w >= wait_s]
    if calls is not None:
        kept = getattr(view, "queue_depth", None)
        if kept is not None:
            depth = kept()
        else:
            depth = Counter((m, g) for m, g, _, _ in view.admission_queue())
        waited += [mg for mg, k in depth.items() if k >= calls]
    stuck: dict[str, set] = {}
    for model, group in waited:
        stuck.setdefault(model, set()).update(group)
    cap, overhead, est = view.tiers.hbm_cap, view.tiers.engine_overhead, view.output_estimate
    out = []
    for m in catalog.models:
        busy = stuck.get(m.name)
        if busy is None or m.moe is not None:
            continue
        wk = weights_key(m.name)
        held = view.tiers.groups_of.get(wk, ())
        if any(busy.isdisjoint(g) for g in held):
            continue  # a replica clear of the queue exists (or is loading)
        # per GPU, empty: the weights and the KV of the model's typical call
        tokens = (est.typical_asked(m.name) or 0.0) if fits_typical else 0.0
        need = (m.dense_bytes + tokens * m.kv_bytes_per_token) / m.tp
        clear = [g for g in view.model_groups(m)
                 if busy.isdisjoint(g) and all(need + overhead[i] <= cap[i] for i in g)]
        best = most_free(view, clear, m.dense_bytes / m.tp)
        if best is not None:
            out.append(Promote(wk, best))
    return out
