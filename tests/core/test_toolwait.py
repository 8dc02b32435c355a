"""What each tool-wait KV rule does to a program's KV while it waits on a tool (`core/toolwait.py`):
the adaptive choice (the wait and resume models it reads: test_waits.py), then, replayed in the
simulator, preserve, swap, discard and adaptive, its TTL and its swap-in ahead of the
predicted return, a lease that keeps the KV, and the swap's background share of a link."""

import math

import pytest

from tests.helpers import GB, call, catalog, cluster, program, tool, trace
from statebudget.core.costs import LATENCY_S
from statebudget.core.toolwait import BACKGROUND_SHARE, adaptive_choice
from statebudget.core.waits import ToolWaitModel
from statebudget.policies import make_policy
from statebudget.sim import programs as sim_programs, transfers as sim_transfers
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator


def _waits(median_s: float, sigma: float = 0.3) -> ToolWaitModel:
    return ToolWaitModel({"t": (median_s, sigma)})


def test_adaptive_picks_the_cheapest_rule():
    kw = dict(hbm_bytes=40 * GB, pcie_bps=25 * GB, p_resume=1.0, tool="t")
    rule, ttl = adaptive_choice(1 * GB, recompute_s=1.0, waits=_waits(0.1), **kw)
    assert rule == "preserve" and ttl > 0
    assert adaptive_choice(5 * GB, recompute_s=5.0, waits=_waits(60), **kw) == ("swap", 0.0)
    assert adaptive_choice(5 * GB, recompute_s=0.01, waits=_waits(60), **kw) == ("discard", 0.0)


def test_adaptive_weighs_the_chance_of_resuming():
    # A KV its program will not come back to is not worth moving out and back, nor recomputing.
    kw = dict(hbm_bytes=40 * GB, pcie_bps=25 * GB, recompute_s=5.0, waits=_waits(60), tool="t")
    assert adaptive_choice(5 * GB, p_resume=1.0, **kw) == ("swap", 0.0)
    assert adaptive_choice(5 * GB, p_resume=0.0, **kw) == ("discard", 0.0)
    assert adaptive_choice(5 * GB, p_resume=0.01, **kw) == ("discard", 0.0)


def test_adaptive_holds_a_long_tailed_wait_for_a_ttl_not_for_its_median():
    # A tool that usually returns at once but sometimes runs for minutes (median 1 s, sigma 2.5:
    # mean 23 s). Priced at its median, holding the KV is cheaper than moving it; in expectation
    # holding it until the tool returns is dearer. The rule holds it only while a return is likely.
    waits = _waits(1.0, sigma=2.5)
    kv, hbm, pcie = 4 * GB, 40 * GB, 25 * GB
    move = 2 * kv / pcie  # out and back: 0.32 GPU-s
    assert kv / hbm * 1.0 < move < kv / hbm * waits.hold_outcomes("t", 0.0, [math.inf])[0][0]
    rule, ttl = adaptive_choice(kv, hbm, pcie, recompute_s=100.0, p_resume=1.0, waits=waits, tool="t")
    assert rule == "preserve" and 0 < ttl < math.inf
    # When the TTL runs out it acts, on the wait still to come.
    assert adaptive_choice(kv, hbm, pcie, 100.0, 1.0, waits, "t", elapsed_s=ttl) == ("swap", 0.0)
    # A tight wait distribution around the same median is held until it returns.
    assert adaptive_choice(kv, hbm, pcie, 100.0, 1.0, _waits(1.0, sigma=0.2), "t") == ("preserve", math.inf)


def test_adaptive_learns_to_discard_kv_its_programs_never_resume():
    # Each program: a call on m, a tool, then a call on another model. The KV of m is never used
    # again; the rule starts by swapping it (prior: it resumes) and turns to discarding it.
    cl, cat = cluster(hbm_gb=40.0, tflops=10.0), catalog(("m", 10.0, 1_000_000), ("n", 5.0, 1000))
    progs = [program(f"p{i}", [call("a", "m", ctx=5_000, out=0), tool("t", ["a"], duration=30.0, name="build"),
                               call("b", "n", ["t"], ctx=100, out=0)], start=40.0 * i) for i in range(12)]
    sim = Simulator(cl, cat, trace(*progs), make_policy("lru-keepwarm"),
                    config=SimConfig(kv_rule="adaptive", check_invariants=True))
    res = sim.run()
    assert res.kv_actions["swap"] >= 1 and res.kv_actions["discard"] >= 6
    assert sim.kvw.resume.p("build", "m") < 0.3
    assert res.recomputed_tokens == 0  # nothing it dropped was needed
    kv = 5_000 * 1_000_000
    assert res.bytes_by_pair["gpu->host"] == pytest.approx(res.kv_actions["swap"] * kv)
    # Swapped out while it still believed in a resume, but brought back only while P(resume) >= 0.5.
    assert res.bytes_by_pair["host->gpu"] <= 2 * kv * (1 + 1e-9) < res.bytes_by_pair["gpu->host"]


def test_adaptive_moves_a_preserved_kv_out_when_the_wait_runs_long():
    # The tool usually takes 1 s, so preserving wins at first; this one takes 50 s. Once the wait
    # outlasts the prediction the rule decides again (§12), swaps the KV out, and brings it back
    # before the call that resumes it.
    cl, cat = cluster(hbm_gb=40.0, tflops=1.0), catalog(("m", 10.0, 100_000))
    nodes = [call("a", "m", ctx=10_000, out=0), tool("t", ["a"], duration=50.0, name="quick"),
             call("b", "m", ["t"], ctx=10_000, out=0)]
    sim = Simulator(cl, cat, trace(program("p", nodes)), make_policy("lru-keepwarm"),
                    config=SimConfig(kv_rule="adaptive", check_invariants=True))
    sim.kvw.waits = ToolWaitModel({"quick": (1.0, 1.5)})
    res = sim.run()
    kv = 10_000 * 100_000
    assert res.kv_actions["preserve"] == 1 and res.kv_actions["swap"] == 1
    assert 0 < res.kv_hbm_byte_s < kv * 50.0 / 4
    assert res.calls[1].ready - res.calls[1].arrive == 0.0


def test_a_ttl_that_finds_another_thread_running_is_judged_again_later():
    # t starts when a ends; b, on another model, starts just after, so the KV of m is suspended
    # but its TTL runs out while b runs. It is judged again once b is over and swapped out, not
    # held through the whole 80 s wait.
    cl, cat = cluster(hbm_gb=40.0, tflops=10.0), catalog(("m", 10.0, 100_000), ("n", 10.0, 1000))
    nodes = [call("a", "m", ctx=10_000, out=0), tool("t", ["a"], duration=80.0, name="quick"),
             tool("t0", [], duration=16.0, name="other"), call("b", "n", ["t0"], ctx=20_000, out=0),
             call("c", "m", ["t", "b"], ctx=10_000, out=0)]
    sim = Simulator(cl, cat, trace(program("p", nodes)), make_policy("lru-keepwarm"),
                    config=SimConfig(kv_rule="adaptive", check_invariants=True))
    sim.kvw.waits = ToolWaitModel({"quick": (1.0, 1.5), "other": (16.0, 0.1)})
    res = sim.run()
    a, b, _ = res.calls
    assert a.end < b.arrive  # the program is idle when the tool starts: the KV is suspended
    assert res.kv_actions["preserve"] == 1 and res.kv_actions["swap"] == 1
    assert 0 < res.kv_hbm_byte_s < 10_000 * 100_000 * 80.0 / 2


def _tool_wait_trace(wait=50.0):
    nodes = [call("a", "m", ctx=10_000, out=0), tool("t", ["a"], duration=wait, name="build"),
             call("b", "m", ["t"], ctx=10_000, out=0)]
    return trace(program("p", nodes))


@pytest.mark.parametrize("rule", ["preserve", "swap", "discard"])
def test_tool_wait_kv_rules(rule):
    cl, cat = cluster(tflops=10.0), catalog(("m", 10.0, 100_000))
    sim = Simulator(cl, cat, _tool_wait_trace(), make_policy("lru-keepwarm"),
                    config=SimConfig(kv_rule=rule, check_invariants=True))
    res = sim.run()
    kv = 10_000 * 100_000
    assert res.kv_actions[rule] == 1
    second = res.calls[1]
    if rule == "preserve":
        assert res.kv_hbm_byte_s == pytest.approx(kv * 50.0)
        assert second.ready - second.arrive == 0.0 and res.recomputed_tokens == 0
    elif rule == "swap":
        assert res.kv_hbm_byte_s == 0.0
        assert res.bytes_by_pair["gpu->host"] == pytest.approx(kv)
        assert res.bytes_by_pair["host->gpu"] == pytest.approx(kv)  # onboarded when the call came back
        assert second.ready - second.arrive == pytest.approx(kv / (25 * GB), abs=1e-3)
    else:
        assert res.kv_hbm_byte_s == 0.0 and res.recomputed_tokens == 10_000
        assert second.ready - second.arrive == pytest.approx(sim.cost.prefill_s(cat.by_name["m"], 10_000, (0,)), rel=1e-6)


def test_a_call_that_comes_back_during_the_swap_out_keeps_its_kv():
    # The tool returns after 10 ms, while the 1 GB swap-out (40 ms over PCIe) is still being
    # written: the move stops and the KV, which never left HBM, serves the call at once (the live
    # planner does the same with its open demote op).
    cl, cat = cluster(tflops=10.0), catalog(("m", 10.0, 100_000))
    kv = 10_000 * 100_000
    sim = Simulator(cl, cat, _tool_wait_trace(wait=0.01), make_policy("lru-keepwarm"),
                    config=SimConfig(kv_rule="swap", check_invariants=True))
    res = sim.run()
    assert res.kv_actions["swap"] == 1
    assert 0 < res.bytes_by_pair["gpu->host"] < kv  # stopped part way
    assert res.bytes_by_pair["host->gpu"] == 0.0 and res.recomputed_tokens == 0
    assert res.calls[1].ready - res.calls[1].arrive == 0.0
    assert not sim.tiers.host  # the half-written host copy is gone


def test_a_kv_leased_for_the_next_call_is_kept_through_the_tool_wait():
    # The runtime announces the next call (on the same model) while the tool runs: statebudget-lease
    # leases it with the program's KV, and the swap rule keeps that KV; without leases it swaps.
    cl, cat = cluster(tflops=10.0), catalog(("m", 10.0, 100_000))
    nodes = [call("a", "m", ctx=10_000, out=0), tool("t", ["a"], duration=50.0, name="build"),
             call("b", "m", ["t"], ctx=10_000, out=0)]
    hints = [{"issued_at": "t", "for": "b", "model": "m", "confidence": 0.9}]
    out = {}
    for policy in ("statebudget", "statebudget-lease"):
        res = Simulator(cl, cat, trace(program("p", nodes, hints=hints)), make_policy(policy),
                        config=SimConfig(kv_rule="swap", check_invariants=True)).run()
        out[policy] = dict(+res.kv_actions), res.bytes_by_pair["gpu->host"]
    assert out["statebudget"] == ({"swap": 1}, pytest.approx(10_000 * 100_000))
    assert out["statebudget-lease"] == ({"preserve": 1}, 0.0)


def test_adaptive_swaps_ahead_of_the_predicted_return():
    # A build (median ~11 s) on a large KV: swapping beats holding a big share of the GPU, and the
    # KV is brought back before the predicted end, so the next call finds it in HBM.
    cl, cat = cluster(hbm_gb=40.0, tflops=10.0), catalog(("m", 10.0, 1_000_000))
    sim = Simulator(cl, cat, _tool_wait_trace(wait=30.0), make_policy("lru-keepwarm"),
                    config=SimConfig(kv_rule="adaptive"))
    res = sim.run()
    assert res.kv_actions["swap"] == 1
    assert res.calls[1].ready - res.calls[1].arrive == 0.0
    assert len(res.ttl_errors) == 1 and res.ttl_errors[0] < 0  # it predicted a shorter build


@pytest.mark.parametrize("share", [BACKGROUND_SHARE, 1.0])
def test_a_tool_wait_swap_yields_the_link_to_a_weight_load(monkeypatch, share):
    # A 20 GB KV swaps out through the node's 10 GB/s root complex while another GPU loads 14 GB
    # of weights through it. As a background transfer (weight 0.25) the swap gets a fifth of the
    # root and the load four fifths; at full weight they would split it evenly.
    monkeypatch.setattr(sim_programs, "BACKGROUND_SHARE", share)
    monkeypatch.setattr(sim_transfers, "BACKGROUND_SHARE", share)
    cl = cluster(gpus=2, hbm_gb=80.0, h2d=25.0, nvme_read=30.0, root=10.0, cold=0.0)
    cat = catalog(("m", 10.0, 1_000_000), ("n", 14.0))
    a = program("a", [call("a", "m", ctx=20_000, out=0), tool("t", ["a"], duration=100.0, name="build"),
                      call("b", "m", ["t"], ctx=20_000, out=0)])
    end_a = Simulator(cl, cat, trace(a), make_policy("ondemand"), config=SimConfig(kv_rule="swap")).run().calls[0].end
    b = program("b", [call("x", "n", ctx=100, out=0)], start=end_a + 0.5)
    res = Simulator(cl, cat, trace(a, b), make_policy("ondemand"),
                    config=SimConfig(kv_rule="swap", check_invariants=True)).run()
    x = next(c for c in res.calls if c.program == "b")
    root_share = 10.0 * 1.0 / (1.0 + share)
    assert x.ready - x.arrive == pytest.approx(14.0 / root_share + LATENCY_S["nvme"], abs=1e-6)
