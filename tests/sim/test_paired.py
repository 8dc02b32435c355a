"""The intervals behind every paired verdict (`sim/paired.py`)."""

import numpy as np
import pytest

from statebudget.sim.paired import _t975, paired_diff, t_interval

# t(0.975, df) from published tables
PUBLISHED = {1: 12.706, 10: 2.228, 30: 2.042, 31: 2.040, 39: 2.023, 40: 2.021, 60: 2.000, 120: 1.980}


@pytest.mark.parametrize("df,t", sorted(PUBLISHED.items()))
def test_the_t_quantile_matches_the_tables_on_both_sides_of_thirty(df, t):
    assert _t975(df) == pytest.approx(t, abs=6e-4)


def test_the_t_quantile_falls_towards_the_normals_as_seeds_grow():
    ts = [_t975(df) for df in range(1, 400)]
    assert all(a > b for a, b in zip(ts, ts[1:]))
    assert 1.96 < ts[-1] < 1.97


def test_forty_seeds_get_a_t_interval_not_a_normal_one():
    v = np.random.default_rng(0).normal(1.0, 2.0, 40)
    ci = t_interval(list(v))["ci95"]
    hw = (ci[1] - ci[0]) / 2
    assert hw == pytest.approx(2.0227 * v.std(ddof=1) / np.sqrt(40), rel=1e-4)


def test_a_paired_difference_is_other_minus_base_seed_by_seed():
    d = paired_diff([1.0, 2.0, 3.0], [1.5, 1.0, 4.0])
    assert d["mean"] == pytest.approx(0.5 / 3)
    assert d["lower_on"] == 1 and d["n"] == 3
