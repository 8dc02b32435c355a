"""The simulator's admission queue and call-end estimates are kept between planning steps
(`AdmissionMixin.admission_queue`, `_est_end`): what a policy reads from them must be what a fresh
computation gives at that instant, through joins, admissions, retries and estimate changes."""

import math

from tests.helpers import call, catalog, cluster, program, trace
from statebudget.planner.core import PlannerConfig
from statebudget.policies.ours import StateBudget
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator


class _Checking(StateBudget):
    """At every hook, the kept queue and call ends against fresh ones."""

    def __init__(self):
        super().__init__(PlannerConfig(overload_wait_s=30.0))
        self.checked = self.queued_seen = 0

    def replan(self, sim):
        kept = sim.admission_queue()
        kept_waits = [sim.expected_wait_s(g) for g in ((0,), (1,))]
        sim._queue_key = None                      # what was kept, forgotten
        for c in list(sim.waiting) + list(sim.active.values()):
            c.queue_run, c.est_run = (), ()
        fresh = sim.admission_queue()
        assert [(m, g, w) for m, g, _, w in kept] == [(m, g, w) for m, g, _, w in fresh]
        # the run of a waiting call is memoised per (model, group, context, reused KV, output
        # estimate) across calls, so a fresh list may round it differently in the last bits
        assert all(math.isclose(a[2], b[2], rel_tol=1e-12) for a, b in zip(kept, fresh))
        assert kept_waits == [sim.expected_wait_s(g) for g in ((0,), (1,))]
        self.checked += 1
        self.queued_seen += bool(kept)
        if kept and self.checked % 7 == 0:
            # a moved output estimate, at the same instant, moves every waiting call's run
            sim.output_estimate.observe("m", sim.output_estimate.expected("m", 1500) + 500)
            assert all(b[2] > a[2] for a, b in zip(fresh, sim.admission_queue()))
        return super().replan(sim)


def test_the_kept_admission_queue_is_the_fresh_one_at_every_step():
    # two 40 GB GPUs, a 30 GB model, a call every 2 s of ~11 s each: the queue grows, calls are
    # admitted several at an instant, and every call's end moves the output estimate
    cl, cat = cluster(gpus=2, hbm_gb=40.0, cold=10.0, wake=0.5), catalog(("m", 30.0, 3_000_000))
    tr = trace(*(program(f"p{i:02d}", [call("a", "m", ctx=1000, out=200 + 40 * i, max_tokens=1500),
                                       call("b", "m", ctx=1100, out=300, max_tokens=1500, after=["a"])],
                         start=2.0 * i) for i in range(24)))
    pol = _Checking()
    res = Simulator(cl, cat, tr, pol, config=SimConfig(check_invariants=True, start="warm")).run()
    assert all(c.state == "done" for c in res.calls)
    assert pol.checked > 50 and pol.queued_seen > 20
