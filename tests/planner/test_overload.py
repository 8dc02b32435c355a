"""Past capacity (`planner/overload.py`): the admission queue read as pressure, and leases onto a
group with a queue rejected with a reason and a time to ask again."""

from collections import Counter
from dataclasses import replace

import pytest

from tests.helpers import call, catalog, cluster, program, resident, trace
from statebudget.core.estimates import OutputEstimate
from statebudget.planner.config import PlannerConfig
from statebudget.planner.leases import LeaseRequest, LeaseState
from statebudget.planner.overload import Pressure, QueueLoad
from statebudget.policies.ours import StateBudgetLease
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator


class _Queue:
    """A view that reports a fixed admission queue and running calls."""

    def __init__(self, queue, running, n_gpu=2):
        self._queue, self.running_on = queue, running
        self.tiers = type("T", (), {"hbm_cap": [40e9] * n_gpu})()

    def admission_queue(self):
        return self._queue


def test_the_wait_is_the_queued_work_over_the_calls_running_there():
    p = Pressure.of(_Queue([("m", (0,), 40.0, 50.0), ("m", (0,), 20.0, 1.0), ("m", (0, 1), 10.0, 1.0)], [2, 0]), threshold_s=30.0)  # the oldest on GPU 0 waited 50 s
    assert p.waiting == (3, 1)
    assert p.wait_s((0,)) == pytest.approx(35.0)   # 70 s of work, two calls running
    assert p.wait_s((1,)) == pytest.approx(10.0)   # nothing running: one at a time
    assert p.past_capacity((0,)) and not p.past_capacity((1,))
    assert p.past_capacity((0, 1))                 # a group is as late as its most loaded GPU
    assert p.any_past


def _sim(n_gpu=2):
    cl, cat = cluster(gpus=n_gpu, hbm_gb=40.0), catalog(("m", 20.0))
    pol = StateBudgetLease()
    sim = Simulator(cl, cat, trace(program("p", [call("a", "m")])), pol, config=SimConfig(start="warm"))
    return sim, pol._core(sim)


def _queued(sim, queue):
    """The simulator reports `queue` [(model, group, run s, waited s)] as its admission queue, and
    the same summed per GPU (what the planner reads of it)."""
    by_group = {}
    for _, g, run, waited in queue:
        n, r, first = by_group.get(g, (0, 0.0, float("inf")))
        by_group[g] = (n + 1, r + run, min(first, sim.now - waited))
    sim.admission_queue = lambda: queue
    sim.queue_load = lambda: QueueLoad.of(len(sim.gpus), by_group) if queue else None
    oldest = {}
    for m, g, _, waited in queue:
        oldest[(m, g)] = min(oldest.get((m, g), float("inf")), sim.now - waited)
    sim.queue_oldest = lambda: oldest
    depth = Counter((m, g) for m, g, _, _ in queue)
    sim.queue_depth = lambda: depth


def _req(deadline_s=60.0):
    return LeaseRequest(program="p", tenant="t0", model="m", version="v1", deadline_s=deadline_s, confidence=0.9,
                        cancel_token="p/a", for_call="a")


def test_a_lease_onto_a_group_past_capacity_is_rejected_with_when_to_retry():
    sim, core = _sim()
    _queued(sim, [("m", (0,), 50.0, 100.0), ("m", (0,), 40.0, 5.0)])  # 90 s of work, nothing running
    (lease, group), = core.admit(sim, [(_req(), (0,))], 0.0)
    assert lease.state == LeaseState.REJECTED and group == (0,)
    assert lease.reason.startswith("overloaded: 2 calls wait for HBM on gpu:0") and "retry after 90 s" in lease.reason
    assert lease.retry_after_s == pytest.approx(90.0)
    assert lease.objects == {}  # it holds nothing and moves nothing
    # the other GPU has no queue: the same request is quoted and admitted as below capacity
    (other, _), = core.admit(sim, [(_req(), (1,))], 0.0)
    assert other.state == LeaseState.ACCEPTED and other.retry_after_s is None


def test_below_the_threshold_and_with_overload_off_leases_are_admitted_as_before():
    sim, core = _sim()
    _queued(sim, [("m", (0,), 20.0, 100.0)])  # a queue, but 20 s < the 90 s threshold
    assert core.admit(sim, [(_req(), (0,))], 0.0)[0][0].state == LeaseState.ACCEPTED
    _queued(sim, [("m", (0,), 500.0, 100.0)])
    core.cfg = PlannerConfig(overload_wait_s=None)
    assert core.pressure(sim) is None
    assert core.admit(sim, [(_req(), (0,))], 0.0)[0][0].state == LeaseState.ACCEPTED


def test_speculation_onto_a_group_past_capacity_yields():
    sim, core = _sim(n_gpu=1)
    core.target, core.target_p = {"m": (0,)}, 1.0  # a target the planner keeps for sure
    promotes = [d for d in core.plan(sim, 0.0) if type(d).__name__ == "Promote"]
    assert [(d.key, d.group) for d in promotes] == [(("w", "m"), (0,))], "below capacity it is promoted"
    _queued(sim, [("m", (0,), 100.0, 100.0)])
    assert not [d for d in core.plan(sim, 0.0) if type(d).__name__ == "Promote"]


def _replicas(decisions) -> list:
    return [d.group for d in decisions if type(d).__name__ == "Promote" and d.key == ("w", "m")]


def test_a_call_queued_at_its_home_adds_a_replica_where_most_hbm_is_free():
    sim, core = _sim(n_gpu=3)
    core.cfg = replace(core.cfg, scale_out_wait_s=20.0)
    resident(sim, ("w", "m"), (0,), 20.0)
    sim.tiers.alloc_gpu((2,), 10e9)  # GPU 1 has the most free HBM
    _queued(sim, [("m", (0,), 30.0, 10.0)])
    assert _replicas(core.plan(sim, 0.0)) == [], "a call that has waited less than 20 s adds nothing"
    _queued(sim, [("m", (0,), 30.0, 25.0)])
    assert _replicas(core.plan(sim, 0.0)) == [(1,)]
    sim.queue_oldest = None  # a view that keeps no oldest waits (the service's): the queue is read
    assert _replicas(core.plan(sim, 0.0)) == [(1,)]
    core.cfg = replace(core.cfg, scale_out_wait_s=None)
    assert _replicas(core.plan(sim, 0.0)) == [], "off: the queue adds no replica"


def test_a_replica_goes_only_where_the_models_typical_call_fits_beside_its_weights():
    sim, core = _sim(n_gpu=3)
    core.cfg = replace(core.cfg, scale_out_wait_s=20.0)
    resident(sim, ("w", "m"), (0,), 20.0)
    sim.tiers.hbm_cap[1] = 30e9  # GPU 1 has the most free HBM (30 GB), but holds 10 GB beside the weights
    sim.tiers.alloc_gpu((2,), 12e9)  # 28 GB free of 40
    _queued(sim, [("m", (0,), 30.0, 25.0)])
    assert _replicas(core.plan(sim, 0.0)) == [(1,)], "before a call has finished: where most is free"
    for asked, replica in ((5_000_000, [(1,)]),     # 5 GB of KV (1,000 bytes a token)
                           (15_000_000, [(2,)]),    # not beside 20 GB on GPU 1
                           (25_000_000, [])):       # on no GPU
        sim._output_estimate = OutputEstimate()
        sim.output_estimate.observe_asked("m", asked)
        assert _replicas(core.plan(sim, 0.0)) == replica, asked
    core.cfg = replace(core.cfg, scale_out_fits_typical=False)
    assert _replicas(core.plan(sim, 0.0)) == [(1,)], "off: where most is free, whatever the calls ask"


def test_calls_queued_at_once_add_a_replica_however_briefly_they_waited():
    sim, core = _sim(n_gpu=3)
    core.cfg = replace(core.cfg, scale_out_wait_s=None, scale_out_calls=2)
    resident(sim, ("w", "m"), (0,), 20.0)
    sim.tiers.alloc_gpu((2,), 10e9)  # GPU 1 has the most free HBM
    _queued(sim, [("m", (0,), 30.0, 1.0)])
    assert _replicas(core.plan(sim, 0.0)) == [], "one call waiting is not a queue of two"
    _queued(sim, [("m", (0,), 30.0, 1.0), ("m", (0,), 30.0, 0.5)])
    assert _replicas(core.plan(sim, 0.0)) == [(1,)]
    sim.queue_depth = None  # a view that keeps no depths (the service's): the queue is read
    assert _replicas(core.plan(sim, 0.0)) == [(1,)]
    core.cfg = replace(core.cfg, scale_out_calls=3)
    assert _replicas(core.plan(sim, 0.0)) == []
    core.cfg = replace(core.cfg, scale_out_wait_s=20.0, scale_out_calls=None)  # the default: by age only
    assert _replicas(core.plan(sim, 0.0)) == []


def test_no_replica_is_added_while_one_clear_of_the_queue_exists_or_none_has_room():
    sim, core = _sim(n_gpu=3)
    core.cfg = replace(core.cfg, scale_out_wait_s=20.0)
    resident(sim, ("w", "m"), (0,), 20.0)
    sim.tiers.alloc_gpu((1,), 25e9)  # 15 GB free: the 20 GB of weights do not fit without evicting
    sim.tiers.alloc_gpu((2,), 25e9)
    _queued(sim, [("m", (0,), 30.0, 25.0)])
    assert _replicas(core.plan(sim, 0.0)) == []
    sim.tiers.free_gpu((1,), 25e9)
    resident(sim, ("w", "m"), (1,), 20.0)
    _queued(sim, [("m", (0,), 30.0, 25.0)])
    assert _replicas(core.plan(sim, 0.0)) == [], "the replica on GPU 1 is clear of the queue on GPU 0"
