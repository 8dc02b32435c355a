"""What placement may know of a call (`policies/base.py`, `sim/admission.py`): not which expert
pages it will touch, nor how many. What a restart keeps of what a policy learnt (`Policy.learnt`)."""

import json

import pytest

from tests.helpers import catalog, moe_catalog, call, cluster, program, resident, tool, trace
from statebudget.core.costs import median_page_count
from statebudget.models.cluster import Cluster
from statebudget.policies import REGISTRY, make_policy
from statebudget.policies.base import restore_estimate_s
from statebudget.policies.ours import StateBudget, StateBudgetTrack
from statebudget.sim.calls import CallRec
from statebudget.sim.engine import Simulator

CAT = moe_catalog()  # 16 pages of 1 GB beside a 2 GB dense part


def test_the_restore_estimate_counts_pages_by_how_often_calls_touch_them_not_by_this_calls():
    sim = Simulator(cluster(gpus=2, hbm_gb=40.0), CAT, trace(program("p", [call("a", "e")])), make_policy("ondemand"))
    for g, pages in (((0,), range(0, 8)), ((1,), range(8, 16))):  # the most touched half on GPU 0
        resident(sim, ("w", "e"), g, 2.0)
        for p in pages:
            resident(sim, ("e", "e", p), g, 1.0)
    hot, cold = (CallRec("p", n, "e", 100, 10, 10, "t0", "interactive", True, False, pages=pages)
                 for n, pages in (("a", (0, 1)), ("b", (8, 9))))
    # a call that will touch only GPU 1's pages is not told so: both rank the groups alike, by the
    # pages each group lacks weighted by their touch probabilities
    for g in ((0,), (1,)):
        assert restore_estimate_s(sim, hot, g) == restore_estimate_s(sim, cold, g)
    assert 0 < restore_estimate_s(sim, cold, (0,)) < restore_estimate_s(sim, cold, (1,))


def _calls(*page_sets):
    return [CallRec("p", f"n{i}", "e", 100, 10, 10, "t0", "interactive", True, False, pages=tuple(pages))
            for i, pages in enumerate(page_sets)]


def test_room_now_is_judged_without_the_calls_pages():
    # the dense part and the two most touched pages held, 0.6 GB free: a call that will touch only
    # those has room (what the admission would find) and one that will touch ten has not; a
    # policy judges both alike, by the expected bytes of the 14 missing pages (2.4 GB): no room
    sim = Simulator(cluster(gpus=1, hbm_gb=4.6), CAT, trace(program("p", [call("a", "e")])), make_policy("ondemand"))
    resident(sim, ("w", "e"), (0,), 2.0)
    for p in (0, 1):
        resident(sim, ("e", "e", p), (0,), 1.0)
    few, many = _calls((0,), range(10))
    assert sim._victims_for_room((0,), *sim.call_need(few, (0,))) is not None
    assert sim._victims_for_room((0,), *sim.call_need(many, (0,))) is None
    assert sim.expected_need(few, (0,)) == sim.expected_need(many, (0,))
    assert not sim.has_room_now(few, (0,)) and not sim.has_room_now(many, (0,))


def test_idle_pages_of_the_model_itself_make_room_as_they_would_for_the_admission():
    # 12 GB: the dense part and ten idle pages fill it; the pages a call seldom touches may go
    sim = Simulator(cluster(gpus=1, hbm_gb=12.0), CAT, trace(program("p", [call("a", "e")])), make_policy("ondemand"))
    resident(sim, ("w", "e"), (0,), 2.0)
    for p in range(10):
        resident(sim, ("e", "e", p), (0,), 1.0)
    (c,) = _calls((0, 12))
    assert sim._victims_for_room((0,), *sim.call_need(c, (0,))) is not None
    assert sim.has_room_now(c, (0,))


def _small_and_big(small_gb: float, big_cold_s: float = 1.0):
    kind = {"hbm_gbps": 1555, "h2d_gbps": 25.0, "d2h_gbps": 25.0, "tflops": 312.0, "wake_s": 0.5,
            "cold_start_s": 1.0, "engine_overhead_gb": 0.0}
    return Cluster.model_validate({
        "name": "test", "hbm_reserve_frac": 0.0,
        "gpu_kinds": {"small": {**kind, "hbm_gb": small_gb},
                      "big": {**kind, "hbm_gb": 40.0, "cold_start_s": big_cold_s}},
        "nodes": [{"name": "n0", "host_dram_gb": 256, "nvme_gb": 4000, "nvme_read_gbps": 7, "nvme_write_gbps": 5,
                   "root_gbps": 50, "gpus": {"small": 1, "big": 1}}]})


def test_whether_a_call_could_ever_fit_is_judged_by_the_median_page_count_not_its_own():
    median = median_page_count(CAT.by_name["e"])
    assert 2 <= median <= 6
    for gb, fits in ((2.0 + median + 0.5, True), (2.0 + median - 0.5, False)):
        sim = Simulator(_small_and_big(gb), CAT, trace(program("p", [call("a", "e")])), make_policy("ondemand"))
        few, many = _calls((0,), range(12))
        assert sim.fits_at_all(few, (0,)) and not sim.fits_at_all(many, (0,))  # the truth differs
        assert sim.could_ever_fit(few, (0,)) is fits and sim.could_ever_fit(many, (0,)) is fits  # placement cannot tell
        many.refused = ((0,),)
        assert not sim.could_ever_fit(many, (0,))  # once refused there, never again


def _busy_nodes(dense: str) -> list:
    """A call of `dense` with 4 GB of KV, then the call `a` of `e` with 2 GB of KV."""
    return [call("x", dense, ctx=4_000_000), tool("t", [], duration=0.01), call("a", "e", ["t"], ctx=2_000_000)]


def _run_with_pages(pages, small_gb: float = 8.0, hot=(), busy: bool = False, big_cold_s: float = 1.0):
    """One call of `e` whose router picks `pages`, with the dense part (and the pages `hot`)
    resident on the small GPU, where placement sends it; `busy`: a call of `d` with 4 GB of KV
    runs there first, and `e` brings 2 GB of KV."""
    nodes = _busy_nodes("d") if busy else [call("a", "e")]
    sim = Simulator(_small_and_big(small_gb, big_cold_s), CAT, trace(program("p", nodes)), make_policy("ondemand"))
    sim._pages_for = lambda program, node, model: tuple(pages) if model == "e" else ()
    resident(sim, ("w", "e"), (0,), 2.0)
    for p in hot:
        resident(sim, ("e", "e", p), (0,), 1.0)
    if busy:
        resident(sim, ("w", "d"), (0,), 2.0)
    res = sim.run()
    return sim, res, next(c for c in res.calls if c.model == "e")


def test_a_group_the_calls_own_pages_cannot_fit_refuses_it_and_it_is_routed_again():
    sim, res, c = _run_with_pages(range(10))
    assert c.state == "done" and c.group == (1,) and c.refused == ((0,),)
    assert sim.recorder.page_refusals == 1
    sim, res, c = _run_with_pages((0, 1))
    assert c.state == "done" and c.group == (0,) and c.refused == ()
    assert sim.recorder.page_refusals == 0


def test_a_call_is_refused_even_where_its_expected_need_never_has_room():
    # 7.5 GB, the dense part and the three most touched pages there: the median five pages fit,
    # but the expected need (those three kept, the rest by touch) never does; the engine takes
    # the call on its weights and KV, and refuses it, rather than hold it until the run ends
    sim, res, c = _run_with_pages(range(10), small_gb=7.5, hot=(0, 1, 2))
    assert sim._victims_for_room((0,), *sim.expected_need(c, (0,))) is None
    assert c.state == "done" and c.refused == ((0,),) and c.group == (1,)


def test_a_refusal_comes_when_the_engine_would_take_the_call_and_the_wait_for_it_is_lost():
    # a call of `d` holds the small GPU's room (9.5 GB: both dense parts and its 4 GB of KV leave
    # 1.5, `e` needs 2 for its KV; the big GPU's engine is slow to start, so `e` waits there): the
    # call waits until that call ends, is refused then and only then, and goes on to the big GPU;
    # with few pages it runs on the small one
    sim, res, many = _run_with_pages(range(10), small_gb=9.5, busy=True, big_cold_s=300.0)
    x = next(c for c in res.calls if c.model == "d")
    assert x.group == (0,) and many.refused == ((0,),) and many.group == (1,)
    assert many.admitted >= x.end > many.arrive
    _, _, few = _run_with_pages((0, 1), small_gb=9.5, busy=True, big_cold_s=300.0)
    assert few.group == (0,) and few.refused == () and few.admitted >= x.end


@pytest.mark.parametrize("waits_first", [False, True])
def test_ray_multiplex_applies_its_cap_on_the_replica_a_refused_call_goes_to(waits_first):
    # the big GPU holds three idle models, ray-multiplex's cap; the call of `e` goes to the small
    # GPU, which has its weights, is refused there (ten pages; at once, or once a call of `d1`
    # holding the room ends) and goes to the big one: that replica unloads its least recently
    # used model (d3) to load `e`, as on a first placement
    cat = moe_catalog(dense=("d1", "d2", "d3", "d4"))
    # 9.5 GB: both dense parts and the 4 GB of KV of `d1` leave 1.5, `e` needs 2
    nodes = _busy_nodes("d1") if waits_first else [call("a", "e")]
    sim = Simulator(_small_and_big(9.5 if waits_first else 8.0), cat, trace(program("p", nodes)),
                    make_policy("ray-multiplex"))
    sim._pages_for = lambda program, node, model: tuple(range(10)) if model == "e" else ()
    resident(sim, ("w", "e"), (0,), 2.0)
    resident(sim, ("w", "d1"), (0,), 2.0)
    for n, used in (("d2", 2.0), ("d3", 1.0), ("d4", 3.0)):
        resident(sim, ("w", n), (1,), 2.0)
        sim.tiers.gpu[(("w", n), (1,))].last_use = used
    res = sim.run()
    c = next(c for c in res.calls if c.model == "e")
    assert c.state == "done" and c.refused == ((0,),) and c.group == (1,)
    if waits_first:
        x = next(c for c in res.calls if c.model == "d1")
        assert x.group == (0,) and c.admitted >= x.end > c.arrive
    assert sorted(k[1] for (k, g) in sim.tiers.gpu if k[0] == "w" and g == (1,)) == ["d2", "d4", "e"]


def _after_a_morning(name):
    """The policy after programs that each call `d` then, after a tool, `e`: (policy, the end)."""
    progs = [program(f"p{i}", [call("a", "d"), tool("t", ["a"], 3.0), call("b", "e", ["t"])], start=8.0 * i)
             for i in range(12)]
    pol = make_policy(name)
    sim = Simulator(cluster(gpus=2, hbm_gb=40.0), CAT, trace(*progs), pol)
    sim.run()
    return pol, sim.now


@pytest.mark.parametrize("name", [n for n in REGISTRY if n not in ("oracle", "foresight", "static")])
def test_what_a_policy_learnt_is_taken_up_whole_by_a_new_one_or_it_learns_nothing(name):
    pol, end = _after_a_morning(name)
    state = pol.learnt(end)
    fresh = make_policy(name)
    if state is None:  # configuration only: nothing to keep, and a saved state is refused
        with pytest.raises(ValueError, match=name):
            fresh.take_up({"policy": name}, 0.0)
        return
    assert state == json.loads(json.dumps(state))  # plain JSON, as the ledger keeps it
    fresh.take_up(json.loads(json.dumps(state)), end + 3600.0)
    if isinstance(fresh, StateBudget):  # what the first hook builds, so the state goes through it
        sim = Simulator(cluster(gpus=2, hbm_gb=40.0), CAT, trace(), fresh)
        fresh._core(sim)
        if isinstance(fresh, StateBudgetTrack):
            fresh._tracker(sim)
            assert fresh.tracker.rate and fresh.tracker.rate == state["tracker"]["rate"]
        assert fresh.core.predictor.program_starts.rows(end + 3600.0)[0, 0] > 0
    assert fresh.learnt(end + 3600.0) == state  # not decayed over the hour it was down
    with pytest.raises(ValueError):
        fresh.take_up({"policy": "no-such-policy"}, 0.0)


def _two_models(cl, copies):
    """A simulator on `cl` with models a (10 GB) and b (30 GB), the weights `copies` [(model, group,
    ready)] in HBM, and a call of a."""
    from statebudget.core.books import GpuCopy

    sim = Simulator(cl, catalog(("a", 10.0), ("b", 30.0)), trace(program("p", [call("n", "a")])), make_policy("ondemand"))
    for model, g, ready in copies:
        nbytes = sim.catalog.by_name[model].dense_bytes
        sim.tiers.add_gpu_copy(GpuCopy(("w", model), g, nbytes, ready, 0.0, 0.0))
        sim.tiers.alloc_gpu(g, nbytes)
    return sim, CallRec("p", "n", "a", 100, 10, 10, "t0", "interactive", True, False)


def _neighbour(a_ready: bool = True, gpus: int = 2, b_asleep: bool = False):
    """Model a (20 GB) with a copy on GPU 0, model b (30 GB) on GPU 1 (or only its asleep engine,
    whose overhead leaves too little room), 40 GB each: a call of a placed on GPU 1 must evict b's
    weights there, or stop its engine; GPU 2, if any, is empty."""
    from statebudget.core.books import HostCopy

    cl = cluster(gpus=gpus, hbm_gb=40.0, overhead=25.0 if b_asleep else 0.0)
    sim, c = _two_models(cl, [("a", (0,), a_ready)] + ([] if b_asleep else [("b", (1,), True)]))
    if b_asleep:  # b's engine asleep on GPU 1 holds 25 GB: a's 10 GB and engine need it gone
        sim.tiers.start_engine(("w", "b"), (1,), 0.0)
        hc = HostCopy(("w", "b"), "n0", 30e9, True, 0.0)
        sim.tiers.sleep_engine(("w", "b"), (1,), hc)
    return sim, c


@pytest.mark.parametrize("a_ready,refused,b_asleep,placed", [
    (True, False, False, (0,)),   # a's copy is ready: the call waits for it rather than evict b
    (True, False, True, (0,)),    # nor stop b's asleep engine
    (False, False, False, (1,)),  # a's copy still loading: nothing ready to wait for
    (True, True, False, (1,)),    # a's group refused the call: it cannot go back there
])
def test_a_call_waits_for_its_own_copy_rather_than_evict_another_models_weights(a_ready, refused, b_asleep, placed):
    from statebudget.policies.base import stay_with_copy

    sim, c = _neighbour(a_ready, b_asleep=b_asleep)
    ready = {(1,): 11.0} if refused else {(0,): 0.0, (1,): 11.0}
    assert stay_with_copy(sim, c, (1,), ready) == placed
    # a group that holds the model, or one where nothing of another model need go, is kept
    assert stay_with_copy(sim, c, (0,), ready) == (0,)
    if not b_asleep:
        sim.tiers.remove_gpu_copy(sim.tiers.gpu[(("w", "b"), (1,))])
        assert stay_with_copy(sim, c, (1,), ready) == (1,)


def test_of_two_ready_copies_the_call_waits_at_the_sooner_ready_and_a_free_group_is_not_second_guessed():
    from statebudget.core.books import GpuCopy
    from statebudget.policies.base import stay_with_copy

    sim, c = _neighbour(gpus=4)
    sim.tiers.add_gpu_copy(GpuCopy(("w", "a"), (3,), 10e9, True, 0.0, 0.0))
    sim.tiers.alloc_gpu((3,), 10e9)
    assert stay_with_copy(sim, c, (1,), {(0,): 0.5, (1,): 11.0, (2,): 11.0, (3,): 0.2}) == (3,)
    # the empty GPU 2 needs nothing of b's: a call placed there goes there
    assert stay_with_copy(sim, c, (2,), {(0,): 0.5, (1,): 11.0, (2,): 11.0, (3,): 0.2}) == (2,)


@pytest.mark.parametrize("keeps", [True, False])
def test_our_placement_keeps_other_models_weights_unless_told_not_to(keeps, monkeypatch):
    import statebudget.policies.ours as ours
    from statebudget.planner.config import PlannerConfig

    sim, c = _neighbour()
    pol = StateBudget(PlannerConfig(place_keeps_weights=keeps))
    sim.policy = pol
    # the plain ranking would take room on GPU 1 now rather than wait for a's copy on GPU 0
    monkeypatch.setattr(ours, "default_place", lambda *a, **k: (1,))
    assert pol.place(sim, c) == ((0,) if keeps else (1,))


def _fast_and_slow(slow_tflops: float, b_elsewhere: bool = False):
    """`_neighbour` on GPUs 0, 1 of a fast kind, with an empty GPU 2 of a kind `slow_tflops` fast:
    a call of a placed on GPU 1 evicts b, whose next home clear of GPU 1 is the most free, GPU 2."""
    kind = {"hbm_gb": 40.0, "hbm_gbps": 1555, "h2d_gbps": 25.0, "d2h_gbps": 25.0, "wake_s": 0.5,
            "cold_start_s": 10.0, "engine_overhead_gb": 0.0}
    cl = Cluster.model_validate({
        "name": "test", "hbm_reserve_frac": 0.0,
        "gpu_kinds": {"F": {**kind, "tflops": 312.0}, "S": {**kind, "tflops": slow_tflops}},
        "nodes": [{"name": "n0", "host_dram_gb": 256, "nvme_gb": 4000, "nvme_read_gbps": 7.0,
                   "nvme_write_gbps": 5, "root_gbps": 50.0, "gpus": {"F": 2, "S": 1}}]})
    # with `b_elsewhere`, b has a second ready copy, on GPU 0 beside a
    sim, c = _two_models(cl, [("a", (0,), True), ("b", (1,), True)] + ([("b", (0,), True)] if b_elsewhere else []))
    assert [g.kind for g in sim.gpus] == ["F", "F", "S"]
    return sim, c


@pytest.mark.parametrize("slow_tflops,b_elsewhere,slower,placed", [
    (71.0, False, 1.3, (0,)),    # b would be homed on a 4.4x slower GPU: the call waits for a's copy
    (300.0, False, 1.3, (1,)),   # its next home is about as fast: the call takes the room
    (71.0, True, 1.3, (1,)),     # b keeps another ready copy: nothing is re-homed
    (71.0, False, 5.0, (1,)),    # 4.4x is not over 5x
    (300.0, False, None, (0,)),  # without `slower`, any eviction of b's weights keeps the call away
])
def test_keeping_weights_only_where_the_evicted_model_would_run_slower(slow_tflops, b_elsewhere, slower, placed):
    from statebudget.policies.base import rehomed_slower, stay_with_copy, weight_victims

    sim, c = _fast_and_slow(slow_tflops, b_elsewhere)
    ready = {(0,): 0.0, (1,): 11.0, (2,): 11.0}
    assert stay_with_copy(sim, c, (1,), ready, slower) == placed
    victims = weight_victims(sim, c, (1,))
    assert [v.key for v in victims] == [("w", "b")]
    if slower is not None:
        assert rehomed_slower(sim, victims[0], (1,), slower) == (placed == (0,))
    # room on the empty slow GPU evicts nothing of b's: a call placed there stays there
    assert stay_with_copy(sim, c, (2,), ready, slower) == (2,)


def test_our_placement_reads_a_number_as_the_slowdown_that_keeps_weights(monkeypatch):
    import statebudget.policies.ours as ours
    from statebudget.planner.config import PlannerConfig

    for keep, placed in ((1.3, (0,)), (5.0, (1,)), (True, (0,)), (False, (1,))):
        sim, c = _fast_and_slow(71.0)
        pol = StateBudget(PlannerConfig(place_keeps_weights=keep))
        sim.policy = pol
        monkeypatch.setattr(ours, "default_place", lambda *a, **k: (1,))
        assert pol.place(sim, c) == placed, keep


def test_a_next_home_exactly_k_times_slower_is_not_slower_than_k():
    from statebudget.policies.base import rehomed_slower, weight_victims

    sim, c = _fast_and_slow(71.0)
    (victim,) = weight_victims(sim, c, (1,))
    b = sim.catalog.by_name["b"]
    ratio = sim.cost.prefill_s(b, 4096, (2,)) / sim.cost.prefill_s(b, 4096, (1,))
    assert 1.3 < ratio  # GPU 2, where b would go, is the slow one
    assert rehomed_slower(sim, victim, (1,), ratio * 0.999)
    assert not rehomed_slower(sim, victim, (1,), ratio * 1.001)
