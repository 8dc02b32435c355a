"""Hand-computed answers for the simulator's physical model (DESIGN.md §3)."""

import pytest

from tests.helpers import GB, call, catalog, cluster, program, tool, trace
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.sim.flows import FairShare
from statebudget.policies import make_policy
from statebudget.core.costs import LATENCY_S
from statebudget.core.decisions import Promote
from statebudget.sim.metrics import hbm_wait_s, policy_report


def run(cl, cat, tr, policy="ondemand"):
    sim = Simulator(cl, cat, tr, make_policy(policy), config=SimConfig(check_invariants=True))
    return sim, sim.run()


def done_calls(res):
    return {c.node if len({x.program for x in res.calls}) == 1 else (c.program, c.node): c for c in res.calls}


def test_cold_load_stall_is_bytes_over_slowest_link_plus_cold_start():
    # NVMe 7 GB/s < root 50 < h2d 25: the NVMe read is the bottleneck.
    cl = cluster(nvme_read=7.0, cold=10.0)
    tr = trace(program("p", [call("a", "m")]))
    _, res = run(cl, catalog(("m", 14.0)), tr)
    c = res.calls[0]
    assert c.state == "done"
    assert c.ready - c.arrive == pytest.approx(14.0 / 7.0 + 10.0 + LATENCY_S["nvme"], abs=1e-9)


def test_slowest_link_can_be_the_gpu_link():
    cl = cluster(nvme_read=30.0, h2d=10.0, root=50.0, cold=0.0)
    tr = trace(program("p", [call("a", "m")]))
    _, res = run(cl, catalog(("m", 20.0)), tr)
    assert res.calls[0].ready - res.calls[0].arrive == pytest.approx(20.0 / 10.0 + LATENCY_S["nvme"], abs=1e-9)


def test_two_loads_sharing_a_link_each_take_twice_as_long():
    # Two GPUs on one node load two models at once; both read the one NVMe.
    cl = cluster(gpus=2, nvme_read=7.0, cold=0.0)
    tr = trace(program("p1", [call("a", "m1")]), program("p2", [call("a", "m2")]))
    _, res = run(cl, catalog(("m1", 14.0), ("m2", 14.0)), tr)
    for c in res.calls:
        assert c.ready - c.arrive == pytest.approx(2 * 14.0 / 7.0 + LATENCY_S["nvme"], abs=1e-9)
    assert res.bytes_by_link["nvme_r:n0"] == pytest.approx(28 * GB)


def test_a_background_flow_yields_its_link_and_takes_it_whole_when_alone():
    fs = FairShare({"l": 10.0})
    done = {}
    ev = fs.add(0.0, 40.0, ("l",), lambda now: done.setdefault("bg", now), weight=0.25)
    assert ev[-1][0] == pytest.approx(4.0)  # alone: the whole link
    ev = fs.add(0.0, 8.0, ("l",), lambda now: done.setdefault("fg", now))
    rates = {f.fid: f.rate for f in fs.flows.values()}
    assert rates == pytest.approx({0: 2.0, 1: 8.0})  # 0.25 : 1 of the link
    ev = fs.reweight(0.5, 0, 1.0)  # a call now waits for it: an equal share
    assert {f.fid: f.rate for f in fs.flows.values()} == pytest.approx({0: 5.0, 1: 5.0})
    fid, version = ev[-1][1], ev[-1][2]
    assert fs.finish(ev[-1][0], fid, version)[1] is not None
    assert fs._weight["l"] == pytest.approx(1.0)


def test_background_flows_on_a_link_share_one_budget():
    # Three swaps next to one weight load: together they get what one would (0.25 : 1 of the
    # link), split three ways; the load keeps 80 %. Alone, they split the whole link.
    fs = FairShare({"l": 10.0, "m": 10.0})
    for _ in range(3):
        fs.add(0.0, 30.0, ("l",), lambda now: None, weight=0.25)
    assert [f.rate for f in fs.flows.values()] == pytest.approx([10 / 3] * 3)
    fs.add(0.0, 80.0, ("l",), lambda now: None)
    assert [f.rate for f in fs.flows.values()] == pytest.approx([2 / 3] * 3 + [8.0])
    # A swap that also crosses a link of its own runs at its smaller share there: the pool is per link.
    fs.add(0.0, 10.0, ("l", "m"), lambda now: None, weight=0.25)
    assert fs.flows[4].rate == pytest.approx(0.5) and fs.flows[3].rate == pytest.approx(8.0)
    # One raised to full weight leaves the pool: 1 : 1 : 0.25 (the three left split the last share).
    fs.reweight(0.0, 0, 1.0)
    assert fs.flows[0].rate == pytest.approx(10 / 2.25) and fs.flows[3].rate == pytest.approx(10 / 2.25)
    assert fs.flows[1].rate == pytest.approx(10 * 0.25 / 2.25 / 3)
    for fid in list(fs.flows):
        fs.cancel(0.0, fid)
    assert fs._weight == {"l": 0.0, "m": 0.0} and not any(fs._groups.values())
    # Background flows of two weights are two pools: each counts its own weight, and leaving
    # takes off what joining put on.
    fg = fs.add(0.0, 100.0, ("l",), lambda now: None)[0][1]
    half, quarter = (fs.add(0.0, 100.0, ("l",), lambda now: None, weight=w)[-1][1] for w in (0.5, 0.25))
    assert fs.flows[fg].rate == pytest.approx(10 / 1.75) and fs.flows[half].rate == pytest.approx(5 / 1.75)
    fs.cancel(0.0, half)
    fs.cancel(0.0, quarter)
    assert fs._weight["l"] == pytest.approx(1.0) and fs.flows[fg].rate == pytest.approx(10.0)


def test_second_call_to_a_warm_model_stalls_zero():
    tr = trace(program("p", [call("a", "m"), tool("t", ["a"]), call("b", "m", ["t"])]))
    _, res = run(cluster(), catalog(("m", 10.0)), tr)
    first, second = res.calls
    assert first.ready - first.arrive > 1.0
    assert second.ready - second.arrive == 0.0


def _evict_then_return(tflops, kv_per_token, ctx):
    """20 GB HBM. m1 (10 GB) runs and leaves 1 GB of KV; m2 (9.5 GB) needs 0.5 GB more room and LRU
    (ties: KV first) demotes m1's KV to host DRAM (lru-keepwarm); then m1 returns to its warm
    weights and needs its KV back, for which m2 (LRU now) is demoted first."""
    cl = cluster(hbm_gb=20.0, tflops=tflops, cold=0.0, wake=0.25)
    cat = catalog(("m1", 10.0, kv_per_token), ("m2", 9.5, 1))
    nodes = [call("a", "m1", ctx=ctx, out=0), tool("t1", ["a"]), call("b", "m2", ["t1"], ctx=10, out=0),
             tool("t2", ["b"]), call("c", "m1", ["t2"], ctx=ctx, out=0)]
    return run(cl, cat, trace(program("p", nodes)), "lru-keepwarm")


M2_DRAIN_S = (9.5 * GB + 10) / (25 * GB) + LATENCY_S["gpu"]  # m2's weights and KV out over D2H


def test_restore_onboards_kv_when_loading_beats_recomputing():
    # Slow GPU: recomputing 10k tokens takes ~67 s; onboarding 1 GB of KV takes 0.04 s.
    sim, res = _evict_then_return(tflops=0.6, kv_per_token=100_000, ctx=10_000)
    kv = 10_000 * 100_000
    last = res.calls[-1]
    assert res.bytes_by_pair["gpu->host"] == pytest.approx(kv + 9.5 * GB + 10)
    assert res.bytes_by_pair["host->gpu"] == pytest.approx(kv)
    assert last.ready - last.arrive == pytest.approx(M2_DRAIN_S + kv / (25 * GB) + LATENCY_S["host"], abs=1e-6)


def test_restore_recomputes_kv_when_recomputing_beats_loading():
    # Fast GPU, 100 tokens of 10 MB each: a prefill of 100 tokens beats moving 1 GB over PCIe.
    sim, res = _evict_then_return(tflops=1e6, kv_per_token=10_000_000, ctx=100)
    last = res.calls[-1]
    assert res.bytes_by_pair["host->gpu"] == 0
    prefill = sim.cost.prefill_s(sim.catalog.by_name["m1"], 100, (0,))
    assert prefill < 1 * GB / (25 * GB)
    assert last.ready - last.arrive == pytest.approx(M2_DRAIN_S + prefill, abs=1e-6)


def test_a_model_that_never_fits_is_reported_not_hung():
    cl = cluster(hbm_gb=8.0)
    tr = trace(program("p", [call("a", "big"), tool("t", ["a"]), call("b", "small", ["t"])]),
               program("q", [call("a", "small")]))
    sim, res = run(cl, catalog(("big", 20.0), ("small", 2.0)), tr)
    states = {(c.program, c.node): c.state for c in res.calls}
    assert states == {("p", "a"): "unplaceable", ("p", "b"): "cancelled", ("q", "a"): "done"}
    assert all(pr.end >= 0 for pr in res.programs.values())


def test_a_cancelled_branch_stops_and_frees_its_kv():
    nodes = [call("a", "m"), tool("slow", ["a"], duration=100.0), call("b", "m", ["slow"]),
             tool("fast", ["a"], duration=1.0)]
    tr = trace(program("p", nodes, cancel=[{"node": "slow", "at_after": "fast"}]))
    sim, res = run(cluster(), catalog(("m", 10.0)), tr)
    states = {c.node: c.state for c in res.calls}
    assert states == {"a": "done", "b": "cancelled"}
    assert res.sim_end < 100.0
    assert not [k for k in sim.tiers.gpu if k[0][0] == "kv"]


def _speculator(yields: bool, gpu: int, demote_to: str = "none"):
    """A policy that promotes model `n` onto GPU `gpu` when the first call arrives: speculation no
    lease asked for (a lease, for the program named `lease`). `yields` is the policy's
    `speculation_yields`."""
    from statebudget.models.state import weights_key
    from statebudget.policies.base import Policy

    class P(Policy):
        name = "speculator"
        speculation_yields = yields

        def demote_tier(self, sim, copy):
            return demote_to

        def on_call_arrive(self, sim, call):
            if call.program == "lease":  # a lease for the copy already in flight
                return [Promote(weights_key("n"), (gpu,), "L1")]
            return [Promote(weights_key("n"), (gpu,))] if call.program == "a" else None
    return P()


@pytest.mark.parametrize("yields", [True, False])
def test_a_speculative_promote_yields_the_link_to_a_call_s_load(yields):
    # GPU 0 loads the 10 GB of `m` that a call needs while GPU 1 speculatively loads 14 GB of `n`,
    # both through the node's 10 GB/s root complex. Speculation that yields is a background
    # transfer (a quarter of a foreground share): the call's load gets 8 GB/s instead of 5.
    from statebudget.core.toolwait import BACKGROUND_SHARE

    cl = cluster(gpus=2, hbm_gb=80.0, nvme_read=30.0, root=10.0, cold=0.0)
    tr = trace(program("a", [call("x", "m", out=0)]))
    res = Simulator(cl, catalog(("m", 10.0), ("n", 14.0)), tr, _speculator(yields, gpu=1),
                    config=SimConfig(check_invariants=True)).run()
    x = res.calls[0]
    share = BACKGROUND_SHARE if yields else 1.0
    assert x.ready - x.arrive == pytest.approx(10.0 / (10.0 / (1.0 + share)) + LATENCY_S["nvme"], abs=1e-6)
    assert res.wasted_bytes == pytest.approx(0.0)  # the promote was not in the call's way: it finished


@pytest.mark.parametrize("yields", [True, False])
def test_a_call_cancels_a_speculative_load_that_holds_its_room(yields):
    # One 40 GB GPU. A speculative promote of `n` (30 GB) starts at 0 and takes 30/7 s from NVMe.
    # A call of `m` (20 GB) arriving at 1 s needs that room. Speculation that yields gives it up
    # at once (the 7 GB already read are wasted); otherwise the call waits for the load to end,
    # then evicts it.
    cl = cluster(gpus=1, hbm_gb=40.0, nvme_read=7.0, cold=0.0)
    tr = trace(program("a", [call("x", "k", ctx=10, out=0)]), program("b", [call("y", "m", out=0)], start=1.0))
    res = Simulator(cl, catalog(("k", 0.001), ("m", 20.0), ("n", 30.0)), tr, _speculator(yields, gpu=0),
                    config=SimConfig(check_invariants=True)).run()
    y = next(c for c in res.calls if c.program == "b")
    lat = LATENCY_S["nvme"]
    if yields:
        assert y.ready - y.arrive == pytest.approx(20.0 / 7.0 + lat, abs=0.05)
        assert 0.0 < res.wasted_bytes / GB < 30.0
    else:
        assert y.ready == pytest.approx(lat + 30.0 / 7.0 + lat + 20.0 / 7.0, abs=0.05)


def test_a_lease_on_a_speculative_load_in_flight_raises_it_to_full_weight():
    # As in the test above, but a lease asks for the copy of `n` while it loads: it is no longer
    # speculation, and the call's load of `m` gets an equal share of the root (5 GB/s), not 8.
    cl = cluster(gpus=2, hbm_gb=80.0, nvme_read=30.0, root=10.0, cold=0.0)
    tr = trace(program("a", [call("x", "m", out=0)]), program("lease", [call("y", "m", out=0)]))
    res = Simulator(cl, catalog(("m", 10.0), ("n", 14.0)), tr, _speculator(True, gpu=1),
                    config=SimConfig(check_invariants=True)).run()
    x = next(c for c in res.calls if c.program == "a")
    assert x.ready - x.arrive == pytest.approx(10.0 / 5.0 + LATENCY_S["nvme"], abs=1e-6)


def test_a_speculative_load_waiting_for_its_victims_drain_is_cancelled_only_once_it_starts():
    # `o` (30 GB) sits idle on one 40 GB GPU. At 10 s a speculative promote of `n` (30 GB) evicts
    # it to host: 1.2 s of writing out over the 25 GB/s link, during which that room is not free.
    # A call of `m` (20 GB) arriving at 10.5 s must not take it then; it cancels `n` as soon as
    # the drain is out and `n` starts to load, and does not wait for all of `n`.
    cl = cluster(gpus=1, hbm_gb=40.0, nvme_read=7.0, h2d=25.0, cold=0.0)
    cat = catalog(("o", 30.0), ("k", 0.001), ("m", 20.0), ("n", 30.0))
    tr = trace(program("o0", [call("c", "o", ctx=10, out=0)]), program("a", [call("x", "k", ctx=10, out=0)], start=10.0),
               program("b", [call("y", "m", out=0)], start=10.5))
    res = Simulator(cl, cat, tr, _speculator(True, gpu=0, demote_to="host"),
                    config=SimConfig(check_invariants=True)).run()
    y = next(c for c in res.calls if c.program == "b")
    drained = 10.0 + 30.0 / 25.0
    lat = LATENCY_S["nvme"]
    assert y.ready == pytest.approx(drained + 20.0 / 7.0 + lat, abs=0.05)
    assert res.wasted_bytes / GB < 1.0  # n had only just started


def test_a_speculative_load_whose_bytes_are_all_in_is_not_cancelled():
    # `n`'s 30 GB are in HBM after 30/7 s; only its 35 s wake-up is left when a call of `m` needs
    # the room at 10 s. Cancelling it then would throw away bytes that have all arrived: the call
    # waits for `n` to be ready and evicts it instead.
    cl = cluster(gpus=1, hbm_gb=40.0, nvme_read=7.0, cold=35.0)
    tr = trace(program("a", [call("x", "k", ctx=10, out=0)]), program("b", [call("y", "m", out=0)], start=10.0))
    res = Simulator(cl, catalog(("k", 0.001), ("m", 20.0), ("n", 30.0)), tr, _speculator(True, gpu=0),
                    config=SimConfig(check_invariants=True)).run()
    y = next(c for c in res.calls if c.program == "b")
    n_ready = LATENCY_S["nvme"] + 30.0 / 7.0 + 35.0
    assert y.ready == pytest.approx(n_ready + LATENCY_S["nvme"] + 20.0 / 7.0 + 35.0, abs=0.5)


def test_sim_config_is_frozen_and_checks_the_failure_rate():
    import dataclasses

    with pytest.raises(ValueError, match="call_failure_rate"):
        SimConfig(call_failure_rate=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SimConfig().seed = 1


def test_the_join_order_counts_joins_only_and_the_heap_its_own_ties():
    # `CallRec.seq` orders the calls that joined a waiting list; the heap's tie-break is apart.
    sim, res = run(cluster(), catalog(("m", 1.0)), trace(program("p", [call("a", "m"), call("b", "m", ["a"])])))
    assert [c.seq for c in res.calls] == [1, 2]
    assert sim._tie > sim._joined == 2


def test_the_recorder_integrates_the_warm_tax_until_the_last_program_ends():
    from collections import Counter
    from types import SimpleNamespace as NS

    from statebudget.sim.recorder import Recorder

    tiers = NS(gpu={"w": NS(key=("w", "m"), per_gpu=5.0, group=(0,))}, hbm_cap=[10.0])
    rec = Recorder(tiers, Counter(), sample_dt=15.0)
    rec.advance(0.0, 10.0)   # half of HBM holds weights no call runs on
    rec.end = 10.0
    rec.advance(10.0, 30.0)  # after the end: not counted
    res = rec.result([], {}, NS(work_done={}), NS(actions=Counter(), ttl_errors=[]), NS(changes=[]))
    assert res.warm_tax == 0.5 and res.sim_end == 10.0 and res.hbm_samples == [(0.0, 5.0, 0.0, 0.0)]


def test_a_call_waiting_for_room_splits_its_stall_into_the_wait_and_the_load():
    # 20 GB: the weights (10 GB) and one call's KV (6 GB) fit, a second call's KV does not: the
    # second waits for the first to end, then has its weights resident already.
    cl = cluster(hbm_gb=20.0, cold=0.0)
    cat = catalog(("m", 10.0, 1_000_000))
    tr = trace(program("p", [call("a", "m", ctx=6000, out=50)]), program("q", [call("b", "m", ctx=6000, out=50)]))
    _, res = run(cl, cat, tr)
    first, second = sorted(res.calls, key=lambda c: c.admitted)
    assert first.admitted == first.arrive and hbm_wait_s(first) == 0.0 < first.ready - first.arrive
    assert second.admitted == pytest.approx(first.end) and second.ready == second.admitted
    assert hbm_wait_s(second) == pytest.approx(second.ready - second.arrive) and hbm_wait_s(second) > 0
    by = policy_report(res, {"interactive": 2.0}).stall_by_model["m"]
    assert by.hbm_wait_total_s == pytest.approx(hbm_wait_s(second))
    assert by.stall_total_s == pytest.approx(by.hbm_wait_total_s + first.ready - first.arrive)


@pytest.mark.parametrize("reserve", ["asked", "written"])
def test_kv_room_is_held_for_max_tokens_or_for_the_tokens_written(reserve):
    # 20 GB: the weights (10 GB) and calls of 1,000 context tokens (1 GB of KV each). Each asks
    # for 5,000 output tokens (6 GB with its context) and writes 50: held for all it asked, one
    # call's room leaves no room for a second; held for what it writes, both run at once. The
    # books stay true either way (`check_invariants`), and at the end no KV room is left held.
    cl = cluster(hbm_gb=20.0, cold=0.0)
    cat = catalog(("m", 10.0, 1_000_000))
    tr = trace(*(program(p, [call("a", "m", ctx=1000, out=50, max_tokens=5000)]) for p in ("p", "q")))
    sim = Simulator(cl, cat, tr, make_policy("ondemand"), config=SimConfig(check_invariants=True, kv_reserve=reserve))
    res = sim.run()
    first, second = sorted(res.calls, key=lambda c: c.admitted)
    assert first.state == second.state == "done"
    if reserve == "asked":
        assert second.admitted == pytest.approx(first.end) and hbm_wait_s(second) > 0
    else:
        assert second.admitted == pytest.approx(second.arrive) and second.admitted < first.end
        assert hbm_wait_s(second) == 0.0
    # Only the admission holds room for what a call writes; what a policy may ask keeps `max_tokens`.
    from statebudget.models.state import kv_key

    T = sim.kv_tokens.get(kv_key(first.program, "m"), 0)  # the program's KV kept after the run
    asked = (first.context_tokens + first.max_tokens - T) * 1_000_000
    assert sim.call_need(first, (0,))[2] == sim.expected_need(first, (0,))[2] == asked
    assert sim._reserved_tokens(first) == (50 if reserve == "written" else 5000)


def test_with_written_room_the_admission_fits_what_placement_judges_by_max_tokens():
    # 20 GB: weights 10 GB; a call of 1,000 context tokens asking 50,000 (51 GB of KV) and writing
    # 50. By `max_tokens` it never fits; the admission, holding what it writes, takes it.
    cl = cluster(hbm_gb=20.0, cold=0.0)
    cat = catalog(("m", 10.0, 1_000_000))
    tr = trace(program("p", [call("a", "m", ctx=1000, out=50, max_tokens=50_000)]))
    for reserve, fits in (("asked", False), ("written", True)):
        sim = Simulator(cl, cat, tr, make_policy("ondemand"), config=SimConfig(kv_reserve=reserve))
        sim.run()
        c = sim.calls[0]
        c.fits = None  # asked again, not read from the call's cache
        assert sim.fits_at_all(c, (0,)) is fits
        assert not sim.could_ever_fit(c, (0,))  # placement's judgement stays on `max_tokens`


def test_a_report_with_written_room_carries_no_lower_bound():
    from statebudget.sim.runner import replay

    tr = trace(program("p", [call("a", "m", ctx=1000, out=50, max_tokens=5000)]))
    for reserve in ("asked", "written"):
        o = replay(cluster(hbm_gb=20.0, cold=0.0), catalog(("m", 10.0, 1_000_000)), tr, ["oracle"],
                   SimConfig(kv_reserve=reserve)).report.oracle
        if reserve == "asked":
            assert o.bound is not None and o.bound_total_stall_s is not None
        else:
            assert o.bound is None and o.bound_total_stall_s is None and "kv_reserve written" in o.bound_status


def test_a_kv_reserve_other_than_asked_written_or_paged_is_refused():
    with pytest.raises(ValueError, match="kv_reserve must be one of asked, written, paged"):
        SimConfig(kv_reserve="blocks")


def test_a_paged_engine_preempts_its_newest_call_when_kv_room_runs_out():
    # 20 GB: weights 10 GB; two calls of 1,000 context tokens (1 GB) that write 5,000 (5 GB) each:
    # both are admitted with a chunk of room, both fit until their KV grows past the 10 GB left.
    # The engine then preempts the newer call, never the older; preempted, it comes back holding
    # room for all it asked for (6 GB), so it starts again once the older has ended.
    cl = cluster(hbm_gb=20.0, cold=0.0)
    cat = catalog(("m", 10.0, 1_000_000))
    tr = trace(*(program(p, [call("a", "m", ctx=1000, out=5000, max_tokens=6000)], start=t)
                 for p, t in (("p", 0.0), ("q", 0.1))))
    for reserve in ("asked", "paged"):
        sim = Simulator(cl, cat, tr, make_policy("ondemand"), config=SimConfig(check_invariants=True, kv_reserve=reserve))
        res = sim.run()
        p, q = sorted(res.calls, key=lambda c: c.program)
        assert p.state == q.state == "done" and sim.tiers.private == {}
        assert q.admitted == pytest.approx(p.end)  # paged: its second attempt's admission
        if reserve == "paged":
            assert res.preemptions == 1 and p.attempt == 0 and q.attempt == 1 and q.preempted
        else:
            assert res.preemptions == 0 and q.attempt == 0


def test_a_paged_decode_takes_as_long_as_one_decode():
    # One call alone: its decode in chunks ends when the whole decode would.
    cl, cat = cluster(hbm_gb=40.0, cold=0.0), catalog(("m", 10.0, 1_000_000))
    tr = trace(program("p", [call("a", "m", ctx=1000, out=1800, max_tokens=4000)]))
    ends = [Simulator(cl, cat, tr, make_policy("ondemand"), config=SimConfig(kv_reserve=r)).run().calls[0].end
            for r in ("asked", "paged")]
    assert ends[1] == pytest.approx(ends[0], rel=1e-9)


@pytest.mark.parametrize("preset,policy,seed", [("mapreduce", "statebudget-lease", 109),
                                                ("swe-team-shuffled", "ondemand", 102)])
def test_preempted_calls_come_back_and_the_run_ends(preset, policy, seed):
    # Two endless preemptions once seen: on mapreduce a preempted call, admitted and started again
    # at once, was preempted again without end at one instant; on swe-team-shuffled a call alone
    # on its engine beside others' idle state found no free HBM for its next chunk at every
    # attempt. A preempted call now comes back holding room for all it asked for, so it preempts
    # itself at most once. The alarm only ends a hang.
    import collections
    import signal

    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.traces.generators import generate

    sim = Simulator(load_cluster("hetero16"), load_catalog("agent-team"), generate(preset, seed, 2.0),
                    make_policy(policy), config=SimConfig(seed=seed, start="warm", kv_reserve="paged"))
    at = collections.Counter()
    restart = sim._restart

    def counted(c, then=None, later=False):
        at[sim.now] += later
        return restart(c, then, later)
    sim._restart = counted

    def hang(*_):
        raise AssertionError(f"no end: {max(at.values())} preemptions at t = {max(at, key=at.get):.3f}")
    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(60)
    try:
        res = sim.run()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert res.preemptions == sum(at.values()) > 0 and max(at.values()) <= 32


def test_a_preempted_call_cancelled_before_it_arrives_again_stays_cancelled():
    # The preempted call arrives again as the next event; a cancel of its node at that same
    # instant (a sibling's end that cancels it) comes first, and then it must not run.
    from statebudget.sim.loop import PRIO_FLOW

    cl, cat = cluster(hbm_gb=16.0, cold=0.0), catalog(("m", 10.0, 1_000_000))
    tr = trace(program("q", [call("C", "m", ctx=1400, out=2500, max_tokens=3000)]),
               program("p", [call("A", "m", ctx=1400, out=2500, max_tokens=3000)]))
    sim = Simulator(cl, cat, tr, make_policy("ondemand"), config=SimConfig(check_invariants=True, kv_reserve="paged"))
    restart = sim._restart

    def cancelling(c, then=None, later=False):
        events = restart(c, then, later)
        if later:
            sim.push(sim.now, PRIO_FLOW, lambda: sim._cancel_call(c))
        return events
    sim._restart = cancelling
    res = sim.run()
    preempted = [c for c in res.calls if c.preempted]
    assert len(preempted) == 1 and preempted[0].state == "cancelled" and preempted[0].end == -1.0
