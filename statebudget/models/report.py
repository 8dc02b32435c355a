"""The report contract (DESIGN.md §8) and the percentile summary every latency uses (§4)."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class Dist(BaseModel):
    """p50/p95/p99/mean/max of a latency, numpy's default percentile method; n = sample count."""
    model_config = ConfigDict(frozen=True)
    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    mean: float = 0.0
    max: float = 0.0
    n: int = 0

    @classmethod
    def of(cls, values) -> "Dist":
        a = np.asarray(list(values), dtype=float)
        if a.size == 0:
            return cls()
        p = np.percentile(a, [50, 95, 99])
        return cls(p50=_r(p[0]), p95=_r(p[1]), p99=_r(p[2]), mean=_r(a.mean()), max=_r(a.max()), n=int(a.size))


def _r(x: float) -> float:
    # Rounded so that float noise in the last bits cannot break byte-identical reports.
    return round(float(x), 9)


class DecisionMs(BaseModel):
    p50: float = 0.0
    p99: float = 0.0


class ModelStall(BaseModel):
    """One model's calls in a run (counted calls that completed): where the stall sits and where
    the calls ran. `groups`: calls per GPU group, keyed by its GPU indices ("12,13")."""
    model_config = ConfigDict(extra="allow")
    calls: int = 0
    stall_total_s: float = 0.0
    stall_s: Dist = Field(default_factory=Dist)
    handoff_stall_s: Dist = Field(default_factory=Dist)
    groups: dict[str, int] = Field(default_factory=dict)
    # Of the stall, the seconds calls waited for HBM room (arrive to admission), the rest loading
    # state: a model whose stall is mostly this wait needs room (a replica, a bigger GPU), not
    # earlier prefetch.
    hbm_wait_total_s: float = 0.0
    handoff_stall_total_s: float = 0.0
    handoff_hbm_wait_total_s: float = 0.0
    # The user's side, as the policy's figures (DESIGN.md §4) over this model's calls alone: which
    # model misses its first tokens. `slo_attainment` is empty without a cost model, or for a
    # model no GPU hosts (its calls have no ideal TTFT: they measure nothing).
    ttft_s: Dist = Field(default_factory=Dist)
    slo_attainment: dict[str, float] = Field(default_factory=dict)


class HandoffTail(BaseModel):
    """The handoff calls that set the handoff-stall P95: those whose stall is above 0 and at least
    the P95. Their stall split into the wait for HBM room (arrival until the call's own loads could
    start: admission, then the drain of what was evicted for it) and loading after it, the loading
    by the kind of state the call waited for last (weights with their engine, expert pages, or KV,
    a recompute included); the calls by the larger part of their stall (`by_cause`: room, else
    that kind) and by model: what to fix to move the P95."""
    calls: int = 0
    p95_s: float = 0.0
    stall_s: float = 0.0
    room_s: float = 0.0
    weights_s: float = 0.0
    pages_s: float = 0.0
    kv_s: float = 0.0
    by_cause: dict[str, int] = Field(default_factory=dict)  # "room", "weights", "pages", "kv": tail calls, most first
    models: dict[str, int] = Field(default_factory=dict)  # tail calls per model, most first


class PolicyReport(BaseModel):
    model_config = ConfigDict(extra="allow")
    stall_s: Dist
    handoff_stall_s: Dist
    lease_lateness_s: Dist
    ttft_s: Dist
    program_latency_s: Dist
    nonlease_ttft_s: Dist
    bytes_moved: float
    bytes_moved_by_tier: dict[str, float] = Field(default_factory=dict)
    bytes_by_link: dict[str, float] = Field(default_factory=dict)
    wasted_bytes: float
    warm_tax: float
    slo_violations: float
    decision_ms: DecisionMs
    calls_completed: int = 0
    calls_cancelled: int = 0
    unplaceable_calls: int = 0
    events: int = 0
    # Program level (seed 003; README "Metrics"). Defaults, so that reports written before them load.
    makespan_s: Dist = Field(default_factory=Dist)      # latency of the fork/join programs
    slowdown: Dist = Field(default_factory=Dist)        # latency / zero-stall latency on the reference machine
    max_wait_s: Dist = Field(default_factory=Dist)      # per program: the longest a call waited to start
    programs_per_hour: float = 0.0                      # finished programs / simulated hours
    tenant_service_share: dict[str, float] = Field(default_factory=dict)  # compute seconds, by tenant
    kv_actions: dict[str, int] = Field(default_factory=dict)  # tool-wait KV decisions: preserve, swap, discard
    kv_hbm_byte_s: float = 0.0                          # suspended KV held in HBM, byte-seconds
    recomputed_tokens: int = 0                          # prefill tokens recomputed for discarded KV
    ttl_error_s: Dist = Field(default_factory=Dist)     # adaptive rule: predicted minus actual tool wait
    failed_attempts: int = 0                            # call attempts that failed and were retried (--call-failure-rate)
    failed_service_s: float = 0.0                       # compute seconds those attempts ran (still attained service)
    moved_calls: int = 0                                # calls moved to another group while waiting for HBM (whole run)
    page_refusals: int = 0                              # times a group refused a call its own expert pages could not fit (whole run)
    preemptions: int = 0                                # running calls preempted for KV room (--kv-reserve paged; whole run)
    queue_switches: list[dict] = Field(default_factory=list)  # `auto`: {at_s, programs, to} at each switch
    # §4 SLO figures against each call's ideal TTFT (its model alone on the fastest kind that hosts it).
    stall_total_s: float = 0.0                          # the sum of stall over all counted calls
    ttft_slowdown: Dist = Field(default_factory=Dist)   # TTFT / ideal TTFT
    slo_attainment: dict[str, float] = Field(default_factory=dict)  # "2", "5", "10": share with TTFT <= k x ideal
    stall_by_model: dict[str, ModelStall] = Field(default_factory=dict)  # per model, by name
    handoff_tail: HandoffTail = Field(default_factory=HandoffTail)  # what sets the handoff-stall P95


class TraceSummary(BaseModel):
    programs: int
    calls: int
    handoffs: int


class OracleBehind(BaseModel):
    """Why the oracle's replay stalls more in total than the best other policy of the run: its
    counted calls by how they were placed against the schedule (`policies/oracle.py`: on its group,
    or off it: no group, no room there now, never fits there), the stall each kind carries and how
    much of it waited for HBM room."""
    best: str                   # the other policy with the least total stall
    best_stall_total_s: float
    stall_total_s: float        # the oracle replay's
    calls: dict[str, int]       # counted, completed calls by placement
    stall_s: dict[str, float]   # their total stall, by the same
    hbm_wait_s: dict[str, float]  # of it, the wait for HBM room (`metrics.hbm_wait_s`), by the same
    why: str                    # the above in sentences, with what the schedule does not model


class OracleBlock(BaseModel):
    """The MILP behind the `oracle` policy. `bound` is null for a rolling-horizon solve (no global
    bound follows from overlapping windows); `gap` is then the worst window's."""
    status: str
    objective: float
    bound: float | None
    gap: float
    solve_s: float
    # The lower bound on total stall (`solvers/bound.py`): no policy's `stall_total_s` on this
    # trace and start is below it. `bound_status` says how it was found (OPTIMAL, FEASIBLE: the
    # solver's proven bound at its limit, CLOSED_FORM: too large for the pairwise relaxation).
    bound_total_stall_s: float | None = None
    bound_status: str | None = None
    # What the oracle replayed: "relaxation" (the bound's optimum: up to 60 calls) or "milp" (the
    # rolling MILP, whose replay stalls more than the online planners on the presets: docs/milp.md).
    schedule: str | None = None
    behind: OracleBehind | None = None  # set only where the replay stalls more than another policy


class RunBlock(BaseModel):
    """How the run started (§4): `cold` or `warm`, the warm-up the metrics leave out, the seed;
    the KV room an admitted call holds (`SimConfig.kv_reserve`)."""
    start: str
    warmup_s: float
    seed: int
    kv_reserve: str = "asked"


class Report(BaseModel):
    model_config = ConfigDict(extra="allow")
    statebudget: str
    cluster: str
    catalog: str
    trace: TraceSummary
    policies: dict[str, PolicyReport]
    oracle: OracleBlock | None = None
    run: RunBlock | None = None
