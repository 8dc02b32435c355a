"""llama-swap, sleep-swap and forecast-prewarm behave as the operators' tools they follow (DESIGN.md §6)."""

import math

import pytest

from tests.helpers import GB, call, catalog, cluster, program, tool, trace
from statebudget.models.load import load_catalog, load_cluster
from statebudget.models.state import kv_key, weights_key
from statebudget.policies import REGISTRY, make_policy
from statebudget.policies.base import Policy
from statebudget.policies.swaps import ForecastPrewarm, LlamaSwap, SleepSwap
from statebudget.sim.engine import Simulator


def _stall(c):
    return c.ready - c.arrive


def _homes(cl, cat, **kw):
    p = LlamaSwap(**kw)
    sim = Simulator(cl, cat, trace(), p)
    return p._homes(sim), p.swaps, sim


def test_registry_lists_the_new_baselines_after_llama_swap_and_before_ours():
    names = list(REGISTRY)
    assert names.index("llama-swap") < names.index("sleep-swap") < names.index("statebudget")
    assert names.index("llama-swap") < names.index("forecast-prewarm") < names.index("statebudget")
    assert isinstance(make_policy("sleep-swap"), SleepSwap) and isinstance(make_policy("forecast-prewarm"), ForecastPrewarm)


def test_llama_swap_homes_on_hetero16_give_every_model_its_own_gpus():
    # 16 GPUs, 7 engines needing 11 GPUs in all: no overlap is unavoidable, so none may happen.
    home, swaps, sim = _homes(load_cluster("hetero16"), load_catalog("agent-team"))
    cat = load_catalog("agent-team")
    assert set(home) == {m.name for m in cat.models}
    for m in cat.models:
        assert len(home[m.name]) == m.tp
    owners = {}
    for model, g in home.items():
        for i in g:
            assert i not in owners, f"{model} and {owners[i]} share GPU {i}"
            owners[i] = model
    assert swaps == {}
    assert not set(home["fast-coder"]) & set(home["reasoner"])  # they used to evict each other
    for m in cat.models:  # a dense model's engine holds all its weights on its home
        if not m.moe:
            assert all(m.total_bytes / m.tp <= sim.tiers.hbm_cap[i] for i in home[m.name])


def test_homes_fit_together_before_they_overlap_and_overlap_the_smallest_homes():
    cl = cluster(gpus=2, hbm_gb=40.0)
    cat = catalog(("a", 30.0), ("b", 25.0), ("c", 12.0), ("d", 8.0))
    home, swaps, _ = _homes(cl, cat, kv_headroom=0.0)
    # biggest first, each on an empty GPU; c fits next to b only, d next to a only
    assert home == {"a": (0,), "b": (1,), "c": (1,), "d": (0,)} and swaps == {}
    cat = catalog(("a", 30.0), ("b", 25.0), ("c", 12.0), ("d", 8.0), ("e", 7.0))
    home, swaps, _ = _homes(cl, cat, kv_headroom=0.0)
    # e fits next to nobody: it swaps with the GPU whose biggest home is smaller (b's, not a's)
    assert home["e"] == (1,)
    assert swaps == {"e": {"b", "c"}, "b": {"e"}, "c": {"e"}}


def test_llama_swap_never_unloads_an_idle_model_by_default():
    cl, cat = cluster(hbm_gb=40.0, cold=5.0), catalog(("m1", 14.0))
    tr = trace(program("p", [call("a", "m1"), tool("idle", ["a"], duration=5000.0), call("b", "m1", ["idle"])]))
    assert make_policy("llama-swap").ttl_s == math.inf
    res = Simulator(cl, cat, tr, make_policy("llama-swap")).run()
    assert _stall(res.calls[1]) == 0.0
    res = Simulator(cl, cat, tr, LlamaSwap(ttl_s=300.0)).run()
    assert _stall(res.calls[1]) > 5.0


def _pingpong(rounds=2, gap_s=1.0):
    nodes, prev = [], []
    for r in range(rounds):
        for m in ("m1", "m2"):
            nid = f"{m}_{r}"
            nodes += [call(nid, m, prev), tool(f"t_{nid}", [nid], duration=gap_s)]
            prev = [f"t_{nid}"]
    return trace(program("p", nodes))


class _Probe:
    """Records, at each arrival of an m1 call, where m1's weights and KV are."""

    def on_call_arrive(self, sim, c):
        if c.model == "m1":
            w = weights_key("m1")
            self.seen.append({"gpu": (w, (0,)) in sim.tiers.gpu, "asleep": sim.tiers.asleep_on(w, (0,)),
                              "host": (w, "n0") in sim.tiers.host,
                              "kv_gpu": (kv_key("p", "m1"), (0,)) in sim.tiers.gpu})
        return super().on_call_arrive(sim, c)


class ProbeLlama(_Probe, LlamaSwap):
    seen: list


class ProbeSleep(_Probe, SleepSwap):
    seen: list


# Both 14 GB models fit one 30 GB GPU, but with half of it kept for KV each fits only alone: an
# operator puts them in one swap group. Whatever happens to m1 is the swap's doing, not a lack of room.
SWAP_CLUSTER = dict(hbm_gb=30.0, cold=10.0, wake=0.5, h2d=25.0)


def test_llama_swap_stops_the_rival_in_its_swap_group():
    cl, cat = cluster(**SWAP_CLUSTER), catalog(("m1", 14.0), ("m2", 14.0))
    p = ProbeLlama(kv_headroom=0.5)
    p.seen = []
    res = Simulator(cl, cat, _pingpong(), p).run()
    assert p.swaps == {"m1": {"m2"}, "m2": {"m1"}}
    assert p.seen[1] == {"gpu": False, "asleep": False, "host": False, "kv_gpu": False}
    assert _stall(res.calls[2]) > 10.0  # a cold start
    assert res.bytes_by_pair.get("host->gpu", 0.0) == 0.0
    keep = Simulator(cl, cat, _pingpong(), make_policy("lru-keepwarm")).run()
    assert _stall(keep.calls[2]) == 0.0  # without the swap group both stay resident


def test_sleep_swap_puts_the_rival_to_sleep_on_host_and_wakes_it_on_its_home():
    cl, cat = cluster(**SWAP_CLUSTER), catalog(("m1", 14.0), ("m2", 14.0))
    p = ProbeSleep(kv_headroom=0.5)
    p.seen = []
    res = Simulator(cl, cat, _pingpong(), p).run()
    assert p.seen[1]["gpu"] is False and p.seen[1]["asleep"] is True and p.seen[1]["host"] is True
    assert p.seen[1]["kv_gpu"] is False
    second = res.calls[2]
    assert second.model == "m1" and second.group == (0,)
    wake_bound = 14.0 / 25.0 + 0.5 + 14.0 / 25.0 + 0.01  # a drain, the H2D copy and the wake
    assert 0.5 <= _stall(second) < wake_bound < 10.0
    # m1 and m2 each woke once, their KV (a few hundred kB) came back from host with them
    assert 2 * 14.0 * GB <= res.bytes_by_pair["host->gpu"] < 2 * 14.0 * GB + 1e6


def _dominant_trace(hints=()):
    progs = [program(f"hot{i}", [call("a", "m1")], start=5.0 * i) for i in range(13)]  # m1 every 5 s to t=60
    progs.append(program("once", [call("a", "m2")], start=65.0))  # m2 takes the GPU once
    progs.append(program("again", [call("a", "m1")], start=100.0))
    return trace(*progs)


def test_forecast_prewarm_brings_back_the_model_whose_arrivals_dominate():
    cl, cat = cluster(hbm_gb=24.0, cold=10.0), catalog(("m1", 14.0), ("m2", 14.0))
    sim = Simulator(cl, cat, _dominant_trace(), make_policy("forecast-prewarm"))
    res = sim.run()
    last = [c for c in res.calls if c.program == "again"][0]
    assert _stall(last) == 0.0
    assert sim.tiers.gpu[(weights_key("m1"), (0,))].from_prefetch
    for other in ("ondemand", "lru-keepwarm"):
        r = Simulator(cl, cat, _dominant_trace(), make_policy(other)).run()
        assert _stall([c for c in r.calls if c.program == "again"][0]) > 0.0


def test_forecast_prewarm_ignores_hints():
    assert ForecastPrewarm.on_hint is Policy.on_hint and ForecastPrewarm.on_hints is Policy.on_hints
    cl, cat = cluster(gpus=2, hbm_gb=40.0, cold=1.0), catalog(("m1", 10.0), ("m3", 10.0))
    nodes = [call("a", "m1"), tool("t", ["a"], duration=60.0), call("b", "m1", ["t"])]
    hints = [{"issued_at": "t", "for": "b", "model": "m3", "confidence": 0.9}]
    tr = lambda: trace(program("p", nodes, hints=hints))  # noqa: E731
    to_gpu = lambda r: sum(b for pair, b in r.bytes_by_pair.items() if pair.endswith("->gpu"))  # noqa: E731
    sim = Simulator(cl, cat, tr(), make_policy("forecast-prewarm"))
    res = sim.run()
    assert to_gpu(res) == pytest.approx(10.0 * GB)  # m1 once, never m3
    assert not sim.copies_of("m3")
    pre = Simulator(cl, cat, tr(), make_policy("prefetch-all")).run()
    assert to_gpu(pre) >= 20.0 * GB  # the same hints do load m3 under a policy that reads them
