"""Engine lifecycle physics (DESIGN.md §3): an asleep engine wakes only on its own group, for the
copy plus `wake_s`; a host copy used on any other group is a new engine, `cold_start_s` plus the
copy; asleep engines hold their weights in host DRAM and their overhead in HBM."""

import pytest

from tests.helpers import GB, call, catalog, cluster, program, tool, trace
from statebudget.core.costs import LATENCY_S
from statebudget.models.state import weights_key
from statebudget.policies.base import Policy
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator

WAKE, COLD, H2D, OVERHEAD = 0.5, 10.0, 25.0, 1.0


class Pinned(Policy):
    """Program p1 runs on GPU 0, every other program on GPU 1; evicted weights sleep."""
    name = "pinned"
    demote_to = "host"

    def __init__(self):
        self.seen = {}

    def place(self, sim, call):
        return (0,) if call.program == "p1" else (1,)

    def on_call_arrive(self, sim, call):
        t = sim.tiers
        self.seen[(call.program, call.node)] = {
            "engines": {(k[1], g): e.asleep for (k, g), e in t.engines.items()},
            "host_used": t.host_used["n0"], "hbm_used": list(t.hbm_used)}


def scenario():
    """Two GPUs of 20 GB, two 14 GB models: p1 runs a, b, a on GPU 0 (each evicts the other), p2
    runs a on GPU 1 meanwhile."""
    cl = cluster(gpus=2, hbm_gb=20.0, h2d=H2D, nvme_read=7.0, wake=WAKE, cold=COLD, overhead=OVERHEAD)
    cat = catalog(("a", 14.0), ("b", 14.0))
    tr = trace(program("p1", [call("a1", "a"), call("b1", "b", ["a1"]), tool("t", ["b1"], duration=100.0),
                              call("a2", "a", ["t"])]),
               program("p2", [call("a", "a")], start=60.0))
    return cl, cat, tr


def replay():
    pol = Pinned()
    res = Simulator(*scenario(), pol, config=SimConfig(check_invariants=True)).run()
    return {(c.program, c.node): c for c in res.calls}, pol.seen


def test_an_asleep_engine_wakes_on_its_group_for_the_copy_plus_wake_s():
    calls, _ = replay()
    a2 = calls[("p1", "a2")]
    # b's engine goes to sleep first (its 14 GB out over D2H), then a's copy comes back and it wakes.
    drain = 14.0 / H2D + LATENCY_S["gpu"]
    # (abs: the program's 110 kB of KV comes back with the weights)
    assert a2.ready - a2.arrive == pytest.approx(drain + 14.0 / H2D + LATENCY_S["host"] + WAKE, abs=1e-4)


def test_a_host_copy_on_another_group_is_a_cold_start_plus_the_copy():
    calls, seen = replay()
    other = calls[("p2", "a")]
    assert seen[("p2", "a")]["engines"][("a", (0,))] is True  # a's engine sleeps on GPU 0 meanwhile
    assert other.ready - other.arrive == pytest.approx(14.0 / H2D + LATENCY_S["host"] + COLD, abs=1e-6)


def test_a_first_load_from_nvme_is_a_cold_start():
    calls, _ = replay()
    a1 = calls[("p1", "a1")]
    assert a1.ready - a1.arrive == pytest.approx(14.0 / 7.0 + LATENCY_S["nvme"] + COLD, abs=1e-6)


def test_asleep_engines_count_in_host_dram_and_hold_their_overhead_in_hbm():
    _, seen = replay()
    s = seen[("p1", "a2")]  # a asleep on GPU 0, b awake there; a also awake on GPU 1 (p2)
    assert s["engines"] == {("a", (0,)): True, ("b", (0,)): False, ("a", (1,)): False}
    assert s["host_used"] == pytest.approx(14.0 * GB, abs=1e6)  # a's pinned copy (b never slept yet)
    # b's weights, two engines' overhead, and at most a few hundred kB of KV
    assert s["hbm_used"][0] == pytest.approx(14.0 * GB + 2 * OVERHEAD * GB, abs=1e6)
    assert s["hbm_used"][1] == pytest.approx(14.0 * GB + OVERHEAD * GB, abs=1e6)


def test_an_asleep_engine_is_stopped_when_its_gpu_needs_the_room():
    # One 20.5 GB GPU, 9 GB models, 1 GB per engine: a and b fit awake together; c puts both to
    # sleep (1 GB each left in HBM); d needs 10 GB with 8.5 free, so the asleep engines stop. a's
    # next use is a new engine: a cold start from its host copy, now a cache.
    cl = cluster(gpus=1, hbm_gb=20.5, wake=WAKE, cold=COLD, overhead=OVERHEAD)
    cat = catalog(("a", 9.0), ("b", 9.0), ("c", 9.0), ("d", 9.0))
    tr = trace(program("p1", [call("1", "a"), call("2", "b", ["1"]), call("3", "c", ["2"]), call("4", "d", ["3"]),
                              call("5", "a", ["4"])]))
    pol = Pinned()
    res = Simulator(cl, cat, tr, pol, config=SimConfig(check_invariants=True)).run()
    calls = {c.node: c for c in res.calls}
    assert all(c.state == "done" for c in res.calls)
    assert pol.seen[("p1", "4")]["engines"] == {("a", (0,)): True, ("b", (0,)): True, ("c", (0,)): False}
    engines = pol.seen[("p1", "5")]["engines"]
    assert ("a", (0,)) not in engines and ("b", (0,)) not in engines and engines[("d", (0,))] is False
    assert pol.seen[("p1", "5")]["host_used"] == pytest.approx(18.0 * GB, abs=1e6)  # a's and b's caches stay
    assert calls["5"].ready - calls["5"].arrive >= COLD


def test_eviction_stops_no_asleep_engine_that_a_copy_already_makes_room_for():
    # An asleep engine is offered first, but when the copy chosen after it frees enough on its
    # own, the engine is left asleep.
    sim = Simulator(cluster(gpus=1, hbm_gb=20.0, overhead=OVERHEAD), catalog(("a", 4.0), ("b", 14.0)),
                    trace(program("p", [call("1", "a")])), Pinned())
    wa, wb = weights_key("a"), weights_key("b")
    sim._new_gpu_copy(wa, (0,), prefetch=False).ready = True
    sim._evict(sim.tiers.gpu[(wa, (0,))], "host")
    sim._run_loop(None)  # a's copy-out finishes: a sleeps, holding 1 GB
    sim._new_gpu_copy(wb, (0,), prefetch=False).ready = True  # 14 + 1 GB; 4 GB free
    assert sim.tiers.asleep_on(wa, (0,))
    victims = sim.plan_eviction((0,), 10.0 * GB)
    assert victims == [sim.tiers.gpu[(wb, (0,))]]


def test_engines_in_the_books_add_up():
    sim = Simulator(cluster(gpus=1, overhead=OVERHEAD), catalog(("a", 4.0)), trace(program("p", [call("1", "a")])),
                    Pinned())
    t = sim.tiers
    key = weights_key("a")
    assert t.engine_need(key, (0,)) == pytest.approx(OVERHEAD * GB)
    t.start_engine(key, (0,), 0.0)
    assert t.engine_need(key, (0,)) == 0.0
    assert t.hbm_used[0] == pytest.approx(OVERHEAD * GB)
    t.stop_engine(key, (0,))
    assert t.hbm_used[0] == pytest.approx(0.0) and not t.engines


def test_eviction_stops_an_engine_rather_than_let_it_sleep_when_its_overhead_is_the_room_needed():
    sim = Simulator(cluster(gpus=1, hbm_gb=20.0, overhead=OVERHEAD), catalog(("a", 18.0)),
                    trace(program("p", [call("1", "a")])), Pinned())
    key = weights_key("a")
    sim._new_gpu_copy(key, (0,), prefetch=False).ready = True
    copy = sim.tiers.gpu[(key, (0,))]
    assert [v is copy for v in sim.plan_eviction((0,), 17.0 * GB)] == [True]  # the weights' room is enough: it may sleep
    victims = sim.plan_eviction((0,), 19.5 * GB)
    assert victims[0] is copy and victims[1] is sim.tiers.engines[(key, (0,))]
    for v in victims:
        sim._evict(v, "host")
    assert not sim.tiers.engines and sim.tiers.hbm_used[0] == pytest.approx(0.0)
    sim.tiers.check()


def test_the_timeline_says_what_moved_weights_and_why():
    plain = Simulator(*scenario(), Pinned(), config=SimConfig()).run()
    res = Simulator(*scenario(), Pinned(), config=SimConfig(timeline=True)).run()
    got = [(e["event"], e["model"], tuple(e["gpus"]), e.get("engine"), e["cause"]) for e in res.timeline]
    assert got == [
        ("load", "a", (0,), "cold", "call p1/a1 (a)"),
        ("evict", "a", (0,), "asleep", "call p1/b1 (b)"),  # b needs GPU 0: a goes to sleep there
        ("load", "b", (0,), "cold", "call p1/b1 (b)"),
        ("load", "a", (1,), "cold", "call p2/a (a)"),
        ("evict", "b", (0,), "asleep", "call p1/a2 (a)"),
        ("load", "a", (0,), "wake", "call p1/a2 (a)"),     # a's engine slept on GPU 0: a wake
    ]
    assert all(e["to"] == "host" for e in res.timeline if e["event"] == "evict")
    assert [(c.ready, c.end) for c in res.calls] == [(c.ready, c.end) for c in plain.calls]  # it decides nothing
    assert plain.timeline == []


def test_the_timeline_records_cancels_stopped_engines_and_evictions_to_nothing():
    from statebudget.core.decisions import Cancel
    from statebudget.sim.plots import residency_intervals
    sim = Simulator(cluster(gpus=2, hbm_gb=20.0, overhead=OVERHEAD), catalog(("a", 4.0), ("b", 4.0)),
                    trace(program("p", [call("1", "a")])), Pinned(), config=SimConfig(timeline=True))
    wa, wb = weights_key("a"), weights_key("b")
    sim._prefetch(wa, (0,), lease="L1")
    sim.cancel(Cancel(wa, (0,)))  # still loading: its engine stops with it
    sim._new_gpu_copy(wa, (1,), prefetch=False).ready = True
    sim._evict(sim.tiers.gpu[(wa, (1,))], "host", cause="test")
    sim._run_loop(None)  # a sleeps on GPU 1
    sim._make_host_room("n0", sim.tiers.host_cap["n0"])  # all of DRAM: a's pinned copy goes, and its engine
    sim._new_gpu_copy(wb, (0,), prefetch=False).ready = True
    sim._evict(sim.tiers.gpu[(wb, (0,))], "none", cause="test")
    got = [(e["event"], e["model"], tuple(e["gpus"]), e.get("engine"), e["cause"]) for e in sim.recorder.timeline]
    assert got == [("prefetch", "a", (0,), "cold", "lease L1"), ("cancel", "a", (0,), None, "the policy cancelled it"),
                   ("load", "a", (1,), "cold", ""), ("evict", "a", (1,), "asleep", "test"),
                   ("engine-stop", "a", (1,), None, "host DRAM room on n0"),
                   ("load", "b", (0,), "cold", ""), ("evict", "b", (0,), "stopped", "test")]
    assert not sim.tiers.engines
    assert [(i, m) for i, m, _, _ in residency_intervals(sim.recorder.timeline, 100.0)] == [(0, "a"), (0, "b"), (1, "a")]
