"""Turns a simulation's call records into the §8 report block, with the §4 definitions."""

from __future__ import annotations

import numpy as np

from ..models.report import DecisionMs, Dist, PolicyReport
from .engine import SimResult


def policy_report(res: SimResult, slo_classes: dict[str, float]) -> PolicyReport:
    done = [c for c in res.calls if c.state == "done"]
    stall = [c.ready - c.arrive for c in done]
    ttft = [c.first_token - c.arrive for c in done]
    programs = [pr.end - pr.prog.start for pr in res.programs.values() if pr.end >= 0]
    slo_bad = sum(1 for c in done if c.first_token - c.arrive > slo_classes.get(c.slo, slo_classes.get("interactive", 2.0)))
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
    )
