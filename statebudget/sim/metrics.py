"""Turns a simulation's call records into the §8 report block, with the §4 definitions. With a
warm-up (`SimConfig.warmup_s`) every call and program figure counts only the calls of the programs
that started at or after it (`counted_calls`) (the recorder already counts bytes and the warm
tax from it on)."""

from __future__ import annotations

import numpy as np

from collections import Counter

from ..core.costs import CostModel
from ..models.report import DecisionMs, Dist, HandoffTail, ModelStall, PolicyReport
from ..models.trace import ttft_bound
from .engine import SimResult

SLO_KS = (2, 5, 10)  # SLO attainment is reported at TTFT <= k x ideal TTFT for these k (§4)


def counted_calls(res: SimResult) -> list:
    """The calls the metrics count: those of programs that start at or after the warm-up. By
    program start, not by arrival: in the closed loop a call's arrival depends on the policy, and
    paired comparisons need the same calls under every policy."""
    w = getattr(res, "warmup_s", 0.0)
    if w <= 0:
        return list(res.calls)
    return [c for c in res.calls if res.programs[c.program].prog.start >= w]


def counted_done(res: SimResult) -> list:
    """The counted calls that completed: those every figure of a call is taken over."""
    return [c for c in counted_calls(res) if c.state == "done"]


def group_label(group) -> str:
    """A GPU group as the report names it: its GPU indices, "12,13,14,15"."""
    return ",".join(map(str, group))


def counted_programs(res: SimResult) -> list:
    """The programs the metrics count: those that started at or after the warm-up."""
    w = getattr(res, "warmup_s", 0.0)
    return [pr for pr in res.programs.values() if pr.prog.start >= w]


class IdealTTFT:
    """Ideal TTFT of a call (§4): prefill of its whole context plus one decode step on the fastest
    GPU kind that can host its model (a group of `tp` GPUs of that kind exists and its HBM holds
    the model's weights), all state resident, no queueing. None when no group can host it."""

    def __init__(self, cost: CostModel):
        self.cost = cost
        self._groups: dict[str, list] = {}  # model -> one group per GPU kind that can host it

    def hosts(self, model: str) -> list:
        g = self._groups.get(model)
        if g is None:
            cl, m = self.cost.cluster, self.cost.catalog.by_name[model]
            by_kind = {}
            for group in cl.model_groups(m):
                kind = cl.gpus[group[0]].kind
                if kind not in by_kind and m.dense_bytes / m.tp <= min(cl.usable_hbm_bytes(cl.gpus[i]) for i in group):
                    by_kind[kind] = group
            g = self._groups[model] = list(by_kind.values())
        return g

    def __call__(self, model: str, context_tokens: float) -> float | None:
        m = self.cost.catalog.by_name[model]
        times = [self.cost.prefill_s(m, context_tokens, g) + self.cost.decode_s(m, 1, context_tokens, g)
                 for g in self.hosts(model)]
        return min(times) if times else None


def ttft_ratios(res: SimResult) -> list[float]:
    """TTFT / ideal TTFT of every counted finished call whose model some group can host."""
    return [r for _, r in model_ratios(res.cost, counted_done(res))]


def model_ratios(cost: CostModel, calls) -> list[tuple[str, float]]:
    """(model, TTFT / ideal TTFT) of each of `calls` whose model some group can host, in order:
    priced once for the policy's figures and each model's (hosting depends on the model alone)."""
    ideal = IdealTTFT(cost)
    out = []
    for c in calls:
        base = ideal(c.model, c.context_tokens)
        if base:
            out.append((c.model, (c.first_token - c.arrive) / base))
    return out


def attainment_curve(ratios, ks) -> np.ndarray:
    """Share of calls whose TTFT / ideal TTFT is at most k, for each k of `ks` (0 with no call)."""
    r = np.asarray(ratios, dtype=float)
    return np.array([(r <= k).mean() if r.size else 0.0 for k in ks])


def attainment(ratios: list[float]) -> dict[str, float]:
    """The report's `slo_attainment`: `attainment_curve` at each k of `SLO_KS`."""
    return {str(k): round(float(a), 9) for k, a in zip(SLO_KS, attainment_curve(ratios, SLO_KS))}


def total_stall(res: SimResult) -> float:
    """The report's `stall_total_s` from a result: stall summed over the counted calls that finished."""
    return sum(c.ready - c.arrive for c in counted_done(res))


def slo_metrics(done: list, cost: CostModel, ratios: list | None = None) -> dict:
    """`ttft_slowdown`, `slo_attainment` at k = 2, 5, 10 and `stall_total_s` over finished calls
    (`ratios`: their `model_ratios`, where the caller has them)."""
    ratios = [r for _, r in (model_ratios(cost, done) if ratios is None else ratios)]
    return {
        "ttft_slowdown": Dist.of(ratios),
        "slo_attainment": attainment(ratios),
        "stall_total_s": round(float(sum(c.ready - c.arrive for c in done)), 9),
    }


def program_metrics(res: SimResult, nominal: dict | None) -> dict:
    """Seed 003's program-level figures. slowdown = program latency / its zero-stall latency on the
    reference machine (`traces/timeline.py`); max_wait = the longest a call of the program waited
    between arriving and starting (stall + queueing)."""
    done = [pr for pr in counted_programs(res) if pr.end >= 0]
    latency = {pr.prog.program: pr.end - pr.prog.start for pr in done}
    forkjoin = [latency[pr.prog.program] for pr in done if any(len(n.after) >= 2 for n in pr.prog.nodes)]
    slowdown = []
    if nominal is not None:
        for pr in done:
            spans = [nominal[(pr.prog.program, n.id)] for n in pr.prog.nodes if (pr.prog.program, n.id) in nominal]
            if spans:
                base = max(e for _, e in spans) - pr.prog.start
                if base > 0:
                    slowdown.append(latency[pr.prog.program] / base)
    max_wait = []
    service: Counter = Counter()
    for pr in done:
        waits = [c.start - c.arrive for c in pr.calls.values() if c.state == "done"]
        if waits:
            max_wait.append(max(waits))
        service[pr.prog.tenant] += pr.service
    total = sum(service.values())
    hours = (res.sim_end - getattr(res, "warmup_s", 0.0)) / 3600.0
    return {
        "makespan_s": Dist.of(forkjoin),
        "slowdown": Dist.of(slowdown),
        "max_wait_s": Dist.of(max_wait),
        "programs_per_hour": round(len(done) / hours, 6) if hours > 0 else 0.0,
        "tenant_service_share": {t: round(v / total, 6) for t, v in sorted(service.items())} if total else {},
        "kv_actions": {k: res.kv_actions.get(k, 0) for k in ("preserve", "swap", "discard")},
        "kv_hbm_byte_s": round(res.kv_hbm_byte_s, 3),
        "recomputed_tokens": res.recomputed_tokens,
        "ttl_error_s": Dist.of(res.ttl_errors),
        "failed_attempts": res.failed_attempts,
        "failed_service_s": round(res.failed_service_s, 6),
        "moved_calls": res.moved_calls,
        "page_refusals": res.page_refusals,
        "preemptions": res.preemptions,
        "queue_switches": res.queue_switches,
    }


def hbm_wait_s(c) -> float:
    """Of a completed call's stall, the seconds it waited for HBM room: from its arrival to its
    admission (`CallRec.admitted`; a call the starvation reservation holds back waits too), the
    rest of `ready - arrive` being loading (which includes the drain of the copies evicted for it,
    so this is the least of what room cost)."""
    return c.admitted - c.arrive


def stall_by_model(done: list, ratios: list | None = None) -> dict[str, ModelStall]:
    """Per model (sorted by name): its completed calls' stall and TTFT, their SLO attainment from
    `ratios` (the calls' `model_ratios`; none: left empty, as for a model no group hosts), and the
    groups they ran on, most used first. A policy's total hides which model stalls where; this is
    where to look first."""
    by: dict[str, list] = {}
    for c in done:
        by.setdefault(c.model, []).append(c)
    of_model: dict[str, list] = {}
    for model, r in ratios or ():
        of_model.setdefault(model, []).append(r)
    out = {}
    for model in sorted(by):
        cs = by[model]
        stall = [c.ready - c.arrive for c in cs]
        wait = [hbm_wait_s(c) for c in cs]
        groups = Counter(group_label(c.group) for c in cs)
        out[model] = ModelStall(calls=len(cs), stall_total_s=round(float(sum(stall)), 9), stall_s=Dist.of(stall),
                                handoff_stall_s=Dist.of(s for s, c in zip(stall, cs) if c.handoff),
                                groups=_most_first(groups),
                                hbm_wait_total_s=round(float(sum(wait)), 9),
                                handoff_stall_total_s=round(float(sum(s for s, c in zip(stall, cs) if c.handoff)), 9),
                                handoff_hbm_wait_total_s=round(float(sum(w for w, c in zip(wait, cs) if c.handoff)), 9),
                                ttft_s=Dist.of(c.first_token - c.arrive for c in cs),
                                slo_attainment=attainment(of_model[model]) if model in of_model else {})
    return out


_LOAD_KINDS = {"w": "weights", "e": "pages", "kv": "kv"}


def handoff_tail(done: list) -> HandoffTail:
    """The completed handoff calls whose stall is above 0 and at least the handoff-stall P95 (the
    P95 of `PolicyReport.handoff_stall_s`), their stall split as `HandoffTail` says: room from
    arrival until the call's own loads could start (`CallRec.loads_at`: admission, then the drain
    of the copies evicted for it), loading after it, by the kind it waited for last."""
    handoffs = [c for c in done if c.handoff]
    if not handoffs:
        return HandoffTail()
    p95 = Dist.of(c.ready - c.arrive for c in handoffs).p95
    # the P95 is rounded (`Dist`); equal stalls differ in their last bits: none is left out for that
    tail = [c for c in handoffs if c.ready - c.arrive > 0 and c.ready - c.arrive >= p95 - 1e-9]
    secs = dict.fromkeys(("room", *_LOAD_KINDS.values()), 0.0)
    calls: Counter = Counter()
    for c in tail:
        room, loading = c.loads_at - c.arrive, c.ready - c.loads_at
        secs["room"] += room
        if loading > 0:  # it waited for a copy, and the simulator names the last one's kind
            secs[_LOAD_KINDS[c.last_load]] += loading
        calls["room" if room >= loading else _LOAD_KINDS[c.last_load]] += 1
    return HandoffTail(calls=len(tail), p95_s=p95, stall_s=round(float(sum(c.ready - c.arrive for c in tail)), 9),
                       **{f"{k}_s": round(float(v), 9) for k, v in secs.items()}, by_cause=_most_first(calls),
                       models=_most_first(Counter(c.model for c in tail)))


def _most_first(counts: Counter) -> dict[str, int]:
    """Counts, most first, ties by name: the same order in every report of the same run."""
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def short_of_room(by_model: dict[str, ModelStall], total_stall_s: float, share: float = 0.5,
                  of_total: float = 0.1) -> list[str]:
    """The models (most waiting first) whose stall is mostly the wait for HBM room (at least
    `share` of it) and matters (at least `of_total` of the run's stall): earlier prefetch cannot
    help them; room can (a replica, a bigger GPU, fewer other models beside them)."""
    short = [(m.hbm_wait_total_s, name) for name, m in by_model.items()
             if m.hbm_wait_total_s > 0 and m.hbm_wait_total_s >= share * m.stall_total_s
             and m.hbm_wait_total_s >= of_total * total_stall_s]
    return [name for _, name in sorted(short, key=lambda x: (-x[0], x[1]))]


def policy_report(res: SimResult, slo_classes: dict[str, float], nominal: dict | None = None,
                  cost: CostModel | None = None) -> PolicyReport:
    """The §8 block of one run. `cost`: the cost model ideal TTFT is priced with (default: the
    run's own, `res.cost`); without one the slowdown and attainment figures stay empty."""
    cost = cost if cost is not None else getattr(res, "cost", None)
    calls = counted_calls(res)
    done = [c for c in calls if c.state == "done"]
    stall = [c.ready - c.arrive for c in done]
    ttft = [c.first_token - c.arrive for c in done]
    programs = [pr.end - pr.prog.start for pr in counted_programs(res) if pr.end >= 0]
    ratios = model_ratios(cost, done) if cost is not None else None
    slo = slo_metrics(done, cost, ratios) if ratios is not None else {"stall_total_s": round(float(sum(stall)), 9)}
    slo_bad = sum(1 for c in done if c.first_token - c.arrive > ttft_bound(slo_classes, c.slo))
    dec = np.asarray(res.decision_ms) if res.decision_ms else np.zeros(1)
    return PolicyReport(
        stall_s=Dist.of(stall),
        handoff_stall_s=Dist.of(c.ready - c.arrive for c in done if c.handoff),
        lease_lateness_s=Dist.of(c.ready - c.arrive for c in done if c.hinted),
        ttft_s=Dist.of(ttft),
        program_latency_s=Dist.of(programs),
        nonlease_ttft_s=Dist.of(c.first_token - c.arrive for c in done if not c.hinted),
        bytes_moved=round(float(sum(res.bytes_by_pair.values())), 3),
        bytes_moved_by_tier={k: round(v, 3) for k, v in sorted(res.bytes_by_pair.items())},
        bytes_by_link={k: round(v, 3) for k, v in res.bytes_by_link.items()},
        wasted_bytes=round(res.wasted_bytes, 3),
        warm_tax=round(res.warm_tax, 9),
        slo_violations=round(slo_bad / len(done), 9) if done else 0.0,
        decision_ms=DecisionMs(p50=float(np.percentile(dec, 50)), p99=float(np.percentile(dec, 99))),
        calls_completed=len(done),
        calls_cancelled=sum(1 for c in calls if c.state == "cancelled"),
        unplaceable_calls=sum(1 for c in calls if c.state == "unplaceable"),
        events=res.events,
        stall_by_model=stall_by_model(done, ratios),
        handoff_tail=handoff_tail(done),
        **slo,
        **program_metrics(res, nominal),
    )
