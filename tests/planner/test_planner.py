"""The online planner: predictor, greedy solver, and the statebudget policies in the simulator,
including random lease storms (hypothesis)."""

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.helpers import GB, call, catalog, cluster, program, tool, trace
from statebudget.planner.config import PlannerConfig
from statebudget.planner.leases import LeaseState
from statebudget.planner.predictor import Predictor
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.policies import make_policy
from statebudget.policies.ours import StateBudgetLease
from statebudget.solvers.greedy import Candidates, solve


def test_switch_matrix_learns_and_forgets():
    p = Predictor(["a", "b", "c"], half_life_s=100.0)
    for i in range(20):
        p.program_started(f"p{i}", "t", now=float(i))
        p.call_arrived(f"p{i}", "a", now=float(i))
        p.call_arrived(f"p{i}", "b", now=float(i))
    m = p.switch_matrix(20.0)
    assert m[0, 1] > 0.9  # a -> b
    for i in range(20, 40):  # the phase drifts: a -> c
        p.program_started(f"p{i}", "t", now=1000.0 + i)
        p.call_arrived(f"p{i}", "a", now=1000.0 + i)
        p.call_arrived(f"p{i}", "c", now=1000.0 + i)
    m = p.switch_matrix(1040.0)
    assert m[0, 2] > 0.9 and m[0, 1] < 0.05
    assert np.allclose(m.sum(axis=1), 1.0)


def test_tenant_rows_blend_with_the_team():
    p = Predictor(["a", "b"], half_life_s=1e9)
    for i in range(30):
        p.program_started(f"x{i}", "alice", 0.0)
        p.call_arrived(f"x{i}", "a", 0.0)
        p.call_arrived(f"x{i}", "b", 0.0)
        p.program_started(f"y{i}", "bob", 0.0)
        p.call_arrived(f"y{i}", "a", 0.0)
        p.call_arrived(f"y{i}", "a", 0.0)
    assert p.switch_matrix(1.0, "alice")[0, 1] > 0.6 > p.switch_matrix(1.0)[0, 1] > p.switch_matrix(1.0, "bob")[0, 1]


def test_stacked_tenant_matrices_are_each_tenants_own_switch_matrix():
    # tenants counted at different instants (the stack decays as one), one seen only in a
    # program's row (no counts: the team's matrix), read later than every count
    p = Predictor(["a", "b", "c"], half_life_s=600.0)
    for t, (tenant, models) in enumerate([("x", "ab"), ("y", "bcc"), ("x", "ca"), ("z", "")]):
        p.program_started(f"{tenant}{t}", tenant, 300.0 * t)
        for m in models:
            p.call_arrived(f"{tenant}{t}", m, 300.0 * t + 1)
    p.p_next_within(1000.0, 30.0)  # builds every program's row: z gets its index there
    mats = p._tenant_matrices(1000.0)
    for tenant, i in p._tenants.items():
        assert np.array_equal(mats[i], p.switch_matrix(1000.0, tenant))
    assert np.array_equal(mats[p._tenants["z"]], p.switch_matrix(1000.0))
    # from first principles: each count halves every 600 s until 1000 s
    n, idx = 3, {"a": 0, "b": 1, "c": 2, None: 3}
    adds = {"x": [(1, None, "a"), (1, "a", "b"), (601, None, "c"), (601, "c", "a")],
            "y": [(301, None, "b"), (301, "b", "c"), (301, "c", "c")]}
    team = np.zeros((n + 1, n + 1))
    own = {t: np.zeros((n + 1, n + 1)) for t in adds}
    for tenant, rows in adds.items():
        for t, last, nxt in rows:
            team[idx[last], idx[nxt]] += 0.5 ** ((1000 - t) / 600.0)
            own[tenant][idx[last], idx[nxt]] += 0.5 ** ((1000 - t) / 600.0)
    for tenant in adds:
        c = team + p.tenant_weight * own[tenant] + p.prior / (n + 1)
        assert np.allclose(mats[p._tenants[tenant]], c / c.sum(axis=1, keepdims=True), rtol=1e-12)


def test_need_within_follows_a_hint_and_the_clock():
    p = Predictor(["planner", "coder", "reviewer"])
    p.program_started("p", "t", 0.0)
    p.call_arrived("p", "planner", 0.0)
    p.call_finished("p", 1.0)
    p.tool_started("p", "search", 1.0)
    p.hinted("p", "reviewer", 0.95)
    _, with_hint = p.need_within(1.0, 60.0, use_hints=True)
    _, without = p.need_within(1.0, 60.0, use_hints=False)
    assert with_hint[0, 2] > 0.5 > without[0, 2]
    _, soon = p.need_within(1.0, 0.01, use_hints=True)
    assert soon[0, 2] < 0.05


def _cands(values, resident, per_gpu, groups, n_gpu):
    member = np.zeros((len(values), n_gpu), bool)
    for i, g in enumerate(groups):
        member[i, list(g)] = True
    paths = [{} if r else {f"h2d:{g[0]}": per_gpu[i]} for i, (r, g) in enumerate(zip(resident, groups))]
    return Candidates([("w", str(i)) for i in range(len(values))], groups, member, np.asarray(per_gpu, float),
                      np.asarray(values, float), np.asarray(resident), paths)


EVENTS = st.lists(st.tuples(st.sampled_from(["start", "call", "end", "tool", "hint", "cancel", "finish", "step"]),
                             st.integers(0, 4), st.integers(0, 2), st.floats(0.1, 30.0)), max_size=40)


@given(EVENTS)
@example([("start", 0, 0, 1.0), ("start", 1, 0, 1.0), ("step", 0, 0, 1.0),
          ("call", 1, 2, 1.0), ("start", 1, 0, 1.0), ("step", 0, 0, 1.0)])  # p1 restarts with a dropped row
@settings(max_examples=60, deadline=None)
def test_cached_program_rows_match_a_rebuild_from_scratch(events):
    """The predictor keeps each live program's row between steps; after any sequence of events
    (several between two steps, an id started again while live) its estimates equal those of the
    same predictor with every cached row dropped."""
    models = ["a", "b", "c"]
    pred = Predictor(models)
    now = 0.0
    for kind, k, mi, dt in events:
        now += dt
        prog = f"p{k}"
        if kind == "start":
            pred.program_started(prog, f"t{k % 2}", now)
        elif kind == "call":
            pred.call_arrived(prog, models[mi], now, expected_s=dt)
        elif kind == "end":
            pred.call_finished(prog, now)
        elif kind == "tool":
            pred.tool_started(prog, ["search", "test", "build"][mi], now)
        elif kind == "hint":
            pred.hinted(prog, models[mi], 0.7, call=f"n{mi}")
        elif kind == "cancel":
            pred.call_cancelled(prog, f"n{mi}")
        elif kind == "finish":
            pred.program_finished(prog, now)
        else:
            _assert_same_as_rebuilt(pred, now)
    _assert_same_as_rebuilt(pred, now)


def _assert_same_as_rebuilt(pred, now):
    # the scratch copy keeps none of the row bookkeeping: its rows come from `live` alone
    scratch = copy.deepcopy(pred)
    for lp in scratch.live.values():
        lp.rec, lp.row = None, -1
    scratch._rows_array, scratch._rows_progs = None, []
    scratch._dirty, scratch._born, scratch._gone = [], [], False
    scratch._cache_key = None
    scratch._memo.clear()
    for hints in (True, False):
        later = now + 1.0
        assert np.array_equal(pred.need_within(later, 30.0, hints)[1], scratch.need_within(later, 30.0, hints)[1])
    assert [lp.program for lp in pred._rows_progs] == list(pred.live)
    assert np.array_equal(pred._rows(), scratch._rows())


def test_greedy_takes_the_most_stall_saved_per_byte_within_hbm_and_links():
    # One GPU of 10 bytes: densities 1.0 (5 B), 0.5 (4 B), 2.0 (8 B) -> takes the 8 B one only.
    c = _cands([5.0, 2.0, 16.0], [False] * 3, [5, 4, 8], [(0,)] * 3, 1)
    plan = solve(c, np.array([10.0]), {"h2d:0": 100.0}, hysteresis=0.0)
    assert plan.target.tolist() == [False, False, True] and plan.promote == [2]
    # Link budget: the target is kept but not promoted now.
    plan = solve(c, np.array([10.0]), {"h2d:0": 1.0}, hysteresis=0.0)
    assert plan.target[2] and plan.promote == []


def test_greedy_hysteresis_keeps_a_resident_against_a_slightly_better_newcomer():
    c = _cands([10.0, 11.0], [True, False], [8, 8], [(0,), (0,)], 1)
    assert solve(c, np.array([10.0]), {"h2d:0": 100.0}, hysteresis=0.3).target.tolist() == [True, False]
    assert solve(c, np.array([10.0]), {"h2d:0": 100.0}, hysteresis=0.0).target.tolist() == [False, True]


def test_tp_groups_need_room_on_every_gpu():
    c = _cands([100.0, 1.0], [False, False], [6, 6], [(0, 1), (1,)], 2)
    plan = solve(c, np.array([10.0, 5.0]), {"h2d:0": 100.0, "h2d:1": 100.0}, hysteresis=0.0)
    assert plan.target.tolist() == [False, False]


def _handoff_trace(tool_s=20.0, n=4):
    progs = []
    for i in range(n):
        nodes = [call("a", "m1"), tool("t", ["a"], duration=tool_s), call("b", "m2", ["t"]),
                 tool("u", ["b"], duration=tool_s), call("c", "m1", ["u"])]
        hints = [{"issued_at": "t", "for": "b", "model": "m2", "confidence": 0.9},
                 {"issued_at": "u", "for": "c", "model": "m1", "confidence": 0.9}]
        progs.append(program(f"p{i}", nodes, start=200.0 * i, hints=hints))
    return trace(*progs)


def test_statebudget_lease_prepares_the_hinted_model_before_the_handoff():
    # One 24 GB GPU, two 14 GB models: every handoff needs a swap; the tool wait hides it.
    cl, cat = cluster(hbm_gb=24.0, cold=5.0, wake=0.5), catalog(("m1", 14.0), ("m2", 14.0))
    tr = _handoff_trace()
    pol = make_policy("statebudget-lease")
    res = Simulator(cl, cat, tr, pol, config=SimConfig(check_invariants=True)).run()
    od = Simulator(cl, cat, tr, make_policy("lru-keepwarm")).run()
    handoff = [c.ready - c.arrive for c in res.calls if c.handoff]
    baseline = [c.ready - c.arrive for c in od.calls if c.handoff]
    assert max(handoff[2:]) < 0.05 < min(baseline)
    assert pol.core.ledger.counts().get("consumed", 0) >= 4


def test_a_cancelled_branch_stops_its_lease_transfer():
    # No room in host DRAM to stage anything: m2 comes from a 3 GB/s NVMe (3.3 s), well within the
    # lease's deadline (a low quantile of a search's wait), and the branch is abandoned after 1 s.
    cl, cat = cluster(hbm_gb=40.0, cold=0.0, nvme_read=3.0, host_gb=1.0), catalog(("m1", 10.0), ("m2", 10.0))
    nodes = [call("a", "m1"), tool("t", ["a"], duration=30.0, name="search"), call("b", "m2", ["t"]),
             tool("fast", ["a"], duration=1.0)]
    hints = [{"issued_at": "t", "for": "b", "model": "m2", "confidence": 0.9}]
    tr = trace(program("p", nodes, hints=hints, cancel=[{"node": "t", "at_after": "fast"}]))
    pol = StateBudgetLease(PlannerConfig(promote_min_p=1.1))  # leases only: no speculative promotions
    sim = Simulator(cl, cat, tr, pol, config=SimConfig(check_invariants=True))
    res = sim.run()
    assert [c.state for c in res.calls] == ["done", "cancelled"]
    states = [l.state for l in pol.core.ledger.leases.values()]
    assert states == [LeaseState.CANCELLED]
    # m1 (10 GB), then m2 stopped after ~1 s of its 3.3 s: it never became usable.
    assert 12 * GB < res.bytes_by_pair["nvme->gpu"] < 14 * GB
    assert res.wasted_bytes == pytest.approx(res.bytes_by_pair["nvme->gpu"] - 10 * GB)
    assert ("w", "m2") not in {k for k, _ in sim.tiers.gpu}


@st.composite
def storms(draw):
    n_gpu = draw(st.integers(1, 3))
    cl = cluster(gpus=n_gpu, hbm_gb=draw(st.sampled_from([16.0, 24.0])), cold=draw(st.sampled_from([0.0, 2.0])),
                 host_gb=draw(st.sampled_from([8.0, 64.0])))
    models = [(f"m{i}", draw(st.floats(1.0, 12.0)), draw(st.sampled_from([1000, 200_000]))) for i in range(3)]
    cat = catalog(*models)
    names = [m[0] for m in models]
    progs = []
    for p in range(draw(st.integers(1, 6))):
        nodes, prev, hints, cancels = [], [], [], []
        for k in range(draw(st.integers(1, 4))):
            c, t = f"c{k}", f"t{k}"
            nodes.append(call(c, draw(st.sampled_from(names)), prev, ctx=draw(st.integers(0, 20_000)), out=50))
            nodes.append(tool(t, [c], duration=draw(st.floats(0.0, 20.0))))
            prev = [t]
        calls = [n["id"] for n in nodes if n["kind"] == "call"]
        ids = [n["id"] for n in nodes]
        for c in calls:  # a storm: several hints per call, some wrong, some for branches to cancel
            for _ in range(draw(st.integers(0, 3))):
                hints.append({"issued_at": draw(st.sampled_from(ids)), "for": c, "model": draw(st.sampled_from(names)),
                              "confidence": draw(st.floats(0.05, 1.0))})
        if draw(st.booleans()):
            cancels.append({"node": draw(st.sampled_from(ids)), "at_after": draw(st.sampled_from(ids))})
        progs.append(program(f"p{p}", nodes, start=draw(st.floats(0, 30)), hints=hints, cancel=cancels))
    return cl, cat, trace(*progs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(storms())
def test_capacities_hold_under_random_lease_storms(sc):
    cl, cat, tr = sc
    pol = make_policy("statebudget-lease")
    sim = Simulator(cl, cat, tr, pol, config=SimConfig(check_invariants=True))
    res = sim.run()
    assert {c.state for c in res.calls} <= {"done", "cancelled", "unplaceable"}
    assert all(pr.end >= 0 for pr in res.programs.values())
    assert not sim.flows.flows and not sim.tiers.private
    ledger = pol.core.ledger
    for lease in ledger.leases.values():
        # Nothing is published once a lease is cancelled, stale or expired (it may have been before).
        if lease.state in (LeaseState.CANCELLED, LeaseState.STALE, LeaseState.EXPIRED) and lease.ready_s is not None:
            assert lease.ready_s <= lease.ended_s, f"{lease.lease_id} published after it ended"
        assert lease.state != LeaseState.SUBMITTED


def test_prefill_weight_places_a_long_prompt_on_the_faster_gpu():
    from statebudget.models import Cluster

    cl = Cluster.model_validate({
        "name": "two-speeds", "hbm_reserve_frac": 0.0,
        "gpu_kinds": {k: {"hbm_gb": 40, "hbm_gbps": 1555, "h2d_gbps": 25, "d2h_gbps": 25, "tflops": tf,
                          "wake_s": 0.5, "cold_start_s": 10.0} for k, tf in (("Slow", 30.0), ("Fast", 300.0))},
        "nodes": [{"name": "n0", "host_dram_gb": 256, "nvme_gb": 4000, "nvme_read_gbps": 7, "nvme_write_gbps": 5,
                   "root_gbps": 50, "gpus": {"Slow": 1, "Fast": 1}}]})
    slow = next(i for i, g in enumerate(cl.gpus) if g.kind == "Slow")
    tr = trace(program("p", [call("a", "m", ctx=50_000, out=10)]))
    placed = {}
    for w in (0.0, 1.0):
        sim = Simulator(cl, catalog(("m", 10.0)), tr, StateBudgetLease(PlannerConfig(place_prefill_weight=w)))
        placed[w] = sim.run().calls[0].group
    # the weights are nowhere, so both GPUs restore alike: restore alone breaks the tie by index,
    # restore plus prefill takes the GPU with 10x the FLOP/s
    assert slow == 0 and placed[0.0] == (slow,)
    assert cl.gpus[placed[1.0][0]].kind == "Fast"


@pytest.mark.parametrize("p,price,promoted", [(0.5, 0.0, True), (0.5, 1.0, False), (1.0, 1.0, True)])
def test_a_promotion_pays_for_the_bytes_it_would_waste(p, price, promoted):
    # a 20 GB model needed with probability p: its value is p x restore (~11 s from host, with the
    # cold start); at 1 s/GB, the (1 - p) x 20 GB it may waste outweighs it unless it is sure
    from statebudget.policies.ours import StateBudget
    cl, cat = cluster(gpus=1, hbm_gb=80.0), catalog(("m", 20.0))  # within the warm budget's share
    pol = StateBudget(PlannerConfig(waste_price_s_per_gb=price, promote_min_p=0.1))
    sim = Simulator(cl, cat, trace(program("p", [call("a", "m")])), pol, config=SimConfig(start="warm"))
    core = pol._core(sim)
    core.predictor.model_need_within = lambda now, horizon_s, use_hints=True: np.array([p])
    promotes = [(d.key, d.group) for d in core.plan(sim, 0.0) if type(d).__name__ == "Promote"]
    assert (promotes == [(("w", "m"), (0,))]) == promoted


@pytest.mark.parametrize("budget,promoted", [(0.2, set()), (0.3, {"a"}), (0.6, {"a", "b"})])
def test_idle_weights_are_promoted_only_within_the_warm_budget(budget, promoted):
    # two idle 20 GB models, both sure to be needed, on one 80 GB GPU: the warm budget's share of
    # HBM (x 80 GB) holds none, one (the likelier) or both; without it the target set takes both
    from statebudget.policies.ours import StateBudget
    cl, cat = cluster(gpus=1, hbm_gb=80.0), catalog(("a", 20.0), ("b", 20.0))
    pol = StateBudget(PlannerConfig(warm_budget=budget, waste_price_s_per_gb=0.0, promote_min_p=0.1))
    sim = Simulator(cl, cat, trace(program("p", [call("x", "a")])), pol, config=SimConfig(start="warm"))
    core = pol._core(sim)
    core.predictor.model_need_within = lambda now, horizon_s, use_hints=True: np.array([1.0, 0.9])
    got = {d.key[1] for d in core.plan(sim, 0.0) if type(d).__name__ == "Promote" and d.key[0] == "w"}
    assert got == promoted


def test_at_the_default_price_pages_need_higher_odds_than_weights():
    # the reasoner (MoE) needed with P 0.6: its weights are promoted either way (their restore
    # includes an engine start); its hot expert pages, worth only their transfer, only unpriced
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.policies.ours import StateBudget
    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    promoted = {}
    for price in (0.0, PlannerConfig().waste_price_s_per_gb):
        pol = StateBudget(PlannerConfig(waste_price_s_per_gb=price))
        sim = Simulator(cl, cat, trace(program("p", [call("a", "reasoner")])), pol, config=SimConfig(start="cold"))
        core = pol._core(sim)
        p = np.array([0.6 if m.name == "reasoner" else 0.0 for m in cat.models])
        core.predictor.model_need_within = lambda now, horizon_s, use_hints=True: p
        promoted[price] = {d.key[0] for d in core.plan(sim, 0.0) if type(d).__name__ == "Promote"}
    assert promoted[0.0] == {"w", "e"}
    assert promoted[PlannerConfig().waste_price_s_per_gb] == {"w"}


def test_the_kept_kv_sources_are_the_views_at_every_step():
    # swe-team on the shared cluster: KV goes to host DRAM and NVMe and comes back while the step
    # keeps paths and rates per (model, length, group, host, NVMe); each must be what the view's
    # own source gives
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.traces.generators import generate
    pol = make_policy("statebudget-lease")
    asked = []

    def checked(core):
        keep = core._kv_source

        def source(view, kvk, m, group, tokens, per_gpu):
            got = keep(view, kvk, m, group, tokens, per_gpu)
            src = view.best_source(kvk, group)
            assert got == (core._path_bytes(src, group, per_gpu), core._kv_rates(m, group))
            asked.append(src.split(":")[0])
            return got
        core._kv_source = source
        return core
    make = pol._core
    pol._core = lambda sim: pol.core or checked(make(sim))
    Simulator(load_cluster("hetero16"), load_catalog("agent-team"), generate("swe-team", 4, 0.6, load=3.0), pol,
              config=SimConfig(start="warm", seed=4)).run()
    assert len(asked) > 200 and {"host", "none"} <= set(asked), (len(asked), set(asked))


def test_the_vectorised_normal_cdf_is_within_its_stated_error():
    # Abramowitz & Stegun 7.1.26 promises |error| < 1.5e-7 on erf: the CDF, computed in place,
    # must be within that of math.erf's, symmetric, and leave its input as it was
    import math
    from statebudget.planner.predictor import _norm_cdf
    x = np.concatenate((np.linspace(-9.0, 9.0, 2001), [0.0, -0.0, 1e-12, 40.0, -40.0]))
    kept = x.copy()
    got = _norm_cdf(x)
    want = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    assert np.abs(got - want).max() < 1.5e-7 and np.array_equal(x, kept)
    assert np.allclose(got + _norm_cdf(-x), 1.0, atol=3e-7) and got[-2] == 1.0 and got[-1] == 0.0


@pytest.mark.parametrize("name", ["statebudget", "statebudget-lease"])
def test_a_planner_taking_up_what_it_learnt_loads_the_first_model_before_the_first_call(name):
    # Yesterday a program began every 10 s, always with `b`. From a cold start a planner with no
    # history loads nothing before the first call, which pays the cold start; one that took up
    # what it learnt has `b` ready when the first program comes.
    cl, cat = cluster(gpus=1, hbm_gb=40.0, cold=10.0), catalog(("a", 10.0), ("b", 10.0))
    yesterday = trace(*(program(f"y{i}", [call("n0", "b"), tool("t", ["n0"], 5.0), call("n1", "a", ["t"])],
                                start=10.0 * i) for i in range(60)))
    old = make_policy(name)
    sim = Simulator(cl, cat, yesterday, old, config=SimConfig(start="cold"))
    sim.run()
    today = trace(program("p", [call("n0", "b")], start=40.0))
    stalls = {}
    for history in (None, old.learnt(sim.now)):
        pol = make_policy(name)
        if history is not None:
            pol.take_up(history, 0.0)
        res = Simulator(cl, cat, today, pol, config=SimConfig(start="cold")).run()
        (c,) = res.calls
        stalls[history is not None] = c.ready - c.arrive
    assert stalls[False] >= 10.0 and stalls[True] == pytest.approx(0.0, abs=1e-6)


def test_a_planner_refuses_another_policys_saved_state():
    with pytest.raises(ValueError, match="format"):
        make_policy("statebudget-lease").take_up({"policy": "frequency", "hotness": {}}, 0.0)
