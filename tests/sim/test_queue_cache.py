"""The simulator's admission queue and call-end estimates are kept between planning steps
(`AdmissionMixin.queue_load`, summed as calls join and leave in `sim/waiting.py`; the run
`_est_end` keeps on each call): what a policy reads from them must be what a fresh
computation gives at that instant, through joins, admissions, retries after failed attempts (a
retried call is placed anew), queue reorders and estimate changes."""

import math

import pytest

from tests.helpers import call, catalog, program, tool, trace
from statebudget.models.cluster import Cluster
from statebudget.planner.config import PlannerConfig
from statebudget.planner.overload import Pressure, QueueLoad
from statebudget.policies.ours import StateBudget
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator

GROUPS = ((0,), (1,), (2,))


def _cluster() -> Cluster:
    # three single-GPU groups of two kinds: the same call runs 3x longer on the slow ones
    kind = {"hbm_gb": 40.0, "h2d_gbps": 25.0, "d2h_gbps": 25.0, "wake_s": 0.5, "cold_start_s": 10.0,
            "engine_overhead_gb": 0.0}
    return Cluster.model_validate({
        "name": "test", "hbm_reserve_frac": 0.0,
        "gpu_kinds": {"fast": {**kind, "hbm_gbps": 1555, "tflops": 312.0},
                      "slow": {**kind, "hbm_gbps": 500, "tflops": 100.0}},
        "nodes": [{"name": "n0", "host_dram_gb": 256, "nvme_gb": 4000, "nvme_read_gbps": 7, "nvme_write_gbps": 5,
                   "root_gbps": 50, "gpus": {"fast": 1, "slow": 2}}]})


class _Checking(StateBudget):
    """At every planning step, the kept queue and call ends against fresh ones (everything kept
    forgotten, the memo of runs too), then everything kept put back, so that the check does not
    change the replay."""

    def __init__(self):
        super().__init__(PlannerConfig(overload_wait_s=30.0))
        self.checked = self.queued_seen = self.moved = 0

    def replan(self, sim):
        kept = sim.admission_queue()
        kept_load = sim.queue_load()
        kept_waits = [sim.expected_wait_s(g) for g in GROUPS]
        calls = list(sim.waiting) + list(sim.active.values())
        saved = [c.est_run for c in calls]
        for c in calls:
            c.est_run = ()
        fresh = sim.admission_queue()
        fresh_load = _summed(sim, fresh)
        fresh_waits = [sim.expected_wait_s(g) for g in GROUPS]
        for c, e in zip(calls, saved):
            c.est_run = e
        assert [(m, g, w) for m, g, _, w in kept] == [(m, g, w) for m, g, _, w in fresh]
        # a kept run was computed at another instant: (now + run) - now may round apart
        assert all(math.isclose(a[2], b[2], rel_tol=1e-12) for a, b in zip(kept, fresh))
        assert kept_waits == fresh_waits
        # each model's longest wait per group, kept, is the one the queue shows
        oldest = {}
        for c in sim.waiting:
            if c.state == "waiting":
                oldest[(c.model, c.group)] = min(oldest.get((c.model, c.group), math.inf), c.arrive)
        assert sim.queue_oldest() == oldest
        # the planner's pressure from the kept sums is the one the fresh queue gives
        assert (kept_load is None) == (not fresh)
        if fresh:
            a = Pressure.at(kept_load, sim.running_on, sim.now, 30.0)
            b = Pressure.of(sim, 30.0, fresh)
            assert (a.waiting, a.oldest_s, a.running) == (b.waiting, b.oldest_s, b.running)
            assert all(math.isclose(x, y, rel_tol=1e-9) for x, y in zip(a.queued_s, b.queued_s))
            assert kept_load.waiting == fresh_load.waiting
            assert all(math.isclose(x, y, rel_tol=1e-12) for x, y in zip(kept_load.first_s, fresh_load.first_s))
        self.checked += 1
        self.queued_seen += bool(kept)
        if {a[0] for a in kept} == {"m", "n"} and self.checked % 2 == 0:  # both models wait
            sim.output_estimate.observe("m", sim.output_estimate.expected("m", 1500) + 500)
            # a moved estimate of one model moves the runs of its calls, and of no other model's
            after = sim.admission_queue()
            assert all(b[2] > a[2] if a[0] == "m" else math.isclose(b[2], a[2], rel_tol=1e-12)
                       for a, b in zip(fresh, after))
            assert sum(sim.queue_load().queued_s) > sum(kept_load.queued_s)
            self.moved += 1
        return super().replan(sim)


def _summed(sim, queue) -> QueueLoad | None:
    """The queue summed per GPU in one pass, from scratch."""
    by_group = {}
    for _, group, run_s, waited_s in queue:
        n, total, first = by_group.get(group, (0, 0.0, math.inf))
        by_group[group] = (n + 1, total + run_s, min(first, sim.now - waited_s))
    return QueueLoad.of(len(sim.gpus), by_group) if queue else None


@pytest.mark.parametrize("queue,failures", [("fcfs", 0.0), ("atlas", 0.3)])
def test_the_kept_admission_queue_is_the_fresh_one_at_every_step(queue, failures):
    # a 30 GB model, one call a GPU; pairs of programs arrive at the same instant every 2 s, each
    # call ~11 s: the queue grows, calls are admitted several at an instant, every call's end
    # moves the output estimate, and failed attempts are placed again, maybe on another kind
    # two models, so that a moved estimate of one leaves the other's kept runs as they are
    cat = catalog(("m", 30.0, 3_000_000), ("n", 30.0, 3_000_000))
    tr = trace(*(program(f"p{i:02d}", [call("a", "m", ctx=1000, out=200 + 40 * i, max_tokens=1500),
                                       call("b", "m" if i % 4 else "n", ctx=1100, out=300, max_tokens=1500,
                                            after=["a"])],
                         start=2.0 * (i // 2)) for i in range(32)))
    pol = _Checking()
    res = Simulator(_cluster(), cat, tr, pol, config=SimConfig(check_invariants=True, start="warm", seed=3,
                                                               queue=queue, call_failure_rate=failures)).run()
    assert all(c.state == "done" for c in res.calls)
    assert pol.checked > 50 and pol.queued_seen > 20 and pol.moved > 3
    if failures:
        assert res.failed_attempts > 5


def test_a_call_cancelled_while_it_waits_leaves_the_kept_queue():
    # three calls of m, one a GPU at a time (weights and KV take 37.5 of 40 GB): two wait, and q's
    # waits behind them until its branch is cancelled when q's tool ends. The engine's check
    # (`_check_books`) holds the kept sums to the calls still waiting after every event
    cat = catalog(("m", 30.0, 3_000_000))
    busy = [program(f"p{i}", [call("a", "m", ctx=1000, out=1500, max_tokens=1500)]) for i in range(3)]
    q = program("q", [tool("t", [], duration=5.0), call("x", "m", ctx=1000, out=1500, max_tokens=1500)], start=1.0,
                cancel=[{"node": "x", "at_after": "t"}])
    res = Simulator(_cluster(), cat, trace(*busy, q), StateBudget(PlannerConfig(overload_wait_s=30.0)),
                    config=SimConfig(check_invariants=True, start="warm", seed=1)).run()
    x = next(c for c in res.calls if c.program == "q")
    assert x.state == "cancelled" and x.start < 0  # cancelled before it was ever admitted
