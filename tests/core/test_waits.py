"""The wait and resume models that the tool-wait KV rules and the planner's predictor read
(`core/waits.py`): the log-normal tool-wait model conditioned on the elapsed wait, its hold
outcomes and remaining-wait quantiles, and P(resume) learned per tool and model."""

import math

import numpy as np
import pytest

from statebudget.core.waits import ResumeModel, ToolWaitModel


def test_tool_waits_condition_on_elapsed_time():
    t = ToolWaitModel({"test": (10.0, 0.5)})
    fresh = t.p_end_within("test", 0.0, 10.0)
    assert fresh == pytest.approx(0.5, abs=0.01)  # the median
    assert t.p_end_within("test", 20.0, 10.0) > fresh  # a long wait is more likely to end soon
    for _ in range(500):
        t.observe("test", 1.0)
    assert t.p_end_within("test", 0.0, 2.0) > 0.9  # learned: tests got fast
    assert t.quantile_remaining("test", 0.0, 0.5) == pytest.approx(1.0, rel=0.2)


def test_hold_outcomes_match_the_log_normal_they_model():
    # E[min(W, e + tau) - e | W > e] and P(W > e + tau | W > e), closed form against a sample.
    w = ToolWaitModel({"t": (10.0, 1.2)})
    rng = np.random.default_rng(0)
    sample = np.exp(np.log(10.0) + 1.2 * rng.standard_normal(1_000_000))
    holds = [1.0, 10.0, 100.0, math.inf]
    for e in (0.0, 5.0, 60.0):
        alive = sample[sample > e]
        for hold, (held, outlasts) in zip(holds, w.hold_outcomes("t", e, holds)):
            assert held == pytest.approx(np.minimum(alive, e + hold).mean() - e, rel=0.01)
            assert outlasts == pytest.approx((alive > e + hold).mean(), abs=0.003)
        for q, left in zip((0.1, 0.5, 0.9), w.remaining_quantiles("t", e, (0.1, 0.5, 0.9))):
            assert left == pytest.approx(np.quantile(alive - e, q), rel=0.02)
            assert left == pytest.approx(w.quantile_remaining("t", e, q), rel=1e-6)


def test_resume_model_learns_per_tool_and_model():
    r = ResumeModel()
    assert r.p("search", "planner") == 1.0  # the prior: every interrupt resumes
    for _ in range(50):
        r.observe("search", "planner", False)
        r.observe("build", "coder", True)
    assert r.p("search", "planner") < 0.1
    assert r.p("edit", "planner") < 0.2  # an unseen tool leans on the model's pooled outcomes
    assert r.p("build", "coder") == 1.0 and r.p("search", "coder") == 1.0
    for _ in range(400):  # it forgets: a changed workload moves the estimate back
        r.observe("search", "planner", True)
    assert r.p("search", "planner") > 0.7
