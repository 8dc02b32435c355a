"""`OutputEstimate`: learnt from finished calls only, clipped to what a call asked for; an array of
`max_tokens` (a queue re-read in one pass, `sim/waiting.py`) gives each element the scalar answer."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from statebudget.core.estimates import OutputEstimate

asks = st.lists(st.floats(0.0, 1e5, allow_nan=False), min_size=1, max_size=20)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1e5, allow_nan=False), max_size=30), asks)
def test_an_array_of_asks_is_the_scalar_answer_per_element(outputs, max_tokens):
    est = OutputEstimate()
    for o in outputs:
        est.observe("m", o)
    arr = est.expected("m", np.array(max_tokens))
    assert arr.tolist() == [est.expected("m", t) for t in max_tokens]
    assert all(0.0 <= e <= t for e, t in zip(arr.tolist(), max_tokens))


def test_before_any_finished_call_the_prior_share_then_the_observed_mean():
    est = OutputEstimate(prior_share=0.25)
    assert est.expected("m", 400) == 100.0
    est.observe("m", 50)
    est.observe("m", 150)
    assert est.expected("m", 400) == 100.0 and est.expected("m", 60) == 60.0
    assert est.count == {"m": 2} and est.expected("other", 8) == 2.0


def test_the_typical_ask_is_averaged_as_the_outputs_are_and_moves_no_output_estimate():
    est, plain = OutputEstimate(alpha=0.5), OutputEstimate(alpha=0.5)
    assert est.typical_asked("m") is None, "nothing before a call has finished"
    for out, asked in ((10, 1000), (30, 3000), (50, 9000)):
        est.observe("m", out)
        est.observe_asked("m", asked)
        plain.observe("m", out)
    # a running mean for the first two (1000, 3000 -> 2000), then weight 0.5: 2000 + 0.5 x 7000
    assert est.typical_asked("m") == 5500.0 and est.typical_asked("other") is None
    assert (est.mean, est.count, est.version) == (plain.mean, plain.count, plain.version)
    est.forget_asked()
    est.observe_asked("m", 800)
    assert est.typical_asked("m") == 800.0, "forgotten, it starts again from the next ask"
