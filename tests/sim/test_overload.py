"""Past capacity in a replay (`planner/overload.py`): calls go where the queue ahead is shorter,
and below capacity nothing changes."""

from tests.helpers import call, catalog, cluster, program, trace
from statebudget.models.cluster import Cluster
from statebudget.planner.config import PlannerConfig
from statebudget.policies.ours import StateBudget
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator


def _replay(tr, overload_wait_s, scale_out_wait_s=None, place_queue_wait=False, move_waiting_share=None,
            spread_until_s=None):
    # two 40 GB GPUs, a 30 GB model whose calls reserve 6-9 GB of KV each: one call per GPU
    cl, cat = cluster(gpus=2, hbm_gb=40.0, cold=10.0, wake=0.5), catalog(("m", 30.0, 3_000_000))
    cfg = PlannerConfig(overload_wait_s=overload_wait_s, scale_out_wait_s=scale_out_wait_s,
                        place_queue_wait=place_queue_wait, move_waiting_share=move_waiting_share,
                        spread_until_s=spread_until_s)
    return Simulator(cl, cat, tr, StateBudget(cfg), config=SimConfig(check_invariants=True, start="warm")).run()


def _burst(n, every_s):
    return trace(*(program(f"p{i:02d}", [call("a", "m", ctx=1000, out=500, max_tokens=2000)], start=every_s * i)
                   for i in range(n)))


def test_past_capacity_calls_queue_where_the_wait_ahead_is_shorter():
    tr = _burst(30, 2.0)  # a call every 2 s, each ~11 s long: the queue only grows
    on, off = _replay(tr, 30.0), _replay(tr, None)
    stall = {k: sum(c.ready - c.arrive for c in r.calls) for k, r in (("on", on), ("off", off))}
    # off: every call waits behind the others on the GPU holding the weights, where it is
    # "ready soonest"; the other GPU, a 10 s cold start away, stays idle
    assert {c.group for c in off.calls} == {(0,)}
    assert {c.group for c in on.calls} == {(0,), (1,)}
    assert stall["on"] < 0.6 * stall["off"]
    # the calls placed before any had waited 30 s stay where they were placed
    assert all(c.group == (0,) for c in on.calls[:3])
    assert all(c.state == "done" for c in on.calls)


def _longest_wait_at(calls, group, t: float) -> float:
    """How long the longest-waiting call on `group` had waited at time `t` (0: none waited)."""
    return max((t - c.arrive for c in calls if c.group == group and c.arrive < t < c.admitted), default=0.0)


def test_spreading_stops_once_the_longest_wait_on_the_group_reaches_the_bound():
    tr = _burst(30, 2.0)  # a call every 2 s, each ~11 s long: the queue only grows
    runs = {b: _replay(tr, 30.0, spread_until_s=b).calls for b in (None, 0.0, 45.0)}
    # at or below overload_wait_s (30 s here), never: past capacity needs that wait already
    assert {c.group for c in runs[0.0]} == {(0,)}
    calls = runs[45.0]
    moved = [c for c in calls if c.group == (1,)]
    assert 0 < len(moved) < sum(1 for c in runs[None] if c.group == (1,))
    # every call that spread came while GPU 0's longest wait was under 45 s; the calls that
    # stayed on GPU 0 after the first one past the bound found it at 45 s or more
    assert all(_longest_wait_at(calls, (0,), c.arrive) < 45.0 for c in moved)
    late = [c for c in calls if c.group == (0,) and _longest_wait_at(calls, (0,), c.arrive) >= 45.0]
    assert late and all(c.arrive > moved[0].arrive for c in late)


def test_with_the_queue_in_the_wait_a_call_takes_a_cold_start_rather_than_a_longer_queue():
    tr = _burst(30, 2.0)
    # never past capacity: the queue is read, but the overload mode never acts
    on, off = (_replay(tr, 1e6, place_queue_wait=q) for q in (True, False))
    # off: the wait for GPU 0 is its running call's expected end (< 11 s), never longer than the
    # 10 s cold start on GPU 1 by enough, so every call queues there
    assert {c.group for c in off.calls} == {(0,)}
    assert all(c.state == "done" for c in on.calls)
    # the first calls queue at GPU 0 (their wait is shorter than the cold start); the first to
    # move found three there not yet started (the first still loading its weights)
    assert [c.group for c in on.calls[:3]] == [(0,)] * 3
    first = min((c for c in on.calls if c.group == (1,)), key=lambda c: c.arrive)
    assert sum(1 for c in on.calls if c.group == (0,) and c.arrive < first.arrive and c.start > first.arrive) >= 3
    assert sum(c.ready - c.arrive for c in on.calls) < 0.8 * sum(c.ready - c.arrive for c in off.calls)


def test_a_queue_at_the_only_copy_adds_a_replica_on_the_idle_gpu():
    tr = _burst(20, 6.0)  # a call every 6 s, each ~11 s long: one GPU cannot keep up, two can
    scaled, off = _replay(tr, None, scale_out_wait_s=20.0), _replay(tr, None)
    stall = {k: sum(c.ready - c.arrive for c in r.calls) for k, r in (("scaled", scaled), ("off", off))}
    assert {c.group for c in off.calls} == {(0,)}
    # once a call has waited 20 s the second GPU gets the weights, and later calls run there
    first_on_1 = min(c.arrive for c in scaled.calls if c.group == (1,))
    assert any(c.ready - c.arrive >= 20.0 for c in scaled.calls if c.arrive < first_on_1)
    assert stall["scaled"] < 0.5 * stall["off"]
    assert all(c.state == "done" for c in scaled.calls)


def test_no_replica_is_loaded_where_the_models_calls_cannot_fit_beside_it():
    # GPU 1 holds the 30 GB model with 2 GB to spare; each call asks for 9 GB of KV
    cl = Cluster.model_validate({
        "name": "two-kinds", "hbm_reserve_frac": 0.0,
        "gpu_kinds": {k: {"hbm_gb": gb, "hbm_gbps": 1555, "h2d_gbps": 25, "d2h_gbps": 25, "tflops": 312,
                          "wake_s": 0.5, "cold_start_s": 10.0, "engine_overhead_gb": 0.0}
                      for k, gb in (("big", 40.0), ("small", 32.0))},
        "nodes": [{"name": "n0", "host_dram_gb": 256, "nvme_gb": 4000, "nvme_read_gbps": 7, "nvme_write_gbps": 5,
                   "root_gbps": 50, "gpus": {"big": 1, "small": 1}}]})
    cfg = PlannerConfig(overload_wait_s=None, scale_out_wait_s=20.0)
    res = Simulator(cl, catalog(("m", 30.0, 3_000_000)), _burst(20, 6.0), StateBudget(cfg),
                    config=SimConfig(check_invariants=True, start="warm", timeline=True)).run()
    assert any(c.ready - c.arrive >= 20.0 for c in res.calls), "calls wait past the trigger"
    assert [e for e in res.timeline if e["gpus"] == [1]] == [], "no copy on the GPU none of them fits"
    assert {c.group for c in res.calls} == {(0,)} and all(c.state == "done" for c in res.calls)


class _Placed(StateBudget):
    """Keeps the group each call was placed on at its arrival."""

    def __init__(self, config):
        super().__init__(config)
        self.placed = {}

    def place(self, sim, call):
        group = self.placed[(call.program, call.node)] = super().place(sim, call)
        return group


def test_calls_waiting_at_the_only_copy_move_to_its_new_replica():
    tr = _burst(20, 6.0)
    cl, cat = cluster(gpus=2, hbm_gb=40.0, cold=10.0, wake=0.5), catalog(("m", 30.0, 3_000_000))
    runs = {}
    for share in (0.5, 1e-6, None):
        policy = _Placed(PlannerConfig(overload_wait_s=None, scale_out_wait_s=20.0, move_waiting_share=share))
        res = Simulator(cl, cat, tr, policy, config=SimConfig(check_invariants=True, start="warm")).run()
        runs[share] = res, [c for c in res.calls if c.group != policy.placed[(c.program, c.node)]]
    (moved, gone), (stay, none) = runs[0.5], runs[None]
    assert stay.moved_calls == 0 and none == []
    # the share is read: a first token a millionth as soon is never on offer
    assert runs[1e-6][0].moved_calls == 0 and runs[1e-6][1] == []
    # calls placed on GPU 0 (the only copy) run on the replica the queue there added
    assert moved.moved_calls == len(gone) > 0 and all(c.group == (1,) for c in gone)
    assert sum(c.ready - c.arrive for c in moved.calls) < sum(c.ready - c.arrive for c in stay.calls)
    assert all(c.state == "done" for c in moved.calls)


class _MoveAway(_Placed):
    """Asks to move every waiting call to the other GPU, with room there or not."""

    def on_waiting(self, sim, calls):
        return [(c.program, c.node, (1,) if c.group == (0,) else (0,)) for c in calls]


def test_a_move_is_carried_out_only_where_the_call_is_admitted_at_once():
    # one GPU runs a call of n (30 GB) while longer calls of m queue on the other: a move to n's
    # GPU waits for n's call to end and its weights to be evicted
    cl = cluster(gpus=2, hbm_gb=40.0, cold=10.0, wake=0.5)
    cat = catalog(("m", 30.0, 3_000_000), ("n", 30.0, 3_000_000))
    tr = trace(program("pn", [call("a", "n", ctx=1000, out=500, max_tokens=500)]),
               *(program(f"p{i}", [call("a", "m", ctx=1000, out=2000, max_tokens=2000)], start=1.0 + i)
                 for i in range(4)))
    policy = _MoveAway(PlannerConfig(overload_wait_s=None, scale_out_wait_s=None))
    res = Simulator(cl, cat, tr, policy, config=SimConfig(check_invariants=True, start="warm")).run()
    n_call = next(c for c in res.calls if c.model == "n")
    gone = [c for c in res.calls if c.group != policy.placed[(c.program, c.node)]]
    assert res.moved_calls == len(gone) >= 1
    assert all(c.group == n_call.group and c.admitted >= n_call.end for c in gone)
    assert all(c.state == "done" for c in res.calls)


def test_below_capacity_the_overload_mode_changes_no_call():
    tr = _burst(6, 40.0)  # each call ends (~11 s) before the next arrives: no queue ever forms
    on, off = _replay(tr, 30.0), _replay(tr, None)
    key = [(c.group, c.arrive, c.ready, c.start, c.end) for c in off.calls]
    assert [(c.group, c.arrive, c.ready, c.start, c.end) for c in on.calls] == key


def test_at_3x_the_swe_team_load_the_overload_mode_cuts_the_stall():
    import numpy as np

    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.traces.generators import generate

    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    tr = generate("swe-team", 3, 2.0, load=3)
    stall, handoff = {}, {}
    for w in (90.0, None):
        # without the price of wasted bytes, which on its own keeps this queue from forming
        # and without replicas on queue wait (`scale_out_wait_s`) or moves of waiting calls to
        # them (`move_waiting_share`), which spread the queue too
        cfg = PlannerConfig(overload_wait_s=w, waste_price_s_per_gb=0.0, scale_out_wait_s=None,
                            move_waiting_share=None)
        res = Simulator(cl, cat, tr, StateBudget(cfg), config=SimConfig(seed=3, start="warm")).run()
        done = [c for c in res.calls if c.ready >= 0]
        stall[w] = sum(c.ready - c.arrive for c in done)
        handoff[w] = np.percentile([c.ready - c.arrive for c in done if c.handoff], 95)
    # off, every reviewer call queues on one L40 (minutes of waiting) while other GPUs idle
    assert stall[90.0] < 0.25 * stall[None]
    assert handoff[90.0] < 0.25 * handoff[None]
    # the shipped configuration (the mode on, wasted bytes priced) does not collapse either
    res = Simulator(cl, cat, tr, StateBudget(), config=SimConfig(seed=3, start="warm")).run()
    done = [c for c in res.calls if c.ready >= 0]
    assert sum(c.ready - c.arrive for c in done) < 0.25 * stall[None]
