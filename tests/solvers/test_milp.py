"""The offline MILP: tiny instances against an exact dynamic program, both backends agree, and the
independent checker rejects infeasible solutions."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statebudget.solvers.milp import (Call, Instance, Obj, Solution, brute_force, evaluate, greedy_schedule, solve,
                                      solve_rolling)

GB = 1e9


def two_models(slots=(10.0, 10.0, 10.0, 10.0), hbm=20 * GB, lam=1e-12):
    """One GPU that holds one of two 15 GB models; calls alternate m0, m1, m0, m1."""
    objs = (Obj("w:m0", (0,), "n0", 15 * GB, 1.0, 5.0, (0, 3)), Obj("w:m1", (0,), "n0", 15 * GB, 1.0, 5.0, (0, 3)))
    calls = tuple(Call(f"c{t}", t, (t % 2,), ()) for t in range(4))
    return Instance(slot_s=slots, objects=objs, calls=calls, hbm=(hbm,), h2d=(25 * GB,), dram={"n0": 100 * GB},
                    root={"n0": 50 * GB}, nvme={"n0": 7 * GB}, lam=lam)


def test_hand_computed_optimum():
    # t=0: m0 must come on demand from NVMe (5 s). m1 at t=1 too: a prefetch reads DRAM, and m1
    # can only be staged there during slot 0 (NVMe 7 GB/s x 10 s), in DRAM from slot 1 on. From
    # then on both models sit in DRAM and each is prefetched over the 10 s slot before its call.
    inst = two_models()
    sol = solve(inst, "scip", time_limit_s=30)
    assert sol.status == "OPTIMAL"
    assert sol.stall.tolist() == pytest.approx([5.0, 5.0, 0.0, 0.0])
    bad, obj = evaluate(inst, sol)
    assert bad == [] and obj == pytest.approx(sol.objective, rel=1e-6)
    assert sol.objective == pytest.approx(brute_force(inst), rel=1e-6)


@pytest.mark.parametrize("noise", [-0.0, -1e-12])
def test_a_zero_stall_the_solver_reports_a_hair_below_zero_prints_as_zero(noise, monkeypatch):
    from statebudget.solvers.milp import model

    real = model.BACKENDS["scip"]

    def noisy():
        be = real()
        exact = be.value
        be.value = lambda v: noise if (x := exact(v)) == 0 else x  # a solver's signed zero or float noise
        return be

    monkeypatch.setitem(model.BACKENDS, "scip", noisy)
    sol = solve(two_models(), "scip", time_limit_s=30)
    assert [f"{s:.3f}" for s in sol.stall] == ["5.000", "5.000", "0.000", "0.000"]  # never -0.000


def test_slots_too_short_to_prefetch_force_on_demand_loads():
    inst = two_models(slots=(0.1, 0.1, 0.1, 0.1))  # 15 GB cannot cross a link in 0.1 s
    sol = solve(inst, "scip", time_limit_s=30)
    # m0 from NVMe (5), then m1 from NVMe (5); m0 and m1 come back from DRAM (1 each) after
    # demotions, which are free.
    assert sol.stall.sum() == pytest.approx(12.0)
    assert sol.objective == pytest.approx(brute_force(inst), rel=1e-6)


@st.composite
def tiny(draw):
    n_gpu = draw(st.integers(1, 2))
    T = draw(st.integers(2, 5))
    objs = []
    for o in range(draw(st.integers(1, 3))):
        g = draw(st.sampled_from([(i,) for i in range(n_gpu)] + ([(0, 1)] if n_gpu == 2 else [])))
        first = draw(st.integers(0, T - 1))
        objs.append(Obj(f"o{o}", g, "n0", draw(st.sampled_from([5, 10, 15])) * GB,
                        draw(st.sampled_from([0.5, 1.0])), draw(st.sampled_from([2.0, 6.0])),
                        (first, draw(st.integers(first, T - 1)))))
    calls = []
    for t in range(T):
        live = [o for o, ob in enumerate(objs) if ob.live[0] <= t <= ob.live[1]]
        if live and draw(st.booleans()):
            needs = tuple(sorted(draw(st.sets(st.sampled_from(live), min_size=1, max_size=2))))
            produces = tuple(o for o in needs if objs[o].live[0] == t and draw(st.booleans()))
            calls.append(Call(f"c{t}", t, needs, produces))
    return Instance(slot_s=tuple(draw(st.sampled_from([0.2, 1.0, 3.0])) for _ in range(T)), objects=tuple(objs),
                    calls=tuple(calls), hbm=tuple(draw(st.sampled_from([12.0, 20.0, 40.0])) * GB for _ in range(n_gpu)),
                    h2d=(10 * GB,) * n_gpu, dram={"n0": draw(st.sampled_from([0.0, 12.0, 100.0])) * GB},
                    root={"n0": 15 * GB}, nvme={"n0": 5 * GB}, lam=draw(st.sampled_from([0.0, 1e-11])))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny())
def test_milp_equals_brute_force_and_backends_agree(inst):
    exact = brute_force(inst)
    a = solve(inst, "scip", time_limit_s=30)
    b = solve(inst, "highs", time_limit_s=30)
    if exact == np.inf:
        assert a.status == "INFEASIBLE" and b.status == "INFEASIBLE"
        return
    assert a.status == "OPTIMAL" and b.status == "OPTIMAL"
    assert a.objective == pytest.approx(exact, rel=1e-6, abs=1e-6)
    assert b.objective == pytest.approx(exact, rel=1e-6, abs=1e-6)
    for sol in (a, b):
        bad, obj = evaluate(inst, sol)
        assert bad == []
        assert obj == pytest.approx(exact, rel=1e-6, abs=1e-6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny())
def test_the_greedy_warm_start_is_feasible_never_beats_the_optimum_and_keeps_it(inst):
    exact = brute_force(inst)
    g = greedy_schedule(inst)
    if g.status != "FEASIBLE":  # it only fails where a call's needs cannot fit, or DRAM rules bind
        return
    bad, obj = evaluate(inst, g)
    assert bad == [] and obj == pytest.approx(g.objective)
    assert exact <= obj + 1e-6
    warm = solve(inst, "scip", time_limit_s=30, hint=g)
    assert warm.status == "OPTIMAL" and warm.objective == pytest.approx(exact, rel=1e-6, abs=1e-6)


def test_greedy_demotes_the_resident_used_farthest_ahead():
    inst = two_models(hbm=20 * GB)  # one model fits at a time; calls alternate m0, m1, m0, m1
    g = greedy_schedule(inst)
    assert g.status == "FEASIBLE"
    assert g.d.sum() == 4  # every call loads on demand (no prefetch in the greedy rule)
    assert g.y[0, 1] == 1 and g.y[1, 2] == 1  # demoted to DRAM, restored from there: R^h, not R^n
    assert g.stall.tolist() == pytest.approx([5.0, 5.0, 1.0, 1.0])
    assert solve(inst, "scip", time_limit_s=30).objective < g.objective  # the oracle prefetches


def _feasible():
    inst = two_models()
    return inst, solve(inst, "scip", time_limit_s=30)


def _copy(sol, **arrays):
    s = Solution(sol.x.copy(), sol.y.copy(), sol.u.copy(), sol.d.copy(), sol.v.copy(), sol.stall.copy(),
                 choice=dict(sol.choice), wait=None if sol.wait is None else sol.wait.copy())
    for k, v in arrays.items():
        setattr(s, k, v)
    return s


def test_checker_rejects_hand_made_infeasible_solutions():
    inst, sol = _feasible()
    x = sol.x.copy()
    x[:, 1] = 1  # both 15 GB models in a 20 GB GPU, and m0 without a promotion
    bad, _ = evaluate(inst, _copy(sol, x=x))
    assert any(b.startswith("(7)") for b in bad) and any(b.startswith("(1)") or b.startswith("(2)") for b in bad)
    x = sol.x.copy()
    x[1, 1] = 0  # the call at t=1 runs without its model
    assert any(b.startswith("(5)") for b in evaluate(inst, _copy(sol, x=x))[0])
    s = sol.stall.copy()
    s[0] = 0.0  # the first call claims no stall although it loaded from NVMe
    assert any(b.startswith("(6)") for b in evaluate(inst, _copy(sol, stall=s))[0])
    u = sol.u.copy()
    u[0, 0] = 1  # a prefetch before time 0
    assert any(b.startswith("(4)") for b in evaluate(inst, _copy(sol, u=u))[0])


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown MILP backend"):
        solve(two_models(), "gurobi")


def test_rolling_horizon_stitches_a_feasible_schedule_close_to_the_full_solve():
    inst = two_models(slots=(10.0,) * 8)
    inst = Instance(slot_s=(10.0,) * 8, objects=tuple(o.__class__(o.name, o.gpus, o.node, o.bytes, o.restore_host_s,
                                                                  o.restore_nvme_s, (0, 7)) for o in inst.objects),
                    calls=tuple(Call(f"c{t}", t, (t % 2,), ()) for t in range(8)), hbm=inst.hbm, h2d=inst.h2d,
                    dram=inst.dram, root=inst.root, nvme=inst.nvme, lam=inst.lam)
    full = solve(inst, "scip", 30)
    rolled = solve_rolling(inst, window=4, overlap=2, backend="scip", time_limit_s=30)
    assert rolled.violations == []
    assert [w["status"] for w in rolled.windows] == ["OPTIMAL"] * len(rolled.windows)
    assert len(rolled.windows) == 3
    assert rolled.solution.objective >= full.objective - 1e-9
    assert rolled.solution.objective == pytest.approx(full.objective, rel=1e-6)  # this one is easy


def test_oracle_cli_on_a_generated_trace(tmp_path):
    from typer.testing import CliRunner

    from statebudget.cli import app
    from statebudget.models.load import write_trace
    from statebudget.traces.generators import generate

    write_trace(generate("swe-team", 2, 0.15), tmp_path / "t.jsonl")
    res = CliRunner().invoke(app, ["oracle", "--cluster", "hetero16", "--catalog", "agent-team", "--trace",
                                   str(tmp_path / "t.jsonl"), "--json", str(tmp_path / "o.json"), "--time-limit", "20"])
    assert res.exit_code == 0, res.output
    import json
    doc = json.loads((tmp_path / "o.json").read_text())
    assert doc["oracle"]["status"] in ("OPTIMAL", "FEASIBLE")
    assert doc["violations"] == []
    assert all(w["status"] == "OPTIMAL" for w in doc["windows"])
    assert doc["stall_s"]["n"] == doc["calls"]


def test_replay_with_the_oracle_adds_its_block_and_ratios(tmp_path):
    import html
    import json
    import re

    from typer.testing import CliRunner

    from statebudget.cli import app
    from statebudget.models.load import write_trace
    from statebudget.traces.generators import generate

    write_trace(generate("swe-team", 3, 0.15), tmp_path / "t.jsonl")
    res = CliRunner().invoke(app, ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace",
                                   str(tmp_path / "t.jsonl"), "--policy", "ondemand,statebudget,oracle",
                                   "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"),
                                   "--start", "cold"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["oracle"]["status"] in ("OPTIMAL", "FEASIBLE")
    for name in ("ondemand", "statebudget"):
        ratio = doc["policies"][name]["vs_oracle"]
        o, p = doc["policies"]["oracle"]["handoff_stall_s"], doc["policies"][name]["handoff_stall_s"]
        if o["p95"] > 0:
            assert ratio["handoff_stall_p95"] == pytest.approx(p["p95"] / o["p95"], rel=1e-5)
    assert "vs_oracle" not in doc["policies"]["oracle"]
    # From a cold start its replay is behind (about 2x ondemand's total stall on this trace): the
    # report says where its calls ran and stalled, `replay` prints it and the page shows it.
    totals = {n: p["stall_total_s"] for n, p in doc["policies"].items()}
    behind = doc["oracle"]["behind"]
    assert behind["best"] == min(("ondemand", "statebudget"), key=totals.get)
    assert behind["stall_total_s"] == totals["oracle"] > totals[behind["best"]]
    assert sum(behind["calls"].values()) == doc["policies"]["oracle"]["calls_completed"]
    assert sum(behind["stall_s"].values()) == pytest.approx(totals["oracle"], rel=1e-6)
    assert behind["why"].startswith("The replay of the MILP schedule") and "docs/milp.md" in behind["why"]
    assert behind["why"][:60] in " ".join(res.output.split())
    from tests.browser import rendered_dom

    dom = rendered_dom((tmp_path / "r.html").as_uri())
    assert f"Lower bound on total stall: {doc['oracle']['bound_total_stall_s']:.2f} s" in dom
    shown = re.search(r'<p class="behind">(.*?)</p>', dom).group(1)
    assert html.unescape(shown) == behind["why"]


def test_the_oracle_records_where_each_call_ran_against_its_schedule():
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.policies.oracle import Oracle
    from statebudget.sim.config import SimConfig
    from statebudget.sim.runner import replay
    from statebudget.traces.generators import generate

    made = []

    def make(base):
        made.append(Oracle())
        return made[-1]

    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    rep = replay(cl, cat, generate("swe-team", 3, 0.15), ["oracle"], SimConfig(seed=3), make=make)
    oracle = made[0]
    done = [c for c in rep.results["oracle"].calls if c.state == "done"]
    how = {oracle.placed[(c.program, c.node)] for c in done}
    assert {"schedule", "no_room_there", "no_room"} <= how, how
    for c in done:
        label, planned = oracle.placed[(c.program, c.node)], oracle.group_for.get((c.program, c.node))
        assert (planned is None) == (label == "no_group")
        if label in ("schedule", "no_room_there"):
            assert c.group == planned
        elif label in ("no_room", "never_fits"):
            assert c.group != planned


# ---- group choice, call spans and waiting ---------------------------------------------------------
@st.composite
def tiny_choice(draw):
    """Models with a weights object on each of one or two GPUs; calls that span slots, choose a
    GPU per affinity (a program's model), and may wait."""
    n_gpu = draw(st.integers(1, 2))
    T = draw(st.integers(2, 4))
    objs, by_model = [], []
    for m in range(draw(st.integers(1, 2))):
        gpus = draw(st.sampled_from([(0,), (1,), (0, 1)] if n_gpu == 2 else [(0,)]))
        size = draw(st.sampled_from([5, 10, 15])) * GB
        by_model.append([len(objs) + k for k in range(len(gpus))])
        objs += [Obj(f"w:m{m}@{i}", (i,), "n0", size, draw(st.sampled_from([0.5, 1.0])), 4.0, (0, T - 1)) for i in gpus]
    calls = []
    for t in range(T):
        for j in range(draw(st.integers(0, 2))):
            m = draw(st.integers(0, len(by_model) - 1))
            opts = tuple((o,) for o in by_model[m])
            calls.append(Call(f"c{t}.{j}", t, opts[0], (), draw(st.integers(t, T - 1)), opts[1:],
                              affinity=draw(st.sampled_from([m, 10 + len(calls)])),
                              wait_s=draw(st.sampled_from([None, 3.0, 8.0]))))
    return Instance(slot_s=tuple(draw(st.sampled_from([0.2, 1.0, 3.0])) for _ in range(T)), objects=tuple(objs),
                    calls=tuple(calls), hbm=tuple(draw(st.sampled_from([12.0, 20.0])) * GB for _ in range(n_gpu)),
                    h2d=(10 * GB,) * n_gpu, dram={"n0": draw(st.sampled_from([0.0, 100.0])) * GB},
                    root={"n0": 15 * GB}, nvme={"n0": 5 * GB}, lam=draw(st.sampled_from([0.0, 1e-11])))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_choice())
def test_group_choice_spans_and_waits_match_brute_force_on_both_backends(inst):
    exact = brute_force(inst)
    for backend in ("scip", "highs"):
        sol = solve(inst, backend, time_limit_s=30)
        if exact == np.inf:
            assert sol.status == "INFEASIBLE"
            continue
        assert sol.status == "OPTIMAL"
        assert sol.objective == pytest.approx(exact, rel=1e-6, abs=1e-6)
        bad, obj = evaluate(inst, sol)
        assert bad == [] and obj == pytest.approx(exact, rel=1e-6, abs=1e-6)
    g = greedy_schedule(inst)
    if g.status == "FEASIBLE":
        assert evaluate(inst, g)[0] == [] and exact <= g.objective + 1e-6


def _overlapping(options_for_m1, wait_s=None):
    """Two 15 GB models, two 20 GB GPUs; a call of each spans slots 0-2, so they overlap."""
    objs = (Obj("w:m0@0", (0,), "n0", 15 * GB, 1.0, 5.0, (0, 2)), Obj("w:m1@0", (0,), "n0", 15 * GB, 1.0, 5.0, (0, 2)),
            Obj("w:m1@1", (1,), "n0", 15 * GB, 1.0, 5.0, (0, 2)))
    calls = (Call("a", 0, (0,), (), 2), Call("b", 0, options_for_m1[0], (), 2, options_for_m1[1:], wait_s=wait_s))
    return Instance(slot_s=(10.0,) * 3, objects=objs, calls=calls, hbm=(20 * GB, 20 * GB), h2d=(25 * GB,) * 2,
                    dram={"n0": 100 * GB}, root={"n0": 50 * GB}, nvme={"n0": 7 * GB})


def test_overlapping_calls_take_another_gpu_or_wait():
    both = solve(_overlapping(((1,), (2,))), "scip", 30)  # m1 may run on GPU 0 or GPU 1
    assert both.status == "OPTIMAL" and both.stall.tolist() == pytest.approx([5.0, 5.0])
    assert both.choice[-2] == 1  # call b (index 1, its own affinity -2) took its second option, GPU 1
    assert solve(_overlapping(((1,),)), "scip", 30).status == "INFEASIBLE"  # one GPU for both, no waiting
    waits = solve(_overlapping(((1,),), wait_s=30.0), "scip", 30)
    assert waits.status == "OPTIMAL" and waits.wait.tolist() == [0.0, 1.0]
    assert waits.stall.tolist() == pytest.approx([5.0, 30.0])


def test_checker_rejects_a_model_evicted_while_its_call_runs_and_bad_choices():
    inst = _overlapping(((1,), (2,)), wait_s=30.0)
    sol = solve(inst, "scip", 30)
    assert evaluate(inst, sol)[0] == []
    x = sol.x.copy()
    x[2, 1:] = 0  # m1 leaves GPU 1 while call b still runs there
    assert any(b.startswith("(5) call b") and "t=1" in b for b in evaluate(inst, _copy(sol, x=x))[0])
    bad = _copy(sol, choice={-2: 5})
    assert any(b.startswith("(0)") for b in evaluate(inst, bad)[0])
    w = _copy(sol, wait=np.array([1.0, 0.0]))  # call a may not wait
    assert any(b.startswith("(6b) call a") for b in evaluate(inst, w)[0])


def test_the_warm_start_can_follow_the_online_planner_and_stays_feasible():
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.sim.lead import planner_guide
    from statebudget.core.costs import CostModel
    from statebudget.solvers.milp import build_instance
    from statebudget.traces.generators import generate

    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    tr, cost = generate("swe-team", 2, 0.15), CostModel(cl, cat)
    inst, index = build_instance(cl, cat, tr, cost)
    guide = planner_guide(cl, cat, tr, cost, inst, index, seed=2)
    assert guide.tiers.shape == (len(inst.objects), inst.T) and guide.tiers.min() >= 0 and guide.choice
    plain, led = greedy_schedule(inst), greedy_schedule(inst, guide)
    for sol in (plain, led):
        assert sol.status == "FEASIBLE" and evaluate(inst, sol)[0] == []
    assert plain.u.sum() + plain.v.sum() == 0  # the plain rule never prefetches or stages
    assert led.u.sum() + led.v.sum() > 0       # following the planner, it does
    rolled = solve_rolling(inst, backend="scip", time_limit_s=20, guide=guide)
    assert rolled.violations == [] and all(w["status"] == "OPTIMAL" for w in rolled.windows)


def test_a_planner_prefetch_serves_the_call_of_that_slot():
    from statebudget.solvers.milp import Guide

    # one 10 GB model in DRAM; a call at t=1; the planner had it in HBM by then (3 s x 10 GB/s suffice)
    inst = Instance(slot_s=(3.0, 3.0), objects=(Obj("w:m0@0", (0,), "n0", 10 * GB, 1.0, 4.0, (0, 1)),),
                    calls=(Call("c1", 1, (0,), ()),), hbm=(20 * GB,), h2d=(10 * GB,), dram={"n0": 100 * GB},
                    root={"n0": 15 * GB}, nvme={"n0": 5 * GB}, init=(1,))
    led = greedy_schedule(inst, Guide(np.array([[1, 0]], dtype=np.int8)))
    assert led.u[0, 1] == 1 and led.d[0, 1] == 0 and led.stall.tolist() == [0.0]
    assert evaluate(inst, led)[0] == []
    assert led.objective == pytest.approx(solve(inst, "scip", 30).objective)
    assert greedy_schedule(inst).stall.tolist() == [1.0]  # without the lead: a restore from DRAM
