"""Ideal TTFT, TTFT slowdown, SLO attainment at k and total stall (DESIGN.md §4), on hand-made
calls whose ideal TTFT follows from the cost model's formulas, and in a replay's report and plots."""

import json
from collections import Counter
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from tests.helpers import GB, toy_trace_jsonl
from statebudget.cli import app
from statebudget.core.costs import CostModel
from statebudget.models import Catalog, Cluster
from statebudget.models.report import ModelStall
from statebudget.sim.metrics import (IdealTTFT, attainment_curve, handoff_tail, policy_report, short_of_room, slo_metrics,
                                     stall_by_model)
from statebudget.sim.plots import SLO_K, group_styles, placement_points
from statebudget.sim.recorder import SimResult
from statebudget.sim.sweep import figures

MFU = 0.5
SLOW = {"hbm_gb": 80, "hbm_gbps": 1000, "tflops": 100}
FAST = {"hbm_gb": 20, "hbm_gbps": 4000, "tflops": 400}
# name: (weights GB, active params B, KV bytes per token, tp)
MODELS = {"small": (10.0, 2.0, 1000, 1), "big": (30.0, 4.0, 2000, 1), "wide": (10.0, 2.0, 1000, 2),
          "huge": (100.0, 1.0, 1000, 1)}


def hetero() -> Cluster:
    """n0: two slow GPUs with large HBM; n1: one fast GPU with 20 GB."""
    link = {"h2d_gbps": 25, "d2h_gbps": 25, "wake_s": 0.5, "cold_start_s": 10}
    return Cluster.model_validate({
        "name": "hetero", "hbm_reserve_frac": 0.0,
        "gpu_kinds": {"slow": {**SLOW, **link}, "fast": {**FAST, **link}},
        "nodes": [{"name": n, "host_dram_gb": 256, "nvme_gb": 4000, "nvme_read_gbps": 7, "nvme_write_gbps": 5,
                   "root_gbps": 50, "gpus": gpus} for n, gpus in (("n0", {"slow": 2}), ("n1", {"fast": 1}))]})


def cat() -> Catalog:
    return Catalog.model_validate({"name": "t", "models": [
        {"name": n, "version": "v", "weights_gb": w, "active_params_b": p, "kv_bytes_per_token": kv, "tp": tp}
        for n, (w, p, kv, tp) in MODELS.items()]})


def by_hand(model: str, ctx: int, kind: dict) -> float:
    """Prefill of the whole context at MFU on tp GPUs, plus one roofline decode step."""
    w, p, kv, tp = MODELS[model]
    prefill = ctx * 2 * p * 1e9 / (kind["tflops"] * 1e12 * MFU * tp)
    step = (w * GB + (ctx + 0.5) * kv) / (kind["hbm_gbps"] * 1e9 * tp)
    return prefill + step


# The fastest kind that hosts each model: small fits both (fast wins); big (30 GB) only the slow
# kind's 80 GB; wide needs two GPUs of one kind on one node, which only n0 has; huge fits nowhere.
IDEAL = {("small", 1000): by_hand("small", 1000, FAST), ("big", 500): by_hand("big", 500, SLOW),
         ("wide", 1000): by_hand("wide", 1000, SLOW)}


def rec(model, ctx, arrive, stall, ttft):
    """A finished call record as the simulator leaves it (the fields the metrics read)."""
    return SimpleNamespace(program=f"p{arrive}", node=f"{model}@{arrive}", model=model, context_tokens=ctx, output_tokens=10,
                           tenant="t0", slo="interactive", handoff=False, hinted=False, state="done", arrive=arrive,
                           admitted=arrive, loads_at=arrive, last_load="w", ready=arrive + stall, start=arrive + stall,
                           first_token=arrive + ttft, end=arrive + ttft + 1.0, group=(0,))


# (model, context, arrive, TTFT / ideal); the stall is the part of the TTFT above ideal.
CALLS = [("small", 1000, 0.0, 1.5), ("small", 1000, 10.0, 4.0), ("big", 500, 5.0, 8.0), ("wide", 1000, 20.0, 30.0)]
STALL = {i: (r - 1) * IDEAL[(m, ctx)] for i, (m, ctx, _, r) in enumerate(CALLS)}
HUGE_STALL = 0.7


def fabricated() -> list:
    """TTFT / ideal = 1.5, 4, 8, 30; and one call of a model no GPU can host."""
    return [rec(m, ctx, t, STALL[i], r * IDEAL[(m, ctx)]) for i, (m, ctx, t, r) in enumerate(CALLS)] + \
        [rec("huge", 100, 30.0, HUGE_STALL, 3.0)]


def result(calls, warmup_s=0.0) -> SimResult:
    """Each call its own program, started when the call arrives (unfinished: no program figures)."""
    programs = {c.program: SimpleNamespace(prog=SimpleNamespace(program=c.program, start=c.arrive, nodes=[], tenant="t0"),
                                           end=-1.0, calls={}, service=0.0) for c in calls}
    return SimResult(calls=calls, programs=programs, bytes_by_pair=Counter(), bytes_by_link={}, wasted_bytes=0.0,
                     warm_tax=0.0, hbm_samples=[], decision_ms=[], events=0, stale_events=0, sim_end=100.0,
                     hbm_total=1.0, warmup_s=warmup_s, cost=CostModel(hetero(), cat()))


def test_ideal_ttft_is_prefill_plus_one_step_on_the_fastest_kind_that_hosts_the_model():
    ideal = IdealTTFT(CostModel(hetero(), cat()))
    for (model, ctx), want in IDEAL.items():
        assert ideal(model, ctx) == pytest.approx(want, rel=1e-12), model
    # The slow kind would be slower for `small`: the fast one is chosen, not the first found.
    assert by_hand("small", 1000, SLOW) > IDEAL[("small", 1000)]
    assert ideal("huge", 100) is None


def test_slowdown_attainment_and_total_stall_on_hand_made_calls():
    out = slo_metrics(fabricated(), CostModel(hetero(), cat()))
    d = out["ttft_slowdown"]
    assert d.n == 4  # the unhostable model's call has no ideal TTFT: it measures nothing
    assert d.p50 == pytest.approx((4 + 8) / 2) and d.mean == pytest.approx((1.5 + 4 + 8 + 30) / 4)
    assert d.max == pytest.approx(30.0)
    assert out["slo_attainment"] == pytest.approx({"2": 0.25, "5": 0.5, "10": 0.75})
    assert out["stall_total_s"] == pytest.approx(sum(STALL.values()) + HUGE_STALL)


def test_policy_report_carries_the_slo_figures_and_honours_the_warmup():
    full = policy_report(result(fabricated()), {"interactive": 2.0})
    assert full.slo_attainment == pytest.approx({"2": 0.25, "5": 0.5, "10": 0.75})
    assert full.stall_total_s == pytest.approx(sum(STALL.values()) + HUGE_STALL) and full.calls_completed == 5
    late = policy_report(result(fabricated(), warmup_s=4.0), {"interactive": 2.0})  # the call at 0 s goes
    assert late.calls_completed == 4 and late.ttft_slowdown.n == 3
    assert late.slo_attainment == pytest.approx({"2": 0.0, "5": 1 / 3, "10": 2 / 3})
    assert late.stall_total_s == pytest.approx(sum(STALL.values()) - STALL[0] + HUGE_STALL)


def test_stall_by_model_splits_the_counted_calls_by_model_and_group():
    calls = fabricated()
    for c, group, handoff in zip(calls, [(0,), (2,), (0,), (0, 1), (1,)], [True, False, True, True, False]):
        c.group, c.handoff = group, handoff
    calls[1].state = "cancelled"  # not completed: in no model's figures
    calls[2].admitted = calls[2].loads_at = calls[2].arrive + 0.25 * STALL[2]  # a quarter of its stall waiting for HBM room
    rep = policy_report(result(calls, warmup_s=4.0), {"interactive": 2.0})  # the small call at 0 s goes
    by = rep.stall_by_model
    assert list(by) == ["big", "huge", "wide"]
    assert by["big"].calls == 1 and by["big"].groups == {"0": 1}
    assert by["big"].stall_total_s == pytest.approx(STALL[2]) and by["big"].handoff_stall_s.n == 1
    assert by["wide"].groups == {"0,1": 1} and by["huge"].handoff_stall_s.n == 0
    assert by["big"].hbm_wait_total_s == pytest.approx(0.25 * STALL[2]) == by["big"].handoff_hbm_wait_total_s
    assert by["big"].handoff_stall_total_s == pytest.approx(STALL[2])
    assert by["wide"].hbm_wait_total_s == 0.0 and by["wide"].handoff_stall_total_s == pytest.approx(by["wide"].stall_total_s)
    assert by["huge"].handoff_stall_total_s == 0.0 < by["huge"].stall_total_s
    assert figures(rep)["handoff_hbm_wait_share"] == pytest.approx(
        0.25 * STALL[2] / (by["big"].stall_total_s + by["wide"].stall_total_s))
    assert sum(m.calls for m in by.values()) == rep.calls_completed
    assert sum(m.stall_total_s for m in by.values()) == pytest.approx(rep.stall_total_s)


def test_each_models_ttft_and_attainment_are_the_policys_figures_over_its_calls_alone():
    # TTFT / ideal: small 1.5 and 4, big 8, wide 30; huge has no ideal TTFT (no GPU hosts it).
    rep = policy_report(result(fabricated()), {"interactive": 2.0})
    by = rep.stall_by_model
    assert by["small"].slo_attainment == pytest.approx({"2": 0.5, "5": 1.0, "10": 1.0})
    assert by["big"].slo_attainment == pytest.approx({"2": 0.0, "5": 0.0, "10": 1.0})
    assert by["wide"].slo_attainment == pytest.approx({"2": 0.0, "5": 0.0, "10": 0.0})
    assert by["huge"].slo_attainment == {}  # it measures nothing, as in the policy's figures
    assert by["big"].ttft_s.max == pytest.approx(8 * IDEAL[("big", 500)]) and by["huge"].ttft_s.n == 1
    # Weighted by calls, over the models that have an attainment (hosting depends on the model
    # alone, so all of a hosted model's calls count), the models' attainment is the policy's.
    hosted = [m for m in by.values() if m.slo_attainment]
    for k in ("2", "5", "10"):
        mean = sum(m.calls * m.slo_attainment[k] for m in hosted) / sum(m.calls for m in hosted)
        assert mean == pytest.approx(rep.slo_attainment[k])
    # Without the calls' ratios (no cost model) the TTFT stays and the attainment is left empty.
    bare = stall_by_model(fabricated())
    assert bare["small"].slo_attainment == {} and bare["small"].ttft_s.n == 2


def test_placement_points_are_the_calls_whose_state_got_ready_by_model_in_arrival_order():
    calls = fabricated()
    for c, group in zip(calls, [(1,), (0,), (0,), (0, 1), (2,)]):
        c.group = group
    calls[4].ready = -1.0  # never ready: it ran nowhere
    calls[3].state = "cancelled"  # drawn where it ran, but not counted
    pts = placement_points(result(calls[::-1], warmup_s=4.0))  # the warm-up's call at 0 s is drawn too
    assert {m: [(a, g, counted) for a, g, _, counted in v] for m, v in pts.items()} == {
        "small": [(0.0, (1,), False), (10.0, (0,), True)], "big": [(5.0, (0,), True)], "wide": [(20.0, (0, 1), False)]}
    assert [st for _, _, st, _ in pts["small"]] == pytest.approx([STALL[0], STALL[1]])
    assert pts["wide"][0][2] == pytest.approx(STALL[3])


def test_group_styles_give_each_gpu_kind_its_shades_and_each_group_its_colour():
    from statebudget.models.load import load_cluster
    groups = [(12, 13, 14, 15), (0,), (8,), (12,), (9,), (0, 1, 2, 3)]
    style = group_styles(groups, load_cluster("hetero16"))
    assert style[(12, 13, 14, 15)][1] == "12,13,14,15 A100-40G" and style[(8,)][1] == "8 L40-48G"
    assert len({c for c, _ in style.values()}) == len(groups)
    # the two L40 groups are shades of one family: same hue order (green strongest), unlike an A100's
    for g in ((8,), (9,)):
        r, gr, b, _ = style[g][0]
        assert gr > r and gr > b
    plain = group_styles([(i,) for i in range(20)])
    assert len({c for c, _ in plain.values()}) == 20 and plain[(3,)][1] == "3"


def test_short_of_room_names_the_models_whose_stall_is_mostly_the_wait_for_room():
    by = {"reviewer": ModelStall(stall_total_s=100.0, hbm_wait_total_s=90.0),   # mostly room, and big
          "coder": ModelStall(stall_total_s=60.0, hbm_wait_total_s=20.0),       # mostly loading
          "planner": ModelStall(stall_total_s=5.0, hbm_wait_total_s=5.0),       # all room, but small
          "vlm": ModelStall(stall_total_s=40.0, hbm_wait_total_s=30.0)}         # room, second
    assert short_of_room(by, 195.0) == ["reviewer", "vlm"]
    assert short_of_room(by, 195.0, of_total=0.01) == ["reviewer", "vlm", "planner"]
    assert short_of_room(by, 195.0, share=0.3) == ["reviewer", "vlm", "coder"]
    assert short_of_room({"m": ModelStall()}, 0.0) == []  # no stall: nothing is short of room


def test_the_handoff_tail_is_the_calls_at_or_above_the_p95_split_by_what_held_them():
    def c(model, room, loading, last="w", handoff=True, drain=0.0):
        return SimpleNamespace(model=model, handoff=handoff, arrive=0.0, admitted=room - drain, loads_at=room,
                               ready=room + loading, last_load=last)

    # 40 handoffs with no stall and a tail: one waited for room (7 s, then 1 s of drain) then loaded
    # pages (1 s), one loaded pages (3 s), one weights (2 s) behind 0.5 s of room; a non-handoff is
    # left out
    calls = [c("s", 0.0, 0.0, last="") for _ in range(40)] + [
        c("r", 8.0, 1.0, last="e", drain=1.0), c("q", 0.0, 3.0, last="e"), c("p", 0.5, 2.0, last="w"),
        c("z", 50.0, 0.0, handoff=False)]
    tail = handoff_tail(calls)
    assert 0.0 < tail.p95_s <= 2.5 and tail.calls == 3
    assert (tail.room_s, tail.pages_s, tail.weights_s, tail.kv_s) == pytest.approx((8.5, 4.0, 2.0, 0.0))
    assert tail.stall_s == pytest.approx(14.5) and tail.models == {"p": 1, "q": 1, "r": 1}
    assert list(tail.by_cause.items()) == [("pages", 1), ("room", 1), ("weights", 1)]  # ties by name
    # calls exactly at the P95 are in it, whatever their last bits (the P95 is rounded)
    tied = [c("s", 0.0, 0.0, last="") for _ in range(30)] + [c("f", 0.0, 0.42302 - k * 1e-12, last="e") for k in range(9)]
    assert handoff_tail(tied).calls == 9
    # a P95 of 0 leaves no tail: calls with no stall do not set it
    assert handoff_tail([c("s", 0.0, 0.0, last="") for _ in range(40)]).calls == 0
    assert handoff_tail([]).calls == 0


def _moe_catalog():
    from statebudget.models import Catalog

    # 16 pages of 2 GB, page 0 touched by every call; the dense part (1 GB) loads first
    moe = {"experts": 16, "active": 2, "layers": 1, "expert_gb": 2.0, "pages": 16, "zipf_s": 1.0}
    return Catalog.model_validate({"name": "moe", "models": [
        {"name": "d", "version": "v1", "weights_gb": 1.0, "kv_bytes_per_token": 1000, "active_params_b": 1.0, "tp": 1},
        {"name": "x", "version": "v1", "weights_gb": 1.0, "kv_bytes_per_token": 1000, "active_params_b": 1.0, "tp": 1,
         "moe": moe}]})


def test_a_replay_names_the_state_a_handoff_waited_for_last():
    from tests.helpers import call, cluster, program, trace
    from statebudget.policies import make_policy
    from statebudget.sim.config import SimConfig
    from statebudget.sim.engine import Simulator

    # a then b on a MoE model: b loads its dense part and its pages at once (ondemand); the pages,
    # many times the bytes, come in last
    tr = trace(program("p", [call("a", "d"), call("b", "x", after=["a"])]))
    res = Simulator(cluster(hbm_gb=80.0, cold=0.0), _moe_catalog(), tr, make_policy("ondemand"), config=SimConfig()).run()
    b = next(x for x in res.calls if x.node == "b")
    assert b.handoff and len(b.pages) > 1 and b.last_load == "e" and b.loads_at == b.admitted == b.arrive
    tail = policy_report(res, {"interactive": 2.0}).handoff_tail
    assert tail.calls == 1 and tail.by_cause == {"pages": 1}
    assert tail.pages_s == pytest.approx(b.ready - b.arrive) and tail.weights_s == 0.0


def test_a_retried_call_keeps_no_load_of_its_failed_attempt():
    from tests.helpers import call, catalog, cluster, program, tool, trace
    from statebudget.policies import make_policy
    from statebudget.sim.config import SimConfig
    from statebudget.sim.engine import Simulator

    # every call fails now and then; a retry finds its weights resident and loads nothing
    nodes, prev = [], []
    for i in range(12):
        nodes += [call(f"c{i}", "m1" if i % 2 else "m2", prev, out=200), tool(f"t{i}", [f"c{i}"], duration=0.5)]
        prev = [f"t{i}"]
    sim = Simulator(cluster(cold=0.0), catalog(("m1", 10.0), ("m2", 10.0)), trace(program("p", nodes)),
                    make_policy("lru-keepwarm"), config=SimConfig(call_failure_rate=0.5, seed=1))
    res = sim.run()
    done = [c for c in res.calls if c.state == "done"]
    assert any(c.attempt > 0 and c.ready == c.loads_at for c in done), "no retry that loads nothing: the case is not met"
    for c in done:  # a last load exactly when the final attempt waited for one
        assert c.arrive <= c.admitted <= c.loads_at <= c.ready
        assert (c.last_load != "") == (c.ready > c.loads_at)


def test_attainment_curve_counts_calls_within_k_times_ideal():
    curve = dict(zip(SLO_K.tolist(), attainment_curve([1.0, 3.0, 6.0, 30.0], SLO_K)))
    assert SLO_K[0] == 1 and SLO_K[-1] == 20
    assert curve[1] == 0.25 and curve[2] == 0.25 and curve[3] == 0.5 and curve[5] == 0.5
    assert curve[10] == 0.75 and curve[20] == 0.75
    assert list(curve.values()) == sorted(curve.values())  # a share within a looser bound never drops


def test_replay_cli_reports_the_run_block_slo_figures_and_plot(tmp_path):
    (tmp_path / "t.jsonl").write_text(toy_trace_jsonl(seed=2, hours=0.05))
    res = CliRunner().invoke(app, ["replay", "--cluster", "toy2", "--catalog", "toy", "--trace", str(tmp_path / "t.jsonl"),
                                   "--policy", "ondemand,statebudget", "--start", "cold", "--warmup", "30", "--seed", "4",
                                   "--json", str(tmp_path / "r.json"), "--plots", str(tmp_path / "plots"), "--by-model"],
                            env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["run"] == {"start": "cold", "warmup_s": 30.0, "seed": 4, "kv_reserve": "asked"}
    for block in doc["policies"].values():
        assert set(block["slo_attainment"]) == {"2", "5", "10"}
        a = block["slo_attainment"]
        assert 0 <= a["2"] <= a["5"] <= a["10"] <= 1
        assert block["ttft_slowdown"]["n"] > 0 and block["stall_total_s"] >= 0
        assert block["stall_total_s"] == pytest.approx(block["stall_s"]["mean"] * block["stall_s"]["n"], rel=1e-6, abs=1e-6)
        by = block["stall_by_model"]
        assert sum(m["calls"] for m in by.values()) == block["calls_completed"] > 0
        assert sum(m["stall_total_s"] for m in by.values()) == pytest.approx(block["stall_total_s"], abs=1e-6)
        for m in by.values():  # every call ran on a group of the toy cluster, most used first
            assert sum(m["groups"].values()) == m["calls"]
            assert 0 <= m["handoff_hbm_wait_total_s"] <= m["hbm_wait_total_s"] <= m["stall_total_s"] + 1e-9
            assert list(m["groups"].values()) == sorted(m["groups"].values(), reverse=True)
            assert all(0 <= int(i) < 2 for g in m["groups"] for i in g.split(","))
            assert m["ttft_s"]["n"] == m["calls"] and 0 <= m["slo_attainment"]["5"] <= 1
        assert "stall by model" in res.output
    assert "SLO@5" in res.output and "start cold, warm-up 30 s" in res.output
    assert (tmp_path / "plots" / "slo_attainment.png").stat().st_size > 5000


def test_replay_cli_rejects_an_unknown_start(tmp_path):
    (tmp_path / "t.jsonl").write_text(toy_trace_jsonl(seed=2, hours=0.01))
    res = CliRunner().invoke(app, ["replay", "--cluster", "toy2", "--catalog", "toy", "--trace", str(tmp_path / "t.jsonl"),
                                   "--start", "tepid"])
    assert res.exit_code == 2 and "--start must be one of cold, warm" in res.output
