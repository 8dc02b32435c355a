"""Where a model with no copy is homed (`planner/homes.py:home_of`): clear of the weights of
models not far less likely than it, counting idle state of those far less likely as room, else
the most free."""

import re
from dataclasses import replace

import pytest

from tests.helpers import call, catalog, cluster, moe_catalog, program, resident, trace
from statebudget.planner.config import PlannerConfig
from statebudget.planner.core import PlannerCore
from statebudget.planner.homes import home_of, layout, pages_owed, resident_by_model
from statebudget.policies.ours import StateBudgetLease
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator

IDX = {"a": 0, "b": 1, "c": 2}


def _sim(n_gpu=3):
    cat = catalog(("a", 40.0, 1000, 2), ("b", 20.0), ("c", 30.0))
    sim = Simulator(cluster(gpus=n_gpu, hbm_gb=40.0), cat, trace(program("p", [call("x", "b")])), StateBudgetLease(),
                    config=SimConfig(start="warm"))
    return sim, cat.by_name


def _home(sim, m, p):
    """`home_of` as the planning step calls it (weights, then two expert pages of each model)."""
    keys = [(("w", n), ("e", n, 0), ("e", n, 1)) for n in IDX]
    return home_of(sim, m, p, 0.2, IDX, resident_by_model(sim, keys))


def test_a_home_stays_off_the_gpus_of_a_model_about_as_likely_when_another_has_room():
    sim, m = _sim()
    resident(sim, ("w", "a"), (0, 1), 10.0)   # 30 GB free on GPUs 0 and 1, the likely tp-2 model's
    sim.tiers.alloc_gpu((2,), 15e9)     # 25 GB free on GPU 2: less, but room for b's 20 GB
    assert home_of(sim, m["b"]) == (0,), "the most free HBM, without the rule"
    assert _home(sim, m["b"], [0.9, 0.5, 0.0]) == (2,)
    # a model far less likely than b does not hold its GPUs against it
    assert _home(sim, m["b"], [0.05, 0.5, 0.0]) == (0,)


def test_idle_state_of_a_much_less_likely_model_counts_as_room():
    sim, m = _sim(n_gpu=2)
    sim.tiers.alloc_gpu((0,), 30e9)     # GPU 0: 10 GB free
    resident(sim, ("w", "c"), (1,), 25.0)
    sim.tiers.alloc_gpu((1,), 10e9)     # GPU 1: 5 GB free, behind c's idle 25 GB
    p = [0.9, 0.5, 0.05]                # c is far less likely than b
    assert home_of(sim, m["b"]) == (0,), "the most free, though b's 20 GB fit nowhere now"
    assert _home(sim, m["b"], p) == (1,), "c's idle copy is room for b"
    sim.running_models[("c", (1,))] += 1
    assert _home(sim, m["b"], p) == (0,), "a copy a call runs on is not room"
    sim.running_models[("c", (1,))] -= 1
    sim.tiers.gpu[(("w", "c"), (1,))].pins = 1
    assert _home(sim, m["b"], p) == (0,), "nor is a copy a call pins"
    sim.tiers.gpu[(("w", "c"), (1,))].pins = 0
    assert _home(sim, m["b"], [0.9, 0.5, 0.2]) == (0,), "c is likely enough to keep its GPU"


def test_idle_expert_pages_count_as_room_and_a_models_own_state_does_not():
    sim, m = _sim(n_gpu=2)
    sim.tiers.alloc_gpu((0,), 25e9)                   # GPU 0: 15 GB free
    resident(sim, ("e", "c", 1), (1,), 28.0)  # GPU 1: 12 GB free, behind an idle page of c
    assert _home(sim, m["b"], [0.0, 0.5, 0.05]) == (1,)
    sim, m = _sim(n_gpu=2)
    sim.tiers.alloc_gpu((0,), 25e9)                   # GPU 0: 15 GB free
    resident(sim, ("e", "b", 1), (1,), 28.0)  # b's own page is not room for b
    assert _home(sim, m["b"], [0.0, 0.5, 0.05]) == (0,)


def test_the_planning_step_homes_a_model_by_the_rule_when_set_else_by_the_most_free():
    sim, _ = _sim()
    core = sim.policy._core(sim)
    core.target, core.target_p = {"b": (0,)}, 1.0  # b is promoted for sure, where `home_of` says
    core.cfg = replace(core.cfg, home_reclaim=0.2)
    resident(sim, ("w", "a"), (0, 1), 10.0)
    sim.tiers.alloc_gpu((2,), 15e9)

    def promoted():
        return [d.group for d in core.plan(sim, 0.0) if type(d).__name__ == "Promote" and d.key == ("w", "b")]

    assert promoted() == [(2,)]
    core.cfg = replace(core.cfg, home_reclaim=None)
    assert promoted() == [(0,)]
    assert PlannerConfig().home_reclaim is None, "off by default: it lost on evaluation seeds"


def test_a_group_where_the_engine_sleeps_comes_first():
    sim, m = _sim()
    sim.tiers.alloc_gpu((0,), 35e9)
    sim.tiers.asleep_on = lambda key, g: key == ("w", "b") and g == (0,)
    assert _home(sim, m["b"], [0.9, 0.5, 0.0]) == (0,)


def test_idle_copies_of_models_no_call_asked_for_are_room_once_calls_have_flowed_a_while():
    sim, _ = _sim(n_gpu=2)
    core = sim.policy._core(sim)
    core.target, core.target_p = {"b": (0,)}, 1.0  # b is promoted for sure, where `home_of` says
    core.cfg = replace(core.cfg, uncalled_room_after_s=600.0)
    sim.tiers.alloc_gpu((0,), 30e9)            # GPU 0: 10 GB free
    resident(sim, ("w", "c"), (1,), 25.0)      # GPU 1: 15 GB free, behind c's idle 25 GB
    sim.tiers.alloc_gpu((1,), 10e9)            # ... 5 GB free

    def promoted(now):
        return [d.group for d in core.plan(sim, now) if type(d).__name__ == "Promote" and d.key == ("w", "b")]

    assert promoted(1000.0) == [(0,)], "no call yet: nothing is known to be uncalled"
    core.predictor.program_started("p1", "default", 100.0)
    core.predictor.call_arrived("p1", "a", 100.0)
    assert promoted(650.0) == [(0,)], "550 s after the first call: every model may still come"
    assert promoted(700.0) == [(1,)], "c, never asked for, holds room for b"
    core.predictor.call_arrived("p1", "c", 710.0)
    assert promoted(720.0) == [(0,)], "once c is called its copy is its own again"
    core.cfg = replace(core.cfg, uncalled_room_after_s=None)
    core.predictor.called.discard("c")
    assert promoted(730.0) == [(0,)], "off: the most free HBM alone"
    assert PlannerConfig().uncalled_room_after_s == 0.0


def test_a_home_leaves_free_the_hot_pages_a_resident_moe_model_lacks():
    # d: 2 GB dense; e: 2 GB dense and 16 pages of 1 GB, of which 9 are hot (touched by >= 20 % of calls)
    sim = Simulator(cluster(gpus=2, hbm_gb=12.0), moe_catalog(), trace(program("p", [call("x", "d")])),
                    StateBudgetLease(), config=SimConfig(start="warm"))
    core = sim.policy._core(sim)
    core.target, core.target_p = {"d": (0,)}, 1.0  # d is promoted for sure, where `home_of` says
    hot = sorted(core._static[1].hot)
    assert len(hot) == 9
    resident(sim, ("w", "e"), (0,), 2.0)    # GPU 0: 10 GB free, but e's 9 hot pages are not there
    sim.tiers.alloc_gpu((1,), 4e9)          # GPU 1: 8 GB free

    def promoted():
        return [d.group for d in core.plan(sim, 0.0) if type(d).__name__ == "Promote" and d.key == ("w", "d")]

    core.cfg = replace(core.cfg, home_keeps_pages=False)
    assert promoted() == [(0,)], "off: the most free HBM alone (10 GB against 8)"
    core.cfg = replace(core.cfg, home_keeps_pages=True)
    assert promoted() == [(1,)], "GPU 0's free HBM is e's working set"
    for p in hot[:6]:                       # six of them come back: GPU 0 has 4 GB free, 3 owed
        resident(sim, ("e", "e", p), (0,), 1.0)
    assert pages_owed(sim, [(("w", "e"), [("e", "e", p) for p in range(16)], hot, 1e9)]) == [3e9, 0.0]
    sim.tiers.alloc_gpu((1,), 6.5e9)        # GPU 1: 1.5 GB free, against 4 GB less 3 owed on GPU 0
    assert promoted() == [(1,)], "pages present are not owed again"
    assert PlannerConfig().home_keeps_pages


def test_a_never_called_moe_model_owes_its_hot_pages_and_its_idle_copy_is_room():
    # d and f: 2 GB dense; e: MoE, promoted but never called, its 2 GB idle on GPU 0 (10 GB free)
    sim = Simulator(cluster(gpus=2, hbm_gb=12.0), moe_catalog(("d", "f")), trace(program("p", [call("x", "f")])),
                    StateBudgetLease(), config=SimConfig(start="warm"))
    core = sim.policy._core(sim)
    core.target, core.target_p = {"d": (0,)}, 1.0
    resident(sim, ("w", "e"), (0,), 2.0)
    sim.tiers.alloc_gpu((1,), 7e9)          # GPU 1: 5 GB free

    def promoted(now):
        return [d.group for d in core.plan(sim, now) if type(d).__name__ == "Promote" and d.key == ("w", "d")]

    core.predictor.program_started("p1", "default", 10.0)
    core.predictor.call_arrived("p1", "f", 10.0)
    assert promoted(20.0) == [(1,)], "GPU 0: 10 + 2 idle - 9 owed = 3 GB, less than 5"
    sim.tiers.alloc_gpu((1,), 2.5e9)        # GPU 1: 2.5 GB free
    assert promoted(20.0) == [(0,)], "e's idle copy still counts: 3 GB against 2.5"
    core.predictor.call_arrived("p1", "e", 30.0)
    assert promoted(40.0) == [(1,)], "called, e's copy is its own: 10 - 9 = 1 GB"


def test_pages_owed_are_split_over_the_gpus_of_a_wider_group_and_only_where_the_weights_are():
    sim = Simulator(cluster(gpus=3, hbm_gb=12.0), moe_catalog(), trace(program("p", [call("x", "d")])),
                    StateBudgetLease(), config=SimConfig(start="warm"))
    keys = [("e", "e", p) for p in range(16)]
    assert pages_owed(sim, [(("w", "e"), keys, [0, 1, 2], 1e9)]) == [0.0, 0.0, 0.0], "no weights, nothing owed"
    resident(sim, ("w", "e"), (1, 2), 1.0)
    resident(sim, ("e", "e", 0), (1, 2), 0.5)
    assert pages_owed(sim, [(("w", "e"), keys, [0, 1, 2], 1e9)]) == [0.0, 1e9, 1e9], "two 1 GB pages over two GPUs"


def test_an_operators_layout_homes_a_model_with_no_copy_and_with_layout_holds_one_held_elsewhere():
    sim, _ = _sim()
    core = sim.policy._core(sim)
    core.target, core.target_p = {"b": (0,), "c": (0,)}, 1.0  # promoted for sure, wherever homed
    sim.tiers.alloc_gpu((0,), 15e9)                 # GPU 0 the fullest: never the most free
    resident(sim, ("w", "c"), (1,), 30.0)           # c already has a copy on GPU 1

    def promoted(cfg):
        core.cfg = cfg
        core.set_homes(cfg.homes, cfg.layout_holds)
        return {d.key[1]: d.group for d in core.plan(sim, 0.0) if type(d).__name__ == "Promote" and d.key[0] == "w"}

    assert promoted(PlannerConfig())["b"] == (2,), "the most free HBM, with no layout"
    assert promoted(PlannerConfig(homes=(("b", (0,)), ("c", (2,)))))["b"] == (0,)
    assert layout(sim.catalog, sim.cluster, (("a", (1, 0)),)) == {"a": (0, 1)}, "a group's GPUs in any order"
    assert "c" not in promoted(PlannerConfig(homes=(("c", (2,)),))), "a held copy stays where its calls ran"
    bound = PlannerConfig(homes=(("b", (0,)), ("c", (2,))), layout_holds=True)
    assert promoted(bound)["c"] == (2,), "with layout_holds, a held copy elsewhere does not keep it there"
    assert "c" not in promoted(replace(bound, layout_holds=False))


def test_a_bad_layout_fails_when_the_planner_is_made_and_names_the_entry():
    sim, _ = _sim()
    for homes, words in [((("b", (0,)), ("z", (1,))), "homes[1]: no model 'z'"),
                         ((("b", (7,)),), "homes[0]: b (tp 1) cannot run on GPUs (7,)"),
                         ((("a", (0,)),), "homes[0]: a (tp 2) cannot run"),
                         ((("b", (0,)), ("b", (1,))), "homes[1]: b is given a home twice"),
                         ((("b",),), "homes[0]: expected (model name, (GPU index, ...))"),
                         ((("b", (0.5,)),), "homes[0]: expected"), ((([], (0,)),), "homes[0]: expected")]:
        with pytest.raises(ValueError, match=re.escape(words)):
            PlannerCore(sim.catalog, sim.cost, PlannerConfig(homes=homes))
    big = Simulator(cluster(gpus=2, hbm_gb=24.0), catalog(("b", 30.0)), trace(program("p", [call("x", "b")])),
                    StateBudgetLease(), config=SimConfig(start="warm"))
    with pytest.raises(ValueError, match=re.escape("homes[0]: b's weights (30.0 GB a GPU) do not fit GPUs (1,)")):
        PlannerCore(big.catalog, big.cost, PlannerConfig(homes=(("b", (1,)),)))
