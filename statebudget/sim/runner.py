"""Replay one trace under several policies and build the §8 report."""

from __future__ import annotations

from dataclasses import dataclass

from .. import __version__
from ..models.catalog import Catalog
from ..models.cluster import Cluster
from ..models.report import Report, TraceSummary
from ..models.trace import Trace
from ..solvers.costs import CostModel
from ..traces.graph import count_handoffs
from .engine import SimResult, Simulator
from .metrics import policy_report
from .policies import make_policy


@dataclass
class Replay:
    report: Report
    results: dict[str, SimResult]


def replay(cluster: Cluster, catalog: Catalog, trace: Trace, policies: list[str], seed: int = 0,
           check_invariants: bool = False, progress=None, profile: dict | None = None) -> Replay:
    """`progress(policy, sim_time)` is called now and then while a policy runs."""
    cost = CostModel(cluster, catalog, profile=profile)
    results, blocks = {}, {}
    for name in policies:
        sim = Simulator(cluster, catalog, trace, make_policy(name), cost=cost, seed=seed,
                        check_invariants=check_invariants)
        res = sim.run(progress=(lambda t, n=name: progress(n, t)) if progress else None)
        results[name] = res
        blocks[name] = policy_report(res, trace.header.slo_classes)
    report = Report(
        statebudget=__version__, cluster=cluster.name, catalog=catalog.name,
        trace=TraceSummary(programs=len(trace.programs), calls=trace.n_calls, handoffs=count_handoffs(trace)),
        policies=blocks)
    return Replay(report, results)


def report_json(report: Report) -> str:
    import json
    return json.dumps(report.model_dump(exclude_none=True), indent=1, sort_keys=False) + "\n"
