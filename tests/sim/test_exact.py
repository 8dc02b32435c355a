"""The exhaustive search over the simulator's decisions (`sim/exact.py`): it finds what the best
policies find, the lower bound never exceeds it, and the oracle's replay reaches it where the
physics leaves one good schedule."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import call, cluster, program, tool, trace
from tests.solvers.test_bound import alternating, stall_total
from statebudget.models import Catalog
from statebudget.policies import make_policy
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.sim.exact import exact_optimum
from statebudget.solvers.bound import lower_bound

TOL = 1e-3


def run(cl, cat, tr, name, start="warm"):
    return stall_total(Simulator(cl, cat, tr, make_policy(name), config=SimConfig(start=start)).run())


def test_the_search_beats_on_demand_and_matches_the_best_prefetcher():
    cl, cat, tr = alternating(20.0)
    ex = exact_optimum(cl, cat, tr)
    assert ex.complete and ex.runs > 1
    assert ex.stall_total_s < run(cl, cat, tr, "ondemand") - 1.0
    assert ex.stall_total_s <= run(cl, cat, tr, "prefetch-all") + TOL
    # the same search twice is the same answer
    assert exact_optimum(cl, cat, tr) == ex


def test_bound_and_oracle_meet_the_exact_optimum_when_waits_hide_the_swaps():
    for wait in (20.0, 12.0):
        cl, cat, tr = alternating(wait)
        ex = exact_optimum(cl, cat, tr)
        b = lower_bound(cl, cat, tr)
        assert b.total_stall_s <= ex.stall_total_s + TOL
        assert abs(b.total_stall_s - ex.stall_total_s) < 0.01  # tight: the bound is the optimum
        assert run(cl, cat, tr, "oracle") <= ex.stall_total_s + TOL


def test_short_waits_leave_the_bound_below_the_optimum_by_the_swaps_it_relaxes():
    cl, cat, tr = alternating(0.1)
    ex = exact_optimum(cl, cat, tr)
    b = lower_bound(cl, cat, tr)
    assert b.total_stall_s <= ex.stall_total_s + TOL
    assert run(cl, cat, tr, "oracle") <= ex.stall_total_s + TOL
    # the gap is what the relaxation leaves out: the first sleep of each engine writes its
    # weights out (14 GB over 25 GB/s) before the other model's copy may land
    assert ex.stall_total_s - b.total_stall_s <= 2 * 14e9 / 25e9 + 0.01


@st.composite
def small(draw):
    cl = cluster(gpus=draw(st.integers(1, 2)), hbm_gb=draw(st.sampled_from([16.0, 24.0])),
                 cold=draw(st.sampled_from([0.0, 5.0])), wake=0.5)
    cat = Catalog.model_validate({"name": "h", "models": [
        {"name": f"m{i}", "version": "v", "weights_gb": draw(st.floats(4.0, 14.0)), "kv_bytes_per_token": 1000,
         "active_params_b": 1.0, "tp": 1} for i in range(2)]})
    nodes, prev = [], []
    for k in range(draw(st.integers(1, 3))):
        nodes.append(call(f"c{k}", draw(st.sampled_from(["m0", "m1"])), after=prev, ctx=draw(st.integers(0, 4000))))
        nodes.append(tool(f"t{k}", [f"c{k}"], duration=draw(st.floats(0.0, 15.0))))
        prev = [f"t{k}"]
    return cl, cat, trace(program("p0", nodes, start=draw(st.floats(0.0, 15.0)))), draw(st.sampled_from(["warm", "cold"]))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small())
def test_the_bound_never_exceeds_the_exact_optimum(sc):
    cl, cat, tr, start = sc
    ex = exact_optimum(cl, cat, tr, config=SimConfig(start=start), max_runs=5000)
    b = lower_bound(cl, cat, tr, start=start)
    assert b.total_stall_s <= ex.stall_total_s + TOL
