"""The tool-wait KV rule carried out (`core/kvwait.py`), once, against both of its mechanisms: the
simulator (a trace replayed, its timers on the event heap) and the live planner (runtime events on
a fake clock, its timers on `kv_timers`, each op reported done at once). Both run the same program
on the toy2 cluster and toy catalog: a planner call leaves its KV in HBM, then the program waits
on a tool; the scenario looks where the KV is at set moments of the wait."""

from __future__ import annotations

import pytest

from statebudget.planner.config import lease_config
from tests.helpers import Clock, call, make_live_planner, program, report_op, tool, trace
from statebudget.core.waits import ToolWaitModel
from statebudget.models.load import load_catalog, load_cluster
from statebudget.models.state import kv_key
from statebudget.policies import make_policy
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.sim.loop import PRIO_TICK

TOKENS = 20_000  # 82 MB of the toy planner's KV
KV = kv_key("p1", "planner")


def where(tiers) -> str:
    """Where the program's KV is: "hbm" (a ready copy on a GPU), "host" (in host DRAM only) or "none"."""
    if any(k == KV and c.ready for (k, _), c in tiers.gpu.items()):
        return "hbm"
    if any(k == KV and c.ready for (k, _), c in tiers.host.items()):
        return "host"
    return "none"


def run_sim(rule, wait, name, probes, waits=None, busy=False):
    """The simulator: call a, then the tool; `busy`: another thread's call (on coder) runs through
    the tool's start. Returns where the KV is `probes` seconds into the wait, and the actions."""
    nodes = [call("a", "planner", ctx=TOKENS, out=0), tool("t", ["a"], duration=wait, name=name),
             call("b", "planner", ["t"], ctx=TOKENS, out=0)]
    if busy:
        nodes.append(call("c", "coder", ctx=TOKENS, out=3000))
    sim = Simulator(load_cluster("toy2"), load_catalog("toy"), trace(program("p1", nodes)), make_policy("lru-keepwarm"),
                    config=SimConfig(kv_rule=rule, check_invariants=True))
    if waits is not None:
        sim.kvw.waits = ToolWaitModel(waits)
    seen, started = {}, sim._tool_wait_kv

    def tool_started(pr, nid):  # look at the KV at set moments of the wait
        started(pr, nid)
        assert not busy or pr.calls["c"].state != "done"  # the other thread's call still runs
        for dt in probes:
            sim.push(sim.now + dt, PRIO_TICK, lambda dt=dt: seen.__setitem__(dt, where(sim.tiers)), ())

    sim._tool_wait_kv = tool_started
    sim.run()
    return [seen[dt] for dt in probes], dict(+sim.kvw.actions)


def run_service(rule, wait, name, probes, waits=None, busy=False):
    """The live planner, through the same program's events; `busy`: another thread's call (on
    coder) starts before the tool and ends half way through the wait."""
    clock = Clock(0.0)
    # no speculative promotes, as lru-keepwarm on the simulator's side: the tool-wait rule alone
    p = make_live_planner(clock, kv_rule=rule, config=lease_config(promote_min_p=1.01))
    if waits is not None:
        p.kvw.waits = ToolWaitModel(waits)
    done = set()

    def engine():  # an engine that carries out every op it is given at once
        while (todo := [r for r in p.ops.values() if r.op.op_id not in done]):
            for r in todo:
                done.add(r.op.op_id)
                report_op(p, r.op)

    def until(t):  # time passes: timers fire as they fall due
        while (d := p.due_in()) is not None and clock.t + d <= t:
            clock.t = max(clock.t, clock.t + d)
            p.tick()
            engine()
        clock.t = t
        p.tick()
        engine()

    ev = lambda **e: p.event("a", e)  # noqa: E731
    ev(type="program_started", program="p1")
    ev(type="call_arrived", program="p1", call="c1", model="planner")
    ev(type="call_started", program="p1", call="c1")
    engine()
    clock.t = 1.0
    ev(type="call_finished", program="p1", call="c1", tokens=TOKENS)
    engine()
    if busy:
        ev(type="call_arrived", program="p1", call="c2", model="coder")
        ev(type="call_started", program="p1", call="c2")
    ev(type="tool_started", program="p1", tool=name, call="t1")
    engine()
    seen, t0 = [], clock.t
    for dt in sorted(set(probes) | ({wait / 2} if busy else set())):
        until(t0 + dt)
        if busy and dt == wait / 2:
            ev(type="call_finished", program="p1", call="c2", tokens=100)
            engine()
        if dt in probes:
            seen.append(where(p.tiers))
    until(t0 + wait)
    ev(type="tool_finished", program="p1", tool=name, call="t1")
    p.tiers.check()
    return seen, dict(+p.kvw.actions)


@pytest.fixture(params=["sim", "service"])
def mechanism(request):
    return {"sim": run_sim, "service": run_service}[request.param]


def test_preserve_keeps_the_kv_in_hbm_through_the_wait(mechanism):
    seen, actions = mechanism("preserve", 30.0, "build", [0.01, 10.0, 29.0])
    assert seen == ["hbm", "hbm", "hbm"]
    assert actions == {"preserve": 1}  # one action, never judged again (no TTL)


def test_swap_moves_the_kv_to_host_dram_for_the_wait(mechanism):
    seen, actions = mechanism("swap", 30.0, "build", [5.0, 29.0])
    assert seen == ["host", "host"]  # (the swap rule predicts no return: it comes back with the call)
    assert actions == {"swap": 1}


def test_adaptive_swaps_a_long_wait_out_and_back_before_its_predicted_return(mechanism):
    # 20 s expected: holding a fifth of the GPU that long costs more than the round trip over PCIe.
    # The swap-in is due ahead of the predicted return (20 s), before the tool ends (30 s).
    seen, actions = mechanism("adaptive", 30.0, "long", [5.0, 19.0, 25.0], waits={"long": (20.0, 0.1)})
    assert seen == ["host", "host", "hbm"]
    assert actions == {"swap": 1}


def test_discard_drops_the_kv(mechanism):
    seen, actions = mechanism("discard", 30.0, "build", [5.0, 29.0])
    assert seen == ["none", "none"]
    assert actions == {"discard": 1}


def test_a_recheck_after_the_ttl_judges_the_kv_again_on_the_wait_still_to_come(mechanism):
    # The tool usually takes 50 ms (a long tail): the KV is held for a TTL (at least 1 ms), judged
    # again when it runs out with the tool still running, and moved out once the wait has run long.
    # Judged on the whole wait again (as if it had just begun) it would be held to the end.
    waits = {"quick": (0.05, 1.5)}
    seen, actions = mechanism("adaptive", 30.0, "quick", [1e-4, 29.0], waits=waits)
    assert seen[0] == "hbm"
    assert actions == {"preserve": 1, "swap": 1}
    assert seen[1] in ("host", "hbm")  # out, and back in if the swap-in fell due within the wait


@pytest.mark.parametrize("rule", ["swap", "discard"])
def test_a_program_whose_other_thread_s_call_runs_does_not_suspend_its_kv(mechanism, rule):
    seen, actions = mechanism(rule, 30.0, "build", [0.01, 29.0], busy=True)
    assert seen == ["hbm", "hbm"]
    assert actions == {}
