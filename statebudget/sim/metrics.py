"""Turns a simulation's call records into the §8 report block, with the §4 definitions."""

from __future__ import annotations

import numpy as np

from collections import Counter

from ..models.report import DecisionMs, Dist, PolicyReport
from ..models.trace import ttft_bound
from .engine import SimResult


def program_metrics(res: SimResult, nominal: dict | None) -> dict:
    """Seed 003's program-level figures. slowdown = program latency / its zero-stall latency on the
    reference machine (`traces/timeline.py`); max_wait = the longest a call of the program waited
    between arriving and starting (stall + queueing)."""
    done = [pr for pr in res.programs.values() if pr.end >= 0]
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
    hours = res.sim_end / 3600.0
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
        "queue_switches": res.queue_switches,
    }


def policy_report(res: SimResult, slo_classes: dict[str, float], nominal: dict | None = None) -> PolicyReport:
    done = [c for c in res.calls if c.state == "done"]
    stall = [c.ready - c.arrive for c in done]
    ttft = [c.first_token - c.arrive for c in done]
    programs = [pr.end - pr.prog.start for pr in res.programs.values() if pr.end >= 0]
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
        calls_cancelled=sum(1 for c in res.calls if c.state == "cancelled"),
        unplaceable_calls=sum(1 for c in res.calls if c.state == "unplaceable"),
        events=res.events,
        **program_metrics(res, nominal),
    )
