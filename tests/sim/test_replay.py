"""The replay command and report: deterministic, complete, and every baseline behaves as named."""

import json

import pytest

from statebudget.models.cluster import Cluster

from typer.testing import CliRunner

from tests.helpers import GB, call, catalog, cluster, program, tool, trace
from statebudget.cli import app
from statebudget.models.load import load_catalog, load_cluster, write_trace
from statebudget.sim.engine import Simulator
from statebudget.policies import REGISTRY, make_policy
from statebudget.policies.baselines import BASELINES
from statebudget.sim.runner import replay, report_json
from statebudget.traces.generators import generate


def _strip_decision_ms(doc):
    """Drop what is measured in wall time: each policy's decision_ms and the oracle's solve_s."""
    for p in doc["policies"].values():
        p.pop("decision_ms")
    if doc.get("oracle"):
        doc["oracle"].pop("solve_s")
    return doc


def test_same_inputs_and_seed_give_a_byte_identical_report(tmp_path):
    tr = generate("swe-team", 7, 0.3)
    write_trace(tr, tmp_path / "t.jsonl")
    runner = CliRunner()
    outs = []
    for name in ("a", "b"):
        res = runner.invoke(app, ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace",
                                  str(tmp_path / "t.jsonl"), "--policy", ",".join(REGISTRY), "--seed", "3",
                                  "--json", str(tmp_path / f"{name}.json")])
        assert res.exit_code == 0, res.output
        outs.append(json.loads((tmp_path / f"{name}.json").read_text()))
    a, b = (_strip_decision_ms(o) for o in outs)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert set(a["policies"]) == set(REGISTRY)


def test_report_has_every_section8_field_and_plots(tmp_path):
    tr = generate("swe-team", 1, 0.2)
    write_trace(tr, tmp_path / "t.jsonl")
    res = CliRunner().invoke(app, ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace",
                                   str(tmp_path / "t.jsonl"), "--policy", "ondemand,static",
                                   "--json", str(tmp_path / "r.json"), "--plots", str(tmp_path / "plots")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert {"statebudget", "cluster", "trace", "policies"} <= set(doc)
    assert doc["trace"]["calls"] == tr.n_calls
    block = doc["policies"]["ondemand"]
    for key in ("stall_s", "handoff_stall_s", "lease_lateness_s", "ttft_s", "program_latency_s", "nonlease_ttft_s"):
        assert set(block[key]) >= {"p50", "p95", "p99", "mean", "max"}
        assert block[key]["p50"] <= block[key]["p95"] <= block[key]["p99"] <= block[key]["max"]
    for key in ("bytes_moved", "wasted_bytes", "warm_tax", "slo_violations", "decision_ms"):
        assert key in block
    assert 0 <= block["warm_tax"] <= 1 and 0 <= block["slo_violations"] <= 1
    assert block["calls_completed"] + block["calls_cancelled"] + block["unplaceable_calls"] == tr.n_calls
    for png in ("handoff_stall_cdf.png", "ttft_cdf.png", "hbm_occupancy.png", "bytes_per_link.png",
                "program_latency_cdf.png", "kv_actions.png", "stall_by_model.png", "placement.png", "handoff_tail.png"):
        assert (tmp_path / "plots" / png).stat().st_size > 5000


def _two_model_pingpong(gap_s=1.0, rounds=3):
    nodes, prev = [], []
    for r in range(rounds):
        for m in ("m1", "m2"):
            nid = f"{m}_{r}"
            nodes.append(call(nid, m, prev))
            nodes.append(tool(f"t_{nid}", [nid], duration=gap_s))
            prev = [f"t_{nid}"]
    return trace(program("p", nodes))


def test_ondemand_drops_and_keepwarm_sleeps_to_host():
    # One 24 GB GPU, two 14 GB models: every switch evicts the other model.
    cl, cat, tr = cluster(hbm_gb=24.0, cold=10.0, wake=0.5), catalog(("m1", 14.0), ("m2", 14.0)), _two_model_pingpong()
    res = {p: Simulator(cl, cat, tr, make_policy(p)).run() for p in ("ondemand", "lru-keepwarm")}
    od = [c.ready - c.arrive for c in res["ondemand"].calls]
    kw = [c.ready - c.arrive for c in res["lru-keepwarm"].calls]
    assert min(od) > 10.0                    # every call is a cold start
    assert max(kw[2:]) < 14.0 / 25.0 + 0.5 + 14.0 / 25.0 + 0.01  # drain + restore from host + wake
    assert res["lru-keepwarm"].bytes_by_pair["host->gpu"] > 0 and res["ondemand"].bytes_by_pair["host->gpu"] == 0


def test_llama_swap_unloads_after_ttl():
    from statebudget.policies.swaps import LlamaSwap

    cl, cat = cluster(hbm_gb=40.0, cold=5.0), catalog(("m1", 14.0))
    nodes = [call("a", "m1"), tool("idle", ["a"], duration=1000.0), call("b", "m1", ["idle"])]
    tr = trace(program("p", nodes))
    res = Simulator(cl, cat, tr, LlamaSwap(ttl_s=300.0)).run()
    assert res.calls[1].ready - res.calls[1].arrive > 5.0  # unloaded after 300 s idle: cold again
    res = Simulator(cl, cat, tr, make_policy("llama-swap")).run()
    assert res.calls[1].ready - res.calls[1].arrive == 0.0  # llama-swap's default `ttl: 0`: never unloads
    res = Simulator(cl, cat, tr, make_policy("lru-keepwarm")).run()
    assert res.calls[1].ready - res.calls[1].arrive == 0.0


def test_ray_multiplex_caps_models_per_replica():
    cl = cluster(hbm_gb=80.0)
    cat = catalog(*[(f"m{i}", 5.0) for i in range(5)])
    nodes, prev = [], []
    for i in range(5):
        nodes += [call(f"c{i}", f"m{i}", prev), tool(f"t{i}", [f"c{i}"])]
        prev = [f"t{i}"]
    sim = Simulator(cl, cat, trace(program("p", nodes)), make_policy("ray-multiplex"))
    sim.run()
    assert len([k for k in sim.tiers.gpu if k[0][0] == "w"]) == 3
    sim = Simulator(cl, cat, trace(program("p", nodes)), make_policy("ondemand"))
    sim.run()
    assert len([k for k in sim.tiers.gpu if k[0][0] == "w"]) == 5


def test_ray_multiplex_routes_a_context_too_long_for_the_replica_elsewhere():
    # the model's replica is the small GPU (it loads fastest); a call whose KV fits only the big
    # one goes there instead of being dropped with the rest of its program
    kind = {"hbm_gbps": 1555, "d2h_gbps": 25.0, "tflops": 312.0, "wake_s": 0.5, "cold_start_s": 1.0,
            "engine_overhead_gb": 0.0}
    cl = Cluster.model_validate({
        "name": "test", "hbm_reserve_frac": 0.0,
        "gpu_kinds": {"small": {**kind, "hbm_gb": 24.0, "h2d_gbps": 50.0}, "big": {**kind, "hbm_gb": 80.0, "h2d_gbps": 25.0}},
        "nodes": [{"name": "n0", "host_dram_gb": 256, "nvme_gb": 4000, "nvme_read_gbps": 50, "nvme_write_gbps": 5,
                   "root_gbps": 100, "gpus": {"small": 1, "big": 1}}]})
    cat = catalog(("m", 10.0, 1_000_000))
    nodes = [call("a", "m", ctx=1000, out=10), tool("t", ["a"]), call("b", "m", ["t"], ctx=20_000, out=10), tool("u", ["b"]),
             call("c", "m", ["u"], ctx=1000, out=10)]
    res = Simulator(cl, cat, trace(program("p", nodes)), make_policy("ray-multiplex")).run()
    assert [c.state for c in res.calls] == ["done"] * 3
    small, big = (g.index for g in cl.gpus)
    assert [c.group for c in res.calls[:2]] == [(small,), (big,)]


def test_prefetch_all_promotes_on_hints_and_wrong_hints_waste_bytes():
    cl, cat = cluster(gpus=2, hbm_gb=40.0, cold=1.0), catalog(("m1", 10.0), ("m2", 10.0), ("m3", 10.0))
    nodes = [call("a", "m1"), tool("t", ["a"], duration=60.0), call("b", "m2", ["t"])]
    right = [{"issued_at": "t", "for": "b", "model": "m2", "confidence": 0.9}]
    wrong = [{"issued_at": "t", "for": "b", "model": "m3", "confidence": 0.9}]
    pre = Simulator(cl, cat, trace(program("p", nodes, hints=right)), make_policy("prefetch-all")).run()
    od = Simulator(cl, cat, trace(program("p", nodes, hints=right)), make_policy("ondemand")).run()
    assert pre.calls[1].ready - pre.calls[1].arrive == 0.0 < od.calls[1].ready - od.calls[1].arrive
    sim = Simulator(cl, cat, trace(program("p", nodes, hints=wrong)), make_policy("prefetch-all"))
    res = sim.run()
    assert res.calls[1].ready - res.calls[1].arrive > 0
    assert res.bytes_by_pair["nvme->gpu"] == pytest.approx(30 * GB)  # m1, the wrongly hinted m3, then m2


def test_prefetch_all_prefetches_a_hinted_moe_models_hot_pages_with_its_weights():
    # Seed 000's full prefetch makes the candidate whole: for a MoE model, the pages most of its
    # calls touch (the ones a static placement keeps) come with the dense weights.
    from statebudget.models import Catalog
    from statebudget.policies.baselines import hot_page_ids

    cl = cluster(gpus=1, hbm_gb=80.0, cold=1.0)
    cat = Catalog.model_validate({"name": "t", "models": [
        {"name": "a", "version": "v1", "weights_gb": 5.0, "kv_bytes_per_token": 1000, "active_params_b": 1.0},
        {"name": "moe", "version": "v1", "weights_gb": 4.0, "kv_bytes_per_token": 1000, "active_params_b": 3.0,
         "moe": {"experts": 64, "active": 4, "layers": 10, "expert_gb": 0.05, "pages": 8, "zipf_s": 1.2}}]})
    hot = hot_page_ids(cat.by_name["moe"])
    assert 0 < len(hot) < 8  # some pages, not all
    nodes = [call("x", "a"), tool("t", ["x"], duration=120.0), call("y", "moe", ["t"])]
    hints = [{"issued_at": "t", "for": "y", "model": "moe", "confidence": 0.9}]
    sim = Simulator(cl, cat, trace(program("p", nodes, hints=hints)), make_policy("prefetch-all"))
    sim.run()
    prefetched = {k[2] for (k, _), c in sim.tiers.gpu.items() if k[0] == "e" and c.from_prefetch}
    assert prefetched == set(hot)  # loaded on the hint, not faulted in by the call
    assert sim.tiers.gpu[(("w", "moe"), (0,))].from_prefetch


@pytest.mark.parametrize("make", [lambda: make_policy("static"), BASELINES["static-share"]], ids=["static", "static-share"])
def test_static_loads_its_placement_at_time_zero(make):
    cl, cat = cluster(gpus=2, hbm_gb=40.0, cold=2.0), catalog(("m1", 10.0), ("m2", 10.0))
    tr = trace(program("p", [call("a", "m1")], start=100.0), program("q", [call("a", "m2")], start=100.0))
    res = Simulator(cl, cat, tr, make()).run()
    assert all(c.ready - c.arrive == 0.0 for c in res.calls)


def test_demo_cluster_shows_the_problem():
    """On hetero16 + agent-team + swe-team, on-demand swapping stalls handoffs for seconds."""
    tr = generate("swe-team", 1, 0.5)
    rep = replay(load_cluster("hetero16"), load_catalog("agent-team"), tr, ["ondemand"]).report
    assert rep.policies["ondemand"].handoff_stall_s.p95 > 1.0
    assert json.loads(report_json(rep))["policies"]["ondemand"]["calls_completed"] > 0


def test_replay_seeds_the_simulator_with_the_trace_seed_by_default(tmp_path):
    write_trace(generate("swe-team", 2, 0.1), tmp_path / "t.jsonl")
    runner = CliRunner()
    docs = {}
    for name, extra in (("default", []), ("two", ["--seed", "2"]), ("zero", ["--seed", "0"])):
        res = runner.invoke(app, ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace",
                                  str(tmp_path / "t.jsonl"), "--policy", "statebudget", *extra,
                                  "--json", str(tmp_path / f"{name}.json")])
        assert res.exit_code == 0, res.output
        docs[name] = json.dumps(_strip_decision_ms(json.loads((tmp_path / f"{name}.json").read_text())), sort_keys=True)
    assert docs["default"] == docs["two"]
    assert docs["default"] != docs["zero"]  # the seed matters (MoE page sampling), so the default is the trace's


@pytest.mark.xdist_group("e2e")
def test_replay_html_shows_the_reports_figures_in_a_browser(tmp_path):
    import re

    from tests.browser import rendered_dom, screenshot

    write_trace(generate("swe-team", 5, 0.2), tmp_path / "t.jsonl")
    res = CliRunner().invoke(app, ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace",
                                   str(tmp_path / "t.jsonl"), "--policy", "ondemand,statebudget", "--json",
                                   str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "r.json").read_text())
    page = (tmp_path / "r.html").read_text()
    assert "<script" not in page and not re.search(r"(src|href)=\"https?:", page)  # offline, self-contained
    dom = rendered_dom((tmp_path / "r.html").as_uri())
    cells = {m.group(1): m.group(2) for m in re.finditer(r"<tr><td>([^<]+)</td>(.*?)</tr>", dom)}
    assert set(cells) == {"ondemand", "statebudget"}
    for name, row in cells.items():
        shown = [float(v) for v in re.findall(r'<td class="num">([^<]+)</td>', row)]
        p = doc["policies"][name]
        assert shown[2] == pytest.approx(p["ttft_s"]["p95"], rel=1e-3)
        assert shown[3] == pytest.approx(p["slo_attainment"]["5"], rel=1e-3)
        assert shown[-1] == p["calls_completed"]
    assert f"t.jsonl ({doc['trace']['programs']} programs" in dom and dom.count("<img") >= 2
    screenshot((tmp_path / "r.html").as_uri(), "replay-page.png", size="1280,1600")


def test_the_oracle_block_says_why_the_replay_is_behind_and_only_then():
    from types import SimpleNamespace as NS

    from statebudget.sim.runner import behind

    def c(node, stall, state="done", wait=0.0, start=0.0):
        return NS(program=f"p{start:g}", node=node, state=state, arrive=10.0, admitted=10.0 + wait,
                  ready=10.0 + stall)

    calls = [c("a", 1.0, wait=0.25), c("b", 6.0), c("d", 0.5), c("x", 3.0, state="cancelled"), c("w", 9.0, start=1.0)]
    res = NS(calls=calls, warmup_s=5.0, programs={"p0": NS(prog=NS(start=5.0)), "p1": NS(prog=NS(start=1.0))})
    placed = {("p0", "a"): "schedule", ("p0", "b"): "no_room", ("p0", "d"): "no_room_there",
              ("p0", "x"): "no_group", ("p1", "w"): "never_fits"}
    policy = NS(placed=placed)
    online = {"lru": NS(stall_total_s=5.0), "static": NS(stall_total_s=2.0)}
    b = behind(NS(stall_total_s=7.5), online, policy, res, "milp")
    assert b.best == "static" and b.best_stall_total_s == 2.0 and b.stall_total_s == 7.5
    assert b.calls == {"schedule": 1, "no_room_there": 1, "no_room": 1, "no_group": 0, "never_fits": 0}, \
        "a cancelled call and one of a program that started in the warm-up are not counted"
    assert b.stall_s["no_room"] == pytest.approx(6.0) and b.stall_s["no_room_there"] == pytest.approx(0.5)
    assert b.hbm_wait_s["schedule"] == pytest.approx(0.25) and b.hbm_wait_s["no_room"] == 0.0
    assert "2, carrying 20% of its stall, ran on the schedule's group (1 without room" in b.why
    assert "1, carrying 80% of its stall, elsewhere: 1 as their group had no room." in b.why
    assert "Of all its stall, 3% waited for HBM room" in b.why and "docs/milp.md" in b.why  # 0.25 s of 7.5
    assert behind(NS(stall_total_s=2.0), online, policy, res, "milp") is None, "tied with the best: not behind"
    assert behind(NS(stall_total_s=7.5), {}, policy, res, "milp") is None, "no online policy"


def test_the_timeline_file_and_the_residency_plot(tmp_path):
    tr = generate("swe-team", 1, 0.2)
    write_trace(tr, tmp_path / "t.jsonl")
    base = ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace", str(tmp_path / "t.jsonl"),
            "--policy", "ondemand,statebudget-lease", "--plots"]
    res = CliRunner().invoke(app, base + [str(tmp_path / "plain"), "--json", str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "plain" / "residency.png").exists()  # no timeline asked for: no plot of it
    res = CliRunner().invoke(app, base + [str(tmp_path / "plots"), "--timeline", str(tmp_path / "tl.jsonl"),
                                          "--json", str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
    a, b = (_strip_decision_ms(json.loads((tmp_path / f).read_text())) for f in ("a.json", "b.json"))
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # recording decides nothing
    events = [json.loads(line) for line in (tmp_path / "tl.jsonl").read_text().splitlines()]
    assert {e["policy"] for e in events} == {"ondemand", "statebudget-lease"}
    mine = [e for e in events if e["policy"] == "ondemand"]
    assert [e["t"] for e in mine] == sorted(e["t"] for e in mine)
    # ondemand moves weights only for calls: no prefetch
    assert {e["event"] for e in mine} <= {"load", "evict", "engine-stop"}
    assert all(e["cause"].startswith("call ") for e in mine if e["event"] == "load")
    ours = [e for e in events if e["policy"] == "statebudget-lease"]
    assert any(e["event"] == "prefetch" and e["cause"] == "promote" for e in ours)  # it speculates; ondemand does not
    assert (tmp_path / "plots" / "residency.png").stat().st_size > 5000


def test_residency_intervals_pair_each_load_with_the_eviction_that_ends_it():
    from statebudget.sim.plots import residency_intervals
    tl = [{"t": 1.0, "event": "load", "model": "a", "gpus": [0, 1]},
          {"t": 2.0, "event": "prefetch", "model": "b", "gpus": [1]},
          {"t": 5.0, "event": "evict", "model": "a", "gpus": [0, 1]},
          {"t": 6.0, "event": "engine-stop", "model": "a", "gpus": [0, 1]},
          {"t": 7.0, "event": "load", "model": "a", "gpus": [0]}]
    assert residency_intervals(tl, 10.0) == [(0, "a", 1.0, 5.0), (0, "a", 7.0, 10.0), (1, "a", 1.0, 5.0),
                                             (1, "b", 2.0, 10.0)]
