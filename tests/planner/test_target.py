"""Online tracking of the forecast MILP (`planner/target.py`, `statebudget-track`): a solve's
target applies only once its charge has passed, the target is what the forecast says, and in a
replay it keeps the most used model ready where the greedy step alone lets it go."""

import numpy as np
import pytest

from tests.helpers import call, catalog, cluster, program, trace
from statebudget.planner.target import TargetTracker, TrackConfig
from statebudget.policies.ours import StateBudgetLease, StateBudgetTrack
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator


def _sim(tr, pol, cl=None, cat=None):
    cl = cl or cluster(gpus=1, hbm_gb=40.0)
    cat = cat or catalog(("a", 12.0), ("b", 12.0), ("c", 12.0))
    return Simulator(cl, cat, tr, pol, config=SimConfig(check_invariants=True))


def test_target_applies_after_its_charge_and_follows_the_rates():
    sim = _sim(trace(program("p", [call("x", "a")])), StateBudgetLease())
    t = TargetTracker(sim.catalog, sim.cost, TrackConfig(replan_s=60.0, charge_s=2.0, time_limit_s=1.0))
    for _ in range(6):
        t.call_arrived("a", 100)
    t.call_arrived("b", 100)
    rec = t.replan(sim, np.zeros(3), 30.0, now=10.0)
    assert rec["status"] == "optimal"
    assert t.target(11.9) == {}  # the solve is still running
    # 18 GB of the 40 (share 0.45) holds one 12 GB model: the one called most
    assert t.target(12.0) == {"a": (0,)}
    assert t.rate["a"] == pytest.approx(6 / 60.0)


def test_charge_below_the_time_limit_is_refused():
    sim = _sim(trace(program("p", [call("x", "a")])), StateBudgetLease())
    with pytest.raises(ValueError, match="charge_s"):
        TargetTracker(sim.catalog, sim.cost, TrackConfig(charge_s=0.5, time_limit_s=1.0))


def _busy_trace():
    # a (12 GB) is called every two minutes; 40 s after each, e (36 GB) needs nearly the whole GPU,
    # so a leaves HBM. Before a's next call the greedy step alone sees too low a chance (< 0.35
    # within its 30 s horizon) to bring it back; the target, from a's rate, does.
    progs = [program(f"a{i}", [call("x", "a")], start=120.0 * i) for i in range(20)]
    progs += [program(f"e{i}", [call("x", "e")], start=120.0 * i + 40.0) for i in range(20)]
    return trace(*progs)


def test_tracking_keeps_the_most_used_model_ready():
    stall = {}
    for name, pol in (("lease", StateBudgetLease()), ("track", StateBudgetTrack(track=TrackConfig(replan_s=60.0)))):
        res = _sim(_busy_trace(), pol, cat=catalog(("a", 12.0), ("e", 36.0))).run()
        stall[name] = sum(c.ready - c.arrive for c in res.calls if c.model == "a" and c.arrive > 300.0)
        if name == "track":
            times = [r["t"] for r in pol.tracker.solves]
            assert times[:3] == [0.0, 60.0, 120.0]  # every R seconds, off the decision path
    assert stall["track"] < 0.5 * stall["lease"]


def test_the_target_keeps_a_model_where_its_engine_is_rather_than_move_it_to_a_cold_group():
    # a's engine runs on one of two equal GPUs. Being ready saves a call the restore it would pay
    # without the target (a wake there), wherever the target puts it: a cold GPU is worth no
    # more, and moving there costs a cold start, so the target is a's own GPU.
    cl = cluster(gpus=2, hbm_gb=40.0, cold=30.0)
    sim = _sim(trace(program("p", [call("x", "a")])), StateBudgetLease(), cl=cl)
    sim.run()
    held = list(sim.tiers.groups_of.get(("w", "a"), ())) or [g for g in sim.model_groups(sim.catalog.by_name["a"])
                                                       if sim.tiers.asleep_on(("w", "a"), g)]
    assert len(held) == 1
    t = TargetTracker(sim.catalog, sim.cost, TrackConfig(replan_s=60.0))
    for _ in range(60):  # one call a second: a move's cold start is small against the rate
        t.call_arrived("a", 100)
    t.replan(sim, np.zeros(3), 30.0, now=sim.now)
    assert t.target(sim.now + 1.0) == {"a": held[0]}
