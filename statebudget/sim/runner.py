"""Replay one trace under several policies and build the §8 report."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import __version__
from ..models.catalog import Catalog
from ..models.cluster import Cluster
from ..models.report import OracleBehind, OracleBlock, Report, RunBlock, TraceSummary
from ..models.trace import Trace
from ..core.costs import CostModel
from ..traces.graph import count_handoffs
from ..traces.timeline import nominal_timeline
from .config import SimConfig
from .engine import SimResult, Simulator
from .metrics import counted_done, hbm_wait_s, policy_report
from ..core.programs import parse_spec
from ..policies import REGISTRY, SEES_FUTURE, make_policy
from ..policies.oracle import ON_GROUP, PLACED
from ..solvers.bound import lower_bound


@dataclass
class Replay:
    report: Report
    results: dict[str, SimResult]


def replay(cluster: Cluster, catalog: Catalog, trace: Trace, policies: list[str], config: SimConfig = SimConfig(),
           progress=None, profile: dict | None = None, make=make_policy) -> Replay:
    """Each entry of `policies` is a spec `POLICY[:QUEUE[:KV]]`; the report keys it by that exact
    string, and its queue and KV rule replace those of `config` for that policy.
    `progress(spec, sim_time)` is called now and then while a policy runs; `make(POLICY)` builds
    each policy (another knob setting than the registry's defaults)."""
    cost = CostModel(cluster, catalog, profile=profile)
    results, blocks = {}, {}
    first = None  # the first oracle spec and its policy, which the report's `oracle` block describes
    nominal = nominal_timeline(trace, catalog)
    for name in policies:
        base, queue, kv = parse_spec(name, REGISTRY)
        policy = make(base)
        sim = Simulator(cluster, catalog, trace, policy, cost=cost, config=replace(config, queue=queue, kv_rule=kv))
        res = sim.run(progress=(lambda t, n=name: progress(n, t)) if progress else None)
        results[name] = res
        blocks[name] = policy_report(res, trace.header.slo_classes, nominal, cost=cost)
        if base == "oracle" and first is None:
            first = (name, policy)
    oracle = _oracle_block(first[1], cluster, catalog, trace, cost, config) if first is not None else None
    if oracle is not None:
        name_o = first[0]
        ref = blocks[name_o].handoff_stall_s
        online = {n: b for n, b in blocks.items() if parse_spec(n, REGISTRY)[0] not in SEES_FUTURE}
        for block in online.values():
            # Online policies against the oracle replayed in the same closed loop.
            mine = block.handoff_stall_s
            block.vs_oracle = {
                "handoff_stall_total": round(mine.mean * mine.n / (ref.mean * ref.n), 6) if ref.mean * ref.n > 0 else None,
                "handoff_stall_p95": round(mine.p95 / ref.p95, 6) if ref.p95 > 0 else None,
            }
        oracle.behind = behind(blocks[name_o], online, first[1], results[name_o], oracle.schedule)
        for block in blocks.values():
            # Total stall over the lower bound: at most this far from optimal.
            block.stall_total_vs_bound = round(block.stall_total_s / oracle.bound_total_stall_s, 6) \
                if oracle.bound_total_stall_s else None
    report = Report(
        statebudget=__version__, cluster=cluster.name, catalog=catalog.name,
        trace=TraceSummary(programs=len(trace.programs), calls=trace.n_calls, handoffs=count_handoffs(trace)),
        policies=blocks, oracle=oracle, run=RunBlock(start=config.start, warmup_s=config.warmup_s, seed=config.seed,
                                                         kv_reserve=config.kv_reserve))
    return Replay(report, results)


SCHEDULE = {"milp": "MILP", "relaxation": "relaxation's"}
# What the schedule does not model, that the closed loop has.
UNMODELLED = {"milp": "The MILP plans on the zero-stall timeline, without compute, from every object on NVMe "
                      "with no engine, so its groups and prefetch times are not the closed loop's (docs/milp.md).",
              "relaxation": "The relaxation leaves out link sharing, KV restores, expert pages and three-way HBM "
                            "conflicts (docs/bound.md)."}


def _oracle_block(policy, cluster, catalog, trace, cost, config) -> OracleBlock | None:
    """The solve behind the oracle's replay and the lower bound on total stall (None: no schedule)."""
    if policy.result is not None:
        sol = policy.result.solution
        oracle = OracleBlock(status=sol.status, objective=round(sol.objective, 6),
                             bound=round(sol.bound, 6) if sol.bound == sol.bound else None,
                             gap=sol.gap, solve_s=round(sol.solve_s, 3), schedule="milp")
    elif policy.bound is not None:  # the relaxation's schedule, replayed
        b = policy.bound
        # its optimum bounds no schedule where KV room is held for less than `max_tokens`
        oracle = OracleBlock(status=b.status, objective=b.total_stall_s,
                             bound=b.total_stall_s if config.kv_reserve == "asked" else None, gap=0.0,
                             solve_s=b.solve_s, schedule="relaxation")
    else:
        return None
    if config.call_failure_rate > 0:
        # a retry arrives again and a failed attempt's compute delays others: outside the relaxation
        oracle.bound_status = "NOT_COMPUTED (call failures)"
    elif config.kv_reserve != "asked":
        # the relaxation holds each call's KV room for all it asked for (`max_tokens`)
        oracle.bound_status = f"NOT_COMPUTED (kv_reserve {config.kv_reserve})"
    else:
        # the oracle's own relaxation is this bound when no warm-up leaves calls out
        lb = policy.bound if policy.bound is not None and config.warmup_s == 0 else \
            lower_bound(cluster, catalog, trace, cost, warmup_s=config.warmup_s, start=config.start)
        oracle.bound_total_stall_s, oracle.bound_status = lb.total_stall_s, lb.status
    return oracle


def behind(mine, online: dict, policy, res: SimResult, schedule: str | None) -> OracleBehind | None:
    """Why the oracle's replay (its block `mine`, its `policy` and `res`) stalls more in total than
    the best of the `online` policies' blocks (None where it does not): its counted, completed
    calls by how they were placed (`Oracle.placed`), their stall and its wait for HBM room."""
    if not online:
        return None
    best = min(online, key=lambda n: (online[n].stall_total_s, n))
    if mine.stall_total_s <= online[best].stall_total_s:
        return None
    calls, stall, wait = dict.fromkeys(PLACED, 0), dict.fromkeys(PLACED, 0.0), dict.fromkeys(PLACED, 0.0)
    for c in counted_done(res):
        how = policy.placed[(c.program, c.node)]
        calls[how] += 1
        stall[how] += c.ready - c.arrive
        wait[how] += hbm_wait_s(c)
    total = sum(stall.values())

    def part(keys) -> str:  # "N ... carrying X% of its stall"
        n, st = sum(calls[k] for k in keys), sum(stall[k] for k in keys)
        return f"{n}" + (f", carrying {st / total:.0%} of its stall" if total > 0 else "")
    off = [k for k in sorted(PLACED, key=lambda k: -calls[k]) if k not in ON_GROUP and calls[k]]
    why = [f"The replay of the {SCHEDULE.get(schedule, 'offline')} schedule stalls {mine.stall_total_s:.1f} s "
           f"in total, {best} {online[best].stall_total_s:.1f} s.",
           f"Of its {sum(calls.values())} counted calls, {part(ON_GROUP)}, ran on the schedule's group "
           f"({calls['no_room_there']} {PLACED['no_room_there']})"
           + (f" and {part(off)}, elsewhere: " + ", ".join(f"{calls[k]} as {PLACED[k]}" for k in off) if off else "")
           + "."]
    if total > 0:
        why.append(f"Of all its stall, {sum(wait.values()) / total:.0%} waited for HBM room and the rest loaded state.")
    why.append(UNMODELLED.get(schedule or "", ""))
    return OracleBehind(best=best, best_stall_total_s=online[best].stall_total_s, stall_total_s=mine.stall_total_s,
                        calls=calls,
                        stall_s={k: round(v, 6) for k, v in stall.items()},
                        hbm_wait_s={k: round(v, 6) for k, v in wait.items()}, why=" ".join(w for w in why if w))


def report_json(report: Report) -> str:
    import json
    return json.dumps(report.model_dump(exclude_none=True), indent=1, sort_keys=False) + "\n"
