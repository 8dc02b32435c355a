"""The lower bound on total stall (`solvers/bound.py`) holds against every policy, the oracle's
replay included, on random tiny instances, from both starts and with a warm-up; and it is not
vacuous where the physics forces stall."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import call, cluster, program, tool, trace
from statebudget.models import Catalog
from statebudget.policies import REGISTRY, make_policy
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.sim.metrics import total_stall as stall_total
from statebudget.solvers.bound import UNIT_S, lower_bound


@st.composite
def tiny(draw):
    cl = cluster(gpus=draw(st.integers(1, 2)), hbm_gb=draw(st.sampled_from([16.0, 24.0, 40.0])),
                 cold=draw(st.sampled_from([0.0, 3.0, 10.0])), wake=draw(st.sampled_from([0.2, 1.0])),
                 h2d=draw(st.sampled_from([8.0, 25.0])))
    models = [{"name": f"m{i}", "version": "v", "weights_gb": draw(st.floats(2.0, 18.0)),
               "kv_bytes_per_token": draw(st.sampled_from([1000, 100_000])),
               "active_params_b": draw(st.sampled_from([1.0, 8.0])), "tp": draw(st.sampled_from([1, 1, 2]))}
              for i in range(draw(st.integers(2, 3)))]
    cat = Catalog.model_validate({"name": "h", "models": models})
    names = [m["name"] for m in models]
    budget = draw(st.integers(1, 6))  # calls in all
    progs = []
    for p in range(draw(st.integers(1, 2))):
        nodes, calls = [], []
        for k in range(draw(st.integers(1, 5))):
            after = draw(st.lists(st.sampled_from([n["id"] for n in nodes]), max_size=2, unique=True)) if nodes else []
            if budget > 0 and draw(st.booleans()):
                budget -= 1
                nodes.append(call(f"n{k}", draw(st.sampled_from(names)), after=after,
                                  ctx=draw(st.integers(0, 8000)), out=draw(st.integers(0, 300))))
                calls.append(f"n{k}")
            else:
                nodes.append(tool(f"n{k}", after, duration=draw(st.floats(0.0, 40.0))))
        ids = [n["id"] for n in nodes]
        hints = [{"issued_at": draw(st.sampled_from(ids)), "for": c, "model": draw(st.sampled_from(names)),
                  "confidence": 0.8} for c in calls if draw(st.booleans())]
        cancel = [{"node": draw(st.sampled_from(ids)), "at_after": draw(st.sampled_from(ids))}] \
            if len(ids) >= 2 and draw(st.integers(0, 3)) == 0 else []
        progs.append(program(f"p{p}", nodes, start=draw(st.floats(0.0, 30.0)), hints=hints, cancel=cancel))
    start = draw(st.sampled_from(["warm", "cold"]))
    warmup = draw(st.sampled_from([0.0, 0.0, 10.0]))
    return cl, cat, trace(*progs), start, warmup


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny())
def test_no_policy_beats_the_bound(sc):
    cl, cat, tr, start, warmup = sc
    b = lower_bound(cl, cat, tr, warmup_s=warmup, start=start)
    assert b.status == "OPTIMAL"
    for name in sorted(REGISTRY):
        res = Simulator(cl, cat, tr, make_policy(name), config=SimConfig(start=start, warmup_s=warmup)).run()
        assert b.total_stall_s <= stall_total(res) + 1e-6, (name, b, stall_total(res))


def alternating(tool_s: float):
    """One GPU that holds one of two models at a time; a program alternates them across tool waits,
    each hinted: the case where the MILP's replay used to stall every handoff."""
    cl = cluster(gpus=1, hbm_gb=24.0, cold=10.0, wake=0.5)
    cat = Catalog.model_validate({"name": "h", "models": [
        {"name": m, "version": "v", "weights_gb": 14.0, "kv_bytes_per_token": 1000, "active_params_b": 1.0, "tp": 1}
        for m in ("a", "b")]})
    tr = trace(program("p0", [call("n1", "a"), tool("t1", ["n1"], duration=tool_s), call("n2", "b", after=["t1"]),
                              tool("t2", ["n2"], duration=tool_s), call("n3", "a", after=["t2"])],
                       hints=[{"issued_at": "t1", "for": "n2", "model": "b", "confidence": 0.9},
                              {"issued_at": "t2", "for": "n3", "model": "a", "confidence": 0.9}]))
    return cl, cat, tr


def test_bound_is_the_forced_cold_start_and_the_oracle_reaches_it():
    cl, cat, tr = alternating(20.0)
    b = lower_bound(cl, cat, tr)
    # Nothing can be awake before the first call: its cold start and copy are forced ...
    first = 14e9 / 25e9 + 10.0
    assert abs(b.total_stall_s - first) < 0.01
    # ... and the 20 s waits hide every swap: the oracle's replay of the relaxation's schedule
    # reaches the bound, so the bound is the optimum here.
    res = Simulator(cl, cat, tr, make_policy("oracle"), config=SimConfig(start="warm")).run()
    assert abs(stall_total(res) - b.total_stall_s) < 0.01


def test_short_waits_force_swap_stall_into_the_bound():
    long_b = lower_bound(*alternating(20.0)).total_stall_s
    short_b = lower_bound(*alternating(0.1)).total_stall_s
    # a swap needs the 14 GB over 25 GB/s and a wake-up; a 0.1 s wait hides 0.1 s of it, twice
    assert short_b >= long_b + 2 * (14e9 / 25e9 + 0.5 - 0.1) - 0.01


def test_the_report_carries_the_bound_and_every_policy_stays_above_it():
    from statebudget.sim.runner import replay
    cl, cat, tr = alternating(0.1)
    rep = replay(cl, cat, tr, ["ondemand", "prefetch-all", "oracle"], SimConfig(start="warm")).report
    bound = rep.oracle.bound_total_stall_s
    assert rep.oracle.bound_status == "OPTIMAL" and bound > 0 and rep.oracle.schedule == "relaxation"
    for name, block in rep.policies.items():
        assert block.stall_total_s >= bound - UNIT_S, name
        assert block.stall_total_vs_bound >= 1 - 1e-3


def test_no_bound_is_claimed_when_call_attempts_fail():
    from statebudget.sim.runner import replay
    cl, cat, tr = alternating(0.1)
    rep = replay(cl, cat, tr, ["ondemand", "oracle"], SimConfig(start="warm", call_failure_rate=0.3)).report
    assert rep.oracle.bound_total_stall_s is None and rep.oracle.bound_status.startswith("NOT_COMPUTED")
    assert rep.policies["ondemand"].stall_total_vs_bound is None


def _every_policy_above(cl, cat, tr, start="warm"):
    b = lower_bound(cl, cat, tr, start=start)
    for name in sorted(REGISTRY):
        res = Simulator(cl, cat, tr, make_policy(name), config=SimConfig(start=start)).run()
        assert b.total_stall_s <= stall_total(res) + 1e-6, (name, b.total_stall_s, stall_total(res))
    return b


def test_a_sibling_branch_listed_later_still_leaves_its_kv():
    """KV reuse follows the DAG, not the order nodes are listed in: x may reuse y's KV."""
    cl = cluster(gpus=1, hbm_gb=16.0)
    cat = Catalog.model_validate({"name": "h", "models": [
        {"name": m, "version": "v", "weights_gb": 2.0, "kv_bytes_per_token": 100_000, "active_params_b": 8.0, "tp": 1}
        for m in ("a", "b")]})
    p = program("p", [tool("t", [], duration=30.0), call("x", "a", after=["t"], ctx=70_000),
                      call("y", "a", ctx=70_000)])
    q = program("q", [call("z", "b", ctx=70_000)], start=30.5)
    for start in ("warm", "cold"):
        _every_policy_above(cl, cat, trace(p, q), start)


def test_a_call_that_may_never_fit_is_not_counted():
    """The simulator drops a call whose expert pages and KV fit no group (and cancels what follows)."""
    cl = cluster(gpus=1, hbm_gb=16.0)
    cat = Catalog.model_validate({"name": "h", "models": [
        {"name": "moe", "version": "v", "weights_gb": 4.0, "kv_bytes_per_token": 100_000, "active_params_b": 1.0,
         "tp": 1, "moe": {"experts": 8, "active": 8, "layers": 1, "expert_gb": 1.5, "pages": 8, "zipf_s": 1.0}},
        {"name": "d", "version": "v", "weights_gb": 2.0, "kv_bytes_per_token": 1000, "active_params_b": 1.0, "tp": 1}]})
    tr = trace(program("p", [call("u", "moe", ctx=109_000, out=10, max_tokens=1000), call("v", "d", after=["u"])]))
    assert _every_policy_above(cl, cat, tr).total_stall_s == 0.0
