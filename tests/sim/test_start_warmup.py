"""Start (cold or warm) and warm-up (DESIGN.md §4): what the books hold at t = 0, and which calls
and bytes the metrics count."""

import pytest

from tests.helpers import GB, call, catalog, cluster, program, trace
from statebudget.core.books import Tiers
from statebudget.core.costs import LATENCY_S
from statebudget.models import Catalog, Cluster
from statebudget.models.state import expert_key, weights_key
from statebudget.policies import REGISTRY, make_policy
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.sim.runner import replay


def two_node_cluster(small_host_gb: float, preload=()) -> Cluster:
    """n0 has DRAM for every model; n1 only `small_host_gb`."""
    kind = {"hbm_gb": 40, "hbm_gbps": 1555, "h2d_gbps": 25, "d2h_gbps": 25, "tflops": 312, "wake_s": 0.5,
            "cold_start_s": 10}
    return Cluster.model_validate({
        "name": "two", "gpu_kinds": {"G": kind}, "preload": list(preload),
        "nodes": [{"name": name, "host_dram_gb": host, "nvme_gb": 4000, "nvme_read_gbps": 7, "nvme_write_gbps": 5,
                   "root_gbps": 50, "gpus": {"G": 2}} for name, host in (("n0", 512.0), ("n1", small_host_gb))]})


def moe_catalog() -> Catalog:
    """a 20 GB, b 16 GB + 4 expert pages of 1 GB (20 GB in all), c 8 GB, in that order."""
    return Catalog.model_validate({"name": "t", "models": [
        {"name": "a", "version": "v", "weights_gb": 20.0, "kv_bytes_per_token": 1000, "active_params_b": 1.0, "tp": 1},
        {"name": "b", "version": "v", "weights_gb": 16.0, "kv_bytes_per_token": 1000, "active_params_b": 1.0, "tp": 1,
         "moe": {"experts": 4, "active": 1, "layers": 1, "expert_gb": 1.0, "pages": 4}},
        {"name": "c", "version": "v", "weights_gb": 8.0, "kv_bytes_per_token": 1000, "active_params_b": 1.0, "tp": 1},
    ]})


def keys_of(m) -> list:
    return [weights_key(m.name)] + ([expert_key(m.name, p) for p in range(m.moe.pages)] if m.moe else [])


def books(sim) -> tuple:
    t = sim.tiers
    return (sorted((k, c.nbytes, c.ready) for k, c in t.host.items()), sorted(t.nvme.items()), dict(t.host_used),
            dict(t.nvme_used), list(t.hbm_used), sorted(t.gpu))


def one_call():
    return trace(program("p", [call("x", "a")]))


def test_config_rejects_an_unknown_start_and_a_negative_warmup():
    with pytest.raises(ValueError, match="start must be one of cold, warm"):
        SimConfig(start="hot")
    with pytest.raises(ValueError, match="warmup_s must be >= 0"):
        SimConfig(warmup_s=-1.0)
    assert SimConfig().start == "cold" and SimConfig().warmup_s == 0.0


def test_warm_start_books_are_the_same_for_every_policy():
    cl, cat = two_node_cluster(30.0), moe_catalog()
    names = [n for n in REGISTRY if n != "oracle"]
    seen = {n: books(Simulator(cl, cat, one_call(), make_policy(n), config=SimConfig(start="warm"))) for n in names}
    first = seen[names[0]]
    for n in names:
        assert seen[n] == first, n
    assert first[0], "a warm start holds host copies"
    assert not first[5] and not any(first[4]), "no engine is awake: nothing in HBM"


def test_warm_start_fills_each_node_in_catalog_order_skipping_what_does_not_fit():
    # n1 holds 30 GB: a (20 GB) fits, b (20 GB with its pages) no longer does, c (8 GB) still does.
    cl, cat = two_node_cluster(30.0), moe_catalog()
    sim = Simulator(cl, cat, one_call(), make_policy("ondemand"), config=SimConfig(start="warm"))
    host = sim.tiers.host
    expect = {"n0": {"a", "b", "c"}, "n1": {"a", "c"}}
    for node, models in expect.items():
        for m in cat.models:
            for k in keys_of(m):
                assert ((k, node) in host) == (m.name in models), (k, node)
                if (k, node) in host:
                    assert host[(k, node)].ready
    assert sim.tiers.host_used["n0"] == pytest.approx(48 * GB)
    assert sim.tiers.host_used["n1"] == pytest.approx(28 * GB)
    # Every object is still in the model store on every node's NVMe.
    assert all((k, n.name) in sim.tiers.nvme for n in cl.nodes for m in cat.models for k in keys_of(m))
    sim.tiers.check()


def test_cold_start_holds_only_the_clusters_preload_in_host_dram():
    cat = moe_catalog()
    sim = Simulator(two_node_cluster(30.0), cat, one_call(), make_policy("ondemand"), config=SimConfig(start="cold"))
    assert not sim.tiers.host and sim.tiers.host_used == {"n0": 0.0, "n1": 0.0}
    sim = Simulator(two_node_cluster(30.0, preload=["c"]), cat, one_call(), make_policy("ondemand"),
                    config=SimConfig(start="cold"))
    assert set(sim.tiers.host) == {(weights_key("c"), "n0"), (weights_key("c"), "n1")}


def test_stocking_without_preload_leaves_host_dram_empty_as_the_live_planner_asks():
    cl = two_node_cluster(30.0, preload=["c"])
    sim = Simulator(cl, moe_catalog(), one_call(), make_policy("ondemand"))
    sim.tiers = Tiers(cl)
    sim.stock_model_store(preload=False)
    assert not sim.tiers.host and len(sim.tiers.nvme) == 2 * (1 + 4 + 1 + 1)
    with pytest.raises(ValueError, match="preload"):
        sim.stock_model_store(preload="tepid")


def test_warm_start_loads_from_host_dram_then_starts_the_engine_cold():
    # 14 GB: from NVMe the 7 GB/s read is the bottleneck; from DRAM the 25 GB/s h2d link. The host
    # copy is a page cache, not a sleeping engine: the engine still starts cold (10 s).
    cl, cat = cluster(nvme_read=7.0, h2d=25.0, root=50.0, cold=10.0, wake=0.5), catalog(("a", 14.0))
    stall = {}
    for start in ("cold", "warm"):
        res = Simulator(cl, cat, one_call(), make_policy("ondemand"),
                        config=SimConfig(start=start, check_invariants=True)).run()
        stall[start] = res.calls[0].ready - res.calls[0].arrive
    assert stall["cold"] == pytest.approx(14 / 7 + 10 + LATENCY_S["nvme"], abs=1e-9)
    assert stall["warm"] == pytest.approx(14 / 25 + 10 + LATENCY_S["host"], abs=1e-9)


def warmup_trace():
    """p1 at 0 s loads m1 (14 GB); p2 at 100 s loads m2 (8 GB); p3 at 200 s runs both, warm."""
    return trace(program("p1", [call("a", "m1")]), program("p2", [call("b", "m2")], start=100.0),
                 program("p3", [call("c", "m1"), call("d", "m2", after=["c"])], start=200.0))


@pytest.mark.parametrize("start", ["cold", "warm"])
def test_warmup_leaves_out_the_calls_that_arrive_in_it(start):
    cl, cat, tr = cluster(), catalog(("m1", 14.0), ("m2", 8.0)), warmup_trace()
    runs = {w: replay(cl, cat, tr, ["ondemand"], SimConfig(start=start, warmup_s=w, check_invariants=True))
            for w in (0.0, 50.0)}
    full, late = (runs[w].report.policies["ondemand"] for w in (0.0, 50.0))
    calls = runs[0.0].results["ondemand"].calls
    assert all(c.state == "done" for c in calls)
    stall = {c.node: c.ready - c.arrive for c in calls}
    assert stall["a"] > 1.0 and stall["b"] > 1.0  # both loads stall: the warm-up must drop one of them

    assert full.calls_completed == full.ttft_s.n == full.stall_s.n == 4
    assert late.calls_completed == late.ttft_s.n == late.stall_s.n == 3
    assert full.stall_total_s == pytest.approx(sum(stall.values()), abs=1e-6)
    assert late.stall_total_s == pytest.approx(stall["b"] + stall["c"] + stall["d"], abs=1e-6)
    assert full.program_latency_s.n == 3 and late.program_latency_s.n == 2
    # Bytes count from the warm-up's end: m1's load (done by 50 s) is left out, m2's is not.
    assert full.bytes_moved == pytest.approx(22 * GB, rel=1e-9)
    assert late.bytes_moved == pytest.approx(8 * GB, rel=1e-9)
    assert sum(late.bytes_moved_by_tier.values()) == pytest.approx(8 * GB, rel=1e-9)
    assert 0.0 <= late.warm_tax <= 1.0
    run = runs[50.0].report.run
    assert (run.start, run.warmup_s, run.seed) == (start, 50.0, 0)


def test_warmup_past_every_arrival_counts_nothing():
    cl, cat, tr = cluster(), catalog(("m1", 14.0), ("m2", 8.0)), warmup_trace()
    rep = replay(cl, cat, tr, ["ondemand"], SimConfig(warmup_s=10_000.0)).report.policies["ondemand"]
    assert rep.calls_completed == 0 and rep.ttft_s.n == 0 and rep.stall_total_s == 0.0
    assert rep.bytes_moved == 0.0 and rep.wasted_bytes == 0.0 and rep.warm_tax == 0.0
