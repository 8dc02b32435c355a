"""`statebudget evidence` on a small grid: every answer is computed from the replays' rows, the
page reads offline (no script, no outside resource) and, opened in headless Chromium, says what
evidence.json says."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest

from statebudget.sim import claims, evidence
from statebudget.sim.paired import ratio_of_means

from tests.browser import rendered_dom, screenshot
from tests.helpers import real_data_dir

pytestmark = pytest.mark.xdist_group("e2e")
SMALL = {"seeds": [100, 101], "hours": 0.25, "warmup_s": 300.0}


def test_the_evidence_report_answers_from_its_replays_and_reads_the_same_in_a_browser(tmp_path):
    ev = evidence.run(tmp_path, quick=True, workers=2, scale=SMALL)
    saved = json.loads((tmp_path / "evidence.json").read_text())
    assert saved["settings"]["seeds"] == SMALL["seeds"] and saved["replays"] == ev["replays"] == len(
        evidence.plan(True, SMALL)[1])
    a = saved["answers"]
    best = a["best_baseline"]
    for k, _, higher in claims.METRICS:  # the best of every baseline, metric by metric
        means = {p: np.mean([r[k] for r in ev["rows"] if r["policy"] == p and r["trace"] == "swe-team"
                             and r["load"] == 1.0]) for p in evidence.FULL_BASELINES}
        assert means[best[k]["baseline"]] == (max if higher else min)(means.values())
    assert a["h4"]["holds"] is False and a["h4"]["holds_for"] == []  # 2 seeds: figures, no verdict
    assert set(a["h4"]["warm_tax_vs_static"]) == set(evidence.OURS)  # H4's second clause is read too
    assert [g["claim"] for g in a["not_measured"]][-1] == "Real traces"  # no data given: said, not skipped quietly
    assert a["real_traces"] == [] and a["no_real_traces"].startswith("no real workload data given")
    assert abs(sum(a["active_models"]["time_share"].values()) - 1) < 0.01
    page = (tmp_path / "index.html").read_text()
    assert "<script" not in page and not re.search(r"(src|href)=\"https?:", page)  # offline, self-contained
    dom = rendered_dom((tmp_path / "index.html").as_uri())
    verdicts = re.findall(r'data-verdict="([^"]+)"', dom)
    by_sec = dict(re.findall(r'<section id="([^"]+)"><h2>[^<]*</h2><p class="verdict" data-verdict="([^"]+)"', dom))
    assert all("too few seeds for a verdict" in v for s, v in by_sec.items() if s not in ("h2", "h3"))  # cost model
    summary = re.search(r'<section id="summary">(.*?)</section>', dom, re.S).group(1)
    assert summary.count("<tr>") - 1 == len(verdicts)  # every verdict at a glance
    ratio = a["h4"]["vs_static"]["statebudget"]["ratio"]
    assert f"statebudget {ratio:.2f}×" in dom
    _h1_to_h3_read_the_same(a, dom)
    _replan_reads_the_same(a, dom)
    screenshot((tmp_path / "index.html").as_uri(), "evidence-small.png", size="1280,2400")


def _h1_to_h3_read_the_same(a: dict, dom: str) -> None:
    """H1-H3 (seed 002) are measured, each says how, and the page shows evidence.json's verdicts
    and figures."""
    assert not any(g["claim"].startswith(("H1", "H2", "H3")) for g in a["not_measured"])
    sec = {s: re.search(rf'<section id="{s}">(.*?)</section>', dom, re.S).group(1) for s in ("h1", "h2", "h3")}
    for s, how in (("h1", "simulator replay"), ("h2", "cost model, not measured on hardware"),
                   ("h3", "cost-model arithmetic")):
        (shown,) = [html.unescape(v) for v in re.findall(r'data-verdict="([^"]+)"', sec[s])]
        assert shown == a[s]["verdict"] and how in sec[s] and a[s]["method"].startswith(how.split(",")[0])
        assert "<img" in sec[s]
    h1 = a["h1"]
    assert h1["verdict"] == "too few seeds for a verdict" and not h1["holds"]  # 2 seeds
    assert f"{h1['calls']['q95']['ratio']:.2f}x" in sec["h1"] and "predicted &lt; 1.15" in sec["h1"]
    assert len(h1["calls"]["per_seed_ratio_q95"]) == len(h1["at_load_1"]["calls"]["per_seed_ratio_q95"]) == len(
        SMALL["seeds"]) and h1["load"] == evidence.H1_LOAD
    assert h1["live_programs"]["mean"] > h1["at_load_1"]["live_programs"]["mean"]  # the heavier load is heavier
    assert all(r >= 1 - 1e-9 for r in h1["calls"]["per_seed_ratio_q95"])  # a pool never needs more
    h2 = a["h2"]
    lo, hi = h2["pcie_share_b1"]
    assert f"{100 * lo:.1f}-{100 * hi:.1f} %" in sec["h2"] and len(h2["rows"]) == sec["h2"].count("<tr>") - 1
    assert all(r["pcie_b1"]["tpot_ratio"] == pytest.approx(1 / (1 - r["pcie_b1"]["share"])) for r in h2["rows"])
    h3 = a["h3"]
    f = h3["sweeps"][0]["first_failure"]
    assert (f"first fails at K = {f['k']} ({f['model']}), by {f['killer']}" if f else "all fit") in sec["h3"]
    assert [s["cluster"] for s in h3["sweeps"]] == ["hetero16", "hetero16", "h200x8"]


def _replan_reads_the_same(a: dict, dom: str) -> None:
    """How often to re-plan: one figure per R swept, the best R is the one with the lowest mean
    handoff P95, and the page's table holds evidence.json's means."""
    rp = a["replan"]
    assert rp["replan_s"] == list(claims.QUICK_REPLAN) and rp["default_s"] in rp["replan_s"]
    assert set(rp["handoff_p95_vs_default"]) == {str(r) for r in rp["replan_s"] if r != rp["default_s"]}
    sec = re.search(r'<section id="replan">(.*?)</section>', dom, re.S).group(1)
    cells = re.findall(r"<tr><td[^>]*>([^<]+)</td><td[^>]*>([^<]+)</td>", sec)
    assert [(float(r), float(h)) for r, h in cells] == [
        (r, pytest.approx(rp["mean"][str(r)]["handoff_p95_s"], rel=1e-3)) for r in rp["replan_s"]]
    assert f"At R = {rp['default_s']:g} s against statebudget-lease" in sec and "<img" in sec


def test_ratio_of_means_pairs_seeds_and_says_how_sure():
    r = ratio_of_means([10.0, 20.0, 30.0], [5.0, 10.0, 15.0])
    assert r["ratio"] == pytest.approx(0.5) and r["ci95"] == pytest.approx([0.5, 0.5]) and r["lower_on"] == 3
    noisy = ratio_of_means([1.0, 10.0, 2.0, 8.0], [2.0, 5.0, 1.0, 9.0])
    assert noisy["ci95"][0] < noisy["ratio"] < noisy["ci95"][1]
    with pytest.raises(ValueError):
        ratio_of_means([1.0], [1.0, 2.0])


REAL = real_data_dir()


@pytest.mark.skipif(not (REAL / "tracelab").is_dir(), reason="no real workload data next to the checkout")
def test_an_imported_real_trace_replays_under_every_policy_and_the_report_says_where_we_lose(tmp_path):
    data = tmp_path / "data"
    (data / "tracelab").mkdir(parents=True)
    for f in ("round_trace.jsonl", "multi_session_large.csv"):
        (data / "tracelab" / f).write_bytes((REAL / "tracelab" / f).read_bytes())
    ev = evidence.run(tmp_path / "out", quick=True, workers=2, scale={"seeds": [100], "hours": 0.1, "warmup_s": 0.0},
                      data=data)
    (real,) = ev["answers"]["real_traces"]
    assert real["name"] == "tracelab-sessions" and real["programs"] > 0
    assert set(real["policies"]) == set(evidence.FULL_BASELINES + evidence.OURS)  # every policy
    best = min(real["policies"][p]["ttft_p95_s"] for p in evidence.FULL_BASELINES)
    ours = max(real["policies"][p]["ttft_p95_s"] for p in evidence.OURS)
    assert ("ttft_p95_s" in real["loses_on"]) == (ours > best * 1.05 + 1e-9)
    assert real["file"] == "real/tracelab-sessions.jsonl"  # not where --out was: same inputs, same report
    page = (tmp_path / "out" / "index.html").read_text()
    assert 'id="real-tracelab-sessions"' in page and "Real traces" not in [g["claim"] for g in
                                                                             ev["answers"]["not_measured"]]


def test_the_report_is_the_same_for_the_same_seeds(tmp_path):
    for d in ("a", "b"):
        evidence.run(tmp_path / d, quick=True, workers=2, scale={"seeds": [100], "hours": 0.1, "warmup_s": 0.0})
    assert (tmp_path / "a" / "evidence.json").read_bytes() == (tmp_path / "b" / "evidence.json").read_bytes()
    assert (tmp_path / "a" / "index.html").read_bytes() == (tmp_path / "b" / "index.html").read_bytes()


def test_the_difference_of_two_ratios_resamples_the_seeds_together():
    from statebudget.sim.paired import difference_of_ratios
    d = difference_of_ratios([10, 10, 10], [5, 5, 5], [10, 10, 10], [8, 8, 8])
    assert d["diff"] == pytest.approx(0.3) and d["ci95"] == pytest.approx([0.3, 0.3])


def test_restore_against_recompute_follows_the_cost_models_rule_and_a_profile_changes_it():
    from statebudget.models.load import load_catalog

    nominal = evidence.restore_crossover()
    assert all(r["from_host"] == 0 and r["recompute_over_host_at_4k"] > 1 for r in nominal["rows"])
    fast_prefill = {"prefill_tok_s": {m.name: 1e12 for m in load_catalog("agent-team").models}}
    measured = evidence.restore_crossover(fast_prefill)
    assert measured["profile"] and all(r["from_host"] is None and r["from_nvme"] is None for r in measured["rows"])
