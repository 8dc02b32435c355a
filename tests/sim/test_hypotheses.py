"""H1-H3 of `evidence` (statebudget/sim/hypotheses.py) on constructed inputs whose answers are
known by hand: the capacity ratio of pooled against independent KV, the hidden-state hop
arithmetic, and the warm-model sweep's first killer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from statebudget.core.costs import LATENCY_S, CostModel
from statebudget.models.catalog import Catalog
from statebudget.models.cluster import GB
from statebudget.models.load import load_cluster
from statebudget.sim import hypotheses as hyp

from tests.helpers import catalog, cluster


def test_two_models_that_never_overlap_need_twice_the_memory_reserved_apart():
    c = hyp.capacity([(0, 10, "a", 1.0), (10, 20, "b", 1.0)], 0, 20, ["a", "b"])
    assert c["independent_q95"] == 2.0 and c["pooled_q95"] == 1.0 and c["ratio_q95"] == 2.0
    assert c["ratio_q100"] == 2.0 and c["active_models_p95"] == 1
    # at the pool's Q95 budget (1 byte) each model's share is half a byte: both calls turned away
    assert c["rejected_at_pooled_q95"] == {"pooled": 0.0, "independent": 1.0, "calls": 2}


def test_models_that_peak_together_gain_nothing_from_a_pool():
    c = hyp.capacity([(0, 20, "a", 3.0), (0, 20, "b", 1.0)], 0, 20, ["a", "b"])
    assert c["ratio_q95"] == 1.0 and c["ratio_q100"] == 1.0 and c["pooled_q95"] == 4.0 and c["active_models_p95"] == 2
    assert c["rejected_at_pooled_q95"]["pooled"] == c["rejected_at_pooled_q95"]["independent"] == 0.0


def test_a_short_peak_sets_q100_not_q95_and_the_window_clips_demand():
    iv = [(0, 100, "a", 1.0), (50, 51, "a", 5.0), (-50, 10, "b", 7.0), (200, 300, "b", 9.0)]
    c = hyp.capacity(iv, 0, 100, ["a", "b"])
    assert c["per_model_q95"] == {"a": 1.0, "b": 7.0}  # b holds 7 for 10 % of the window
    assert c["per_model_q100"] == {"a": 6.0, "b": 7.0}
    assert c["pooled_q100"] == 8.0  # a's peak (6) at t=50 does not meet b's 7 (ended at 10)
    assert c["rejected_at_pooled_q95"]["calls"] == 2  # calls starting before the window are not admitted in it


def test_kv_demand_counts_the_evaluated_window_and_holds_a_sessions_kv_between_its_calls():
    cat = catalog(("m", 1.0, 10), ("n", 1.0, 1))
    rec = lambda p, m, s, e, ctx: SimpleNamespace(program=p, model=m, start=s, end=e, context_tokens=ctx,
                                                 output_tokens=0)
    calls = [rec("p", "m", 10, 20, 100), rec("p", "m", 60, 70, 300), rec("q", "n", 30, 40, 50),
             rec("w", "m", 1, 5, 999)]  # w ran in the warm-up
    progs = {"p": SimpleNamespace(prog=SimpleNamespace(start=10.0), end=70.0),
             "q": SimpleNamespace(prog=SimpleNamespace(start=30.0), end=40.0)}
    res = SimpleNamespace(calls=calls, programs=progs, warmup_s=10.0, sim_end=110.0)
    d = hyp.kv_demand(res, cat)
    assert d["window_s"] == 100.0
    assert d["calls"]["per_model_q100"] == {"m": 3000.0, "n": 50.0}
    # the session on m holds its largest KV (3000 B) from 10 to 70: 60 % of the window
    assert d["sessions"]["per_model_q95"]["m"] == 3000.0 and d["calls"]["per_model_q95"]["m"] == 3000.0
    s = hyp.capacity([(10, 70, "m", 3000.0), (30, 40, "n", 50.0)], 10, 110, ["m", "n"])
    assert d["sessions"] == s
    # live programs: 1 for 50 s, 2 for 10 s (30-40), none for 40 s
    assert d["live_programs"]["mean"] == pytest.approx((50 + 2 * 10) / 100) and d["live_programs"]["p95"] == 2.0


def test_a_hidden_state_hop_costs_what_the_arithmetic_says():
    cl = cluster(gpus=1, nodes=2, h2d=20.0, root=50.0)
    cat = Catalog.model_validate({"models": [{"name": "m", "version": "custom", "weights_gb": 10.0,
                                              "kv_bytes_per_token": 1000, "active_params_b": 5.0, "tp": 1,
                                              "hidden_size": 4000, "layers": 10}]})
    m = cat.models[0]
    cost = CostModel(cl, cat)
    d = hyp.disagg(cost, m, (0,), 1, batch=4, link=None, context=2000)
    hop = 4 * 4000 * 2 / 20e9 + LATENCY_S["gpu"]  # GPU 0 -> host n0 -> host n1 -> GPU 1: 20 GB/s at worst
    local = (10e9 + 4 * 2000 * 1000) / 1555e9
    assert d["hop_s"] == pytest.approx(hop) and d["exposed_s"] == pytest.approx(2 * 10 * hop)
    assert d["local_s"] == pytest.approx(local)
    assert d["share"] == pytest.approx(20 * hop / (local + 20 * hop))
    assert d["tpot_ratio"] == pytest.approx(1 + 20 * hop / local)
    # at the latency it names, the exposed share is 30 %
    at = 2 * 10 * (hop - LATENCY_S["gpu"] + d["latency_for_30pct_s"])
    assert at / (local + at) == pytest.approx(0.30)
    nv = hyp.disagg(cost, m, (0,), 1, batch=4, link=(300.0, 5e-6), context=2000)
    assert nv["hop_s"] == pytest.approx(4 * 4000 * 2 / 300e9 + 5e-6)
    assert hyp.shape(m.model_copy(update={"version": "nothing-known"})) == (4000, 10)  # its own fields win


def test_a_model_of_unknown_shape_is_skipped_and_said():
    ans, page = hyp.h2(cluster(gpus=1, nodes=2), catalog(("x", 1.0)))
    assert ans["rows"] == [] and ans["skipped"] == ["x"] and ans["verdict"].startswith("not shown")


def test_the_warm_sweep_names_weights_when_the_weights_alone_do_not_fit():
    cl = cluster(gpus=2, hbm_gb=10.0)  # two 10 GB GPUs, no reserve, no engine overhead
    cat = catalog(("a", 8.0), ("b", 8.0), ("c", 8.0))
    s = hyp.warm_sweep(cl, cat, ["a", "b", "c"], {"a": 1 * GB, "b": 1 * GB, "c": 1 * GB})
    assert [r["fits"] for r in s["rows"]] == [True, True, False]
    assert s["first_failure"] == {"k": 3, "killer": "weights", "model": "c", "fits_alone": True}
    assert s["rows"][1]["weights_share_hbm"] == pytest.approx(16 / 20)
    # the third model's cold load: 8 GB over its GPU's 25 GB/s H2D, plus the latency and the engine
    load = s["rows"][2]["load"]
    assert load["copy_host_s"] == pytest.approx(8 / 25 + LATENCY_S["host"], abs=1e-3)
    assert load["host_wake_s"] == pytest.approx(load["copy_host_s"] + 0.5, abs=1e-3)
    assert load["nvme_cold_s"] == pytest.approx(8 / 7 + LATENCY_S["nvme"] + 10.0, abs=1e-3)
    # a model too big for any of its groups fails alone: said, whatever K it comes at
    big = hyp.warm_sweep(cl, catalog(("a", 4.0), ("z", 12.0)), ["a", "z"], {})
    assert big["first_failure"] == {"k": 2, "killer": "weights", "model": "z", "fits_alone": False}


def test_the_warm_sweep_names_kv_when_weights_fit_but_not_with_their_kv():
    cl = cluster(gpus=2, hbm_gb=10.0)
    cat = catalog(("a", 6.0), ("b", 6.0))
    s = hyp.warm_sweep(cl, cat, ["a", "b"], {"a": 3 * GB, "b": 5 * GB})
    assert s["rows"][0]["fits"] and s["first_failure"] == {"k": 2, "killer": "kv", "model": "b", "fits_alone": True}
    # with tensor parallelism the weights and the KV split over the group
    tp = catalog(("a", 12.0, 1000, 2))
    assert hyp.warm_sweep(cl, tp, ["a"], {"a": 7 * GB})["first_failure"] is None
    assert hyp.warm_sweep(cl, tp, ["a"], {"a": 9 * GB})["first_failure"]["killer"] == "kv"


def test_frontier_models_spread_over_a_whole_node():
    assert {m.tp for m in hyp.frontier_catalog(load_cluster("h200x8")).models} == {8}
    assert {m.tp for m in hyp.frontier_catalog(load_cluster("hetero16")).models} == {4}
    cat = hyp.frontier_catalog(load_cluster("h200x8"))
    assert cat.by_name["deepseek-v3"].total_bytes == pytest.approx(671e9, rel=0.001)  # hardware.md's 671 GB fp8
