"""Decision time of the online planner with N live programs (`statebudget bench planner`).

A synthetic but full state: every model's weights (and hot expert pages) resident on its home
group, N live programs spread over the agent-team phases (running a call, or waiting on a tool
of some class, some with a runtime hint), each holding KV for the models it has called. Each
iteration changes one program (a call arrives, or a tool starts) and times one `plan` step: the
work the planner does per runtime event. With hints the planner runs the service's settings
(`lease_config`)."""

from __future__ import annotations

import time

import numpy as np

from ..models.catalog import Catalog
from ..models.cluster import Cluster
from ..models.state import expert_key, kv_key, weights_key
from ..models.trace import Program, Trace, TraceNode
from .engine import Simulator
from ..policies.base import Policy
from ..planner.core import PlannerCore, lease_config

TOOLS = ("search", "edit", "test", "build", "shell", "approval")


def bench_planner(cluster: Cluster, catalog: Catalog, programs: int, iterations: int = 500, seed: int = 0,
                  use_hints: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    dummy = Trace(programs=[Program(program="_", start=0.0, nodes=[TraceNode(id="n", kind="tool", duration=0.0)])])
    view = Simulator(cluster, catalog, dummy, Policy())
    core = PlannerCore(catalog, view.cost, lease_config() if use_hints else None, use_hints=use_hints)
    models = [m.name for m in catalog.models]
    for m in catalog.models:  # the catalog warm on its home groups, as far as HBM allows
        home = core._home(view, m)
        if home is None:
            continue
        for key in [weights_key(m.name)] + [expert_key(m.name, p) for p, _ in core._hot_pages[m.name]]:
            if view.tiers.fits_gpu(home, view.size_of(key) / len(home)):
                view._new_gpu_copy(key, home, prefetch=False).ready = True
    now = 1000.0
    pred = core.predictor
    for i in range(programs):
        pid = f"p{i:05d}"
        pred.program_started(pid, f"dev{i % 10:02d}", now - 100)
        seen = rng.choice(models, size=int(rng.integers(1, 4)), replace=False)
        for m in seen:
            pred.call_arrived(pid, str(m), now - 50, expected_s=5.0)
            pred.call_finished(pid, now - 45)
            view.kv_tokens[kv_key(pid, str(m))] = int(rng.integers(1000, 30000))
        pred.tool_started(pid, str(rng.choice(TOOLS)), now - float(rng.uniform(0, 20)))
        if rng.random() < 0.5:
            pred.hinted(pid, str(rng.choice(models)), float(rng.uniform(0.3, 1.0)))
        view.kv_of_program[pid] = set()
    live = list(pred.live)
    times = []
    for it in range(iterations):
        pid = live[int(rng.integers(len(live)))]
        now += 0.05
        if rng.random() < 0.5:
            pred.call_arrived(pid, str(rng.choice(models)), now, expected_s=5.0)
        else:
            pred.call_finished(pid, now)
            pred.tool_started(pid, str(rng.choice(TOOLS)), now)
        t0 = time.perf_counter()
        core.plan(view, now)
        times.append((time.perf_counter() - t0) * 1e3)
    a = np.asarray(times)
    return {"programs": programs, "decision_ms": {"p50": round(float(np.percentile(a, 50)), 4),
                                                  "p99": round(float(np.percentile(a, 99)), 4)},
            "iterations": iterations, "cluster": cluster.name, "catalog": catalog.name}
