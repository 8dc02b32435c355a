"""The evidence's verdicts on made-up rows whose answer is known: a claim holds, is refuted or
cannot be told apart, and a verdict on fewer than ten seeds says it is provisional."""

from __future__ import annotations

import numpy as np
import pytest

from statebudget.sim import claims as C

BASE = ["static", "lru-keepwarm", "frequency", "prefetch-all"]
OURS = ["statebudget", "statebudget-lease"]
METRIC_KEYS = [k for k, _, _ in C.METRICS] + ["slo_violations", "lease_late_p99_s", "nonlease_ttft_p99_s"]


def _rows(seeds, value, trace="swe-team"):
    """One row per (seed, policy) with every metric `value(policy, key, seed)`."""
    return [dict(trace=trace, policy=p, seed=s, load=1.0, **{k: value(p, k, s) for k in METRIC_KEYS})
            for s in seeds for p in BASE + OURS]


def _noise(s):
    return 1.0 + 0.05 * np.sin(s)  # the same for every policy of a seed: a paired effect is exact


def test_h4_holds_only_when_both_clauses_hold_and_lists_baselines_that_clear_the_bar():
    seeds = list(range(100, 110))

    def value(p, k, s):
        if k == "handoff_p95_s":
            return {"static": 10.0, "frequency": 7.0}.get(p, 2.0) * _noise(s)
        if k == "warm_tax":  # the lease planner holds 50 % more warm HBM than static
            return (0.45 if p == "statebudget-lease" else 0.3) * _noise(s)
        return 1.0 * _noise(s)

    ans, (sec,) = C.h4(C.Rows(_rows(seeds, value), seeds, BASE, OURS))
    assert ans["verdict"] == {"statebudget": "holds", "statebudget-lease": "does not hold"}
    assert ans["holds_for"] == ["statebudget"]
    assert ans["baselines_clearing_the_bar"] == ["lru-keepwarm", "prefetch-all"]  # 0.2x; frequency's 0.7x is not
    assert "statebudget: holds; statebudget-lease: does not hold" in sec


def test_a_verdict_on_five_seeds_is_provisional_and_on_fewer_is_withheld():
    assert C.verdict(10, True, False, "holds", "refuted") == "holds"
    assert C.verdict(5, False, True, "holds", "refuted") == "provisional (5 seeds): refuted"
    assert C.verdict(4, True, False, "holds", "refuted") == "too few seeds for a verdict"
    assert C.verdict(10, False, False, "holds", "refuted").startswith("not shown")


def test_best_baseline_is_chosen_per_metric_and_each_planner_marked_by_its_interval():
    seeds = list(range(100, 110))

    def value(p, k, s):
        if k == "ttft_p95_s":  # frequency is best; statebudget beats it, the lease planner loses
            return {"frequency": 4.0, "statebudget": 2.0, "statebudget-lease": 8.0}.get(p, 6.0) * _noise(s)
        if k == "slo_at5":  # higher is better: prefetch-all is best, nobody beats it
            return {"prefetch-all": 0.99}.get(p, 0.9)
        return (1.0 + 0.2 * np.cos(3 * s) * (p in OURS)) * _noise(s)  # ties: ours swing around

    ans, _ = C.best_baseline(C.Rows(_rows(seeds, value), seeds, BASE, OURS))
    assert ans["ttft_p95_s"]["baseline"] == "frequency" and ans["slo_at5"]["baseline"] == "prefetch-all"
    assert ans["ttft_p95_s"]["statebudget"]["mark"] == "wins"
    assert ans["ttft_p95_s"]["statebudget-lease"]["mark"] == "loses"
    assert ans["slo_at5"]["statebudget"]["mark"] == "loses"
    assert ans["stall_total_s"]["statebudget"]["mark"] == "ties"
    assert ans["verdict"].startswith("we lose on")


def test_leases_are_refuted_when_a_rival_is_late_less_often():
    seeds = list(range(100, 110))

    def value(p, k, s):
        if k == "lease_late_p99_s":
            return {"frequency": 1.0, "statebudget-lease": 2.0}.get(p, 4.0) * _noise(s)
        return 1.0 * _noise(s)

    ans, _ = C.leases(C.Rows(_rows(seeds, value), seeds, BASE, OURS))
    assert ans["verdict"] == "refuted"
    assert ans["lateness_p99_vs"]["frequency"]["ratio"] == pytest.approx(2.0)
    assert ans["lateness_p99_vs"]["prefetch-all"]["ratio"] == pytest.approx(0.5)


def test_a_knob_row_is_never_read_as_the_fair_comparisons():
    seeds = [100]
    rows = _rows(seeds, lambda p, k, s: 1.0) + [dict(trace="swe-team", policy="statebudget", seed=100, load=1.0,
                                                     replan_s=30.0, handoff_p95_s=99.0)]
    R = C.Rows(rows, seeds, BASE, OURS)
    assert R.get("swe-team", "statebudget", "handoff_p95_s") == [1.0]
    assert R.get("swe-team", "statebudget", "handoff_p95_s", replan_s=30.0) == [99.0]
